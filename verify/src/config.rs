//! What one run of the checker models: the mode, the clients, the lease and
//! the clock's horizon, the faults the environment may inject and how many
//! of each, and the seeded bug, if any.

use crate::bugs::Bug;
use crate::state::{MAX_CLIENTS, MAX_FINGERPRINTS, MAX_KEYS, MAX_TOKENS, MAX_TRIES};

/// How the route claims its key (ARCHITECTURE.md, "The three layers").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    /// A claim in the store, held by its lease: an in-flight row with an
    /// owner and an expiry, renewed while the handler runs; the handler's
    /// effect is written outside the record, then the record is completed.
    Plain,
    /// A claim held by an open database transaction: the handler's effect
    /// and the completed record commit together, and a crash rolls both
    /// back (PostgreSQL's form: the key's lock is held by the transaction
    /// and the completed row is inserted at commit).
    Transactional,
}

/// A client: one operation, sent under one key with one fingerprint, and
/// retried with the same key and fingerprint until it gets a final answer
/// or runs out of tries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ClientSpec {
    /// The idempotency key, `0..keys`.
    pub key: u8,
    /// The request's fingerprint: two clients of one key with different
    /// fingerprints are a key reused for another request.
    pub fingerprint: u8,
    /// How many attempts the client may send in all. A retry may go out
    /// while an earlier attempt still runs (the client's attempt timeout).
    pub tries: u8,
}

/// How many faults of each kind the environment may inject in one run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Faults {
    /// Process crashes (`kill -9`, then a restart with nothing in memory).
    pub crashes: u8,
    /// Keys Redis forgets (eviction, a failover to a replica that missed
    /// the write, a restart without persistence).
    pub redis_losses: u8,
    /// Redis commands that fail or time out, so the gate degrades to SQL;
    /// a failed `SET NX` may have run in Redis all the same.
    pub redis_errors: u8,
    /// Handlers that fail (a 5xx, an error, a panic): no effect, and the
    /// claim is let go so the client may retry.
    pub handler_failures: u8,
    /// Ticks of the clock past the lease of a live plain claim: a process
    /// paused, or its renewals starved, for a whole lease
    /// (docs/leases-and-crashes.md, "A handler can still outlive its lease"). Without stalls a live owner's
    /// renewals land in time.
    pub stalls: u8,
}

/// The model: the configuration of one checked system. The checker's state
/// is [`State`](crate::State); its transitions are
/// [`Action`](crate::Action)s.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct IdemModel {
    /// Plain or transactional claims, for every attempt of the run.
    pub mode: Mode,
    /// The seeded bug, or [`Bug::None`] for the protocol as implemented.
    pub bug: Bug,
    /// How many distinct keys the clients use (1 or 2).
    pub keys: u8,
    /// The clients (at most 3), each with its key, fingerprint and tries.
    pub clients: Vec<ClientSpec>,
    /// A claim's lease, in ticks: claimed at `t`, it runs out once the clock
    /// passes `t + lease`.
    pub lease: u8,
    /// The last tick of the clock: time stops there, which bounds the run.
    pub horizon: u8,
    /// The faults the environment may inject.
    pub faults: Faults,
    /// Whether the handler is made of phases (`idem_core::Phases`): the
    /// order created in a local transaction with its recovery point, then
    /// the charge, its point recorded after it, then the handler's effect.
    pub phases: bool,
}

impl IdemModel {
    /// The base scenario of `mode`, without bugs: one key; a client that
    /// sends its request twice, and a second client reusing the key for
    /// another request, twice; two instances; a lease of one tick and a
    /// clock of two; one crash, one key lost by Redis and one failing
    /// handler.
    pub fn new(mode: Mode) -> Self {
        Self {
            mode,
            bug: Bug::None,
            keys: 1,
            clients: vec![
                ClientSpec {
                    key: 0,
                    fingerprint: 0,
                    tries: 2,
                },
                ClientSpec {
                    key: 0,
                    fingerprint: 1,
                    tries: 2,
                },
            ],
            lease: 1,
            horizon: 2,
            faults: Faults {
                crashes: 1,
                redis_losses: 1,
                redis_errors: 0,
                handler_failures: 1,
                stalls: 0,
            },
            phases: false,
        }
    }

    /// This model with a phased handler ([`IdemModel::phases`]).
    #[must_use]
    pub fn with_phases(mut self) -> Self {
        self.phases = true;
        self
    }

    /// This model with `bug` seeded.
    #[must_use]
    pub fn with_bug(mut self, bug: Bug) -> Self {
        self.bug = bug;
        self
    }

    /// This model with these fault budgets.
    #[must_use]
    pub fn with_faults(mut self, faults: Faults) -> Self {
        self.faults = faults;
        self
    }

    /// This model with these clients over `keys` keys.
    #[must_use]
    pub fn with_clients(mut self, keys: u8, clients: Vec<ClientSpec>) -> Self {
        self.keys = keys;
        self.clients = clients;
        self
    }

    /// The configuration's bounds, checked before a run: the state holds
    /// fixed-size arrays, and owner tokens are bits of a 16-bit set.
    pub(crate) fn validate(&self) {
        assert!(
            (1..=MAX_KEYS as u8).contains(&self.keys),
            "1 to {MAX_KEYS} keys"
        );
        assert!(
            !self.clients.is_empty() && self.clients.len() <= MAX_CLIENTS,
            "1 to {MAX_CLIENTS} clients"
        );
        for client in &self.clients {
            assert!(client.key < self.keys, "a client's key is one of the keys");
            assert!(
                (1..=MAX_TRIES as u8).contains(&client.tries),
                "1 to {MAX_TRIES} tries"
            );
        }
        let attempts: usize = self.clients.iter().map(|c| usize::from(c.tries)).sum();
        assert!(
            attempts <= MAX_TOKENS,
            "at most {MAX_TOKENS} attempts in all"
        );
        assert!(self.lease >= 1, "a lease of at least one tick");
        assert!(
            !self.phases
                || self
                    .clients
                    .iter()
                    .all(|c| usize::from(c.fingerprint) < MAX_FINGERPRINTS),
            "a phased model's fingerprints are below {MAX_FINGERPRINTS}"
        );
    }
}
