//! Parsing and checking the arguments of `#[idempotent(...)]`.
//!
//! Every check that can be made without a request is made here, at compile
//! time: the key template goes through the very `KeyTemplate::parse` the
//! runtime uses, and each error is spanned on the token to fix.

use std::time::Duration;

use idem_core::KeyTemplate;
use proc_macro2::{Span, TokenStream};
use syn::meta::ParseNestedMeta;
use syn::parse::{Parse, ParseStream, Parser};
use syn::punctuated::Punctuated;
use syn::{Ident, Lit, LitBool, LitStr, Token, bracketed};

/// The arguments, in the order the docs list them.
const ARGUMENTS: [&str; 8] = [
    "key",
    "retention",
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
    pub(crate) retention: Option<Duration>,
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
    retention: Option<Duration>,
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
            "key" => {
                let lit = string_value(
                    &meta,
                    &ident,
                    "key = \"order-create:{header:idempotency-key}\"",
                )?;
                let template = parse_template(&lit)?;
                set(&mut self.key, &ident, Key { lit, template })
            }
            "retention" => {
                let lit = string_value(&meta, &ident, "retention = \"24h\"")?;
                set(
                    &mut self.retention,
                    &ident,
                    parse_duration(&lit, &lit.value(), "retention")?,
                )
            }
            "ttl" => Err(syn::Error::new(
                ident.span(),
                "`ttl` is called `retention`, as on the builder and the layer: write \
                 `retention = \"24h\"`",
            )),
            "lease" => {
                let lit = string_value(&meta, &ident, "lease = \"30s\"")?;
                set(
                    &mut self.lease,
                    &ident,
                    parse_duration(&lit, &lit.value(), "lease")?,
                )
            }
            "required" => {
                let value = bool_value(&meta, &ident, "required = false")?;
                set(&mut self.required, &ident, value.value)
            }
            "in_flight" => {
                let lit = string_value(&meta, &ident, "in_flight = \"wait(5s)\"")?;
                set(
                    &mut self.in_flight,
                    &ident,
                    (parse_in_flight(&lit)?, lit.span()),
                )
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
            retention: self.retention,
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

/// The value of `name = "..."`.
fn string_value(meta: &ParseNestedMeta<'_>, ident: &Ident, example: &str) -> syn::Result<LitStr> {
    let input = value_of(meta, ident, example)?;
    match input.parse::<Lit>()? {
        Lit::Str(lit) => Ok(lit),
        Lit::Int(int) if example.contains(['s', 'h']) => Err(syn::Error::new(
            int.span(),
            format!("write `{ident}` as a string with a unit, such as {example}"),
        )),
        other => Err(syn::Error::new(
            other.span(),
            format!("`{ident}` takes a string: write {example}"),
        )),
    }
}

/// The value of `required = true|false`.
fn bool_value(meta: &ParseNestedMeta<'_>, ident: &Ident, example: &str) -> syn::Result<LitBool> {
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
fn flag_value(meta: &ParseNestedMeta<'_>, ident: &Ident) -> syn::Result<bool> {
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
fn fingerprint_value(
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
            retention = "24h",
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
        assert_eq!(args.retention, Some(Duration::from_secs(86_400)));
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
    fn suggests_the_argument_meant() {
        assert!(
            error(quote!(key = "a:{path:id}", retntion = "1h"))
                .contains("did you mean `retention`?")
        );
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
            (
                quote!(key = "a:{path:id}", retention = 5),
                "as a string with a unit",
            ),
            (
                quote!(key = "a:{path:id}", retention = "0s"),
                "longer than zero",
            ),
            (
                quote!(key = "a:{path:id}", ttl = "1h"),
                "`ttl` is called `retention`",
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
            (quote!(retention = "1h"), "missing `key`"),
        ] {
            let message = error(attr.clone());
            assert!(message.contains(expected), "{attr}: {message}");
        }
    }
}
