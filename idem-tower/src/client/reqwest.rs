//! The same policy as a reqwest-middleware [`Middleware`] (feature
//! `reqwest`), for callers on reqwest rather than a tower client.

use std::sync::Arc;

use http::Extensions;
use reqwest::{Request, Response};
use reqwest_middleware::{Middleware, Next};
use tracing::Instrument;

use super::attempt::{Schedule, within};
use super::key::{self, KEY_HEADER, KeyForm, KeyKind, KeyOrigin, KeyStyle, OperationKey};
use super::policy::{Cause, RetryPolicy, Verdict};
use super::report::{ClientError, ClientErrorKind, RetryReport};

/// Sends each non-safe request with an `Idempotency-Key` (the caller's, or
/// one made for it) and retries it, same key, same body, on transient
/// failures ([`RetryPolicy`]). Every response carries a [`RetryReport`]
/// extension: `response.extensions().get::<RetryReport>()`.
///
/// A request with a streaming body cannot be re-sent: it gets its key and
/// one attempt.
///
/// ```
/// use idem_tower::client::{IdempotencyMiddleware, RetryPolicy};
///
/// let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
///     .with(IdempotencyMiddleware::new(RetryPolicy::default()))
///     .build();
/// # let _ = client;
/// ```
#[derive(Debug, Clone, Default)]
pub struct IdempotencyMiddleware {
    policy: Arc<RetryPolicy>,
    keys: KeyStyle,
}

impl IdempotencyMiddleware {
    /// A middleware retrying under `policy`, generating UUID v4 keys.
    pub fn new(policy: RetryPolicy) -> Self {
        Self {
            policy: Arc::new(policy),
            keys: KeyStyle::default(),
        }
    }

    /// The kind of key generated for a request that carries none.
    pub fn key_kind(mut self, kind: KeyKind) -> Self {
        self.keys.kind = kind;
        self
    }

    /// How a generated key is written: bare (the default, what most
    /// servers read) or quoted as the IETF draft writes it ([`KeyForm`]).
    pub fn key_form(mut self, form: KeyForm) -> Self {
        self.keys.form = form;
        self
    }
}

/// Why a failed attempt may be retried; `None` if it may not.
fn transient(error: &reqwest_middleware::Error) -> Option<Cause> {
    match error {
        reqwest_middleware::Error::Reqwest(e) if e.is_timeout() => Some(Cause::Timeout),
        reqwest_middleware::Error::Reqwest(e) if e.is_connect() || e.is_request() => {
            Some(Cause::Connection)
        }
        _ => None,
    }
}

#[async_trait::async_trait]
impl Middleware for IdempotencyMiddleware {
    async fn handle(
        &self,
        mut request: Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<Response> {
        // Once per logical request, never per attempt.
        // The key the caller gave as an extension
        // (`RequestBuilder::with_extension(operation.key_for(..))`), if any.
        let given = extensions.get::<OperationKey>().cloned();
        let origin = key::ensure(
            &request.method().clone(),
            request.headers_mut(),
            given.as_ref(),
            self.keys,
        );
        let key = request
            .headers()
            .get(KEY_HEADER)
            .cloned()
            .filter(|_| origin != KeyOrigin::NotSent);
        let size = request
            .body()
            .and_then(reqwest::Body::as_bytes)
            .map_or(0, <[u8]>::len);
        if size > self.policy.max_body {
            return Err(reqwest_middleware::Error::middleware(
                ClientError::new(ClientErrorKind::BodyTooLarge, 0, None).with_report(key, origin),
            ));
        }

        let mut schedule = Schedule::start(Arc::clone(&self.policy));
        let mut original = Some(request);
        loop {
            // A copy while the body can be copied; else the request itself,
            // for its one and last attempt.
            let this = match original.as_ref().and_then(Request::try_clone) {
                Some(copy) => copy,
                None => original.take().expect("a request is left"),
            };
            let span = schedule.begin(this.method(), this.url().path());
            let result = within(schedule.timeout(), next.clone().run(this, &mut *extensions))
                .instrument(span.clone())
                .await;
            let attempts = schedule.attempts();

            let (cause, retry_after, outcome) = match result {
                Ok(Ok(mut response)) => {
                    span.record("status", response.status().as_u16());
                    let verdict = schedule
                        .policy()
                        .classify(response.status(), response.headers());
                    let delivery =
                        RetryReport::new(attempts, response.headers(), key.clone(), origin);
                    response.extensions_mut().insert(delivery);
                    match verdict {
                        Verdict::Final => return Ok(response),
                        Verdict::Retry { cause, retry_after } => (cause, retry_after, Ok(response)),
                    }
                }
                Ok(Err(error)) => match transient(&error) {
                    Some(cause) => (cause, None, Err(error)),
                    None => return Err(error),
                },
                Err(elapsed) => (
                    Cause::Timeout,
                    None,
                    Err(reqwest_middleware::Error::middleware(
                        ClientError::new(
                            ClientErrorKind::Exhausted(Cause::Timeout),
                            attempts,
                            Some(Box::new(elapsed)),
                        )
                        .with_report(key.clone(), origin),
                    )),
                ),
            };

            if original.is_none() {
                return outcome;
            }
            let Some(wait) = schedule.retry(&span, cause, retry_after) else {
                return outcome;
            };
            drop(outcome);
            tokio::time::sleep(wait).await;
        }
    }
}
