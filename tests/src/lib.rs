//! Test harness: the orders app on any backend, driven over real loopback
//! HTTP or through `oneshot`, with the same requests and the same assertions
//! either way.
//!
//! Server URLs come from `IDEM_TEST_POSTGRES_URL` and `IDEM_TEST_MYSQL_URL`
//! (defaults: the local services). Names (tenants, payment numbers) carry a
//! per-harness nonce, since the SQL databases outlive a test run.

pub mod prometheus;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::BodyExt;
use idem_examples::orders::{App, Wiring};
use idem_tower::IdempotencyBuilder;
use idem_tower::core::conformance::{mysql_url, postgres_url, redis_url, server_missing};
use serde_json::Value;
use tower::ServiceExt;

/// How requests reach the app.
#[derive(Clone)]
pub enum Transport {
    /// A real server on 127.0.0.1, an ephemeral port.
    Http {
        /// `http://127.0.0.1:PORT`.
        base: String,
        /// A keep-alive client.
        client: reqwest::Client,
    },
    /// Straight into the router, no socket.
    Oneshot(Router),
}

/// Where the app keeps its data and idempotency records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// `MemoryStore` and the in-memory database.
    Memory,
    /// A fresh SQLite file.
    Sqlite,
    /// PostgreSQL at `IDEM_TEST_POSTGRES_URL`.
    Postgres,
    /// MariaDB / MySQL at `IDEM_TEST_MYSQL_URL`.
    MySql,
    /// The in-memory database with Redis (`IDEM_TEST_REDIS_URL`) alone
    /// keeping the records.
    Redis,
    /// PostgreSQL behind the Redis gate: the tiered store.
    PostgresWithRedis,
}

impl Backend {
    /// The `--database` value for this backend, or `None` (after saying why,
    /// or failing under `CI=true`) if its server cannot be reached.
    pub async fn database_url(self) -> Option<String> {
        let url = match self {
            Self::Memory | Self::Redis => return Some("memory".into()),
            Self::Sqlite => {
                let path = std::env::temp_dir().join(format!("idem-orders-{}.db", nonce()));
                return Some(format!("sqlite://{}", path.display()));
            }
            Self::Postgres | Self::PostgresWithRedis => postgres_url(),
            Self::MySql => mysql_url(),
        };
        let addr = url
            .split('@')
            .nth(1)
            .and_then(|rest| rest.split('/').next())
            .unwrap_or("127.0.0.1");
        reachable(&format!("{self:?}"), &url, addr)
            .await
            .then_some(url)
    }

    /// The `--redis` value for this backend, if it has one, or `None` (after
    /// saying why, or failing under `CI=true`) if Redis cannot be reached.
    pub async fn redis_url(self) -> Option<Option<String>> {
        match self {
            Self::Redis | Self::PostgresWithRedis => {
                let url = redis_url();
                let addr = url.trim_start_matches("redis://").to_owned();
                reachable("Redis", &url, &addr).await.then_some(Some(url))
            }
            _ => Some(None),
        }
    }
}

async fn reachable(what: &str, url: &str, addr: &str) -> bool {
    match tokio::net::TcpStream::connect(addr).await {
        Ok(_) => true,
        Err(err) => server_missing::<()>(what, url, err).is_some(),
    }
}

/// How a harness reaches its app.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// Loopback HTTP.
    Http,
    /// `oneshot` into the router.
    Oneshot,
}

/// A random hex nonce.
pub fn nonce() -> String {
    use std::hash::{BuildHasher, RandomState};
    format!(
        "{:016x}",
        RandomState::new().hash_one(std::time::SystemTime::now())
    )
}

/// A running app and the way to talk to it.
#[derive(Clone)]
pub struct Harness {
    /// The app, for its counters and database.
    pub app: App,
    /// How to reach it.
    pub transport: Transport,
    run: String,
}

/// What came back.
#[derive(Debug, Clone)]
pub struct Reply {
    /// Status.
    pub status: StatusCode,
    /// Headers.
    pub headers: HeaderMap,
    /// Body bytes.
    pub body: Bytes,
}

impl Reply {
    /// The body as JSON (panics with the body if it is not JSON).
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("{e}: {:?}", String::from_utf8_lossy(&self.body)))
    }

    /// Whether the layer marked this a replay.
    pub fn replayed(&self) -> bool {
        self.headers
            .get("idempotent-replayed")
            .is_some_and(|v| v == "true")
    }

    /// The problem `type`, for layer-written errors.
    pub fn problem_type(&self) -> String {
        assert_eq!(
            self.headers["content-type"], "application/problem+json",
            "not a problem response: {self:?}"
        );
        self.json()["type"].as_str().unwrap_or_default().to_owned()
    }
}

/// A request to send.
#[derive(Debug, Clone)]
pub struct Call {
    method: Method,
    path: String,
    headers: Vec<(String, String)>,
    body: Bytes,
}

impl Call {
    /// A POST of `body` as JSON.
    pub fn post(path: &str, body: &Value) -> Self {
        Self {
            method: Method::POST,
            path: path.to_owned(),
            headers: vec![("content-type".into(), "application/json".into())],
            body: Bytes::from(body.to_string()),
        }
    }

    /// A GET.
    pub fn get(path: &str) -> Self {
        Self {
            method: Method::GET,
            path: path.to_owned(),
            headers: Vec::new(),
            body: Bytes::new(),
        }
    }

    /// Adds a header (repeatable).
    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }

    /// Replaces the raw body.
    pub fn raw_body(mut self, body: impl Into<Bytes>) -> Self {
        self.body = body.into();
        self
    }
}

/// `POST /orders` as user `user` of tenant `tenant` with client key `key`.
pub fn order(tenant: &str, user: &str, key: &str, amount_cents: i64) -> Call {
    Call::post(
        "/orders",
        &serde_json::json!({ "sku": "book", "qty": 1, "amount_cents": amount_cents }),
    )
    .header("idempotency-key", key)
    .header("x-tenant-id", tenant)
    .header("authorization", &format!("Bearer {user}"))
}

impl Harness {
    /// The orders app (chaos headers on, `#[idempotent]` handlers) on
    /// `backend`, reached `via`; `None` if the backend's server is not there
    /// (and not required).
    pub async fn start(backend: Backend, via: Via) -> Option<Self> {
        Self::start_with(backend, via, Wiring::Attribute, |builder| builder).await
    }

    /// [`Harness::start`] with the routes wired as asked and the idempotency
    /// settings adjusted.
    pub async fn start_with(
        backend: Backend,
        via: Via,
        wiring: Wiring,
        configure: impl FnOnce(IdempotencyBuilder) -> IdempotencyBuilder,
    ) -> Option<Self> {
        let url = backend.database_url().await?;
        let redis = backend.redis_url().await?;
        let app = App::connect_tiered(&url, redis.as_deref(), true, configure)
            .await
            .unwrap_or_else(|err| panic!("the orders app on {url} ({redis:?}): {err}"));
        Some(match via {
            Via::Http => Self::serve_wired(app, wiring).await,
            Via::Oneshot => Self {
                transport: Transport::Oneshot(app.router_with(wiring)),
                app,
                run: nonce(),
            },
        })
    }

    /// Serves `app` on 127.0.0.1 on an ephemeral port, for the test's life.
    pub async fn serve(app: App) -> Self {
        Self::serve_wired(app, Wiring::Attribute).await
    }

    async fn serve_wired(app: App, wiring: Wiring) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1:0");
        let base = format!("http://{}", listener.local_addr().expect("local addr"));
        let router = app.router_with(wiring);
        tokio::spawn(async move { axum::serve(listener, router).await });
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .expect("reqwest client");
        Self {
            app,
            transport: Transport::Http { base, client },
            run: nonce(),
        }
    }

    /// `name`, made unique to this harness.
    pub fn unique(&self, name: &str) -> String {
        format!("{name}-{}", self.run)
    }

    /// `POST /orders` for this harness's `tenant` (made unique), as `user`,
    /// with client key `key`.
    pub fn order(&self, tenant: &str, user: &str, key: &str, amount_cents: i64) -> Call {
        order(&self.unique(tenant), user, key, amount_cents)
    }

    /// Sends `copies` copies of `call` at once: each from a task of its own
    /// (run the test on a multi-thread runtime for real parallelism), all
    /// released together by a barrier. The replies, in task order.
    pub async fn send_together(&self, copies: usize, call: Call) -> Vec<Reply> {
        let barrier = Arc::new(tokio::sync::Barrier::new(copies));
        let tasks: Vec<_> = (0..copies)
            .map(|_| {
                let (h, barrier, call) = (self.clone(), barrier.clone(), call.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    h.send(call).await
                })
            })
            .collect();
        let mut replies = Vec::with_capacity(copies);
        for task in tasks {
            replies.push(task.await.expect("a sending task"));
        }
        replies
    }

    /// Sends `call` and reads the whole reply.
    pub async fn send(&self, call: Call) -> Reply {
        match &self.transport {
            Transport::Http { base, client } => {
                let mut request = client.request(call.method, format!("{base}{}", call.path));
                for (name, value) in &call.headers {
                    request = request.header(name, value);
                }
                let response = request.body(call.body).send().await.expect("HTTP request");
                Reply {
                    status: response.status(),
                    headers: response.headers().clone(),
                    body: response.bytes().await.expect("HTTP body"),
                }
            }
            Transport::Oneshot(router) => {
                let mut request = Request::builder().method(call.method).uri(&call.path);
                for (name, value) in &call.headers {
                    request = request.header(name, value);
                }
                let request = request
                    .body(axum::body::Body::from(call.body))
                    .expect("request");
                let response = router.clone().oneshot(request).await.expect("infallible");
                let (parts, body) = response.into_parts();
                Reply {
                    status: parts.status,
                    headers: parts.headers,
                    body: body.collect().await.expect("body").to_bytes(),
                }
            }
        }
    }

    /// A user's order count and balance, as `GET /orders` reports them
    /// (`tenant` made unique, as [`Harness::order`] does).
    pub async fn account(&self, tenant: &str, user: &str) -> (u64, i64) {
        let tenant = self.unique(tenant);
        let reply = self
            .send(Call::get(&format!("/orders?tenant={tenant}&user={user}")))
            .await;
        assert_eq!(reply.status, StatusCode::OK);
        let json = reply.json();
        (
            json["count"].as_u64().expect("count"),
            json["balance_cents"].as_i64().expect("balance"),
        )
    }
}

/// Counting database transactions from PostgreSQL's own statistics.
pub mod pg_stats {
    use std::time::{Duration, Instant};

    use idem_tower::core::sql::sqlx::{self, PgPool};

    use super::Backend;

    /// Transactions of one database, as `pg_stat_database` counts them.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct Transactions {
        /// `xact_commit`.
        pub commits: i64,
        /// `xact_rollback`.
        pub rollbacks: i64,
    }

    /// A database of a measurement's own, and a connection to another one
    /// to read its statistics from (reading commits nothing there).
    pub struct PgStats {
        server: String,
        database: String,
        observer: PgPool,
    }

    impl PgStats {
        /// Creates `database` if missing; `None` if PostgreSQL is not there
        /// (a failure under `CI=true`).
        pub async fn for_database(database: &str) -> Option<Self> {
            let url = Backend::Postgres.database_url().await?;
            let server = url
                .rsplit_once('/')
                .expect("a URL with a database")
                .0
                .to_owned();
            let observer = PgPool::connect(&format!("{server}/postgres"))
                .await
                .expect("an observer connection");
            let exists: bool =
                sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
                    .bind(database)
                    .fetch_one(&observer)
                    .await
                    .expect("pg_database");
            if !exists {
                sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE {database}")))
                    .execute(&observer)
                    .await
                    .expect("create the measurement database");
            }
            Some(Self {
                server,
                database: database.to_owned(),
                observer,
            })
        }

        /// The URL of the measured database.
        pub fn url(&self) -> String {
            format!("{}/{}", self.server, self.database)
        }

        /// The counts once they stop moving. PostgreSQL 15 flushes a
        /// backend's statistics lazily, up to 10 s late
        /// (`PGSTAT_IDLE_INTERVAL`), so a reading waits until nothing has
        /// changed for longer than that.
        pub async fn settled(&self) -> Transactions {
            let read = || async {
                let (commits, rollbacks): (i64, i64) = sqlx::query_as(
                    "SELECT xact_commit, xact_rollback FROM pg_stat_database WHERE datname = $1",
                )
                .bind(&self.database)
                .fetch_one(&self.observer)
                .await
                .expect("pg_stat_database");
                Transactions { commits, rollbacks }
            };
            let deadline = Instant::now() + Duration::from_secs(60);
            let mut last = read().await;
            let mut stable_since = Instant::now();
            loop {
                tokio::time::sleep(Duration::from_millis(200)).await;
                let now = read().await;
                if now != last {
                    last = now;
                    stable_since = Instant::now();
                } else if stable_since.elapsed() >= Duration::from_millis(10_500) {
                    return now;
                }
                assert!(Instant::now() < deadline, "pg_stat_database never settled");
            }
        }
    }
}
