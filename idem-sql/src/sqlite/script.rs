//! The end of a transactional claim on SQLite, in one call to the
//! connection's worker thread.
//!
//! sqlx runs each statement on the connection's own thread and wakes the
//! caller's task with its answer: a hand-off each way per statement, made
//! while the claim holds the database's one turn to write. A script of
//! several statements (`sqlx::raw_sql`) is one hand-off. It has no
//! parameters: the values are written into its text, only values the
//! store makes, as blob literals of hexadecimal digits (`X'…'`) and
//! integers. The table name is a checked identifier
//! (`validate_identifier`). The fuzz target `fuzz/fuzz_targets/sql_script.rs`
//! (which includes this file and `hex_digits.rs` by path: they need
//! nothing but std) checks that no value changes a script's shape.

/// `value` as a blob literal.
pub(crate) fn blob(value: &[u8]) -> String {
    let mut out = String::from("X'");
    crate::hex_digits::push(&mut out, value);
    out.push('\'');
    out
}

/// A transactional claim's completion.
pub(crate) struct Completion<'a> {
    pub(crate) key_hash: &'a [u8; 32],
    pub(crate) owner: &'a [u8],
    pub(crate) outcome: &'a [u8],
    pub(crate) ttl_ms: i64,
}

/// The claim's row completed, then COMMIT, with `now` the store's clock
/// expression.
///
/// Between them, a statement that fails unless the update changed exactly
/// one row (`abs()` of the least 64-bit integer is SQLite's overflow
/// error), so that a row that is not this claim's is never committed: the
/// rest of the script does not run. The claim holds the write lock from
/// its row's insert, so no other writer can have changed that row; this
/// check is the proof, not a path expected to run.
///
/// Then BEGIN: sqlx still counts the transaction as open, and rolls it back
/// when its handle is dropped; what it rolls back is this empty, deferred
/// transaction, which holds no lock.
pub(crate) fn commit(table: &str, now: &str, completion: &Completion<'_>) -> String {
    format!(
        "UPDATE {table} SET state = 'C', owner = NULL, outcome = {outcome}, \
           expires_at = {now} + {ttl_ms} \
           WHERE key_hash = {hash} AND state = 'I' AND owner = {owner}; \
         SELECT abs(-9223372036854775808) WHERE changes() <> 1; \
         COMMIT; \
         BEGIN",
        outcome = blob(completion.outcome),
        ttl_ms = completion.ttl_ms,
        hash = blob(completion.key_hash),
        owner = blob(completion.owner),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blobs_are_hex_digits_between_quotes() {
        assert_eq!(blob(b"\x00'\\"), "X'00275c'");
        assert_eq!(blob(b""), "X''");
    }
}
