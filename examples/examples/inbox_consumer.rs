//! A message consumer deduplicating with the inbox guard: each message's
//! effect and its inbox row commit in one transaction, so a redelivery, a
//! re-publication under a new message id and a retry after a failure all
//! leave one effect (docs/guards.md, "The inbox: idempotent consumers").
//!
//! ```text
//! cargo run -p idem-examples --example inbox_consumer
//! ```
//!
//! Needs no server: the inbox and the accounts live in an in-memory SQLite
//! database, and the "broker" is a list of deliveries. `Inbox` works the
//! same on a `PgPool` or a `MySqlPool`; the `consumer` binary
//! (`cargo run -p idem-app --bin consumer -- --help`) is the same
//! consumer on NATS JetStream.
#![allow(clippy::print_stdout, reason = "the example prints what happened")]

use idem_tower::guards::{Inbox, ProcessError, Processed};
use idem_tower::sql::sqlx::{self, sqlite::SqlitePoolOptions};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // One connection: each connection to `sqlite::memory:` is a database of
    // its own.
    let pool = SqlitePoolOptions::new()
        .max_connections(1)
        .connect("sqlite::memory:")
        .await?;
    sqlx::query("CREATE TABLE accounts (account TEXT PRIMARY KEY, balance_cents INTEGER NOT NULL)")
        .execute(&pool)
        .await?;
    let inbox = Inbox::new(pool.clone(), "ledger")?;
    inbox.migrate().await?;

    // What the broker delivers: the message id, the business id it carries
    // (a transfer, to credit once), the account, the amount, and whether the
    // handler fails after its write, as a crash would.
    let deliveries = [
        ("m-1", "T-1", "alice", 500, false),
        ("m-2", "T-2", "bob", 300, false),
        ("m-1", "T-1", "alice", 500, false), // redelivered
        ("m-9", "T-1", "alice", 500, false), // re-published under a new id
        ("m-3", "T-3", "carol", 200, true),
        ("m-3", "T-3", "carol", 200, false), // the broker's redelivery
    ];
    for (message_id, transfer_id, account, amount_cents, fails) in deliveries {
        let outcome = inbox
            .process(message_id, transfer_id, |conn| {
                Box::pin(async move {
                    sqlx::query(
                        "INSERT INTO accounts (account, balance_cents) VALUES ($1, $2) \
                         ON CONFLICT (account) DO UPDATE \
                         SET balance_cents = balance_cents + excluded.balance_cents",
                    )
                    .bind(account)
                    .bind(amount_cents)
                    .execute(&mut *conn)
                    .await?;
                    if fails {
                        return Err("the handler failed after its write".into());
                    }
                    Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
                })
            })
            .await;
        // Acknowledge on `Ok` (done or skipped); on `Err` nothing was
        // committed: leave the message for the broker to deliver again.
        let what = match outcome {
            Ok(Processed::Done(())) => "credited, ack".to_owned(),
            Ok(Processed::Skipped(of)) => format!("duplicate ({of:?}) skipped, ack"),
            Err(ProcessError::Failed(err)) => format!("{err}: rolled back, no ack"),
            Err(ProcessError::Inbox(err)) => return Err(err.into()),
        };
        println!("{message_id} {transfer_id} {account:>5} -> {what}");
    }
    let balances: Vec<(String, i64)> =
        sqlx::query_as("SELECT account, balance_cents FROM accounts ORDER BY account")
            .fetch_all(&pool)
            .await?;
    println!("balances: {balances:?}");
    Ok(())
}
