//! In-process cost as a count: `--instructions CASE` sends `--requests`
//! requests through one scenario's app with `tower::ServiceExt::oneshot`
//! on a current-thread runtime, without sockets or threads, so that the
//! instructions a run executes (counted by valgrind's callgrind,
//! `.ci/instructions`) repeat from one run to the next where times do not.
//! Two runs of different lengths give the count per request: their
//! difference over the difference of their requests, the setup cancelled.

use bytes::Bytes;
use http::{HeaderValue, StatusCode, header};
use http_body_util::BodyExt;
use tower::ServiceExt;

use crate::apps::{self, Kind};
use crate::client::{key, replay_header};
use crate::load::{ORDER, account_order, order_request};

/// The cases `--instructions` takes, and what each measures.
pub(crate) const CASES: [&str; 13] = [
    "bare",
    "idem-first",
    "idem-replay",
    "peer-first",
    "peer-replay",
    "orders-mysql-first",
    "orders-mysql-hand-first",
    "orders-mysql-replay",
    "orders-mysql-hand-replay",
    "orders-postgres-first",
    "orders-postgres-hand-first",
    "orders-postgres-replay",
    "orders-postgres-hand-replay",
];

/// The MySQL/MariaDB database of the `orders-mysql-` cases (a profile of
/// the SQL path rather than a figure CI checks): `IDEM_BENCH_MYSQL_URL`,
/// or the benchmark's own database on the local server.
fn mysql_url() -> String {
    std::env::var("IDEM_BENCH_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/idem_bench".to_owned())
}

/// The PostgreSQL database of the `orders-postgres-` cases (a profile of
/// the SQL path, as the MySQL cases): `IDEM_BENCH_PG_URL`, or the
/// benchmark's own database on the local server, which a run of the
/// benchmark creates.
fn postgres_url() -> String {
    std::env::var("IDEM_BENCH_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/idem_bench".to_owned())
}

/// The orders tables and the store's table on PostgreSQL, as the
/// benchmark prepares them before its rows.
async fn prepare_postgres(url: &str) -> Result<(), String> {
    let pool = idem_tower::sql::sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(url)
        .await
        .map_err(|e| format!("PostgreSQL at {url}: {e}"))?;
    idem_tower::PgStore::new(pool.clone())
        .migrate()
        .await
        .map_err(|e| e.to_string())?;
    apps::prepare_orders(&pool, 1000).await?;
    pool.close().await;
    Ok(())
}

/// Runs `requests` requests of `case`; the process's exit code.
pub(crate) fn run(case: &str, requests: u64) -> i32 {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime");
    match runtime.block_on(send_all(case, requests)) {
        Ok(()) => 0,
        Err(err) => {
            crate::say(&format!("--instructions {case}: {err}"));
            1
        }
    }
}

/// The app of `case`, a session on it for the peer, its replayed key
/// completed for a replay case, then the requests, each answered and its
/// body read to the end.
async fn send_all(case: &str, requests: u64) -> Result<(), String> {
    let (kind, replay) = match case {
        "bare" => (Kind::Bare, false),
        "idem-first" => (Kind::Memory, false),
        "idem-replay" => (Kind::Memory, true),
        "peer-first" => (Kind::Peer, false),
        "peer-replay" => (Kind::Peer, true),
        "orders-mysql-first" | "orders-mysql-replay" => (
            Kind::OrdersMysql {
                url: mysql_url(),
                pool: 1,
                accounts: 1000,
            },
            case.ends_with("replay"),
        ),
        "orders-mysql-hand-first" | "orders-mysql-hand-replay" => (
            Kind::OrdersMysqlHand {
                url: mysql_url(),
                pool: 1,
                accounts: 1000,
            },
            case.ends_with("replay"),
        ),
        "orders-postgres-first" | "orders-postgres-replay" => {
            prepare_postgres(&postgres_url()).await?;
            (
                Kind::OrdersPg {
                    url: postgres_url(),
                    pool: 1,
                },
                case.ends_with("replay"),
            )
        }
        "orders-postgres-hand-first" | "orders-postgres-hand-replay" => {
            prepare_postgres(&postgres_url()).await?;
            (
                Kind::OrdersPgHand {
                    url: postgres_url(),
                    pool: 1,
                },
                case.ends_with("replay"),
            )
        }
        other => return Err(format!("no case {other:?}; one of {CASES:?}")),
    };
    let router = apps::router(kind.clone()).await?;
    let cookie = match kind {
        Kind::Peer => Some(login(&router).await?),
        _ => None,
    };
    let orders = kind.orders();
    let body_of = |n: u64| {
        if orders {
            account_order(u32::try_from(n % 1000).unwrap_or(0))
        } else {
            Bytes::from_static(ORDER.as_bytes())
        }
    };
    let body = body_of(0);
    let replayed = replay_header(&kind);
    if replay {
        let request = order_request(key("replayed".to_owned()), cookie.as_ref(), body.clone());
        let (status, _) = answer(&router, request, &replayed).await?;
        if status != StatusCode::CREATED {
            return Err(format!("the first of the replayed key answered {status}"));
        }
    }
    for n in 0..requests {
        let name = if replay {
            "replayed".to_owned()
        } else {
            format!("first-{n}-{}", std::process::id())
        };
        let body = if replay { body.clone() } else { body_of(n) };
        let request = order_request(key(name), cookie.as_ref(), body);
        let (status, was_replayed) = answer(&router, request, &replayed).await?;
        if status != StatusCode::CREATED || was_replayed != replay {
            return Err(format!(
                "request {n} answered {status}, replayed {was_replayed}"
            ));
        }
    }
    Ok(())
}

/// Sends `request` through `router`, reads the body; the status and
/// whether the answer carries the replay header `replayed`.
async fn answer(
    router: &axum::Router,
    request: http::Request<http_body_util::Full<Bytes>>,
    replayed: &http::HeaderName,
) -> Result<(StatusCode, bool), String> {
    let response = router
        .clone()
        .oneshot(request)
        .await
        .map_err(|e| e.to_string())?;
    let (head, body) = response.into_parts();
    body.collect().await.map_err(|e| e.to_string())?;
    Ok((head.status, head.headers.contains_key(replayed)))
}

/// Starts a session on the peer's app, as the load does over HTTP; the
/// `Cookie` header that carries it.
async fn login(router: &axum::Router) -> Result<HeaderValue, String> {
    let request = http::Request::post("/login")
        .header(header::HOST, "127.0.0.1")
        .header("idempotency-key", key("login".to_owned()))
        .body(http_body_util::Full::new(Bytes::new()))
        .expect("a valid request");
    let response = router
        .clone()
        .oneshot(request)
        .await
        .map_err(|e| e.to_string())?;
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
