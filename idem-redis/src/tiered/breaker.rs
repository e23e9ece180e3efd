//! A circuit breaker for the Redis gate: after a few consecutive failures it
//! opens and requests skip the gate; after a pause one request probes it
//! (half-open), and a success closes it again, without a restart.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Where the breaker stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    /// The gate is used.
    Closed,
    /// The gate is skipped until the pause ends.
    Open,
    /// One probe is allowed through; its result decides.
    HalfOpen,
}

#[derive(Debug)]
enum State {
    Closed { failures: u32 },
    Open { until: Instant },
    HalfOpen { probing: bool },
}

/// What happened on the last transition, for the counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Transition {
    None,
    Opened,
    Recovered,
}

#[derive(Debug)]
pub(crate) struct Breaker {
    state: Mutex<State>,
    threshold: u32,
    pause: Duration,
}

impl Breaker {
    pub(crate) fn new(threshold: u32, pause: Duration) -> Self {
        Self {
            state: Mutex::new(State::Closed { failures: 0 }),
            threshold: threshold.max(1),
            pause,
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding this lock cannot leave the state invalid.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Whether this request may use the gate. While half-open, only one
    /// request at a time gets through as the probe.
    pub(crate) fn allow(&self, now: Instant) -> bool {
        let mut state = self.state();
        match *state {
            State::Closed { .. } => true,
            State::Open { until } if now >= until => {
                *state = State::HalfOpen { probing: true };
                true
            }
            State::Open { .. } => false,
            State::HalfOpen { probing: true } => false,
            State::HalfOpen { probing: false } => {
                *state = State::HalfOpen { probing: true };
                true
            }
        }
    }

    pub(crate) fn success(&self) -> Transition {
        let mut state = self.state();
        let recovered = matches!(*state, State::HalfOpen { .. });
        *state = State::Closed { failures: 0 };
        if recovered {
            Transition::Recovered
        } else {
            Transition::None
        }
    }

    pub(crate) fn failure(&self, now: Instant) -> Transition {
        let mut state = self.state();
        match *state {
            State::Closed { failures } if failures + 1 < self.threshold => {
                *state = State::Closed {
                    failures: failures + 1,
                };
                Transition::None
            }
            State::Closed { .. } | State::HalfOpen { .. } => {
                *state = State::Open {
                    until: now + self.pause,
                };
                Transition::Opened
            }
            State::Open { .. } => Transition::None,
        }
    }

    pub(crate) fn current(&self) -> BreakerState {
        match *self.state() {
            State::Closed { .. } => BreakerState::Closed,
            State::Open { .. } => BreakerState::Open,
            State::HalfOpen { .. } => BreakerState::HalfOpen,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_after_the_threshold_and_recovers_through_one_probe() {
        let breaker = Breaker::new(3, Duration::from_secs(1));
        let t0 = Instant::now();
        assert!(breaker.allow(t0));
        assert_eq!(breaker.failure(t0), Transition::None);
        assert_eq!(breaker.failure(t0), Transition::None);
        assert_eq!(breaker.failure(t0), Transition::Opened);
        assert_eq!(breaker.current(), BreakerState::Open);
        assert!(!breaker.allow(t0 + Duration::from_millis(500)));

        let later = t0 + Duration::from_secs(1);
        assert!(breaker.allow(later), "the probe");
        assert!(!breaker.allow(later), "only one probe at a time");
        assert_eq!(breaker.current(), BreakerState::HalfOpen);
        assert_eq!(breaker.success(), Transition::Recovered);
        assert_eq!(breaker.current(), BreakerState::Closed);
        assert!(breaker.allow(later));
    }

    #[test]
    fn a_failed_probe_opens_again() {
        let breaker = Breaker::new(1, Duration::from_secs(1));
        let t0 = Instant::now();
        assert_eq!(breaker.failure(t0), Transition::Opened);
        let later = t0 + Duration::from_secs(1);
        assert!(breaker.allow(later));
        assert_eq!(breaker.failure(later), Transition::Opened);
        assert!(!breaker.allow(later));
    }

    #[test]
    fn a_success_resets_the_failure_count() {
        let breaker = Breaker::new(2, Duration::from_secs(1));
        let t0 = Instant::now();
        breaker.failure(t0);
        breaker.success();
        assert_eq!(breaker.failure(t0), Transition::None);
        assert_eq!(breaker.current(), BreakerState::Closed);
    }
}
