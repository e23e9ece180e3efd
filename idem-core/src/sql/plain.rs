//! Plain mode on SQL: each transition is one statement on a connection from
//! the pool (taken after the turn to write, on SQLite: `writer.rs`), and a
//! claim lives by its lease.

use std::time::Duration;

use super::{Dialect, SqlStore, key_hash, millis, unavailable};
use crate::store::TransactionalStore;
use crate::{Claim, Error, Fingerprint, IdempotencyKey, IdempotencyStore, Outcome, OwnerToken};

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
            && let Some(row) = DB::read(&mut conn, &self.inner.queries, &hash)
                .await
                .map_err(unavailable)?
            && let Some(answer) = row.answer(fingerprint)?
        {
            return Ok(answer);
        }
        // The claim writes. Where writers take turns, the read's connection
        // goes back to the pool while this one waits for its turn.
        let _turn = if self.inner.writer.one_at_a_time() {
            drop(conn);
            let (turn, writer) = self.write_connection().await?;
            conn = writer;
            Some(turn)
        } else {
            None
        };
        self.claim_on(&mut conn, key, &hash, fingerprint, lease, owner, false)
            .await
            .map_err(unavailable)
    }

    async fn complete(
        &self,
        key: &IdempotencyKey,
        owner: &OwnerToken,
        outcome: &Outcome,
        retention: Duration,
    ) -> Result<(), Error> {
        let (_turn, mut conn) = self.write_connection().await?;
        let done = DB::complete(
            &mut conn,
            &self.inner.queries,
            &key_hash(key),
            owner,
            &outcome.encode(),
            millis(retention),
        )
        .await
        .map_err(unavailable)?;
        Error::fenced(done)
    }

    async fn release(&self, key: &IdempotencyKey, owner: &OwnerToken) -> Result<(), Error> {
        let (_turn, mut conn) = self.write_connection().await?;
        let done = DB::release(&mut conn, &self.inner.queries, &key_hash(key), owner)
            .await
            .map_err(unavailable)?;
        Error::fenced(done)
    }

    async fn renew(
        &self,
        key: &IdempotencyKey,
        owner: &OwnerToken,
        lease: Duration,
    ) -> Result<(), Error> {
        let (_turn, mut conn) = self.write_connection().await?;
        let done = DB::renew(
            &mut conn,
            &self.inner.queries,
            &key_hash(key),
            owner,
            millis(lease),
        )
        .await
        .map_err(unavailable)?;
        Error::fenced(done)
    }

    fn transactional(&self) -> Option<&dyn TransactionalStore> {
        Some(self)
    }
}
