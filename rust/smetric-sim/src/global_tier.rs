//! Cluster-wide KV store (a Mooncake store behind LMCache or vLLM's connector, or host DRAM
//! behind vLLM's offloading connector): an LRU set of block hashes with a capacity in bytes.
//! How blocks travel to and from it is `transfer`'s and `cluster`'s business.
//!
//! Semantics (perf-model §4 and §6.4):
//! * Filled by write-through: every full block an instance prefills and the store lacks is
//!   written to it, and [`GlobalTier::store`] is called when that write completes — a block is
//!   visible only from then on. Storing a present block refreshes it.
//! * A request's tier hit is the contiguous run of its chain, starting where its GPU hit ends,
//!   whose blocks are all in the store.
//! * Capacity: `capacity_bytes / (block_tokens · kv_bytes_per_token)` blocks; the least
//!   recently stored or read block is dropped first. Capacity 0 switches the tier off.
//!
//! Invariants: `map` and the slab list hold the same blocks; `len <= capacity`.
//! Complexity: O(1) expected per block stored, looked up or read.

use hashbrown::HashMap;

/// End-of-list marker of the intrusive LRU list.
const NIL: u32 = u32::MAX;

#[derive(Clone, Copy, Debug)]
struct Slot {
    hash: u64,
    /// The instance whose write put the block here (it announces the block's removal).
    owner: u32,
    prev: u32,
    next: u32,
}

/// What the last [`GlobalTier::store`] changed, when the tier logs (see `cache_events`).
#[derive(Clone, Debug, Default)]
pub struct StoreChanges {
    /// Whether stores fill this in.
    pub enabled: bool,
    /// Positions in the stored slice of the blocks that entered the tier (and stayed), ascending.
    pub inserted: Vec<usize>,
    /// `(hash, owner)` of blocks dropped for capacity.
    pub evicted: Vec<(u64, u32)>,
}

/// The global KV store: an LRU set of block hashes.
#[derive(Clone, Debug, Default)]
pub struct GlobalTier {
    capacity: u32,
    slots: Vec<Slot>,
    map: HashMap<u64, u32>,
    /// Most recently used end.
    head: u32,
    /// Least recently used end.
    tail: u32,
    evictions: u64,
    /// The changes of the last store.
    pub changes: StoreChanges,
}

impl GlobalTier {
    /// A store holding at most `capacity_blocks` blocks (0 = disabled).
    pub fn new(capacity_blocks: u32) -> Self {
        Self {
            capacity: capacity_blocks,
            slots: Vec::new(),
            map: HashMap::new(),
            head: NIL,
            tail: NIL,
            evictions: 0,
            changes: StoreChanges::default(),
        }
    }

    /// True when the tier can hold anything.
    pub fn enabled(&self) -> bool {
        self.capacity > 0
    }

    /// Blocks currently stored.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// True when nothing is stored.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Blocks dropped for capacity so far.
    pub fn evictions(&self) -> u64 {
        self.evictions
    }

    /// Whether `hash` is stored (touches nothing).
    pub fn contains(&self, hash: u64) -> bool {
        self.map.contains_key(&hash)
    }

    /// Length of the run of `chain[from..]` whose blocks are all stored (touches nothing).
    pub fn run_from(&self, chain: &[u64], from: usize) -> usize {
        chain
            .get(from..)
            .map_or(0, |rest| rest.iter().take_while(|h| self.map.contains_key(*h)).count())
    }

    /// Stores (or refreshes) `hashes` as most recently used, written by instance `owner`,
    /// dropping LRU blocks over capacity. The first hash ends up most recent, so a chain's
    /// tail is dropped before its head. With [`StoreChanges::enabled`], `changes` says what
    /// entered and what was dropped.
    pub fn store(&mut self, hashes: &[u64], owner: u32) {
        self.changes.inserted.clear();
        self.changes.evicted.clear();
        if self.capacity == 0 {
            return;
        }
        for (k, &h) in hashes.iter().enumerate().rev() {
            if let Some(&s) = self.map.get(&h) {
                self.unlink(s);
                self.push_head(s);
                continue;
            }
            let s = if self.map.len() as u32 >= self.capacity {
                let victim = self.tail;
                self.unlink(victim);
                let Slot {
                    hash,
                    owner: victim_owner,
                    ..
                } = self.slots[victim as usize];
                self.map.remove(&hash);
                self.evictions += 1;
                if self.changes.enabled {
                    // A block of this very store dropped again (a store longer than the tier)
                    // never entered, as far as anyone outside can tell.
                    match self.changes.inserted.iter().position(|&i| hashes[i] == hash) {
                        Some(i) => {
                            self.changes.inserted.remove(i);
                        }
                        None => self.changes.evicted.push((hash, victim_owner)),
                    }
                }
                self.slots[victim as usize].hash = h;
                self.slots[victim as usize].owner = owner;
                victim
            } else {
                self.slots.push(Slot {
                    hash: h,
                    owner,
                    prev: NIL,
                    next: NIL,
                });
                (self.slots.len() - 1) as u32
            };
            self.map.insert(h, s);
            self.push_head(s);
            if self.changes.enabled {
                self.changes.inserted.push(k);
            }
        }
        self.changes.inserted.reverse();
    }

    /// Marks `hashes` (a run that [`Self::run_from`] found) as just read.
    pub fn touch(&mut self, hashes: &[u64]) {
        for h in hashes.iter().rev() {
            if let Some(&s) = self.map.get(h) {
                self.unlink(s);
                self.push_head(s);
            }
        }
    }

    fn unlink(&mut self, s: u32) {
        let Slot { prev, next, .. } = self.slots[s as usize];
        if prev == NIL {
            self.head = next;
        } else {
            self.slots[prev as usize].next = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            self.slots[next as usize].prev = prev;
        }
    }

    fn push_head(&mut self, s: u32) {
        self.slots[s as usize].prev = NIL;
        self.slots[s as usize].next = self.head;
        if self.head == NIL {
            self.tail = s;
        } else {
            self.slots[self.head as usize].prev = s;
        }
        self.head = s;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disabled_tier_stores_nothing() {
        let mut t = GlobalTier::new(0);
        t.store(&[1, 2], 0);
        assert!(!t.enabled());
        assert!(t.is_empty());
        assert_eq!(t.run_from(&[1, 2], 0), 0);
    }

    #[test]
    fn lru_drops_chain_tail_first_and_reads_refresh() {
        let mut t = GlobalTier::new(3);
        t.store(&[1, 2, 3], 0);
        assert_eq!(t.run_from(&[1, 2, 3], 0), 3);
        assert_eq!(t.run_from(&[1, 2, 3], 1), 2);
        assert_eq!(t.run_from(&[1, 2, 3], 5), 0);
        t.touch(&[3]);
        // 2 is now least recent (the chain was stored head-most-recent, then 3 was read).
        t.store(&[9], 0);
        assert_eq!(t.len(), 3);
        assert_eq!(t.run_from(&[1, 2], 0), 1);
        assert_eq!(t.run_from(&[3], 0), 1);
        assert_eq!(t.evictions(), 1);
    }

    #[test]
    fn logged_stores_report_entries_and_owned_evictions() {
        let mut t = GlobalTier::new(3);
        t.changes.enabled = true;
        t.store(&[1], 7);
        t.store(&[2], 8);
        t.store(&[2, 3], 9);
        // 2 was refreshed (it keeps its owner); 3 entered.
        assert_eq!(t.changes.inserted, [1]);
        assert!(t.changes.evicted.is_empty());
        t.store(&[4], 9);
        assert_eq!(t.changes.inserted, [0]);
        assert_eq!(t.changes.evicted, [(1, 7)]);
        t.store(&[20, 21, 22], 4);
        let mut owners: Vec<u32> = t.changes.evicted.iter().map(|&(_, o)| o).collect();
        owners.sort_unstable();
        assert_eq!(owners, [8, 9, 9]);
        // The slots now belong to the writer of what replaced their blocks.
        t.store(&[30, 31, 32], 5);
        assert!(
            t.changes.evicted.iter().all(|&(_, o)| o == 4),
            "{:?}",
            t.changes.evicted
        );
        // A store longer than the tier: what it dropped of itself never entered.
        t.store(&[10, 11, 12, 13], 5);
        assert_eq!(t.changes.inserted, [0, 1, 2]);
        assert_eq!(t.changes.evicted.len(), 3);
        assert_eq!(t.run_from(&[10, 11, 12], 0), 3);
    }
}
