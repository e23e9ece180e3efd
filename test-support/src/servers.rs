//! Where the tests find their servers, and what they do about one that is
//! not there.

/// What a test does about a server it cannot reach: under `CI=true` that is
/// a failure (the run must not pass by testing nothing); elsewhere the test
/// says why it is skipped and passes.
///
/// # Panics
///
/// Under `CI=true`, always.
pub fn server_missing<T>(what: &str, url: &str, err: impl std::fmt::Display) -> Option<T> {
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{what} at {url} is required when CI=true, and it failed: {err}");
    }
    eprintln!("skipped: {what} is not reachable at {url} ({err}); set the URL or start it");
    None
}

/// A server URL from `var`, or `default`.
pub fn server_url(var: &str, default: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| default.to_owned())
}

/// The PostgreSQL server of the tests: `IDEM_TEST_POSTGRES_URL`, or
/// `postgres://postgres@127.0.0.1:5432/test`.
pub fn postgres_url() -> String {
    server_url(
        "IDEM_TEST_POSTGRES_URL",
        "postgres://postgres@127.0.0.1:5432/test",
    )
}

/// PostgreSQL through PgBouncer in transaction pooling, as `.ci/services`
/// starts it: `IDEM_TEST_PGBOUNCER_URL`, or
/// `postgres://postgres@127.0.0.1:6432/test`.
pub fn pgbouncer_url() -> String {
    server_url(
        "IDEM_TEST_PGBOUNCER_URL",
        "postgres://postgres@127.0.0.1:6432/test",
    )
}

/// The MySQL/MariaDB server of the tests: `IDEM_TEST_MYSQL_URL`, or
/// `mysql://root@127.0.0.1:3306/test`.
pub fn mysql_url() -> String {
    server_url("IDEM_TEST_MYSQL_URL", "mysql://root@127.0.0.1:3306/test")
}

/// The Redis server of the tests: `IDEM_TEST_REDIS_URL`, or
/// `redis://127.0.0.1:6379`.
pub fn redis_url() -> String {
    server_url("IDEM_TEST_REDIS_URL", "redis://127.0.0.1:6379")
}

/// What a test does about a program it needs that is not installed
/// (`what`, say "pgbouncer (Debian's package)"): fails under `CI=true`,
/// where every install step is the project's own; elsewhere says the test
/// is skipped.
///
/// # Panics
///
/// Under `CI=true`, always.
pub fn missing(what: &str) {
    let ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
    assert!(!ci, "the test needs {what}, which is not here (CI=true)");
    eprintln!("skipped: {what} not found");
}
