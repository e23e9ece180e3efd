//! Values written into a statement's text, for statements sent as simple
//! queries: one protocol message, answered whole by one server session,
//! which a pooler in transaction pooling never splits
//! (ARCHITECTURE.md, "Behind a pooler").
//!
//! No byte of a value reaches the text as it is: bytes and text go as
//! hexadecimal digits in an escape string ([`script::bytes`]), integers as
//! digits in a cast. So no value can end a literal, start a comment
//! (`- -1` would) or carry a NUL byte, which a simple query cannot hold.

use super::script::bytes;
use crate::dialect::Value;

/// `value` as an SQL expression of the type sqlx binds it as: `BIGINT`,
/// `BYTEA` or `TEXT` (UTF-8 decoded by the server from its bytes).
pub(crate) fn literal(value: &Value<'_>) -> String {
    match *value {
        Value::Int(i) => format!("CAST({i} AS BIGINT)"),
        Value::Bytes(b) => format!("CAST({} AS BYTEA)", bytes(b)),
        Value::Text(s) => format!(
            "convert_from(CAST({} AS BYTEA), 'UTF8')",
            bytes(s.as_bytes())
        ),
    }
}

/// `sql` with each parameter `$n` replaced by the `literal` of
/// `args[n - 1]`, to be sent as a simple query. `$` inside a quoted literal,
/// a quoted identifier or a comment, or within a name (`a$1`), is left as
/// it is. An error if a parameter has no argument.
///
/// ```
/// use idem_sql::__postgres::inline;
/// use idem_sql::Value;
///
/// let sql = inline("SELECT '$1', $1 + $2", &[Value::Int(-1), Value::Int(2)]).unwrap();
/// assert_eq!(sql, "SELECT '$1', CAST(-1 AS BIGINT) + CAST(2 AS BIGINT)");
/// ```
pub fn inline(sql: &str, args: &[Value<'_>]) -> Result<String, sqlx::Error> {
    let mut out = String::with_capacity(sql.len() + 64 * args.len());
    let mut chars = sql.char_indices().peekable();
    // The quote that closes the literal or identifier we are in, if any.
    let mut quoted: Option<char> = None;
    let mut previous = ' ';
    while let Some((at, c)) = chars.next() {
        match quoted {
            Some(close) => {
                if c == close {
                    quoted = None;
                }
                out.push(c);
            }
            None if c == '\'' || c == '"' => {
                quoted = Some(c);
                out.push(c);
            }
            None if c == '-' && sql[at..].starts_with("--") => {
                // A line comment, to its end.
                let end = sql[at..].find('\n').map_or(sql.len(), |n| at + n);
                out.push_str(&sql[at..end]);
                while chars.peek().is_some_and(|&(i, _)| i < end) {
                    chars.next();
                }
            }
            None if c == '/' && sql[at..].starts_with("/*") => {
                let end = sql[at + 2..].find("*/").map_or(sql.len(), |n| at + n + 4);
                out.push_str(&sql[at..end]);
                while chars.peek().is_some_and(|&(i, _)| i < end) {
                    chars.next();
                }
            }
            None if c == '$'
                && !(previous.is_alphanumeric() || previous == '_' || previous == '$')
                && chars.peek().is_some_and(|&(_, d)| d.is_ascii_digit()) =>
            {
                let mut n = 0usize;
                while let Some(&(_, d)) = chars.peek().filter(|(_, d)| d.is_ascii_digit()) {
                    n = n
                        .saturating_mul(10)
                        .saturating_add(d as usize - '0' as usize);
                    chars.next();
                }
                let arg = n.checked_sub(1).and_then(|i| args.get(i)).ok_or_else(|| {
                    sqlx::Error::Protocol(format!(
                        "statement parameter ${n} has no argument ({} given)",
                        args.len()
                    ))
                })?;
                out.push_str(&literal(arg));
                previous = '0';
                continue;
            }
            None => out.push(c),
        }
        previous = c;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_become_literals_of_their_type() {
        let sql = inline(
            "UPDATE t SET a = $2, b = $10 WHERE c = $1 AND d = x - $3",
            &[
                Value::Text("it's"),
                Value::Bytes(b"\x00"),
                Value::Int(-5),
                Value::Int(0),
                Value::Int(0),
                Value::Int(0),
                Value::Int(0),
                Value::Int(0),
                Value::Int(0),
                Value::Int(10),
            ],
        )
        .unwrap();
        assert_eq!(
            sql,
            "UPDATE t SET a = CAST(E'\\\\x00' AS BYTEA), b = CAST(10 AS BIGINT) \
             WHERE c = convert_from(CAST(E'\\\\x69742773' AS BYTEA), 'UTF8') \
             AND d = x - CAST(-5 AS BIGINT)"
        );
    }

    #[test]
    fn dollars_in_literals_names_and_comments_stay() {
        let sql = "SELECT 'a$1''$1', \"x$1\", a$1, $1 -- $1\n, $1 /* $1 */";
        assert_eq!(
            inline(sql, &[Value::Int(7)]).unwrap(),
            "SELECT 'a$1''$1', \"x$1\", a$1, CAST(7 AS BIGINT) -- $1\n, \
             CAST(7 AS BIGINT) /* $1 */"
        );
    }

    #[test]
    fn a_parameter_without_an_argument_is_an_error() {
        assert!(inline("SELECT $2", &[Value::Int(1)]).is_err());
        assert!(inline("SELECT $0", &[Value::Int(1)]).is_err());
    }
}
