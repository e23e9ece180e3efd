//! The checker: the ledger PostgreSQL holds after a run, against the
//! operations the workload sent and the answers it got.
//!
//! - each operation has exactly one effect: an order has one order row, a
//!   payment one ledger credit (more is a double effect; none, for an
//!   acknowledged operation, a lost one);
//! - every answer to an order (its copies, its re-send) is the same 201,
//!   whose body is the stored order, and all but one are replays; every
//!   answer to a payment's callback is 200 with the payment paid, once;
//! - each user's balance is the starting balance less the orders' amounts,
//!   and the orders' recorded balances chain down one debit at a time (no
//!   debit without its order, none applied twice);
//! - each order has exactly one `order.created` event in the outbox.

use std::collections::HashMap;
use std::time::Duration;

use idem_app::orders::STARTING_BALANCE_CENTS;
use idem_app::sql_pool::ACQUIRE_TIMEOUT;
use idem_tower::sql::sqlx::{self, PgPool, Row};

use crate::workload::{Answer, Kind, Sent};
use idem_test_support::loss_window::{Acknowledgement, LossWindow};

/// What the ledger says about a run's operations.
#[derive(Debug, Default)]
pub(crate) struct Verdict {
    pub(crate) operations: usize,
    /// Order rows and payment credits of the run.
    pub(crate) effects: usize,
    /// Operations with more than one effect.
    pub(crate) doubles: usize,
    /// Operations acknowledged (an order's 201, a callback's 200) with no
    /// effect.
    pub(crate) lost: usize,
    /// Operations acknowledged, then lost with their idempotency record
    /// (a failover to a standby that had not received their commit), so
    /// that a retry ran them again: one effect now, but not the one the
    /// first answer described. Only asynchronous replication may do this.
    pub(crate) acknowledged_lost: usize,
    /// Of those, operations whose lost record the Redis gate still held
    /// and replayed: acknowledged again, never run again, no effect.
    pub(crate) replayed_without_effect: usize,
    /// Operations with no final answer within the workload's patience.
    pub(crate) unanswered: usize,
    /// Answers that differ from the stored order or payment, or from one
    /// another, or are not a success.
    pub(crate) wrong_answers: usize,
    /// Users whose balance or balance chain is off.
    pub(crate) bad_balances: usize,
    /// Orders without exactly one outbox event.
    pub(crate) bad_events: usize,
    /// The first few problems, for the failure message.
    pub(crate) problems: Vec<String>,
}

impl Verdict {
    /// No double, nothing lost, every answer right, every balance right.
    pub(crate) fn clean(&self) -> bool {
        self.acknowledged_lost == 0 && self.clean_but_for_acknowledged_lost()
    }

    /// [`clean`](Self::clean), but for operations a failover lost with
    /// their record, which ran again: what asynchronous replication allows.
    pub(crate) fn clean_but_for_acknowledged_lost(&self) -> bool {
        self.doubles == 0
            && self.lost == 0
            && self.unanswered == 0
            && self.wrong_answers == 0
            && self.bad_balances == 0
            && self.bad_events == 0
            && self.effects + self.replayed_without_effect == self.operations
    }

    fn problem(&mut self, problem: String) {
        if self.problems.len() < 10 {
            self.problems.push(problem);
        }
    }
}

/// How long after its commit a `POST /orders` answer can arrive: the route
/// is transactional (its record commits with the order), so only the
/// Redis gate's completion, bounded by the gate's timeouts, comes between.
const ORDER_ANSWER_DELAY: Duration = Duration::from_secs(1);

/// How long after its commit a payment callback's answer can arrive. The
/// route is in plain mode: after the handler's commit, the layer stores
/// the record, trying 3 times before it answers
/// (`idem-tower/src/layer/lease.rs`, `QUICK_ATTEMPTS`, 40 and 80 ms
/// apart), and with the primary gone each try can wait for a connection
/// for the app's whole acquire timeout: 9.1 s with its 3 s, and 1 s more
/// for the rest. Seen in CI: an answer 3.5 s after the crash, for a credit
/// node0 alone had committed.
const CALLBACK_ANSWER_DELAY: Duration = ACQUIRE_TIMEOUT
    .saturating_mul(3)
    .saturating_add(Duration::from_secs(1));

/// The acknowledgements among `answers`, for a [`LossWindow`].
fn acknowledgements(
    answers: &[&Answer],
    acknowledges: impl Fn(&Answer) -> bool,
) -> Vec<Acknowledgement> {
    answers
        .iter()
        .filter(|a| acknowledges(a))
        .map(|a| Acknowledgement {
            at: a.at,
            replayed: a.replayed,
        })
        .collect()
}

/// An order row.
#[derive(Debug)]
struct OrderRow {
    order_id: i64,
    user: String,
    sku: String,
    qty: i64,
    amount_cents: i64,
    balance_cents: i64,
}

/// Checks `sent` (with `resent`, the answers to sending each operation
/// once more) against what `tenant` (and the payments named after the
/// run) has in the database at `pool`.
pub(crate) async fn check(
    pool: &PgPool,
    tenant: &str,
    sent: &[Sent],
    resent: &[Option<Answer>],
    may_lose: Option<LossWindow>,
) -> Verdict {
    let rows: Vec<OrderRow> = sqlx::query(
        "SELECT order_id, user_id, sku, qty, amount_cents, balance_cents \
         FROM orders_orders WHERE tenant = $1 ORDER BY order_id",
    )
    .bind(tenant)
    .fetch_all(pool)
    .await
    .expect("the orders")
    .into_iter()
    .map(|row| OrderRow {
        order_id: row.get(0),
        user: row.get(1),
        sku: row.get(2),
        qty: row.get(3),
        amount_cents: row.get(4),
        balance_cents: row.get(5),
    })
    .collect();
    let mut by_sku: HashMap<&str, Vec<&OrderRow>> = HashMap::new();
    for row in &rows {
        by_sku.entry(row.sku.as_str()).or_default().push(row);
    }
    let payments = payments_of(pool, sent).await;
    let mut verdict = Verdict {
        operations: sent.len(),
        effects: rows.len() + payments.values().map(|p| p.credits.len()).sum::<usize>(),
        ..Verdict::default()
    };
    for (s, again) in sent.iter().zip(resent) {
        let answers: Vec<&Answer> = s.answers.iter().chain([again]).flatten().collect();
        if answers.len() < s.answers.len() + 1 {
            verdict.unanswered += 1;
            verdict.problem(format!("{}: no final answer", s.op.name()));
        }
        match &s.op.kind {
            Kind::Order { sku, .. } => {
                let found = by_sku.remove(sku.as_str()).unwrap_or_default();
                check_order(
                    &mut verdict,
                    tenant,
                    s,
                    &found,
                    &answers,
                    again.as_ref(),
                    may_lose,
                );
            }
            Kind::Payment { payment_no } => {
                check_payment(
                    &mut verdict,
                    s,
                    payments.get(payment_no),
                    &answers,
                    may_lose,
                );
            }
        }
    }
    for (sku, rows) in by_sku {
        verdict.problem(format!(
            "{} order(s) of {sku}, which no operation sent",
            rows.len()
        ));
    }
    verdict.bad_balances = check_balances(pool, tenant, &rows, &mut verdict).await;
    verdict.bad_events = check_events(pool, tenant, &rows, &mut verdict).await;
    verdict
}

/// One order's rows and answers.
fn check_order(
    verdict: &mut Verdict,
    tenant: &str,
    s: &Sent,
    found: &[&OrderRow],
    answers: &[&Answer],
    again: Option<&Answer>,
    may_lose: Option<LossWindow>,
) {
    let name = s.op.name();
    let acknowledged = answers.iter().any(|a| a.status == 201);
    let in_window = |row: Option<&OrderRow>| {
        may_lose.is_some_and(|w| {
            let acknowledged = acknowledgements(answers, |a| {
                a.status == 201 && row.is_none_or(|row| !answer_is(a, row, tenant))
            });
            w.holds(&acknowledged, ORDER_ANSWER_DELAY)
        })
    };
    match found {
        // The gate still held the lost record, and replayed it.
        [] if acknowledged && in_window(None) => {
            verdict.acknowledged_lost += 1;
            verdict.replayed_without_effect += 1;
        }
        [] if acknowledged => {
            verdict.lost += 1;
            let when = may_lose.map_or_else(String::new, |w| {
                let created = acknowledgements(answers, |a| a.status == 201);
                format!(" ({})", w.describe(&created, ORDER_ANSWER_DELAY))
            });
            verdict.problem(format!("{name}: acknowledged, no order{when}"));
        }
        [] => {}
        [row] if lost_with_its_record(answers, row, tenant, again) && in_window(Some(row)) => {
            verdict.acknowledged_lost += 1;
        }
        [row] => {
            for answer in answers {
                if !answer_is(answer, row, tenant) {
                    verdict.wrong_answers += 1;
                    verdict.problem(format!("{name}: answered {answer:?}, stored {row:?}"));
                }
            }
            // One attempt ran the operation; every other answer is its
            // replay, the re-send's included.
            let fresh = answers.iter().filter(|a| !a.replayed).count();
            if fresh > 1 || again.is_some_and(|a| !a.replayed) {
                verdict.wrong_answers += 1;
                verdict.problem(format!("{name}: {fresh} answers not replayed"));
            }
        }
        more => {
            verdict.doubles += 1;
            verdict.problem(format!("{name}: {} orders", more.len()));
        }
    }
}

/// An order acknowledged with a 201 that is not the stored one, while the
/// re-send was answered with the stored one: the first
/// effect and its record were lost together (a failover to a standby that
/// lacked their commit), and the re-send ran the operation again. Any
/// other mismatch is a wrong answer.
fn lost_with_its_record(
    answers: &[&Answer],
    row: &OrderRow,
    tenant: &str,
    again: Option<&Answer>,
) -> bool {
    let Some(again) = again else {
        return false;
    };
    let other = |a: &&&Answer| a.status == 201 && !answer_is(a, row, tenant);
    answer_is(again, row, tenant)
        && answers.iter().any(|a| other(&a))
        && answers
            .iter()
            .all(|a| answer_is(a, row, tenant) || other(&a))
}

/// A payment as stored: its state and its ledger credits.
#[derive(Debug, Default)]
struct StoredPayment {
    state: String,
    amount_cents: i64,
    credits: Vec<i64>,
}

/// The payments `sent` names, with their credits.
async fn payments_of(pool: &PgPool, sent: &[Sent]) -> HashMap<String, StoredPayment> {
    let names: Vec<String> = sent
        .iter()
        .filter_map(|s| match &s.op.kind {
            Kind::Payment { payment_no } => Some(payment_no.clone()),
            Kind::Order { .. } => None,
        })
        .collect();
    let mut payments: HashMap<String, StoredPayment> = HashMap::new();
    let rows: Vec<(String, String, i64)> = sqlx::query_as(
        "SELECT payment_no, state, amount_cents FROM orders_payments WHERE payment_no = ANY($1)",
    )
    .bind(&names)
    .fetch_all(pool)
    .await
    .expect("the payments");
    for (payment_no, state, amount_cents) in rows {
        let payment = payments.entry(payment_no).or_default();
        payment.state = state;
        payment.amount_cents = amount_cents;
    }
    let credits: Vec<(String, i64)> = sqlx::query_as(
        "SELECT payment_no, amount_cents FROM orders_ledger WHERE payment_no = ANY($1)",
    )
    .bind(&names)
    .fetch_all(pool)
    .await
    .expect("the ledger");
    for (payment_no, amount) in credits {
        payments.entry(payment_no).or_default().credits.push(amount);
    }
    payments
}

/// One payment's credits and its callbacks' answers.
fn check_payment(
    verdict: &mut Verdict,
    s: &Sent,
    stored: Option<&StoredPayment>,
    answers: &[&Answer],
    may_lose: Option<LossWindow>,
) {
    let name = s.op.name();
    let paid = |a: &Answer| a.status == 200 && a.body["state"] == "PAID";
    let paid_answers = acknowledgements(answers, paid);
    let acknowledged = !paid_answers.is_empty();
    let credits = stored.map_or(&[][..], |p| p.credits.as_slice());
    match credits {
        // The gate still held the lost record, and replayed it.
        [] if acknowledged
            && may_lose.is_some_and(|w| w.holds(&paid_answers, CALLBACK_ANSWER_DELAY)) =>
        {
            verdict.acknowledged_lost += 1;
            verdict.replayed_without_effect += 1;
        }
        [] if acknowledged => {
            verdict.lost += 1;
            let when = may_lose.map_or_else(String::new, |w| {
                format!(" ({})", w.describe(&paid_answers, CALLBACK_ANSWER_DELAY))
            });
            verdict.problem(format!("{name}: a callback answered paid, no credit{when}"));
        }
        // The payment's creation was acknowledged, then lost in the
        // failover: its callback found no payment, and that 404 is final
        // and replayed.
        [] if may_lose.is_some()
            && !answers.is_empty()
            && answers.iter().all(|a| a.status == 404) =>
        {
            verdict.acknowledged_lost += 1;
            verdict.replayed_without_effect += 1;
        }
        [] => {}
        [amount] => {
            let stored = stored.expect("a credit's payment");
            if *amount != s.op.amount_cents
                || stored.state != "PAID"
                || stored.amount_cents != s.op.amount_cents
            {
                verdict.wrong_answers += 1;
                verdict.problem(format!("{name}: stored {stored:?}"));
            }
            for answer in answers {
                let right = paid(answer)
                    && answer.body["credits"] == 1
                    && answer.body["amount_cents"] == s.op.amount_cents;
                if !right {
                    verdict.wrong_answers += 1;
                    verdict.problem(format!("{name}: answered {answer:?}"));
                }
            }
        }
        more => {
            verdict.doubles += 1;
            verdict.problem(format!("{name}: {} credits", more.len()));
        }
    }
}

/// A 201 whose body is `row`.
fn answer_is(answer: &Answer, row: &OrderRow, tenant: &str) -> bool {
    let body = &answer.body;
    answer.status == 201
        && body["order_id"].as_i64() == Some(row.order_id)
        && body["tenant"].as_str() == Some(tenant)
        && body["user"].as_str() == Some(&row.user)
        && body["sku"].as_str() == Some(&row.sku)
        && body["qty"].as_i64() == Some(row.qty)
        && body["amount_cents"].as_i64() == Some(row.amount_cents)
        && body["balance_cents"].as_i64() == Some(row.balance_cents)
}

/// Users whose stored balance is not the start less their orders, or
/// whose orders' balances do not step down one order at a time.
async fn check_balances(
    pool: &PgPool,
    tenant: &str,
    rows: &[OrderRow],
    verdict: &mut Verdict,
) -> usize {
    let balances: Vec<(String, i64)> =
        sqlx::query_as("SELECT user_id, balance_cents FROM orders_balances WHERE tenant = $1")
            .bind(tenant)
            .fetch_all(pool)
            .await
            .expect("the balances");
    let mut bad = 0;
    for (user, balance) in balances {
        let mut mine: Vec<&OrderRow> = rows.iter().filter(|row| row.user == user).collect();
        // Debits of one user serialise on the balance row: sorted by the
        // balance they left, each is the one before less its amount.
        mine.sort_by_key(|row| std::cmp::Reverse(row.balance_cents));
        let mut expected = STARTING_BALANCE_CENTS;
        let mut chained = true;
        for row in &mine {
            expected -= row.amount_cents;
            chained &= row.balance_cents == expected;
        }
        if !chained || balance != expected {
            bad += 1;
            verdict.problem(format!(
                "{user}: balance {balance}, {} orders leave {expected}, chained: {chained}",
                mine.len()
            ));
        }
    }
    bad
}

/// Orders without exactly one `order.created` event in the outbox.
async fn check_events(
    pool: &PgPool,
    tenant: &str,
    rows: &[OrderRow],
    verdict: &mut Verdict,
) -> usize {
    let prefix = format!("order-created:{tenant}:");
    let ids: Vec<String> =
        sqlx::query_scalar("SELECT event_id FROM idem_outbox WHERE event_id LIKE $1")
            .bind(format!("{prefix}%"))
            .fetch_all(pool)
            .await
            .expect("the outbox");
    let mut events: HashMap<String, usize> = HashMap::new();
    for id in ids {
        *events.entry(id).or_default() += 1;
    }
    let mut bad = 0;
    for row in rows {
        let count = events
            .remove(&format!("{prefix}{}", row.order_id))
            .unwrap_or(0);
        if count != 1 {
            bad += 1;
            verdict.problem(format!("order {}: {count} events", row.order_id));
        }
    }
    bad + events.len()
}
