//! Compile-time behaviour of `#[idempotent]`: the error each mistake gets.
//! Regenerate the snapshots with `TRYBUILD=overwrite` and read every
//! changed `.stderr` before committing it. What it must accept is
//! `tests/compiles/`.
//!
//! Only refusals here: trybuild then checks every case in one `cargo
//! check` (a "pass" case among them would make it build each case alone,
//! with `cargo build`, over dependencies built for codegen).

#[test]
fn ui() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("tests/ui/fail/*.rs");
    // `Tx`, on the SQLite store.
    cases.compile_fail("tests/ui/sqlite/fail/*.rs");
}
