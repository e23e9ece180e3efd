//! Bytes as lowercase hexadecimal digits, for the literals of the SQL
//! scripts (`postgres/script.rs`, `sqlite/script.rs`). Needs nothing but
//! std: the fuzz target `fuzz/fuzz_targets/sql_script.rs` includes it by
//! path, as it includes the scripts.

/// Appends two hexadecimal digits per byte of `value` to `out`.
pub(crate) fn push(out: &mut String, value: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    // Into bytes first, then one `push_str`: a `push` per digit costs
    // several times as much (a profile of the MySQL scripts, which write
    // a response's bytes as digits).
    let mut digits = Vec::with_capacity(value.len() * 2);
    for &byte in value {
        digits.push(DIGITS[usize::from(byte >> 4)]);
        digits.push(DIGITS[usize::from(byte & 0x0f)]);
    }
    out.push_str(std::str::from_utf8(&digits).expect("ASCII digits"));
}

#[cfg(test)]
mod tests {
    #[test]
    fn two_lowercase_digits_per_byte() {
        let mut out = String::from("x");
        super::push(&mut out, &[0x00, 0x0f, 0xa5, 0xff]);
        assert_eq!(out, "x000fa5ff");
    }
}
