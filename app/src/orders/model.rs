//! The orders app's rows: orders, payments and their lifecycle, and what a
//! client sends to place an order.

use idem_tower::guards::LifecycleState;
use serde::{Deserialize, Serialize};

/// What a new user's balance starts at, in cents.
pub const STARTING_BALANCE_CENTS: i64 = 100_000;

/// The body of `POST /orders`: what the client orders, for the user and
/// tenant the request carries.
#[derive(Debug, Clone, Deserialize)]
pub struct NewOrder {
    /// What.
    pub sku: String,
    /// How many; positive.
    pub qty: i64,
    /// The price debited; not negative.
    pub amount_cents: i64,
}

/// An order row.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Order {
    /// Assigned on insert, from 1.
    pub order_id: u64,
    /// The tenant that placed it.
    pub tenant: String,
    /// The user that placed it.
    pub user: String,
    /// What was ordered.
    pub sku: String,
    /// How many.
    pub qty: i64,
    /// The price debited.
    pub amount_cents: i64,
    /// The user's balance right after the debit.
    pub balance_cents: i64,
}

impl Order {
    /// The row `order` became, as user `user` of `tenant`.
    pub fn placed(
        order_id: u64,
        tenant: &str,
        user: &str,
        order: &NewOrder,
        balance_cents: i64,
    ) -> Self {
        Self {
            order_id,
            tenant: tenant.to_owned(),
            user: user.to_owned(),
            sku: order.sku.clone(),
            qty: order.qty,
            amount_cents: order.amount_cents,
            balance_cents,
        }
    }
}

/// A payment's lifecycle state.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum PaymentState {
    /// Created, waiting for the provider's callback.
    WaitPay,
    /// The provider confirmed it; the ledger was credited.
    Paid,
    /// Paid, then refunded: the credit was reversed. A late callback for it
    /// is a conflict and books nothing.
    Refunded,
}

impl LifecycleState for PaymentState {
    const ALL: &'static [Self] = &[Self::WaitPay, Self::Paid, Self::Refunded];

    fn as_str(&self) -> &'static str {
        match self {
            Self::WaitPay => "WAIT_PAY",
            Self::Paid => "PAID",
            Self::Refunded => "REFUNDED",
        }
    }
}

/// A payment row.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Payment {
    /// The merchant's payment number.
    pub payment_no: String,
    /// Where it is in its lifecycle.
    pub state: PaymentState,
    /// The amount expected.
    pub amount_cents: i64,
    /// Ledger credits booked for it: 1 once paid, never more.
    pub credits: u64,
    /// Refunds (credit reversals) booked for it: 1 once refunded, never more.
    pub refunds: u64,
}

/// Why a payment transition did not apply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TransitionError {
    /// No such payment.
    NotFound,
    /// The callback's amount is not the payment's.
    AmountMismatch,
    /// The payment is in a state this step may not leave (a callback for a
    /// refunded payment, a refund of an unpaid one).
    Illegal(PaymentState),
}
