//! What goes through the outbox: an event as enqueued, and as the relay
//! hands it to a publisher.

use bytes::Bytes;

use crate::db::EventRow;
use crate::sql::{check_short_text, config};
use idem_core::Error;

/// An event to enqueue: its id (the broker's deduplication id, and the
/// consumer's message id), its topic (the subject it is published to), its
/// key (events of one key are published in order), its payload and headers.
///
/// ```
/// use idem_guards::Event;
///
/// let event = Event::new("order.created", "order-42", r#"{"order_id":42}"#)?
///     .header("content-type", "application/json")?;
/// assert_eq!(event.topic(), "order.created");
/// assert_eq!(event.id().len(), 36); // a UUID v7 unless set with `with_id`
/// # Ok::<(), idem_core::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    id: String,
    topic: String,
    key: String,
    payload: Bytes,
    headers: Vec<(String, String)>,
}

impl Event {
    /// An event on `topic` under `key` (each 1 to 255 bytes, the key
    /// without a line break, else an
    /// [`ErrorKind::Config`](idem_core::ErrorKind::Config) error), with a new
    /// UUID v7 as its id.
    pub fn new(
        topic: impl Into<String>,
        key: impl Into<String>,
        payload: impl Into<Bytes>,
    ) -> Result<Self, Error> {
        let (topic, key) = (topic.into(), key.into());
        check_short_text("an event topic", &topic)?;
        check_short_text("an event key", &key)?;
        check_header_value("an event key", &key)?;
        Ok(Self {
            id: uuid::Uuid::now_v7().to_string(),
            topic,
            key,
            payload: payload.into(),
            headers: Vec::new(),
        })
    }

    /// The same event under the id `id` (1 to 255 bytes, without a line
    /// break, as it travels as a header value): one derived from
    /// the business event (`order-created:42`) makes enqueueing it again a
    /// no-op ([`Enqueued::AlreadyQueued`]) for as long as the first is in
    /// the outbox: until it is sent and then purged
    /// ([`Relay::keep_sent`](super::Relay::keep_sent), an hour by default).
    pub fn with_id(mut self, id: impl Into<String>) -> Result<Self, Error> {
        let id = id.into();
        check_short_text("an event id", &id)?;
        check_header_value("an event id", &id)?;
        self.id = id;
        Ok(self)
    }

    /// The same event with one more header: a name of visible ASCII
    /// without `:` (at least one character), a value without a line break,
    /// as brokers' headers take them; else an
    /// [`ErrorKind::Config`](idem_core::ErrorKind::Config) error, before
    /// anything is enqueued.
    pub fn header(
        mut self,
        name: impl Into<String>,
        value: impl Into<String>,
    ) -> Result<Self, Error> {
        let (name, value) = (name.into(), value.into());
        if name.is_empty() || name.contains(|c: char| !c.is_ascii_graphic() || c == ':') {
            return Err(config(format!(
                "an event header name must be visible ASCII without ':', not {name:?}"
            )));
        }
        check_header_value("an event header value", &value)?;
        self.headers.push((name, value));
        Ok(self)
    }

    /// The id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The topic.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// The key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The payload.
    pub fn payload(&self) -> &[u8] {
        &self.payload
    }

    /// The headers, in the order they were added.
    pub fn headers(&self) -> &[(String, String)] {
        &self.headers
    }

    pub(super) fn headers_json(&self) -> String {
        serde_json::to_string(&self.headers).unwrap_or_else(|_| "[]".to_owned())
    }
}

/// `value` can travel as a header value: no line break (`\r` or `\n`),
/// which would end the header; else an
/// [`ErrorKind::Config`](idem_core::ErrorKind::Config) error naming `what`.
fn check_header_value(what: &str, value: &str) -> Result<(), Error> {
    if value.contains(['\r', '\n']) {
        return Err(config(format!(
            "{what} must not hold a line break: {value:?}"
        )));
    }
    Ok(())
}

/// What [`Outbox::enqueue`](super::Outbox::enqueue) did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum Enqueued {
    /// The event is in the transaction.
    New,
    /// An event with this id was enqueued before: nothing was added.
    AlreadyQueued,
}

/// An event the relay claimed, as it hands it to a
/// [`Publisher`](super::Publisher).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingEvent {
    seq: i64,
    event: Event,
    attempts: u32,
}

impl PendingEvent {
    pub(super) fn from_row(row: EventRow) -> Result<Self, Error> {
        let headers = serde_json::from_str(&row.headers).map_err(|err| {
            Error::new(
                idem_core::ErrorKind::Corrupt,
                format!("outbox event {}: unreadable headers: {err}", row.id),
            )
        })?;
        Ok(Self {
            seq: row.seq,
            event: Event {
                id: row.id,
                topic: row.topic,
                key: row.key,
                payload: Bytes::from(row.payload),
                headers,
            },
            attempts: u32::try_from(row.attempts).unwrap_or(u32::MAX),
        })
    }

    /// Its sequence number in the outbox: the order it was enqueued in.
    pub fn seq(&self) -> i64 {
        self.seq
    }

    /// The event.
    pub fn event(&self) -> &Event {
        &self.event
    }

    /// The payload, shared (no copy).
    pub fn payload(&self) -> Bytes {
        self.event.payload.clone()
    }

    /// How many publishes of it failed before.
    pub fn attempts(&self) -> u32 {
        self.attempts
    }
}

#[cfg(test)]
mod tests {
    use idem_core::ErrorKind;

    use super::Event;

    fn event() -> Event {
        Event::new("order.created", "order-42", "{}").expect("a valid event")
    }

    /// What a broker's headers cannot carry is refused when the event is
    /// made, before it is enqueued: a relay publishing it later would fail
    /// (async-nats panics on it) on every try.
    #[test]
    fn what_a_header_cannot_carry_is_refused_when_the_event_is_made() {
        let refused = [
            event().header("bad name", "v").err(),
            event().header("", "v").err(),
            event().header("a:b", "v").err(),
            event().header("caf\u{e9}", "v").err(),
            event().header("ok", "a\r\nb").err(),
            event().with_id("a\nb").err(),
            Event::new("t", "k\r1", "{}").err(),
        ];
        for (n, err) in refused.into_iter().enumerate() {
            let err = err.unwrap_or_else(|| panic!("case {n} was accepted"));
            assert_eq!(err.kind(), ErrorKind::Config, "case {n}: {err}");
        }
        let kept = event()
            .header("content-type", "application/json; charset=utf-8")
            .expect("a valid header");
        assert_eq!(
            kept.headers(),
            [(
                "content-type".to_owned(),
                "application/json; charset=utf-8".to_owned()
            )]
        );
    }
}
