//! Behind axum, the handler's own extractors: a request they refuse before
//! the handler ran leaves its key free (`HandlerRan`), and resolvers built
//! from extractors (stateless or on the router state) scope the keys.

use std::sync::Arc;

use axum::Router;
use axum::extract::{FromRef, FromRequestParts, State};
use axum::routing::post as axum_post;
use http::{HeaderValue, StatusCode, header};
use idem_tower::{HandlerRan, Idempotency, MemoryStore, Resolver};

use crate::fixtures::ORDER;
use crate::support::{Calls, CurrentUser, post, send, signed};

/// An orders route whose handler marks its responses as its own.
fn marked_orders(calls: &Calls, layer: idem_tower::IdempotencyLayer) -> Router {
    let calls = calls.clone();
    let create = move |CurrentUser(user): CurrentUser,
                       axum::Json(order): axum::Json<serde_json::Value>| {
        let calls = calls.clone();
        async move {
            let n = calls.run();
            (
                StatusCode::CREATED,
                HandlerRan,
                format!(
                    r#"{{"order_id":{n},"user":"{user}","sku":{}}}"#,
                    order["sku"]
                ),
            )
        }
    };
    Router::new().route("/orders", axum_post(create).layer(layer))
}

/// Nothing happened when an extractor refused the request, so its key
/// is not burnt: the corrected request with the same key runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_request_refused_before_the_handler_ran_leaves_its_key_free() {
    let calls = Calls::default();
    let idem = Idempotency::new(MemoryStore::new());
    let layer = idem
        .layer_with_key("order:{header:idempotency-key}")
        .expect("a valid template")
        .require_handler_ran();
    let app = marked_orders(&calls, layer);

    let mut plain = signed(post("/orders", Some("k-415"), ORDER), "alice");
    plain
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    let refused = send(&app, plain).await;
    assert_eq!(
        refused.status,
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "{refused:?}"
    );
    assert!(!refused.replayed());

    let malformed = send(
        &app,
        signed(post("/orders", Some("k-415"), "{\"sku\":"), "alice"),
    )
    .await;
    assert_eq!(malformed.status, StatusCode::BAD_REQUEST, "{malformed:?}");
    assert!(!malformed.replayed());

    let anonymous = send(&app, post("/orders", Some("k-415"), ORDER)).await;
    assert_eq!(anonymous.status, StatusCode::UNAUTHORIZED, "{anonymous:?}");
    assert_eq!(calls.get(), 0);

    let fixed = send(&app, signed(post("/orders", Some("k-415"), ORDER), "alice")).await;
    assert_eq!(fixed.status, StatusCode::CREATED, "{fixed:?}");
    assert!(!fixed.replayed());
    let again = send(&app, signed(post("/orders", Some("k-415"), ORDER), "alice")).await;
    assert!(again.replayed(), "{again:?}");
    assert_eq!(again.body, fixed.body);
    assert_eq!(calls.get(), 1, "the handler ran once");
}

/// Without `require_handler_ran`, the layer cannot tell a rejection from
/// the handler's answer, and keeps it like any deterministic 4xx: the
/// reason the signal exists.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_the_signal_a_rejection_is_kept_like_any_answer() {
    let calls = Calls::default();
    let idem = Idempotency::new(MemoryStore::new());
    let layer = idem
        .layer_with_key("order:{header:idempotency-key}")
        .expect("a valid template");
    let app = marked_orders(&calls, layer);
    let mut plain = signed(post("/orders", Some("k-kept"), ORDER), "alice");
    plain
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    assert_eq!(
        send(&app, plain).await.status,
        StatusCode::UNSUPPORTED_MEDIA_TYPE
    );
    let fixed = send(
        &app,
        signed(post("/orders", Some("k-kept"), ORDER), "alice"),
    )
    .await;
    assert!(fixed.replayed(), "{fixed:?}");
    assert_eq!(calls.get(), 0);
}

/// `require_handler_ran` on a handler that forgets to mark its
/// responses: its successes are still kept (with a warning), never
/// silently left undeduplicated.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unmarked_success_is_kept_as_the_handlers() {
    let calls = Calls::default();
    let idem = Idempotency::new(MemoryStore::new());
    let layer = idem
        .layer_with_key("order:{header:idempotency-key}")
        .expect("a valid template")
        .require_handler_ran();
    let handler = {
        let calls = calls.clone();
        move || {
            let n = calls.run();
            async move { (StatusCode::CREATED, format!("order {n}")) }
        }
    };
    let app = Router::new().route("/orders", axum_post(handler).layer(layer));
    let first = send(&app, post("/orders", Some("k-unmarked"), ORDER)).await;
    let again = send(&app, post("/orders", Some("k-unmarked"), ORDER)).await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(again.replayed(), "{again:?}");
    assert_eq!(calls.get(), 1);
}

/// The user comes from the extractor the handlers already use; its
/// rejection is answered as the extractor answers it, nothing claimed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_user_from_an_extractor_scopes_keys_and_its_rejection_claims_nothing() {
    let calls = Calls::default();
    let idem = Idempotency::builder(MemoryStore::new())
        .user(Resolver::from_extractor(|CurrentUser(user)| user))
        .build();
    let layer = idem
        .layer_with_key("order:{user}:{header:idempotency-key}")
        .expect("a valid template")
        .require_handler_ran();
    let app = marked_orders(&calls, layer);

    let anonymous = send(&app, post("/orders", Some("k-user"), ORDER)).await;
    assert_eq!(anonymous.status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        anonymous.text(),
        "who are you?",
        "the extractor's own answer"
    );
    assert_eq!(calls.get(), 0);

    let alice = send(
        &app,
        signed(post("/orders", Some("k-user"), ORDER), "alice"),
    )
    .await;
    let bob = send(&app, signed(post("/orders", Some("k-user"), ORDER), "bob")).await;
    assert_eq!(alice.status, StatusCode::CREATED);
    assert!(!bob.replayed() && bob.text().contains("bob"), "{bob:?}");
    let alice_again = send(
        &app,
        signed(post("/orders", Some("k-user"), ORDER), "alice"),
    )
    .await;
    assert!(alice_again.replayed());
    assert_eq!(alice_again.body, alice.body);
    assert_eq!(calls.get(), 2);
}

/// A user resolver that serves only the caller scope (the template does
/// not name `{user}`): its refusal means a caller without a user, not a
/// 401, and that caller's record is not the signed-in user's.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_scope_only_resolver_refusal_is_a_caller_without_identity() {
    let calls = Calls::default();
    let idem = Idempotency::builder(MemoryStore::new())
        .user(Resolver::from_extractor(|CurrentUser(user)| user))
        .build();
    let layer = idem
        .layer_with_key("order:{header:idempotency-key}")
        .expect("a valid template");
    let handler = {
        let calls = calls.clone();
        move || {
            let n = calls.run();
            async move { (StatusCode::CREATED, format!("order {n}")) }
        }
    };
    let app = Router::new().route("/orders", axum_post(handler).layer(layer));

    let anonymous = send(&app, post("/orders", Some("k-scope"), ORDER)).await;
    let alice = send(
        &app,
        signed(post("/orders", Some("k-scope"), ORDER), "alice"),
    )
    .await;
    assert_eq!(anonymous.status, StatusCode::CREATED, "{anonymous:?}");
    assert!(
        !alice.replayed(),
        "alice got the anonymous caller's response"
    );
    assert_eq!(alice.text(), "order 2");
    let anonymous_again = send(&app, post("/orders", Some("k-scope"), ORDER)).await;
    assert!(anonymous_again.replayed());
    assert_eq!(anonymous_again.body, anonymous.body);
    assert_eq!(calls.get(), 2);
}

#[derive(Clone)]
struct AppState {
    tokens: Arc<Vec<(&'static str, &'static str)>>,
}

/// An extractor that needs the router state: a token looked up in it.
struct Session(String);

impl FromRequestParts<AppState> for Session {
    type Rejection = StatusCode;

    async fn from_request_parts(
        parts: &mut http::request::Parts,
        state: &AppState,
    ) -> Result<Self, StatusCode> {
        let token = parts
            .headers
            .get("x-session")
            .and_then(|v| v.to_str().ok())
            .ok_or(StatusCode::UNAUTHORIZED)?;
        state
            .tokens
            .iter()
            .find(|(t, _)| *t == token)
            .map(|(_, user)| Session((*user).to_owned()))
            .ok_or(StatusCode::FORBIDDEN)
    }
}

impl FromRef<AppState> for Arc<Vec<(&'static str, &'static str)>> {
    fn from_ref(state: &AppState) -> Self {
        Arc::clone(&state.tokens)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stateful_extractor_resolves_with_the_layers_state() {
    let calls = Calls::default();
    let idem = Idempotency::builder(MemoryStore::new())
        .user(Resolver::from_extractor_with_state::<AppState, _, _>(
            |Session(user)| user,
        ))
        .build();
    let state = AppState {
        tokens: Arc::new(vec![("s-1", "alice")]),
    };
    let template = "order:{user}:{header:idempotency-key}";
    let handler = {
        let calls = calls.clone();
        move |State(_): State<AppState>| {
            let n = calls.run();
            async move { (StatusCode::CREATED, HandlerRan, format!("order {n}")) }
        }
    };
    let with_state = idem
        .layer_with_key(template)
        .expect("valid")
        .with_state(state.clone());
    let app: Router = Router::new()
        .route("/orders", axum_post(handler.clone()).layer(with_state))
        .route(
            "/forgot",
            axum_post(handler).layer(idem.layer_with_key(template).expect("valid")),
        )
        .with_state(state);
    let session = |path: &str, token: &str| {
        let mut request = post(path, Some("k-session"), ORDER);
        request
            .headers_mut()
            .insert("x-session", HeaderValue::from_str(token).expect("ASCII"));
        request
    };

    let forbidden = send(&app, session("/orders", "s-bad")).await;
    assert_eq!(forbidden.status, StatusCode::FORBIDDEN);
    let first = send(&app, session("/orders", "s-1")).await;
    let again = send(&app, session("/orders", "s-1")).await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(again.replayed());
    assert_eq!(calls.get(), 1);

    // The same resolver on a layer given no state: the server's error.
    let unwired = send(&app, session("/forgot", "s-1")).await;
    unwired.assert_problem(StatusCode::INTERNAL_SERVER_ERROR, "misconfigured");
    assert!(unwired.text().contains("with_state"), "{unwired:?}");
    assert_eq!(calls.get(), 1);
}

/// `(status, HandlerRan)` alone is a marked, empty response: a handler's
/// own deterministic 4xx is kept and replayed, not taken for an
/// extractor's refusal (which would free the key and run it again).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_bodyless_marked_response_is_kept() {
    let calls = Calls::default();
    let idem = Idempotency::new(MemoryStore::new());
    let layer = idem
        .layer_with_key("refund:{header:idempotency-key}")
        .expect("a valid template")
        .require_handler_ran();
    let counted = calls.clone();
    let refuse = move || {
        let calls = counted.clone();
        async move {
            calls.run();
            (StatusCode::UNPROCESSABLE_ENTITY, HandlerRan)
        }
    };
    let app = Router::new().route("/refunds", axum_post(refuse).layer(layer));

    let first = send(&app, post("/refunds", Some("k-empty"), ORDER)).await;
    assert_eq!(first.status, StatusCode::UNPROCESSABLE_ENTITY, "{first:?}");
    assert!(!first.replayed());
    let again = send(&app, post("/refunds", Some("k-empty"), ORDER)).await;
    assert_eq!(again.status, StatusCode::UNPROCESSABLE_ENTITY, "{again:?}");
    assert!(again.replayed(), "{again:?}");
    assert_eq!(calls.get(), 1, "the handler ran once");
}
