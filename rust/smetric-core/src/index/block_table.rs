//! The block table: an entry's id by its block hash, for the index's slab.
//!
//! Algorithm: open addressing with linear probing over a power-of-two array of 8-byte slots.
//! A slot holds an entry id and the low 32 bits of the key's table hash: those bits are the
//! key's home slot (`bits & mask`) and, above the mask, a filter, so a probe compares slots
//! without reading the slab, and only a slot whose bits match costs the caller's `is_key`
//! check (one entry read, which the caller makes anyway on the entry it finds). A removal
//! shifts the following slots of its cluster back (no tombstones), so a lookup's probe ends at
//! the first empty slot whatever the history. The table doubles when it would pass ¾ full;
//! growing re-places slots from their stored bits alone, without the slab.
//!
//! Why not `hashbrown`: the write path of a new chain into full holders makes one lookup to
//! create per new block and one to remove per evicted block, at ~1M entries each a cache miss.
//! Here the home slot of a key is ours to compute, so the write path asks the memory for it a
//! few blocks ahead ([`BlockTable::prefetch`]) and the misses overlap; `hashbrown`'s bucket
//! address is private. Measured (`BENCHMARKS.md`, 2026-12-06 seventh session): without the
//! prefetch this table is *slower* than `hashbrown` (whose 2 MB of control bytes stay cached,
//! while these slots span 16 MB at 1M keys); with it, a new 32K chain routes ≈ 45 % faster.
//!
//! Invariants: every key is stored in exactly one slot, reachable from its home slot through
//! occupied slots only; fewer than ¾ of the slots are occupied (an empty slot always ends a
//! probe); `len` counts occupied slots. An id is never [`EMPTY`]'s (`u32::MAX`). A stored
//! slot's bits give its home while the table has at most 2³² slots (3·2³⁰ keys, whose entries
//! alone would take 96 GiB).
//!
//! Complexity: lookup, insert and removal O(1) expected (at ¾ load: 2.5 slots a hit, 8.5 a
//! miss, within one or two cache lines); growth O(slots), amortised O(1) per insert. Memory: 8
//! bytes a slot, 10.7–21.3 bytes a key.

use crate::prefetch::prefetch_read;

/// An unoccupied slot.
const EMPTY: u64 = u64::MAX;
/// Slots of the first allocation.
const MIN_SLOTS: usize = 64;

/// Block hash (already mixed into a table hash) → entry id.
#[derive(Debug, Clone, Default)]
pub(super) struct BlockTable {
    /// `bits << 32 | id`, or [`EMPTY`]; length a power of two (or 0 before the first insert).
    slots: Vec<u64>,
    len: usize,
}

impl BlockTable {
    /// Keys stored.
    #[inline]
    pub(super) fn len(&self) -> usize {
        self.len
    }

    #[inline]
    pub(super) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Heap bytes of the slot array.
    pub(super) fn heap_bytes(&self) -> usize {
        self.slots.capacity() * size_of::<u64>()
    }

    #[inline]
    fn mask(&self) -> usize {
        self.slots.len().wrapping_sub(1)
    }

    /// The id stored under `hash` whose entry `is_key` accepts, if any.
    #[inline]
    pub(super) fn find(&self, hash: u64, is_key: impl Fn(u32) -> bool) -> Option<u32> {
        if self.slots.is_empty() {
            return None;
        }
        let bits = hash as u32;
        let mask = self.mask();
        let mut i = bits as usize & mask;
        loop {
            let slot = self.slots[i];
            if slot == EMPTY {
                return None;
            }
            if (slot >> 32) as u32 == bits && is_key(slot as u32) {
                return Some(slot as u32);
            }
            i = (i + 1) & mask;
        }
    }

    /// Stores `id` under `hash` (the caller knows no stored id has its key).
    pub(super) fn insert_unique(&mut self, hash: u64, id: u32) {
        debug_assert!(id != u32::MAX, "u32::MAX marks an empty slot");
        if (self.len + 1) * 4 > self.slots.len() * 3 {
            self.grow();
        }
        Self::place(&mut self.slots, u64::from(hash as u32) << 32 | u64::from(id));
        self.len += 1;
    }

    /// Puts `slot` in the first empty slot from its home (the array has one).
    #[inline]
    fn place(slots: &mut [u64], slot: u64) {
        let mask = slots.len() - 1;
        let mut i = (slot >> 32) as usize & mask;
        while slots[i] != EMPTY {
            i = (i + 1) & mask;
        }
        slots[i] = slot;
    }

    #[cold]
    fn grow(&mut self) {
        let new_len = (self.slots.len() * 2).max(MIN_SLOTS);
        let old = std::mem::replace(&mut self.slots, vec![EMPTY; new_len]);
        for slot in old.into_iter().filter(|&s| s != EMPTY) {
            Self::place(&mut self.slots, slot);
        }
    }

    /// Removes `id`, stored under `hash`; returns whether it was there.
    pub(super) fn remove(&mut self, hash: u64, id: u32) -> bool {
        if self.slots.is_empty() {
            return false;
        }
        let target = u64::from(hash as u32) << 32 | u64::from(id);
        let mask = self.mask();
        let mut i = hash as u32 as usize & mask;
        loop {
            match self.slots[i] {
                EMPTY => return false,
                s if s == target => break,
                _ => i = (i + 1) & mask,
            }
        }
        // Shift back: a later slot of the cluster moves into the hole when the hole lies
        // between its home and it (cyclically), so its probe still reaches it.
        let mut hole = i;
        let mut j = i;
        loop {
            j = (j + 1) & mask;
            let s = self.slots[j];
            if s == EMPTY {
                break;
            }
            let home = (s >> 32) as usize & mask;
            if j.wrapping_sub(home) & mask >= j.wrapping_sub(hole) & mask {
                self.slots[hole] = s;
                hole = j;
            }
        }
        self.slots[hole] = EMPTY;
        self.len -= 1;
        true
    }

    /// Asks the memory for `hash`'s home slot, so that a lookup of it a little later finds the
    /// line in cache. A hint only: it changes no state and no answer.
    #[inline]
    pub(super) fn prefetch(&self, hash: u64) {
        if let Some(slot) = self.slots.get(hash as u32 as usize & self.mask()) {
            prefetch_read(slot);
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// Keys whose low bits collide a lot (few distinct homes), to exercise clusters and
    /// wrap-around.
    fn clustered(k: u64) -> u64 {
        (k % 7) | (k << 40)
    }

    proptest! {
        /// Against a model map, under inserts and removals in any order, with colliding homes.
        #[test]
        fn behaves_as_a_map(ops in prop::collection::vec((any::<bool>(), 0u64..300), 1..2_000)) {
            let mut table = BlockTable::default();
            let mut model = std::collections::HashMap::new();
            let mut next_id = 0u32;
            for (insert, k) in ops {
                let h = clustered(k);
                if insert && !model.contains_key(&k) {
                    table.insert_unique(h, next_id);
                    model.insert(k, next_id);
                    next_id += 1;
                } else if let Some(id) = model.remove(&k) {
                    prop_assert!(table.remove(h, id));
                }
                prop_assert_eq!(table.len(), model.len());
            }
            for k in 0u64..300 {
                let h = clustered(k);
                let want = model.get(&k).copied();
                prop_assert_eq!(table.find(h, |id| Some(id) == want), want);
            }
        }
    }

    #[test]
    fn a_removed_key_is_gone_and_its_cluster_still_found() {
        let mut table = BlockTable::default();
        for id in 0..40 {
            table.insert_unique(5, id); // one home: a 40-slot cluster
        }
        assert!(table.remove(5, 0));
        assert!(!table.remove(5, 0), "removed once");
        assert_eq!(table.find(5, |id| id == 0), None);
        for id in 1..40 {
            assert_eq!(table.find(5, |x| x == id), Some(id), "id {id} still reachable");
        }
        assert_eq!(table.len(), 39);
    }

    #[test]
    fn stays_under_three_quarters_full() {
        let mut table = BlockTable::default();
        for id in 0..10_000u32 {
            table.insert_unique(u64::from(id).wrapping_mul(0x9E37_79B9_7F4A_7C15), id);
            assert!(table.len() * 4 <= table.slots.len() * 3);
        }
        table.prefetch(12_345); // a hint, any key
        assert!(table.heap_bytes() >= 10_000 * 8);
    }

    /// Negative control: a removal that only empties its slot (no shift back) loses keys
    /// the property above finds.
    #[test]
    fn without_the_shift_a_cluster_is_cut() {
        let mut table = BlockTable::default();
        for id in 0..3 {
            table.insert_unique(9, id);
        }
        let i = (0..table.slots.len())
            .find(|&i| table.slots[i] as u32 == 0)
            .expect("stored");
        table.slots[i] = EMPTY; // the broken removal
        table.len -= 1;
        assert_eq!(table.find(9, |id| id == 2), None, "the probe stops at the hole");
    }
}
