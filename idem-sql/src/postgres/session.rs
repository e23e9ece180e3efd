//! A plain claim's statements (claim, read, complete, release, renew,
//! purge): prepared once per server session with SQL's `PREPARE`, and run
//! with `EXECUTE` in a simple query whose values are written into its text
//! ([`literal`]).
//!
//! Not sqlx's own statements, named (`sqlx_s_1`) or unnamed: each is parsed
//! in one round trip and run in another, outside any transaction, and a
//! pooler in transaction pooling (PgBouncer) may send the two to different
//! server sessions, shared with other clients. A simple query is one
//! message, answered whole by one session: it finds the statement there or
//! prepares it there, in the same query. ARCHITECTURE.md, "Behind a
//! pooler".

use sqlx::postgres::{PgConnection, PgRow};
use sqlx::{AssertSqlSafe, Either};

use futures_util::TryStreamExt;

use super::literal::literal;
use super::script::{ALREADY_PREPARED, NOT_PREPARED};
use crate::dialect::{Queries, Value, has_code};

/// The generation of the statements below, part of their names: raised
/// whenever a statement's text or parameters change, so that during a
/// rolling upgrade two versions of the store sharing a server session
/// (through a pooler) each find their own.
const GENERATION: u32 = 1;

/// How many times a statement is tried while the sessions it lands on
/// disagree on having it prepared (a pooler's sessions, one prepared and
/// one not): each try that failed ran nothing.
const ATTEMPTS: usize = 4;

/// One of the plain claim's statements.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Statement {
    Claim,
    Read,
    Complete,
    Release,
    Renew,
    Purge,
}

impl Statement {
    fn what(self) -> &'static str {
        match self {
            Self::Claim => "claim",
            Self::Read => "select",
            Self::Complete => "complete",
            Self::Release => "release",
            Self::Renew => "renew",
            Self::Purge => "purge",
        }
    }

    /// The types of its parameters, in the order `Queries` numbers them.
    fn parameters(self) -> &'static str {
        match self {
            // key hash, key, owner, fingerprint, lease ms, advisory lock id
            Self::Claim => "(bytea, text, bytea, bytea, bigint, bigint)",
            Self::Read => "(bytea)",
            // outcome, ttl ms, key hash, owner
            Self::Complete => "(bytea, bigint, bytea, bytea)",
            Self::Release => "(bytea, bytea)",
            // lease ms, key hash, owner
            Self::Renew => "(bigint, bytea, bytea)",
            Self::Purge => "(bigint)",
        }
    }

    fn body(self, q: &Queries) -> &str {
        match self {
            Self::Claim => &q.claim,
            Self::Read => &q.select,
            Self::Complete => &q.complete,
            Self::Release => &q.release,
            Self::Renew => &q.renew,
            Self::Purge => &q.purge,
        }
    }

    /// Its name on `table`, as PostgreSQL keeps it (folded to lower case).
    fn name(self, table: &str) -> String {
        format!("idem{GENERATION}_plain_{}_{table}", self.what()).to_lowercase()
    }
}

/// What a statement answered: its rows, and how many rows it changed.
pub(crate) struct Answered {
    pub(crate) rows: Vec<PgRow>,
    pub(crate) changed: u64,
}

/// Runs `statement` with `args` on `conn`, outside a transaction, in one
/// round trip where the session has it prepared, and in two the first time
/// a session is met.
pub(crate) async fn run(
    conn: &mut PgConnection,
    q: &Queries,
    statement: Statement,
    args: &[Value<'_>],
) -> Result<Answered, sqlx::Error> {
    let name = statement.name(&q.table);
    let values = args.iter().map(literal).collect::<Vec<_>>().join(", ");
    let execute = format!("EXECUTE {name}({values})");
    for _ in 0..ATTEMPTS {
        match simple(conn, execute.clone()).await {
            Err(err) if has_code(&err, &[NOT_PREPARED]) => {}
            answered => return answered,
        }
        let prepare = format!(
            "PREPARE {name} {} AS {}; {execute}",
            statement.parameters(),
            statement.body(q),
        );
        match simple(conn, prepare).await {
            // This query met a session that has it: the next may too.
            Err(err) if has_code(&err, &[ALREADY_PREPARED]) => {}
            answered => return answered,
        }
    }
    Err(sqlx::Error::Protocol(format!(
        "statement {name} was neither found nor prepared in {ATTEMPTS} tries: \
         the server sessions behind the connection keep changing"
    )))
}

/// Sends `sql` as one simple query.
async fn simple(conn: &mut PgConnection, sql: String) -> Result<Answered, sqlx::Error> {
    let mut answered = Answered {
        rows: Vec::new(),
        changed: 0,
    };
    let mut stream = sqlx::raw_sql(AssertSqlSafe(sql)).fetch_many(&mut *conn);
    while let Some(item) = stream.try_next().await? {
        match item {
            Either::Left(done) => answered.changed += done.rows_affected(),
            Either::Right(row) => answered.rows.push(row),
        }
    }
    Ok(answered)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_per_table_and_generation() {
        assert_eq!(
            Statement::Claim.name("Idem_Records"),
            "idem1_plain_claim_idem_records"
        );
        assert_eq!(Statement::Read.name("t"), "idem1_plain_select_t");
    }
}
