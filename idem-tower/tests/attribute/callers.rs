//! Callers: each tenant and user gets their own record for the same key
//! (unless the handler opts in to `shared_across_callers`), one caller's
//! request in flight does not hold up another's, and a user resolver may be
//! an extractor on the app state (ARCHITECTURE.md, "Keys and callers").

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{HeaderValue, Request, StatusCode};
use idem_tower::{Idempotency, MemoryStore, Resolver};

use crate::app::{AppState, Directory, Member, app, state_with};
use crate::support::{CurrentUser, post, send, signed};

/// A handle whose tenant is a header and whose user is the bearer token,
/// through the same extractor the handlers authenticate with.
fn caller_scoped_state() -> AppState {
    state_with(
        Idempotency::builder(MemoryStore::new())
            .tenant(Resolver::header("x-tenant-id"))
            .user(Resolver::from_extractor(
                |CurrentUser(user): CurrentUser| user,
            ))
            .build(),
    )
}

/// A refund of charge `ch-1` with key `r-1`, by this tenant and user.
fn refund(uri: &str, tenant: &str, user: &str) -> Request<Body> {
    let mut request = signed(post(uri, Some("r-1"), ""), user);
    request.headers_mut().insert(
        "x-tenant-id",
        HeaderValue::from_str(tenant).expect("a header value"),
    );
    request
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_with_the_same_key_each_get_their_own_response() {
    let state = caller_scoped_state();
    let app = app(state.clone());
    let uri = "/charges/ch-1/refunds";

    let alice = send(&app, refund(uri, "acme", "alice")).await;
    let bob = send(&app, refund(uri, "globex", "bob")).await;
    // The same tenant, another user: still another caller.
    let carol = send(&app, refund(uri, "acme", "carol")).await;
    for (reply, user) in [(&alice, "alice"), (&bob, "bob"), (&carol, "carol")] {
        assert_eq!(reply.status, StatusCode::CREATED);
        assert!(!reply.replayed(), "{user} got another caller's response");
        assert_eq!(reply.json()["refunded_by"], user);
    }
    assert_eq!(state.calls.get(), 3);

    // Each caller's duplicate replays their own.
    let alice_again = send(&app, refund(uri, "acme", "alice")).await;
    assert!(alice_again.replayed());
    assert_eq!(alice_again.body, alice.body);
    let bob_again = send(&app, refund(uri, "globex", "bob")).await;
    assert!(bob_again.replayed());
    assert_eq!(bob_again.body, bob.body);
    assert_eq!(state.calls.get(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_callers_request_in_flight_does_not_hold_up_another_callers_same_key() {
    let state = caller_scoped_state();
    let app = app(state.clone());
    let uri = "/slow/charges/ch-1/refunds";
    let spawn = |request: Request<Body>| {
        let app = app.clone();
        tokio::spawn(async move { send(&app, request).await })
    };

    let alice = spawn(refund(uri, "acme", "alice"));
    state.calls.wait_for(1).await;
    // Alice's request is running; Bob's, with the same key, is not hers.
    let bob = spawn(refund(uri, "globex", "bob"));
    let alice_duplicate = spawn(refund(uri, "acme", "alice"));
    let (alice, bob, alice_duplicate) = (
        alice.await.expect("no request task panics"),
        bob.await.expect("no request task panics"),
        alice_duplicate.await.expect("no request task panics"),
    );
    assert_eq!(alice.status, StatusCode::CREATED);
    assert_eq!(bob.status, StatusCode::CREATED);
    assert!(!bob.replayed());
    assert_eq!(bob.json()["refunded_by"], "bob");
    alice_duplicate.assert_problem(StatusCode::CONFLICT, "in-flight");
    assert_eq!(state.calls.get(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_across_callers_replays_one_callers_response_to_another() {
    let state = caller_scoped_state();
    let app = app(state.clone());
    let uri = "/shared/charges/ch-1/refunds";

    let alice = send(&app, refund(uri, "acme", "alice")).await;
    assert_eq!(alice.status, StatusCode::CREATED);
    assert!(!alice.replayed());
    let bob = send(&app, refund(uri, "globex", "bob")).await;
    assert!(bob.replayed());
    assert_eq!(bob.json()["refunded_by"], "alice");
    assert_eq!(state.calls.get(), 1);
}

/// A handle whose user is the member an API key stands for: a resolver
/// that extracts on the app state.
fn member_state() -> AppState {
    let mut state = state_with(
        Idempotency::builder(MemoryStore::new())
            .user(Resolver::from_extractor_with_state::<AppState, Member, _>(
                |Member(member)| member,
            ))
            .build(),
    );
    state.directory = Directory(Arc::new(HashMap::from([
        ("key-ann".to_owned(), "ann".to_owned()),
        ("key-ben".to_owned(), "ben".to_owned()),
    ])));
    state
}

/// `POST /grants` with key `g-1` and, if given, an `X-Api-Key`.
fn grant_request(api_key: Option<&str>) -> Request<Body> {
    let mut request = post("/grants", Some("g-1"), "");
    if let Some(api_key) = api_key {
        request.headers_mut().insert(
            "x-api-key",
            HeaderValue::from_str(api_key).expect("a header value"),
        );
    }
    request
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resolver_extracting_on_the_app_state_keys_each_member() {
    let state = member_state();
    let app = app(state.clone());

    let ann = send(&app, grant_request(Some("key-ann"))).await;
    assert_eq!(ann.status, StatusCode::CREATED);
    assert_eq!(ann.text(), "grant 1 to ann");
    let again = send(&app, grant_request(Some("key-ann"))).await;
    assert!(again.replayed());
    assert_eq!(again.text(), "grant 1 to ann");
    // `{user}` is the member: the same key is another record for ben.
    let ben = send(&app, grant_request(Some("key-ben"))).await;
    assert!(!ben.replayed());
    assert_eq!(ben.text(), "grant 2 to ben");
    assert_eq!(state.calls.get(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resolver_rejection_is_answered_as_is_and_claims_nothing() {
    let state = member_state();
    let app = app(state.clone());

    let missing = send(&app, grant_request(None)).await;
    assert_eq!(missing.status, StatusCode::UNAUTHORIZED);
    assert_eq!(missing.text(), "no api key");
    let unknown = send(&app, grant_request(Some("key-eve"))).await;
    assert_eq!(unknown.status, StatusCode::FORBIDDEN);
    assert_eq!(unknown.text(), "unknown api key");
    assert!(!unknown.replayed());
    assert_eq!(state.calls.get(), 0);

    let granted = send(&app, grant_request(Some("key-ann"))).await;
    assert_eq!(granted.status, StatusCode::CREATED);
    assert!(!granted.replayed());
    assert_eq!(granted.text(), "grant 1 to ann");
    assert_eq!(state.calls.get(), 1);
}
