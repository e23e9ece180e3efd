//! When a failover may lose acknowledged commits (asynchronous
//! replication), and whether an operation's acknowledgements are those of
//! a commit lost in it: the fault suite's checker counts such an operation
//! apart, as what asynchronous replication allows, not as lost.
//!
//! The window opens where the standby's received WAL ends and closes at
//! the primary's crash. A client sees when an answer arrived, not when its
//! commit was made, so each route says how long its answer can follow its
//! commit (`delay`): the window holds acknowledgements up to the crash plus
//! that delay.
//!
//! ```
//! use std::time::{Duration, Instant};
//! use idem_test_support::loss_window::{Acknowledgement, LossWindow};
//!
//! let from = Instant::now();
//! let window = LossWindow { from, crashed: from + Duration::from_secs(2) };
//! let late = Acknowledgement { at: from + Duration::from_secs(5), replayed: false };
//! assert!(window.holds(&[late], Duration::from_secs(10)));
//! assert!(!window.holds(&[late], Duration::from_secs(1)));
//! ```

use std::time::{Duration, Instant};

/// From the last moment the standby had the primary's WAL to the primary's
/// crash.
#[derive(Debug, Clone, Copy)]
pub struct LossWindow {
    /// Where the standby's received WAL ends: a commit acknowledged before
    /// it is on the standby.
    pub from: Instant,
    /// When the primary crashed: nothing was committed on it after.
    pub crashed: Instant,
}

/// One answer that acknowledged an operation's effect.
#[derive(Debug, Clone, Copy)]
pub struct Acknowledgement {
    /// When the client read it.
    pub at: Instant,
    /// Whether it was a replay of a stored answer.
    pub replayed: bool,
}

impl LossWindow {
    /// Where the window ends for a route whose answers can follow their
    /// commit by up to `delay`.
    pub fn closes(&self, delay: Duration) -> Instant {
        self.crashed + delay
    }

    /// Whether `acknowledgements` are those of a run lost in the window,
    /// for a route whose answers can follow their commit by up to `delay`:
    /// the first came within the window (later ones may be the gate's
    /// replays of the lost record), or every one is such a replay, the
    /// first after the window opened (the run's own answer went down with
    /// the primary, and its client, retrying, met the gate's record after
    /// the failover). None holds nothing.
    pub fn holds(&self, acknowledgements: &[Acknowledgement], delay: Duration) -> bool {
        let Some(first) = acknowledgements.iter().map(|a| a.at).min() else {
            return false;
        };
        self.from <= first
            && (first <= self.closes(delay) || acknowledgements.iter().all(|a| a.replayed))
    }

    /// When each acknowledgement came, from the window's start, whether it
    /// was a replay, and where the window ends: what a run the window did
    /// not hold needs to be diagnosed from the suite's report alone.
    pub fn describe(&self, acknowledgements: &[Acknowledgement], delay: Duration) -> String {
        let since_from = |at: Instant| match at.checked_duration_since(self.from) {
            Some(after) => format!("+{:.3} s", after.as_secs_f64()),
            None => format!("-{:.3} s", (self.from - at).as_secs_f64()),
        };
        let each: Vec<String> = acknowledgements
            .iter()
            .map(|a| {
                let replayed = if a.replayed { ", replayed" } else { "" };
                format!("{}{replayed}", since_from(a.at))
            })
            .collect();
        format!(
            "acknowledged at {} from the window's start; the window ends at {}",
            each.join(", "),
            since_from(self.closes(delay))
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DELAY: Duration = Duration::from_secs(1);

    fn window() -> (LossWindow, Instant) {
        let from = Instant::now();
        let window = LossWindow {
            from,
            crashed: from + Duration::from_secs(2),
        };
        (window, from)
    }

    fn at(from: Instant, millis: u64, replayed: bool) -> Acknowledgement {
        Acknowledgement {
            at: from + Duration::from_millis(millis),
            replayed,
        }
    }

    #[test]
    fn a_fresh_answer_up_to_the_crash_plus_the_delay_is_held() {
        let (window, from) = window();
        assert!(window.holds(&[at(from, 0, false)], DELAY));
        assert!(window.holds(&[at(from, 3_000, false)], DELAY));
        assert!(!window.holds(&[at(from, 3_001, false)], DELAY));
        assert!(window.holds(&[at(from, 3_001, false)], 2 * DELAY));
    }

    #[test]
    fn an_answer_before_the_window_opened_is_never_held() {
        let (window, from) = window();
        let before = Acknowledgement {
            at: from - Duration::from_millis(1),
            replayed: true,
        };
        assert!(!window.holds(&[before], DELAY));
        assert!(!window.holds(&[before, at(from, 100, false)], DELAY));
    }

    #[test]
    fn replays_alone_are_held_after_the_window_closed() {
        let (window, from) = window();
        assert!(window.holds(&[at(from, 9_000, true), at(from, 12_000, true)], DELAY));
        assert!(!window.holds(&[at(from, 9_000, true), at(from, 12_000, false)], DELAY));
    }

    #[test]
    fn no_acknowledgement_holds_nothing() {
        let (window, _) = window();
        assert!(!window.holds(&[], DELAY));
    }

    #[test]
    fn the_description_counts_from_the_window_start() {
        let (window, from) = window();
        let said = window.describe(&[at(from, 5_489, false), at(from, 6_000, true)], DELAY);
        assert_eq!(
            said,
            "acknowledged at +5.489 s, +6.000 s, replayed from the window's start; \
             the window ends at +3.000 s"
        );
    }
}
