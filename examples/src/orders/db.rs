//! The orders app's data: orders, balances, payments and the ledger.

use std::collections::HashMap;
use std::sync::Mutex;

use idem_tower::core::guards::LifecycleState;
use serde::Serialize;

/// What a new user's balance starts at, in cents.
pub const STARTING_BALANCE_CENTS: i64 = 100_000;

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

/// The in-memory database: one lock, so each operation is one transaction.
#[derive(Debug, Default)]
pub struct Db {
    tables: Mutex<Tables>,
}

#[derive(Debug, Default)]
struct Tables {
    orders: Vec<Order>,
    balances: HashMap<(String, String), i64>,
    payments: HashMap<String, Payment>,
}

impl Db {
    /// Inserts an order and debits the user's balance (a relative update, as
    /// the real thing would be), atomically.
    pub fn place_order(
        &self,
        tenant: &str,
        user: &str,
        sku: &str,
        qty: i64,
        amount_cents: i64,
    ) -> Order {
        let mut t = self.tables.lock().expect("db lock");
        let balance = t
            .balances
            .entry((tenant.to_owned(), user.to_owned()))
            .or_insert(STARTING_BALANCE_CENTS);
        *balance -= amount_cents;
        let balance_cents = *balance;
        let order = Order {
            order_id: t.orders.len() as u64 + 1,
            tenant: tenant.to_owned(),
            user: user.to_owned(),
            sku: sku.to_owned(),
            qty,
            amount_cents,
            balance_cents,
        };
        t.orders.push(order.clone());
        order
    }

    /// A user's orders and current balance.
    pub fn orders_of(&self, tenant: &str, user: &str) -> (Vec<Order>, i64) {
        let t = self.tables.lock().expect("db lock");
        let orders = t
            .orders
            .iter()
            .filter(|o| o.tenant == tenant && o.user == user)
            .cloned()
            .collect();
        let balance = t
            .balances
            .get(&(tenant.to_owned(), user.to_owned()))
            .copied()
            .unwrap_or(STARTING_BALANCE_CENTS);
        (orders, balance)
    }

    /// Creates a payment waiting for its callback; `false` if the number is taken.
    pub fn create_payment(&self, payment_no: &str, amount_cents: i64) -> bool {
        let mut t = self.tables.lock().expect("db lock");
        if t.payments.contains_key(payment_no) {
            return false;
        }
        t.payments.insert(
            payment_no.to_owned(),
            Payment {
                payment_no: payment_no.to_owned(),
                state: PaymentState::WaitPay,
                amount_cents,
                credits: 0,
                refunds: 0,
            },
        );
        true
    }

    /// Compare-and-set `WAIT_PAY -> PAID`, crediting the ledger once, with
    /// the semantics of the SQL state-machine transition: a payment already
    /// `PAID` is an idempotent success that books nothing; a `REFUNDED` one
    /// is [`TransitionError::Illegal`].
    pub fn mark_paid(
        &self,
        payment_no: &str,
        amount_cents: i64,
    ) -> Result<Payment, TransitionError> {
        let mut t = self.tables.lock().expect("db lock");
        let payment = t
            .payments
            .get_mut(payment_no)
            .ok_or(TransitionError::NotFound)?;
        if payment.amount_cents != amount_cents {
            return Err(TransitionError::AmountMismatch);
        }
        match payment.state {
            PaymentState::WaitPay => {
                payment.state = PaymentState::Paid;
                payment.credits += 1;
            }
            PaymentState::Paid => {}
            other => return Err(TransitionError::Illegal(other)),
        }
        Ok(payment.clone())
    }

    /// Compare-and-set `PAID -> REFUNDED`, reversing the credit once: a
    /// payment already `REFUNDED` is an idempotent success; one still
    /// `WAIT_PAY` is [`TransitionError::Illegal`].
    pub fn refund(&self, payment_no: &str) -> Result<Payment, TransitionError> {
        let mut t = self.tables.lock().expect("db lock");
        let payment = t
            .payments
            .get_mut(payment_no)
            .ok_or(TransitionError::NotFound)?;
        match payment.state {
            PaymentState::Paid => {
                payment.state = PaymentState::Refunded;
                payment.refunds += 1;
            }
            PaymentState::Refunded => {}
            other => return Err(TransitionError::Illegal(other)),
        }
        Ok(payment.clone())
    }

    /// A payment by number.
    pub fn payment(&self, payment_no: &str) -> Option<Payment> {
        self.tables
            .lock()
            .expect("db lock")
            .payments
            .get(payment_no)
            .cloned()
    }
}
