//! Everything a store author needs, in one place: the contract every
//! backend implements ([`IdempotencyStore`]), its type-erased form
//! ([`DynStore`]), transactional mode ([`TransactionalStore`]), and the
//! values they exchange.
//!
//! A store is a small async trait: four atomic steps of the record state
//! machine (see [`record`](crate::record)), each a compare-and-set against
//! the store's own clock. [`conformance`](crate::conformance) (feature
//! `test-util`) is the suite every backend must pass.

mod contract;
mod erased;
mod transactional;

pub use contract::IdempotencyStore;
pub use erased::{BoxFuture, DynStore};
pub use transactional::{OpenTransaction, TransactionalStore, TxClaim, TxHandle};

pub use crate::record::{Claim, DecodeError, Duplicate, Outcome, OwnerToken, Record};
pub use crate::{Error, ErrorKind, Fingerprint, IdempotencyKey, StoredResponse};
