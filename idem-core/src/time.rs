//! Durations as the whole milliseconds that the databases and Redis take.

use std::time::Duration;

/// `d` in whole milliseconds, at least 1 and at most `i64::MAX`: how a
/// lease or a ttl is sent to a backend (a database interval, Redis's `PX`
/// and `PEXPIRE`), so none is ever 0, which would mean "already expired".
///
/// ```
/// use std::time::Duration;
/// use idem_core::expiry_millis;
///
/// assert_eq!(expiry_millis(Duration::from_secs(30)), 30_000);
/// assert_eq!(expiry_millis(Duration::from_micros(10)), 1);
/// ```
pub fn expiry_millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_milliseconds_at_least_one_saturating() {
        assert_eq!(expiry_millis(Duration::ZERO), 1);
        assert_eq!(expiry_millis(Duration::from_micros(1_999)), 1);
        assert_eq!(expiry_millis(Duration::from_secs(30)), 30_000);
        assert_eq!(expiry_millis(Duration::MAX), i64::MAX);
    }
}
