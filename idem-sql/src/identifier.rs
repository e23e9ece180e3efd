//! The check every table and column name spliced into SQL passes.

use idem_core::{Error, ErrorKind};

/// Checks that `name` is an identifier, as every table and column name
/// spliced into SQL unquoted must be (the stores' tables, the guards' tables
/// and columns): ASCII letters, digits and underscores, not starting with a
/// digit, at most 48 bytes. An [`ErrorKind::Config`] error if not.
pub fn validate_identifier(name: &str) -> Result<(), Error> {
    let mut bytes = name.bytes();
    let valid = name.len() <= 48
        && bytes
            .next()
            .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if valid {
        Ok(())
    } else {
        Err(Error::new(
            ErrorKind::Config,
            format!(
                "{name:?} is not a valid SQL identifier: use ASCII letters, digits and \
                 underscores, not starting with a digit, at most 48 bytes"
            ),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_are_identifiers() {
        for ok in ["idem_records", "_t", "T2", &"a".repeat(48)] {
            assert!(validate_identifier(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "1t",
            "t-t",
            "t;drop table x",
            "s.t",
            "t t",
            &"a".repeat(49),
            "é",
        ] {
            let err = validate_identifier(bad).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Config, "{bad}");
        }
    }
}
