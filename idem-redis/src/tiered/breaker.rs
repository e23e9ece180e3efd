//! A circuit breaker for the Redis gate: after a few consecutive failures it
//! opens and requests skip the gate; after a pause one request probes it
//! (half-open), and a success closes it again, without a restart.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
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
    Closed {
        failures: u32,
    },
    Open {
        until: Instant,
    },
    /// `probe` is the id of the probe running, if one is.
    HalfOpen {
        probe: Option<u64>,
    },
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
    /// Ids for probes, so that a probe's end never touches a later one.
    probes: AtomicU64,
    threshold: u32,
    pause: Duration,
}

/// Leave to use the gate once, from [`Breaker::allow`]: settled with
/// [`success`](Self::success) or [`failure`](Self::failure). A probe dropped
/// unsettled (the future running it was dropped: a caller's timeout, a lease
/// renewal cut short) hands its turn to the next request, which probes.
#[must_use = "settle the permit with success or failure"]
#[derive(Debug)]
pub(crate) struct Permit<'a> {
    breaker: &'a Breaker,
    /// The probe's id, while unsettled; `None` if the breaker was closed.
    probe: Option<u64>,
}

impl Permit<'_> {
    /// The gate answered.
    pub(crate) fn success(mut self) -> Transition {
        self.probe = None;
        self.breaker.success()
    }

    /// The gate failed or timed out.
    pub(crate) fn failure(mut self, now: Instant) -> Transition {
        self.probe = None;
        self.breaker.failure(now)
    }
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        let Some(id) = self.probe else { return };
        let mut state = self.breaker.state();
        // Only if this probe is still the one running: by now the breaker may
        // have moved on, and be waiting on a later probe.
        if matches!(*state, State::HalfOpen { probe: Some(running) } if running == id) {
            *state = State::HalfOpen { probe: None };
        }
    }
}

impl Breaker {
    pub(crate) fn new(threshold: u32, pause: Duration) -> Self {
        Self {
            state: Mutex::new(State::Closed { failures: 0 }),
            probes: AtomicU64::new(0),
            threshold: threshold.max(1),
            // A pause meant as forever (`Duration::MAX`) is a century: no
            // overflow when it is added to the time the breaker opens.
            pause: pause.min(idem_core::LONGEST_EXPIRY),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding this lock cannot leave the state invalid.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Leave for this request to use the gate, or `None` if it is to skip
    /// it. While half-open, only one request at a time gets through, as the
    /// probe.
    pub(crate) fn allow(&self, now: Instant) -> Option<Permit<'_>> {
        let mut state = self.state();
        let probe = match *state {
            State::Closed { .. } => None,
            State::Open { until } if now >= until => Some(self.start_probe(&mut state)),
            State::HalfOpen { probe: None } => Some(self.start_probe(&mut state)),
            State::Open { .. } | State::HalfOpen { probe: Some(_) } => return None,
        };
        Some(Permit {
            breaker: self,
            probe,
        })
    }

    /// Marks a new probe running, and returns its id.
    fn start_probe(&self, state: &mut State) -> u64 {
        let id = self.probes.fetch_add(1, Ordering::Relaxed);
        *state = State::HalfOpen { probe: Some(id) };
        id
    }

    fn success(&self) -> Transition {
        let mut state = self.state();
        let recovered = matches!(*state, State::HalfOpen { .. });
        *state = State::Closed { failures: 0 };
        if recovered {
            Transition::Recovered
        } else {
            Transition::None
        }
    }

    fn failure(&self, now: Instant) -> Transition {
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

    /// One use of the gate that fails.
    fn fail(breaker: &Breaker, now: Instant) -> Transition {
        breaker.allow(now).expect("allowed").failure(now)
    }

    #[test]
    fn opens_after_the_threshold_and_recovers_through_one_probe() {
        let breaker = Breaker::new(3, Duration::from_secs(1));
        let t0 = Instant::now();
        assert_eq!(fail(&breaker, t0), Transition::None);
        assert_eq!(fail(&breaker, t0), Transition::None);
        assert_eq!(fail(&breaker, t0), Transition::Opened);
        assert_eq!(breaker.current(), BreakerState::Open);
        assert!(breaker.allow(t0 + Duration::from_millis(500)).is_none());

        let later = t0 + Duration::from_secs(1);
        let probe = breaker.allow(later).expect("the probe");
        assert!(breaker.allow(later).is_none(), "only one probe at a time");
        assert_eq!(breaker.current(), BreakerState::HalfOpen);
        assert_eq!(probe.success(), Transition::Recovered);
        assert_eq!(breaker.current(), BreakerState::Closed);
        assert!(breaker.allow(later).is_some());
    }

    #[test]
    fn a_failed_probe_opens_again() {
        let breaker = Breaker::new(1, Duration::from_secs(1));
        let t0 = Instant::now();
        assert_eq!(fail(&breaker, t0), Transition::Opened);
        let later = t0 + Duration::from_secs(1);
        assert_eq!(fail(&breaker, later), Transition::Opened);
        assert!(breaker.allow(later).is_none());
    }

    #[test]
    fn a_success_resets_the_failure_count() {
        let breaker = Breaker::new(2, Duration::from_secs(1));
        let t0 = Instant::now();
        fail(&breaker, t0);
        breaker.allow(t0).expect("closed").success();
        assert_eq!(fail(&breaker, t0), Transition::None);
        assert_eq!(breaker.current(), BreakerState::Closed);
    }

    #[test]
    fn a_pause_meant_as_forever_opens_without_overflow() {
        let breaker = Breaker::new(1, Duration::MAX);
        let t0 = Instant::now();
        assert_eq!(fail(&breaker, t0), Transition::Opened);
        assert!(breaker.allow(t0 + Duration::from_secs(3600)).is_none());
    }

    /// The future running the probe was dropped (a caller's timeout, a lease
    /// renewal cut short): the next request probes, rather than the breaker
    /// staying half-open with a probe "running" until a restart.
    #[test]
    fn a_probe_dropped_unsettled_lets_the_next_request_probe() {
        let breaker = Breaker::new(1, Duration::from_secs(1));
        let t0 = Instant::now();
        fail(&breaker, t0);
        let later = t0 + Duration::from_secs(1);
        drop(breaker.allow(later).expect("the probe"));
        assert_eq!(breaker.current(), BreakerState::HalfOpen);
        let probe = breaker.allow(later).expect("the next request probes");
        assert_eq!(probe.success(), Transition::Recovered);
        assert_eq!(breaker.current(), BreakerState::Closed);
    }

    /// An old probe dropped late, after the breaker moved on to a newer
    /// probe, leaves that one running: still one probe at a time.
    #[test]
    fn an_old_probes_drop_does_not_clear_a_newer_probe() {
        let breaker = Breaker::new(1, Duration::from_secs(1));
        let t0 = Instant::now();
        // A use from while the breaker was closed, still running.
        let closed = breaker.allow(t0).expect("closed");
        fail(&breaker, t0);
        let t1 = t0 + Duration::from_secs(1);
        let old = breaker.allow(t1).expect("the first probe");
        // The older use answers (closing the breaker), and the gate fails
        // again: open, then a newer probe.
        assert_eq!(closed.success(), Transition::Recovered);
        fail(&breaker, t1);
        let t2 = t1 + Duration::from_secs(1);
        let newer = breaker.allow(t2).expect("the newer probe");

        drop(old);
        assert!(
            breaker.allow(t2).is_none(),
            "the newer probe is still the one running"
        );
        assert_eq!(newer.success(), Transition::Recovered);
    }
}
