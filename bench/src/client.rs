//! The requests sent outside the load: the peer's logins, the first
//! request of a key that is then replayed, and what each scenario's
//! requests carry.

use std::net::SocketAddr;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, StatusCode, header};

use crate::Ctx;
use crate::apps::Kind;
use crate::load::{self, Bodies};

/// idem's replay header.
pub(crate) const IDEM_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");
/// axum-idempotent's replay header (its default).
pub(crate) const PEER_REPLAYED: HeaderName = HeaderName::from_static("idempotency-replayed");

/// The replay header of `kind`'s app: the peer's, or idem's.
pub(crate) fn replay_header(kind: &Kind) -> HeaderName {
    if matches!(kind, Kind::Peer) {
        PEER_REPLAYED
    } else {
        IDEM_REPLAYED
    }
}

/// `text` as an `Idempotency-Key` value.
pub(crate) fn key(text: String) -> HeaderValue {
    HeaderValue::try_from(text).expect("a visible-ASCII key")
}

/// Starts a session on the peer's app; the `Cookie` header that carries it.
pub(crate) async fn peer_session(
    addr: SocketAddr,
    login_key: String,
) -> Result<HeaderValue, String> {
    let request = http::Request::post("/login")
        .header(header::HOST, "127.0.0.1")
        .header("idempotency-key", key(login_key))
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .expect("a valid request");
    let response = load::send_once(addr, request).await?;
    if response.status() != StatusCode::OK {
        return Err(format!("login answered {}", response.status()));
    }
    let cookie = response
        .headers()
        .get_all(header::SET_COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find(|v| v.starts_with("session="))
        .and_then(|v| v.split(';').next())
        .ok_or("login set no session cookie")?;
    HeaderValue::try_from(cookie).map_err(|e| e.to_string())
}

/// Completes `key` with one request (`body`) and checks that a second is
/// replayed.
pub(crate) async fn complete_first(
    addr: SocketAddr,
    key: &HeaderValue,
    cookie: Option<&HeaderValue>,
    body: &Bytes,
    replay_header: &HeaderName,
) -> Result<(), String> {
    let request = load::order_request(key.clone(), cookie, body.clone());
    let first = load::send_once(addr, request).await?;
    if first.status() != StatusCode::CREATED {
        return Err(format!("the first request answered {}", first.status()));
    }
    let again =
        load::send_once(addr, load::order_request(key.clone(), cookie, body.clone())).await?;
    let replayed = again
        .headers()
        .get(replay_header)
        .is_some_and(|v| v == "true");
    if again.status() != StatusCode::CREATED || !replayed {
        return Err(format!(
            "a duplicate answered {} without `{replay_header}: true`",
            again.status()
        ));
    }
    Ok(())
}

/// What `kind`'s requests carry: under load with fresh keys, and the one
/// body of a key sent more than once (duplicates, the correctness check).
/// The orders endpoint's name an account: spread over all of them, or the
/// first.
pub(crate) fn bodies(ctx: &Ctx, kind: &Kind) -> (Bodies, Bytes) {
    if kind.orders() {
        let spread = Bodies::Spread {
            accounts: ctx.args.orders_accounts,
            conns: u32::try_from(ctx.args.connections).unwrap_or(u32::MAX),
        };
        (spread, load::account_order(0))
    } else {
        (Bodies::Order, Bytes::from_static(load::ORDER.as_bytes()))
    }
}
