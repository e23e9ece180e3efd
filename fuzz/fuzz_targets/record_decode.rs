//! `Record::decode` and `Outcome::decode` on arbitrary bytes: never a
//! panic, only a `DecodeError`; and whatever decodes re-encodes to bytes of
//! the same length that decode to the same value, and re-encoding that is a
//! fixed point (repeated headers may come back grouped by name, nothing else
//! may move).
#![no_main]

use idem_core::{Outcome, Record};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(record) = Record::decode(data) {
        let encoded = record.encode();
        assert_eq!(encoded.len(), data.len(), "{record:?}");
        let again = Record::decode(&encoded).expect("a re-encoded record decodes");
        assert_eq!(again, record);
        assert_eq!(again.encode(), encoded);
        match &record {
            // Everything but a response's header order is canonical.
            Record::InFlight { .. }
            | Record::Completed {
                outcome: Outcome::NotReplayable,
                ..
            } => assert_eq!(&encoded[..], data),
            // A completed record is version, tag, fingerprint, then the
            // outcome's own encoding (the Redis scripts rely on it).
            Record::Completed {
                fingerprint,
                outcome,
            } => {
                assert_eq!(&encoded[2..34], fingerprint.as_bytes());
                assert_eq!(&encoded[34..], &outcome.encode()[..]);
            }
        }
    }

    if let Ok(outcome) = Outcome::decode(data) {
        let encoded = outcome.encode();
        assert_eq!(encoded.len(), data.len(), "{outcome:?}");
        let again = Outcome::decode(&encoded).expect("a re-encoded outcome decodes");
        assert_eq!(again, outcome);
        assert_eq!(again.encode(), encoded);
    }
});
