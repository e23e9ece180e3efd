//! The store interface: the contract every backend implements
//! ([`IdempotencyStore`]), its type-erased form ([`DynStore`]) and
//! transactional mode ([`TransactionalStore`]), all re-exported at the
//! crate root.

mod contract;
mod erased;
mod transactional;

pub use contract::IdempotencyStore;
pub use erased::{BoxFuture, DynStore};
pub use transactional::{OpenTransaction, TransactionalStore, TxClaim, TxHandle};
