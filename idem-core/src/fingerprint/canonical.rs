//! A JSON body's canonical form, written straight from its bytes.
//!
//! The fingerprint hashes JSON by value, not by text: object members in key
//! order, a repeated key counting once with its last value, numbers as
//! serde_json prints them. Building a `serde_json::Value` for that costs an
//! allocation per string, number and member; this visitor writes the same
//! bytes as it parses, and sorts each object's members in place at its end.

use std::fmt;
use std::ops::Range;

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};

use super::Hasher;

/// Writes the canonical form of `body` to `h`, or returns `false` and writes
/// nothing if `body` is not one JSON value (with optional whitespace around).
pub(super) fn write(h: &mut Hasher, body: &[u8]) -> bool {
    let start = h.0.len();
    let mut de = serde_json::Deserializer::from_slice(body);
    let ok = Canonical(h).deserialize(&mut de).is_ok() && de.end().is_ok();
    if !ok {
        h.0.truncate(start);
    }
    ok
}

/// Writes one JSON value.
struct Canonical<'h>(&'h mut Hasher);

impl<'de> DeserializeSeed<'de> for Canonical<'_> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl Canonical<'_> {
    fn number(self, n: serde_json::Number) {
        self.0.tag(b'#');
        self.0.display(&n);
    }

    fn string(self, s: &str) {
        self.0.tag(b's');
        self.0.bytes(s.as_bytes());
    }
}

impl<'de> Visitor<'de> for Canonical<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        self.0.tag(b'n');
        Ok(())
    }

    fn visit_bool<E>(self, v: bool) -> Result<(), E> {
        self.0.tag(if v { b't' } else { b'f' });
        Ok(())
    }

    fn visit_u64<E>(self, v: u64) -> Result<(), E> {
        self.number(v.into());
        Ok(())
    }

    fn visit_i64<E>(self, v: i64) -> Result<(), E> {
        self.number(v.into());
        Ok(())
    }

    fn visit_f64<E>(self, v: f64) -> Result<(), E> {
        // As serde_json's own Value does with a float it cannot represent.
        match serde_json::Number::from_f64(v) {
            Some(n) => self.number(n),
            None => self.0.tag(b'n'),
        }
        Ok(())
    }

    fn visit_str<E>(self, v: &str) -> Result<(), E> {
        self.string(v);
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let h = self.0;
        h.tag(b'[');
        let count_at = h.0.len();
        h.len(0);
        let mut count = 0;
        while seq.next_element_seed(Canonical(h))?.is_some() {
            count += 1;
        }
        h.patch_len(count_at, count);
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let h = self.0;
        h.tag(b'{');
        let count_at = h.0.len();
        h.len(0);
        let first = h.0.len();
        // Each member is written as it comes: its key (length-prefixed),
        // then its value.
        let mut members: Vec<Member> = Vec::new();
        while map.next_key_seed(Key(h))?.is_some() {
            let start = members.last().map_or(first, |m| m.bytes.end);
            let key_end = h.0.len();
            map.next_value_seed(Canonical(h))?;
            members.push(Member {
                key: start + 8..key_end,
                bytes: start..h.0.len(),
            });
        }
        let count = sort_members(&mut h.0, first, members);
        h.patch_len(count_at, count);
        Ok(())
    }
}

/// Writes an object's key, length-prefixed.
struct Key<'h>(&'h mut Hasher);

impl<'de> DeserializeSeed<'de> for Key<'_> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for Key<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object key")
    }

    fn visit_str<E>(self, v: &str) -> Result<(), E> {
        self.0.bytes(v.as_bytes());
        Ok(())
    }
}

/// Where one object member was written.
struct Member {
    key: Range<usize>,
    bytes: Range<usize>,
}

/// Puts the members written from `first` to the end of `out` in key order,
/// keeping only the last of any repeated key; returns how many remain.
fn sort_members(out: &mut Vec<u8>, first: usize, mut members: Vec<Member>) -> usize {
    let key = |m: &Member| &out[m.key.clone()];
    let sorted = members.windows(2).all(|w| key(&w[0]) < key(&w[1]));
    if sorted {
        return members.len();
    }
    // Stable, so that among equal keys the last written stays last.
    members.sort_by(|a, b| key(a).cmp(key(b)));
    let mut kept = 0;
    for i in 0..members.len() {
        let replaced = members
            .get(i + 1)
            .is_some_and(|next| key(next) == key(&members[i]));
        if !replaced {
            members.swap(kept, i);
            kept += 1;
        }
    }
    members.truncate(kept);
    let written = out.split_off(first);
    for member in &members {
        let bytes = member.bytes.start - first..member.bytes.end - first;
        out.extend_from_slice(&written[bytes]);
    }
    kept
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::Value;

    use super::*;

    fn from_text(text: &str) -> Option<Vec<u8>> {
        let mut h = Hasher(Vec::new());
        write(&mut h, text.as_bytes()).then_some(h.0)
    }

    fn from_value(value: &Value) -> Vec<u8> {
        let mut h = Hasher(Vec::new());
        h.json(value);
        h.0
    }

    fn json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<f64>().prop_map(Value::from),
            "[a-c\"\\\\é\u{1F600}]{0,4}".prop_map(Value::from),
        ];
        leaf.prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::btree_map("[a-d]{0,2}", inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    /// `value` as text, its members in an order set by `seed`, some of them
    /// preceded by a stale copy of the same key that the later one replaces.
    fn shuffled(value: &Value, seed: &mut u64, out: &mut String) {
        let mut next = || {
            *seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            *seed >> 33
        };
        match value {
            Value::Array(items) => {
                out.push_str("[ ");
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(" ,\n");
                    }
                    shuffled(item, seed, out);
                }
                out.push(']');
            }
            Value::Object(map) => {
                let mut members: Vec<_> = map.iter().collect();
                for i in (1..members.len()).rev() {
                    members.swap(i, next() as usize % (i + 1));
                }
                let stale: Vec<bool> = members.iter().map(|_| next() % 3 == 0).collect();
                out.push('{');
                for (i, ((key, value), stale)) in members.into_iter().zip(stale).enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    let key = Value::from(key.as_str()).to_string();
                    if stale {
                        out.push_str(&format!("{key}: \"stale\", "));
                    }
                    out.push_str(&key);
                    out.push_str(" : ");
                    shuffled(value, seed, out);
                }
                out.push('}');
            }
            scalar => out.push_str(&scalar.to_string()),
        }
    }

    proptest! {
        /// The streaming form is byte for byte what walking the parsed value
        /// writes, whatever the member order, whitespace or repeated keys.
        #[test]
        fn matches_the_parsed_value(value in json(), mut seed in any::<u64>()) {
            let mut text = String::new();
            shuffled(&value, &mut seed, &mut text);
            // What the text parses to (floats may come back a bit off).
            let parsed: Value = serde_json::from_str(&text).unwrap();
            prop_assert_eq!(from_text(&text), Some(from_value(&parsed)));
        }
    }

    #[test]
    fn not_json_writes_nothing() {
        for text in ["", "{", "[1,]", "{\"a\":1} x", "nul", "{\"a\" 1}", "1 2"] {
            assert_eq!(from_text(text), None, "{text:?}");
        }
        assert_eq!(from_text(" 1 "), Some(from_value(&Value::from(1))));
    }

    #[test]
    fn nesting_beyond_serde_json_limit_is_not_json() {
        let deep = "[".repeat(200) + &"]".repeat(200);
        assert!(serde_json::from_str::<Value>(&deep).is_err());
        assert_eq!(from_text(&deep), None);
    }
}
