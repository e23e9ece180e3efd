//! The compile-time behaviour of `#[idempotent]`: what compiles, and the
//! error each mistake gets. The cases are in `tests/ui/`, run by
//! `tests/ui.rs`; this crate has no code of its own.
