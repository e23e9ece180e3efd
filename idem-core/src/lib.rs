//! The core of [idem]: keys, fingerprints, the record state machine and the
//! stores that keep it.
//!
//! Most users reach this crate through `idem-tower`, which re-exports it.
//! Use it directly to write a store, or to drive the state machine by hand
//! outside HTTP:
//!
//! ```
//! use std::time::Duration;
//! use http::{HeaderMap, Method};
//! use idem_core::{Claim, Fingerprint, FingerprintSpec, IdempotencyStore, KeyTemplate, MemoryStore, Outcome, OwnerToken, RequestView};
//!
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! let template: KeyTemplate = "pay-callback:{path:payment_no}".parse()?;
//! let headers = HeaderMap::new();
//! let params = [("payment_no".to_owned(), "P-1".to_owned())];
//! let request = RequestView::new(&Method::POST, "/payments/{payment_no}/callback", &headers)
//!     .path_params(&params)
//!     .body(br#"{"status":"PAID"}"#);
//!
//! let key = template.evaluate(&request, "idem:")?;
//! let fingerprint = Fingerprint::of(&request, &FingerprintSpec::Request)?;
//!
//! let store = MemoryStore::new();
//! match store.claim(&key, &fingerprint, Duration::from_secs(30), OwnerToken::generate()).await? {
//!     Claim::Acquired(owner) => {
//!         // first time: do the work, then record the outcome
//!         store.complete(&key, &owner, &Outcome::NotReplayable, Duration::from_secs(3600)).await?;
//!     }
//!     Claim::Replay(_) | Claim::InFlight { .. } | Claim::Mismatch => unreachable!(),
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(()) }).unwrap();
//! ```
//!
//! # Writing a store
//!
//! Everything a store author needs is at this crate's root, one path each:
//! the contract every backend implements ([`IdempotencyStore`]), its
//! type-erased form ([`DynStore`]), transactional mode
//! ([`TransactionalStore`]), and the values they exchange ([`Claim`],
//! [`Outcome`], [`OwnerToken`], [`Record`]). A store is a small async trait:
//! four atomic steps of the record state machine (see [`Record`]), each a
//! compare-and-set against the store's own clock. `conformance` (feature
//! `test-util`) is the suite every backend must pass.
//!
//! [idem]: https://docs.rs/idem-tower
#![cfg_attr(docsrs, feature(doc_cfg))]

mod error;
mod fingerprint;
mod key;
mod phases;
mod record;
mod response;
mod store;

#[cfg(feature = "memory")]
#[cfg_attr(docsrs, doc(cfg(feature = "memory")))]
mod memory;

#[cfg(feature = "test-util")]
#[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
pub mod conformance;

mod time;

pub use error::{BoxError, Error, ErrorKind};
pub use fingerprint::{Fingerprint, FingerprintSpec};
pub use key::{
    DEFAULT_NAMESPACE, IdempotencyKey, KeyError, KeyScope, KeyTemplate, MAX_PART_LEN, Placeholder,
    RequestView, TemplateError, TemplateErrorKind,
};
#[cfg(feature = "memory")]
pub use memory::{DEFAULT_MAX_BYTES, MemoryStore};
#[cfg(feature = "memory")]
#[cfg_attr(docsrs, doc(cfg(feature = "memory")))]
pub use phases::MemoryPoints;
pub use phases::{MAX_PHASE_NAME_LEN, Phases, Recorded, RecoveryPoint, RecoveryPoints};
pub use record::{Claim, DecodeError, Duplicate, Outcome, OwnerToken, Record};
pub use response::StoredResponse;
pub use store::{
    BoxFuture, DynStore, IdempotencyStore, OpenTransaction, TransactionalStore, TxClaim, TxHandle,
};
pub use time::{LONGEST_EXPIRY, expiry_after, expiry_millis};
