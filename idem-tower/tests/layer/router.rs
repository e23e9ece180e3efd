//! One layer behind an axum router: the route and path parameters come
//! from the matched route, a parameter the route lacks is the server's 500,
//! and safe methods pass through a layer on the whole router.

use axum::Router;
use axum::body::Body;
use axum::extract::Path;
use axum::routing::{get as axum_get, post as axum_post};
use http::{Request, StatusCode};
use idem_tower::{Idempotency, MemoryStore};

use crate::fixtures::ORDER;
use crate::support::{Calls, post, send};

/// One layer on a whole router: reads pass through untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn safe_methods_pass_through_a_layer_on_the_whole_router() {
    let calls = Calls::default();
    let reads = Calls::default();
    let list = {
        let reads = reads.clone();
        move || {
            reads.run();
            async { "[]" }
        }
    };
    let create = {
        let calls = calls.clone();
        move || {
            let n = calls.run();
            async move { (StatusCode::CREATED, format!("order {n}")) }
        }
    };
    let app = |idem: &Idempotency| {
        Router::new()
            .route("/items", axum_get(list.clone()).post(create.clone()))
            .layer(idem.layer())
    };
    let passing = app(&Idempotency::new(MemoryStore::new()));

    for method in [http::Method::GET, http::Method::HEAD, http::Method::GET] {
        let request = Request::builder()
            .method(method.clone())
            .uri("/items")
            .body(Body::empty())
            .expect("a request");
        let reply = send(&passing, request).await;
        assert_eq!(reply.status, StatusCode::OK, "{method}: {reply:?}");
        assert!(!reply.replayed());
    }
    assert_eq!(reads.get(), 3, "every read ran");
    let unkeyed = send(&passing, post("/items", None, ORDER)).await;
    unkeyed.assert_problem(StatusCode::BAD_REQUEST, "key-missing");
    let created = send(&passing, post("/items", Some("k-items"), ORDER)).await;
    let replayed = send(&passing, post("/items", Some("k-items"), ORDER)).await;
    assert_eq!(created.status, StatusCode::CREATED);
    assert!(replayed.replayed());
    assert_eq!(calls.get(), 1);

    let strict = app(&Idempotency::builder(MemoryStore::new())
        .safe_methods_pass_through(false)
        .build());
    let get = Request::get("/items")
        .body(Body::empty())
        .expect("a request");
    send(&strict, get)
        .await
        .assert_problem(StatusCode::BAD_REQUEST, "key-missing");
    assert_eq!(reads.get(), 3);
}

/// `{path:NAME}` naming a parameter the matched route lacks is the
/// server's mistake: 500, never a 400 that blames the client.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_path_parameter_the_route_lacks_is_a_server_error() {
    let calls = Calls::default();
    let idem = Idempotency::new(MemoryStore::new());
    let app = payments_app(&calls, &idem, "pay-callback:{path:payment_id}");
    let reply = send(&app, post("/payments/P-1/callback", None, ORDER)).await;
    reply.assert_problem(StatusCode::INTERNAL_SERVER_ERROR, "misconfigured");
    assert!(
        reply.text().contains("/payments/{payment_no}/callback"),
        "{reply:?}"
    );
    assert_eq!(calls.get(), 0);
}

/// A path parameter that is not UTF-8 once decoded is the client's
/// mistake, as axum's `Path` says: 400, whether or not the key reads it
/// (the fingerprint does), never a 500 that blames the server's template
/// and that retrying clients send again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_path_parameter_that_is_not_utf8_is_the_clients_mistake() {
    let calls = Calls::default();
    let idem = Idempotency::new(MemoryStore::new());
    for template in ["pay-callback:{path:payment_no}", ""] {
        let app = payments_app(&calls, &idem, template);
        let reply = send(&app, post("/payments/P%FF/callback", Some("k-utf8"), ORDER)).await;
        reply.assert_problem(StatusCode::BAD_REQUEST, "key-invalid");
        assert!(reply.text().contains("UTF-8"), "{template}: {reply:?}");
    }
    assert_eq!(calls.get(), 0);
}

fn payments_app(calls: &Calls, idem: &Idempotency, template: &str) -> Router {
    let calls = calls.clone();
    let handler = move |Path(payment_no): Path<String>| {
        let calls = calls.clone();
        async move {
            let n = calls.run();
            (StatusCode::OK, format!("{payment_no} credited by call {n}"))
        }
    };
    let layer = match template {
        "" => idem.layer(),
        template => idem.layer_with_key(template).expect("a valid template"),
    };
    Router::new().route(
        "/payments/{payment_no}/callback",
        axum_post(handler).layer(layer),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn path_placeholder_is_read_from_the_axum_router() {
    let calls = Calls::default();
    let idem = Idempotency::new(MemoryStore::new());
    let app = payments_app(&calls, &idem, "pay-callback:{path:payment_no}");
    let paid = r#"{"status":"PAID","amount_cents":500}"#;

    let first = send(&app, post("/payments/P-1/callback", None, paid)).await;
    let again = send(&app, post("/payments/P-1/callback", None, paid)).await;
    let encoded = send(&app, post("/payments/P%2D1/callback", None, paid)).await;
    let other = send(&app, post("/payments/P-2/callback", None, paid)).await;

    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(first.text(), "P-1 credited by call 1");
    assert!(!first.replayed());
    assert!(again.replayed() && encoded.replayed(), "{encoded:?}");
    assert_eq!(encoded.body, first.body);
    assert_eq!(other.text(), "P-2 credited by call 2");
    assert!(!other.replayed());
    assert_eq!(calls.get(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn default_layer_behind_axum_keys_by_header_and_matched_route() {
    let calls = Calls::default();
    let idem = Idempotency::new(MemoryStore::new());
    let app = payments_app(&calls, &idem, "");
    let paid = r#"{"status":"PAID","amount_cents":500}"#;

    let missing = send(&app, post("/payments/P-1/callback", None, paid)).await;
    missing.assert_problem(StatusCode::BAD_REQUEST, "key-missing");
    let first = send(&app, post("/payments/P-1/callback", Some("k-ax"), paid)).await;
    let again = send(&app, post("/payments/P-1/callback", Some("k-ax"), paid)).await;

    assert_eq!(first.text(), "P-1 credited by call 1");
    assert!(again.replayed());
    assert_eq!(again.body, first.body);
    assert_eq!(calls.get(), 1);
}

/// As `same_key_on_two_resources_of_one_route_never_replays_across_them`,
/// behind axum, where the route comes from `MatchedPath`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn same_key_on_two_resources_behind_axum_never_replays_across_them() {
    let calls = Calls::default();
    let idem = Idempotency::new(MemoryStore::new());
    let app = payments_app(&calls, &idem, "");
    let paid = r#"{"status":"PAID","amount_cents":500}"#;

    let first = send(&app, post("/payments/P-1/callback", Some("k-cb"), paid)).await;
    let second = send(&app, post("/payments/P-2/callback", Some("k-cb"), paid)).await;

    assert_eq!(first.text(), "P-1 credited by call 1");
    assert!(
        !second.replayed(),
        "P-2's callback got P-1's response replayed: {second:?} (calls: {})",
        calls.get()
    );
    assert!(
        second.status == StatusCode::UNPROCESSABLE_ENTITY || calls.get() == 2,
        "{second:?}"
    );
}
