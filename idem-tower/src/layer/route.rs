//! Matching a request path against a route pattern, for services that are
//! not behind an axum router.

use std::sync::Arc;

/// A route pattern such as `/payments/{payment_no}/callback` or
/// `/files/{*path}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RoutePattern {
    /// Shared: each request's metrics label is this, not a copy.
    pattern: Arc<str>,
}

impl RoutePattern {
    pub(crate) fn new(pattern: &str) -> Self {
        Self {
            pattern: Arc::from(pattern),
        }
    }

    /// The pattern, as a request's route label.
    pub(crate) fn shared(&self) -> Arc<str> {
        Arc::clone(&self.pattern)
    }

    /// The parameters of `path` under this pattern (percent-decoded), or
    /// `None` if it does not match.
    pub(crate) fn captures(&self, path: &str) -> Option<Vec<(String, String)>> {
        let mut params = Vec::new();
        let mut segments = path.trim_start_matches('/').split('/');
        let mut parts = self.pattern.trim_start_matches('/').split('/');
        loop {
            match (parts.next(), segments.next()) {
                (None, None) => return Some(params),
                (Some(part), Some(segment)) => {
                    if let Some(name) = part.strip_prefix("{*").and_then(|p| p.strip_suffix('}')) {
                        let rest: Vec<&str> = std::iter::once(segment).chain(segments).collect();
                        params.push((name.to_owned(), decode(&rest.join("/"))?));
                        return Some(params);
                    }
                    match part.strip_prefix('{').and_then(|p| p.strip_suffix('}')) {
                        Some(name) => params.push((name.to_owned(), decode(segment)?)),
                        None if part == segment => {}
                        None => return None,
                    }
                }
                _ => return None,
            }
        }
    }
}

fn decode(segment: &str) -> Option<String> {
    percent_encoding::percent_decode_str(segment)
        .decode_utf8()
        .ok()
        .map(|s| s.into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn captures_named_and_wildcard_segments() {
        let p = RoutePattern::new("/payments/{payment_no}/callback");
        assert_eq!(
            p.captures("/payments/P%2D1/callback"),
            Some(vec![("payment_no".into(), "P-1".into())])
        );
        assert_eq!(p.captures("/payments/P1"), None);
        assert_eq!(p.captures("/payments/P1/callback/x"), None);
        assert_eq!(p.captures("/orders/P1/callback"), None);
        let w = RoutePattern::new("/files/{*path}");
        assert_eq!(
            w.captures("/files/a/b"),
            Some(vec![("path".into(), "a/b".into())])
        );
    }
}
