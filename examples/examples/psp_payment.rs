//! A payment handler that charges a provider and then writes the order,
//! its charge keyed by `operation.key_for("psp-charge")`: the provider
//! fails after charging, the shop fails before committing, and still one
//! charge, one order (docs/outbound.md).
//!
//! ```text
//! cargo run -p idem-examples --example psp_payment
//! ```
//!
//! Needs nothing: the stand-in provider (`src/psp/provider.rs`, which
//! deduplicates by `Idempotency-Key` as Stripe does) and the shop
//! (`src/psp/shop.rs`, transactional mode on a SQLite file in the temporary
//! directory) run in this process, over loopback HTTP.
#![allow(clippy::print_stdout, reason = "the example prints what happened")]

use std::time::Duration;

use idem_examples::psp::provider::Provider;
use idem_examples::psp::shop::{self, BoxError, Shop};
use idem_tower::sql::sqlx::{self, SqlitePool};

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let provider = Provider::new();
    let psp = provider
        .serve(tokio::net::TcpListener::bind("127.0.0.1:0").await?)
        .await?;

    let run = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_nanos();
    let file = std::env::temp_dir().join(format!("idem-psp-{run}.db"));
    let pool = SqlitePool::connect(&format!("sqlite://{}?mode=rwc", file.display())).await?;
    let shop = Shop::new(
        &format!("http://{psp}"),
        Shop::policy(Duration::from_secs(5)),
    );
    // In production: the same secret on every instance, from a secret store.
    let router = shop::sqlite(
        pool.clone(),
        shop.clone(),
        b"example secret: 32 bytes or more",
    )
    .await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/payments", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, router).await });

    // The provider charges, then its gateway answers 502: the shop's client
    // retries with the same key. Then the shop fails after the charge,
    // before its commit: the customer's retry runs the payment again.
    provider.fail_after_charge(1);
    shop.fail_before_commit(1);
    let client = reqwest::Client::new();
    for what in ["first attempt", "customer's retry", "duplicate"] {
        let response = client
            .post(&url)
            .header("Idempotency-Key", format!("pay-{run}"))
            .json(&serde_json::json!({ "amount_cents": 1200, "reference": "order-1" }))
            .send()
            .await?;
        println!(
            "{what:<17} -> {}, {}",
            response.status(),
            response.text().await?
        );
    }
    let orders: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM psp_orders")
        .fetch_one(&pool)
        .await?;
    println!(
        "provider: {} requests, {} charge(s); shop: {orders} order(s)",
        provider.requests(),
        provider.charges()
    );
    Ok(())
}
