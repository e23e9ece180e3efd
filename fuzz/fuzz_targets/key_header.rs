//! The key header path: `idempotency-key` values as a client sends them
//! (absent, repeated, empty, oversize, non-UTF-8, quoted as the IETF draft
//! writes them or bare) evaluated through the
//! template `op:{tenant}:{header:idempotency-key}`, scoped to the caller (a
//! user the template does not name is appended as `:@user=...`), checked
//! against an
//! independent oracle of ARCHITECTURE.md, "Keys and callers"; and `Fingerprint::of` on
//! arbitrary bodies and queries. Input format: see `idem_fuzz` (`T`, `K`,
//! `H`, `Q`, `B` lines).
#![no_main]

use std::sync::LazyLock;

use idem_core::{Fingerprint, FingerprintSpec, KeyError, KeyTemplate, Placeholder};
use idem_fuzz::{
    FuzzRequest, KEY_HEADER, PartFault, escape, key_faults, key_header_value, part_faults,
};
use libfuzzer_sys::fuzz_target;

static TEMPLATE: LazyLock<KeyTemplate> = LazyLock::new(|| {
    "op:{tenant}:{header:idempotency-key}"
        .parse()
        .expect("the fixed template parses")
});

/// The first part that is refused, and why; `None` if the key must build.
fn expected_fault(request: &FuzzRequest) -> Option<(Placeholder, Vec<PartFault>)> {
    let tenant = request.tenant.as_deref().map(str::as_bytes).unwrap_or(b"");
    let faults = part_faults(tenant);
    if !faults.is_empty() {
        return Some((Placeholder::Tenant, faults));
    }
    let header = Placeholder::Header(KEY_HEADER);
    match request.key_values.as_slice() {
        [] => return Some((header, vec![PartFault::Missing])),
        [value] => {
            // `None` stands for "not a lone String", refused as NotAString.
            let faults = match key_header_value(value) {
                Ok(content) => key_faults(&content, value.starts_with(b"\"")),
                Err(fault) => fault.into_iter().collect(),
            };
            if !faults.is_empty() || key_header_value(value).is_err() {
                return Some((header, faults));
            }
        }
        _ => return Some((header, Vec::new())), // repeated
    }
    // The caller scope comes after the template's own parts. No user is a
    // scope of its own; a malformed one is refused.
    let user = request.user.as_deref().map(str::as_bytes).unwrap_or(b"");
    let faults: Vec<PartFault> = part_faults(user)
        .into_iter()
        .filter(|f| *f != PartFault::Missing)
        .collect();
    (!user.is_empty() && !faults.is_empty()).then_some((Placeholder::User, faults))
}

fn check_key(request: &FuzzRequest) {
    let method = request.method();
    let view = request.view(&method);
    let result = TEMPLATE.evaluate(&view, "idem:");
    match (expected_fault(request), result) {
        (None, Ok(key)) => {
            let tenant = request.tenant.as_deref().unwrap();
            let content = key_header_value(&request.key_values[0]).unwrap();
            let value = std::str::from_utf8(&content).unwrap();
            let mut composite = format!("op:{}:{}", escape(tenant), escape(value));
            if let Some(user) = request.user.as_deref().filter(|u| !u.is_empty()) {
                composite.push_str(&format!(":@user={}", escape(user)));
            }
            assert_eq!(key.composite(), composite);
            assert_eq!(key.as_str(), format!("idem:{{{composite}}}"));
        }
        (None, Err(err)) => panic!("a valid key was refused: {err:?}"),
        (Some((part, faults)), Ok(key)) => {
            panic!("{part} should be refused ({faults:?}), built {key:?}")
        }
        (Some((part, faults)), Err(err)) => {
            assert_eq!(err.placeholder(), Some(&part), "{err:?}");
            let fault = match &err {
                KeyError::Repeated(_) => {
                    assert!(request.key_values.len() > 1, "{err:?}");
                    return;
                }
                // Not a lone String; or a bare value refused anyway, whose
                // refusal says it is a list.
                KeyError::NotAString { .. } => {
                    assert!(
                        key_header_value(&request.key_values[0]).is_err()
                            || faults.contains(&PartFault::NotVisibleAscii),
                        "{err:?}"
                    );
                    return;
                }
                KeyError::Missing(_) => PartFault::Missing,
                KeyError::TooLong { len, .. } => {
                    assert!(*len > idem_core::MAX_PART_LEN);
                    PartFault::TooLong
                }
                KeyError::NotVisibleAscii(_) => PartFault::NotVisibleAscii,
                other => panic!("unexpected error for {part}: {other:?}"),
            };
            assert!(
                faults.contains(&fault),
                "{err:?}, expected one of {faults:?}"
            );
        }
    }
}

fn check_fingerprint(request: &FuzzRequest) {
    let method = request.method();
    let view = request.view(&method);
    let whole = Fingerprint::of(&view, &FingerprintSpec::Request).expect("never refused");
    assert_eq!(
        Fingerprint::of(&view, &FingerprintSpec::Request).unwrap(),
        whole
    );
    Fingerprint::of(&view, &FingerprintSpec::MethodAndRoute).expect("never refused");

    let json: Option<serde_json::Value> = serde_json::from_slice(&request.body).ok();
    let fields = FingerprintSpec::JsonFields(vec!["/a".into(), "/b/0".into(), "".into()]);
    match Fingerprint::of(&view, &fields) {
        Ok(_) => assert!(json.is_some()),
        Err(err) => {
            assert_eq!(err, KeyError::BodyNotJson);
            assert!(json.is_none());
        }
    }

    // Whitespace around a JSON body does not change what was asked.
    let mut padded = b" \n\t".to_vec();
    padded.extend_from_slice(&request.body);
    padded.extend_from_slice(b"\r\n ");
    let padded_view = request.view(&method).body(&padded);
    let padded_fp = Fingerprint::of(&padded_view, &FingerprintSpec::Request).unwrap();
    if json.is_some() {
        assert_eq!(padded_fp, whole, "whitespace changed a JSON fingerprint");
    }

    // Nor does re-serialising it (other whitespace, key order, escapes),
    // as long as that keeps its numbers: serde_json's default float parsing
    // is not correctly rounded, so a number may not survive a round trip
    // through its shortest form (`2222...2` with 112 digits does not), and
    // fingerprints hash numbers as parsed.
    if let Some(json) = json {
        for body in [
            serde_json::to_vec(&json).unwrap(),
            serde_json::to_vec_pretty(&json).unwrap(),
        ] {
            if serde_json::from_slice::<serde_json::Value>(&body).ok() != Some(json.clone()) {
                continue;
            }
            let again = request.view(&method).body(&body);
            assert_eq!(
                Fingerprint::of(&again, &FingerprintSpec::Request).unwrap(),
                whole,
                "re-serialised JSON changed the fingerprint"
            );
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let request = FuzzRequest::parse(data);
    check_key(&request);
    check_fingerprint(&request);
});
