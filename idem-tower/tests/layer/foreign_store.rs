//! Transactional mode on a store written outside idem, from idem-core's
//! public API alone: the layer claims in the store's transaction, lends the
//! store's own transaction type to the handler through `TxHandle`, and
//! commits the handler's writes with the outcome, or rolls both back.
//!
//! The store here keeps its records in a `MemoryStore` and its business
//! rows in a `Vec`, and applies a transaction's buffered writes at commit:
//! a stand-in for tokio-postgres, diesel-async or a DynamoDB transaction,
//! whose handler-facing type is its own.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Request, StatusCode};
use idem_core::{
    BoxFuture, Error, Fingerprint, IdempotencyKey, IdempotencyStore, OpenTransaction, Outcome,
    OwnerToken, TransactionalStore, TxClaim, TxHandle,
};
use idem_tower::{Idempotency, MemoryStore};
use tower::{Layer, service_fn};

use crate::fixtures::{ORDER, created, json};
use crate::support::{Calls, post, send};

/// The rows the store's transactions have committed.
type Rows = Arc<Mutex<Vec<String>>>;

/// A third party's store: records in a `MemoryStore`, rows in a `Vec`.
#[derive(Clone, Default)]
struct LedgerStore {
    records: Arc<MemoryStore>,
    rows: Rows,
}

/// What the store lends its handlers: the writes of one open transaction,
/// applied at commit.
#[derive(Clone, Default)]
struct LedgerTx(Arc<Mutex<Vec<String>>>);

impl LedgerTx {
    fn insert(&self, row: String) {
        self.0.lock().unwrap().push(row);
    }
}

impl IdempotencyStore for LedgerStore {
    async fn claim(
        &self,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        lease: Duration,
        owner: OwnerToken,
    ) -> Result<idem_core::Claim, Error> {
        self.records.claim(key, fingerprint, lease, owner).await
    }

    async fn complete(
        &self,
        key: &IdempotencyKey,
        owner: &OwnerToken,
        outcome: &Outcome,
        ttl: Duration,
    ) -> Result<(), Error> {
        self.records.complete(key, owner, outcome, ttl).await
    }

    async fn release(&self, key: &IdempotencyKey, owner: &OwnerToken) -> Result<(), Error> {
        self.records.release(key, owner).await
    }

    async fn renew(
        &self,
        key: &IdempotencyKey,
        owner: &OwnerToken,
        lease: Duration,
    ) -> Result<(), Error> {
        self.records.renew(key, owner, lease).await
    }

    fn transactional(&self) -> Option<&dyn TransactionalStore> {
        Some(self)
    }
}

impl TransactionalStore for LedgerStore {
    fn claim_in_transaction<'a>(
        &'a self,
        key: &'a IdempotencyKey,
        fingerprint: &'a Fingerprint,
        lease: Duration,
        owner: OwnerToken,
    ) -> BoxFuture<'a, Result<TxClaim, Error>> {
        Box::pin(async move {
            let claim = self.records.claim(key, fingerprint, lease, owner).await?;
            Ok(match claim.acquired() {
                Ok(owner) => TxClaim::Open(Box::new(Open {
                    store: self.clone(),
                    key: key.clone(),
                    owner,
                    writes: LedgerTx::default(),
                })),
                Err(duplicate) => TxClaim::Duplicate(duplicate),
            })
        })
    }
}

struct Open {
    store: LedgerStore,
    key: IdempotencyKey,
    owner: OwnerToken,
    writes: LedgerTx,
}

impl OpenTransaction for Open {
    fn handle(&self) -> TxHandle {
        TxHandle::new(self.writes.clone())
    }

    fn commit<'a>(
        self: Box<Self>,
        outcome: &'a Outcome,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            let writes = std::mem::take(&mut *self.writes.0.lock().unwrap());
            self.store.rows.lock().unwrap().extend(writes);
            let records = &self.store.records;
            records.complete(&self.key, &self.owner, outcome, ttl).await
        })
    }

    fn rollback(self: Box<Self>) -> BoxFuture<'static, Result<(), Error>> {
        Box::pin(async move { self.store.records.release(&self.key, &self.owner).await })
    }
}

/// The layer in transactional mode on a `LedgerStore`, around a handler
/// that writes one row through the store's own transaction type and fails
/// (500, after its write) on the runs `fail_on` names.
fn service(
    store: &LedgerStore,
    calls: &Calls,
    fail_on: &'static [usize],
) -> impl tower::Service<
    Request<axum::body::Body>,
    Response = http::Response<impl http_body::Body<Data: Send, Error: std::fmt::Debug> + Send>,
    Error: std::fmt::Debug,
    Future: Send,
> + Clone
+ Send
+ 'static {
    let calls = calls.clone();
    let handler = service_fn(move |request: Request<axum::body::Body>| {
        let n = calls.run();
        async move {
            let tx = request
                .extensions()
                .get::<TxHandle>()
                .and_then(TxHandle::get::<LedgerTx>)
                .expect("the layer lends the store's transaction")
                .clone();
            tokio::time::sleep(Duration::from_millis(20)).await;
            tx.insert(format!("debit for run {n}"));
            if fail_on.contains(&n) {
                return Ok(json(StatusCode::INTERNAL_SERVER_ERROR, "{}".into()));
            }
            Ok::<_, std::convert::Infallible>(created(n))
        }
    });
    Idempotency::new(store.clone())
        .layer()
        .transactional()
        .expect("the store has a transactional mode")
        .layer(handler)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_foreign_stores_transaction_commits_the_handlers_writes_once_per_key() {
    let store = LedgerStore::default();
    let calls = Calls::default();
    let service = service(&store, &calls, &[]);
    let racing: Vec<_> = (0..10)
        .map(|_| {
            let service = service.clone();
            tokio::spawn(async move { send(&service, post("/orders", Some("k-1"), ORDER)).await })
        })
        .collect();
    for reply in racing {
        let status = reply.await.unwrap().status;
        assert!(
            status == StatusCode::CREATED || status == StatusCode::CONFLICT,
            "{status}"
        );
    }
    let replay = send(&service, post("/orders", Some("k-1"), ORDER)).await;
    assert_eq!(replay.status, StatusCode::CREATED);
    assert_eq!(replay.headers["idempotent-replayed"], "true");
    assert_eq!(calls.get(), 1);
    assert_eq!(*store.rows.lock().unwrap(), ["debit for run 1"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failed_attempt_rolls_its_writes_back_with_its_claim() {
    let store = LedgerStore::default();
    let calls = Calls::default();
    let service = service(&store, &calls, &[1]);
    let failed = send(&service, post("/orders", Some("k-2"), ORDER)).await;
    assert_eq!(failed.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(store.rows.lock().unwrap().is_empty(), "rolled back");
    let retried = send(&service, post("/orders", Some("k-2"), ORDER)).await;
    assert_eq!(retried.status, StatusCode::CREATED);
    assert!(retried.headers.get("idempotent-replayed").is_none());
    assert_eq!(calls.get(), 2);
    assert_eq!(*store.rows.lock().unwrap(), ["debit for run 2"]);
}
