//! The `order.created` event: what `POST /orders` enqueues in idem's
//! transactional outbox on the SQL databases, in the same transaction as
//! the order row, the balance debit and the idempotency record, so the
//! event exists if and only if the order committed. The `relay` binary
//! publishes it to NATS JetStream on [`ORDER_CREATED_SUBJECT`]; the
//! `consumer` binary (`--feed orders`) books its loyalty points once.
//!
//! - id: `order-created:{tenant}:{order_id}` ([`event_id`]), derived from
//!   the order, so enqueueing it twice is a no-op; the relay publishes it as
//!   `Nats-Msg-Id`, and the consumer's inbox takes it as the message id;
//! - key: `{tenant}:{user}`, so one user's events are published in order.
//!   The balance debit locks the user's balance row until the commit, so a
//!   user's orders commit one at a time, in `order_id` order, and their
//!   events are enqueued in that order too;
//! - payload: [`OrderCreated`] as JSON.
//!
//! The memory database has no outbox: orders placed on it publish nothing.

use idem_tower::core::Error;
use idem_tower::guards::Event;
use serde::{Deserialize, Serialize};

use super::model::Order;

/// The NATS subject `order.created` events are published to (the outbox
/// event's topic). The relay creates a stream capturing it if missing.
pub const ORDER_CREATED_SUBJECT: &str = "orders.created";

/// The JetStream stream the relay creates for [`ORDER_CREATED_SUBJECT`]
/// unless told another.
pub const ORDERS_STREAM: &str = "ORDERS";

/// The payload of an `order.created` event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrderCreated {
    /// The order.
    pub order_id: u64,
    /// Its tenant.
    pub tenant: String,
    /// The user who placed it.
    pub user: String,
    /// What was debited.
    pub amount_cents: i64,
}

/// The id of the `order.created` event of `order_id` of `tenant`.
pub fn event_id(tenant: &str, order_id: u64) -> String {
    format!("order-created:{tenant}:{order_id}")
}

/// The outbox event reporting that `order` was placed.
pub fn order_created(order: &Order) -> Result<Event, Error> {
    let payload = OrderCreated {
        order_id: order.order_id,
        tenant: order.tenant.clone(),
        user: order.user.clone(),
        amount_cents: order.amount_cents,
    };
    let json = serde_json::to_vec(&payload).expect("plain fields serialise");
    Event::new(
        ORDER_CREATED_SUBJECT,
        format!("{}:{}", order.tenant, order.user),
        json,
    )?
    .with_id(event_id(&order.tenant, order.order_id))
}
