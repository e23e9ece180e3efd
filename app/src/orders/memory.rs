//! The in-memory database, for `--database memory`: the same operations as
//! the SQL tables (sql/), each under one lock, so each is one transaction.
//!
//! It has no outbox: orders placed here publish no `order.created` event
//! (events.rs), and nothing rolls an order back once placed (no
//! transaction spans the handler), so `X-Chaos-Fail-After-Write` leaves
//! the order in place.

use std::collections::HashMap;
use std::sync::Mutex;

use super::model::{
    NewOrder, Order, Payment, PaymentState, STARTING_BALANCE_CENTS, TransitionError,
};

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
    pub fn place_order(&self, tenant: &str, user: &str, order: &NewOrder) -> Order {
        let mut t = self.tables.lock().expect("db lock");
        let balance = t
            .balances
            .entry((tenant.to_owned(), user.to_owned()))
            .or_insert(STARTING_BALANCE_CENTS);
        *balance -= order.amount_cents;
        let balance_cents = *balance;
        let placed = Order::placed(
            t.orders.len() as u64 + 1,
            tenant,
            user,
            order,
            balance_cents,
        );
        t.orders.push(placed.clone());
        placed
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
