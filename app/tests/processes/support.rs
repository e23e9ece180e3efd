//! The `orders` binary of this crate, started for a test (the rest of what
//! the process tests use is the test-support crate's).

pub(crate) use idem_test_support::orders::{
    Orders, Spawned, account, handler_calls, order, scrape,
};
pub(crate) use idem_test_support::prometheus::{metric, samples};
pub(crate) use idem_test_support::unique;

/// Starts this crate's `orders` binary on `database` (and `redis`):
/// [`Orders::start`].
pub(crate) fn start_orders(database: &str, redis: Option<&str>) -> Orders {
    start_orders_with(database, redis, &[])
}

/// [`start_orders`], with more arguments (`--lease-ms 1000`).
pub(crate) fn start_orders_with(database: &str, redis: Option<&str>, extra: &[&str]) -> Orders {
    Orders::start(env!("CARGO_BIN_EXE_orders"), database, redis, extra)
}
