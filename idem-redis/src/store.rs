//! Redis: the fast gate.
//!
//! One key per record, holding [`Record::encode`] with the lease or the
//! ttl as its `PX` expiry, so Redis's own clock expires it. A claim is
//! one round trip: `SET key value NX PX lease GET` sets the record if the key
//! is free and otherwise returns what is there. Complete, release and renew
//! are Lua scripts that compare the owner token inside the stored value,
//! loaded once and called with `EVALSHA`; a renewal moves the key's `PX`
//! expiry.
//!
//! Redis keeps records in memory: an eviction, an expiry or a failover loses
//! them. Use it in front of a SQL store ([`TieredStore`](crate::TieredStore)),
//! not alone, where a duplicate is lost money.
//!
//! ```no_run
//! # async fn run() -> redis::RedisResult<()> {
//! use idem_redis::RedisStore;
//!
//! let client = redis::Client::open("redis://127.0.0.1:6379")?;
//! let store = RedisStore::new(client.get_connection_manager().await?);
//! # let _ = store; Ok(()) }
//! ```
//!
//! Keys are hash-tagged (`idem:{...}`), so a Redis Cluster connection
//! (`redis::cluster_async::ClusterConnection`) works as well. Behind Redis
//! Sentinel, [`SentinelConnection`](crate::SentinelConnection) follows a failover to the new primary.

use std::sync::LazyLock;
use std::time::Duration;

use ::redis::Script;
use ::redis::aio::ConnectionLike;

use idem_core::{
    Claim, Error, ErrorKind, Fingerprint, IdempotencyKey, IdempotencyStore, Outcome, OwnerToken,
    Record,
};

static COMPLETE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("complete.lua")));
static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("release.lua")));
static RENEW: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("renew.lua")));

/// Idempotency records in Redis, on your connection: a
/// `redis::aio::ConnectionManager` (reconnects by itself, cheap to clone), a
/// `redis::cluster_async::ClusterConnection`, or a [`SentinelConnection`](crate::SentinelConnection).
#[derive(Clone)]
pub struct RedisStore<C> {
    conn: C,
}

impl<C> std::fmt::Debug for RedisStore<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore").finish_non_exhaustive()
    }
}

impl<C> RedisStore<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// A store on `conn`.
    pub fn new(conn: C) -> Self {
        Self { conn }
    }

    /// The connection, for a health check or a command of your own.
    pub fn connection(&self) -> &C {
        &self.conn
    }

    /// Writes a completed record directly, with its ttl: how a tiered
    /// store re-warms the gate from the source of truth.
    pub async fn put_completed(
        &self,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        outcome: &Outcome,
        ttl: Duration,
    ) -> Result<(), Error> {
        let record = Record::Completed {
            fingerprint: *fingerprint,
            outcome: outcome.clone(),
        };
        self.put(key, &record, ttl).await
    }

    /// Writes an in-flight record for `owner` over whatever the key holds,
    /// in one command: how a tiered store takes over a key whose claim in
    /// the source of truth it has just won. Deleting the key and claiming
    /// it again would leave a moment in which a third request's `SET NX`
    /// finds it free.
    pub async fn put_in_flight(
        &self,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        owner: OwnerToken,
        lease: Duration,
    ) -> Result<(), Error> {
        let record = Record::InFlight {
            owner,
            fingerprint: *fingerprint,
        };
        self.put(key, &record, lease).await
    }

    /// Sets `key` to `record`, whatever it held, expiring after `px`.
    async fn put(&self, key: &IdempotencyKey, record: &Record, px: Duration) -> Result<(), Error> {
        ::redis::cmd("SET")
            .arg(key.as_str())
            .arg(&record.encode()[..])
            .arg("PX")
            .arg(expiry_millis(px))
            .exec_async(&mut self.conn.clone())
            .await
            .map_err(unavailable)
    }

    /// Forgets a key whatever it holds, as an eviction or a failover would.
    pub async fn forget(&self, key: &IdempotencyKey) -> Result<(), Error> {
        ::redis::cmd("DEL")
            .arg(key.as_str())
            .exec_async(&mut self.conn.clone())
            .await
            .map_err(unavailable)
    }
}

use idem_core::expiry_millis;

fn unavailable(err: ::redis::RedisError) -> Error {
    Error::new(ErrorKind::Unavailable, err)
}

impl<C> IdempotencyStore for RedisStore<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    async fn claim(
        &self,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        lease: Duration,
        owner: OwnerToken,
    ) -> Result<Claim, Error> {
        let mut conn = self.conn.clone();
        let record = Record::InFlight {
            owner,
            fingerprint: *fingerprint,
        };
        let previous: Option<Vec<u8>> = ::redis::cmd("SET")
            .arg(key.as_str())
            .arg(&record.encode()[..])
            .arg("NX")
            .arg("PX")
            .arg(expiry_millis(lease))
            .arg("GET")
            .query_async(&mut conn)
            .await
            .map_err(unavailable)?;
        let Some(previous) = previous else {
            return Ok(Claim::Acquired(owner));
        };
        let existing = Record::decode(&previous)?;
        // Our own claim: this `SET` was re-sent by the connection (a cluster
        // connection does, on a dropped connection or a timeout) after the
        // first one ran and its reply was lost. Owner tokens are unique per
        // attempt, so the key is ours.
        if let Record::InFlight {
            owner: held_by,
            fingerprint: fp,
        } = &existing
            && *held_by == owner
            && fp == fingerprint
        {
            return Ok(Claim::Acquired(owner));
        }
        let lease_left = match &existing {
            // Only an in-flight answer needs the time left: a second trip.
            Record::InFlight {
                fingerprint: fp, ..
            } if fp == fingerprint => {
                let ttl: i64 = ::redis::cmd("PTTL")
                    .arg(key.as_str())
                    .query_async(&mut conn)
                    .await
                    .map_err(unavailable)?;
                Duration::from_millis(ttl.max(1).unsigned_abs())
            }
            _ => lease,
        };
        Ok(existing.claim_answer(fingerprint, lease_left))
    }

    async fn complete(
        &self,
        key: &IdempotencyKey,
        owner: &OwnerToken,
        outcome: &Outcome,
        ttl: Duration,
    ) -> Result<(), Error> {
        let done: i64 = COMPLETE
            .key(key.as_str())
            .arg(&owner.as_bytes()[..])
            .arg(&outcome.encode()[..])
            .arg(expiry_millis(ttl))
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(unavailable)?;
        Error::fenced(done == 1)
    }

    async fn release(&self, key: &IdempotencyKey, owner: &OwnerToken) -> Result<(), Error> {
        let done: i64 = RELEASE
            .key(key.as_str())
            .arg(&owner.as_bytes()[..])
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(unavailable)?;
        Error::fenced(done == 1)
    }

    async fn renew(
        &self,
        key: &IdempotencyKey,
        owner: &OwnerToken,
        lease: Duration,
    ) -> Result<(), Error> {
        let done: i64 = RENEW
            .key(key.as_str())
            .arg(&owner.as_bytes()[..])
            .arg(expiry_millis(lease))
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(unavailable)?;
        Error::fenced(done == 1)
    }
}
