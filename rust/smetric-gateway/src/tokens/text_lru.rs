//! A least-recently-used map from a text to what was worked out from it, bounded by the bytes
//! its entries are charged: the piece cache (a piece between added tokens → its ids,
//! `piecewise.rs`) and the message cache (a chat message's JSON text → the message as the template
//! sees it, `conversation.rs`). An agent session re-sends its whole history every turn, so all of
//! a body's texts but the new ones are entries already.
//!
//! Algorithm: a hash map from the text to (value, charge, stamp) and a queue of touches, each
//! (stamp, text) in stamp order; a hit gives the entry a new, highest stamp and appends that touch
//! (no reordering: a hit is one map probe, a comparison of the text and an append — measured
//! against an ordered map of stamps, which took two tree updates a hit, `BENCHMARKS.md`, "The
//! converted APIs through the message cache"); a new entry evicts from the queue's front until the
//! charged total is within the bound, skipping touches an entry's later stamp has outdated. The
//! queue is rebuilt from the map's stamps when it holds more than twice as many touches as
//! entries, so it stays within O(entries). A key is the text itself (compared on a hit, never
//! only its hash), so a value is only ever given back for the very text it was made from.
//!
//! Invariants: `bytes` is the sum of the entries' charges and stays within the bound given to
//! [`TextLru::keep`] after it returns; an entry charged more than the bound is not kept; every
//! entry's current stamp is in `touches` exactly once, and the entries leave in the order of their
//! current stamps (least recently used first), as a strict LRU's would. Complexity: a lookup or an
//! insert is O(text) to hash and compare plus O(1) amortised for the queue (a rebuild, O(entries
//! · log entries), follows at least `entries` touches); an insert's evictions O(1) amortised each.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

/// An entry: its value, charged bytes and LRU stamp, and its text again (shared with the map's
/// key, so that a hit's touch needs no second probe for it).
struct Slot<V> {
    value: V,
    charged: usize,
    stamp: u64,
    key: Arc<str>,
}

/// Text → entry, the touches in stamp order, the charged total, the counts.
pub(super) struct TextLru<V> {
    entries: HashMap<Arc<str>, Slot<V>, foldhash::quality::RandomState>,
    /// (stamp, text) of every touch since the last rebuild, oldest first; a touch whose stamp is
    /// no longer its entry's (or whose entry left) is outdated.
    touches: VecDeque<(u64, Arc<str>)>,
    bytes: usize,
    next_stamp: u64,
    /// Lookups that found their text (counted by the caller, which may look up and then not
    /// use what it found, e.g. a call over its encode budget).
    pub(super) hits: u64,
    pub(super) misses: u64,
}

impl<V> Default for TextLru<V> {
    fn default() -> Self {
        Self {
            entries: HashMap::default(),
            touches: VecDeque::new(),
            bytes: 0,
            next_stamp: 0,
            hits: 0,
            misses: 0,
        }
    }
}

impl<V: Clone> TextLru<V> {
    /// The value kept for `text`, now the most recently used; `None` if there is none.
    pub(super) fn get(&mut self, text: &str) -> Option<V> {
        let stamp = self.next_stamp;
        let slot = self.entries.get_mut(text)?;
        slot.stamp = stamp;
        let (key, value) = (Arc::clone(&slot.key), slot.value.clone());
        self.touch(stamp, key);
        Some(value)
    }

    /// Keeps `value` for `text`, charged `charged` bytes (not kept if that alone is over
    /// `bound`; left as it is if `text` is kept already), evicting the least recently used
    /// entries down to `bound`.
    pub(super) fn keep(&mut self, text: &str, value: V, charged: usize, bound: usize) {
        if charged > bound || self.entries.contains_key(text) {
            return;
        }
        let key: Arc<str> = Arc::from(text);
        let stamp = self.next_stamp;
        let slot = Slot {
            value,
            charged,
            stamp,
            key: Arc::clone(&key),
        };
        self.entries.insert(Arc::clone(&key), slot);
        self.touch(stamp, key);
        self.bytes += charged;
        while self.bytes > bound {
            let Some((stamp, old)) = self.touches.pop_front() else {
                break;
            };
            if self.entries.get(&old).is_some_and(|slot| slot.stamp == stamp)
                && let Some(slot) = self.entries.remove(&old)
            {
                self.bytes -= slot.charged;
            }
        }
    }

    /// Appends a touch at `stamp` (the next one), rebuilding the queue when outdated touches
    /// outnumber the entries.
    fn touch(&mut self, stamp: u64, key: Arc<str>) {
        self.touches.push_back((stamp, key));
        self.next_stamp += 1;
        if self.touches.len() > 2 * self.entries.len() + 16 {
            let mut current: Vec<(u64, Arc<str>)> = self
                .entries
                .iter()
                .map(|(key, slot)| (slot.stamp, Arc::clone(key)))
                .collect();
            current.sort_unstable_by_key(|(stamp, _)| *stamp);
            self.touches = current.into();
        }
    }

    /// Entries kept.
    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }

    /// The charged total.
    pub(super) fn bytes(&self) -> usize {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::TextLru;

    #[test]
    fn the_least_recently_used_go_first_and_the_bound_holds() {
        let mut lru = TextLru::default();
        lru.keep("a", 1, 10, 25);
        lru.keep("b", 2, 10, 25);
        assert_eq!(lru.get("a"), Some(1)); // "b" is now the least recently used
        lru.keep("c", 3, 10, 25);
        assert_eq!((lru.get("b"), lru.get("a"), lru.get("c")), (None, Some(1), Some(3)));
        assert_eq!((lru.len(), lru.bytes()), (2, 20));
        lru.keep("huge", 4, 26, 25); // over the bound alone: not kept, nothing evicted
        assert_eq!((lru.get("huge"), lru.len()), (None, 2));
        lru.keep("a", 9, 10, 25); // kept already: left as it is
        assert_eq!(lru.get("a"), Some(1));
    }

    /// Against a strict LRU (a list, most recent last) under a long pseudo-random run of hits,
    /// misses and inserts of varied charges: the same texts kept, the same charged total, after
    /// every call — across many rebuilds of the touch queue.
    #[test]
    fn evicts_as_a_strict_lru_does() {
        let mut lru = TextLru::default();
        let mut model: Vec<(String, usize)> = Vec::new(); // (text, charge), least recent first
        let bound = 100;
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for step in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let text = format!("t{}", (x >> 32) % 24);
            let charge = 5 + (x >> 8) as usize % 30;
            if x.is_multiple_of(3) {
                lru.keep(&text, step, charge, bound);
                if !model.iter().any(|(t, _)| *t == text) {
                    model.push((text.clone(), charge));
                    while model.iter().map(|(_, c)| c).sum::<usize>() > bound {
                        model.remove(0);
                    }
                }
            } else {
                let hit = lru.get(&text).is_some();
                let at = model.iter().position(|(t, _)| *t == text);
                assert_eq!(hit, at.is_some(), "step {step}");
                if let Some(at) = at {
                    let entry = model.remove(at);
                    model.push(entry);
                }
            }
            let mut kept: Vec<&str> = lru.entries.keys().map(AsRef::as_ref).collect();
            let mut want: Vec<&str> = model.iter().map(|(t, _)| t.as_str()).collect();
            kept.sort_unstable();
            want.sort_unstable();
            assert_eq!(kept, want, "step {step}");
            assert_eq!(lru.bytes(), model.iter().map(|(_, c)| c).sum::<usize>());
            assert!(lru.touches.len() <= 2 * lru.len() + 17);
        }
        // Hits alone (nothing to evict) do not grow the queue past its rebuild bound.
        let mut lru = TextLru::default();
        for text in ["a", "b", "c"] {
            lru.keep(text, 0, 1, 1000);
        }
        for _ in 0..1000 {
            assert!(lru.get("b").is_some());
        }
        assert!(lru.touches.len() <= 2 * lru.len() + 17, "{}", lru.touches.len());
        lru.keep("d", 0, 999, 1000); // evicts the least recent: a and c, not b
        assert_eq!((lru.get("a"), lru.get("c"), lru.get("b")), (None, None, Some(0)));
    }
}
