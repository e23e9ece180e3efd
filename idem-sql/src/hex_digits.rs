//! Bytes as lowercase hexadecimal digits, for the literals of the SQL
//! scripts (`postgres/script.rs`, `sqlite/script.rs`). Needs nothing but
//! std: the fuzz target `fuzz/fuzz_targets/sql_script.rs` includes it by
//! path, as it includes the scripts.

/// Appends two hexadecimal digits per byte of `value` to `out`.
pub(crate) fn push(out: &mut String, value: &[u8]) {
    /// Each byte's two digits.
    const PAIRS: [[u8; 2]; 256] = {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut pairs = [[0; 2]; 256];
        let mut n = 0;
        while n < 256 {
            pairs[n] = [DIGITS[n >> 4], DIGITS[n & 0x0f]];
            n += 1;
        }
        pairs
    };
    /// Bytes written to the stack buffer at a time.
    const CHUNK: usize = 256;
    // Digits into a buffer on the stack, a pair per byte from the table,
    // then one `push_str` per chunk: a `push` per digit, into the string or
    // a vector, cost several times as much (callgrind profiles of the
    // scripts, which write a stored response's bytes as digits).
    out.reserve(value.len() * 2);
    let mut buffer = [0; 2 * CHUNK];
    for chunk in value.chunks(CHUNK) {
        let digits = &mut buffer[..2 * chunk.len()];
        for (pair, &byte) in digits.chunks_exact_mut(2).zip(chunk) {
            pair.copy_from_slice(&PAIRS[usize::from(byte)]);
        }
        out.push_str(std::str::from_utf8(digits).expect("ASCII digits"));
    }
}

/// The bytes of `digits`, two hexadecimal digits (either case) a byte;
/// `None` if it holds anything else or an odd count. Text-format `bytea`
/// answers (`\\x…`) come back this way: sqlx's own decoding of them took
/// more instructions per byte than the rest of reading a record (a
/// callgrind profile of PostgreSQL's transactional replays).
#[cfg(feature = "postgres")]
pub(crate) fn decode(digits: &[u8]) -> Option<Vec<u8>> {
    /// Each byte's value as a digit, or 0xff.
    const VALUES: [u8; 256] = {
        let mut values = [0xff; 256];
        let mut n = 0;
        while n < 10 {
            values[b'0' as usize + n] = n as u8;
            n += 1;
        }
        let mut n = 0;
        while n < 6 {
            values[b'a' as usize + n] = 10 + n as u8;
            values[b'A' as usize + n] = 10 + n as u8;
            n += 1;
        }
        values
    };
    if !digits.len().is_multiple_of(2) {
        return None;
    }
    let mut out = Vec::with_capacity(digits.len() / 2);
    for pair in digits.chunks_exact(2) {
        let (high, low) = (VALUES[usize::from(pair[0])], VALUES[usize::from(pair[1])]);
        if (high | low) > 0x0f {
            return None;
        }
        out.push(high << 4 | low);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    #[test]
    fn two_lowercase_digits_per_byte() {
        let mut out = String::from("x");
        super::push(&mut out, &[0x00, 0x0f, 0xa5, 0xff]);
        assert_eq!(out, "x000fa5ff");
    }

    #[test]
    fn values_longer_than_a_chunk_are_written_whole() {
        let value: Vec<u8> = (0..1000u32).map(|n| (n * 7 % 256) as u8).collect();
        let mut out = String::new();
        super::push(&mut out, &value);
        let expected: String = value.iter().map(|byte| format!("{byte:02x}")).collect();
        assert_eq!(out, expected);
    }

    #[cfg(feature = "postgres")]
    #[test]
    fn digits_decode_to_the_bytes_they_encode() {
        let bytes: Vec<u8> = (0..=255).collect();
        let mut digits = String::new();
        super::push(&mut digits, &bytes);
        assert_eq!(super::decode(digits.as_bytes()), Some(bytes));
        assert_eq!(super::decode(b"0A0f"), Some(vec![0x0a, 0x0f]));
        assert_eq!(super::decode(b""), Some(vec![]));
        for bad in [&b"0"[..], b"0g", b"x0", b"\\x00"] {
            assert_eq!(super::decode(bad), None, "{bad:?}");
        }
    }
}
