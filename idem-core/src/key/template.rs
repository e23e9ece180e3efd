//! Key templates: parsed and validated once, evaluated per request.

use std::fmt;
use std::str::FromStr;

use http::HeaderName;

use super::{TemplateError, TemplateErrorKind};

/// One `{...}` placeholder of a [`KeyTemplate`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Placeholder {
    /// `{tenant}`: the tenant, from the tenant resolver.
    Tenant,
    /// `{user}`: the user, from the user resolver.
    User,
    /// `{method}`: the request method.
    Method,
    /// `{route}`: the matched route pattern, such as `/orders/{id}`.
    Route,
    /// `{header:NAME}`: a request header; given twice it is an error.
    Header(HeaderName),
    /// `{path:NAME}`: a path parameter of the matched route.
    Path(String),
    /// `{query:NAME}`: a query-string parameter.
    Query(String),
    /// `{body:/json/pointer}`: a scalar in the JSON request body (RFC 6901).
    Body(String),
}

impl Placeholder {
    /// Whether this placeholder names the request's own business identity
    /// (header, path, query or body), as opposed to its scope (tenant, user,
    /// method, route). Every template needs at least one.
    pub fn is_per_request(&self) -> bool {
        matches!(
            self,
            Self::Header(_) | Self::Path(_) | Self::Query(_) | Self::Body(_)
        )
    }

    /// Whether the client supplies the value, and may leave it out:
    /// headers, query and body. A path parameter is the route's, there
    /// whenever the route matched.
    pub fn is_client_supplied(&self) -> bool {
        matches!(self, Self::Header(_) | Self::Query(_) | Self::Body(_))
    }
}

impl fmt::Display for Placeholder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Tenant => f.write_str("tenant"),
            Self::User => f.write_str("user"),
            Self::Method => f.write_str("method"),
            Self::Route => f.write_str("route"),
            Self::Header(name) => write!(f, "header:{name}"),
            Self::Path(name) => write!(f, "path:{name}"),
            Self::Query(name) => write!(f, "query:{name}"),
            Self::Body(pointer) => write!(f, "body:{pointer}"),
        }
    }
}

/// A piece of a parsed template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Segment {
    Literal(String),
    Placeholder(Placeholder),
}

/// A validated key template such as
/// `order-create:{tenant}:{user}:{header:idempotency-key}`.
///
/// Parsing checks everything that can be checked without a request: the
/// brace syntax, that each placeholder is known and well formed, and that at
/// least one placeholder identifies the request itself (a template of
/// literals, tenant and user alone would make every request of a user share
/// one key).
///
/// ```
/// use idem_core::KeyTemplate;
///
/// let template: KeyTemplate = "refund:{tenant}:{body:/order_no}:{body:/refund_no}".parse()?;
/// assert_eq!(template.placeholders().count(), 3);
///
/// let err = "idempotent:pay".parse::<KeyTemplate>().unwrap_err();
/// assert!(err.to_string().contains("constant"));
/// # Ok::<(), idem_core::TemplateError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyTemplate {
    source: String,
    pub(crate) segments: Vec<Segment>,
}

impl KeyTemplate {
    /// Parses and validates `template`.
    pub fn parse(template: &str) -> Result<Self, TemplateError> {
        let segments = parse_segments(template)?;
        if !segments
            .iter()
            .any(|s| matches!(s, Segment::Placeholder(p) if p.is_per_request()))
        {
            return Err(TemplateError::new(
                0..template.len(),
                TemplateErrorKind::Constant,
            ));
        }
        Ok(Self {
            source: template.to_owned(),
            segments,
        })
    }

    /// The template as written.
    pub fn as_str(&self) -> &str {
        &self.source
    }

    /// The placeholders, in order of appearance.
    pub fn placeholders(&self) -> impl Iterator<Item = &Placeholder> {
        self.segments.iter().filter_map(|s| match s {
            Segment::Placeholder(p) => Some(p),
            Segment::Literal(_) => None,
        })
    }

    /// Whether any placeholder reads the request body.
    pub fn reads_body(&self) -> bool {
        self.placeholders()
            .any(|p| matches!(p, Placeholder::Body(_)))
    }
}

impl FromStr for KeyTemplate {
    type Err = TemplateError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl fmt::Display for KeyTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

fn parse_segments(template: &str) -> Result<Vec<Segment>, TemplateError> {
    if template.is_empty() {
        return Err(TemplateError::new(0..0, TemplateErrorKind::Empty));
    }
    let mut segments = Vec::new();
    let mut literal_start = 0;
    let mut at = 0;
    while let Some(c) = template[at..].chars().next() {
        match c {
            '{' => {
                if literal_start < at {
                    segments.push(Segment::Literal(template[literal_start..at].to_owned()));
                }
                let close = template[at..].find('}').map(|i| at + i).ok_or_else(|| {
                    TemplateError::new(at..template.len(), TemplateErrorKind::Unclosed)
                })?;
                let inner = &template[at + 1..close];
                if let Some(nested) = inner.find('{') {
                    let pos = at + 1 + nested;
                    return Err(TemplateError::new(pos..pos + 1, TemplateErrorKind::Nested));
                }
                segments.push(Segment::Placeholder(parse_placeholder(inner, at + 1)?));
                at = close + 1;
                literal_start = at;
                continue;
            }
            '}' => {
                return Err(TemplateError::new(
                    at..at + 1,
                    TemplateErrorKind::UnopenedBrace,
                ));
            }
            c if !c.is_ascii_graphic() => {
                return Err(TemplateError::new(
                    at..at + c.len_utf8(),
                    TemplateErrorKind::InvalidLiteral(c),
                ));
            }
            _ => at += 1,
        }
    }
    if literal_start < template.len() {
        segments.push(Segment::Literal(template[literal_start..].to_owned()));
    }
    Ok(segments)
}

fn parse_placeholder(inner: &str, offset: usize) -> Result<Placeholder, TemplateError> {
    let span = offset..offset + inner.len();
    let (kind, arg) = match inner.split_once(':') {
        Some((kind, arg)) => (kind, Some(arg)),
        None => (inner, None),
    };
    let arg_span = offset + kind.len() + 1..offset + inner.len();
    let need_arg = |what: &'static str| -> Result<&str, TemplateError> {
        match arg {
            Some(a) if !a.is_empty() => Ok(a),
            _ => Err(TemplateError::new(
                span.clone(),
                TemplateErrorKind::MissingArgument {
                    placeholder: kind.to_owned(),
                    what,
                },
            )),
        }
    };
    let no_arg = |p: Placeholder| -> Result<Placeholder, TemplateError> {
        match arg {
            None => Ok(p),
            Some(_) => Err(TemplateError::new(
                span.clone(),
                TemplateErrorKind::UnexpectedArgument(kind.to_owned()),
            )),
        }
    };
    match kind {
        "tenant" => no_arg(Placeholder::Tenant),
        "user" => no_arg(Placeholder::User),
        "method" => no_arg(Placeholder::Method),
        "route" => no_arg(Placeholder::Route),
        "header" => {
            let name = need_arg("a header name")?;
            HeaderName::from_bytes(name.as_bytes())
                .map(Placeholder::Header)
                .map_err(|_| {
                    TemplateError::new(arg_span, TemplateErrorKind::InvalidName(name.to_owned()))
                })
        }
        "path" | "query" => {
            let name = need_arg("a parameter name")?;
            if !name.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(TemplateError::new(
                    arg_span,
                    TemplateErrorKind::InvalidName(name.to_owned()),
                ));
            }
            Ok(if kind == "path" {
                Placeholder::Path(name.to_owned())
            } else {
                Placeholder::Query(name.to_owned())
            })
        }
        "body" => {
            let pointer = need_arg("a JSON pointer such as /order_no")?;
            if !pointer.starts_with('/') {
                return Err(TemplateError::new(
                    arg_span,
                    TemplateErrorKind::InvalidPointer(pointer.to_owned()),
                ));
            }
            Ok(Placeholder::Body(pointer.to_owned()))
        }
        _ => Err(TemplateError::new(
            span,
            TemplateErrorKind::UnknownPlaceholder(inner.to_owned()),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_design_examples() {
        for t in [
            "order-create:{tenant}:{user}:{header:idempotency-key}",
            "pay-callback:{path:payment_no}",
            "refund:{tenant}:{body:/order_no}:{body:/refund_no}",
            "{method}:{route}:{query:id}",
        ] {
            let parsed = KeyTemplate::parse(t).unwrap();
            assert_eq!(parsed.as_str(), t);
        }
    }

    #[test]
    fn segments_keep_literals_and_placeholders_in_order() {
        let t = KeyTemplate::parse("a:{tenant}-{path:id}z").unwrap();
        assert_eq!(
            t.segments,
            vec![
                Segment::Literal("a:".into()),
                Segment::Placeholder(Placeholder::Tenant),
                Segment::Literal("-".into()),
                Segment::Placeholder(Placeholder::Path("id".into())),
                Segment::Literal("z".into()),
            ]
        );
    }

    #[test]
    fn rejects_constant_templates() {
        for t in ["idempotent:pay", "x:{tenant}:{user}", "{method}{route}"] {
            let err = KeyTemplate::parse(t).unwrap_err();
            assert_eq!(err.kind(), &TemplateErrorKind::Constant, "{t}");
        }
    }

    #[test]
    fn rejects_syntax_errors_with_spans() {
        let cases: &[(&str, std::ops::Range<usize>)] = &[
            ("a:{header:x", 2..11),
            ("a}{path:x}", 1..2),
            ("a:{pa{th:x}", 5..6),
            ("a:{nope}", 3..7),
            ("a:{header}", 3..9),
            ("a:{header:}", 3..10),
            ("a:{tenant:x}{path:y}", 3..11),
            ("a:{body:order}", 8..13),
            ("a b:{path:x}", 1..2),
            ("a:{header:bad name}", 10..18),
            ("", 0..0),
        ];
        for (t, span) in cases {
            let err = KeyTemplate::parse(t).unwrap_err();
            assert_eq!(&err.span(), span, "{t}: {err}");
        }
    }
}
