//! A least-recently-used map from a text to what was worked out from it, bounded by the bytes
//! its entries are charged: the piece cache (a piece between added tokens → its ids,
//! `piecewise.rs`) and the message cache (a chat message's JSON text → the message as the template
//! sees it, `conversation.rs`). An agent session re-sends its whole history every turn, so all of
//! a body's texts but the new ones are entries already.
//!
//! Algorithm: a hash map from the text to (value, charge, stamp) and an ordered map from stamp to
//! text; a hit moves the entry to a new, highest stamp; a new entry evicts the lowest stamps until
//! the charged total is within the bound. A key is the text itself (compared on a hit, never only
//! its hash), so a value is only ever given back for the very text it was made from.
//!
//! Invariants: `bytes` is the sum of the entries' charges and stays within the bound given to
//! [`TextLru::keep`] after it returns; an entry charged more than the bound is not kept; every
//! entry has exactly one stamp in `order`. Complexity: a lookup or an insert is O(text) to hash and
//! compare plus O(log entries) for the order; an insert's evictions O(log entries) each.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// Text → (value, charged bytes, LRU stamp), the stamps in order, the charged total, the counts.
pub(super) struct TextLru<V> {
    entries: HashMap<Arc<str>, (V, usize, u64), foldhash::quality::RandomState>,
    order: BTreeMap<u64, Arc<str>>,
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
            order: BTreeMap::new(),
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
        let (value, _, old) = self.entries.get_mut(text)?;
        let key = self.order.remove(old)?;
        *old = stamp;
        self.order.insert(stamp, key);
        self.next_stamp += 1;
        Some(value.clone())
    }

    /// Keeps `value` for `text`, charged `charged` bytes (not kept if that alone is over
    /// `bound`; left as it is if `text` is kept already), evicting the least recently used
    /// entries down to `bound`.
    pub(super) fn keep(&mut self, text: &str, value: V, charged: usize, bound: usize) {
        if charged > bound || self.entries.contains_key(text) {
            return;
        }
        let key: Arc<str> = Arc::from(text);
        self.order.insert(self.next_stamp, key.clone());
        self.entries.insert(key, (value, charged, self.next_stamp));
        self.next_stamp += 1;
        self.bytes += charged;
        while self.bytes > bound {
            let Some((_, old)) = self.order.pop_first() else { break };
            if let Some((_, old_charge, _)) = self.entries.remove(&old) {
                self.bytes -= old_charge;
            }
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
}
