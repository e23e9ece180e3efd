//! `redis+sentinel://[user:password@]host:port[,host:port...]/SERVICE_NAME[/DB]`
//! URLs: parsed, checked, and turned into a redis-rs sentinel client.

use ::redis::io::tcp::TcpSettings;
use ::redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use ::redis::{ConnectionAddr, ErrorKind, RedisError, RedisResult};

/// The sentinels' port when a URL gives none.
const SENTINEL_PORT: u16 = 26379;

/// A `redis+sentinel://` URL, parsed.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct SentinelUrl {
    sentinels: Vec<(String, u16)>,
    service: String,
    pub(super) db: i64,
    username: Option<String>,
    password: Option<String>,
}

/// The scheme a URL must start with, in any case.
const SCHEME: &str = "redis+sentinel://";

impl SentinelUrl {
    /// Parses `url`; a malformed one is an [`ErrorKind::InvalidClientConfig`]
    /// whose detail names what is wrong.
    pub(super) fn parse(url: &str) -> RedisResult<Self> {
        Self::parse_parts(url).map_err(|detail| {
            RedisError::from((
                ErrorKind::InvalidClientConfig,
                "invalid redis+sentinel URL",
                detail,
            ))
        })
    }

    /// [`parse`](Self::parse), what is wrong as a message.
    fn parse_parts(url: &str) -> Result<Self, String> {
        let rest = url
            .get(..SCHEME.len())
            .filter(|scheme| scheme.eq_ignore_ascii_case(SCHEME))
            .map(|_| &url[SCHEME.len()..])
            .ok_or_else(|| {
                "expected redis+sentinel://[user:password@]host:port[,host:port...]/SERVICE_NAME[/DB]"
                    .to_owned()
            })?;
        if rest.contains(['?', '#']) {
            return Err("query parameters and fragments are not supported".to_owned());
        }
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        let (userinfo, hosts) = match authority.rsplit_once('@') {
            Some((userinfo, hosts)) => (Some(userinfo), hosts),
            None => (None, authority),
        };
        let (username, password) = match userinfo {
            None => (None, None),
            Some(userinfo) => parse_userinfo(userinfo)?,
        };
        if hosts.is_empty() {
            return Err("no sentinel host".to_owned());
        }
        let sentinels = hosts
            .split(',')
            .map(parse_host)
            .collect::<Result<Vec<_>, _>>()?;
        let mut segments = path.split('/');
        let service = segments.next().unwrap_or_default();
        if service.is_empty() {
            return Err("no service name (the primary's name in the sentinels' \
                        configuration, after the hosts: .../mymaster)"
                .to_owned());
        }
        let service = percent_decode(service)
            .ok_or_else(|| "the service name is not valid percent-encoded UTF-8".to_owned())?;
        let db = match segments.next() {
            None | Some("") => 0,
            Some(db) => db
                .parse::<i64>()
                .ok()
                .filter(|db| *db >= 0)
                .ok_or_else(|| format!("bad db {db:?}: a database number is expected"))?,
        };
        if let Some(extra) = segments.find(|segment| !segment.is_empty()) {
            return Err(format!(
                "unexpected {extra:?} after the database: the path is /SERVICE_NAME[/DB]"
            ));
        }
        Ok(Self {
            sentinels,
            service,
            db,
            username,
            password,
        })
    }

    /// The sentinels, `host:port,host:port`, for messages.
    pub(super) fn addresses(&self) -> String {
        let addresses: Vec<String> = self
            .sentinels
            .iter()
            .map(|(host, port)| format!("{host}:{port}"))
            .collect();
        addresses.join(",")
    }

    /// A redis-rs client for these sentinels, asking them for the primary of
    /// the service, with the URL's credentials and database for it.
    pub(super) fn client(self) -> RedisResult<SentinelClient> {
        let sentinels = self
            .sentinels
            .into_iter()
            .map(|(host, port)| ConnectionAddr::Tcp(host, port));
        // TCP_NODELAY on the primary's connection, which redis-rs leaves
        // off: a command written while the one before it on the shared
        // connection awaits its answer would otherwise wait for that
        // answer's ACK, a network round trip more (docs/redis-gate.md).
        let mut builder =
            SentinelClientBuilder::new(sentinels, &self.service, SentinelServerType::Master)?
                .set_client_to_redis_tcp_settings(TcpSettings::default().set_nodelay(true));
        if let Some(username) = self.username {
            builder = builder.set_client_to_redis_username(username);
        }
        if let Some(password) = self.password {
            builder = builder.set_client_to_redis_password(password);
        }
        if self.db != 0 {
            builder = builder.set_client_to_redis_db(self.db);
        }
        builder.build()
    }
}

/// The user name and password of `user[:password]`, percent-decoded; an
/// empty one is none.
fn parse_userinfo(userinfo: &str) -> Result<(Option<String>, Option<String>), String> {
    let (user, password) = match userinfo.split_once(':') {
        Some((user, password)) => (user, Some(password)),
        None => (userinfo, None),
    };
    let decode = |part: &str, what: &str| -> Result<Option<String>, String> {
        match percent_decode(part) {
            Some(decoded) if decoded.is_empty() => Ok(None),
            Some(decoded) => Ok(Some(decoded)),
            None => Err(format!("the {what} is not valid percent-encoded UTF-8")),
        }
    };
    Ok((
        decode(user, "user name")?,
        password
            .map(|p| decode(p, "password"))
            .transpose()?
            .flatten(),
    ))
}

/// `host[:port]` or `[ipv6][:port]`.
fn parse_host(address: &str) -> Result<(String, u16), String> {
    if address.is_empty() {
        return Err("an empty sentinel address (a stray comma?)".to_owned());
    }
    let (host, port) = if let Some(bracketed) = address.strip_prefix('[') {
        let (host, after) = bracketed
            .split_once(']')
            .ok_or_else(|| format!("no closing ] in sentinel address {address:?}"))?;
        match after {
            "" => (host, None),
            _ => match after.strip_prefix(':') {
                Some(port) => (host, Some(port)),
                None => return Err(format!("bad sentinel address {address:?}")),
            },
        }
    } else {
        match address.rsplit_once(':') {
            Some((host, _)) if host.contains(':') => {
                return Err(format!(
                    "sentinel address {address:?}: an IPv6 address goes in brackets, [::1]:26379"
                ));
            }
            Some((host, port)) => (host, Some(port)),
            None => (address, None),
        }
    };
    if host.is_empty() {
        return Err(format!("no host in sentinel address {address:?}"));
    }
    let port = match port {
        None => SENTINEL_PORT,
        Some(port) => port
            .parse::<u16>()
            .ok()
            .filter(|port| *port != 0)
            .ok_or_else(|| format!("bad port {port:?} in sentinel address {address:?}"))?,
    };
    Ok((host.to_owned(), port))
}

/// `%XX` decoded; `None` if an escape is malformed or the result is not
/// UTF-8.
fn percent_decode(input: &str) -> Option<String> {
    let bytes = input.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes.get(i + 1..i + 3)?;
            let hex = std::str::from_utf8(hex).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(url: &str) -> SentinelUrl {
        SentinelUrl::parse(url).unwrap_or_else(|err| panic!("{url}: {err}"))
    }

    /// The error's detail, which must name what is wrong.
    fn refused(url: &str) -> String {
        let err = SentinelUrl::parse(url).expect_err(url);
        assert_eq!(err.kind(), ErrorKind::InvalidClientConfig, "{url}");
        err.to_string()
    }

    #[test]
    fn one_sentinel_and_a_service() {
        assert_eq!(
            parsed("redis+sentinel://127.0.0.1:26379/mymaster"),
            SentinelUrl {
                sentinels: vec![("127.0.0.1".to_owned(), 26379)],
                service: "mymaster".to_owned(),
                db: 0,
                username: None,
                password: None,
            }
        );
    }

    #[test]
    fn several_sentinels_credentials_and_a_db() {
        assert_eq!(
            parsed("redis+sentinel://app:s%40cret%3A1@a:1,b,[::1]:3,[fe80::1]/orders/2"),
            SentinelUrl {
                sentinels: vec![
                    ("a".to_owned(), 1),
                    ("b".to_owned(), SENTINEL_PORT),
                    ("::1".to_owned(), 3),
                    ("fe80::1".to_owned(), SENTINEL_PORT),
                ],
                service: "orders".to_owned(),
                db: 2,
                username: Some("app".to_owned()),
                password: Some("s@cret:1".to_owned()),
            }
        );
    }

    #[test]
    fn a_password_alone_or_a_trailing_slash() {
        let url = parsed("REDIS+SENTINEL://:pw@h:1/svc/");
        assert_eq!((url.username, url.password), (None, Some("pw".to_owned())));
        assert_eq!((url.service.as_str(), url.db), ("svc", 0));
    }

    #[test]
    fn what_is_wrong_is_named() {
        for (url, says) in [
            ("redis://127.0.0.1:6379", "expected redis+sentinel://"),
            ("", "expected redis+sentinel://"),
            ("redis+sentinel://", "no sentinel host"),
            ("redis+sentinel:///mymaster", "no sentinel host"),
            ("redis+sentinel://user:pw@/mymaster", "no sentinel host"),
            ("redis+sentinel://h:1", "no service name"),
            ("redis+sentinel://h:1/", "no service name"),
            ("redis+sentinel://h:1//0", "no service name"),
            ("redis+sentinel://h:port/m", "bad port \"port\""),
            ("redis+sentinel://h:70000/m", "bad port \"70000\""),
            ("redis+sentinel://h:0/m", "bad port \"0\""),
            ("redis+sentinel://h:/m", "bad port \"\""),
            ("redis+sentinel://:1/m", "no host"),
            ("redis+sentinel://a:1,,b:2/m", "empty sentinel address"),
            ("redis+sentinel://::1:5/m", "IPv6"),
            ("redis+sentinel://[::1/m", "no closing ]"),
            ("redis+sentinel://[::1]x/m", "bad sentinel address"),
            ("redis+sentinel://h:1/m/x", "bad db \"x\""),
            ("redis+sentinel://h:1/m/-1", "bad db \"-1\""),
            ("redis+sentinel://h:1/m/1/x", "unexpected \"x\""),
            ("redis+sentinel://h:1/m?db=1", "query parameters"),
            ("redis+sentinel://u:%zz@h:1/m", "password"),
            ("redis+sentinel://u%:p@h:1/m", "user name"),
            ("redis+sentinel://h:1/%ff", "service name"),
        ] {
            let message = refused(url);
            assert!(message.contains(says), "{url}: {message}");
        }
    }

    #[test]
    fn a_password_is_not_repeated_in_an_error() {
        let message = refused("redis+sentinel://user:hunter2@h:notaport/m");
        assert!(!message.contains("hunter2"), "{message}");
    }

    #[test]
    fn no_input_panics() {
        for url in [
            "redis+sentinel://%",
            "redis+sentinel://[",
            "redis+sentinel://]:",
            "redis+sentinel://é:1/é/é",
            "redis+sentinel\u{e9}",
            "redis+sentine",
        ] {
            let _ = SentinelUrl::parse(url);
        }
    }
}
