//! Publishing outbox events to NATS JetStream.

use async_nats::HeaderMap;
use async_nats::header::{HeaderName, HeaderValue, NATS_MESSAGE_ID};
use async_nats::jetstream;

use super::event::PendingEvent;
use super::relay::{Published, Publisher};
use idem_core::BoxError;
use idem_core::BoxFuture;

/// The header that carries an event's key on the published message.
pub const EVENT_KEY_HEADER: &str = "Idem-Event-Key";

/// A [`Publisher`] to NATS JetStream: each event is published to the subject
/// named by its topic, with its id as `Nats-Msg-Id` (so JetStream drops a
/// re-publish inside the stream's duplicate window), its key as
/// `Idem-Event-Key` and its own headers, and counts as published once
/// JetStream acknowledges that a stream stored it.
///
/// A subject no stream captures has nobody to store it: its publish fails
/// and the event is retried, so create the stream before the relay runs.
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use idem_guards::JetStreamPublisher;
///
/// let nats = async_nats::connect("nats://127.0.0.1:4222").await?;
/// let publisher = JetStreamPublisher::new(nats);
/// # let _ = publisher; Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct JetStreamPublisher {
    js: jetstream::Context,
}

impl JetStreamPublisher {
    /// Publishes through a JetStream context on `client`.
    pub fn new(client: async_nats::Client) -> Self {
        Self::with_context(jetstream::new(client))
    }

    /// Publishes through `js` (a domain or prefix of your choosing).
    pub fn with_context(js: jetstream::Context) -> Self {
        Self { js }
    }
}

impl Publisher for JetStreamPublisher {
    fn publish<'a>(
        &'a self,
        pending: &'a PendingEvent,
    ) -> BoxFuture<'a, Result<Published, BoxError>> {
        Box::pin(async move {
            let event = pending.event();
            // Parsed, not inserted as strings: async-nats panics on a name or
            // value it cannot send, and a row written before `Event` checked
            // its headers must fail its publish, not the relay.
            let mut headers = HeaderMap::new();
            for (name, value) in event.headers() {
                headers.append(name.parse::<HeaderName>()?, value.parse::<HeaderValue>()?);
            }
            headers.insert(NATS_MESSAGE_ID, event.id().parse::<HeaderValue>()?);
            headers.insert(EVENT_KEY_HEADER, event.key().parse::<HeaderValue>()?);
            let ack = self
                .js
                .publish_with_headers(event.topic().to_owned(), headers, pending.payload())
                .await?
                .await?;
            if ack.duplicate {
                tracing::debug!(event = event.id(), "JetStream had this event already");
                return Ok(Published::AlreadyStored);
            }
            Ok(Published::Stored)
        })
    }
}
