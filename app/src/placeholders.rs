//! Writing the examples' SQL once, with PostgreSQL's and SQLite's `$1`
//! parameters, and running it on MySQL too.

/// `$1`, `$2`, ... as MySQL's `?`, one per occurrence: right for statements
/// that name each parameter in order, or bind a repeated one again.
///
/// ```
/// use idem_app::placeholders::positional;
///
/// assert_eq!(positional("UPDATE t SET a = $1 WHERE b = $2"), "UPDATE t SET a = ? WHERE b = ?");
/// ```
pub fn positional(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '$' && chars.peek().is_some_and(char::is_ascii_digit) {
            while chars.peek().is_some_and(char::is_ascii_digit) {
                chars.next();
            }
            out.push('?');
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::positional;

    #[test]
    fn positional_parameters_for_mysql() {
        assert_eq!(
            positional("UPDATE t SET a = $1 WHERE b = $2 AND c = $10"),
            "UPDATE t SET a = ? WHERE b = ? AND c = ?"
        );
        assert_eq!(
            positional("a LIKE $1 AND b LIKE $1"),
            "a LIKE ? AND b LIKE ?"
        );
        assert_eq!(positional("SELECT '$' || x"), "SELECT '$' || x");
    }
}
