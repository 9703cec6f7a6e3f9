//! The two-tier KV$ index: which blocks each instance's GPU cache holds, and which the
//! cluster-wide global tier (CPU / Mooncake / LMCache store) holds.
//!
//! Algorithm: one *entry* per block hash that some holder has, in a slab; each entry
//! carries a bitset of the instances holding it (one bit per instance slot) and the global
//! tier's sequence number. A query walks the request's hash chain once, ANDing the set of
//! instances still matching with each block's bitset; when an instance's bit drops, its
//! longest prefix hit is the current depth. The walk stops as soon as no instance and not
//! the global tier still match, so a miss costs one lookup. The entry ids it walked are kept,
//! so that inserting the same chain right after (insert on route) needs no second lookup.
//!
//! Each holder (instance or global tier) has a capacity in blocks and an LRU order
//! ([`lru::RunLru`], one run per touched chain). Touching a chain goes from its last block to its first, leaving the
//! first block the most recent, so a chain's tail is evicted before its head, as vLLM frees
//! blocks tail first. Optional TTL ages instance blocks. The first instance to hold a block
//! keeps its LRU sequence number inline in the entry (most blocks are one session's history,
//! held by one instance); further holders use a per-instance map.
//!
//! Invariants: an entry exists iff at least one holder holds it; every held (entry, holder)
//! pair has one current LRU item; a holder never holds more than its capacity after a call
//! returns. Memory is therefore bounded by `Σ capacities` entries.
//!
//! Complexity: `query` O(matched blocks · ⌈instances/64⌉); `touch` O(run) amortised;
//! removal O(1) per block; `clear`/`remove_slot` O(blocks held).
//!
//! Bytes per (block, holder) entry are measured by `benches/` and documented in
//! `BENCHMARKS.md`; [`KvIndex::memory_bytes`] estimates them from the container sizes.

pub(crate) mod lru;

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use lru::RunLru;

use crate::ids::BlockHash;

/// Marks "the global tier does not hold this entry" and "no child yet".
const NOT_HELD: u32 = u32::MAX;
/// `Entry::inline_slot` when no instance holds the block inline.
const NO_SLOT: u16 = u16::MAX;
/// `Entry::inline_slot` of a slab slot on the free list.
const FREE_ENTRY: u16 = u16::MAX - 1;
/// Instance slots the index can address (slot numbers must stay below [`FREE_ENTRY`]).
pub const MAX_SLOTS: u32 = FREE_ENTRY as u32;

/// Hasher for keys that are already hashes or small ids: one multiply, high bits folded
/// down, so that hashbrown's control bytes (top 7 bits) stay well spread even for the
/// sequential ids that traces use.
#[derive(Default, Clone, Copy)]
pub(crate) struct MixHasher(u64);

impl Hasher for MixHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    #[inline]
    fn write_u64(&mut self, x: u64) {
        let m = (self.0 ^ x).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 = m ^ (m >> 29);
    }
    #[inline]
    fn write_u32(&mut self, x: u32) {
        self.write_u64(u64::from(x));
    }
}

pub(crate) type MixMap<K, V> = HashMap<K, V, BuildHasherDefault<MixHasher>>;

/// Where a block is held.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Holder {
    /// An instance's local (GPU) cache, by slot.
    Instance(u32),
    /// The cluster-wide global tier.
    Global,
}

/// One indexed block: 24 bytes.
#[derive(Debug)]
struct Entry {
    hash: BlockHash,
    /// Sequence number of the global tier's current touch, or [`NOT_HELD`].
    global_seq: u32,
    /// Sequence number of `inline_slot`'s current touch.
    inline_seq: u32,
    /// The child most recently touched after this block: a query that follows it (and checks
    /// the child's hash) walks a chain through the slab instead of the hash table.
    last_child: u32,
    /// The first instance that held this block keeps its sequence number inline, so that a
    /// touch of a single-holder block needs no map access; other holders use their map.
    /// [`NO_SLOT`] when none, [`FREE_ENTRY`] while the slab slot is on the free list.
    inline_slot: u16,
    /// Distinct child blocks created under this block (saturating); a shared system prompt's
    /// last block has many, a session's latest turn none. Drives turn inference.
    children: u16,
}

impl Entry {
    fn live(&self) -> bool {
        self.inline_slot != FREE_ENTRY
    }
}

#[derive(Debug, Default)]
struct InstanceHolder {
    /// Entry id → current LRU sequence number, for entries that do not hold this slot inline.
    seqs: MixMap<u32, u32>,
    /// Blocks held (inline and in `seqs`).
    held: usize,
    lru: RunLru,
    live: bool,
}

/// Result of [`KvIndex::query`].
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct IndexQuery {
    /// Longest prefix hit in blocks, per instance slot (0 for free slots).
    pub local_blocks: Vec<u32>,
    /// Longest prefix hit in blocks in the global tier.
    pub global_blocks: u32,
    /// Deepest prefix any holder matched, in blocks.
    pub deepest_blocks: u32,
    /// `children` of the deepest matched block (0 when nothing matched).
    pub branches: u32,
}

/// Capacities and TTL of an index.
#[derive(Debug, Clone, Copy)]
pub struct IndexLimits {
    /// Blocks per instance.
    pub local_capacity: u64,
    /// Blocks in the global tier; 0 disables it.
    pub global_capacity: u64,
    /// Age limit of instance blocks in milliseconds.
    pub local_ttl_ms: Option<u64>,
}

/// Per-holder block counts, for `stats()`.
#[derive(Debug, Clone, Default)]
pub struct IndexStats {
    /// Distinct blocks indexed.
    pub entries: usize,
    /// Blocks held per instance slot.
    pub local_blocks: Vec<usize>,
    /// Blocks held by the global tier.
    pub global_blocks: usize,
    /// Blocks evicted for capacity or age since creation.
    pub evictions: u64,
}

/// The two-tier index. Not synchronised: the router wraps it in a mutex.
#[derive(Debug)]
pub struct KvIndex {
    limits: IndexLimits,
    /// Entry ids keyed by their block hash (the hash lives in the entry, not twice).
    by_hash: hashbrown::HashTable<u32>,
    entries: Vec<Entry>,
    free_entries: Vec<u32>,
    /// `words` u64 per entry: the instance bitset.
    bits: Vec<u64>,
    words: usize,
    live_mask: Vec<u64>,
    instances: Vec<InstanceHolder>,
    global_lru: RunLru,
    global_held: usize,
    evictions: u64,
    scratch_active: Vec<u64>,
    /// Entry ids of the chain blocks walked by the last query or touched by the last touch,
    /// in chain order; reused (after a liveness check) by the next touch of the same chain.
    walked: Vec<u32>,
}

impl KvIndex {
    /// An empty index with no instance slot.
    pub fn new(limits: IndexLimits) -> Self {
        Self {
            limits,
            by_hash: hashbrown::HashTable::new(),
            entries: Vec::new(),
            free_entries: Vec::new(),
            bits: Vec::new(),
            words: 1,
            live_mask: vec![0],
            instances: Vec::new(),
            global_lru: RunLru::default(),
            global_held: 0,
            evictions: 0,
            scratch_active: Vec::new(),
            walked: Vec::new(),
        }
    }

    fn global_enabled(&self) -> bool {
        self.limits.global_capacity > 0
    }

    /// Makes `slot` a live, empty instance holder.
    pub fn add_slot(&mut self, slot: u32) {
        let s = slot as usize;
        if s / 64 >= self.words {
            self.restride(s / 64 + 1);
        }
        if self.instances.len() <= s {
            self.instances.resize_with(s + 1, InstanceHolder::default);
        }
        self.instances[s] = InstanceHolder {
            live: true,
            ..InstanceHolder::default()
        };
        self.live_mask[s / 64] |= 1 << (s % 64);
    }

    /// Drops everything `slot` holds and marks it free.
    pub fn remove_slot(&mut self, slot: u32) {
        self.clear_instance(slot);
        if let Some(h) = self.instances.get_mut(slot as usize) {
            h.live = false;
            let s = slot as usize;
            self.live_mask[s / 64] &= !(1 << (s % 64));
        }
    }

    fn restride(&mut self, words: usize) {
        let mut bits = vec![0u64; self.entries.len() * words];
        for e in 0..self.entries.len() {
            bits[e * words..e * words + self.words].copy_from_slice(&self.bits[e * self.words..(e + 1) * self.words]);
        }
        self.bits = bits;
        self.live_mask.resize(words, 0);
        self.words = words;
    }

    fn is_live(&self, slot: u32) -> bool {
        self.instances.get(slot as usize).is_some_and(|h| h.live)
    }

    // ---- per-holder sequence store -------------------------------------------------------

    #[inline]
    fn seq_of(&self, holder: Holder, e: u32) -> Option<u32> {
        let entry = &self.entries[e as usize];
        match holder {
            Holder::Instance(s) if u32::from(entry.inline_slot) == s => Some(entry.inline_seq),
            Holder::Instance(s) => self.instances[s as usize].seqs.get(&e).copied(),
            Holder::Global => (entry.global_seq != NOT_HELD).then_some(entry.global_seq),
        }
    }

    fn held(&self, holder: Holder) -> usize {
        match holder {
            Holder::Instance(s) => self.instances[s as usize].held,
            Holder::Global => self.global_held,
        }
    }

    fn capacity(&self, holder: Holder) -> u64 {
        match holder {
            Holder::Instance(_) => self.limits.local_capacity,
            Holder::Global => self.limits.global_capacity,
        }
    }

    fn lru_mut(&mut self, holder: Holder) -> &mut RunLru {
        match holder {
            Holder::Instance(s) => &mut self.instances[s as usize].lru,
            Holder::Global => &mut self.global_lru,
        }
    }

    /// Records `seq` as `holder`'s current touch of `e`, adding `e` to the holder if needed.
    #[inline]
    fn set_seq(&mut self, holder: Holder, e: u32, seq: u32) {
        let entry = &mut self.entries[e as usize];
        match holder {
            Holder::Instance(s) => {
                let added = if u32::from(entry.inline_slot) == s {
                    entry.inline_seq = seq;
                    false
                } else if entry.inline_slot == NO_SLOT && !self.instances[s as usize].seqs.contains_key(&e) {
                    entry.inline_slot = s as u16;
                    entry.inline_seq = seq;
                    true
                } else {
                    self.instances[s as usize].seqs.insert(e, seq).is_none()
                };
                if added {
                    self.instances[s as usize].held += 1;
                    let (w, b) = (s as usize / 64, s % 64);
                    self.bits[e as usize * self.words + w] |= 1 << b;
                }
            }
            Holder::Global => {
                if entry.global_seq == NOT_HELD {
                    self.global_held += 1;
                }
                entry.global_seq = seq;
            }
        }
    }

    /// Takes `e` away from `holder` (which must hold it) and frees the entry if nobody else does.
    fn drop_membership(&mut self, holder: Holder, e: u32) {
        let entry = &mut self.entries[e as usize];
        match holder {
            Holder::Instance(s) => {
                if u32::from(entry.inline_slot) == s {
                    entry.inline_slot = NO_SLOT;
                } else {
                    self.instances[s as usize].seqs.remove(&e);
                }
                self.instances[s as usize].held -= 1;
                let (w, b) = (s as usize / 64, s % 64);
                self.bits[e as usize * self.words + w] &= !(1 << b);
            }
            Holder::Global => {
                entry.global_seq = NOT_HELD;
                self.global_held -= 1;
            }
        }
        let base = e as usize * self.words;
        let unheld = self.entries[e as usize].global_seq == NOT_HELD
            && self.bits[base..base + self.words].iter().all(|&w| w == 0);
        if unheld {
            let entry = &mut self.entries[e as usize];
            entry.inline_slot = FREE_ENTRY;
            let hash = entry.hash;
            if let Ok(found) = self.by_hash.find_entry(table_hash(hash), |&id| id == e) {
                found.remove();
            }
            self.free_entries.push(e);
        }
    }

    fn entry_of(&self, hash: BlockHash) -> Option<u32> {
        self.by_hash
            .find(table_hash(hash), |&id| self.entries[id as usize].hash == hash)
            .copied()
    }

    fn create_entry(&mut self, hash: BlockHash) -> u32 {
        let entry = Entry {
            hash,
            global_seq: NOT_HELD,
            inline_seq: 0,
            last_child: NOT_HELD,
            inline_slot: NO_SLOT,
            children: 0,
        };
        let id = if let Some(id) = self.free_entries.pop() {
            self.entries[id as usize] = entry;
            let base = id as usize * self.words;
            self.bits[base..base + self.words].fill(0);
            id
        } else {
            // Grow by an eighth, not by doubling: the slab sits at the sum of the capacities for
            // a router's whole life, so doubling would waste up to half of it.
            if self.entries.len() == self.entries.capacity() {
                let more = (self.entries.len() / 8).max(1024);
                self.entries.reserve_exact(more);
                self.bits.reserve_exact(more * self.words);
            }
            self.entries.push(entry);
            self.bits.resize(self.bits.len() + self.words, 0);
            (self.entries.len() - 1) as u32
        };
        let entries = &self.entries;
        self.by_hash
            .insert_unique(table_hash(hash), id, |&x| table_hash(entries[x as usize].hash));
        id
    }

    // ---- LRU maintenance --------------------------------------------------------------------

    /// The LRU block of `holder` and its touch time, after dropping stale queue ids.
    fn lru_front(&mut self, holder: Holder) -> Option<(u32, u64)> {
        let mut lru = std::mem::take(self.lru_mut(holder));
        lru.settle(|e, seq| self.seq_of(holder, e) == Some(seq));
        let front = lru.peek();
        *self.lru_mut(holder) = lru;
        front
    }

    /// Evicts `holder`'s least recently used block; returns false when it holds none.
    fn evict_lru(&mut self, holder: Holder) -> bool {
        let Some((e, _)) = self.lru_front(holder) else {
            return false;
        };
        self.lru_mut(holder).pop();
        self.drop_membership(holder, e);
        self.evictions += 1;
        true
    }

    /// Evicts `slot`'s expired blocks (TTL, docs §2.5).
    fn purge_expired(&mut self, slot: u32, now_ms: u64) {
        let Some(ttl) = self.limits.local_ttl_ms else { return };
        let holder = Holder::Instance(slot);
        while let Some((e, time_ms)) = self.lru_front(holder) {
            if now_ms.saturating_sub(time_ms) < ttl {
                break;
            }
            self.lru_mut(holder).pop();
            self.drop_membership(holder, e);
            self.evictions += 1;
        }
    }

    /// Keeps `holder`'s queue bounded: cleans up to `CLEAN_FACTOR · work` ids of it (see
    /// [`lru`]), or, in the rare case sequence numbers run high, renumbers it whole.
    fn maybe_compact(&mut self, holder: Holder, work: usize) {
        let held = self.held(holder);
        let mut lru = std::mem::take(self.lru_mut(holder));
        if lru.needs_renumbering() {
            lru.renumber(|e, seq| self.seq_of(holder, e) == Some(seq));
            for (seq, e) in lru.all() {
                self.set_seq(holder, e, seq);
            }
        } else {
            lru.clean(held, lru::CLEAN_FACTOR * work, |e, seq| {
                self.seq_of(holder, e) == Some(seq)
            });
        }
        *self.lru_mut(holder) = lru;
    }

    /// Whether `e` is a live entry for `hash` (a cached id may have been freed or reused).
    #[inline]
    fn names(&self, e: u32, hash: BlockHash) -> bool {
        self.entries.get(e as usize).is_some_and(|x| x.live() && x.hash == hash)
    }

    /// The entry id of `run[i]`, reusing `hint[i]` when it still names that live block.
    #[inline]
    fn hinted_entry(&self, hint: &[u32], i: usize, hash: BlockHash) -> Option<u32> {
        match hint.get(i) {
            Some(&e) if self.names(e, hash) => Some(e),
            _ => self.entry_of(hash),
        }
    }

    // ---- public operations --------------------------------------------------------------------

    /// Touches a run of blocks for `holder` at `now_ms` (docs §2.2): creates missing entries
    /// (bumping their parent's `children`), makes the run's first block the most recent,
    /// then evicts down to capacity. A disabled global tier or a free slot ignores the call.
    ///
    /// Entry ids found by the previous `query` or `touch` of the same chain are reused.
    pub fn touch(&mut self, holder: Holder, run: &[BlockHash], parent: Option<BlockHash>, now_ms: u64) {
        match holder {
            Holder::Instance(s) if !self.is_live(s) => return,
            Holder::Global if !self.global_enabled() => return,
            Holder::Instance(s) => self.purge_expired(s, now_ms),
            Holder::Global => {}
        }
        let hint = std::mem::take(&mut self.walked);
        let mut ids = Vec::with_capacity(run.len());
        for (i, &h) in run.iter().enumerate() {
            let id = if let Some(id) = self.hinted_entry(&hint, i, h) {
                id
            } else {
                let id = self.create_entry(h);
                let parent_id = if i > 0 {
                    Some(ids[i - 1])
                } else {
                    parent.and_then(|p| self.entry_of(p))
                };
                if let Some(p) = parent_id {
                    let c = &mut self.entries[p as usize].children;
                    *c = c.saturating_add(1);
                }
                id
            };
            if i > 0 {
                self.entries[ids[i - 1] as usize].last_child = id;
            }
            ids.push(id);
        }
        // One run for the chain: each block once, at its first (most recent) position.
        let seq = self.lru_mut(holder).next_seq();
        let mut run_ids = Vec::with_capacity(ids.len());
        for &id in &ids {
            if self.seq_of(holder, id) != Some(seq) {
                self.set_seq(holder, id, seq);
                run_ids.push(id);
            }
        }
        self.lru_mut(holder).push(run_ids, now_ms);
        let cap = self.capacity(holder);
        while self.held(holder) as u64 > cap {
            if !self.evict_lru(holder) {
                break;
            }
        }
        self.maybe_compact(holder, ids.len());
        self.walked = ids;
    }

    /// Removes the listed blocks from `holder` (blocks it does not hold are ignored).
    pub fn remove(&mut self, holder: Holder, hashes: &[BlockHash]) {
        if let Holder::Instance(s) = holder {
            if !self.is_live(s) {
                return;
            }
        }
        for &h in hashes {
            if let Some(e) = self.entry_of(h) {
                if self.seq_of(holder, e).is_some() {
                    self.drop_membership(holder, e);
                }
            }
        }
        self.maybe_compact(holder, hashes.len());
    }

    /// Drops every block `holder` holds (each is current in exactly one queued run).
    fn clear_holder(&mut self, holder: Holder) {
        let lru = std::mem::take(self.lru_mut(holder));
        for (seq, e) in lru.all() {
            if self.seq_of(holder, e) == Some(seq) {
                self.drop_membership(holder, e);
            }
        }
    }

    /// Removes every block of instance `slot`.
    pub fn clear_instance(&mut self, slot: u32) {
        if self.is_live(slot) {
            self.clear_holder(Holder::Instance(slot));
        }
    }

    /// Removes every block of the global tier.
    pub fn clear_global(&mut self) {
        self.clear_holder(Holder::Global);
    }

    /// Longest prefix hits of `chain` for every instance and the global tier (docs §2.4).
    /// Purges expired blocks first; touches nothing.
    pub fn query(&mut self, chain: &[BlockHash], now_ms: u64, out: &mut IndexQuery) {
        if self.limits.local_ttl_ms.is_some() {
            for s in 0..self.instances.len() as u32 {
                if self.instances[s as usize].live {
                    self.purge_expired(s, now_ms);
                }
            }
        }
        out.local_blocks.clear();
        out.local_blocks.resize(self.instances.len(), 0);
        let words = self.words;
        let mut active = std::mem::take(&mut self.scratch_active);
        active.clear();
        active.extend_from_slice(&self.live_mask);
        let mut walked = std::mem::take(&mut self.walked);
        walked.clear();
        let mut any_local = active.iter().any(|&w| w != 0);
        let mut global_active = self.global_enabled();
        let mut global_blocks = 0u32;
        let mut deepest = 0u32;
        let mut deepest_entry = None;
        for (i, h) in chain.iter().enumerate() {
            if !any_local && !global_active {
                break;
            }
            let depth = i as u32;
            let followed = walked
                .last()
                .map(|&p| self.entries[p as usize].last_child)
                .filter(|&c| self.names(c, *h));
            let Some(e) = followed.or_else(|| self.entry_of(*h)) else {
                break;
            };
            walked.push(e);
            let base = e as usize * words;
            any_local = false;
            for (w, (a, held)) in active.iter_mut().zip(&self.bits[base..base + words]).enumerate() {
                let keep = *a & held;
                let mut dropped = *a & !keep;
                while dropped != 0 {
                    let b = dropped.trailing_zeros();
                    out.local_blocks[w * 64 + b as usize] = depth;
                    dropped &= dropped - 1;
                }
                *a = keep;
                any_local |= keep != 0;
            }
            if global_active && self.entries[e as usize].global_seq == NOT_HELD {
                global_active = false;
                global_blocks = depth;
            }
            if any_local || global_active {
                deepest = depth + 1;
                deepest_entry = Some(e);
            }
        }
        // Holders still matching at the end matched up to `deepest`.
        for (w, &a) in active.iter().enumerate() {
            let mut rest = a;
            while rest != 0 {
                let b = rest.trailing_zeros();
                out.local_blocks[w * 64 + b as usize] = deepest;
                rest &= rest - 1;
            }
        }
        if global_active {
            global_blocks = deepest;
        }
        self.scratch_active = active;
        self.walked = walked;
        out.global_blocks = global_blocks;
        out.deepest_blocks = deepest;
        out.branches = deepest_entry.map_or(0, |e| u32::from(self.entries[e as usize].children));
    }

    /// Block counts for `stats()`.
    pub fn stats(&self) -> IndexStats {
        IndexStats {
            entries: self.by_hash.len(),
            local_blocks: self.instances.iter().map(|h| if h.live { h.held } else { 0 }).collect(),
            global_blocks: self.global_held,
            evictions: self.evictions,
        }
    }

    /// Whether `holder` holds `hash` (for tests and introspection).
    pub fn holds(&self, holder: Holder, hash: BlockHash) -> bool {
        match holder {
            Holder::Instance(s) if !self.is_live(s) => false,
            _ => self.entry_of(hash).is_some_and(|e| self.seq_of(holder, e).is_some()),
        }
    }

    /// Heap bytes of the index by component, from the containers' capacities.
    pub fn memory_breakdown(&self) -> [(&'static str, usize); 6] {
        use std::mem::size_of;
        // hashbrown: one control byte per bucket plus the slot; buckets = capacity · 8/7.
        let table_bytes = |cap: usize, slot: usize| cap * 8 / 7 * (slot + 1);
        let seqs: usize = self
            .instances
            .iter()
            .map(|h| table_bytes(h.seqs.capacity(), size_of::<(u32, u32)>()))
            .sum();
        let runs: usize =
            self.instances.iter().map(|h| h.lru.heap_bytes()).sum::<usize>() + self.global_lru.heap_bytes();
        [
            ("hash_table", table_bytes(self.by_hash.capacity(), size_of::<u32>())),
            (
                "entries",
                self.entries.capacity() * size_of::<Entry>() + self.free_entries.capacity() * size_of::<u32>(),
            ),
            ("holder_bits", self.bits.capacity() * 8),
            ("extra_holder_maps", seqs),
            ("lru_runs", runs),
            ("entry_count", self.by_hash.len()),
        ]
    }

    /// Heap bytes of the index (sum of [`KvIndex::memory_breakdown`] without the count).
    pub fn memory_bytes(&self) -> usize {
        self.memory_breakdown()
            .iter()
            .filter(|(k, _)| *k != "entry_count")
            .map(|(_, v)| v)
            .sum()
    }
}

/// Hash of a block hash for the entry table: block hashes from xxh3 are already uniform,
/// but trace ids are small sequential integers, hence the multiply-fold.
#[inline]
fn table_hash(hash: BlockHash) -> u64 {
    let m = hash.0.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    m ^ (m >> 29)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chain(range: std::ops::Range<u64>) -> Vec<BlockHash> {
        range.map(BlockHash).collect()
    }

    fn index(local: u64, global: u64) -> KvIndex {
        let mut ix = KvIndex::new(IndexLimits {
            local_capacity: local,
            global_capacity: global,
            local_ttl_ms: None,
        });
        for s in 0..3 {
            ix.add_slot(s);
        }
        ix
    }

    #[test]
    fn longest_prefix_per_instance_and_global() {
        let mut ix = index(100, 100);
        ix.touch(Holder::Instance(0), &chain(0..10), None, 0);
        ix.touch(Holder::Instance(1), &chain(0..4), None, 0);
        ix.touch(Holder::Global, &chain(0..6), None, 0);
        let mut q = IndexQuery::default();
        ix.query(&chain(0..12), 0, &mut q);
        assert_eq!(q.local_blocks, vec![10, 4, 0]);
        assert_eq!(q.global_blocks, 6);
        assert_eq!(q.deepest_blocks, 10);
    }

    #[test]
    fn tail_is_evicted_first() {
        let mut ix = index(5, 0);
        ix.touch(Holder::Instance(0), &chain(0..5), None, 0);
        ix.touch(Holder::Instance(0), &chain(100..102), None, 1);
        // Two evictions took the tail (blocks 4 and 3) of the older chain.
        let mut q = IndexQuery::default();
        ix.query(&chain(0..5), 1, &mut q);
        assert_eq!(q.local_blocks[0], 3);
        assert_eq!(ix.stats().local_blocks[0], 5);
    }

    #[test]
    fn children_count_branches() {
        let mut ix = index(100, 0);
        let sys = chain(0..4);
        let mut a = sys.clone();
        a.extend(chain(10..12));
        let mut b = sys.clone();
        b.extend(chain(20..22));
        ix.touch(Holder::Instance(0), &a, None, 0);
        ix.touch(Holder::Instance(1), &b, None, 0);
        let mut q = IndexQuery::default();
        let mut c = sys.clone();
        c.push(BlockHash(99));
        ix.query(&c, 0, &mut q);
        assert_eq!((q.deepest_blocks, q.branches), (4, 2));
        ix.query(&a, 0, &mut q);
        assert_eq!((q.deepest_blocks, q.branches), (6, 0));
    }

    #[test]
    fn ttl_and_removal_free_entries() {
        let mut ix = KvIndex::new(IndexLimits {
            local_capacity: 100,
            global_capacity: 0,
            local_ttl_ms: Some(1000),
        });
        ix.add_slot(0);
        ix.touch(Holder::Instance(0), &chain(0..3), None, 0);
        let mut q = IndexQuery::default();
        ix.query(&chain(0..3), 999, &mut q);
        assert_eq!(q.local_blocks[0], 3);
        ix.query(&chain(0..3), 1000, &mut q);
        assert_eq!(q.local_blocks[0], 0);
        assert_eq!(ix.stats().entries, 0);
        ix.touch(Holder::Instance(0), &chain(0..3), None, 2000);
        ix.remove(Holder::Instance(0), &chain(1..2));
        ix.query(&chain(0..3), 2000, &mut q);
        assert_eq!(q.local_blocks[0], 1);
    }

    #[test]
    fn many_slots_restride() {
        let mut ix = KvIndex::new(IndexLimits {
            local_capacity: 10,
            global_capacity: 0,
            local_ttl_ms: None,
        });
        ix.add_slot(0);
        ix.touch(Holder::Instance(0), &chain(0..3), None, 0);
        ix.add_slot(130);
        ix.touch(Holder::Instance(130), &chain(0..2), None, 0);
        let mut q = IndexQuery::default();
        ix.query(&chain(0..3), 0, &mut q);
        assert_eq!((q.local_blocks[0], q.local_blocks[130]), (3, 2));
        ix.remove_slot(0);
        ix.query(&chain(0..3), 0, &mut q);
        assert_eq!((q.local_blocks[0], q.local_blocks[130]), (0, 2));
    }

    #[test]
    fn compaction_keeps_order() {
        let mut ix = index(8, 8);
        for round in 0..200u64 {
            ix.touch(Holder::Instance(0), &chain(0..4), None, round);
            ix.touch(Holder::Global, &chain(0..4), None, round);
            ix.touch(Holder::Instance(0), &chain(100 + round..101 + round), None, round);
        }
        assert!(ix.instances[0].lru.queued() <= 2 * 8 + lru::COMPACT_SLACK + 4 * lru::CLEAN_FACTOR);
        let mut q = IndexQuery::default();
        ix.query(&chain(0..4), 0, &mut q);
        assert_eq!((q.local_blocks[0], q.global_blocks), (4, 4));
    }

    /// A naive model of §2: per holder, an ordered list (LRU first) and a capacity.
    #[derive(Default)]
    struct Model {
        order: std::collections::HashMap<Option<u32>, Vec<u64>>,
    }

    impl Model {
        fn touch(&mut self, holder: Option<u32>, run: &[u64], cap: usize) {
            let order = self.order.entry(holder).or_default();
            for h in run.iter().rev() {
                order.retain(|x| x != h);
                order.push(*h);
            }
            while order.len() > cap {
                order.remove(0);
            }
        }
        fn remove(&mut self, holder: Option<u32>, run: &[u64]) {
            self.order.entry(holder).or_default().retain(|x| !run.contains(x));
        }
        fn hit(&self, holder: Option<u32>, chain: &[u64]) -> u32 {
            let held = self.order.get(&holder);
            chain.iter().take_while(|h| held.is_some_and(|o| o.contains(h))).count() as u32
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
        #[test]
        fn matches_a_naive_lru_model(ops in proptest::collection::vec((0u8..4, 0u32..4, 0u64..6, 1usize..7), 1..300)) {
            let (local, global) = (6usize, 9usize);
            let mut ix = KvIndex::new(IndexLimits { local_capacity: local as u64, global_capacity: global as u64, local_ttl_ms: None });
            for s in 0..3 {
                ix.add_slot(s);
            }
            let mut model = Model::default();
            let mut q = IndexQuery::default();
            for (kind, who, start, len) in ops {
                let (holder, key, cap) = if who == 3 { (Holder::Global, None, global) } else { (Holder::Instance(who), Some(who), local) };
                let run: Vec<u64> = (start..start + len as u64).collect();
                let chain: Vec<BlockHash> = run.iter().map(|&h| BlockHash(h)).collect();
                match kind {
                    0 | 1 => {
                        ix.touch(holder, &chain, None, 0);
                        model.touch(key, &run, cap);
                    }
                    2 => {
                        ix.remove(holder, &chain);
                        model.remove(key, &run);
                    }
                    _ => {}
                }
                let probe: Vec<u64> = (0..12).collect();
                let probe_chain: Vec<BlockHash> = probe.iter().map(|&h| BlockHash(h)).collect();
                ix.query(&probe_chain, 0, &mut q);
                for s in 0..3u32 {
                    proptest::prop_assert_eq!(q.local_blocks[s as usize], model.hit(Some(s), &probe));
                }
                proptest::prop_assert_eq!(q.global_blocks, model.hit(None, &probe));
                for s in 0..3u32 {
                    proptest::prop_assert_eq!(ix.stats().local_blocks[s as usize], model.order.get(&Some(s)).map_or(0, Vec::len));
                }
            }
        }
    }
}
