//! The routes, and the two ways of making a route idempotent. Both answer
//! the same HTTP contract, and the contract tests run each ([`Wiring`]):
//!
//! - `#[idempotent(key = ...)]` on a handler (the default, and what to
//!   copy): the route line stays `post(create_order)`;
//! - an `IdempotencyLayer` built by hand around a plain handler, as any
//!   tower service can have it: `post(handler).layer(idem.layer_with_key(KEY)?)`.

use axum::Json;
use axum::Router;
use axum::extract::{Extension, Path, State};
use axum::http::HeaderMap;
use axum::middleware;
use axum::response::Response;
use axum::routing::{MethodRouter, get, post};
use idem_tower::{IdempotencyLayer, idempotent};

use super::App;
use super::auth::{UserId, demo_auth};
use super::data::{Data, Writer};
use super::handlers::{self, Callback};
use super::model::NewOrder;
use super::prometheus;

/// How the idempotent routes are wired.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Wiring {
    /// `#[idempotent]` handlers (the default).
    #[default]
    Attribute,
    /// The same plain handlers behind `IdempotencyLayer`s built by hand.
    Layer,
}

impl App {
    /// The routes, with `#[idempotent]` handlers.
    pub fn router(&self) -> Router {
        self.router_with(Wiring::Attribute)
    }

    /// The routes, wired as asked.
    pub fn router_with(&self, wiring: Wiring) -> Router {
        let (orders, callback) = match wiring {
            Wiring::Attribute => self.attribute_routes(),
            Wiring::Layer => self.layer_routes(),
        };
        Router::new()
            .route(
                "/orders",
                orders
                    .layer(middleware::from_fn(demo_auth))
                    .get(handlers::list_orders),
            )
            .route("/payments", post(handlers::create_payment))
            .route("/payments/{payment_no}/callback", callback)
            .route(
                "/payments/{payment_no}/refund",
                post(handlers::refund_payment),
            )
            .route("/payments/{payment_no}", get(handlers::get_payment))
            .route("/metrics", get(prometheus::metrics))
            .with_state(self.clone())
    }

    /// `POST /orders` and the payment callback as `#[idempotent]` handlers:
    /// on SQL, `POST /orders` is transactional (the order, the debit and the
    /// stored response commit together); the memory database has no
    /// transactions.
    fn attribute_routes(&self) -> (MethodRouter<App>, MethodRouter<App>) {
        let orders = match self.data {
            Data::Memory(_) => post(create_order_in_memory),
            _ => post(create_order),
        };
        (orders, post(payment_callback))
    }

    /// The same two routes, plain handlers behind layers built by hand.
    fn layer_routes(&self) -> (MethodRouter<App>, MethodRouter<App>) {
        let order_layer = self.layer(ORDER_KEY);
        let order_layer = match self.data {
            Data::Memory(_) => order_layer,
            _ => order_layer
                .transactional()
                .expect("the SQL stores are transactional"),
        };
        let callback_layer = self.layer(CALLBACK_KEY).shared_across_callers();
        (
            post(handlers::create_order).layer(order_layer),
            post(handlers::payment_callback).layer(callback_layer),
        )
    }

    fn layer(&self, key: &str) -> IdempotencyLayer {
        self.idem
            .layer_with_key(key)
            .expect("the route keys are valid templates")
    }
}

/// Writes each route's key template once. `#[idempotent(key = ...)]` takes
/// a string literal, so this hands the same literal to the attributes and
/// to the constants the hand-built layers use.
macro_rules! keyed_routes {
    (order: $order:literal, callback: $callback:literal $(,)?) => {
        /// The key of `POST /orders`: one order per client key, per user,
        /// per tenant.
        pub const ORDER_KEY: &str = $order;

        /// The key of a payment callback: the provider re-pushes the same
        /// callback, from wherever it sends it, until it gets a 2xx.
        pub const CALLBACK_KEY: &str = $callback;

        /// `POST /orders` on SQL.
        #[idempotent(key = $order, transactional)]
        async fn create_order(
            app: State<App>,
            user: Extension<UserId>,
            headers: HeaderMap,
            writer: Writer,
            order: Json<NewOrder>,
        ) -> Response {
            handlers::create_order(app, user, headers, writer, order).await
        }

        /// `POST /orders` on the memory database.
        #[idempotent(key = $order)]
        async fn create_order_in_memory(
            app: State<App>,
            user: Extension<UserId>,
            headers: HeaderMap,
            writer: Writer,
            order: Json<NewOrder>,
        ) -> Response {
            handlers::create_order(app, user, headers, writer, order).await
        }

        /// `POST /payments/{payment_no}/callback`: one record per payment,
        /// whoever the provider sends it as.
        #[idempotent(key = $callback, shared_across_callers)]
        async fn payment_callback(
            app: State<App>,
            payment_no: Path<String>,
            headers: HeaderMap,
            callback: Json<Callback>,
        ) -> Response {
            handlers::payment_callback(app, payment_no, headers, callback).await
        }
    };
}

keyed_routes!(
    order: "order-create:{tenant}:{user}:{header:idempotency-key}",
    callback: "pay-callback:{path:payment_no}",
);
