//! A transactional claim's statements, sent several to a round trip.
//!
//! sqlx waits for each statement's answer before it sends the next, and a
//! prepared statement carries one statement. A simple query carries many:
//! PostgreSQL runs them in order and answers them all in one round trip,
//! each statement with a snapshot of its own (READ COMMITTED), so a read
//! after a lock in the same query sees what the lock's last holder
//! committed. So a transactional claim costs no round trip of its own: its
//! BEGIN, the key's lock and the read of its record go in one, where sqlx
//! would have sent BEGIN alone, and the completed record goes with COMMIT.
//!
//! A simple query has no parameters: the values are written into its text,
//! as the arguments of statements prepared once per connection (below), so
//! that PostgreSQL parses a short `EXECUTE` and plans nothing per script.
//! Only values the store makes go there, in forms that cannot end a
//! literal: integers as digits, bytes as an escape string of hexadecimal
//! digits (`E'\\x…'`, which reads the same whatever
//! `standard_conforming_strings` says, and which the statement's `bytea`
//! parameter takes as it is, without a function call); the key goes as its
//! UTF-8 bytes. The table name is a checked identifier
//! (`validate_identifier`). The fuzz target
//! `fuzz/fuzz_targets/sql_script.rs` (which includes this file and
//! `hex_digits.rs` by path: they need nothing but std) checks that no
//! value changes a script's shape.

use std::fmt::Write;

/// `value` as a `bytea` literal: an escape string of its bytes in
/// hexadecimal, `E'\\x…'`.
pub(crate) fn bytes(value: &[u8]) -> String {
    let mut out = String::with_capacity(value.len() * 2 + 6);
    push_bytes(&mut out, value);
    out
}

/// Appends `value` as a `bytea` literal ([`bytes`]).
fn push_bytes(out: &mut String, value: &[u8]) {
    out.push_str("E'\\\\x");
    crate::hex_digits::push(out, value);
    out.push('\'');
}

/// The error PostgreSQL answers an `EXECUTE` of a statement the session
/// has not prepared: `invalid_sql_statement_name`.
pub(crate) const NOT_PREPARED: &str = "26000";

/// The error PostgreSQL answers a `PREPARE` of a name the session has
/// prepared already: `duplicate_prepared_statement`.
pub(crate) const ALREADY_PREPARED: &str = "42P05";

/// The generation of the statements below, part of their names: raised
/// whenever a statement's text or parameters change. A pooler in front of
/// PostgreSQL (PgBouncer in transaction mode) shares a server session
/// between processes, so during a rolling upgrade one session can serve
/// two versions of this store; with the generation in the names each finds
/// its own statements there, instead of the other's under the same name.
const GENERATION: u32 = 1;

/// The statements' names on `table`, as PostgreSQL keeps them (folded to
/// lower case, as unquoted names are).
pub(crate) fn statement_names(table: &str) -> [String; 3] {
    ["lock", "read", "insert"].map(|what| format!("idem{GENERATION}_{what}_{table}").to_lowercase())
}

/// The statements the scripts execute, prepared on a connection the first
/// time a claim finds them missing there (`NOT_PREPARED`): PostgreSQL then
/// plans them once per connection, as it does sqlx's own, instead of once
/// per script. Prepared statements outlive the transaction they were
/// prepared in, and are the session's: named after the table, so that
/// stores of several tables share a pool, and after their [`GENERATION`].
///
/// `idem_insert` deletes an expired record of the key in the same
/// statement, before it inserts (the insert reads the delete's count, so
/// the delete has run to its end first; the row it deleted no longer
/// stands in the unique index's way): one statement for what a claim that
/// found no record, nearly every one, needs, and for what one that found
/// an expired record needs.
///
/// Those named in `prepared` are left out: after a prepare that failed
/// partway (a table not migrated yet, a missing privilege), the session
/// keeps the statements prepared before the failure, and preparing them
/// again is refused (`ALREADY_PREPARED`).
pub(crate) fn prepare_missing(table: &str, prepared: &[String]) -> String {
    let [lock, read, insert] = statement_names(table);
    [
        (
            lock,
            "(bigint, text) AS \
             SELECT pg_try_advisory_xact_lock($1), set_config('lock_timeout', $2, true)"
                .to_owned(),
        ),
        (
            read,
            format!(
                "(bytea) AS \
                 SELECT state::text, owner, fingerprint, outcome, \
                   (EXTRACT(EPOCH FROM (expires_at - now())) * 1000)::int8 \
                 FROM {table} WHERE key_hash = $1"
            ),
        ),
        (
            insert,
            format!(
                "(bytea, bytea, bytea, bytea, bigint) AS \
                 WITH expired AS ( \
                   DELETE FROM {table} WHERE key_hash = $1 AND expires_at <= now() RETURNING 1 \
                 ) \
                 INSERT INTO {table} \
                   (key_hash, idem_key, state, owner, fingerprint, outcome, expires_at) \
                 SELECT $1, convert_from($2, 'UTF8'), 'C', NULL, $3, $4, \
                   now() + $5 * interval '1 millisecond' \
                 FROM (SELECT count(*) FROM expired) AS cleared"
            ),
        ),
    ]
    .into_iter()
    .filter(|(name, _)| !prepared.contains(name))
    .map(|(name, body)| format!("PREPARE {name} {body}"))
    .collect::<Vec<_>>()
    .join("; ")
}

/// Reads which of the statements on `table` the session has, after a
/// prepare that failed partway: the failure rolled back the query's
/// statements before its BEGIN, so no transaction is open.
pub(crate) fn which_prepared(table: &str) -> String {
    let names = statement_names(table)
        .map(|name| format!("'{name}'"))
        .join(", ");
    format!("SELECT name::text FROM pg_prepared_statements WHERE name IN ({names})")
}

/// [`prepare_and_claim`] preparing only the statements not in `prepared`
/// ([`which_prepared`]). The prepares go before the claim's BEGIN, which
/// makes the transaction they run in the claim's.
pub(crate) fn prepare_missing_and_claim(
    table: &str,
    prepared: &[String],
    lock_id: i64,
    key_hash: &[u8; 32],
    timeout_ms: u128,
) -> String {
    let missing = prepare_missing(table, prepared);
    let claim = claim(table, lock_id, key_hash, timeout_ms);
    if missing.is_empty() {
        claim
    } else {
        format!("{missing}; {claim}")
    }
}

/// The start of a transactional claim: BEGIN (the transaction is the
/// claim's own, `claim_tx.rs`); the key's advisory lock `lock_id`, tried
/// without waiting (held by the transaction until it ends, and by nothing
/// once its session is gone); the lock timeout of the handler's
/// statements, `timeout_ms`; then the key's record. Answers a row (locked, setting) and, if the key has a record, a
/// row of it as the store's `select` reads it (state, owner, fingerprint,
/// outcome, milliseconds left).
pub(crate) fn claim(table: &str, lock_id: i64, key_hash: &[u8; 32], timeout_ms: u128) -> String {
    let mut out = String::with_capacity(2 * table.len() + 170);
    write!(
        out,
        "BEGIN; EXECUTE idem{GENERATION}_lock_{table}({lock_id}, '{timeout_ms}ms'); \
         EXECUTE idem{GENERATION}_read_{table}("
    )
    .expect("a String takes any text");
    push_bytes(&mut out, key_hash);
    out.push(')');
    out
}

/// [`claim`] on a connection that has not prepared the statements: the
/// transaction the failed attempt began and aborted rolled back, the
/// statements prepared, then the claim.
pub(crate) fn prepare_and_claim(
    table: &str,
    lock_id: i64,
    key_hash: &[u8; 32],
    timeout_ms: u128,
) -> String {
    format!(
        "ROLLBACK; {}",
        prepare_missing_and_claim(table, &[], lock_id, key_hash, timeout_ms)
    )
}

/// The transaction-local setting that marks a lent transaction as the
/// claim's ([`lend`]). A setting made with `set_config(..., true)` lasts
/// until its transaction ends, by COMMIT or ROLLBACK, whoever sends it.
const MARK: &str = "idem.claim";

/// The text [`push_check`]'s failure carries, by which the store knows it
/// (no quote in it: it goes into a literal as it is).
pub(crate) const ENDED: &str = "idem: the transaction of the claim ended before idem settled it";

/// The statement a won claim's transaction is lent to the handler with
/// (`claim_tx.rs`): marks it as the claim of `owner`, whose token it
/// holds in hexadecimal digits, and bounds how long it may sit idle,
/// `idle_ms`: a transaction idle longer (its process paused, its
/// connection frozen) is ended by PostgreSQL with its session, and its key
/// is free. Both settings are the transaction's own (`set_config(...,
/// true)`), gone with it.
pub(crate) fn lend(owner: &[u8], idle_ms: u128) -> String {
    let mut out = String::with_capacity(2 * owner.len() + 128);
    write!(out, "SELECT set_config('{MARK}', '").expect("a String takes any text");
    crate::hex_digits::push(&mut out, owner);
    write!(
        out,
        "', true), set_config('idle_in_transaction_session_timeout', '{idle_ms}', true)"
    )
    .expect("a String takes any text");
    out
}

/// Appends a statement that fails unless the transaction is the one
/// [`lend`] marked for `owner`: the handler may have ended it (a raw
/// COMMIT or ROLLBACK), and a script's statements after it must then not
/// run. It fails with a cast of [`ENDED`] to an integer, evaluated only
/// then: the text depends on `current_setting`, which PostgreSQL does not
/// fold into a constant when it plans the statement.
fn push_check(out: &mut String, owner: &[u8]) {
    write!(out, "SELECT CASE WHEN current_setting('{MARK}', true) = '")
        .expect("a String takes any text");
    crate::hex_digits::push(out, owner);
    write!(
        out,
        "' THEN 0 ELSE ('{ENDED}; marked ' || coalesce(current_setting('{MARK}', true), 'nothing'))::int END"
    )
    .expect("a String takes any text");
}

/// The end of a claim's transaction whose handler's response was not
/// kept: the check that it is still the claim's ([`push_check`]), and a
/// ROLLBACK. `AND CHAIN`: sqlx counts the transaction open
/// (`claim_tx.rs`, `ended`) and ends the empty one chained to it with a
/// ROLLBACK of its own, where a ROLLBACK of nothing would warn.
pub(crate) fn rollback(owner: &[u8]) -> String {
    let mut out = String::with_capacity(2 * owner.len() + 200);
    push_check(&mut out, owner);
    out.push_str("; ROLLBACK AND CHAIN");
    out
}

/// A record that is not replayable (`outcome`), inserted on its own (no
/// transaction open) where none is, to keep the key of a claim whose
/// transaction the handler ended from running again. Values as literals,
/// no prepared statement: through a pooler this may be another session.
pub(crate) fn tombstone(table: &str, record: &Completed<'_>) -> String {
    let mut out = String::with_capacity(table.len() + 2 * record.outcome.len() + 400);
    write!(
        out,
        "INSERT INTO {table} (key_hash, idem_key, state, owner, fingerprint, outcome, expires_at) \
         VALUES ("
    )
    .expect("a String takes any text");
    push_bytes(&mut out, record.key_hash);
    out.push_str(", convert_from(");
    push_bytes(&mut out, record.key.as_bytes());
    out.push_str(", 'UTF8'), 'C', NULL, ");
    push_bytes(&mut out, record.fingerprint);
    out.push_str(", ");
    push_bytes(&mut out, record.outcome);
    write!(
        out,
        ", now() + {} * interval '1 millisecond') ON CONFLICT (key_hash) DO NOTHING",
        record.ttl_ms
    )
    .expect("a String takes any text");
    out
}

/// A transactional claim's completed record.
pub(crate) struct Completed<'a> {
    pub(crate) key_hash: &'a [u8; 32],
    pub(crate) key: &'a str,
    pub(crate) fingerprint: &'a [u8],
    pub(crate) outcome: &'a [u8],
    pub(crate) ttl_ms: i64,
}

/// The end of a transactional claim whose start found no live record: the
/// check that the transaction is still the claim's ([`push_check`]), the
/// completed record inserted (and an expired one of the key deleted:
/// [`prepare_missing`]), COMMIT, which ends the claim's own transaction
/// (`claim_tx.rs`; `AND CHAIN`, as in [`rollback`]). A live record in the
/// way (written past the lock, by a plain claim) makes the insert fail on
/// the unique index, and a failed check fails its statement: the rest of
/// the query is not run, and nothing commits.
pub(crate) fn commit(table: &str, record: &Completed<'_>, owner: &[u8]) -> String {
    let values = [
        &record.key_hash[..],
        record.key.as_bytes(),
        record.fingerprint,
        record.outcome,
    ];
    // Built in place, each value's digits written once: the stored
    // response can be most of the text.
    let digits: usize = values.iter().map(|value| 2 * value.len() + 8).sum();
    let mut out = String::with_capacity(table.len() + digits + 260);
    push_check(&mut out, owner);
    write!(out, "; EXECUTE idem{GENERATION}_insert_{table}(").expect("a String takes any text");
    for value in values {
        push_bytes(&mut out, value);
        out.push_str(", ");
    }
    write!(out, "{}); COMMIT AND CHAIN", record.ttl_ms).expect("a String takes any text");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_hex_digits_in_an_escape_string() {
        assert_eq!(bytes(b"\x00'\\"), r"E'\\x00275c'");
        assert_eq!(
            bytes("a'); DROP TABLE t; --".as_bytes()),
            r"E'\\x6127293b2044524f50205441424c4520743b202d2d'"
        );
        assert_eq!(bytes(b""), r"E'\\x'");
    }
}
