//! Where the tenant and the user of a request come from.

use std::fmt;
use std::sync::Arc;

use http::HeaderName;
use http::request::Parts;

type ResolveFn = dyn Fn(&Parts) -> Option<String> + Send + Sync;

/// Finds the tenant or the user of a request, for the `{tenant}` and `{user}`
/// placeholders of key templates.
///
/// Prefer [`Resolver::extension`]: a value your authentication middleware
/// put there after checking credentials. [`Resolver::header`] trusts the
/// client, which is only right behind a gateway that sets the header itself.
///
/// ```
/// use idem_tower::Resolver;
///
/// #[derive(Clone)]
/// struct UserId(String);
/// impl std::fmt::Display for UserId {
///     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { f.write_str(&self.0) }
/// }
///
/// let tenant = Resolver::header("x-tenant-id");
/// let user = Resolver::extension::<UserId>();
/// let custom = Resolver::from_fn(|parts| parts.uri.host().map(str::to_owned));
/// # let _ = (tenant, user, custom);
/// ```
#[derive(Clone)]
pub struct Resolver {
    describe: Arc<str>,
    resolve: Arc<ResolveFn>,
}

impl Resolver {
    /// The value of a request header (the first, if repeated).
    ///
    /// # Panics
    ///
    /// If `name` is not a valid header name; it is a constant in practice.
    pub fn header(name: &str) -> Self {
        let name = HeaderName::from_bytes(name.as_bytes()).expect("a valid header name");
        Self {
            describe: format!("header {name}").into(),
            resolve: Arc::new(move |parts: &Parts| {
                let mut values = parts.headers.get_all(&name).iter();
                let value = values.next()?;
                // Ambiguous identity is no identity.
                if values.next().is_some() {
                    return None;
                }
                value.to_str().ok().map(str::to_owned)
            }),
        }
    }

    /// A request extension of type `T`, formatted with `Display`.
    pub fn extension<T: fmt::Display + Send + Sync + 'static>() -> Self {
        Self {
            describe: format!("extension {}", std::any::type_name::<T>()).into(),
            resolve: Arc::new(|parts: &Parts| parts.extensions.get::<T>().map(T::to_string)),
        }
    }

    /// Any function of the request head.
    pub fn from_fn(f: impl Fn(&Parts) -> Option<String> + Send + Sync + 'static) -> Self {
        Self {
            describe: "function".into(),
            resolve: Arc::new(f),
        }
    }

    pub(crate) fn resolve(&self, parts: &Parts) -> Option<String> {
        (self.resolve)(parts)
    }
}

impl fmt::Debug for Resolver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Resolver").field(&self.describe).finish()
    }
}
