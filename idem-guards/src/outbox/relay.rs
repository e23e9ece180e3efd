//! The relay: claims committed events, publishes each until the broker
//! acknowledges it, marks it sent; retries with backoff; purges what was
//! sent long enough ago.

use std::collections::HashSet;
use std::fmt;
use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::Outbox;
use super::event::PendingEvent;
use crate::GuardDb;
use idem_core::BoxFuture;
use idem_core::{BoxError, Error};

/// Where a [`Relay`] publishes: a broker client that returns once the
/// broker has *stored* the event (its publish acknowledgement), never
/// sooner; an `Err` makes the relay retry the event later.
///
/// ```
/// use idem_core::BoxError;
/// use idem_guards::{PendingEvent, Published, Publisher};
/// use idem_core::BoxFuture;
///
/// /// Prints instead of publishing.
/// struct Stdout;
///
/// impl Publisher for Stdout {
///     fn publish<'a>(&'a self, pending: &'a PendingEvent) -> BoxFuture<'a, Result<Published, BoxError>> {
///         Box::pin(async move {
///             let event = pending.event();
///             println!("{} {} {}", event.topic(), event.id(), String::from_utf8_lossy(event.payload()));
///             Ok(Published::Stored)
///         })
///     }
/// }
/// ```
///
/// Publish with [`Event::id`](super::Event::id) as the broker's
/// deduplication id where it has one, so that a re-publish (a relay that
/// died between the acknowledgement and marking the event sent) is dropped
/// by the broker; the consumer's [`Inbox`](crate::Inbox) catches
/// any that get through. [`JetStreamPublisher`](super::JetStreamPublisher)
/// (feature `nats`) is one.
pub trait Publisher: Send + Sync + 'static {
    /// Publishes `event` and waits for the broker's acknowledgement.
    fn publish<'a>(&'a self, event: &'a PendingEvent)
    -> BoxFuture<'a, Result<Published, BoxError>>;
}

/// What the broker said to a publish.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Published {
    /// It stored the event.
    Stored,
    /// It had the event already (its deduplication caught a re-publish by
    /// a relay that died, or lost its lease, between the acknowledgement and
    /// marking the event sent): nothing new was stored.
    AlreadyStored,
}

/// What one [`Relay::run_once`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Pass {
    /// Events claimed. Zero does not mean the outbox is empty: the events
    /// may be leased, waiting for a retry, held back behind an earlier
    /// event of their key, or another relay was claiming at that moment
    /// ([`Outbox::unsent`](super::Outbox::unsent) says what is left).
    pub claimed: usize,
    /// Events published and marked sent.
    pub published: usize,
    /// Of those, events the broker had already ([`Published::AlreadyStored`]).
    pub already_stored: usize,
    /// Events whose publish failed, put back for a retry after a backoff.
    pub retried: usize,
    /// Events published whose lease another relay had taken over meanwhile
    /// (it publishes them again, under the same id).
    pub lease_lost: usize,
}

/// Publishes the events of an [`Outbox`] through a [`Publisher`], at least
/// once each, the events of one key in order.
///
/// Run as many relays as you like, in one process or several: they share
/// the work, and never publish one event at the same time. A relay that
/// dies mid-batch leaves its events leased until [`Relay::lease`] runs
/// out; then another relay publishes them (again, for those the broker had
/// stored: same id, dropped by the broker's deduplication).
///
/// ```no_run
/// # #[cfg(all(feature = "postgres", feature = "nats"))]
/// # async fn run(pool: idem_sql::sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
/// use idem_guards::{JetStreamPublisher, Outbox, Relay};
///
/// let outbox = Outbox::new(pool)?;
/// let nats = async_nats::connect("nats://127.0.0.1:4222").await?;
/// let relay = Relay::new(outbox, JetStreamPublisher::new(nats));
/// relay.run(std::future::pending()).await; // until the process stops
/// # Ok(()) }
/// ```
pub struct Relay<DB: GuardDb, P> {
    outbox: Outbox<DB>,
    publisher: Arc<P>,
    name: String,
    batch: usize,
    lease: Duration,
    idle: Duration,
    publish_timeout: Duration,
    backoff: (Duration, Duration),
    keep_sent: Duration,
    purge_batch: usize,
}

impl<DB: GuardDb, P> fmt::Debug for Relay<DB, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Relay")
            .field("outbox", &self.outbox)
            .field("name", &self.name)
            .field("batch", &self.batch)
            .field("lease", &self.lease)
            .finish_non_exhaustive()
    }
}

impl<DB: GuardDb, P: Publisher> Relay<DB, P> {
    /// Events claimed at once unless told otherwise.
    pub const DEFAULT_BATCH: usize = 100;
    /// How long a claim is held unless told otherwise.
    pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
    /// How long an idle relay waits before looking again.
    pub const DEFAULT_IDLE: Duration = Duration::from_millis(200);
    /// How long one publish may wait for its acknowledgement.
    pub const DEFAULT_PUBLISH_TIMEOUT: Duration = Duration::from_secs(10);
    /// The first retry's delay and the longest.
    pub const DEFAULT_BACKOFF: (Duration, Duration) =
        (Duration::from_millis(100), Duration::from_secs(30));
    /// How long sent events stay before they are purged.
    pub const DEFAULT_KEEP_SENT: Duration = Duration::from_secs(3600);

    /// A relay of `outbox` through `publisher`, named `relay-` and a random
    /// suffix.
    pub fn new(outbox: Outbox<DB>, publisher: P) -> Self {
        Self {
            outbox,
            publisher: Arc::new(publisher),
            name: format!("relay-{:08x}", rand::random::<u32>()),
            batch: Self::DEFAULT_BATCH,
            lease: Self::DEFAULT_LEASE,
            idle: Self::DEFAULT_IDLE,
            publish_timeout: Self::DEFAULT_PUBLISH_TIMEOUT,
            backoff: Self::DEFAULT_BACKOFF,
            keep_sent: Self::DEFAULT_KEEP_SENT,
            purge_batch: 1000,
        }
    }

    /// Names the relay in its lease tokens and logs (at most 200 bytes).
    #[must_use]
    pub fn name(mut self, name: &str) -> Self {
        let mut end = name.len().min(200);
        while !name.is_char_boundary(end) {
            end -= 1;
        }
        self.name = name[..end].to_owned();
        self
    }

    /// How many events one claim takes.
    #[must_use]
    pub fn batch(mut self, events: usize) -> Self {
        self.batch = events.max(1);
        self
    }

    /// How long a claim is held: a relay that dies mid-batch delays its
    /// events by up to this much. It stops publishing a batch at four
    /// fifths of it, so another relay's takeover does not overlap. At
    /// least 100 ms; a lease meant as forever (`Duration::MAX`) is a
    /// century ([`LONGEST_EXPIRY`](idem_core::LONGEST_EXPIRY)).
    #[must_use]
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease.clamp(Duration::from_millis(100), idem_core::LONGEST_EXPIRY);
        self
    }

    /// How long an idle relay waits before it looks for events again.
    #[must_use]
    pub fn idle(mut self, idle: Duration) -> Self {
        self.idle = idle;
        self
    }

    /// How long one publish may wait for the broker's acknowledgement
    /// before it counts as failed.
    #[must_use]
    pub fn publish_timeout(mut self, timeout: Duration) -> Self {
        self.publish_timeout = timeout;
        self
    }

    /// A failed event's first retry waits about `first`; each failure
    /// doubles it, up to `max` (with jitter: between half and all of it).
    #[must_use]
    pub fn backoff(mut self, first: Duration, max: Duration) -> Self {
        self.backoff = (first, max.max(first));
        self
    }

    /// Sent events are purged once they are this old, `batch` rows per
    /// purge, so no purge holds long locks.
    #[must_use]
    pub fn keep_sent(mut self, age: Duration, batch: usize) -> Self {
        self.keep_sent = age;
        self.purge_batch = batch.max(1);
        self
    }

    /// The outbox.
    pub fn outbox(&self) -> &Outbox<DB> {
        &self.outbox
    }

    /// One batch: claims it, publishes its events in order, marks each
    /// sent once the broker acknowledged it. A failed publish puts the
    /// event back with a backoff and holds back the later events of its key
    /// in this batch; events left unpublished are let go at the end.
    pub async fn run_once(&self) -> Result<Pass, Error> {
        // The lease runs from the claim's start (PostgreSQL's now() is its
        // transaction's), not its end: a claim that waited on the outbox's
        // lock would otherwise publish past its lease, into a takeover.
        let stop_at = Instant::now() + self.lease * 4 / 5;
        let claimed = self
            .outbox
            .claim(&self.name, self.batch, self.lease)
            .await?;
        let mut pass = Pass {
            claimed: claimed.events.len(),
            ..Pass::default()
        };
        if claimed.events.is_empty() {
            return Ok(pass);
        }
        let mut held_back = HashSet::new();
        for pending in &claimed.events {
            let event = pending.event();
            if held_back.contains(event.key()) {
                continue;
            }
            if Instant::now() >= stop_at {
                tracing::warn!(relay = %self.name, "lease nearly over; leaving the rest of the batch");
                break;
            }
            // Never past the lease: a publish still waiting then would
            // overlap the relay that takes the batch over.
            let timeout = self
                .publish_timeout
                .min(stop_at.saturating_duration_since(Instant::now()));
            let published = tokio::time::timeout(timeout, self.publisher.publish(pending)).await;
            let outcome = match published {
                Ok(Ok(published)) => Ok(published),
                Ok(Err(err)) => Err(err.to_string()),
                Err(_) => Err(format!("no acknowledgement in {timeout:?}")),
            };
            let topic = event.topic().to_owned();
            match outcome {
                Ok(published) => {
                    if published == Published::AlreadyStored {
                        pass.already_stored += 1;
                        metrics::counter!("idem_outbox_already_stored_total", "topic" => topic.clone())
                            .increment(1);
                    }
                    if self.outbox.mark_sent(&claimed.token, pending.seq()).await? {
                        pass.published += 1;
                        metrics::counter!("idem_outbox_published_total", "topic" => topic)
                            .increment(1);
                    } else {
                        pass.lease_lost += 1;
                        held_back.insert(event.key());
                        metrics::counter!("idem_outbox_lease_lost_total", "topic" => topic)
                            .increment(1);
                        tracing::warn!(relay = %self.name, event = event.id(), "published after the lease was taken over");
                    }
                }
                Err(error) => {
                    let delay = self.delay(pending.attempts());
                    tracing::warn!(
                        relay = %self.name,
                        event = event.id(),
                        attempts = pending.attempts() + 1,
                        %error,
                        retry_in_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
                        "publish failed; retrying later"
                    );
                    self.outbox
                        .retry_later(&claimed.token, pending.seq(), delay)
                        .await?;
                    pass.retried += 1;
                    held_back.insert(event.key());
                    metrics::counter!("idem_outbox_retried_total", "topic" => topic).increment(1);
                }
            }
        }
        if pass.published + pass.retried + pass.lease_lost < pass.claimed {
            self.outbox.release(&claimed.token).await?;
        }
        Ok(pass)
    }

    /// Runs passes until `shutdown` completes: right away while there is
    /// work, every [`Relay::idle`] when there is none, backing off while the
    /// database fails. Sets the gauge `idem_outbox_lag_seconds` (the age of
    /// the oldest unsent event) after each idle pass and at least every
    /// second while busy, and purges sent events while idle. A pass under way when `shutdown` completes is finished
    /// first.
    pub async fn run(&self, shutdown: impl Future<Output = ()>) {
        let mut shutdown = pin!(shutdown);
        let mut failures = 0;
        let (mut purged_at, mut lag_at): (Option<Instant>, Option<Instant>) = (None, None);
        loop {
            let wait = match self.run_once().await {
                Ok(pass) => {
                    failures = 0;
                    let idle = pass.claimed == 0;
                    if idle || lag_at.is_none_or(|at| at.elapsed() >= Duration::from_secs(1)) {
                        self.record_lag().await;
                        lag_at = Some(Instant::now());
                    }
                    if idle && purged_at.is_none_or(|at| at.elapsed() >= self.idle * 50) {
                        self.purge().await;
                        purged_at = Some(Instant::now());
                    }
                    if idle { self.idle } else { Duration::ZERO }
                }
                Err(err) => {
                    failures += 1;
                    let wait = self.delay(failures);
                    tracing::warn!(relay = %self.name, error = %err, "relay pass failed; trying again");
                    wait
                }
            };
            if tokio::time::timeout(wait, &mut shutdown).await.is_ok() {
                return;
            }
        }
    }

    async fn record_lag(&self) {
        match self.outbox.lag().await {
            Ok(lag) => metrics::gauge!("idem_outbox_lag_seconds")
                .set(lag.unwrap_or_default().as_secs_f64()),
            Err(err) => tracing::debug!(error = %err, "outbox lag not read"),
        }
    }

    async fn purge(&self) {
        match self
            .outbox
            .purge_sent(self.keep_sent, self.purge_batch)
            .await
        {
            Ok(0) => {}
            Ok(rows) => {
                metrics::counter!("idem_outbox_purged_total").increment(rows);
                tracing::debug!(relay = %self.name, rows, "purged sent events");
            }
            Err(err) => {
                tracing::warn!(relay = %self.name, error = %err, "purging sent events failed")
            }
        }
    }

    /// The wait before retry number `attempts + 1`: doubling from the first
    /// backoff, capped, between half and all of it.
    fn delay(&self, attempts: u32) -> Duration {
        let (first, max) = self.backoff;
        let full = first
            .saturating_mul(2_u32.saturating_pow(attempts.min(20)))
            .min(max);
        full / 2 + full.mul_f64(rand::random::<f64>() / 2.0)
    }
}
