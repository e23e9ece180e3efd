//! Property tests of the record state machine (ARCHITECTURE.md, "Records") against
//! real stores: random interleavings of claim, complete, release, concurrent
//! claim races and lease / ttl expiry, across several owners and keys,
//! each step checked against a reference model. The properties:
//!
//! - **one owner**: no key is ever acquired while another owner's lease on it
//!   may still run (and a race of concurrent claims has at most one winner);
//! - **no lost response**: a completed key replays exactly its outcome to
//!   every claim with its fingerprint until its ttl may have run out;
//! - **no stale write**: an owner whose lease was taken over, or that already
//!   completed or released, gets `LeaseLost` from `complete` and `release`,
//!   and the record is unchanged afterwards.
//!
//! Time is real: stores judge expiry by their own clocks, which a test cannot
//! stop. So the model never assumes how long anything took. It times every
//! store call and keeps, for each lease and ttl, the window in which
//! the store must have set its deadline. At a later call a deadline is
//! certainly running, certainly over, or (if it falls within the call, give
//! or take `SLACK`,
//! `conformance/model.rs`) either, and then the store's answer settles which. A
//! slow, loaded machine makes more deadlines pass; it cannot make the model
//! expect the wrong thing.
//!
//! The one latitude: after its lease ran out and before anyone took the key
//! over, an owner may or may not still complete or release it (the memory
//! store says no, the SQL stores yes); both are safe, as no one else holds it.
//!
//! Failures print the shrunk sequence of steps. `PROPTEST_CASES=N` runs N
//! cases per store instead of the defaults below.
#![cfg(all(feature = "memory", feature = "test-util"))]

use std::sync::Arc;

use idem_core::MemoryStore;
use idem_core::conformance::model::{CONTENDED, SPREAD, run, runtime};

#[test]
fn memory_store_keeps_one_owner_and_every_response_with_contention() {
    let seen = run(&runtime(), Arc::new(MemoryStore::new()), CONTENDED);
    // Hundreds of each in a run: none at all means the generators broke.
    assert!(seen.stale_refused > 0 && seen.replays > 0, "{seen:?}");
}

#[test]
fn memory_store_keeps_one_owner_and_every_response_across_keys() {
    let seen = run(&runtime(), Arc::new(MemoryStore::new()), SPREAD);
    // Tens of each in a run.
    assert!(seen.takeovers > 0 && seen.races_won > 0, "{seen:?}");
}
