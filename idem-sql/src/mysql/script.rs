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
//! The claim's upsert, its read back and the completion are prepared once
//! per connection with SQL's `PREPARE` and run with `EXECUTE ... USING`
//! user variables in the scripts, so that the server parses the long
//! statements once per connection rather than on every request (parsing
//! them was most of what a text claim cost the server beyond the
//! hand-written statements: BENCHMARKS.md). A connection's first script
//! finds them missing ([`NOT_PREPARED`]: nothing of it but its first `SET`
//! ran) and is sent again after their `PREPARE`s ([`prepare`]), in the same
//! round trip. Prepared statements are the session's and outlive its
//! transactions; they are named after the table, so that stores of several
//! tables share a pool, and after their [`GENERATION`].
//!
//! A text query has no parameters: the values are written into its text,
//! as user variables the `EXECUTE`s take. Only values the store makes go
//! there, in forms that cannot end a literal: integers as digits, bytes as
//! hexadecimal literals (`X'…'`), the key as the hexadecimal literal of its
//! UTF-8 bytes, converted. The table name is a checked identifier
//! (`validate_identifier`). The statements are the store's own, rendered
//! once with `?` parameters.
//!
//! A stored response goes into the commit's text as two digits a byte, so
//! the query is about twice the response's size and must fit the server's
//! `max_allowed_packet` (MariaDB's default 16 MiB, MySQL's 64 MiB): far
//! above idem's default cap on a stored response (256 KiB), but a cap
//! raised past about 8 MiB needs the server's raised too. The user variable
//! that carries it is emptied in the same script.

use crate::dialect::{ClaimArgs, Queries};

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

/// Appends `SET` with `assignments` (a session variable, or a user
/// variable and the value it takes), comma-separated.
fn push_set(out: &mut String, assignments: &[(&str, Literal<'_>)]) {
    out.push_str("SET ");
    for (n, (variable, value)) in assignments.iter().enumerate() {
        if n > 0 {
            out.push_str(", ");
        }
        out.push_str(variable);
        out.push_str(" = ");
        value.push(out);
    }
}

/// The session variable of the lock wait, in whole seconds.
const LOCK_WAIT: &str = "SESSION innodb_lock_wait_timeout";

/// The generation of the prepared statements, part of their names: raised
/// whenever a statement's text or parameters change, so that a connection
/// never runs another version's statement under the same name.
const GENERATION: u32 = 1;

/// One of the statements a transactional claim prepares.
#[derive(Clone, Copy)]
enum Prepared {
    /// The store's `claim` upsert: key hash, key, owner, fingerprint, lease
    /// in milliseconds.
    Claim,
    /// The store's `select`: key hash.
    Select,
    /// The store's `complete`: outcome, retention in milliseconds, key
    /// hash, owner.
    Complete,
}

impl Prepared {
    const ALL: [Self; 3] = [Self::Claim, Self::Select, Self::Complete];

    /// Appends its name on `table`.
    fn push_name(self, out: &mut String, table: &str) {
        out.push_str("idem");
        out.push_str(&GENERATION.to_string());
        out.push_str(match self {
            Self::Claim => "_claim_",
            Self::Select => "_select_",
            Self::Complete => "_complete_",
        });
        out.push_str(table);
    }

    fn body(self, q: &Queries) -> &str {
        match self {
            Self::Claim => &q.claim,
            Self::Select => &q.select,
            Self::Complete => &q.complete,
        }
    }

    /// Appends `EXECUTE` of it with the user variables `using`.
    fn push_execute(self, out: &mut String, table: &str, using: &[&str]) {
        out.push_str("EXECUTE ");
        self.push_name(out, table);
        out.push_str(" USING ");
        out.push_str(&using.join(", "));
    }
}

/// MySQL's error when an `EXECUTE` names a statement the session has not
/// prepared (`ER_UNKNOWN_STMT_HANDLER`).
pub(crate) const NOT_PREPARED: u32 = 1243;

/// The `PREPARE`s of the statements the scripts execute, on `q`'s table,
/// then `script`: a script sent again on a connection where it found them
/// missing. Preparing a name the session has prepared replaces it.
pub(crate) fn prepare(q: &Queries, script: &str) -> String {
    let mut out = String::new();
    for statement in Prepared::ALL {
        out.push_str("PREPARE ");
        statement.push_name(&mut out, &q.table);
        // A string literal: the statements' own quotes doubled (they hold
        // no backslash, which would read differently under
        // NO_BACKSLASH_ESCAPES).
        out.push_str(" FROM '");
        out.push_str(&statement.body(q).replace('\'', "''"));
        out.push_str("'; ");
    }
    out.push_str(script);
    out
}

/// MySQL's error when a scalar subquery returns more than one row
/// (`ER_SUBQUERY_NO_1_ROW`): what [`commit`]'s check raises when the
/// completion found no row of the claim's.
pub(crate) const NOT_COMPLETED: u32 = 1242;

/// The start of a transactional claim, in the transaction just begun: the
/// claim's row written (the store's `claim` upsert, `q.claim`, prepared)
/// under no lock wait, so that another transaction's claim of the key
/// fails it at once with a lock wait timeout; then the session's lock wait
/// for the handler's statements, `lock_wait_secs`; then the key's row, by
/// the store's `select`.
///
/// If the upsert fails, nothing after it runs: the session's lock wait is
/// still 0, and the caller sets it back ([`lock_wait`]).
pub(crate) fn claim(q: &Queries, args: &ClaimArgs<'_>, lock_wait_secs: u64) -> String {
    let table = &*q.table;
    let mut out = String::with_capacity(512 + table.len() * 2);
    push_set(
        &mut out,
        &[
            (LOCK_WAIT, Literal::Int(0)),
            ("@idem_hash", Literal::Bytes(args.key_hash)),
            ("@idem_key", Literal::Text(args.key)),
            ("@idem_owner", Literal::Bytes(args.owner.as_bytes())),
            (
                "@idem_fingerprint",
                Literal::Bytes(args.fingerprint.as_bytes()),
            ),
            ("@idem_lease", Literal::Int(args.lease_ms)),
        ],
    );
    out.push_str("; ");
    Prepared::Claim.push_execute(
        &mut out,
        table,
        &[
            "@idem_hash",
            "@idem_key",
            "@idem_owner",
            "@idem_fingerprint",
            "@idem_lease",
        ],
    );
    out.push_str("; ");
    out.push_str(&lock_wait(lock_wait_secs));
    out.push_str("; ");
    Prepared::Select.push_execute(&mut out, table, &["@idem_hash"]);
    out
}

/// Sets the session's lock wait, in whole seconds.
pub(crate) fn lock_wait(secs: u64) -> String {
    format!("SET {LOCK_WAIT} = {secs}")
}

/// A transactional claim's completed record.
pub(crate) struct Completed<'a> {
    pub(crate) key_hash: &'a [u8; 32],
    pub(crate) owner: &'a [u8],
    pub(crate) outcome: &'a [u8],
    pub(crate) ttl_ms: i64,
}

/// The end of a transactional claim: its row completed (the store's
/// `complete`, prepared), a check that it was (the row the claim wrote,
/// still its own: its transaction's lock keeps every other writer off it,
/// so this holds unless something past the store changed it), and COMMIT.
/// A failed check raises [`NOT_COMPLETED`], and the COMMIT after it is not
/// run: nothing commits.
///
/// The check reads `ROW_COUNT()`, the rows the update matched (sqlx
/// connects with `CLIENT_FOUND_ROWS`): one, or a scalar subquery of two
/// rows, which fails the statement. It assigns a session variable rather
/// than selecting, so that it answers no result set (whose column
/// metadata sqlx would decode); the same `SET` empties the variable that
/// carried the outcome.
pub(crate) fn commit(q: &Queries, record: &Completed<'_>) -> String {
    let mut out = String::with_capacity(2 * record.outcome.len() + 512 + q.table.len());
    push_set(
        &mut out,
        &[
            ("@idem_outcome", Literal::Bytes(record.outcome)),
            ("@idem_ttl", Literal::Int(record.ttl_ms)),
            ("@idem_hash", Literal::Bytes(record.key_hash)),
            ("@idem_owner", Literal::Bytes(record.owner)),
        ],
    );
    out.push_str("; ");
    Prepared::Complete.push_execute(
        &mut out,
        &q.table,
        &["@idem_outcome", "@idem_ttl", "@idem_hash", "@idem_owner"],
    );
    out.push_str(
        "; SET @idem_outcome = NULL, @idem_completed = \
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
    fn assignments_are_comma_separated() {
        let mut out = String::new();
        push_set(
            &mut out,
            &[
                (LOCK_WAIT, Literal::Int(-3)),
                ("@a", Literal::Text("é'")),
                ("@b", Literal::Bytes(&[1, 255])),
            ],
        );
        assert_eq!(
            out,
            "SET SESSION innodb_lock_wait_timeout = -3, \
             @a = CONVERT(X'c3a927' USING utf8mb4), @b = X'01ff'"
        );
    }

    #[test]
    fn statements_are_prepared_as_string_literals() {
        let q = Queries {
            claim: "INSERT INTO t VALUES (?, 'I')".into(),
            select: "SELECT a FROM t WHERE k = ?".into(),
            complete: "UPDATE t SET s = 'C' WHERE k = ?".into(),
            release: "".into(),
            renew: "".into(),
            purge: "".into(),
            table: "t".into(),
        };
        assert_eq!(
            prepare(&q, "EXECUTE idem1_select_t USING @idem_hash"),
            "PREPARE idem1_claim_t FROM 'INSERT INTO t VALUES (?, ''I'')'; \
             PREPARE idem1_select_t FROM 'SELECT a FROM t WHERE k = ?'; \
             PREPARE idem1_complete_t FROM 'UPDATE t SET s = ''C'' WHERE k = ?'; \
             EXECUTE idem1_select_t USING @idem_hash"
        );
    }
}
