//! The service the layer makes, and the one path a request takes through it.

use std::panic::AssertUnwindSafe;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::FutureExt;
use http::{Request, Response};
use http_body::Body;
use idem_core::BoxError;
use tower::Service;
use tracing::Instrument;

use super::answer::Wire;
use super::claim::Claimed;
use super::future::MustFinish;
use super::layer::Settings;
use super::{RebuildBody, ResponseFuture, claim, key, read, settle};
use crate::layer::ResponseBody;
use crate::metrics::{self, Handled, RouteLabel};

/// The service made by [`IdempotencyLayer`](super::IdempotencyLayer).
#[derive(Debug, Clone)]
pub struct IdempotencyService<S> {
    inner: S,
    settings: Settings,
}

/// A generated tonic server keeps its name behind the layer, so the layer
/// can wrap one service: `Server::builder().add_service(layer.layer(svc))`.
#[cfg(feature = "grpc")]
impl<S: tonic::server::NamedService> tonic::server::NamedService for IdempotencyService<S> {
    const NAME: &'static str = S::NAME;
}

impl<S> IdempotencyService<S> {
    pub(super) fn new(inner: S, settings: Settings) -> Self {
        Self { inner, settings }
    }
}

type Reply<B, E> = Result<Response<ResponseBody<B>>, E>;

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for IdempotencyService<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Send,
    ReqBody: RebuildBody + Send + 'static,
    ReqBody::Data: Send,
    ReqBody::Error: Into<BoxError>,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Send,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<Reply<ResBody, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        // The clone takes the place of the service that was polled ready.
        let clone = self.inner.clone();
        let ready = std::mem::replace(&mut self.inner, clone);
        let span = tracing::info_span!(
            "idempotency",
            method = %request.method(),
            key = tracing::field::Empty
        );
        let settings = self.settings.clone();
        ResponseFuture::new(|attempt| through(settings, ready, request, attempt).instrument(span))
    }
}

/// One request through the layer: read the request, resolve its caller and
/// key, claim the key, call the service, settle its outcome (ARCHITECTURE.md,
/// "Bird's-eye view"). Once the claim is sent, the rest cannot be cancelled
/// (ARCHITECTURE.md, "Records"): `attempt` says so to the
/// [`ResponseFuture`] this runs in. A step that answers the request itself ends the path
/// there, with the layer's own [`Answer`](super::answer::Answer).
async fn through<S, ReqBody, ResBody>(
    settings: Settings,
    mut inner: S,
    request: Request<ReqBody>,
    attempt: MustFinish,
) -> Reply<ResBody, S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Send + 'static,
    S::Future: Send,
    S::Error: Send,
    ReqBody: RebuildBody + Send + 'static,
    ReqBody::Error: Into<BoxError>,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Send,
{
    let route = key::matched_route(request.extensions(), &settings.policy);
    let label = route.clone().unwrap_or_else(metrics::unknown_route);
    if read::passes_through(&settings, request.method()) {
        metrics::request(Handled::SafeMethod, &label);
        return Ok(inner.call(request).await?.map(ResponseBody::inner));
    }
    if read::not_selected(&settings, request.uri().path()) {
        metrics::request(Handled::Unkeyed, &label);
        return Ok(inner.call(request).await?.map(ResponseBody::inner));
    }

    // Read the request: who is calling (the resolvers run first), then,
    // unless the head already says the request carries no key, the body.
    let wire = Wire::of(request.headers());
    let (mut parts, body) = request.into_parts();
    let caller = match read::caller(&settings, &mut parts).await {
        Ok(caller) => caller,
        Err(answer) => return Ok(answer.respond(&settings, &label, wire)),
    };
    let params = match key::path_params(&mut parts, &settings.policy).await {
        Ok(params) => params,
        Err(answer) => return Ok(answer.respond(&settings, &label, wire)),
    };
    if key::absent_from_head(&settings, &parts, &params) {
        tracing::debug!("no idempotency key on an optional route; passing through");
        metrics::request(Handled::Unkeyed, &label);
        let request = Request::from_parts(parts, body);
        return Ok(inner.call(request).await?.map(ResponseBody::inner));
    }
    let body = match read::body(&settings, &parts.headers, body).await {
        Ok(body) => body,
        Err(answer) => return Ok(answer.respond(&settings, &label, wire)),
    };

    let message = match read::message(&settings, wire.grpc, &parts.headers, &body) {
        Ok(message) => message,
        Err(answer) => return Ok(answer.respond(&settings, &label, wire)),
    };

    // Resolve the key; an optional key that is absent lets the request through.
    let target = match key::target(&settings, &parts, &params, &message, route, &caller) {
        Ok(Some(target)) => target,
        Ok(None) => {
            tracing::debug!("no idempotency key on an optional route; passing through");
            metrics::request(Handled::Unkeyed, &label);
            let request = Request::from_parts(parts, ReqBody::rebuild(body));
            return Ok(inner.call(request).await?.map(ResponseBody::inner));
        }
        Err(answer) => return Ok(answer.respond(&settings, &label, wire)),
    };

    // Claim it: the key is ours, or a duplicate is answered. From here the
    // attempt is not cut off with its client: a claim already sent may land
    // in the store after the client has gone, and would then hold the key
    // until its lease ran out.
    // The operation the handler runs for, from the key before the claim
    // takes it.
    let operation = settings
        .config()
        .outbound
        .as_ref()
        .map(|keys| keys.operation(&target.key, &target.fingerprint, settings.ttl));
    attempt.set();
    let held = match claim::claim(&settings, target, &label, &attempt).await {
        Ok(held) => held,
        Err(answer) => return Ok(answer.respond(&settings, &label, wire)),
    };
    if attempt.client_gone() {
        // Nobody waits for a response: the key goes free at once, and the
        // service is not called. (The response below is read by no one.)
        metrics::request(Handled::NotRun, &label);
        held.abort("the client went away before the service was called")
            .await;
        return Ok(Response::new(ResponseBody::full(Bytes::new())));
    }

    // Call the service and settle its outcome, whether or not the client
    // waits for it: a handler that has started runs to its end even if the
    // client goes (its effect may be half made), and its outcome is settled
    // either way.
    if let Some(operation) = operation {
        parts.extensions.insert(operation);
    }
    call_and_settle(settings, held, inner, parts, body, label, wire).await
}

/// Calls the service while the claim is held, then keeps a final outcome or
/// lets the key go for a retry.
async fn call_and_settle<S, ReqBody, ResBody>(
    settings: Settings,
    mut claimed: Claimed,
    mut inner: S,
    mut parts: http::request::Parts,
    body: Bytes,
    label: RouteLabel,
    wire: Wire,
) -> Reply<ResBody, S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ReqBody: RebuildBody,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Send,
{
    claimed.lend(&mut parts.extensions);
    let request = Request::from_parts(parts, ReqBody::rebuild(body));
    let call = async { inner.call(request).await };
    let called = AssertUnwindSafe(claimed.hold(call, &label))
        .catch_unwind()
        .await;
    match called {
        Ok(Ok(response)) => Ok(settle::settle(settings, claimed, response, label, wire).await),
        Ok(Err(err)) => {
            metrics::request(Handled::Released, &label);
            claimed.abort("service error").await;
            Err(err)
        }
        Err(panic) => {
            metrics::request(Handled::Released, &label);
            claimed.abort("panicked").await;
            std::panic::resume_unwind(panic)
        }
    }
}

#[cfg(all(test, idem_loom))]
mod loom_checks {
    //! A request's path through the layer under loom (`.ci/loom`): this
    //! module's `through` with the claim, its `ClaimGuard` (`guard.rs`), the
    //! lease and the settling, on a store whose claims land on a thread
    //! of their own (a claim sent lands whatever its sender does, as a
    //! statement in the database does), the request dropped by its client
    //! after none to three polls (or its response waited for), and the hand-over of its attempt to a
    //! task (`task.rs`: a loom thread). Loom interleaves the landing, the
    //! polls, the drop and the task. Properties: the key is never left
    //! held (completed if the handler ran, free otherwise); a handler that
    //! started runs to its end; a client gone before its claim landed gets
    //! no handler call. A seeded bug in the guard shows the check can fail.

    use std::convert::Infallible;
    use std::future::{Future, poll_fn};
    use std::panic::{AssertUnwindSafe, catch_unwind};
    use std::pin::Pin;
    use std::sync::Arc;
    use std::task::{Context, Poll, Waker};
    use std::time::Duration;

    use http_body_util::Full;
    use idem_core::{
        Claim, Error, Fingerprint, IdempotencyKey, IdempotencyStore, Outcome, OwnerToken,
    };
    use loom::future::{AtomicWaker, block_on};
    use loom::sync::Mutex;
    use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use loom::thread;
    use tower::{Layer, service_fn};

    use super::*;
    use crate::Idempotency;
    use crate::layer::guard::Bug;

    /// Stacks deep enough for the layer's unoptimised futures (loom's own
    /// are a few kilobytes).
    const STACK: usize = 8 << 20;

    /// The one key's record.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Record {
        Free,
        Held(OwnerToken),
        Completed,
    }

    /// A store of one key, and what the request's handler did.
    #[derive(Clone)]
    struct LandingStore(Arc<Shared>);

    struct Shared {
        record: Mutex<Record>,
        /// The client had left when the claim landed.
        gone_at_landing: AtomicBool,
        /// Set by the client once it has dropped its request.
        client_gone: AtomicBool,
        started: AtomicUsize,
        finished: AtomicUsize,
    }

    /// A claim on its way: its answer once it has landed.
    struct Landing {
        answer: Mutex<Option<Claim>>,
        waker: AtomicWaker,
    }

    impl LandingStore {
        fn new() -> Self {
            Self(Arc::new(Shared {
                record: Mutex::new(Record::Free),
                gone_at_landing: AtomicBool::new(false),
                client_gone: AtomicBool::new(false),
                started: AtomicUsize::new(0),
                finished: AtomicUsize::new(0),
            }))
        }

        /// The claim of `owner`, as the store runs it.
        fn land(&self, owner: OwnerToken) -> Claim {
            let gone = self.0.client_gone.load(Ordering::SeqCst);
            self.0.gone_at_landing.store(gone, Ordering::SeqCst);
            let mut record = self.0.record.lock().unwrap();
            match *record {
                Record::Free => {
                    *record = Record::Held(owner);
                    Claim::Acquired(owner)
                }
                Record::Held(_) => Claim::InFlight { retry_after: LEASE },
                Record::Completed => Claim::Replay(Outcome::NotReplayable),
            }
        }

        /// `next` if `owner` holds the key.
        fn fenced(&self, owner: &OwnerToken, next: Record) -> Result<(), Error> {
            let mut record = self.0.record.lock().unwrap();
            if *record != Record::Held(*owner) {
                return Err(Error::lease_lost());
            }
            *record = next;
            Ok(())
        }
    }

    impl IdempotencyStore for LandingStore {
        async fn claim(
            &self,
            _key: &IdempotencyKey,
            _fingerprint: &Fingerprint,
            _lease: Duration,
            owner: OwnerToken,
        ) -> Result<Claim, Error> {
            let landing = Arc::new(Landing {
                answer: Mutex::new(None),
                waker: AtomicWaker::new(),
            });
            let (store, landed) = (self.clone(), Arc::clone(&landing));
            thread::Builder::new()
                .stack_size(STACK)
                .spawn(move || {
                    let claim = store.land(owner);
                    *landed.answer.lock().unwrap() = Some(claim);
                    landed.waker.wake();
                })
                .expect("a loom thread");
            poll_fn(|cx| {
                landing.waker.register_by_ref(cx.waker());
                match landing.answer.lock().unwrap().take() {
                    Some(claim) => Poll::Ready(Ok(claim)),
                    None => Poll::Pending,
                }
            })
            .await
        }

        async fn complete(
            &self,
            _key: &IdempotencyKey,
            owner: &OwnerToken,
            _outcome: &Outcome,
            _ttl: Duration,
        ) -> Result<(), Error> {
            self.fenced(owner, Record::Completed)
        }

        async fn release(&self, _key: &IdempotencyKey, owner: &OwnerToken) -> Result<(), Error> {
            self.fenced(owner, Record::Free)
        }

        async fn renew(
            &self,
            _key: &IdempotencyKey,
            owner: &OwnerToken,
            _lease: Duration,
        ) -> Result<(), Error> {
            let held = *self.0.record.lock().unwrap() == Record::Held(*owner);
            if held {
                Ok(())
            } else {
                Err(Error::lease_lost())
            }
        }
    }

    const LEASE: Duration = Duration::from_secs(60);

    /// Pending once, then ready: a handler that awaits something.
    async fn yield_once() {
        let mut yielded = false;
        poll_fn(|cx: &mut Context<'_>| {
            if yielded {
                return Poll::Ready(());
            }
            yielded = true;
            cx.waker().wake_by_ref();
            Poll::Pending
        })
        .await;
    }

    /// One request, whose client polls its response `polls` times and then
    /// drops it (`None`: waits for it), through the layer with `bug`.
    fn a_request_and_its_client(polls: Option<usize>, bug: Option<Bug>) {
        loom::model(move || {
            let store = LandingStore::new();
            let client = {
                let store = store.clone();
                thread::Builder::new()
                    .stack_size(STACK)
                    .spawn(move || {
                        let idem = Idempotency::new(store.clone());
                        let layer = idem
                            .layer_with_key("order:{header:idempotency-key}")
                            .unwrap();
                        let calls = store.clone();
                        let handler = service_fn(move |_: Request<Full<Bytes>>| {
                            let calls = calls.clone();
                            async move {
                                calls.0.started.fetch_add(1, Ordering::SeqCst);
                                yield_once().await;
                                calls.0.finished.fetch_add(1, Ordering::SeqCst);
                                Ok::<_, Infallible>(Response::new(Full::new(Bytes::from("made"))))
                            }
                        });
                        let mut service = layer.layer(handler);
                        service.settings.bug = bug;
                        let request = Request::post("/orders")
                            .header("idempotency-key", "42")
                            .body(Full::new(Bytes::from("{}")))
                            .unwrap();
                        let mut response = service.call(request);
                        let Some(polls) = polls else {
                            let response = block_on(response).unwrap();
                            assert_eq!(response.status(), http::StatusCode::OK);
                            return;
                        };
                        let mut cx = Context::from_waker(Waker::noop());
                        for _ in 0..polls {
                            if Pin::new(&mut response).poll(&mut cx).is_ready() {
                                return;
                            }
                        }
                        drop(response);
                        store.0.client_gone.store(true, Ordering::SeqCst);
                    })
                    .expect("a loom thread")
            };
            client.join().unwrap();
            // The attempt handed over, and the landing, hold the store
            // until they are done.
            while Arc::strong_count(&store.0) > 1 {
                thread::yield_now();
            }
            let record = *store.0.record.lock().unwrap();
            let started = store.0.started.load(Ordering::SeqCst);
            let finished = store.0.finished.load(Ordering::SeqCst);
            assert!(!matches!(record, Record::Held(_)), "a key left held");
            assert_eq!(started, finished, "a handler cut off");
            assert_eq!(record == Record::Completed, finished == 1, "{record:?}");
            if store.0.gone_at_landing.load(Ordering::SeqCst) {
                assert_eq!(started, 0, "the handler called for a client gone");
            }
        });
    }

    #[test]
    fn a_dropped_requests_claim_is_finished_or_released_never_held() {
        for polls in [None, Some(0), Some(1), Some(2), Some(3)] {
            a_request_and_its_client(polls, None);
        }
    }

    #[test]
    fn seeded_bug_a_release_skipped_is_caught() {
        let caught = catch_unwind(AssertUnwindSafe(|| {
            a_request_and_its_client(Some(1), Some(Bug::ReleaseSkipped));
        }));
        let panic = caught.expect_err("loom missed a key held for a client gone");
        let message = panic.downcast_ref::<&str>().copied().unwrap_or_default();
        assert_eq!(message, "a key left held");
    }
}
