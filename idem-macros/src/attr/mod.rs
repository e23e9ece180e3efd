//! Parsing and checking the arguments of `#[idempotent(...)]`.
//!
//! Every check that can be made without a request is made here, at compile
//! time: the key template goes through the very `KeyTemplate::parse` the
//! runtime uses, and each error is spanned on the token to fix. Here: the
//! arguments as a whole, their names, and the checks that span several of
//! them; `value.rs` parses each one's value.

mod value;

use std::time::Duration;

use idem_core::KeyTemplate;
use proc_macro2::{Span, TokenStream};
use syn::meta::ParseNestedMeta;
use syn::parse::Parser;
use syn::{Ident, LitStr};
use value::{
    bool_value, duration_value, fingerprint_value, flag_value, in_flight_value, key_value,
    ttl_value,
};

/// The arguments, in the order the docs list them. `retention`, the name
/// `ttl` had for a while, is accepted as a synonym and listed nowhere.
const ARGUMENTS: [&str; 8] = [
    "key",
    "ttl",
    "lease",
    "required",
    "in_flight",
    "fingerprint",
    "transactional",
    "shared_across_callers",
];

/// `#[idempotent(...)]`, parsed and checked.
pub(crate) struct Args {
    pub(crate) key: Key,
    /// How long a completed response is kept and replayed.
    pub(crate) ttl: Option<Duration>,
    pub(crate) lease: Option<Duration>,
    pub(crate) required: Option<bool>,
    pub(crate) in_flight: Option<InFlightPolicy>,
    pub(crate) fingerprint: Option<Fingerprint>,
    pub(crate) transactional: bool,
    pub(crate) shared_across_callers: bool,
}

/// The key template as written, and as parsed.
pub(crate) struct Key {
    pub(crate) lit: LitStr,
    pub(crate) template: KeyTemplate,
}

/// `in_flight = "reject"` or `"wait(5s)"`.
pub(crate) enum InFlightPolicy {
    Reject,
    Wait(Duration),
}

/// `fingerprint = "request"`, `"method_and_route"` or `["/json", "/pointers"]`.
pub(crate) enum Fingerprint {
    Request,
    MethodAndRoute,
    JsonFields(Vec<LitStr>),
}

impl Args {
    /// Parses the attribute's arguments; `attr` is what is inside the
    /// parentheses.
    pub(crate) fn parse(attr: TokenStream) -> syn::Result<Self> {
        let mut raw = RawArgs::default();
        syn::meta::parser(|meta| raw.argument(meta)).parse2(attr)?;
        raw.check()
    }
}

/// The arguments as found, before the checks that span several of them.
#[derive(Default)]
struct RawArgs {
    key: Option<Key>,
    /// `ttl`, with the name it was written under (`ttl` or `retention`).
    ttl: Option<(Duration, Ident)>,
    lease: Option<Duration>,
    required: Option<bool>,
    in_flight: Option<(InFlightPolicy, Span)>,
    fingerprint: Option<(Fingerprint, Span)>,
    transactional: Option<bool>,
    shared_across_callers: Option<bool>,
}

impl RawArgs {
    fn argument(&mut self, meta: ParseNestedMeta<'_>) -> syn::Result<()> {
        let Some(ident) = meta.path.get_ident().cloned() else {
            return Err(meta.error(unknown_argument(&path_to_string(&meta.path))));
        };
        let name = ident.to_string();
        match name.as_str() {
            "key" => set(&mut self.key, &ident, key_value(&meta, &ident)?),
            "ttl" | "retention" => {
                let value = ttl_value(&meta, &ident)?;
                self.set_ttl(value, ident)
            }
            "lease" => {
                let value = duration_value(&meta, &ident, "lease = \"30s\"")?;
                set(&mut self.lease, &ident, value)
            }
            "required" => {
                let value = bool_value(&meta, &ident, "required = false")?;
                set(&mut self.required, &ident, value.value)
            }
            "in_flight" => {
                let value = in_flight_value(&meta, &ident)?;
                set(&mut self.in_flight, &ident, value)
            }
            "fingerprint" => {
                let value = fingerprint_value(&meta, &ident)?;
                set(&mut self.fingerprint, &ident, value)
            }
            "transactional" => {
                let value = flag_value(&meta, &ident)?;
                set(&mut self.transactional, &ident, value)
            }
            "shared_across_callers" => {
                let value = flag_value(&meta, &ident)?;
                set(&mut self.shared_across_callers, &ident, value)
            }
            _ => Err(syn::Error::new(ident.span(), unknown_argument(&name))),
        }
    }

    /// Stores `ttl`, or fails if it was given already, under either name.
    fn set_ttl(&mut self, ttl: Duration, ident: Ident) -> syn::Result<()> {
        match &self.ttl {
            None => {
                self.ttl = Some((ttl, ident));
                Ok(())
            }
            Some((_, first)) if *first == ident => Err(syn::Error::new(
                ident.span(),
                format!("`{ident}` specified more than once: keep one of them"),
            )),
            Some((_, first)) => Err(syn::Error::new(
                ident.span(),
                format!(
                    "`{ident}` and `{first}` are one argument (`retention` is the former name \
                     of `ttl`): keep `ttl`"
                ),
            )),
        }
    }

    fn check(self) -> syn::Result<Args> {
        let Some(key) = self.key else {
            return Err(syn::Error::new(
                Span::call_site(),
                "missing `key`: #[idempotent] needs a key template, such as \
                 #[idempotent(key = \"order-create:{tenant}:{header:idempotency-key}\")]",
            ));
        };
        let fingerprint = match self.fingerprint {
            Some((Fingerprint::MethodAndRoute, span)) if key.template.reads_body() => {
                let body = key
                    .template
                    .placeholders()
                    .find(|p| matches!(p, idem_core::Placeholder::Body(_)))
                    .map(|p| format!("{{{p}}}"))
                    .unwrap_or_default();
                return Err(syn::Error::new(
                    span,
                    format!(
                        "the key reads the request body ({body}), so the fingerprint must \
                         cover it too: remove `fingerprint = \"method_and_route\"` to fingerprint the whole \
                         body, or list the fields that identify the request, such as \
                         fingerprint = [\"{}\"]",
                        body.trim_start_matches("{body:").trim_end_matches('}')
                    ),
                ));
            }
            other => other.map(|(fingerprint, _)| fingerprint),
        };
        let transactional = self.transactional.unwrap_or(false);
        Ok(Args {
            key,
            ttl: self.ttl.map(|(ttl, _)| ttl),
            lease: self.lease,
            required: self.required,
            in_flight: self.in_flight.map(|(in_flight, _)| in_flight),
            fingerprint,
            transactional,
            shared_across_callers: self.shared_across_callers.unwrap_or(false),
        })
    }
}

/// Stores an argument's value, or fails if it was already given.
fn set<T>(slot: &mut Option<T>, ident: &Ident, value: T) -> syn::Result<()> {
    if slot.is_some() {
        return Err(syn::Error::new(
            ident.span(),
            format!("`{ident}` specified more than once: keep one of them"),
        ));
    }
    *slot = Some(value);
    Ok(())
}

fn unknown_argument(name: &str) -> String {
    let expected = ARGUMENTS.map(|a| format!("`{a}`")).join(", ");
    match closest(name) {
        Some(close) => {
            format!("unknown argument `{name}`: did you mean `{close}`? Expected one of {expected}")
        }
        None => format!("unknown argument `{name}`: expected one of {expected}"),
    }
}

/// The known argument nearest to `name`, if it is plausibly a typo.
fn closest(name: &str) -> Option<&'static str> {
    ARGUMENTS
        .iter()
        .map(|&a| (edit_distance(name, a), a))
        .filter(|&(d, a)| d <= 2 && d < a.len())
        .min_by_key(|&(d, _)| d)
        .map(|(_, a)| a)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

fn path_to_string(path: &syn::Path) -> String {
    path.segments
        .iter()
        .map(|s| s.ident.to_string())
        .collect::<Vec<_>>()
        .join("::")
}

#[cfg(test)]
mod tests {
    use quote::quote;

    use super::*;

    fn error(attr: TokenStream) -> String {
        match Args::parse(attr) {
            Ok(_) => panic!("accepted"),
            Err(err) => err.to_string(),
        }
    }

    #[test]
    fn parses_every_argument() {
        let args = Args::parse(quote!(
            key = "pay:{tenant}:{body:/payment_no}",
            ttl = "24h",
            lease = "1m 30s",
            required = false,
            in_flight = "wait(5s)",
            fingerprint = ["/payment_no", "/amount"],
            shared_across_callers,
        ))
        .unwrap();
        assert_eq!(
            args.key.template.as_str(),
            "pay:{tenant}:{body:/payment_no}"
        );
        assert_eq!(args.ttl, Some(Duration::from_secs(86_400)));
        assert_eq!(args.lease, Some(Duration::from_secs(90)));
        assert_eq!(args.required, Some(false));
        assert!(
            matches!(args.in_flight, Some(InFlightPolicy::Wait(d)) if d == Duration::from_secs(5))
        );
        assert!(matches!(&args.fingerprint, Some(Fingerprint::JsonFields(p)) if p.len() == 2));
        assert!(args.shared_across_callers);
        assert!(!args.transactional);
    }

    #[test]
    fn ttl_takes_a_humane_string_or_whole_seconds() {
        for (attr, expected) in [
            (quote!(key = "a:{path:id}", ttl = "24h"), 86_400),
            (quote!(key = "a:{path:id}", ttl = 86400), 86_400),
            (quote!(key = "a:{path:id}", ttl = 86_400u64), 86_400),
            (quote!(key = "a:{path:id}", ttl = "10m"), 600),
            (quote!(key = "a:{path:id}", retention = "72h"), 259_200),
            (quote!(key = "a:{path:id}", retention = 60), 60),
            (quote!(key = "a:{path:id}", ttl = "365days"), 31_536_000),
        ] {
            let args = Args::parse(attr.clone()).unwrap_or_else(|e| panic!("{attr}: {e}"));
            assert_eq!(args.ttl, Some(Duration::from_secs(expected)), "{attr}");
        }
        assert_eq!(Args::parse(quote!(key = "a:{path:id}")).unwrap().ttl, None);
    }

    #[test]
    fn suggests_the_argument_meant() {
        assert!(error(quote!(key = "a:{path:id}", tll = "1h")).contains("did you mean `ttl`?"));
        assert!(!error(quote!(key = "a:{path:id}", color = "1h")).contains("did you mean"));
    }

    #[test]
    fn underlines_the_bad_part_of_a_template() {
        let message = error(quote!(key = "order:{tenant}:{nope}"));
        let lines: Vec<&str> = message.lines().collect();
        assert!(
            lines[0].starts_with("unknown placeholder {nope}"),
            "{message}"
        );
        let column = lines[1].find("{nope}").unwrap();
        assert_eq!(lines[2].find('^'), Some(column + 1), "{message}");
        assert_eq!(lines[2].matches('^').count(), 4, "{message}");
    }

    #[test]
    fn rejects_bad_values() {
        for (attr, expected) in [
            (quote!(key = "a:{path:id}", ttl = 0), "longer than zero"),
            (quote!(key = "a:{path:id}", ttl = "0s"), "longer than zero"),
            (quote!(key = "a:{path:id}", ttl = -5), "a negative `ttl`"),
            (quote!(key = "a:{path:id}", ttl = 1.5), "whole seconds"),
            (
                quote!(key = "a:{path:id}", ttl = "2years"),
                "at most a year",
            ),
            (
                quote!(key = "a:{path:id}", ttl = 31_536_001),
                "at most a year",
            ),
            (
                quote!(key = "a:{path:id}", ttl = true),
                "`ttl` takes a duration",
            ),
            (
                quote!(key = "a:{path:id}", ttl = "1h", retention = "2h"),
                "are one argument",
            ),
            (
                quote!(key = "a:{path:id}", ttl = "1h", ttl = "2h"),
                "specified more than once",
            ),
            (
                quote!(key = "a:{path:id}", fingerprint = "body"),
                "unknown fingerprint",
            ),
            (
                quote!(key = "a:{path:id}", required = "no"),
                "`true` or `false`",
            ),
            (
                quote!(key = "a:{path:id}", in_flight = "wait"),
                "unknown in_flight policy",
            ),
            (
                quote!(key = "a:{path:id}", in_flight = "wait(soon)"),
                "not a duration",
            ),
            (quote!(key = "a:{path:id}", fingerprint = []), "empty list"),
            (
                quote!(key = "a:{path:id}", fingerprint = ["amount"]),
                "must start with `/`",
            ),
            (
                quote!(key = "a:{path:id}", fingerprint = ["/a", "/a"]),
                "more than once",
            ),
            (
                quote!(key = "a:{path:id}", fingerprint = "all"),
                "unknown fingerprint",
            ),
            (quote!(key), "`key` needs a value"),
            (
                quote!(key = "a:{path:id}", shared_across_callers = "yes"),
                "`shared_across_callers` takes `true` or `false`",
            ),
            (quote!(ttl = "1h"), "missing `key`"),
        ] {
            let message = error(attr.clone());
            assert!(message.contains(expected), "{attr}: {message}");
        }
    }
}
