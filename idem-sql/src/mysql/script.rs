//! A transactional claim's statements on MySQL/MariaDB, sent several to a
//! round trip.
//!
//! sqlx sends a prepared statement alone and waits for its answer, and
//! MySQL prepares one statement at a time. A text query carries several
//! (sqlx connects with `CLIENT_MULTI_STATEMENTS`): the server runs them in
//! order, stops at the first that fails, and answers them all in one round
//! trip. So a transactional claim costs one round trip at its start (the
//! claim's row written, the session's lock wait set for the handler, the
//! row read back) and none of its own at its end (the row completed in the
//! round trip of COMMIT).
//!
//! A text query has no parameters: the values are written into its text.
//! Only values the store makes go there, in forms that cannot end a
//! literal: integers as digits, bytes as hexadecimal literals (`X'…'`), the
//! key as the hexadecimal literal of its UTF-8 bytes, converted. The table
//! name is a checked identifier (`validate_identifier`).

use super::MySql;
use crate::dialect::{ClaimArgs, Dialect};

/// `value` as a binary string literal: `X'…'`, two hexadecimal digits a
/// byte.
pub(crate) fn bytes(value: &[u8]) -> String {
    let mut out = String::with_capacity(3 + value.len() * 2);
    out.push_str("X'");
    crate::hex_digits::push(&mut out, value);
    out.push('\'');
    out
}

/// MySQL's error when a scalar subquery returns more than one row
/// (`ER_SUBQUERY_NO_1_ROW`): what [`commit`]'s check raises when the
/// completion found no row of the claim's.
pub(crate) const NOT_COMPLETED: u32 = 1242;

/// The start of a transactional claim, in the transaction just begun: the
/// claim's row written (the upsert of [`Dialect::queries`], its values
/// literals) under no lock wait, so that another transaction's claim of
/// the key fails it at once with a lock wait timeout; then the session's
/// lock wait for the handler's statements, `lock_wait_secs`; then the
/// key's row, as the store's `select` reads it.
///
/// If the upsert fails, nothing after it runs: the session's lock wait is
/// still 0, and the caller sets it back ([`lock_wait`]).
pub(crate) fn claim(
    table: &str,
    upsert: impl FnOnce([&str; 5]) -> String,
    args: &ClaimArgs<'_>,
    lock_wait_secs: u64,
) -> String {
    let hash = bytes(args.key_hash);
    let key = format!("CONVERT({} USING utf8mb4)", bytes(args.key.as_bytes()));
    let owner = bytes(args.owner.as_bytes());
    let fingerprint = bytes(args.fingerprint.as_bytes());
    let lease = args.lease_ms.to_string();
    let upsert = upsert([&hash, &key, &owner, &fingerprint, &lease]);
    format!(
        "{no_wait}; {upsert}; {wait}; \
         SELECT state, owner, fingerprint, outcome, {left} FROM {table} WHERE key_hash = {hash}",
        no_wait = lock_wait(0),
        wait = lock_wait(lock_wait_secs),
        left = MySql::ms_until("expires_at"),
    )
}

/// Sets the session's lock wait, in whole seconds.
pub(crate) fn lock_wait(secs: u64) -> String {
    format!("SET SESSION innodb_lock_wait_timeout = {secs}")
}

/// A transactional claim's completed record.
pub(crate) struct Completed<'a> {
    pub(crate) key_hash: &'a [u8; 32],
    pub(crate) owner: &'a [u8],
    pub(crate) outcome: &'a [u8],
    pub(crate) ttl_ms: i64,
}

/// The end of a transactional claim: its row completed, a check that it
/// was (the row the claim wrote, still its own: its transaction's lock
/// keeps every other writer off it, so this holds unless something past
/// the store changed it), and COMMIT. A failed check raises
/// [`NOT_COMPLETED`], and the COMMIT after it is not run: nothing commits.
///
/// The check reads `ROW_COUNT()`, the rows the update matched (sqlx
/// connects with `CLIENT_FOUND_ROWS`): one, or a scalar subquery of two
/// rows, which fails the statement.
pub(crate) fn commit(table: &str, record: &Completed<'_>) -> String {
    format!(
        "UPDATE {table} SET state = 'C', owner = NULL, outcome = {outcome}, \
           expires_at = {expires} \
         WHERE key_hash = {hash} AND state = 'I' AND owner = {owner}; \
         SELECT (SELECT 1 FROM DUAL UNION ALL SELECT 2 FROM DUAL WHERE ROW_COUNT() <> 1); \
         COMMIT",
        outcome = bytes(record.outcome),
        expires = MySql::now_plus_ms(&record.ttl_ms.to_string()),
        hash = bytes(record.key_hash),
        owner = bytes(record.owner),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_hex_literals() {
        assert_eq!(bytes(b"\x00'\\"), "X'00275c'");
        assert_eq!(
            bytes("a'); DROP TABLE t; --".as_bytes()),
            "X'6127293b2044524f50205441424c4520743b202d2d'"
        );
        assert_eq!(bytes(b""), "X''");
    }
}
