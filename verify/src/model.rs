//! The transitions: what may happen next in a state (clients sending,
//! instances stepping, faults, the clock), as a stateright [`Model`].

use stateright::{Model, Property};

use crate::config::{IdemModel, Mode};
use crate::properties;
use crate::state::{Attempt, Record, State, Step};

/// One transition of the system.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// `client` sends an attempt, which the idle `instance` takes up with a
    /// fresh owner token.
    Serve {
        /// The instance.
        instance: u8,
        /// The client.
        client: u8,
    },
    /// The instance takes its attempt's next step.
    Step(u8),
    /// The Redis command of the instance's next step fails; `landed`: a
    /// `SET NX` that ran in Redis all the same.
    RedisError {
        /// The instance.
        instance: u8,
        /// Whether the command ran although it failed for the caller.
        landed: bool,
    },
    /// The instance's handler fails, with no effect.
    HandlerFails(u8),
    /// The instance's plain claim is renewed while its handler runs.
    Renew(u8),
    /// The instance crashes and restarts empty.
    Crash(u8),
    /// The clock ticks.
    Tick,
    /// Redis loses the key.
    LoseKey(u8),
}

impl Model for IdemModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        self.validate();
        vec![State::default()]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        let faults = self.faults;
        let used = state.used;
        for (i, slot) in state.instances.iter().enumerate() {
            let instance = i as u8;
            let Some(attempt) = slot else {
                for (c, spec) in self.clients.iter().enumerate() {
                    let client = &state.clients[c];
                    if !client.done() && client.sent < spec.tries {
                        actions.push(Action::Serve {
                            instance,
                            client: c as u8,
                        });
                    }
                }
                continue;
            };
            actions.push(Action::Step(instance));
            if used.redis_errors < faults.redis_errors {
                match attempt.step {
                    Step::GateClaim => {
                        actions.push(Action::RedisError {
                            instance,
                            landed: false,
                        });
                        actions.push(Action::RedisError {
                            instance,
                            landed: true,
                        });
                    }
                    Step::GateWrite(..) => actions.push(Action::RedisError {
                        instance,
                        landed: false,
                    }),
                    _ => {}
                }
            }
            if attempt.step.in_handler() {
                // A handler fails before a phase's commit or in its call
                // out: nothing of that phase is kept.
                let may_fail = matches!(attempt.step, Step::Handler | Step::Charge);
                if may_fail && used.handler_failures < faults.handler_failures {
                    actions.push(Action::HandlerFails(instance));
                }
                if self.renewable(state, *attempt) {
                    actions.push(Action::Renew(instance));
                }
            }
            if used.crashes < faults.crashes {
                actions.push(Action::Crash(instance));
            }
        }
        if state.now < self.horizon
            && (self.overrun(state).is_none() || used.stalls < faults.stalls)
        {
            actions.push(Action::Tick);
        }
        if used.redis_losses < faults.redis_losses {
            for k in 0..self.keys {
                if state.keys[usize::from(k)].gate.is_some() {
                    actions.push(Action::LoseKey(k));
                }
            }
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut state = *last;
        match action {
            Action::Serve { instance, client } => {
                state.instances[usize::from(instance)] = Some(Attempt {
                    client,
                    token: state.next_token,
                    step: Step::GateClaim,
                });
                state.next_token += 1;
                state.clients[usize::from(client)].sent += 1;
            }
            Action::Step(i) => self.step(&mut state, usize::from(i)),
            Action::RedisError { instance, landed } => {
                self.gate_error(&mut state, usize::from(instance), landed);
            }
            Action::HandlerFails(i) => self.handler_fails(&mut state, usize::from(i)),
            Action::Renew(i) => self.renew(&mut state, usize::from(i)),
            Action::Crash(i) => self.crash(&mut state, usize::from(i)),
            Action::Tick => {
                if let Some(keys) = self.overrun(&state) {
                    state.used.stalls += 1;
                    state.ghost.abandoned |= keys;
                }
                state.now += 1;
                // Redis's expiry: a gate record whose lease ran out is gone.
                for key in &mut state.keys {
                    if key.gate.is_some_and(|record| !record.live(state.now)) {
                        key.gate = None;
                    }
                }
            }
            Action::LoseKey(k) => {
                state.keys[usize::from(k)].gate = None;
                state.used.redis_losses += 1;
                state.ghost.lost |= 1 << k;
            }
        }
        Some(state)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        properties::of(self)
    }
}

impl IdemModel {
    /// Whether renewing `attempt`'s plain claim now would change anything:
    /// its row is still its own, its lease has not run out, and it would
    /// end later.
    fn renewable(&self, state: &State, attempt: Attempt) -> bool {
        if self.mode != Mode::Plain {
            return false;
        }
        let k = usize::from(self.clients[usize::from(attempt.client)].key);
        matches!(
            state.keys[k].sql,
            Some(Record::InFlight { owner, expires, .. })
                if owner == attempt.token && state.now <= expires && expires < state.now + self.lease
        )
    }
}
