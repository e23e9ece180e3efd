//! The `grpc_payments` example's server and client over HTTP/2 on
//! loopback: idem's layer on the whole tonic server, limited to `Charge`,
//! with tonic's health and reflection services beside it; each test counts
//! `Charge`'s runs and the charges made.

use std::time::Duration;

use idem_examples::grpc_payments::proto::payments_client::PaymentsClient;
use idem_examples::grpc_payments::proto::{ChargeReply, ChargeRequest, GetChargeRequest};
use idem_examples::grpc_payments::{self, Payments};
use idem_tower::InFlightPolicy;
use idem_tower::client::{KeyOrigin, RetryPolicy, RetryReport};
use tonic::transport::Channel;
use tonic::{Code, Status};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_reflection::pb::v1::ServerReflectionRequest;
use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;

/// A server on a loopback port with `payments` behind the example's layer
/// (`wait`: duplicates of a running charge wait for its reply); a channel
/// to it, and the health reporter.
async fn start(payments: &Payments, wait: bool) -> (Channel, tonic_health::server::HealthReporter) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let idem = grpc_payments::idempotency();
    let mut layer = grpc_payments::idempotency_layer(&idem);
    if wait {
        layer = layer.in_flight(InFlightPolicy::Wait(Duration::from_secs(5)));
    }
    let health = grpc_payments::serve(listener, payments.clone(), layer)
        .await
        .expect("the server starts");
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .expect("the server accepts");
    (channel, health)
}

/// A `Charge` request for the tenant `acme`, with `key` as its
/// `idempotency-key` metadata.
fn charge(key: Option<&str>, amount_cents: i64) -> tonic::Request<ChargeRequest> {
    let mut request = tonic::Request::new(ChargeRequest {
        account: "acct_42".into(),
        amount_cents,
    });
    let metadata = request.metadata_mut();
    metadata.insert("x-tenant-id", "acme".parse().unwrap());
    if let Some(key) = key {
        metadata.insert("idempotency-key", key.parse().unwrap());
    }
    request
}

fn replayed<T>(response: &tonic::Response<T>) -> bool {
    response
        .metadata()
        .get("idempotent-replayed")
        .is_some_and(|v| v == "true")
}

/// A plain client, without idem's client layer: each call is one attempt.
fn plain(channel: &Channel) -> PaymentsClient<Channel> {
    PaymentsClient::new(channel.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_first_charge_runs_and_its_replays_carry_its_reply_and_the_marker() {
    let payments = Payments::new();
    let (channel, _health) = start(&payments, false).await;
    let mut client = plain(&channel);
    let first = client.charge(charge(Some("k-1"), 1250)).await.expect("OK");
    assert!(!replayed(&first));
    for _ in 0..3 {
        let again = client.charge(charge(Some("k-1"), 1250)).await.expect("OK");
        assert!(replayed(&again));
        assert_eq!(again.get_ref(), first.get_ref());
    }
    assert_eq!((payments.runs(), payments.charges()), (1, 1));
    // A read is not deduplicated and needs no key.
    let read = client
        .get_charge(GetChargeRequest {
            charge_id: first.get_ref().charge_id.clone(),
        })
        .await
        .expect("the charge exists");
    assert!(!replayed(&read));
    assert_eq!(read.get_ref(), first.get_ref());
}

/// Twenty calls with one key at once, `Charge` taking 600 ms: one run.
async fn race(channel: &Channel) -> Vec<Result<(ChargeReply, bool), Status>> {
    let calls: Vec<_> = (0..20)
        .map(|_| {
            let mut client = plain(channel);
            tokio::spawn(async move {
                let reply = client.charge(charge(Some("k-race"), 700)).await?;
                Ok((reply.get_ref().clone(), replayed(&reply)))
            })
        })
        .collect();
    let mut results = Vec::new();
    for call in calls {
        results.push(call.await.expect("the task ends"));
    }
    results
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_charges_with_one_key_run_once_and_the_others_are_told_it_runs() {
    let payments = Payments::new().with_delay(Duration::from_millis(600));
    let (channel, _health) = start(&payments, false).await;
    let results = race(&channel).await;
    assert_eq!(payments.runs(), 1, "one run for 20 calls");
    let ok = results.iter().filter(|r| r.is_ok()).count();
    let aborted: Vec<_> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    assert_eq!(ok, 1, "only the first got the reply while it ran");
    assert_eq!(aborted.len(), 19);
    for status in aborted {
        assert_eq!(status.code(), Code::Aborted, "{status:?}");
        assert!(
            status.metadata().get("grpc-retry-pushback-ms").is_some(),
            "{status:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn waiting_duplicates_of_a_running_charge_get_its_reply_replayed() {
    let payments = Payments::new().with_delay(Duration::from_millis(600));
    let (channel, _health) = start(&payments, true).await;
    let results = race(&channel).await;
    assert_eq!(payments.runs(), 1, "one run for 20 calls");
    let replies: Vec<_> = results
        .into_iter()
        .map(|r| r.expect("every caller gets the reply"))
        .collect();
    assert!(replies.iter().all(|(reply, _)| reply.charge_id == "ch_1"));
    assert_eq!(replies.iter().filter(|(_, r)| !r).count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn invalid_argument_is_kept_and_a_corrected_charge_with_a_new_key_runs() {
    let payments = Payments::new();
    let (channel, _health) = start(&payments, false).await;
    let mut client = plain(&channel);
    for _ in 0..2 {
        let refused = client.charge(charge(Some("k-bad"), -5)).await.unwrap_err();
        assert_eq!(refused.code(), Code::InvalidArgument);
        assert_eq!(refused.message(), "amount_cents must be positive");
    }
    assert_eq!(payments.runs(), 1, "the refusal was replayed");
    let corrected = client.charge(charge(Some("k-good"), 5)).await.expect("OK");
    assert!(!replayed(&corrected));
    assert_eq!((payments.runs(), payments.charges()), (2, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unavailable_releases_the_key_and_the_retry_runs() {
    let payments = Payments::new();
    let (channel, _health) = start(&payments, false).await;
    let mut client = plain(&channel);
    payments.fail_next(1);
    let down = client
        .charge(charge(Some("k-flaky"), 900))
        .await
        .unwrap_err();
    assert_eq!(down.code(), Code::Unavailable);
    assert_eq!(payments.charges(), 0);
    let retried = client
        .charge(charge(Some("k-flaky"), 900))
        .await
        .expect("runs");
    assert!(!replayed(&retried));
    assert_eq!((payments.runs(), payments.charges()), (2, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_key_reused_for_another_charge_and_a_missing_key_are_refused_unrun() {
    let payments = Payments::new();
    let (channel, _health) = start(&payments, false).await;
    let mut client = plain(&channel);
    client.charge(charge(Some("k-1"), 100)).await.expect("OK");
    let reused = client.charge(charge(Some("k-1"), 999)).await.unwrap_err();
    assert_eq!(reused.code(), Code::FailedPrecondition, "{reused:?}");
    let missing = client.charge(charge(None, 100)).await.unwrap_err();
    assert_eq!(missing.code(), Code::InvalidArgument, "{missing:?}");
    assert!(missing.message().contains("missing"), "{missing:?}");
    assert_eq!((payments.runs(), payments.charges()), (1, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn health_check_and_watch_pass_through_the_server_wide_layer() {
    let payments = Payments::new();
    let (channel, reporter) = start(&payments, false).await;
    let mut health = HealthClient::new(channel.clone());
    let service = "payments.Payments".to_owned();
    let request = || HealthCheckRequest {
        service: service.clone(),
    };
    for _ in 0..2 {
        let checked = health.check(request()).await.expect("no key asked");
        assert_eq!(checked.get_ref().status(), ServingStatus::Serving);
        assert!(!replayed(&checked));
    }
    // Watch's answer is a stream that stays open: its first message comes
    // at once, the next when the status changes.
    let mut watch = health
        .watch(request())
        .await
        .expect("watching")
        .into_inner();
    let first = watch.message().await.expect("a message").expect("open");
    assert_eq!(first.status(), ServingStatus::Serving);
    reporter
        .set_not_serving::<grpc_payments::proto::payments_server::PaymentsServer<Payments>>()
        .await;
    let next = tokio::time::timeout(Duration::from_secs(5), watch.message())
        .await
        .expect("streamed, not buffered")
        .expect("a message")
        .expect("open");
    assert_eq!(next.status(), ServingStatus::NotServing);
    assert_eq!(payments.runs(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reflection_answers_on_a_request_stream_left_open() {
    let payments = Payments::new();
    let (channel, _health) = start(&payments, false).await;
    let mut reflection = ServerReflectionClient::new(channel);
    let (requests, outgoing) = tokio::sync::mpsc::channel(4);
    let list_services = || ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    requests.send(list_services()).await.unwrap();
    let mut answers = reflection
        .server_reflection_info(tokio_stream::wrappers::ReceiverStream::new(outgoing))
        .await
        .expect("the stream opens while the request stream is open")
        .into_inner();
    for round in 0..2 {
        let answer = tokio::time::timeout(Duration::from_secs(5), answers.message())
            .await
            .expect("answered with the request stream still open")
            .expect("a message")
            .expect("open");
        let Some(MessageResponse::ListServicesResponse(list)) = answer.message_response else {
            panic!("round {round}: {answer:?}");
        };
        let names: Vec<_> = list.service.iter().map(|s| s.name.as_str()).collect();
        assert!(names.contains(&"payments.Payments"), "{names:?}");
        if round == 0 {
            requests.send(list_services()).await.unwrap();
        }
    }
    drop(requests);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_client_layer_retries_unavailable_with_one_key_and_the_charge_runs_once() {
    let payments = Payments::new();
    let (channel, _health) = start(&payments, false).await;
    let policy =
        RetryPolicy::default().backoff(Duration::from_millis(5), Duration::from_millis(20));
    let mut client = grpc_payments::client(channel.clone(), policy);
    payments.fail_next(2);
    let reply = client
        .charge(charge(None, 300))
        .await
        .expect("retried to OK");
    let report = reply
        .extensions()
        .get::<RetryReport>()
        .expect("a report")
        .clone();
    assert_eq!(report.attempts, 3);
    assert_eq!(report.origin, KeyOrigin::Generated);
    assert!(!report.replayed);
    assert_eq!((payments.runs(), payments.charges()), (3, 1));

    // The final codes go straight back: one attempt.
    let refused = client.charge(charge(None, -1)).await.unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument);
    assert_eq!(payments.runs(), 4);
    // A call that ends in a status still has its report.
    let report = RetryReport::of_status(&refused).expect("a report in the status");
    assert_eq!(report.attempts, 1);
    assert_eq!(report.origin, KeyOrigin::Generated);
    assert!(report.key.is_some());

    // Retried to the end of its attempts: the last status, and its report.
    payments.fail_next(2);
    let mut limited = grpc_payments::client(
        channel,
        RetryPolicy::default()
            .max_attempts(2)
            .backoff(Duration::from_millis(5), Duration::from_millis(5)),
    );
    let unavailable = limited.charge(charge(Some("k-last"), 5)).await.unwrap_err();
    assert_eq!(unavailable.code(), Code::Unavailable);
    let report = RetryReport::of_status(&unavailable).expect("a report in the status");
    assert_eq!(report.attempts, 2);
    assert_eq!(report.origin, KeyOrigin::Caller);
    assert_eq!(report.key.unwrap(), "k-last");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_client_layer_waits_out_a_running_duplicate_and_gets_its_reply() {
    let payments = Payments::new().with_delay(Duration::from_millis(1000));
    let (channel, _health) = start(&payments, false).await;
    let mut first = plain(&channel);
    let running = tokio::spawn(async move { first.charge(charge(Some("k-slow"), 40)).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut client = grpc_payments::client(channel, RetryPolicy::default());
    let reply = client
        .charge(charge(Some("k-slow"), 40))
        .await
        .expect("the replay");
    let report = reply
        .extensions()
        .get::<RetryReport>()
        .expect("a report")
        .clone();
    assert!(report.attempts >= 2, "{report:?}");
    assert!(report.replayed && replayed(&reply), "{report:?}");
    assert_eq!(report.origin, KeyOrigin::Caller);
    let original = running.await.unwrap().expect("OK");
    assert_eq!(reply.get_ref(), original.get_ref());
    assert_eq!((payments.runs(), payments.charges()), (1, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_operation_key_in_the_calls_extensions_is_its_key_on_every_retry() {
    let payments = Payments::new();
    let (channel, _health) = start(&payments, false).await;
    let policy =
        RetryPolicy::default().backoff(Duration::from_millis(5), Duration::from_millis(20));
    let mut client = grpc_payments::client(channel, policy);
    payments.fail_next(2);
    // What a handler passes on: `operation.key_for("psp-charge")`.
    let derived = idem_tower::OperationKey::from_caller("7f3a9c-derived").unwrap();
    let mut call = charge(None, 1200);
    call.extensions_mut().insert(derived.clone());
    let reply = client.charge(call).await.expect("retried to OK");
    let report = reply
        .extensions()
        .get::<RetryReport>()
        .expect("a report")
        .clone();
    assert_eq!(report.attempts, 3);
    assert_eq!(report.origin, KeyOrigin::Caller);
    assert_eq!(report.key.unwrap(), derived.as_str());
    // The same call again, the same key: replayed, not charged.
    let mut again = charge(None, 1200);
    again.extensions_mut().insert(derived);
    let replay = client.charge(again).await.expect("OK");
    assert!(replayed(&replay));
    assert_eq!(replay.get_ref(), reply.get_ref());
    assert_eq!((payments.runs(), payments.charges()), (3, 1));
}
