//! An idempotent consumer on NATS JetStream, for one of two feeds
//! ([`Feed`]): each transfer message credits an account exactly once, or
//! each `order.created` event of the orders app (published by the `relay`
//! binary from its outbox) books a user's loyalty points exactly once,
//! however often the broker delivers it and however often the producer
//! re-publishes it.
//!
//! At-least-once delivery plus an idem [`Inbox`] is effectively-once: the
//! inbox row (unique on the message id and, separately, on the business id:
//! the transfer id, or the order) commits in the same transaction as the
//! ledger entry and the balance update. A duplicate is acknowledged and
//! skipped; a handler error rolls everything back and is negatively
//! acknowledged, so JetStream delivers the message again; a crash before
//! the commit leaves nothing, a crash after it leaves the inbox row, so the
//! redelivery is skipped.
//!
//! Why JetStream rather than RabbitMQ: a *durable pull consumer* keeps the
//! delivery state (what was acknowledged) on the server, and with explicit
//! acknowledgement and `ack_wait` every message a killed process had
//! received but not acknowledged is redelivered to whichever process pulls
//! next, with no client-side bookkeeping; the consumer pulls at its own pace
//! (no prefetch to tune), and `async-nats` is pure Rust on tokio. RabbitMQ
//! (via `lapin`) would work the same way with manual acks; nothing here
//! depends on JetStream's own publish dedup (`Nats-Msg-Id`), which only
//! covers a time window and never a re-publication under a new id.
//!
//! The order feed takes the message id from `Nats-Msg-Id` (the relay sets
//! it to the outbox event's id) and the business id from the order, and
//! books one `consumer_rewards` row and a points update per order. Run
//! with a concurrency of 1, it books one user's orders in the order the
//! relay published them, which is the order they committed in; only a
//! redelivery (a failed handler, or a message lost on its way while the
//! connection dropped) comes after messages published later.
//!
//! Run it: `cargo run -p idem-app --bin consumer -- --help`.

mod ledger;

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, AckKind, consumer::pull, stream};
use futures_util::StreamExt;
use idem_tower::guards::{Inbox, ProcessError, Processed};
use idem_tower::sql::sqlx::Pool;
use serde::{Deserialize, Serialize};

use crate::orders::OrderCreated;

pub use ledger::{Ledger, LedgerSql, Reward, Summary, points};

/// Anything that went wrong.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The header carrying the producer's message id. Not JetStream's
/// `Nats-Msg-Id`: that would make the broker drop duplicates inside its
/// window, and the point here is that the consumer needs no such help.
pub const MESSAGE_ID_HEADER: &str = "Idem-Message-Id";

/// A transfer: credit `amount_cents` to `account`, once per `transfer_id`
/// (the business id).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Transfer {
    /// The business id: one credit per transfer, whatever the message id.
    pub transfer_id: String,
    /// The account credited.
    pub account: String,
    /// How much.
    pub amount_cents: i64,
}

/// What the consumer consumes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Feed {
    /// [`Transfer`] messages, their id in [`MESSAGE_ID_HEADER`]: one
    /// account credit per transfer id.
    #[default]
    Transfers,
    /// The orders app's [`OrderCreated`] events, their id in
    /// `Nats-Msg-Id`: one rewards entry per order.
    Orders,
}

/// What one message asks for: its business id and its effect.
enum Effect {
    Credit(Transfer),
    Reward(OrderCreated),
}

impl Effect {
    /// `payload` read as `feed` says.
    fn read(feed: Feed, payload: &[u8]) -> Result<Self, serde_json::Error> {
        Ok(match feed {
            Feed::Transfers => Self::Credit(serde_json::from_slice(payload)?),
            Feed::Orders => Self::Reward(serde_json::from_slice(payload)?),
        })
    }

    /// The business id the inbox holds unique: the same effect re-published
    /// under another message id is skipped.
    fn business_id(&self) -> String {
        match self {
            Self::Credit(transfer) => transfer.transfer_id.clone(),
            Self::Reward(order) => format!("order:{}:{}", order.tenant, order.order_id),
        }
    }

    async fn book<DB: LedgerSql>(&self, conn: &mut DB::Connection) -> Result<(), BoxError> {
        match self {
            Self::Credit(transfer) => DB::credit(conn, transfer).await?,
            Self::Reward(order) => DB::reward(conn, order).await?,
        }
        Ok(())
    }
}

/// How the consumer runs.
#[derive(Debug, Clone)]
pub struct Settings {
    /// What it consumes.
    pub feed: Feed,
    /// `nats://HOST:PORT`.
    pub nats: String,
    /// The stream; created (file storage) if missing.
    pub stream: String,
    /// The subject the stream captures and the consumer filters.
    pub subject: String,
    /// The durable consumer's name, and the inbox's consumer name.
    pub durable: String,
    /// How long JetStream waits for an acknowledgement before redelivering.
    pub ack_wait: Duration,
    /// How many messages are handled at once.
    pub concurrency: usize,
    /// Chaos: the percentage of handler runs that fail after their writes
    /// (which roll back; the message is redelivered).
    pub chaos_fail_percent: u8,
    /// Chaos: how long a handler sleeps between its writes and its commit.
    pub chaos_delay: Duration,
}

/// Publishes `transfer` to `subject` with message id `message_id`, and waits
/// for JetStream to store it.
pub async fn publish(
    js: &jetstream::Context,
    subject: &str,
    message_id: &str,
    transfer: &Transfer,
) -> Result<(), BoxError> {
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(MESSAGE_ID_HEADER, message_id);
    let payload = serde_json::to_vec(transfer)?;
    js.publish_with_headers(subject.to_owned(), headers, payload.into())
        .await?
        .await?;
    Ok(())
}

/// The stream, created with file storage if missing.
pub async fn stream(
    js: &jetstream::Context,
    name: &str,
    subject: &str,
) -> Result<stream::Stream, BoxError> {
    Ok(js
        .get_or_create_stream(stream::Config {
            name: name.to_owned(),
            subjects: vec![subject.to_owned()],
            ..Default::default()
        })
        .await?)
}

/// Consumes until the message stream ends or the broker fails: each
/// message handled in an inbox transaction, then acknowledged.
pub async fn run(settings: Settings, ledger: Ledger) -> Result<(), BoxError> {
    let client = async_nats::connect(&settings.nats).await?;
    let js = jetstream::new(client);
    let stream = stream(&js, &settings.stream, &settings.subject).await?;
    let consumer: pull::Stream = stream
        .get_or_create_consumer(
            &settings.durable,
            pull::Config {
                durable_name: Some(settings.durable.clone()),
                ack_policy: jetstream::consumer::AckPolicy::Explicit,
                ack_wait: settings.ack_wait,
                filter_subject: settings.subject.clone(),
                ..Default::default()
            },
        )
        .await?
        .messages()
        .await?;
    match ledger {
        Ledger::Postgres(pool) => consume(pool, settings, consumer).await?,
        Ledger::MySql(pool) => consume(pool, settings, consumer).await?,
        Ledger::Sqlite(pool) => consume(pool, settings, consumer).await?,
    }
    Err("the JetStream message stream ended".into())
}

/// Handles every message of `consumer` through an inbox on `pool`, up to
/// `settings.concurrency` at once, until the message stream ends.
async fn consume<DB: LedgerSql>(
    pool: Pool<DB>,
    settings: Settings,
    consumer: pull::Stream,
) -> Result<(), BoxError> {
    let inbox = Inbox::<DB>::new(pool, &settings.durable)?;
    inbox.migrate().await?;
    eprintln!("consumer ready: {}", settings.durable);
    let settings = Arc::new(settings);
    consumer
        .for_each_concurrent(settings.concurrency.max(1), |message| {
            let (inbox, settings) = (inbox.clone(), settings.clone());
            async move {
                match message {
                    Ok(message) => handle(&inbox, &settings, message).await,
                    Err(err) => tracing::warn!(%err, "pulling a message failed"),
                }
            }
        })
        .await;
    Ok(())
}

/// One delivery: through the inbox, then the acknowledgement that matches.
async fn handle<DB: LedgerSql>(
    inbox: &Inbox<DB>,
    settings: &Settings,
    message: jetstream::Message,
) {
    let sequence = message
        .info()
        .map(|info| info.stream_sequence)
        .unwrap_or_default();
    let id_header = match settings.feed {
        Feed::Transfers => MESSAGE_ID_HEADER,
        Feed::Orders => "Nats-Msg-Id",
    };
    let message_id = message
        .headers
        .as_ref()
        .and_then(|h| h.get(id_header))
        .map(|v| v.as_str().to_owned())
        .unwrap_or_else(|| format!("{}:{sequence}", settings.stream));
    let effect = match Effect::read(settings.feed, &message.payload) {
        Ok(effect) => effect,
        Err(err) => {
            // Poison: redelivering cannot help. Terminate it (a real
            // consumer would dead-letter it).
            tracing::error!(%err, %message_id, feed = ?settings.feed, "unreadable; terminating the message");
            ack(&message, AckKind::Term).await;
            return;
        }
    };
    let business_id = effect.business_id();
    let (fail_percent, delay) = (settings.chaos_fail_percent, settings.chaos_delay);
    let outcome = inbox
        .process(&message_id, &business_id, move |conn| {
            Box::pin(async move {
                effect.book::<DB>(conn).await?;
                if !delay.is_zero() {
                    tokio::time::sleep(delay).await;
                }
                if fail_percent > 0 && rand::random_range(0..100u8) < fail_percent {
                    return Err::<(), BoxError>("chaos: failing after the writes".into());
                }
                Ok(())
            })
        })
        .await;
    match outcome {
        Ok(Processed::Done(())) => ack(&message, AckKind::Ack).await,
        Ok(Processed::Skipped(of)) => {
            tracing::info!(%message_id, %business_id, ?of, "duplicate skipped");
            ack(&message, AckKind::Ack).await;
        }
        Err(ProcessError::Failed(err)) => {
            tracing::warn!(%err, %message_id, "handler failed; rolled back, asking for redelivery");
            ack(&message, AckKind::Nak(Some(Duration::from_millis(100)))).await;
        }
        Err(ProcessError::Inbox(err)) => {
            tracing::warn!(%err, %message_id, "inbox failed; asking for redelivery");
            ack(&message, AckKind::Nak(Some(Duration::from_millis(500)))).await;
        }
    }
}

async fn ack(message: &jetstream::Message, kind: AckKind) {
    // A lost acknowledgement only means a redelivery, which the inbox skips.
    if let Err(err) = message.ack_with(kind).await {
        tracing::warn!(%err, "acknowledgement failed; the message will be redelivered");
    }
}
