//! One-time tokens, in SQL (`SqlTokens`) and in Redis (`RedisTokens`):
//! twenty submits with one token pass once, a token is bound to its
//! subject, restorable, and expires.

use std::future::Future;
use std::time::Duration;

use idem_guards::{GuardDb, SqlTokens, TokenUse};
use idem_sql::conformance::TestSql;
use idem_sql::sqlx::Pool;

use crate::support::{Table, all_at_once, nonce};

async fn tokens<DB: GuardDb + TestSql>(pool: &Pool<DB>) -> (SqlTokens<DB>, Table<DB>) {
    let table = Table {
        pool: pool.clone(),
        name: format!("guard_tokens_{}", nonce()),
    };
    let tokens = SqlTokens::with_table(pool.clone(), &table.name).unwrap();
    tokens.migrate().await.unwrap();
    tokens.migrate().await.unwrap();
    (tokens, table)
}

/// How many of twenty submits at once, each `submit()`, consumed the
/// token.
async fn twenty_submits_with_one_token<Fut>(submit: impl Fn() -> Fut) -> usize
where
    Fut: Future<Output = TokenUse> + Send + 'static,
{
    let uses = all_at_once(20, |_| submit()).await;
    uses.iter()
        .filter(|used| matches!(used, TokenUse::Consumed(_)))
        .count()
}

async fn sql_token_race<DB: GuardDb + TestSql>(tokens: SqlTokens<DB>, pool: Pool<DB>) {
    let token = tokens
        .issue("acme:alice:checkout", Duration::from_secs(600))
        .await
        .unwrap();
    let consumed = twenty_submits_with_one_token(|| {
        let (tokens, pool, token) = (tokens.clone(), pool.clone(), token.clone());
        async move {
            let mut conn = pool.acquire().await.unwrap();
            tokens
                .consume(&mut *conn, "acme:alice:checkout", &token)
                .await
                .unwrap()
        }
    })
    .await;
    assert_eq!(consumed, 1, "exactly one submit passes");
}

async fn twenty_concurrent_submits_with_one_token_pass_once<DB: GuardDb + TestSql>(pool: Pool<DB>) {
    let (tokens, table) = tokens(&pool).await;
    sql_token_race(tokens, pool).await;
    table.drop_table().await;
}

/// The path MySQL takes (no `DELETE ... RETURNING`): a locked read and a
/// delete in a transaction.
async fn twenty_concurrent_submits_pass_once_by_locked_read<DB: GuardDb + TestSql>(pool: Pool<DB>) {
    let (tokens, table) = tokens(&pool).await;
    sql_token_race(tokens.without_delete_returning(), pool).await;
    table.drop_table().await;
}

async fn token_is_bound_to_its_subject_and_restorable<DB: GuardDb + TestSql>(pool: Pool<DB>) {
    let (tokens, table) = tokens(&pool).await;
    let mut conn = pool.acquire().await.unwrap();
    let token = tokens
        .issue("acme:alice:checkout", Duration::from_secs(600))
        .await
        .unwrap();
    assert_eq!(
        tokens
            .consume(&mut *conn, "acme:bob:checkout", &token)
            .await
            .unwrap(),
        TokenUse::Invalid,
        "another subject's token"
    );
    let consumed = tokens
        .consume(&mut *conn, "acme:alice:checkout", &token)
        .await
        .unwrap()
        .consumed()
        .expect("consumed");
    assert!(consumed.ttl_left > Duration::from_secs(500));
    assert!(consumed.ttl_left <= Duration::from_secs(600));
    assert_eq!(
        tokens
            .consume(&mut *conn, "acme:alice:checkout", &token)
            .await
            .unwrap(),
        TokenUse::Invalid,
        "a double submit"
    );
    // The business step failed: restore, and the user can submit again.
    assert!(tokens.restore(&consumed).await.unwrap());
    assert!(!tokens.restore(&consumed).await.unwrap(), "already back");
    assert!(matches!(
        tokens
            .consume(&mut *conn, "acme:alice:checkout", &token)
            .await
            .unwrap(),
        TokenUse::Consumed(_)
    ));
    // Consumed in a transaction that rolls back: back by itself.
    let token = tokens
        .issue("acme:alice:checkout", Duration::from_secs(600))
        .await
        .unwrap();
    let mut tx = pool.begin().await.unwrap();
    assert!(matches!(
        tokens
            .consume(&mut *tx, "acme:alice:checkout", &token)
            .await
            .unwrap(),
        TokenUse::Consumed(_)
    ));
    tx.rollback().await.unwrap();
    assert!(matches!(
        tokens
            .consume(&mut *conn, "acme:alice:checkout", &token)
            .await
            .unwrap(),
        TokenUse::Consumed(_)
    ));
    // Expired: invalid.
    let token = tokens
        .issue("acme:alice:checkout", Duration::from_millis(200))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(
        tokens
            .consume(&mut *conn, "acme:alice:checkout", &token)
            .await
            .unwrap(),
        TokenUse::Invalid
    );
    assert_eq!(
        tokens
            .consume(&mut *conn, "acme:alice:checkout", &"forged".into())
            .await
            .unwrap(),
        TokenUse::Invalid
    );
    drop(conn);
    table.drop_table().await;
}

/// A token consumed in a transactional claim's transaction (the
/// connection `Tx` lends) goes with it: a request that then fails rolls
/// the consumption back, and the token is valid again. MySQL's locked
/// read and delete run in a nested transaction, a savepoint of the
/// claim's (it committed the claim's transaction halfway before the
/// transaction was lent counted open); both paths are run.
async fn a_token_consumed_by_a_failed_request_is_valid_again<DB: GuardDb + TestSql>(
    pool: Pool<DB>,
) {
    use idem_sql::__core::{Fingerprint, IdempotencyKey, OwnerToken, TransactionalStore, TxClaim};
    use idem_sql::{SqlStore, TxSlot};

    let (tokens, table) = tokens(&pool).await;
    let store = SqlStore::builder(pool.clone())
        .table("guard_tokens_tx_records")
        .build()
        .unwrap();
    store.migrate().await.unwrap();
    for tokens in [tokens.clone(), tokens.without_delete_returning()] {
        let subject = "acme:alice:checkout";
        let token = tokens
            .issue(subject, Duration::from_secs(600))
            .await
            .unwrap();
        let key = IdempotencyKey::new("guard-test:", &nonce());
        let claim = store
            .claim_in_transaction(
                &key,
                &Fingerprint::from_bytes([1; 32]),
                Duration::from_secs(30),
                OwnerToken::generate(),
            )
            .await
            .unwrap();
        let TxClaim::Open(tx) = claim else {
            panic!("a fresh key is claimed: {claim:?}");
        };
        {
            let handle = tx.handle();
            let mut guard = handle.get::<TxSlot<DB>>().unwrap().lock().await;
            let conn = &mut **guard.as_mut().unwrap();
            let used = tokens.consume(conn, subject, &token).await.unwrap();
            assert!(matches!(used, TokenUse::Consumed(_)), "{used:?}");
        }
        tx.rollback().await.unwrap();
        let mut conn = pool.acquire().await.unwrap();
        let used = tokens.consume(&mut *conn, subject, &token).await.unwrap();
        assert!(
            matches!(used, TokenUse::Consumed(_)),
            "the token stayed consumed by a request that rolled back: {used:?}"
        );
    }
    table.drop_table().await;
}

sql_cases!(
    twenty_concurrent_submits_with_one_token_pass_once,
    token_is_bound_to_its_subject_and_restorable,
    a_token_consumed_by_a_failed_request_is_valid_again,
);

/// The locked-read path is MySQL's; PostgreSQL runs it too, as a second
/// opinion. (SQLite always has `RETURNING`, and a deferred read-then-write
/// transaction there fails fast on a busy snapshot instead of waiting.)
mod locked_read {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn mysql_twenty_concurrent_submits_pass_once() {
        if let Some(pool) = crate::support::mysql().await {
            super::twenty_concurrent_submits_pass_once_by_locked_read(pool).await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn postgres_twenty_concurrent_submits_pass_once() {
        if let Some(pool) = crate::support::postgres().await {
            super::twenty_concurrent_submits_pass_once_by_locked_read(pool).await;
        }
    }
}

#[cfg(feature = "redis")]
mod redis {
    use std::time::Duration;

    use idem_guards::{RedisTokens, TokenUse};

    use crate::support::{nonce, redis};

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn twenty_concurrent_submits_with_one_token_pass_once() {
        let Some(conn) = redis().await else {
            return;
        };
        let tokens = RedisTokens::new(conn).namespace("idem-test:");
        let subject = format!("acme:alice:{}", nonce());
        let token = tokens
            .issue(&subject, Duration::from_secs(60))
            .await
            .unwrap();
        let consumed = super::twenty_submits_with_one_token(|| {
            let (tokens, token, subject) = (tokens.clone(), token.clone(), subject.clone());
            async move { tokens.consume(&subject, &token).await.unwrap() }
        })
        .await;
        assert_eq!(consumed, 1, "exactly one submit passes");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn token_is_bound_to_its_subject_and_restorable() {
        let Some(conn) = redis().await else {
            return;
        };
        let tokens = RedisTokens::new(conn).namespace("idem-test:");
        let subject = format!("acme:alice:{}", nonce());
        let token = tokens
            .issue(&subject, Duration::from_secs(60))
            .await
            .unwrap();
        assert_eq!(
            tokens.consume("acme:bob:x", &token).await.unwrap(),
            TokenUse::Invalid
        );
        let consumed = tokens
            .consume(&subject, &token)
            .await
            .unwrap()
            .consumed()
            .expect("consumed");
        assert!(consumed.ttl_left > Duration::from_secs(50));
        assert_eq!(
            tokens.consume(&subject, &token).await.unwrap(),
            TokenUse::Invalid
        );
        assert!(tokens.restore(&consumed).await.unwrap());
        assert!(!tokens.restore(&consumed).await.unwrap());
        assert!(matches!(
            tokens.consume(&subject, &token).await.unwrap(),
            TokenUse::Consumed(_)
        ));
        let short = tokens
            .issue(&subject, Duration::from_millis(100))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(
            tokens.consume(&subject, &short).await.unwrap(),
            TokenUse::Invalid
        );
    }
}
