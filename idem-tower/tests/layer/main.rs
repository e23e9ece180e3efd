//! Integration tests of `IdempotencyLayer` against the HTTP contract
//! (README.md) and the key and record invariants of ARCHITECTURE.md, one
//! module per topic.
//!
//! Every inner service is a real `tower::service_fn` (or an axum router)
//! that counts its runs in a [`support::Calls`] owned by the test, and every
//! test asserts that count.
#![cfg(feature = "memory")]

use idem_test_support::service as support;

mod fixtures;

mod bodies;
mod callers;
#[cfg(feature = "axum")]
mod compression;
#[cfg(feature = "axum")]
mod extractors;
mod failures;
mod foreign_store;
mod grpc;
#[cfg(feature = "grpc")]
mod grpc_server;
mod keys;
mod leases;
#[cfg(feature = "axum")]
mod operations;
mod replay;
#[cfg(feature = "axum")]
mod router;
mod store_failures;
mod streams;
