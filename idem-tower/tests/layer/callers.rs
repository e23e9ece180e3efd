//! Tenants and users: a record is bound to the caller who made it, whatever
//! the template names; a missing or ambiguous identity is a 400, never a
//! shorter key (ARCHITECTURE.md, "Keys and callers").

use std::convert::Infallible;
use std::fmt;
use std::sync::Arc;

use axum::body::Body;
use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode, header};
use http_body_util::Full;
use idem_tower::{Idempotency, MemoryStore, Resolver};
use tower::{Layer, Service, ServiceBuilder};

use crate::fixtures::{ORDER, counting, json};
use crate::support::{Calls, post, send, signed};

/// What the authentication middleware puts in the request.
#[derive(Debug, Clone)]
struct UserId(String);

impl fmt::Display for UserId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Demo authentication: `Authorization: Bearer <user>` becomes a [`UserId`].
fn authenticate(mut request: Request<Body>) -> Request<Body> {
    let user = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(|u| UserId(u.to_owned()));
    if let Some(user) = user {
        request.extensions_mut().insert(user);
    }
    request
}

fn as_tenant(mut request: Request<Body>, tenant: &str) -> Request<Body> {
    request.headers_mut().insert(
        "x-tenant-id",
        HeaderValue::from_str(tenant).expect("a header value"),
    );
    request
}

fn as_user(request: Request<Body>, tenant: &str, user: &str) -> Request<Body> {
    signed(as_tenant(request, tenant), user)
}

/// A handler that answers with the order number and who it was for.
fn whose_order(
    calls: &Calls,
) -> impl Service<
    Request<Body>,
    Response = Response<Full<Bytes>>,
    Error = Infallible,
    Future: Send + 'static,
> + Clone
+ Send
+ 'static {
    counting(calls, |n, request: Request<Body>| async move {
        let tenant = request
            .headers()
            .get("x-tenant-id")
            .map(|v| v.to_str().expect("ASCII").to_owned())
            .unwrap_or_default();
        let user = request
            .extensions()
            .get::<UserId>()
            .map(ToString::to_string)
            .unwrap_or_default();
        json(
            StatusCode::CREATED,
            format!(r#"{{"order_id":{n},"tenant":"{tenant}","user":"{user}"}}"#),
        )
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn same_key_under_two_tenants_runs_twice_and_never_crosses() {
    let calls = Calls::default();
    let idem = Idempotency::builder(MemoryStore::new())
        .tenant(Resolver::header("x-tenant-id"))
        .build();
    let service = idem.layer().layer(whose_order(&calls));
    let request = |tenant: &str| as_tenant(post("/orders", Some("k-shared"), ORDER), tenant);

    let acme = send(&service, request("acme")).await;
    let globex = send(&service, request("globex")).await;
    assert_eq!(calls.get(), 2, "one execution per tenant");
    assert!(!acme.replayed());
    assert!(
        !globex.replayed(),
        "globex must not get acme's response: {globex:?}"
    );
    assert_eq!(acme.text(), r#"{"order_id":1,"tenant":"acme","user":""}"#);
    assert_eq!(
        globex.text(),
        r#"{"order_id":2,"tenant":"globex","user":""}"#
    );

    let acme_again = send(&service, request("acme")).await;
    let globex_again = send(&service, request("globex")).await;
    assert!(acme_again.replayed() && globex_again.replayed());
    assert_eq!(acme_again.body, acme.body);
    assert_eq!(globex_again.body, globex.body);
    assert_eq!(calls.get(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn same_key_for_two_users_of_one_tenant_runs_twice_and_never_crosses() {
    let calls = Calls::default();
    let idem = Idempotency::builder(MemoryStore::new())
        .tenant(Resolver::header("x-tenant-id"))
        .user(Resolver::extension::<UserId>())
        .build();
    let service = ServiceBuilder::new()
        .map_request(authenticate)
        .layer(idem.layer())
        .service(whose_order(&calls));
    let request = |user: &str| as_user(post("/orders", Some("k-shared"), ORDER), "acme", user);

    let alice = send(&service, request("alice")).await;
    let bob = send(&service, request("bob")).await;
    assert_eq!(calls.get(), 2, "one execution per user");
    assert!(
        !bob.replayed(),
        "bob must not get alice's response: {bob:?}"
    );
    assert_eq!(
        alice.text(),
        r#"{"order_id":1,"tenant":"acme","user":"alice"}"#
    );
    assert_eq!(bob.text(), r#"{"order_id":2,"tenant":"acme","user":"bob"}"#);

    let alice_again = send(&service, request("alice")).await;
    let bob_again = send(&service, request("bob")).await;
    assert!(alice_again.replayed() && bob_again.replayed());
    assert_eq!(alice_again.body, alice.body);
    assert_eq!(bob_again.body, bob.body);

    // No user: a 400 naming the part, never a key without the user in it.
    let anonymous = send(
        &service,
        as_tenant(post("/orders", Some("k-shared"), ORDER), "acme"),
    )
    .await;
    anonymous.assert_problem(StatusCode::BAD_REQUEST, "key-missing");
    assert_eq!(calls.get(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn missing_tenant_is_400_never_a_shorter_key() {
    let calls = Calls::default();
    let idem = Idempotency::builder(MemoryStore::new())
        .tenant(Resolver::header("x-tenant-id"))
        .build();
    let service = idem.layer().layer(whose_order(&calls));

    let reply = send(&service, post("/orders", Some("k-anon"), ORDER)).await;

    reply.assert_problem(StatusCode::BAD_REQUEST, "key-missing");
    assert!(
        reply.text().contains("tenant"),
        "the 400 names the part: {reply:?}"
    );
    assert_eq!(calls.get(), 0);
}

/// The key template names neither tenant nor user, yet a record is bound to
/// the caller who made it: another tenant's user sending the same key gets
/// a run of their own, never the first caller's response.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn records_are_bound_to_the_caller_whatever_the_template_names() {
    let calls = Calls::default();
    let idem = Idempotency::builder(MemoryStore::new())
        .tenant(Resolver::header("x-tenant-id"))
        .user(Resolver::extension::<UserId>())
        .build();
    let template = "refund:{path:charge_id}:{header:idempotency-key}";
    let layer = idem.layer_with_key(template).expect("a valid template");
    let service = ServiceBuilder::new()
        .map_request(authenticate)
        .layer(layer.clone().route("/charges/{charge_id}/refund"))
        .service(whose_order(&calls));
    let refund = |tenant: &str, user: &str| {
        as_user(
            post("/charges/ch_1/refund", Some("k-refund"), ORDER),
            tenant,
            user,
        )
    };

    let alice = send(&service, refund("acme", "alice")).await;
    let mallory = send(&service, refund("globex", "mallory")).await;
    let bob = send(&service, refund("acme", "bob")).await;
    let anonymous = send(
        &service,
        post("/charges/ch_1/refund", Some("k-refund"), ORDER),
    )
    .await;

    assert_eq!(
        alice.text(),
        r#"{"order_id":1,"tenant":"acme","user":"alice"}"#
    );
    for (reply, who) in [
        (&mallory, "globex/mallory"),
        (&bob, "acme/bob"),
        (&anonymous, "no one"),
    ] {
        assert!(!reply.replayed(), "{who} got a replay: {reply:?}");
        assert_ne!(reply.body, alice.body, "{who} got alice's response");
        assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
    }
    assert_eq!(calls.get(), 4, "one run per caller");

    let alice_again = send(&service, refund("acme", "alice")).await;
    assert!(alice_again.replayed());
    assert_eq!(alice_again.body, alice.body);
    assert_eq!(calls.get(), 4);

    // Opting in to one record shared by every caller is explicit.
    let shared_calls = Calls::default();
    let shared = ServiceBuilder::new()
        .map_request(authenticate)
        .layer(
            layer
                .shared_across_callers()
                .route("/charges/{charge_id}/refund"),
        )
        .service(whose_order(&shared_calls));
    let shared_refund = |tenant: &str, user: &str| {
        as_user(
            post("/charges/ch_2/refund", Some("k-refund"), ORDER),
            tenant,
            user,
        )
    };
    let first = send(&shared, shared_refund("acme", "alice")).await;
    let other = send(&shared, shared_refund("globex", "mallory")).await;
    assert!(other.replayed(), "{other:?}");
    assert_eq!(other.body, first.body);
    assert_eq!(shared_calls.get(), 1);
}

/// [`whose_order`] behind a layer with `template`, on a handle whose tenant
/// comes from `X-Tenant-Id`.
fn tenant_scoped(
    calls: &Calls,
    template: &str,
) -> impl Service<
    Request<Body>,
    Response = Response<idem_tower::layer::ResponseBody<Full<Bytes>>>,
    Error = Infallible,
    Future: Send + 'static,
> + Clone
+ Send
+ 'static {
    Idempotency::builder(MemoryStore::new())
        .tenant(Resolver::header("x-tenant-id"))
        .build()
        .layer_with_key(template)
        .expect("a valid template")
        .layer(whose_order(calls))
}

/// An identity the request gives ambiguously (the tenant header twice) is a
/// 400, even where the template does not name it: read as "no tenant", two
/// requests naming different tenants would share one record.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_ambiguous_identity_is_refused_never_read_as_none() {
    let calls = Calls::default();
    let service = tenant_scoped(&calls, "refund:{header:idempotency-key}");
    for tenants in [["acme", "globex"], ["globex", "acme"]] {
        let mut request = post("/refunds", Some("k-ambiguous"), ORDER);
        for tenant in tenants {
            request
                .headers_mut()
                .append("x-tenant-id", HeaderValue::from_static(tenant));
        }
        let reply = send(&service, request).await;
        reply.assert_problem(StatusCode::BAD_REQUEST, "key-invalid");
        assert!(reply.text().contains("x-tenant-id"), "{reply:?}");
    }
    let mut unprintable = post("/refunds", Some("k-ambiguous"), ORDER);
    unprintable.headers_mut().insert(
        "x-tenant-id",
        HeaderValue::from_bytes(b"acme corp").expect("a header value"),
    );
    send(&service, unprintable)
        .await
        .assert_problem(StatusCode::BAD_REQUEST, "key-invalid");
    assert_eq!(calls.get(), 0);
}

/// Many callers racing on one key: each caller's requests run once, and
/// no caller ever reads another's body.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_callers_on_one_key_each_run_once_and_never_cross() {
    let calls = Calls::default();
    let service = tenant_scoped(&calls, "order:{header:idempotency-key}");
    let barrier = Arc::new(tokio::sync::Barrier::new(40));
    let tasks: Vec<_> = (0..40)
        .map(|i| {
            let service = service.clone();
            let barrier = Arc::clone(&barrier);
            let tenant = format!("t{}", i % 4);
            tokio::spawn(async move {
                barrier.wait().await;
                let request = as_tenant(post("/orders", Some("k-race"), ORDER), &tenant);
                (tenant, send(&service, request).await)
            })
        })
        .collect();
    for task in tasks {
        let (tenant, reply) = task.await.expect("no request task panics");
        if reply.status == StatusCode::CONFLICT {
            reply.assert_problem(StatusCode::CONFLICT, "in-flight");
            continue;
        }
        assert!(
            reply.text().contains(&format!(r#""tenant":"{tenant}""#)),
            "{tenant} read another caller's body: {reply:?}"
        );
    }
    assert_eq!(calls.get(), 4, "one run per tenant");
}
