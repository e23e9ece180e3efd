//! Procedural macros for idem. Use them through `idem-tower` (feature
//! `macros`); generated code names only `::idem_tower::__private` paths.

mod attr;
mod expand;

use proc_macro::TokenStream;

/// Makes an axum handler idempotent: the first request with a key runs it,
/// duplicates get its stored response replayed (`Idempotent-Replayed: true`).
///
/// The handler stays an ordinary `async fn` with any extractors and any
/// `IntoResponse` return type, and its route line does not change:
/// `post(create_order)`. The router state must hold an `Idempotency` handle,
/// reached through `FromRef` (or be one). Behind the attribute is the very
/// layer tower users write by hand, `idem.layer_with_key(key)` plus one
/// builder call per argument and `.require_handler_ran()`, so both paths
/// answer the same HTTP contract: 400 when the key is missing, 409 while the
/// first request runs, 422 when the key is reused for a different request,
/// 503 when the store is down.
///
/// # Arguments
///
/// - `key = "..."` (required): the key template, such as
///   `"order-create:{tenant}:{user}:{header:idempotency-key}"`. Placeholders:
///   `{tenant}`, `{user}`, `{header:NAME}`, `{path:NAME}`, `{query:NAME}`,
///   `{body:/json/pointer}`, `{method}`, `{route}`; at least one must come
///   from the request itself (header, path, query or body). `{tenant}` and
///   `{user}` need the matching resolver on the handle: without it, requests
///   to the handler get a 500 `urn:idem:problem:misconfigured` problem (and
///   an error log) and the function does not run.
/// - `ttl = "24h"` or `ttl = 86400` (whole seconds): how long a completed
///   response is kept and replayed to duplicates (`IdempotencyLayer::ttl`),
///   longer than zero and at most a year; the handle's ttl (24 h) if unset.
///   After it, the key is free again.
/// - `lease = "30s"`: how long a first attempt holds its key before a
///   duplicate may take it over (`IdempotencyLayer::lease`). The layer
///   renews it while the function runs, so it bounds how long a crashed
///   process keeps its key, not how long the function may take. In
///   transactional mode the claim lives as long as its transaction instead.
///   The handle's lease (10 s) if unset.
/// - `required = false`: let requests without their key through, not
///   deduplicated; a partly present or malformed key is still a 400.
///   Default `true`: a request without its key is a 400.
/// - `in_flight = "reject"` or `in_flight = "wait(5s)"`: what a duplicate
///   gets while the first request runs: 409 with `Retry-After` at once, or
///   wait up to that long and replay the first's response (waiting holds
///   no database connection, in transactional mode too). The handle's
///   policy (reject) if unset.
/// - `fingerprint = "request"` (the default), `"method_and_route"` or a
///   list of JSON pointers such as `["/amount", "/currency"]`
///   (`FingerprintSpec::Request`, `FingerprintSpec::MethodAndRoute`,
///   `FingerprintSpec::JsonFields`): what must match for a duplicate to be
///   replayed rather than answered 422. `"request"` covers method, route,
///   path parameters, query and the whole body (JSON canonicalised);
///   `"method_and_route"` covers method, route and path parameters
///   only; a list covers method, route, path parameters, query and
///   just those body fields, for bodies with volatile fields such as a
///   client timestamp.
/// - `transactional`: transactional mode
///   (`IdempotencyLayer::transactional`): the claim, the handler's writes
///   through a `Tx<DB>` extractor and the stored response commit in one
///   database transaction, or none of them does. The handle's store must
///   be a SQL store, or a `TieredStore` in front of one; on any other,
///   requests to the handler get a 500
///   `urn:idem:problem:misconfigured` problem (and an error log) rather than running
///   without the guarantee.
/// - `shared_across_callers`: let every caller with the same key share one
///   record (`IdempotencyLayer::shared_across_callers`). By default a record
///   is bound to the caller who created it: the tenant and user the handle's
///   resolvers find always scope the key, whether or not the template names
///   `{tenant}` or `{user}`, so one caller is never replayed another's
///   response and never held up by another's request in flight. Share only
///   keys that name a resource any caller acts on in the same way, such as a
///   payment platform's callback keyed by payment number, whose retries may
///   come without the credentials of the first.
///
/// Durations are strings with a unit, `"30s"`, `"10m"`, `"24h"`, `"7days"`,
/// `"1h 30m"`, or integers of whole seconds (`ttl` and `lease` only). The
/// flags `transactional` and `shared_across_callers` may also be written
/// `= true` or `= false`.
///
/// # What is stored
///
/// Only what the function returns goes through the outcome policy (stored
/// if final: 2xx, 3xx, deterministic 4xx; released on 5xx and the like). A
/// request refused before the function ran, by one of its extractors (a
/// malformed body's 400, a wrong `Content-Type`'s 415, an auth extractor's
/// 401) or by a resolver of the handle (its extractor's own rejection), is
/// answered as it is and claims nothing: the client fixes the request and
/// retries with the same key, and that retry runs.
///
/// # Checked at compile time
///
/// Each of these is an error on the token to fix, saying what to write
/// instead: an unknown or repeated argument, a missing `key`, a duration
/// that does not parse, is zero or negative, a `ttl` over a year, a
/// template with a syntax error, an unknown placeholder or no per-request
/// placeholder (a constant key such as
/// `"idempotent:pay"` would make every user share one key), `{body:...}` in
/// the key with `fingerprint = "method_and_route"`; a function that is not `async`, is generic, or is a
/// method taking `self`; an extractor that reads the request body (`Json`,
/// `Form`, `String`, `Bytes`, `Request`, `Multipart`, ...) anywhere but last,
/// or two of them; a `Tx` argument on a handler without `transactional`; and
/// a return type that is not a response.
///
/// What depends on the router state is checked at each route, against the
/// state that route has, so an extractor written for one particular state
/// is never reported falsely: a state that does not give the handle ("the
/// router state `AppState` does not give an `Idempotency` handle", with the
/// `FromRef` impl to write), and an argument that is not an extractor for it
/// ("`Session` is not an extractor for the router state `AppState`",
/// pointing at the argument, with what it must implement; this covers a
/// `State<T>` without `FromRef<AppState> for T`).
///
/// `#[axum::debug_handler]` can go above or below `#[idempotent]`.
///
/// # Calling the function
///
/// The handler stays callable as the function it was, for unit tests:
/// `create_order(args).await` runs the function alone, with no key, no
/// store and no handle. The future is boxed, and a function returning
/// `impl IntoResponse` gives its `Response`.
///
/// ```
/// use axum::{Json, http::StatusCode};
/// use idem_tower::idempotent;
/// use serde_json::{Value, json};
///
/// #[idempotent(key = "order-create:{header:idempotency-key}")]
/// async fn create_order(Json(order): Json<Value>) -> (StatusCode, Json<Value>) {
///     (StatusCode::CREATED, Json(json!({ "order": order })))
/// }
///
/// # async fn unit_test() {
/// let (status, Json(body)) = create_order(Json(json!({ "sku": "A-1" }))).await;
/// assert_eq!(status, StatusCode::CREATED);
/// assert_eq!(body["order"]["sku"], "A-1");
/// # }
/// ```
///
/// # Example
///
/// ```
/// use axum::extract::{FromRef, Path, State};
/// use axum::http::StatusCode;
/// use axum::{Json, Router, routing::post};
/// use idem_tower::{Idempotency, MemoryStore, Resolver, idempotent};
/// use serde_json::{Value, json};
///
/// #[derive(Clone)]
/// struct AppState {
///     idem: Idempotency,
/// }
///
/// impl FromRef<AppState> for Idempotency {
///     fn from_ref(state: &AppState) -> Self {
///         state.idem.clone()
///     }
/// }
///
/// /// Creates an order, once per `Idempotency-Key` and caller.
/// #[idempotent(key = "order-create:{header:idempotency-key}", ttl = "24h")]
/// async fn create_order(State(_state): State<AppState>, Json(order): Json<Value>) -> (StatusCode, Json<Value>) {
///     (StatusCode::CREATED, Json(json!({ "order": order })))
/// }
///
/// /// A payment platform's callback, re-pushed until it gets a 2xx: the
/// /// payment number is the key, and any duplicate is replayed, whoever
/// /// sends it.
/// #[idempotent(
///     key = "pay-callback:{path:payment_no}",
///     fingerprint = "method_and_route",
///     in_flight = "wait(5s)",
///     shared_across_callers
/// )]
/// async fn payment_callback(Path(payment_no): Path<String>) -> Json<Value> {
///     Json(json!({ "payment_no": payment_no, "state": "PAID" }))
/// }
///
/// let idem = Idempotency::builder(MemoryStore::new())
///     .tenant(Resolver::header("x-tenant-id"))
///     .build();
/// let app: Router = Router::new()
///     .route("/orders", post(create_order))
///     .route("/payments/{payment_no}/callback", post(payment_callback))
///     .with_state(AppState { idem });
/// ```
///
/// # What it expands to
///
/// The function is kept as it is, renamed `__idem_create_order` and
/// `#[doc(hidden)]`, and `create_order` becomes a unit struct (same
/// visibility, the function's docs, `Clone + Copy`) that:
///
/// - implements `axum::handler::Handler` for any router state `S` that
///   gives the handle and on which every argument is an extractor (the
///   bounds are on `S`: that is how the errors above name the argument and
///   the state). Its `call` builds the route's policy on the first request
///   (the template is parsed once, never per request) and answers through
///   `IdempotencyLayer` around a service that runs the extractors and then
///   the function, whose response it marks with `HandlerRan`;
/// - dereferences to a function pointer that calls the function, which is
///   what makes `create_order(args)` a call (see above).
///
/// One consequence of the name becoming a unit struct: `let create_order =
/// ...` in the same scope is a pattern matching the struct, not a new
/// binding: pick another name for the local. An argument that binds the
/// name (`async fn charge(Json(charge): Json<Charge>)`) is refused with an
/// error on the binding.
#[proc_macro_attribute]
pub fn idempotent(attr: TokenStream, item: TokenStream) -> TokenStream {
    let original = proc_macro2::TokenStream::from(item.clone());
    match expand::expand(attr.into(), item.into()) {
        Ok(expanded) => expanded.into(),
        // Keep the function as written, so a mistake in the attribute is
        // the one error reported, not every use of the handler as well.
        Err(err) => {
            let mut tokens = err.into_compile_error();
            tokens.extend(original);
            tokens.into()
        }
    }
}
