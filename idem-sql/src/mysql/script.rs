//! A transactional claim's statements on MySQL/MariaDB, sent several to a
//! round trip.
//!
//! sqlx sends a prepared statement alone and waits for its answer, and
//! MySQL prepares one statement at a time. A text query carries several
//! (sqlx connects with `CLIENT_MULTI_STATEMENTS`): the server runs them in
//! order, stops at the first that fails, and answers them all in one round
//! trip. So a transactional claim costs no round trip of its own: its
//! BEGIN, the claim's row written, the session's lock wait set for the
//! handler and the row read back go in one, where sqlx would have sent
//! BEGIN alone, and the row is completed in the round trip of COMMIT.
//!
//! The claim's upsert, its read back and the completion are prepared once
//! per connection with SQL's `PREPARE` and run with `EXECUTE ... USING`
//! user variables in the scripts, so that the server parses the long
//! statements once per connection rather than on every request (parsing
//! them was most of what a text claim cost the server beyond the
//! hand-written statements: BENCHMARKS.md). A connection's first script
//! finds them missing ([`NOT_PREPARED`]: nothing of it but its BEGIN and
//! first `SET` ran) and is sent again after their `PREPARE`s ([`prepare`]);
//! a claim's BEGIN sent again ends the empty transaction the first began. Prepared statements are the session's and outlive its
//! transactions; they are named after the table, so that stores of several
//! tables share a pool, and after their [`GENERATION`].
//!
//! On MariaDB 10.5 and later ([`Server::MariaDb`]) the claim is one
//! statement where MySQL needs three: the upsert answers the row with
//! `RETURNING` (no read back), waits for no lock by `SET STATEMENT
//! innodb_lock_wait_timeout = 0 FOR` (the session's lock wait stays the
//! handler's), and `EXECUTE ... USING` takes the values themselves, not
//! user variables. Every statement of a text query is a dispatch and an
//! answer of its own, sent apart, and the client wakes to read each; so
//! MariaDB's commit is one compound statement (`BEGIN NOT ATOMIC ...
//! END`), answered once, whose check signals rather than fails a
//! subquery.
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

use std::borrow::Cow;

use crate::dialect::{ClaimArgs, Queries};

/// The server a store's scripts are written for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Server {
    /// MySQL, or a MariaDB before 10.5: the scripts of portable statements.
    MySql,
    /// MariaDB 10.5 and later: `INSERT ... RETURNING`, `SET STATEMENT`,
    /// `EXECUTE ... USING` values.
    MariaDb,
}

impl Server {
    /// The server whose `VERSION()` is `version`.
    pub(crate) fn of(version: &str) -> Self {
        let Some(at) = version.find("-MariaDB") else {
            return Self::MySql;
        };
        let mut numbers = version[..at].split('.').map(str::parse::<u32>);
        match (numbers.next(), numbers.next()) {
            (Some(Ok(major)), Some(Ok(minor))) if (major, minor) >= (10, 5) => Self::MariaDb,
            _ => Self::MySql,
        }
    }
}

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
    /// MariaDB's claim: the store's `claim` upsert under no lock wait,
    /// answering the row as `select` reads it (`claim_returning`).
    ClaimReturning,
}

impl Prepared {
    /// The statements the scripts for `server` execute.
    fn all(server: Server) -> &'static [Self] {
        match server {
            Server::MySql => &[Self::Claim, Self::Select, Self::Complete],
            Server::MariaDb => &[Self::ClaimReturning, Self::Complete],
        }
    }

    /// Appends its name on `table`.
    fn push_name(self, out: &mut String, table: &str) {
        out.push_str("idem");
        out.push_str(&GENERATION.to_string());
        out.push_str(match self {
            Self::Claim => "_claim_",
            Self::Select => "_select_",
            Self::Complete => "_complete_",
            Self::ClaimReturning => "_claimr_",
        });
        out.push_str(table);
    }

    fn body(self, q: &Queries) -> Cow<'_, str> {
        match self {
            Self::Claim => Cow::Borrowed(&q.claim),
            Self::Select => Cow::Borrowed(&q.select),
            Self::Complete => Cow::Borrowed(&q.complete),
            Self::ClaimReturning => Cow::Owned(super::claim_returning(q)),
        }
    }

    /// Appends `EXECUTE` of it with `values` themselves (MariaDB).
    fn push_execute_values(self, out: &mut String, table: &str, values: &[Literal<'_>]) {
        out.push_str("EXECUTE ");
        self.push_name(out, table);
        out.push_str(" USING ");
        for (n, value) in values.iter().enumerate() {
            if n > 0 {
                out.push_str(", ");
            }
            value.push(out);
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

/// The `PREPARE`s of the statements the scripts for `server` execute, on
/// `q`'s table, then `script`: a script sent again on a connection where it
/// found them missing. Preparing a name the session has prepared replaces
/// it.
pub(crate) fn prepare(q: &Queries, server: Server, script: &str) -> String {
    let mut out = String::new();
    for &statement in Prepared::all(server) {
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
/// completion found no row of the claim's, and the number MariaDB's
/// compound commit signals then ([`commit_mariadb`]).
pub(crate) const NOT_COMPLETED: u32 = 1242;

/// The savepoint that marks a lent transaction as the claim's ([`lend`]):
/// a savepoint lasts until its transaction ends, by COMMIT or ROLLBACK,
/// whoever sends it, or the database rolls it back (a deadlock, a Galera
/// abort); a handler's nested transactions are savepoints of sqlx's names.
const MARK: &str = "idem_claim";

/// MySQL's error when a savepoint does not exist (`ER_SP_DOES_NOT_EXIST`):
/// what releasing [`MARK`] raises once the claim's transaction ended.
pub(crate) const NO_SAVEPOINT: u32 = 1305;

/// The statement a won claim's transaction is lent to the handler with
/// (`claim_tx.rs`): the session out of autocommit, on MariaDB its idle
/// transactions bounded by `idle_secs`, and [`MARK`] set.
///
/// Out of autocommit, a statement after the transaction ended (the
/// handler's own COMMIT or ROLLBACK, or the database's rollback of a
/// deadlock or a Galera abort, after which MySQL runs each statement on
/// its own) begins a transaction instead of committing alone, and the
/// store rolls that back when it finds [`MARK`] gone: nothing the handler
/// writes after its transaction ended is ever kept. [`AUTOCOMMIT`] sets
/// the session back on every end of the transaction (`mysql.rs`,
/// `end_transaction`).
///
/// On MariaDB (10.3 and later) the transaction may sit idle no longer
/// than `idle_secs`: past it (its process paused, its connection frozen)
/// MariaDB ends the session, the transaction rolls back and the key is
/// free. MySQL has no such bound: its `/*M!...*/` is a comment there,
/// which MariaDB runs.
pub(crate) fn lend(idle_secs: u64) -> String {
    format!(
        "SET autocommit = 0 /*M!100300 , idle_transaction_timeout = {idle_secs} */; \
         SAVEPOINT {MARK}"
    )
}

/// [`MARK`] set again, before a commit is sent again after its first run
/// released it and stopped at an `EXECUTE` of a statement the session had
/// not prepared (`mysql.rs`, `run_prepared`).
pub(crate) fn remark() -> String {
    format!("SAVEPOINT {MARK}; ")
}

/// The session set back to autocommit, and MariaDB's bound on idle
/// transactions to the server's, after a lent transaction ended, last in
/// every statement that ends it ([`lend`]). After the ROLLBACK or COMMIT:
/// setting autocommit commits a transaction still open.
pub(crate) const AUTOCOMMIT: &str =
    "SET autocommit = 1 /*M!100300 , idle_transaction_timeout = DEFAULT */";

/// The end of a claim's transaction whose handler's response was not
/// kept: [`MARK`] released, which fails with [`NO_SAVEPOINT`] if the
/// transaction was no longer the claim's, ROLLBACK, and [`AUTOCOMMIT`].
pub(crate) fn rollback() -> String {
    format!("RELEASE SAVEPOINT {MARK}; ROLLBACK; {AUTOCOMMIT}")
}

/// The start of a transactional claim: BEGIN (the transaction is the
/// claim's own, `claim_tx.rs`); the claim's row written (the store's `claim` upsert, `q.claim`, prepared)
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
    out.push_str("BEGIN; ");
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

/// [`claim`] on MariaDB ([`Server::MariaDb`]), one compound statement
/// (`BEGIN NOT ATOMIC ... END`, answered with the upsert's row and one
/// packet more): START TRANSACTION, the session's lock wait for the
/// handler's statements, `lock_wait_secs`, then the claim's upsert, which
/// waits for no lock by itself and answers the key's row. If the upsert
/// fails, the session's lock wait is already the handler's.
pub(crate) fn claim_mariadb(q: &Queries, args: &ClaimArgs<'_>, lock_wait_secs: u64) -> String {
    let mut out = String::with_capacity(384 + q.table.len());
    out.push_str("BEGIN NOT ATOMIC START TRANSACTION; ");
    out.push_str(&lock_wait(lock_wait_secs));
    out.push_str("; ");
    Prepared::ClaimReturning.push_execute_values(
        &mut out,
        &q.table,
        &[
            Literal::Bytes(args.key_hash),
            Literal::Text(args.key),
            Literal::Bytes(args.owner.as_bytes()),
            Literal::Bytes(args.fingerprint.as_bytes()),
            Literal::Int(args.lease_ms),
        ],
    );
    out.push_str("; END");
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
    push_release(&mut out);
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
    // The variable that carried the outcome emptied in the check's `SET`.
    out.push_str("; SET @idem_outcome = NULL, ");
    out.push_str(CHECK);
    out.push_str("; COMMIT; ");
    out.push_str(AUTOCOMMIT);
    out
}

/// [`commit`] on MariaDB ([`Server::MariaDb`]): one compound statement
/// (`BEGIN NOT ATOMIC ... END`), with the completion's values in its
/// `EXECUTE` (no user variable to set or to empty) and the check an `IF`
/// that signals [`NOT_COMPLETED`]. A compound statement is answered once,
/// where each statement of a text query is answered with a packet of its
/// own: the server sends one packet for the commit, not three, and the
/// client wakes once to read it.
pub(crate) fn commit_mariadb(q: &Queries, record: &Completed<'_>) -> String {
    let mut out = String::with_capacity(2 * record.outcome.len() + 384 + q.table.len());
    out.push_str("BEGIN NOT ATOMIC ");
    push_release(&mut out);
    Prepared::Complete.push_execute_values(
        &mut out,
        &q.table,
        &[
            Literal::Bytes(record.outcome),
            Literal::Int(record.ttl_ms),
            Literal::Bytes(record.key_hash),
            Literal::Bytes(record.owner),
        ],
    );
    out.push_str("; ");
    out.push_str(SIGNAL_UNLESS_COMPLETED);
    out.push_str("; COMMIT; ");
    out.push_str(AUTOCOMMIT);
    out.push_str("; END");
    out
}

/// Appends the release of [`MARK`], first in a commit: if the transaction
/// is no longer the claim's it fails with [`NO_SAVEPOINT`], and nothing
/// after it runs (the completion would otherwise commit on its own).
fn push_release(out: &mut String) {
    out.push_str("RELEASE SAVEPOINT ");
    out.push_str(MARK);
    out.push_str("; ");
}

/// The check after the completion in MariaDB's compound commit
/// ([`commit_mariadb`]): [`NOT_COMPLETED`] signalled unless the update
/// matched one row.
const SIGNAL_UNLESS_COMPLETED: &str = "IF ROW_COUNT() <> 1 THEN \
     SIGNAL SQLSTATE '45000' SET MYSQL_ERRNO = 1242, \
     MESSAGE_TEXT = 'idem: the claim''s record was not completed'; END IF";

/// The check after the completion, an assignment of a `SET` ([`commit`]).
const CHECK: &str = "@idem_completed = \
     (SELECT 1 FROM DUAL UNION ALL SELECT 2 FROM DUAL WHERE ROW_COUNT() <> 1)";

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
            mariadb: std::sync::OnceLock::new(),
        };
        assert_eq!(
            prepare(&q, Server::MySql, "EXECUTE idem1_select_t USING @idem_hash"),
            "PREPARE idem1_claim_t FROM 'INSERT INTO t VALUES (?, ''I'')'; \
             PREPARE idem1_select_t FROM 'SELECT a FROM t WHERE k = ?'; \
             PREPARE idem1_complete_t FROM 'UPDATE t SET s = ''C'' WHERE k = ?'; \
             EXECUTE idem1_select_t USING @idem_hash"
        );
    }

    #[test]
    fn mariadb_from_10_5_takes_its_own_scripts() {
        for (version, server) in [
            ("10.11.19-MariaDB-0+deb12u1", Server::MariaDb),
            ("10.5.0-MariaDB", Server::MariaDb),
            ("11.4.2-MariaDB-log", Server::MariaDb),
            ("10.4.34-MariaDB", Server::MySql),
            ("8.0.36", Server::MySql),
            ("8.4.0-commercial", Server::MySql),
            ("", Server::MySql),
        ] {
            assert_eq!(Server::of(version), server, "{version}");
        }
    }

    #[test]
    fn mariadb_claims_execute_their_values() {
        let q = Queries {
            claim: "".into(),
            select: "".into(),
            complete: "".into(),
            release: "".into(),
            renew: "".into(),
            purge: "".into(),
            table: "t".into(),
            mariadb: std::sync::OnceLock::new(),
        };
        let (hash, owner) = ([1; 32], idem_core::OwnerToken::generate());
        let fingerprint = idem_core::Fingerprint::from_bytes([2; 32]);
        let args = ClaimArgs {
            key_hash: &hash,
            key: "k'",
            fingerprint: &fingerprint,
            owner: &owner,
            lease_ms: 30_000,
        };
        let script = claim_mariadb(&q, &args, 7);
        let owner_hex = bytes(owner.as_bytes());
        assert_eq!(
            script,
            format!(
                "BEGIN NOT ATOMIC START TRANSACTION; SET SESSION innodb_lock_wait_timeout = 7; \
                 EXECUTE idem1_claimr_t USING {}, CONVERT(X'6b27' USING utf8mb4), {owner_hex}, \
                 {}, 30000; END",
                bytes(&hash),
                bytes(&[2; 32]),
            )
        );
        let commit = commit_mariadb(
            &q,
            &Completed {
                key_hash: &hash,
                owner: owner.as_bytes(),
                outcome: b"o",
                ttl_ms: 5,
            },
        );
        assert_eq!(
            commit,
            format!(
                "BEGIN NOT ATOMIC RELEASE SAVEPOINT idem_claim; \
                 EXECUTE idem1_complete_t USING X'6f', 5, {}, {owner_hex}; \
                 {SIGNAL_UNLESS_COMPLETED}; COMMIT; {AUTOCOMMIT}; END",
                bytes(&hash)
            ),
        );
        assert!(
            SIGNAL_UNLESS_COMPLETED.contains(&format!("MYSQL_ERRNO = {NOT_COMPLETED},")),
            "the check signals the error the commit looks for"
        );
    }
}
