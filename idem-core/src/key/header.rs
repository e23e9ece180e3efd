//! The key header's value, read as the IETF draft writes it
//! (draft-ietf-httpapi-idempotency-key-header-09: an Item Structured Field
//! whose value is a String, RFC 9651) and as most clients send it (Stripe's
//! bare form). ARCHITECTURE.md, "Keys and callers".
//!
//! The rule, whole:
//!
//! - A value that starts with `"` is a Structured Field String, parsed by
//!   `sfv`: its content is the key (`"abc-1"` is the key `abc-1`, `"a \"b\""`
//!   the key `a "b"`). It may hold what a String holds (visible ASCII and
//!   spaces). Parameters (`"abc-1";x=1`), a list (`"a", "b"`) or anything
//!   after the String are refused, each with its reason.
//! - Any other value is the bare form, taken byte for byte as it always
//!   was: visible ASCII, nothing parsed out of it. `abc-1`, `12345` and a
//!   UUID are keys as written, although a Structured Field parser would read
//!   the first as a Token and the second as an Integer, and so is `a;b=1` or
//!   `a,b`: `;` and `,` in a bare value are characters of the key, never
//!   parameters or list separators, so no key that worked before is read
//!   differently now. A bare value with spaces is refused, as before; when
//!   it is a list (two header lines joined by a proxy: `a, b`) the refusal
//!   says so. A bare key cannot start with `"` (that is the quoted form):
//!   the key `"abc` is sent quoted, `"\"abc"`.
//!
//! So the same characters, quoted or bare, are one key.

use std::borrow::Cow;

use http::HeaderValue;

/// Why a key header's value is not a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Fault {
    /// Bare, and not visible ASCII.
    NotVisibleAscii,
    /// Starts with `"`, and is not a lone Structured Field String.
    NotAString(String),
}

/// The key a key header's value carries: the content of a quoted String,
/// or the bare value as it is.
pub(super) fn key_of(value: &HeaderValue) -> Result<Cow<'_, str>, Fault> {
    let bytes = value.as_bytes();
    if bytes.first() != Some(&b'"') {
        return match value.to_str() {
            Ok(text) if text.bytes().all(|b| b.is_ascii_graphic()) => Ok(Cow::Borrowed(text)),
            _ => Err(list_or(bytes, Fault::NotVisibleAscii)),
        };
    }
    let item = match sfv::Parser::new(bytes).parse_item::<sfv::Item>() {
        Ok(item) => item,
        Err(err) => {
            return Err(list_or(
                bytes,
                Fault::NotAString(format!(
                    "a quoted key must be one Structured Field String (RFC 9651), such as \
                     \"8e03978e\"; this one is not ({err})"
                )),
            ));
        }
    };
    let sfv::BareItem::String(string) = item.bare_item else {
        // A value that starts with `"` can only parse as a String.
        return Err(Fault::NotAString("a quoted key must be a String".into()));
    };
    if !item.params.is_empty() {
        let names: Vec<&str> = item.params.keys().map(|k| k.as_str()).collect();
        return Err(Fault::NotAString(format!(
            "the key takes no parameters, and this one has {}: send the String alone",
            names.join(", ")
        )));
    }
    Ok(Cow::Owned(string.as_str().to_owned()))
}

/// `fault`, or, when the value is a list of several members (two key
/// headers joined into one line by a proxy), that reason instead.
fn list_or(bytes: &[u8], fault: Fault) -> Fault {
    match sfv::Parser::new(bytes).parse_list::<sfv::List>() {
        Ok(list) if list.len() > 1 => Fault::NotAString(format!(
            "the value is a list of {} keys (two key headers joined into one?): send one",
            list.len()
        )),
        Ok(list) if matches!(list.first(), Some(sfv::ListEntry::InnerList(_))) => {
            Fault::NotAString("the value is an Inner List: send one key".into())
        }
        _ => fault,
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn key(value: &str) -> Result<String, Fault> {
        key_of(&HeaderValue::from_str(value).unwrap()).map(Cow::into_owned)
    }

    fn refusal(value: &str) -> String {
        match key(value) {
            Err(Fault::NotAString(why)) => why,
            other => panic!("{value:?} gave {other:?}"),
        }
    }

    #[test]
    fn a_quoted_string_is_its_content() {
        assert_eq!(key(r#""abc-1""#).unwrap(), "abc-1");
        assert_eq!(
            key(r#""8e03978e-40d5-43e8-bc93-6894a57f9324""#).unwrap(),
            "8e03978e-40d5-43e8-bc93-6894a57f9324"
        );
        assert_eq!(key(r#""order 7 of 9""#).unwrap(), "order 7 of 9");
        assert_eq!(key(r#""say \"hi\" \\o/""#).unwrap(), r#"say "hi" \o/"#);
        assert_eq!(key(r#""""#).unwrap(), "");
    }

    #[test]
    fn bare_values_are_taken_as_written() {
        for value in [
            "abc-1",
            "12345",
            "-7.5",
            "8e03978e-40d5-43e8-bc93-6894a57f9324",
            "a;b=1",
            "a,b",
            "?1",
            ":aGk=:",
            "@1700000000",
            r#"ab"c"#,
            r#"x""#,
            "(a)",
        ] {
            assert_eq!(key(value).unwrap(), value);
        }
    }

    #[test]
    fn parameters_lists_and_broken_strings_are_refused_with_a_reason() {
        assert!(refusal(r#""abc-1";x=1"#).contains("no parameters, and this one has x"));
        assert!(refusal(r#""a";x;y=2"#).contains("x, y"));
        assert!(refusal(r#""a", "b""#).contains("list of 2 keys"));
        assert!(refusal(r#""a","b""#).contains("list of 2 keys"));
        assert!(refusal(r#""abc"#).contains("Structured Field String"));
        assert!(refusal(r#""a\x""#).contains("Structured Field String"));
        assert!(refusal(r#""a" junk"#).contains("Structured Field String"));
        assert!(refusal(r#"("a" "b")"#).contains("Inner List"));
        assert!(refusal("a, b").contains("list of 2 keys"));
    }

    #[test]
    fn bare_values_with_spaces_or_bytes_past_ascii_are_not_visible_ascii() {
        assert_eq!(key("a b"), Err(Fault::NotVisibleAscii));
        let latin = HeaderValue::from_bytes(b"caf\xe9").unwrap();
        assert_eq!(key_of(&latin), Err(Fault::NotVisibleAscii));
        let quoted_latin = HeaderValue::from_bytes(b"\"caf\xe9\"").unwrap();
        assert!(matches!(key_of(&quoted_latin), Err(Fault::NotAString(_))));
    }

    /// A String's serialisation: quotes, with `"` and `\` escaped.
    fn quoted(content: &str) -> String {
        let mut out = String::from('"');
        for c in content.chars() {
            if matches!(c, '"' | '\\') {
                out.push('\\');
            }
            out.push(c);
        }
        out.push('"');
        out
    }

    proptest! {
        /// Any visible-ASCII key, sent quoted (escaped as RFC 9651 says)
        /// or bare, is the same key. (A bare value cannot start with `"`:
        /// that is the quoted form. `\"abc` quoted is `"\"abc"`.)
        #[test]
        fn quoted_and_bare_are_one_key(content in "[!#-~][!-~]{0,63}") {
            let bare = key(&content).unwrap();
            prop_assert_eq!(&bare, &content);
            prop_assert_eq!(key(&quoted(&content)).unwrap(), bare);
        }

        /// Any String (spaces too) parses back to its content, and agrees
        /// with sfv's own serialiser.
        #[test]
        fn any_string_round_trips(content in "[ -~]{0,64}") {
            let serialised = sfv::ItemSerializer::new()
                .bare_item(sfv::StringRef::from_str(&content).unwrap())
                .finish();
            prop_assert_eq!(&serialised, &quoted(&content));
            prop_assert_eq!(key(&serialised).unwrap(), content);
        }
    }
}
