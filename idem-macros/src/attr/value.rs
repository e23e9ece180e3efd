//! The value of each argument of `#[idempotent(...)]`, parsed and checked
//! on its own: a string, a flag, a key template, a duration, an in-flight
//! policy, a fingerprint.

use std::time::Duration;

use idem_core::KeyTemplate;
use proc_macro2::Span;
use syn::meta::ParseNestedMeta;
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::{Ident, Lit, LitBool, LitStr, Token, bracketed};

use super::{Fingerprint, InFlightPolicy, Key};

/// The value of `key = "..."`: the template as written, and as parsed.
pub(super) fn key_value(meta: &ParseNestedMeta<'_>, ident: &Ident) -> syn::Result<Key> {
    let lit = string_value(
        meta,
        ident,
        "key = \"order-create:{header:idempotency-key}\"",
    )?;
    let template = parse_template(&lit)?;
    Ok(Key { lit, template })
}

/// The longest `ttl` the attribute takes: a year. A longer one is almost
/// certainly a slip of the unit, and would keep every response that long.
const MAX_TTL: Duration = Duration::from_secs(365 * 24 * 60 * 60);

/// The value of `ttl = "24h"` or `ttl = 86400` (whole seconds), also
/// written `retention = ...`: longer than zero and at most a year.
pub(super) fn ttl_value(meta: &ParseNestedMeta<'_>, ident: &Ident) -> syn::Result<Duration> {
    let (ttl, span) = seconds_or_duration(meta, ident, "ttl = \"24h\" or ttl = 86400")?;
    if ttl > MAX_TTL {
        return Err(syn::Error::new(
            span,
            format!(
                "`{ident}` must be at most a year (\"365days\", {} seconds): every completed \
                 response is kept this long",
                MAX_TTL.as_secs()
            ),
        ));
    }
    Ok(ttl)
}

/// The value of `lease = "30s"` or `lease = 30` (whole seconds).
pub(super) fn duration_value(
    meta: &ParseNestedMeta<'_>,
    ident: &Ident,
    example: &str,
) -> syn::Result<Duration> {
    Ok(seconds_or_duration(meta, ident, example)?.0)
}

/// A duration written as a humane string (`"24h"`) or as whole seconds
/// (`86400`), longer than zero, and the span of the value.
fn seconds_or_duration(
    meta: &ParseNestedMeta<'_>,
    ident: &Ident,
    example: &str,
) -> syn::Result<(Duration, Span)> {
    let input = value_of(meta, ident, example)?;
    if input.peek(Token![-]) {
        let minus: Token![-] = input.parse()?;
        let value: Lit = input.parse()?;
        let span = minus.span.join(value.span()).unwrap_or(minus.span);
        return Err(syn::Error::new(
            span,
            format!(
                "a negative `{ident}` keeps nothing: write a positive duration, such as {example}"
            ),
        ));
    }
    let zero = |span| {
        syn::Error::new(
            span,
            format!("`{ident}` must be longer than zero: write {example}"),
        )
    };
    match input.parse::<Lit>()? {
        Lit::Str(lit) => {
            let duration = parse_duration(&lit, &lit.value(), &ident.to_string())?;
            Ok((duration, lit.span()))
        }
        Lit::Int(int) => {
            let secs: u64 = int.base10_parse()?;
            if secs == 0 {
                return Err(zero(int.span()));
            }
            Ok((Duration::from_secs(secs), int.span()))
        }
        Lit::Float(float) => Err(syn::Error::new(
            float.span(),
            format!(
                "`{ident}` as a number is whole seconds: write an integer, or a string with a \
                 unit, such as {example}"
            ),
        )),
        other => Err(syn::Error::new(
            other.span(),
            format!("`{ident}` takes a duration: write {example}"),
        )),
    }
}

/// The value of `in_flight = "wait(5s)"`, and the span to blame for it.
pub(super) fn in_flight_value(
    meta: &ParseNestedMeta<'_>,
    ident: &Ident,
) -> syn::Result<(InFlightPolicy, Span)> {
    let lit = string_value(meta, ident, "in_flight = \"wait(5s)\"")?;
    Ok((parse_in_flight(&lit)?, lit.span()))
}

/// The value of `name = "..."`.
fn string_value(meta: &ParseNestedMeta<'_>, ident: &Ident, example: &str) -> syn::Result<LitStr> {
    let input = value_of(meta, ident, example)?;
    match input.parse::<Lit>()? {
        Lit::Str(lit) => Ok(lit),
        other => Err(syn::Error::new(
            other.span(),
            format!("`{ident}` takes a string: write {example}"),
        )),
    }
}

/// The value of `required = true|false`.
pub(super) fn bool_value(
    meta: &ParseNestedMeta<'_>,
    ident: &Ident,
    example: &str,
) -> syn::Result<LitBool> {
    let input = value_of(meta, ident, example)?;
    match input.parse::<Lit>()? {
        Lit::Bool(lit) => Ok(lit),
        other => Err(syn::Error::new(
            other.span(),
            format!("`{ident}` takes `true` or `false`: write {example}"),
        )),
    }
}

/// A flag: bare `name` means `name = true`.
pub(super) fn flag_value(meta: &ParseNestedMeta<'_>, ident: &Ident) -> syn::Result<bool> {
    if meta.input.peek(Token![=]) {
        let example = format!("{ident} (or {ident} = true)");
        Ok(bool_value(meta, ident, &example)?.value)
    } else {
        Ok(true)
    }
}

/// The stream after `name =`, or an error saying how to write the argument.
fn value_of<'a>(
    meta: &ParseNestedMeta<'a>,
    ident: &Ident,
    example: &str,
) -> syn::Result<ParseStream<'a>> {
    if !meta.input.peek(Token![=]) {
        return Err(syn::Error::new(
            ident.span(),
            format!("`{ident}` needs a value: write {example}"),
        ));
    }
    meta.value()
}

fn parse_template(lit: &LitStr) -> syn::Result<KeyTemplate> {
    let source = lit.value();
    KeyTemplate::parse(&source).map_err(|err| {
        let range = err.span();
        // A span cannot point inside a string literal on stable Rust, so the
        // message underlines the offending part itself.
        let whole = range.start == 0 && range.end == source.len();
        let message = if whole || source.is_empty() {
            err.to_string()
        } else {
            let width = source[range.clone()].chars().count().max(1);
            let pad = source[..range.start].chars().count();
            format!(
                "{err}\n  key = \"{source}\"\n{}{}",
                " ".repeat(pad + 9),
                "^".repeat(width)
            )
        };
        syn::Error::new(lit.span(), message)
    })
}

/// A humane duration such as `24h`, `10m`, `30s` or `1h 30m`.
fn parse_duration(lit: &LitStr, text: &str, what: &str) -> syn::Result<Duration> {
    let duration = humantime::parse_duration(text.trim()).map_err(|err| {
        syn::Error::new(
            lit.span(),
            format!(
                "`{what}` is not a duration: {err}; write a number and a unit, such as \
                 \"30s\", \"10m\", \"24h\" or \"7days\""
            ),
        )
    })?;
    if duration.is_zero() {
        return Err(syn::Error::new(
            lit.span(),
            format!("`{what}` must be longer than zero, such as \"30s\""),
        ));
    }
    Ok(duration)
}

fn parse_in_flight(lit: &LitStr) -> syn::Result<InFlightPolicy> {
    let value = lit.value();
    let value = value.trim();
    if value == "reject" {
        return Ok(InFlightPolicy::Reject);
    }
    match value
        .strip_prefix("wait(")
        .and_then(|rest| rest.strip_suffix(')'))
    {
        Some(wait) => Ok(InFlightPolicy::Wait(parse_duration(
            lit,
            wait,
            "in_flight = \"wait(...)\"",
        )?)),
        None => Err(syn::Error::new(
            lit.span(),
            format!(
                "unknown in_flight policy {value:?}: write \"reject\" (answer 409 at once) or \
                 \"wait(DURATION)\", such as \"wait(5s)\" (wait for the first request and replay it)"
            ),
        )),
    }
}

/// The value of `fingerprint = ...`, and the span to blame for it.
pub(super) fn fingerprint_value(
    meta: &ParseNestedMeta<'_>,
    ident: &Ident,
) -> syn::Result<(Fingerprint, Span)> {
    let input = value_of(meta, ident, "fingerprint = \"request\"")?;
    let lookahead = input.lookahead1();
    if lookahead.peek(LitStr) {
        let lit: LitStr = input.parse()?;
        return match lit.value().as_str() {
            "request" => Ok((Fingerprint::Request, lit.span())),
            "method_and_route" => Ok((Fingerprint::MethodAndRoute, lit.span())),
            other => Err(syn::Error::new(
                lit.span(),
                format!(
                    "unknown fingerprint {other:?}: write \"request\" (method, route, query and \
                     body), \"method_and_route\" (method, route and path parameters only) or a \
                     list of JSON pointers, such as [\"/amount\", \"/currency\"]"
                ),
            )),
        };
    }
    if lookahead.peek(syn::token::Bracket) {
        let list = input.parse::<PointerList>()?;
        return Ok((Fingerprint::JsonFields(list.pointers), list.span));
    }
    Err(lookahead.error())
}

/// `["/amount", "/currency"]`.
struct PointerList {
    pointers: Vec<LitStr>,
    span: Span,
}

impl Parse for PointerList {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let content;
        let bracket = bracketed!(content in input);
        let span = bracket.span.join();
        let lits = Punctuated::<LitStr, Token![,]>::parse_terminated(&content)?;
        if lits.is_empty() {
            return Err(syn::Error::new(
                span,
                "an empty list fingerprints nothing of the body: list the JSON pointers that \
                 identify the request, such as [\"/amount\"], or write fingerprint = \"method_and_route\"",
            ));
        }
        let mut pointers: Vec<LitStr> = Vec::with_capacity(lits.len());
        for lit in lits {
            let value = lit.value();
            if !value.starts_with('/') {
                return Err(syn::Error::new(
                    lit.span(),
                    format!(
                        "{value:?} is not a JSON pointer: it must start with `/`, as in \"/{}\"",
                        value.trim_start_matches('/')
                    ),
                ));
            }
            if pointers.iter().any(|p| p.value() == value) {
                return Err(syn::Error::new(
                    lit.span(),
                    format!("{value:?} is listed more than once: keep one"),
                ));
            }
            pointers.push(lit);
        }
        Ok(Self { pointers, span })
    }
}
