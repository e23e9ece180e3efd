//! Redis for [idem](https://docs.rs/idem-tower): the fast gate.
//!
//! - [`RedisStore`]: idempotency records in Redis, one round trip per
//!   claim (`SET NX PX GET`), completion, release and renewal fenced by the
//!   owner token in Lua; on a `ConnectionManager`, a Cluster connection, or
//!   a [`SentinelConnection`] that follows a failover. It needs Redis 7.0 or
//!   later (or a server that takes `SET` with both `NX` and `GET`, as
//!   Valkey does): on 6.2 every claim fails, the tiered store runs on SQL
//!   alone and `RedisStore` alone answers 503.
//! - [`TieredStore`]: the Redis gate in front of a
//!   store of record (a SQL store), duplicates answered by Redis, the store
//!   of record's unique index the bottom line, transactional mode through
//!   it.
//!
//! Built on idem-core's public store interface alone
//! ([`IdempotencyStore`](idem_core::IdempotencyStore),
//! [`TransactionalStore`](idem_core::TransactionalStore)), like any store
//! outside idem. Users of idem-tower reach it through its `redis` feature
//! (`idem_tower::RedisStore`, `idem_tower::TieredStore`,
//! `idem_tower::redis`).
#![cfg_attr(docsrs, feature(doc_cfg))]

/// The redis crate these stores are built on, so your connection is the
/// very type the store takes.
pub use ::redis;

mod sentinel;
mod store;
pub mod tiered;

pub use sentinel::SentinelConnection;
pub use store::RedisStore;
pub use tiered::TieredStore;
