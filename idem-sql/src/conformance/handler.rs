//! What a handler may do with the transaction it is lent, and what it
//! cannot undo: a nested `begin()` is a savepoint, whose `commit()` and
//! `rollback()` touch nothing of the claim's; a raw COMMIT or ROLLBACK of
//! the claim's transaction is found before it settles, and the key never
//! runs twice.

use std::sync::Arc;

use super::{
    TestSql, another_process, claim_in_transaction, claim_lent, effects, fp, fresh_case, response,
};
use crate::SqlStore;
use idem_core::conformance::{LONG, duplicate};
use idem_core::{Claim, Duplicate, ErrorKind, IdempotencyKey, OpenTransaction, Outcome, TxClaim};

/// What a handler does with its transaction, in [`run_handler`].
#[derive(Clone, Copy, Debug)]
enum Handler {
    /// Writes an effect row in a nested transaction (`begin()` on the
    /// connection it was lent) that it commits, as sqlx users group
    /// writes; then a second effect row in the claim's transaction.
    NestedCommit,
    /// Writes an effect row in a nested transaction that it rolls back,
    /// then one in the claim's transaction.
    NestedRollback,
    /// Writes an effect row, sends a raw `COMMIT`, then writes another.
    RawCommit,
    /// Writes an effect row, sends a raw `ROLLBACK`, then writes another.
    RawRollback,
}

/// Claims `key` in a transaction and runs `handler` in it, as a request
/// would through `Tx`: the open claim, for the case to settle.
async fn run_handler<DB: TestSql>(
    store: &SqlStore<DB>,
    key: &IdempotencyKey,
    nonce: &str,
    handler: Handler,
) -> Box<dyn OpenTransaction> {
    let (tx, mut guard) = claim_lent(store, key).await;
    let conn: &mut DB::Connection = guard.as_mut().expect("an open transaction");
    let write = format!("INSERT INTO {} (k) VALUES ('{nonce}')", super::EFFECTS);
    match handler {
        Handler::NestedCommit | Handler::NestedRollback => {
            let mut inner = sqlx::Connection::begin(&mut *conn)
                .await
                .expect("a nested transaction begins");
            DB::exec_on(&mut inner, write.clone()).await;
            if matches!(handler, Handler::NestedCommit) {
                inner
                    .commit()
                    .await
                    .expect("the nested transaction commits");
            } else {
                inner
                    .rollback()
                    .await
                    .expect("the nested transaction rolls back");
            }
            DB::exec_on(conn, write).await;
        }
        Handler::RawCommit | Handler::RawRollback => {
            DB::exec_on(conn, write.clone()).await;
            let end = if matches!(handler, Handler::RawCommit) {
                "COMMIT"
            } else {
                "ROLLBACK"
            };
            // The database may refuse it (SQLite's COMMIT: its commit
            // hook), and a handler that goes on anyway writes again.
            let _ = DB::try_exec_on(conn, end.to_owned()).await;
            let _ = DB::try_exec_on(conn, write).await;
        }
    }
    tx
}

/// A nested `begin()` whose `commit()` the handler sends is a savepoint:
/// when the request then fails (its transaction rolled back), none of its
/// writes stay, and the key is free; the retry runs once and its writes
/// commit with the record; every duplicate after it replays.
pub async fn a_nested_commit_is_undone_with_a_failed_request<DB: TestSql>(
    store: Arc<SqlStore<DB>>,
) {
    let (key, nonce) = fresh_case(&store, "tx-nested-fail").await;
    run_handler(&store, &key, &nonce, Handler::NestedCommit)
        .await
        .rollback()
        .await
        .expect("the failed request rolls back");
    assert_eq!(
        effects(store.pool(), &nonce).await,
        0,
        "the nested commit committed the claim's transaction"
    );
    run_handler(&store, &key, &nonce, Handler::NestedCommit)
        .await
        .commit(&response(), LONG)
        .await
        .expect("the retry commits");
    assert_eq!(effects(store.pool(), &nonce).await, 2);
    assert_eq!(
        duplicate(&*store, &key, &fp()).await,
        Claim::Replay(response())
    );
    assert_eq!(effects(store.pool(), &nonce).await, 2);
}

/// A nested transaction the handler rolls back undoes its own writes
/// only: the claim's transaction goes on, and commits the rest.
pub async fn a_nested_rollback_undoes_only_its_own_writes<DB: TestSql>(store: Arc<SqlStore<DB>>) {
    let (key, nonce) = fresh_case(&store, "tx-nested-rollback").await;
    run_handler(&store, &key, &nonce, Handler::NestedRollback)
        .await
        .commit(&response(), LONG)
        .await
        .expect("the request commits");
    assert_eq!(effects(store.pool(), &nonce).await, 1);
    assert_eq!(
        duplicate(&*store, &key, &fp()).await,
        Claim::Replay(response())
    );
}

/// While a handler that committed a nested transaction runs on, its key
/// is still held: another process's claim of it is told "in flight",
/// never given the key, and replays once the first commits. One run, its
/// writes once.
pub async fn a_nested_commit_keeps_the_key_held<DB: TestSql>(store: Arc<SqlStore<DB>>) {
    let (key, nonce) = fresh_case(&store, "tx-nested-race").await;
    let elsewhere = Arc::new(another_process(&store));
    let first = run_handler(&store, &key, &nonce, Handler::NestedCommit).await;
    // Claims from both processes at once, while the first is open.
    let mut claims = tokio::task::JoinSet::new();
    for n in 0..4 {
        let store = if n % 2 == 0 {
            Arc::clone(&store)
        } else {
            Arc::clone(&elsewhere)
        };
        let key = key.clone();
        claims.spawn(async move { claim_in_transaction(&store, &key).await });
    }
    while let Some(claim) = claims.join_next().await {
        match claim.expect("a claim's task") {
            TxClaim::Duplicate(Duplicate::InFlight { .. }) => {}
            TxClaim::Open(_) => panic!("a second claim was given the held key"),
            other => panic!("expected in flight, got {other:?}"),
        }
    }
    first
        .commit(&response(), LONG)
        .await
        .expect("the first commits");
    match claim_in_transaction(&*elsewhere, &key).await {
        TxClaim::Duplicate(Duplicate::Replay(outcome)) => assert_eq!(outcome, response()),
        other => panic!("expected a replay, got {other:?}"),
    }
    assert_eq!(effects(store.pool(), &nonce).await, 2);
}

/// A raw COMMIT or ROLLBACK the handler sends on the claim's transaction
/// is found when the store settles, whether the response was to be kept
/// (commit) or not (rollback): no response is stored for writes that did
/// not commit with it, and the key never runs twice. Either the store
/// kept every write after the end from committing and the key is free with
/// nothing of the attempt committed (MySQL/MariaDB out of autocommit, a
/// ROLLBACK; SQLite, which refuses the handler's COMMIT), or the settling
/// fails with [`ErrorKind::TransactionEnded`] and the key's duplicates get
/// a record that is not replayable.
pub async fn a_transaction_the_handler_ended_never_runs_again<DB: TestSql>(
    store: Arc<SqlStore<DB>>,
) {
    for (handler, settle_by_commit) in [
        (Handler::RawCommit, true),
        (Handler::RawCommit, false),
        (Handler::RawRollback, true),
        (Handler::RawRollback, false),
    ] {
        let case = format!("{handler:?}, settled by commit: {settle_by_commit}");
        let (key, nonce) = fresh_case(&store, "tx-ended").await;
        let open = run_handler(&store, &key, &nonce, handler).await;
        let settled = if settle_by_commit {
            open.commit(&response(), LONG).await
        } else {
            open.rollback().await
        };
        let kept = effects(store.pool(), &nonce).await;
        let elsewhere = another_process(&store);
        match duplicate(&elsewhere, &key, &fp()).await {
            Claim::Replay(Outcome::NotReplayable) => {
                let err = settled.expect_err(&case);
                assert_eq!(err.kind(), ErrorKind::TransactionEnded, "{case}: {err:?}");
                // The same from this process.
                assert_eq!(
                    duplicate(&*store, &key, &fp()).await,
                    Claim::Replay(Outcome::NotReplayable),
                    "{case}"
                );
            }
            Claim::Acquired(_) => {
                assert_eq!(
                    kept, 0,
                    "{case}: the key is free, its attempt's writes kept"
                );
                if let Err(err) = settled {
                    assert_ne!(err.kind(), ErrorKind::TransactionEnded, "{case}: {err:?}");
                }
            }
            other => panic!("{case}: {other:?}"),
        }
        assert!(kept <= 2, "{case}: {kept} effects");
    }
}
