//! Opening a sqlx pool from a database URL, for the example binaries.

use std::str::FromStr;
use std::time::Duration;

use idem_tower::sql::sqlx::{
    self, MySqlPool, PgPool, SqlitePool,
    mysql::MySqlPoolOptions,
    postgres::PgPoolOptions,
    sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous},
};

/// How long a request waits for a PostgreSQL or MySQL connection: while
/// the server is down, the pool keeps failing to connect, and after this
/// the request is answered 503 with `Retry-After` instead of hanging on
/// (sqlx's default is 30 s). It also bounds how long a duplicate waits for
/// a concurrent first attempt's turn (idem waits up to the pool's acquire
/// timeout), and how late a plain-mode answer can follow its commit while
/// the database is away, which the fault suite's checker allows for.
pub const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(3);

/// A pool on one of the three databases.
#[derive(Debug, Clone)]
pub enum SqlPool {
    /// `postgres://...` or `postgresql://...`.
    Postgres(PgPool),
    /// `mysql://...` or `mariadb://...`.
    MySql(MySqlPool),
    /// `sqlite://PATH`, created if missing, in WAL mode; see
    /// [`SqlPool::connect`] for `?synchronous=`.
    Sqlite(SqlitePool),
}

impl SqlPool {
    /// Connects to `url` with up to `max_connections` (SQLite, one writer at
    /// a time, gets at most 8).
    ///
    /// SQLite runs in WAL mode with `synchronous = NORMAL` unless the URL
    /// ends in `?synchronous=full`. NORMAL does not sync the disk at every
    /// commit, only at checkpoints: a commit survives the process crashing
    /// (`kill -9`, a panic, running out of memory), but an operating system
    /// crash or a power loss may lose the last commits, idempotency records
    /// included, so a retry after one could run again. FULL syncs every
    /// commit and survives both, at several times the cost per write.
    ///
    /// A PostgreSQL URL may end in `?pooler=transaction`: the database is
    /// reached through a pooler in transaction pooling, such as PgBouncer
    /// (see [`behind_transaction_pooler`]); the parameter is the app's, not
    /// sent to sqlx.
    pub async fn connect(url: &str, max_connections: u32) -> Result<Self, sqlx::Error> {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            let (url, _) = pooler(url);
            let pool = PgPoolOptions::new()
                .max_connections(max_connections)
                .acquire_timeout(ACQUIRE_TIMEOUT);
            Ok(Self::Postgres(pool.connect(&url).await?))
        } else if url.starts_with("mysql://") || url.starts_with("mariadb://") {
            let pool = MySqlPoolOptions::new()
                .max_connections(max_connections)
                .acquire_timeout(ACQUIRE_TIMEOUT);
            Ok(Self::MySql(
                pool.connect(&url.replacen("mariadb://", "mysql://", 1))
                    .await?,
            ))
        } else if url.starts_with("sqlite:") {
            let (url, synchronous) = sqlite_synchronous(url)?;
            let options = SqliteConnectOptions::from_str(&url)?
                .create_if_missing(true)
                .journal_mode(SqliteJournalMode::Wal)
                .synchronous(synchronous)
                .busy_timeout(Duration::from_secs(10));
            // A file has no connection to go stale, and sqlx's test of an
            // idle connection at every acquire is one more trip to the
            // connection's worker thread (4-10% of a first request's CPU in
            // the benchmark, synchronous NORMAL).
            let pool = SqlitePoolOptions::new()
                .max_connections(max_connections.min(8))
                .test_before_acquire(false);
            Ok(Self::Sqlite(pool.connect_with(options).await?))
        } else {
            Err(sqlx::Error::Configuration(
                format!(
                    "unsupported database {url:?}: use sqlite://PATH, postgres://... or mysql://..."
                )
                .into(),
            ))
        }
    }
}

/// Whether the PostgreSQL `url` says the database is reached through a
/// pooler in transaction pooling (`?pooler=transaction`): then the app's
/// statements run unnamed, in transactions (docs/poolers.md).
pub fn behind_transaction_pooler(url: &str) -> bool {
    pooler(url).1
}

/// `url` without its `pooler=` parameter, and whether it said
/// `transaction`.
fn pooler(url: &str) -> (String, bool) {
    let Some((base, query)) = url.split_once('?') else {
        return (url.to_owned(), false);
    };
    let (pooler, rest): (Vec<&str>, Vec<&str>) = query
        .split('&')
        .partition(|pair| pair.starts_with("pooler="));
    let transaction = pooler.contains(&"pooler=transaction");
    let url = if rest.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", rest.join("&"))
    };
    (url, transaction)
}

/// `url` without its `synchronous=` parameter, and what that parameter asks
/// for: `normal` (the default) or `full`.
fn sqlite_synchronous(url: &str) -> Result<(String, SqliteSynchronous), sqlx::Error> {
    let Some((path, query)) = url.split_once('?') else {
        return Ok((url.to_owned(), SqliteSynchronous::Normal));
    };
    let mut synchronous = SqliteSynchronous::Normal;
    let mut rest = Vec::new();
    for pair in query.split('&') {
        match pair.split_once('=') {
            Some(("synchronous", "normal")) => synchronous = SqliteSynchronous::Normal,
            Some(("synchronous", "full")) => synchronous = SqliteSynchronous::Full,
            Some(("synchronous", other)) => {
                return Err(sqlx::Error::Configuration(
                    format!("synchronous={other}: use normal or full").into(),
                ));
            }
            _ => rest.push(pair),
        }
    }
    let url = if rest.is_empty() {
        path.to_owned()
    } else {
        format!("{path}?{}", rest.join("&"))
    };
    Ok((url, synchronous))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synchronous_is_read_off_the_url() {
        let (url, sync) = sqlite_synchronous("sqlite://a.db").unwrap();
        assert_eq!(
            (url.as_str(), format!("{sync:?}")),
            ("sqlite://a.db", "Normal".into())
        );
        let (url, sync) = sqlite_synchronous("sqlite://a.db?synchronous=full&mode=rwc").unwrap();
        assert_eq!(
            (url.as_str(), format!("{sync:?}")),
            ("sqlite://a.db?mode=rwc", "Full".into())
        );
        assert!(sqlite_synchronous("sqlite://a.db?synchronous=off").is_err());
    }

    #[test]
    fn the_pooler_is_read_off_the_url() {
        assert_eq!(pooler("postgres://h/db"), ("postgres://h/db".into(), false));
        assert_eq!(
            pooler("postgres://h/db?pooler=transaction&sslmode=disable"),
            ("postgres://h/db?sslmode=disable".into(), true)
        );
        assert!(!behind_transaction_pooler("postgres://h/db?pooler=session"));
    }
}
