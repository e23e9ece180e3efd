//! The scripts of PostgreSQL's transactional claims
//! (`idem-sql/src/postgres/script.rs`, their digits written by
//! `idem-sql/src/hex_digits.rs`), sent without parameters, with values the
//! store writes into their text: whatever a key, a body, a hash or a
//! number holds, the script keeps its shape. Every quoted literal holds
//! hexadecimal digits only, and the text outside them is that of a script
//! of the same statements with other values (numbers aside). (SQLite's
//! take their values as bound parameters: `idem-sql/src/sqlite/script.rs`.)
//!
//! Input: a line with the key (any bytes, read as UTF-8 lossily, as a key
//! must be text), then the outcome (the rest, any bytes). The hash,
//! fingerprint and numbers are taken from the input's bytes.
#![no_main]

// The scripts write their literals' digits with this (`crate::hex_digits`).
#[path = "../../idem-sql/src/hex_digits.rs"]
mod hex_digits;
// What the fuzz target does not call (an error code) is not dead there.
#[allow(dead_code)]
#[path = "../../idem-sql/src/postgres/script.rs"]
mod pg;

use libfuzzer_sys::fuzz_target;

const TABLE: &str = "idem_records";

/// Fixed-size bytes taken from `data` (repeated, or zeros if empty).
fn bytes<const N: usize>(data: &[u8], salt: u8) -> [u8; N] {
    let mut out = [0; N];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = data.get(i % data.len().max(1)).copied().unwrap_or(0) ^ salt;
    }
    out
}

/// The script with every quoted literal emptied and every number written
/// `N`; panics if a literal holds anything but hexadecimal digits (after
/// the `\\x` of a PostgreSQL `bytea`), except the fixed words the scripts
/// quote.
fn shape(script: &str) -> String {
    let mut out = String::new();
    let mut rest = script;
    while let Some(open) = rest.find('\'') {
        out.push_str(&numbers(&rest[..open]));
        let after = &rest[open + 1..];
        let close = after.find('\'').expect("every quote is closed");
        let literal = &after[..close];
        let marked = format!("{}; marked ", pg::ENDED);
        let fixed = [
            "UTF8",
            "C",
            "I",
            "lock_timeout",
            "now",
            "1 millisecond",
            "idem.claim",
            "idle_in_transaction_session_timeout",
            "nothing",
            &marked,
        ];
        // Bytes are an escape string `E'\\x…'`.
        let digits = literal.strip_prefix(r"\\x").unwrap_or(literal);
        let hex = digits.bytes().all(|b| b.is_ascii_hexdigit());
        let timeout = literal
            .strip_suffix("ms")
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
        assert!(
            hex || timeout || fixed.contains(&literal),
            "a literal that is not hexadecimal digits: {literal:?} in {script}"
        );
        out.push_str(if hex { "''" } else { "'w'" });
        rest = &after[close + 1..];
    }
    out.push_str(&numbers(rest));
    out
}

/// `text` with every run of digits (and a minus sign before it) as `N`.
fn numbers(text: &str) -> String {
    let mut out = String::new();
    let mut in_number = false;
    for c in text.chars() {
        if c.is_ascii_digit() || (c == '-' && !in_number) {
            if !in_number {
                out.push('N');
                in_number = true;
            }
        } else {
            in_number = false;
            out.push(c);
        }
    }
    out
}

fn scripts(key: &str, outcome: &[u8], data: &[u8]) -> [String; 6] {
    let hash = bytes::<32>(data, 1);
    let fingerprint = bytes::<32>(data, 3);
    let owner = bytes::<16>(data, 5);
    let number = i64::from_le_bytes(bytes::<8>(data, 4));
    let timeout_ms = u128::from(number.unsigned_abs());
    let record = pg::Completed {
        key_hash: &hash,
        key,
        fingerprint: &fingerprint,
        outcome,
        ttl_ms: number,
    };
    [
        pg::claim(TABLE, number, &hash, timeout_ms),
        pg::prepare_and_claim(TABLE, number, &hash, timeout_ms),
        pg::lend(&owner, timeout_ms),
        pg::commit(TABLE, &record, &owner),
        pg::rollback(&owner),
        pg::tombstone(TABLE, &record),
    ]
}

fuzz_target!(|data: &[u8]| {
    let (key, outcome) = match data.iter().position(|&b| b == b'\n') {
        Some(at) => (&data[..at], &data[at + 1..]),
        None => (data, &[][..]),
    };
    let key = String::from_utf8_lossy(key);
    let reference = scripts("key", b"outcome", b"\x07");
    for (script, reference) in scripts(&key, outcome, data).iter().zip(&reference) {
        assert_eq!(shape(script), shape(reference), "{script}");
    }
});
