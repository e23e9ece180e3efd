//! `#[idempotent]` handlers serving real requests through an axum router,
//! one module per topic: each test counts how often the handler body
//! actually ran.
#![cfg(feature = "macros")]

use idem_test_support::service as support;

mod app;
pub mod payments;

mod callers;
mod functions;
mod options;
mod refusals;

pub use app::AppState;
