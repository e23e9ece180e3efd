//! `KeyTemplate::parse` on arbitrary UTF-8 (the first line of the input),
//! and, when it parses, `evaluate` against the request the other lines
//! describe (see `idem_fuzz`). Nothing may panic, every error must be a typed
//! one that points inside the template, and every key built must keep the
//! promises of ARCHITECTURE.md, "Keys and callers".
#![no_main]

use idem_core::{KeyError, KeyTemplate, MAX_PART_LEN, Placeholder};
use idem_fuzz::{FuzzRequest, split_first_line};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (template, rest) = split_first_line(data);
    let template = String::from_utf8_lossy(template);

    let parsed = match KeyTemplate::parse(&template) {
        Ok(parsed) => parsed,
        Err(err) => {
            // The span is what the macro underlines: it must be a real slice.
            assert!(
                template.get(err.span()).is_some(),
                "span {:?} of {:?} is not a slice of {template:?}",
                err.span(),
                err.kind()
            );
            assert!(!err.to_string().is_empty());
            return;
        }
    };
    assert_eq!(parsed.as_str(), template);
    assert_eq!(parsed.to_string(), template);
    assert_eq!(KeyTemplate::parse(parsed.as_str()).as_ref(), Ok(&parsed));
    let placeholders: Vec<&Placeholder> = parsed.placeholders().collect();
    assert!(
        placeholders.iter().any(|p| p.is_per_request()),
        "{template:?} parsed without a per-request placeholder"
    );
    assert_eq!(
        parsed.reads_body(),
        placeholders
            .iter()
            .any(|p| matches!(p, Placeholder::Body(_)))
    );

    let request = FuzzRequest::parse(rest);
    let method = request.method();
    let view = request.view(&method);
    let namespace = request.namespace();
    match parsed.evaluate(&view, namespace) {
        Ok(key) => {
            let composite = key.composite();
            assert_eq!(key.as_str(), format!("{namespace}{{{composite}}}"));
            // One hash tag around the whole composite: no brace may leak out
            // of a value (Redis Cluster would slot on a part of the key).
            assert!(!composite.contains(['{', '}']), "{composite:?} has a brace");
            assert!(
                composite.bytes().all(|b| b.is_ascii_graphic()),
                "{composite:?} is not visible ASCII"
            );
            // The template's parts, then the caller scope (`:@tenant=`,
            // `:@user=`), each value escaped to at most three bytes a byte.
            let scope = 2 * (":@tenant=".len() + 3 * MAX_PART_LEN);
            assert!(
                composite.len() <= template.len() + placeholders.len() * 3 * MAX_PART_LEN + scope
            );
            for p in &placeholders {
                assert!(view.is_present(p), "{p} resolved but is not present");
            }
            assert_eq!(parsed.evaluate(&view, namespace).ok(), Some(key));
        }
        Err(err) => {
            if let Some(p) = err.placeholder() {
                // The caller's tenant and user scope every key, named or not.
                let scope = matches!(p, Placeholder::Tenant | Placeholder::User);
                assert!(
                    placeholders.contains(&p) || scope,
                    "{err:?} names a foreign placeholder"
                );
            }
            match &err {
                KeyError::BodyNotJson => assert!(parsed.reads_body()),
                KeyError::Missing(p) => assert!(!view.is_present(p)),
                KeyError::TooLong { len, .. } => assert!(*len > MAX_PART_LEN),
                _ => {}
            }
            assert!(!err.to_string().is_empty());
        }
    }
});
