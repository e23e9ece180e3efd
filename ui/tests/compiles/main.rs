//! What `#[idempotent]` must accept: each module is handlers and a router
//! as a user writes them, compiled with warnings denied, and its test
//! builds the router (axum checks each route as it is added). The mistakes
//! it must refuse, and the error each gets, are `tests/ui.rs`'s.
//!
//! These cases were trybuild's "pass" cases; as a test of their own they
//! build against the workspace's dependencies, where trybuild built each
//! case alone, with `cargo build`, over dependencies of its own.

mod custom_extractors;
mod debug_handler_either_side;
mod every_argument;
mod handler_names;
mod issue_example;
mod modules_and_generic_state;
mod shared_across_callers;
mod sqlite_transactional;
mod ttl_forms;
