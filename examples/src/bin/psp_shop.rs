//! The `psp_payment` shop as a process of its own, for the tests that kill
//! it (`examples/tests/psp_payment.rs`): `POST /payments` on a loopback
//! port, charging the provider at `--provider`, writing orders to
//! `--database` (`postgres://...` or `sqlite://PATH`).
//!
//! ```text
//! PSP_SHOP_SECRET=... psp_shop --provider http://127.0.0.1:4000 \
//!     --database sqlite:///tmp/shop.db [--pause-before-commit-ms 60000]
//! ```
//!
//! The secret (at least 32 bytes) comes from the environment, the same on
//! every instance. With `--pause-before-commit-ms`, each payment says
//! `before commit: REFERENCE` on stderr once charged and written, and waits
//! that long before its commit: the window a test's `kill -9` aims at.

use std::time::Duration;

use idem_examples::psp::shop::{self, Shop};
use idem_tower::sql::sqlx::{PgPool, SqlitePool};

#[tokio::main]
async fn main() -> Result<(), shop::BoxError> {
    let mut provider = None;
    let mut database = None;
    let mut pause = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let value = args.next().ok_or_else(|| format!("{arg} takes a value"))?;
        match arg.as_str() {
            "--provider" => provider = Some(value),
            "--database" => database = Some(value),
            "--pause-before-commit-ms" => pause = Some(Duration::from_millis(value.parse()?)),
            _ => return Err(format!("unknown argument {arg}").into()),
        }
    }
    let provider = provider.ok_or("--provider URL is required")?;
    let database = database.ok_or("--database URL is required")?;
    let secret = std::env::var("PSP_SHOP_SECRET").map_err(|_| "PSP_SHOP_SECRET is required")?;

    let mut shop = Shop::new(&provider, Shop::policy(Duration::from_secs(5)));
    if let Some(pause) = pause {
        shop = shop.pause_before_commit(pause);
    }
    let router = if database.starts_with("postgres") {
        shop::postgres(PgPool::connect(&database).await?, shop, secret.as_bytes()).await?
    } else {
        let url = format!("{database}?mode=rwc");
        shop::sqlite(SqlitePool::connect(&url).await?, shop, secret.as_bytes()).await?
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    eprintln!("listening on {}", listener.local_addr()?);
    axum::serve(listener, router).await?;
    Ok(())
}
