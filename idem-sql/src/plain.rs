//! Plain mode on SQL: each transition is one statement on a connection from
//! the pool (on SQLite, one of the batch of writes committed together:
//! `batch.rs`), and a claim lives by its lease.

use std::time::Duration;

use super::batch::Write;
use super::{Dialect, SqlStore, key_hash, unavailable};
use idem_core::TransactionalStore;
use idem_core::expiry_millis;
use idem_core::{Claim, Error, Fingerprint, IdempotencyKey, IdempotencyStore, Outcome, OwnerToken};

impl<DB: Dialect> IdempotencyStore for SqlStore<DB> {
    async fn claim(
        &self,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        lease: Duration,
        owner: OwnerToken,
    ) -> Result<Claim, Error> {
        let mut conn = self.inner.pool.acquire().await.map_err(unavailable)?;
        let hash = key_hash(key);
        // Read first: a duplicate of a live record is answered from a plain
        // read, without writing or locking anything. The upsert would lock
        // the row even when it changes nothing (PostgreSQL: a row lock and WAL
        // to flush at commit, with every duplicate of the key queued behind
        // it; MySQL/MariaDB: an exclusive record lock; SQLite: the database's
        // write lock). The read sees committed rows only and acquires
        // nothing: absent and expired keys still go to the upsert, which
        // alone decides who acquires. On PostgreSQL the claim statement
        // itself reads first.
        if !DB::CLAIM_READS_FIRST
            && let Some(answer) = self.answer_from_read(&mut conn, &hash, fingerprint).await?
        {
            return Ok(answer);
        }
        // The claim writes: where writers take turns, in the next batch
        // (`batch.rs`), with the read's connection back in the pool.
        if self.inner.writer.one_at_a_time() {
            drop(conn);
            let claim = Write::Claim {
                key: key.clone(),
                key_hash: hash,
                fingerprint: *fingerprint,
                lease,
                owner,
            };
            return Ok(self.write(claim).await?.claim());
        }
        self.claim_on(&mut conn, key, &hash, fingerprint, lease, owner, None)
            .await
            .map_err(unavailable)
    }

    async fn complete(
        &self,
        key: &IdempotencyKey,
        owner: &OwnerToken,
        outcome: &Outcome,
        ttl: Duration,
    ) -> Result<(), Error> {
        let complete = Write::Complete {
            key_hash: key_hash(key),
            owner: *owner,
            outcome: outcome.encode(),
            ttl_ms: expiry_millis(ttl),
        };
        self.write(complete).await?.fenced()
    }

    async fn release(&self, key: &IdempotencyKey, owner: &OwnerToken) -> Result<(), Error> {
        let release = Write::Release {
            key_hash: key_hash(key),
            owner: *owner,
        };
        self.write(release).await?.fenced()
    }

    async fn renew(
        &self,
        key: &IdempotencyKey,
        owner: &OwnerToken,
        lease: Duration,
    ) -> Result<(), Error> {
        let renew = Write::Renew {
            key_hash: key_hash(key),
            owner: *owner,
            lease_ms: expiry_millis(lease),
        };
        self.write(renew).await?.fenced()
    }

    fn transactional(&self) -> Option<&dyn TransactionalStore> {
        Some(self)
    }
}
