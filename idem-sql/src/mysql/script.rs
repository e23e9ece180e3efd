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
//! name is a checked identifier (`validate_identifier`). The statements
//! are the store's own, rendered once with `?` parameters, the values
//! spliced in where those are.
//!
//! A stored response goes into the commit's text as two digits a byte, so
//! the query is about twice the response's size and must fit the server's
//! `max_allowed_packet` (MariaDB's default 16 MiB, MySQL's 64 MiB): far
//! above idem's default cap on a stored response (256 KiB), but a cap
//! raised past about 8 MiB needs the server's raised too.

use crate::dialect::ClaimArgs;

/// `value` as a binary string literal: `X'…'`, two hexadecimal digits a
/// byte.
#[cfg(test)]
pub(crate) fn bytes(value: &[u8]) -> String {
    let mut out = String::new();
    Literal::Bytes(value).push(&mut out);
    out
}

/// A value written into a script.
#[derive(Clone, Copy)]
enum Literal<'a> {
    /// `X'…'`.
    Bytes(&'a [u8]),
    /// Text as the literal of its UTF-8 bytes, converted.
    Text(&'a str),
    /// Digits.
    Int(i64),
}

impl Literal<'_> {
    fn push(self, out: &mut String) {
        match self {
            Self::Bytes(value) => {
                out.push_str("X'");
                crate::hex_digits::push(out, value);
                out.push('\'');
            }
            Self::Text(text) => {
                out.push_str("CONVERT(");
                Self::Bytes(text.as_bytes()).push(out);
                out.push_str(" USING utf8mb4)");
            }
            Self::Int(n) => out.push_str(&n.to_string()),
        }
    }
}

/// Appends `statement` (one of the store's prepared statements, its
/// parameters `?`) with its parameters replaced, in order, by `values`:
/// the statement's text is rendered once per store, and a script only
/// splices the values in. The store's statements have no `?` but their
/// parameters (the table name is an identifier).
fn push_with(out: &mut String, statement: &str, values: &[Literal<'_>]) {
    let mut values = values.iter();
    for (n, piece) in statement.split('?').enumerate() {
        if n > 0 {
            values.next().expect("a value for each parameter").push(out);
        }
        out.push_str(piece);
    }
}

/// MySQL's error when a scalar subquery returns more than one row
/// (`ER_SUBQUERY_NO_1_ROW`): what [`commit`]'s check raises when the
/// completion found no row of the claim's.
pub(crate) const NOT_COMPLETED: u32 = 1242;

/// The start of a transactional claim, in the transaction just begun: the
/// claim's row written (the store's `claim` upsert, `upsert`, its values
/// literals) under no lock wait, so that another transaction's claim of
/// the key fails it at once with a lock wait timeout; then the session's
/// lock wait for the handler's statements, `lock_wait_secs`; then the
/// key's row, by the store's `select`, `select`.
///
/// If the upsert fails, nothing after it runs: the session's lock wait is
/// still 0, and the caller sets it back ([`lock_wait`]).
pub(crate) fn claim(
    upsert: &str,
    select: &str,
    args: &ClaimArgs<'_>,
    lock_wait_secs: u64,
) -> String {
    let hash = Literal::Bytes(args.key_hash);
    let mut out = String::with_capacity(upsert.len() + select.len() + 512);
    out.push_str(&lock_wait(0));
    out.push_str("; ");
    push_with(
        &mut out,
        upsert,
        &[
            hash,
            Literal::Text(args.key),
            Literal::Bytes(args.owner.as_bytes()),
            Literal::Bytes(args.fingerprint.as_bytes()),
            Literal::Int(args.lease_ms),
        ],
    );
    out.push_str("; ");
    out.push_str(&lock_wait(lock_wait_secs));
    out.push_str("; ");
    push_with(&mut out, select, &[hash]);
    out
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

/// The end of a transactional claim: its row completed (the store's
/// `complete`, `complete`), a check that it was (the row the claim wrote,
/// still its own: its transaction's lock keeps every other writer off it,
/// so this holds unless something past the store changed it), and COMMIT.
/// A failed check raises [`NOT_COMPLETED`], and the COMMIT after it is not
/// run: nothing commits.
///
/// The check reads `ROW_COUNT()`, the rows the update matched (sqlx
/// connects with `CLIENT_FOUND_ROWS`): one, or a scalar subquery of two
/// rows, which fails the statement. It assigns a session variable rather
/// than selecting, so that it answers no result set (whose column
/// metadata sqlx would decode).
pub(crate) fn commit(complete: &str, record: &Completed<'_>) -> String {
    let mut out = String::with_capacity(complete.len() + 2 * record.outcome.len() + 256);
    push_with(
        &mut out,
        complete,
        &[
            Literal::Bytes(record.outcome),
            Literal::Int(record.ttl_ms),
            Literal::Bytes(record.key_hash),
            Literal::Bytes(record.owner),
        ],
    );
    out.push_str(
        "; SET @idem_completed = \
         (SELECT 1 FROM DUAL UNION ALL SELECT 2 FROM DUAL WHERE ROW_COUNT() <> 1); \
         COMMIT",
    );
    out
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

    #[test]
    fn values_go_where_the_parameters_are() {
        let mut out = String::new();
        push_with(
            &mut out,
            "UPDATE t SET a = ?, b = ? WHERE k = ?",
            &[
                Literal::Int(-3),
                Literal::Text("é'"),
                Literal::Bytes(&[1, 255]),
            ],
        );
        assert_eq!(
            out,
            "UPDATE t SET a = -3, b = CONVERT(X'c3a927' USING utf8mb4) WHERE k = X'01ff'"
        );
    }
}
