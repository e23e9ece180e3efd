//! The orders app started on a backend and reached over loopback HTTP or
//! through `oneshot`, with the same requests and replies either way.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use http::{Request, StatusCode};
use idem_app::orders::{App, Wiring};
use idem_tower::IdempotencyBuilder;
use tower::ServiceExt;

use crate::{Backend, Call, Reply, nonce, order};

/// How a harness reaches its app.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// Loopback HTTP.
    Http,
    /// `oneshot` into the router.
    Oneshot,
}

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

/// A running app and the way to talk to it.
#[derive(Clone)]
pub struct Harness {
    /// The app, for its counters and database.
    pub app: App,
    /// How to reach it.
    pub transport: Transport,
    run: String,
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

    /// The base URL (`http://127.0.0.1:PORT`) of a harness made by
    /// [`Harness::serve`], for clients of the test's own; `None` in process.
    pub fn base(&self) -> Option<&str> {
        match &self.transport {
            Transport::Http { base, .. } => Some(base),
            Transport::Oneshot(_) => None,
        }
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
                Reply::read(response).await
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
