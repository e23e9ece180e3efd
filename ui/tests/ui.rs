//! Compile-time behaviour of `#[idempotent]`: what compiles, and the error
//! each mistake gets. Regenerate the snapshots with `TRYBUILD=overwrite`
//! and read every changed `.stderr` before committing it.

#[test]
fn ui() {
    let cases = trybuild::TestCases::new();
    cases.pass("tests/ui/pass/*.rs");
    cases.compile_fail("tests/ui/fail/*.rs");
    // `Tx`, on the SQLite store.
    cases.pass("tests/ui/sqlite/pass/*.rs");
    cases.compile_fail("tests/ui/sqlite/fail/*.rs");
}
