//! The keys duplicates hit most: a retry storm, or a client that reuses
//! keys.
//!
//! Space-Saving (Metwally et al.): a fixed number of slots, so memory is
//! bounded whatever the traffic; a key seen often enough is always in it,
//! and its count is over-estimated by at most the count it took over.

use std::collections::HashMap;
use std::sync::Mutex;

/// How many keys are tracked: [`Idempotency::TRACKED_KEYS`](crate::Idempotency::TRACKED_KEYS).
pub(crate) const TRACKED_KEYS: usize = 128;
/// How much of a key is kept (keys carry tenant and user ids; the start,
/// with the operation's scope, is what an operator needs).
const KEY_LABEL_LEN: usize = 64;

/// One key and how often duplicates hit it: see
/// [`Idempotency::top_duplicated_keys`](crate::Idempotency::top_duplicated_keys).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DuplicatedKey {
    /// The start of the composite key, such as `order-create:acme:u-7:8e03`.
    pub key: String,
    /// Duplicates seen for it (an upper bound).
    pub count: u64,
}

#[derive(Debug, Default)]
pub(crate) struct DuplicatedKeys {
    slots: Mutex<HashMap<String, u64>>,
}

impl DuplicatedKeys {
    pub(crate) fn record(&self, composite: &str) {
        let label = label(composite);
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        // A key already tracked (the storm case) costs one lookup, no copy.
        if let Some(count) = slots.get_mut(label) {
            *count += 1;
            return;
        }
        if slots.len() < TRACKED_KEYS {
            slots.insert(label.to_owned(), 1);
            return;
        }
        // Full: the least counted key gives its slot, and its count, away.
        let (evicted, floor) = slots
            .iter()
            .min_by_key(|(_, count)| **count)
            .map(|(key, count)| (key.clone(), *count))
            .expect("a full table has a minimum");
        slots.remove(&evicted);
        slots.insert(label.to_owned(), floor + 1);
    }

    pub(crate) fn top(&self, n: usize) -> Vec<DuplicatedKey> {
        let slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        let mut top: Vec<DuplicatedKey> = slots
            .iter()
            .map(|(key, count)| DuplicatedKey {
                key: key.clone(),
                count: *count,
            })
            .collect();
        top.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.key.cmp(&b.key)));
        top.truncate(n);
        top
    }
}

/// The first [`KEY_LABEL_LEN`] characters of `composite`.
fn label(composite: &str) -> &str {
    match composite.char_indices().nth(KEY_LABEL_LEN) {
        Some((end, _)) => &composite[..end],
        None => composite,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heavy_hitters_survive_a_flood_of_one_off_keys() {
        let c = DuplicatedKeys::default();
        for round in 0..50 {
            c.record("storm:acme:key-1");
            c.record("storm:acme:key-2");
            for i in 0..20 {
                c.record(&format!("one-off:{round}:{i}"));
            }
        }
        let top = c.top(2);
        assert_eq!(top.len(), 2);
        assert!(top.iter().any(|t| t.key == "storm:acme:key-1"), "{top:?}");
        assert!(top.iter().any(|t| t.key == "storm:acme:key-2"), "{top:?}");
        assert!(top.iter().all(|t| t.count >= 50));
        assert!(c.slots.lock().unwrap().len() <= TRACKED_KEYS);
    }

    #[test]
    fn labels_are_truncated() {
        let c = DuplicatedKeys::default();
        c.record(&"k".repeat(500));
        assert_eq!(c.top(1)[0].key.len(), KEY_LABEL_LEN);
        c.record(&"é".repeat(100));
        assert_eq!(label(&"é".repeat(100)).chars().count(), KEY_LABEL_LEN);
        assert_eq!(label("short"), "short");
    }
}
