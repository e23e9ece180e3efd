//! The layer an `#[idempotent]` handler's requests go through: the
//! attribute's key and settings on the router's handle.

use proc_macro2::{Literal, Span, TokenStream};
use quote::{quote, quote_spanned};

use super::private;
use crate::attr::{Args, Fingerprint, InFlightPolicy};

/// `layer_with_key(handle, key)` with each setting the attribute gives,
/// made transactional if it asks: an expression of `__idem_handle`.
pub(super) fn layer(args: &Args, span: Span) -> TokenStream {
    let p = private();
    let key = &args.key.lit;
    let mut settings = TokenStream::new();
    if let Some(ttl) = args.ttl {
        let ttl = duration(ttl);
        settings.extend(quote_spanned!(span=> .ttl(#ttl)));
    }
    if let Some(lease) = args.lease {
        let lease = duration(lease);
        settings.extend(quote_spanned!(span=> .lease(#lease)));
    }
    if let Some(required) = args.required {
        settings.extend(quote_spanned!(span=> .required(#required)));
    }
    if let Some(in_flight) = &args.in_flight {
        let in_flight = match in_flight {
            InFlightPolicy::Reject => quote_spanned!(span=> #p::InFlightPolicy::Reject),
            InFlightPolicy::Wait(wait) => {
                let wait = duration(*wait);
                quote_spanned!(span=> #p::InFlightPolicy::Wait(#wait))
            }
        };
        settings.extend(quote_spanned!(span=> .in_flight(#in_flight)));
    }
    if let Some(fingerprint) = &args.fingerprint {
        let spec = match fingerprint {
            Fingerprint::Request => quote_spanned!(span=> #p::FingerprintSpec::Request),
            Fingerprint::MethodAndRoute => {
                quote_spanned!(span=> #p::FingerprintSpec::MethodAndRoute)
            }
            Fingerprint::JsonFields(pointers) => {
                quote_spanned!(span=> #p::json_fields(&[#(#pointers),*]))
            }
        };
        settings.extend(quote_spanned!(span=> .fingerprint(#spec)));
    }
    if args.shared_across_callers {
        settings.extend(quote_spanned!(span=> .shared_across_callers()));
    }
    let mut layer = quote_spanned!(span=> #p::layer_with_key(__idem_handle, #key) #settings);
    if args.transactional {
        layer = quote_spanned!(span=> #p::transactional(#layer));
    }
    layer
}

/// `Duration::new(secs, nanos)`, exactly as parsed.
fn duration(duration: std::time::Duration) -> TokenStream {
    let secs = Literal::u64_suffixed(duration.as_secs());
    let nanos = Literal::u32_suffixed(duration.subsec_nanos());
    let p = private();
    quote!(#p::Duration::new(#secs, #nanos))
}
