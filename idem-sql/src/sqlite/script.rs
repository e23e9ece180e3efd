//! A transactional claim's statements on SQLite, several to one call to
//! the connection's worker thread.
//!
//! sqlx runs each query on the connection's own thread and wakes the
//! caller's task with its answer: a hand-off each way per query, made
//! while the claim holds the database's one turn to write. A query of
//! several statements is one hand-off, and on SQLite it takes parameters
//! like any other: sqlx binds each statement's `?N` to the query's N-th
//! value, and prepares the statements once per connection (its statement
//! cache), so that SQLite parses nothing per claim. The table name is a
//! checked identifier (`validate_identifier`).
//!
//! A claim holds its key by the database's write lock, which its
//! transaction takes as it begins (BEGIN IMMEDIATE, through sqlx) and
//! holds to its commit: under that lock no other connection writes, so
//! what the claim's read found stays so until the commit, which writes the
//! record, completed ([`commit`]). sqlx counts its transaction as open from
//! its own BEGIN to its COMMIT or ROLLBACK; every query here leaves a
//! transaction open on the connection for it to end, once it has run to
//! its end. sqlx's worker stops a query between two of its statements if
//! the caller is dropped, which could leave the transaction committed and
//! none begun in its place: so the commit runs these on a task of its own
//! (`transactional.rs`), to their end whether the request waits or not.

/// The end of a transactional claim: its record written
/// completed ([`complete`]: key hash `?1`, key `?2`, fingerprint `?3`,
/// outcome `?4`, retention in milliseconds `?5`), COMMIT, and BEGIN, with
/// `now` the store's clock expression. What sqlx rolls back when it drops
/// its transaction is that empty, deferred one, which holds no lock.
pub(crate) fn commit(table: &str, now: &str) -> String {
    format!("{} BEGIN", complete(table, now))
}

/// Where [`commit_and_claim`]'s BEGIN IMMEDIATE is among its statements:
/// how many run before it (the completion's two and COMMIT), the
/// committing claim's.
pub(crate) const NEXT_BEGINS_AT: usize = 3;

/// [`commit`] that starts the claim of the key hashed `?6` in its place,
/// in the same call: BEGIN IMMEDIATE and the read of that key's record,
/// with `ms_left` the milliseconds it has left, where [`commit`] has a
/// deferred BEGIN. The write lock then passes from one claim to the next
/// without being let go in between.
pub(crate) fn commit_and_claim(table: &str, now: &str, ms_left: &str) -> String {
    format!(
        "{} BEGIN IMMEDIATE; \
         SELECT state, owner, fingerprint, outcome, {ms_left} FROM {table} \
           WHERE key_hash = ?6",
        complete(table, now),
    )
}

/// The record inserted completed (over an expired one of the key), a
/// statement that fails unless the insert wrote exactly one row (`abs()` of
/// the least 64-bit integer is SQLite's overflow error, and the rest of
/// the query does not run), then COMMIT: nothing is committed over a live
/// record. The claim read the key under the write lock it still holds, so
/// no live record can be there; the check is the proof, not a path expected
/// to run.
fn complete(table: &str, now: &str) -> String {
    format!(
        "INSERT INTO {table} AS r \
           (key_hash, idem_key, state, owner, fingerprint, outcome, expires_at) \
           VALUES (?1, ?2, 'C', NULL, ?3, ?4, {now} + ?5) \
           ON CONFLICT (key_hash) DO UPDATE SET \
             idem_key = excluded.idem_key, state = 'C', owner = NULL, \
             fingerprint = excluded.fingerprint, outcome = excluded.outcome, \
             expires_at = excluded.expires_at, created_at = {now} \
           WHERE r.expires_at <= {now}; \
         SELECT abs(-9223372036854775808) WHERE changes() <> 1; \
         COMMIT;"
    )
}
