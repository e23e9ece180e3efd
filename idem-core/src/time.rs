//! Durations as the whole milliseconds that the databases and Redis take.

use std::time::Duration;

/// The longest a record is kept or a claim leased: a century, "forever"
/// for a record, and within what every backend takes. A longer lease or
/// ttl (`Duration::MAX`, meant as forever) is taken as this: Redis refuses
/// an expiry past `i64::MAX` milliseconds from now, PostgreSQL's
/// timestamps end in the year 294276, MySQL's `DATETIME` in 9999, and an
/// `Instant` that far ahead overflows.
pub const LONGEST_EXPIRY: Duration = Duration::from_secs(100 * 365 * 24 * 60 * 60);

/// `d` in whole milliseconds, at least 1 and at most [`LONGEST_EXPIRY`]'s:
/// how a lease or a ttl is sent to a backend (a database interval, Redis's
/// `PX` and `PEXPIRE`), so none is ever 0, which would mean "already
/// expired", nor past what the backend takes.
///
/// ```
/// use std::time::Duration;
/// use idem_core::{LONGEST_EXPIRY, expiry_millis};
///
/// assert_eq!(expiry_millis(Duration::from_secs(30)), 30_000);
/// assert_eq!(expiry_millis(Duration::from_micros(10)), 1);
/// assert_eq!(expiry_millis(Duration::MAX), expiry_millis(LONGEST_EXPIRY));
/// ```
pub fn expiry_millis(d: Duration) -> i64 {
    i64::try_from(d.min(LONGEST_EXPIRY).as_millis())
        .unwrap_or(i64::MAX)
        .max(1)
}

/// `now + d`, `d` taken as at most [`LONGEST_EXPIRY`]: when a lease, a
/// ttl, a wait or a deadline of `d` that starts `now` ends, on any clock
/// (`std`'s `Instant` or tokio's), without the overflow (a panic) of a
/// duration meant as forever.
///
/// ```
/// use std::time::{Duration, Instant};
/// use idem_core::{LONGEST_EXPIRY, expiry_after};
///
/// let now = Instant::now();
/// assert_eq!(expiry_after(now, Duration::from_secs(1)), now + Duration::from_secs(1));
/// assert_eq!(expiry_after(now, Duration::MAX), now + LONGEST_EXPIRY);
/// ```
pub fn expiry_after<I: std::ops::Add<Duration, Output = I>>(now: I, d: Duration) -> I {
    now + d.min(LONGEST_EXPIRY)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_milliseconds_at_least_one_saturating() {
        assert_eq!(expiry_millis(Duration::ZERO), 1);
        assert_eq!(expiry_millis(Duration::from_micros(1_999)), 1);
        assert_eq!(expiry_millis(Duration::from_secs(30)), 30_000);
        assert_eq!(
            expiry_millis(Duration::MAX),
            i64::try_from(LONGEST_EXPIRY.as_millis()).unwrap()
        );
    }

    #[test]
    fn an_instant_a_forever_away_does_not_overflow() {
        let now = std::time::Instant::now();
        assert_eq!(expiry_after(now, Duration::MAX), now + LONGEST_EXPIRY);
        assert_eq!(
            expiry_after(now, Duration::from_secs(1)),
            now + Duration::from_secs(1)
        );
    }
}
