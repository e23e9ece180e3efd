//! The `psp_payment` shop as a process of its own, for the tests that kill
//! it (`examples/tests/psp_payment.rs`): `POST /payments` on a loopback
//! port, charging the provider at `--provider`, writing orders to
//! `--database` (`postgres://...` or `sqlite://PATH`).
//!
//! ```text
//! PSP_SHOP_SECRET=... psp_shop --provider http://127.0.0.1:4000 \
//!     --database sqlite:///tmp/shop.db [--pause-before-commit-ms 60000]
//!     (or --pause-before-charge-ms, --pause-after-commit-ms) [--phased true]
//! ```
//!
//! The secret (at least 32 bytes) comes from the environment, the same on
//! every instance. With `--pause-before-commit-ms`, each payment says
//! `before commit: REFERENCE` on stderr once charged and written, and waits
//! that long before its commit: the window a test's `kill -9` aims at; the
//! same before the charge (`before charge: REFERENCE`) and after the
//! commit, before the answer (`after commit: KEY`). With `--phased true`
//! the payment runs in phases (`idem_examples::psp::phased`): the pause
//! before the commit is in its last phase, marking the order paid.

use std::time::Duration;

use idem_examples::psp::phased;
use idem_examples::psp::shop::{self, Pause, Shop};
use idem_tower::sql::sqlx::{PgPool, SqlitePool};

#[tokio::main]
async fn main() -> Result<(), shop::BoxError> {
    let mut provider = None;
    let mut database = None;
    let mut pause = None;
    let mut in_phases = false;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let value = args.next().ok_or_else(|| format!("{arg} takes a value"))?;
        match arg.as_str() {
            "--provider" => provider = Some(value),
            "--database" => database = Some(value),
            "--pause-before-charge-ms" => pause = Some((Pause::BeforeCharge, value.parse()?)),
            "--pause-before-commit-ms" => pause = Some((Pause::BeforeCommit, value.parse()?)),
            "--pause-after-commit-ms" => pause = Some((Pause::AfterCommit, value.parse()?)),
            "--phased" => in_phases = value.parse()?,
            _ => return Err(format!("unknown argument {arg}").into()),
        }
    }
    let provider = provider.ok_or("--provider URL is required")?;
    let database = database.ok_or("--database URL is required")?;
    let secret = std::env::var("PSP_SHOP_SECRET").map_err(|_| "PSP_SHOP_SECRET is required")?;

    let mut shop = Shop::new(&provider, Shop::policy(Duration::from_secs(5)));
    if let Some((at, ms)) = pause {
        shop = shop.pause(at, Duration::from_millis(ms));
    }
    let secret = secret.as_bytes();
    let router = if database.starts_with("postgres") {
        let pool = PgPool::connect(&database).await?;
        if in_phases {
            phased::postgres(pool, shop, secret).await?
        } else {
            shop::postgres(pool, shop, secret).await?
        }
    } else {
        let pool = SqlitePool::connect(&format!("{database}?mode=rwc")).await?;
        if in_phases {
            phased::sqlite(pool, shop, secret).await?
        } else {
            shop::sqlite(pool, shop, secret).await?
        }
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    eprintln!("listening on {}", listener.local_addr()?);
    axum::serve(listener, router).await?;
    Ok(())
}
