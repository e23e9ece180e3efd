//! Server URLs pointed elsewhere: what every proxy in front of a server
//! does to the URL the clients are given.

use std::net::SocketAddr;

/// `url` with its host and port (after `://` and any `user@`, before the
/// next `/`) replaced by `addr`; user, path and query kept.
///
/// ```
/// use idem_test_support::urls::via;
///
/// let addr = "127.0.0.1:7000".parse().unwrap();
/// assert_eq!(
///     via("postgres://postgres@127.0.0.1:5432/test", addr),
///     "postgres://postgres@127.0.0.1:7000/test"
/// );
/// assert_eq!(via("redis://127.0.0.1:6379", addr), "redis://127.0.0.1:7000");
/// ```
pub fn via(url: &str, addr: SocketAddr) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (authority, path) = match rest.find('/') {
        Some(at) => rest.split_at(at),
        None => (rest, ""),
    };
    let user = authority
        .rsplit_once('@')
        .map(|(user, _)| format!("{user}@"))
        .unwrap_or_default();
    format!("{scheme}://{user}{addr}{path}")
}

/// The `host:port` of a URL such as `postgres://user@host:5432/db` or
/// `redis://host:6379`, with `default_port` where it names none.
///
/// ```
/// use idem_test_support::urls::host_port;
///
/// assert_eq!(host_port("postgres://u:p@db/x", 5432), "db:5432");
/// assert_eq!(host_port("redis://127.0.0.1:6380", 6379), "127.0.0.1:6380");
/// ```
pub fn host_port(url: &str, default_port: u16) -> String {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split(['/', '?']).next().unwrap_or(rest);
    let host = authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host);
    if host.contains(':') {
        host.to_owned()
    } else {
        format!("{host}:{default_port}")
    }
}
