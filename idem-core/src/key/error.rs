//! Why a key template was refused when parsed, and why a key could not be
//! built for a request.

use std::fmt;

use super::{MAX_PART_LEN, Placeholder};

/// Why a key template was rejected, and where in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateError {
    span: std::ops::Range<usize>,
    kind: TemplateErrorKind,
}

/// The reason a [`TemplateError`] was raised.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum TemplateErrorKind {
    /// The template is empty.
    Empty,
    /// No placeholder identifies the request: every request would share a key.
    Constant,
    /// A `{` without its `}`.
    Unclosed,
    /// A `}` without a `{` before it.
    UnopenedBrace,
    /// A `{` inside a placeholder.
    Nested,
    /// A literal character that is not visible ASCII.
    InvalidLiteral(char),
    /// A placeholder that is not one of the known kinds.
    UnknownPlaceholder(String),
    /// A placeholder kind that needs an argument, given none.
    MissingArgument {
        /// The placeholder kind, such as `header`.
        placeholder: String,
        /// What the argument should be.
        what: &'static str,
    },
    /// An argument to a placeholder that takes none.
    UnexpectedArgument(String),
    /// A header, path or query name that is not valid.
    InvalidName(String),
    /// A body placeholder whose JSON pointer does not start with `/`.
    InvalidPointer(String),
}

impl TemplateError {
    pub(super) fn new(span: std::ops::Range<usize>, kind: TemplateErrorKind) -> Self {
        Self { span, kind }
    }

    /// The byte range of the template the error points at.
    pub fn span(&self) -> std::ops::Range<usize> {
        self.span.clone()
    }

    /// The reason.
    pub fn kind(&self) -> &TemplateErrorKind {
        &self.kind
    }
}

impl fmt::Display for TemplateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            TemplateErrorKind::Empty => f.write_str("the key template is empty"),
            TemplateErrorKind::Constant => f.write_str(
                "the key template is constant: add a per-request placeholder such as \
                 {header:idempotency-key}, {path:id}, {query:id} or {body:/id}, \
                 or every request would share one key",
            ),
            TemplateErrorKind::Unclosed => f.write_str("`{` is never closed: add a `}`"),
            TemplateErrorKind::UnopenedBrace => {
                f.write_str("`}` has no matching `{`; braces may only surround placeholders")
            }
            TemplateErrorKind::Nested => f.write_str("placeholders cannot be nested"),
            TemplateErrorKind::InvalidLiteral(c) => write!(
                f,
                "{c:?} is not allowed in a key template: use visible ASCII only"
            ),
            TemplateErrorKind::UnknownPlaceholder(p) => write!(
                f,
                "unknown placeholder {{{p}}}: expected one of {{tenant}}, {{user}}, {{method}}, \
                 {{route}}, {{header:NAME}}, {{path:NAME}}, {{query:NAME}}, {{body:/pointer}}"
            ),
            TemplateErrorKind::MissingArgument { placeholder, what } => {
                write!(
                    f,
                    "{{{placeholder}}} needs {what}, as in {{{placeholder}:...}}"
                )
            }
            TemplateErrorKind::UnexpectedArgument(p) => {
                write!(f, "{{{p}}} takes no argument: write {{{p}}}")
            }
            TemplateErrorKind::InvalidName(n) => write!(f, "{n:?} is not a valid name"),
            TemplateErrorKind::InvalidPointer(p) => write!(
                f,
                "{p:?} is not a JSON pointer: it must start with `/`, as in {{body:/order_no}}"
            ),
        }
    }
}

impl std::error::Error for TemplateError {}

/// Why a key could not be built for a request. Each is a client error (400).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyError {
    /// The placeholder resolved to nothing (absent or empty).
    Missing(Placeholder),
    /// A header or query parameter the key reads was given more than once.
    Repeated(Placeholder),
    /// The value is longer than [`MAX_PART_LEN`] bytes.
    TooLong {
        /// Which part.
        placeholder: Placeholder,
        /// Its length in bytes.
        len: usize,
    },
    /// The value holds something other than visible ASCII.
    NotVisibleAscii(Placeholder),
    /// The key header's value starts with `"` and is not one Structured
    /// Field String (RFC 9651) without parameters, as the IETF draft
    /// writes the key: parameters, a list, a broken String.
    NotAString {
        /// Which part (the key header).
        placeholder: Placeholder,
        /// What is wrong with it.
        why: String,
    },
    /// A `{body:...}` placeholder points at an object or array.
    NotScalar(Placeholder),
    /// The key or fingerprint reads the body as JSON, and it is not JSON.
    BodyNotJson,
}

impl KeyError {
    /// The placeholder at fault, if one is.
    pub fn placeholder(&self) -> Option<&Placeholder> {
        match self {
            Self::Missing(p)
            | Self::Repeated(p)
            | Self::NotVisibleAscii(p)
            | Self::NotScalar(p)
            | Self::TooLong { placeholder: p, .. }
            | Self::NotAString { placeholder: p, .. } => Some(p),
            Self::BodyNotJson => None,
        }
    }
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Missing(p) => write!(
                f,
                "the idempotency key needs {{{p}}}, and the request has none"
            ),
            Self::Repeated(p) => write!(f, "{{{p}}} was given more than once"),
            Self::TooLong { placeholder, len } => write!(
                f,
                "{{{placeholder}}} is {len} bytes long; at most {MAX_PART_LEN} are allowed"
            ),
            Self::NotVisibleAscii(p) => write!(f, "{{{p}}} must be visible ASCII"),
            Self::NotAString { placeholder, why } => write!(f, "{{{placeholder}}}: {why}"),
            Self::NotScalar(p) => {
                write!(
                    f,
                    "{{{p}}} must be a string, number or boolean in the JSON body"
                )
            }
            Self::BodyNotJson => f.write_str("the request body must be JSON"),
        }
    }
}

impl std::error::Error for KeyError {}
