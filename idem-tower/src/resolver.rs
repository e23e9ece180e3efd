//! Where the tenant and the user of a request come from.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use http::HeaderName;
use http::request::Parts;

/// `Ok(None)`: the request has no value; `Err`: it has one that cannot be
/// used (why, for a 400).
type ResolveFn = dyn Fn(&Parts) -> Result<Option<String>, String> + Send + Sync;

/// A boxed future borrowing the request head.
pub(crate) type ResolveFuture<'a> =
    Pin<Box<dyn Future<Output = Result<Option<String>, Unresolved>> + Send + 'a>>;

type ExtractFn = dyn for<'a> Fn(&'a mut Parts) -> ResolveFuture<'a> + Send + Sync;

/// Why an extractor-backed resolver gave no value.
pub(crate) enum Unresolved {
    /// The extractor refused the request: answer with its rejection, as the
    /// handler would have.
    #[cfg_attr(
        not(feature = "axum"),
        allow(dead_code, reason = "axum extractors only")
    )]
    Rejected(http::Response<bytes::Bytes>),
    /// The resolver needs router state the route does not carry: a wiring
    /// mistake, answered 500.
    #[cfg_attr(
        not(feature = "axum"),
        allow(dead_code, reason = "axum extractors only")
    )]
    Misconfigured(String),
    /// The request carries an identity that cannot be used (a header given
    /// twice, or not visible ASCII): answered 400, never read as no
    /// identity.
    Invalid(String),
}

/// Finds the tenant or the user of a request, for the `{tenant}` and `{user}`
/// placeholders of key templates and for the caller scope every record is
/// bound to (see [`IdempotencyLayer::shared_across_callers`]).
///
/// Prefer the identity your application already trusts: the extractor its
/// handlers authenticate with (`Resolver::from_extractor`, feature `axum`), or a value an
/// authentication middleware put in the request extensions
/// ([`Resolver::extension`]). [`Resolver::header`] trusts the client, which
/// is only right behind a gateway that sets the header itself.
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
///
/// [`IdempotencyLayer::shared_across_callers`]: crate::IdempotencyLayer::shared_across_callers
#[derive(Clone)]
pub struct Resolver {
    describe: Arc<str>,
    kind: Kind,
}

#[derive(Clone)]
enum Kind {
    Sync(Arc<ResolveFn>),
    #[cfg_attr(
        not(feature = "axum"),
        allow(dead_code, reason = "axum extractors only")
    )]
    Extract(Arc<ExtractFn>),
}

impl Resolver {
    /// The value of a request header. A request without the header has no
    /// value: a template naming the placeholder answers it 400, and for the
    /// caller scope it is a caller without one. A request that gives the
    /// header twice, or with anything but visible ASCII, is answered 400
    /// whatever the template says: an ambiguous identity is never read as
    /// another, nor as none.
    ///
    /// # Panics
    ///
    /// If `name` is not a valid header name; it is a constant in practice.
    pub fn header(name: &str) -> Self {
        let name = HeaderName::from_bytes(name.as_bytes()).expect("a valid header name");
        Self {
            describe: format!("header {name}").into(),
            kind: Kind::Sync(Arc::new(move |parts: &Parts| {
                let mut values = parts.headers.get_all(&name).iter();
                let Some(value) = values.next() else {
                    return Ok(None);
                };
                if values.next().is_some() {
                    return Err(format!("the {name} header was given more than once"));
                }
                match value.to_str() {
                    Ok(value) if value.bytes().all(|b| b.is_ascii_graphic()) => {
                        Ok(Some(value.to_owned()))
                    }
                    _ => Err(format!("the {name} header must be visible ASCII")),
                }
            })),
        }
    }

    /// A request extension of type `T`, formatted with `Display`: set by an
    /// authentication middleware that runs before the idempotency layer.
    pub fn extension<T: fmt::Display + Send + Sync + 'static>() -> Self {
        Self::sync(
            format!("extension {}", std::any::type_name::<T>()),
            |parts: &Parts| parts.extensions.get::<T>().map(T::to_string),
        )
    }

    /// Any function of the request head.
    pub fn from_fn(f: impl Fn(&Parts) -> Option<String> + Send + Sync + 'static) -> Self {
        Self::sync("function".into(), f)
    }

    fn sync(
        describe: String,
        f: impl Fn(&Parts) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        Self {
            describe: describe.into(),
            kind: Kind::Sync(Arc::new(move |parts: &Parts| Ok(f(parts)))),
        }
    }

    /// Resolves the request's value. `Err` is for extractor-backed resolvers
    /// only.
    pub(crate) async fn resolve(&self, parts: &mut Parts) -> Result<Option<String>, Unresolved> {
        match &self.kind {
            Kind::Sync(f) => f(parts).map_err(Unresolved::Invalid),
            Kind::Extract(f) => f(parts).await,
        }
    }
}

#[cfg(feature = "axum")]
mod extractor {
    use axum::extract::FromRequestParts;
    use axum::response::IntoResponse;
    use http::request::Parts;
    use http_body_util::BodyExt;

    use super::{Kind, ResolveFuture, Resolver, Unresolved};

    /// The router state a route was given, in the request extensions, for
    /// [`Resolver::from_extractor_with_state`].
    #[derive(Clone)]
    pub(crate) struct RouterState<S>(pub(crate) S);

    impl Resolver {
        /// The value of an axum extractor, the one your handlers already
        /// authenticate with, mapped to a string by `f`.
        ///
        /// It runs before the key is claimed. When it refuses the request,
        /// the client gets the extractor's own rejection (a 401, say) and
        /// nothing is claimed. When the template does not name the
        /// placeholder and the resolver serves only the caller scope, a
        /// refusal means a caller without this identity, and the request
        /// goes on (the handler's own extractor still decides). A handler
        /// that takes the same extractor runs it a second time: if it does
        /// expensive work (a session lookup in the database), cache it in
        /// the request extensions. For an extractor that needs the router
        /// state, use [`Resolver::from_extractor_with_state`].
        ///
        /// ```
        /// use axum::extract::FromRequestParts;
        /// use axum::http::{StatusCode, request::Parts};
        /// use idem_tower::{Idempotency, MemoryStore, Resolver};
        ///
        /// /// The service's own authentication: `Authorization: Bearer <user id>`.
        /// struct CurrentUser { id: String }
        ///
        /// impl<S: Send + Sync> FromRequestParts<S> for CurrentUser {
        ///     type Rejection = StatusCode;
        ///     async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, StatusCode> {
        ///         let header = parts.headers.get("authorization").and_then(|v| v.to_str().ok());
        ///         match header.and_then(|v| v.strip_prefix("Bearer ")) {
        ///             Some(id) => Ok(CurrentUser { id: id.to_owned() }),
        ///             None => Err(StatusCode::UNAUTHORIZED),
        ///         }
        ///     }
        /// }
        ///
        /// let idem = Idempotency::builder(MemoryStore::new())
        ///     .user(Resolver::from_extractor(|user: CurrentUser| user.id))
        ///     .build();
        /// # let _ = idem;
        /// ```
        pub fn from_extractor<E, F>(f: F) -> Self
        where
            E: FromRequestParts<()> + Send + 'static,
            E::Rejection: IntoResponse,
            F: Fn(E) -> String + Send + Sync + 'static,
        {
            let f = std::sync::Arc::new(f);
            Self {
                describe: format!("extractor {}", std::any::type_name::<E>()).into(),
                kind: Kind::Extract(std::sync::Arc::new(move |parts: &mut Parts| {
                    let f = f.clone();
                    Box::pin(async move {
                        let rejection = match E::from_request_parts(parts, &()).await {
                            Ok(value) => return Ok(Some(f(value))),
                            Err(rejection) => rejection.into_response(),
                        };
                        Err(rejected(rejection).await)
                    }) as ResolveFuture<'_>
                })),
            }
        }

        /// Like [`Resolver::from_extractor`], for an extractor that runs on
        /// the router state `S` (one that looks a session up in your
        /// database pool, say).
        ///
        /// The state comes with the request: `#[idempotent]` handlers pass
        /// theirs; a layer added by hand needs
        /// [`IdempotencyLayer::with_state`](crate::IdempotencyLayer::with_state).
        /// A route without a state of type `S` answers 500 and logs why.
        pub fn from_extractor_with_state<S, E, F>(f: F) -> Self
        where
            S: Clone + Send + Sync + 'static,
            E: FromRequestParts<S> + Send + 'static,
            E::Rejection: IntoResponse,
            F: Fn(E) -> String + Send + Sync + 'static,
        {
            let f = std::sync::Arc::new(f);
            let state_name = std::any::type_name::<S>();
            Self {
                describe: format!("extractor {} on {state_name}", std::any::type_name::<E>())
                    .into(),
                kind: Kind::Extract(std::sync::Arc::new(move |parts: &mut Parts| {
                    let f = f.clone();
                    Box::pin(async move {
                        let Some(RouterState(state)) =
                            parts.extensions.get::<RouterState<S>>().cloned()
                        else {
                            return Err(Unresolved::Misconfigured(format!(
                                "a resolver extracts on the router state `{state_name}`, and this \
                                 route has none: use #[idempotent] on the handler, or \
                                 IdempotencyLayer::with_state(state) on the layer"
                            )));
                        };
                        let rejection = match E::from_request_parts(parts, &state).await {
                            Ok(value) => return Ok(Some(f(value))),
                            Err(rejection) => rejection.into_response(),
                        };
                        Err(rejected(rejection).await)
                    }) as ResolveFuture<'_>
                })),
            }
        }
    }

    /// An extractor's rejection, buffered so the layer can send it whatever
    /// its own body type.
    async fn rejected(rejection: axum::response::Response) -> Unresolved {
        let (parts, body) = rejection.into_parts();
        let body = match body.collect().await {
            Ok(collected) => collected.to_bytes(),
            Err(_) => bytes::Bytes::new(),
        };
        Unresolved::Rejected(http::Response::from_parts(parts, body))
    }
}

#[cfg(feature = "axum")]
pub(crate) use extractor::RouterState;

impl fmt::Debug for Resolver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Resolver").field(&self.describe).finish()
    }
}
