//! The compile-time behaviour of `#[idempotent]`: what compiles
//! (`tests/compiles/`, a test of its own) and the error each mistake gets
//! (the cases in `tests/ui/`, run by trybuild from `tests/ui.rs`); this
//! crate has no code of its own.
