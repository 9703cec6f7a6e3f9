//! The two-tier KV$ index: which blocks each instance's GPU cache holds, and which the
//! cluster-wide global tier (CPU / Mooncake / LMCache store) holds.
//!
//! Algorithm: one 40-byte *entry* per block hash that some holder has, in a slab; each entry
//! carries a bitset of the instances holding it (slots 0–63 inline, higher slots in a side
//! array) and the global tier's sequence number. A query walks the request's hash chain
//! once, ANDing the set of instances still matching with each block's bitset; when an
//! instance's bit drops, its longest prefix hit is the current depth. Each step finds the
//! next block's entry without the hash table when it can: first in the slab slot after the
//! previous entry's (a chain's entries are mostly consecutive), then at the previous entry's
//! `last_child`; the walk stops at the first block without an entry, so a miss costs one
//! lookup. The walk only reads (a `last_child` it corrects is a relaxed atomic), so the
//! router runs it under a shared lock; the entry ids it found go back to the caller in a
//! `Walk`, so that inserting the same chain right after (insert on route) needs no second
//! lookup: they are used as they are while the index's count of freed entries has not moved
//! since the walk, else checked one by one (a freed slot may name another block by then). An
//! insert that moves no block in or out of a holder (`KvIndex::refront_walked`: the instance
//! and the global tier already hold the whole chain, and it only becomes their newest blocks)
//! also runs under the shared lock: each holder's LRU order (and map) behind a mutex of its
//! own, the entries' sequence numbers relaxed atomics written only under that mutex, and
//! nothing a walk reads changes. Every other write takes `&mut self`. The index takes chains
//! already hashed: the router hashes a prompt before it takes the index lock.
//!
//! The hash table is ours (`block_table.rs`: linear probing over 8-byte slots whose address we
//! compute), so the write path of a new chain into full holders — one table lookup to create
//! each new block, one to remove each evicted one, each a cache miss at ~1M entries — asks the
//! memory for those lines a few blocks ahead (`PREFETCH_DISTANCE`, `prefetch.rs`).
//!
//! Each holder (instance or global tier) has a capacity in blocks and an LRU order
//! ([`lru::RunLru`], one run per touched chain). Touching a chain goes from its last block
//! to its first, leaving the first block the most recent, so a chain's tail is evicted
//! before its head, as vLLM frees blocks tail first. When the holder's newest run already is
//! a prefix of the chain, all current, the touch only renews that run and appends the new
//! blocks; the run being touched again whole (the same prompt routed again) costs an id
//! comparison per block and no entry access. When the chain's previous touch is an older run
//! (a session's next turn after other sessions' routes), that run is *relinked*: its ids move to
//! the newest end under the number their entries already store (`relink_anchors` finds it
//! through the number of the chain's middle block), so its current blocks are read at most,
//! never written — a re-touch of a 32K chain no longer writes 2,048 entries per holder, and two
//! threads routing one session's turns in turn no longer pull each other's lines (measured:
//! `BENCHMARKS.md`, "Relinked runs"). Optional TTL ages instance blocks. The first
//! two instances to hold a block keep their LRU sequence numbers inline in the entry (most
//! blocks are one session's history, held by one instance, or by two once the session moved);
//! further holders use a per-instance map.
//! Each instance also keeps the newest touch time of a block it gave up for room or by a
//! removal event ([`KvIndex::evicted_touch_ms`], O(1) per eviction): how recent the KV$ a new
//! chain displaces there is, which `smetric`'s displacement guard reads.
//!
//! In exact (event-fed) mode the index also keeps, per instance, the blocks the router sent
//! there and no event has confirmed yet ([`pending`], docs §2.7): a query counts them with the
//! instance's held blocks, a store or removal addressed to the instance ends them, and they
//! expire `exact_pending_ttl_s` after the route that sent them — so a follow-up that beats its
//! predecessor's KV events still finds its prefix at home. A finished request's answer is
//! credited the same way ([`KvIndex::credit_answer`]): a chain matched through the request's
//! last prompt block counts the answer's full blocks past it, until their events arrive.
//!
//! Invariants: an entry exists iff at least one holder holds it; every held (entry, holder)
//! pair is current in exactly one run of the holder's LRU order; a holder never holds more
//! than its capacity after a call returns; an instance never has more sent blocks than its
//! capacity. Memory is therefore bounded by `Σ capacities` entries plus `instances · local
//! capacity` sent blocks. A `Walk` stays valid across writes: its ids are trusted only
//! while `frees` is unchanged, its held prefixes only while `writes` is; a touch that uses
//! one does exactly what a touch of the same chain without it would.
//!
//! Complexity: `query` O(chain blocks with an entry · ⌈instances/64⌉); `touch` O(run)
//! amortised; removal O(1) per block; `clear`/`remove_slot` O(blocks held).
//!
//! Bytes per (block, holder) pair are measured by the `soak` example;
//! [`KvIndex::memory_bytes`] estimates them from the container sizes.

mod block_table;
mod host;
pub(crate) mod lru;
mod pending;
mod query;
#[cfg(test)]
mod tests;

use std::sync::atomic::{AtomicU32, Ordering};

use parking_lot::Mutex;

use block_table::BlockTable;
pub use host::HostPool;
use host::HostTiers;
use lru::RunLru;
use pending::PendingBlocks;
pub(crate) use query::Walk;

use crate::mix_map::MixMap;
use crate::prefetch::prefetch_read;

use crate::ids::BlockHash;

/// How many blocks ahead the write path prefetches what it will look up (a new chain's table
/// slots; an eviction loop's entries and their slots): far enough for a miss (≈ 100 ns) to
/// land before its turn, near enough to stay in L1 (measured: `BENCHMARKS.md`).
const PREFETCH_DISTANCE: usize = 8;

/// Marks "the global tier does not hold this entry" and "no child yet".
const NOT_HELD: u32 = u32::MAX;
/// `Entry::inline_slot` when no instance holds the block inline.
const NO_SLOT: u16 = u16::MAX;
/// `Entry::inline_slot` of a slab slot on the free list.
const FREE_ENTRY: u16 = u16::MAX - 1;
/// Instance slots the index can address (slot numbers must stay below [`FREE_ENTRY`]).
pub const MAX_SLOTS: u32 = FREE_ENTRY as u32;

/// Where a block is held.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Holder {
    /// An instance's local (GPU) cache, by slot.
    Instance(u32),
    /// The cluster-wide global tier.
    Global,
}

/// One indexed block: 40 bytes; a query step reads one entry only.
#[derive(Debug)]
struct Entry {
    hash: BlockHash,
    /// The instances holding this block, slots 0–63 (higher slots: [`KvIndex::more_bits`]).
    held: u64,
    /// Sequence number of the global tier's current touch, or [`NOT_HELD`]. The three sequence
    /// numbers are atomics (relaxed) because a touch that moves no block in or out of a holder
    /// ([`KvIndex::refront_walked`]) rewrites its holder's number under a shared borrow, behind
    /// that holder's mutex; every other write has `&mut self`.
    global_seq: AtomicU32,
    /// Sequence number of `inline_slot`'s current touch.
    inline_seq: AtomicU32,
    /// The child most recently touched or walked after this block: a query that follows it
    /// (and checks the child's hash) walks a chain through the slab, not the hash table.
    /// Atomic (relaxed) because walks under a shared lock update it: it is a hint, checked
    /// before use, so a lost or torn-free race costs a lookup, never an answer.
    last_child: AtomicU32,
    /// Sequence number of `second_slot`'s current touch.
    second_seq: AtomicU32,
    /// The first instance that held this block keeps its sequence number inline, so that a
    /// touch of a single-holder block needs no map access; the second holder uses the
    /// `second_*` seat, further holders their map. [`NO_SLOT`] when none, [`FREE_ENTRY`] while
    /// the slab slot is on the free list.
    inline_slot: u16,
    /// The second inline seat ([`NO_SLOT`] when none): a moved session's old copy, or a prefix
    /// two instances hold, costs neither holder a map access (measured: a second holder through
    /// its map made a 32K decision ×2.4 slower; `BENCHMARKS.md`).
    second_slot: u16,
    /// Distinct child blocks created under this block (saturating); a shared system prompt's
    /// last block has many, a session's latest turn none. Drives turn inference.
    children: u16,
}

const _: () = assert!(std::mem::size_of::<Entry>() == 40);

impl Entry {
    fn live(&self) -> bool {
        self.inline_slot != FREE_ENTRY
    }

    /// Whether the global tier holds this block.
    #[inline]
    fn in_global(&self) -> bool {
        self.global_seq.load(Ordering::Relaxed) != NOT_HELD
    }
}

/// An instance's LRU order and the sequence numbers it keeps outside the entries' seats.
#[derive(Debug, Default)]
struct Order {
    lru: RunLru,
    /// Entry id → current LRU sequence number, for entries that do not hold this slot inline.
    seqs: MixMap<u32, u32>,
}

#[derive(Debug, Default)]
struct InstanceHolder {
    /// Blocks held (inline and in `order.seqs`).
    held: usize,
    /// In a mutex only so that [`KvIndex::refront_walked`] can reorder it under a shared
    /// borrow; every other access goes through `get_mut`, with no locking.
    order: Mutex<Order>,
    live: bool,
    /// The latest touch time of a block this instance's GPU cache evicted (for capacity, or by
    /// an engine's removal event; not for age), ms; `None` until one is. `now` minus it is how
    /// recently used the KV$ a new chain displaces here is ([`KvIndex::evicted_touch_ms`]).
    evicted_touch_ms: Option<u64>,
}

/// The parent of a run's first block to be created: the previous block's entry, or the
/// `parent` hash given to [`KvIndex::touch`].
#[derive(Clone, Copy)]
enum Parent {
    Entry(u32),
    Hash(BlockHash),
}

/// Result of [`KvIndex::query`].
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct IndexQuery {
    /// Longest prefix hit in blocks, per instance slot (0 for free slots).
    pub local_blocks: Vec<u32>,
    /// Longest prefix hit in blocks in the global tier.
    pub global_blocks: u32,
    /// Longest prefix hit in blocks in each instance slot's host pool (§2.8; empty while no
    /// pool holds a block: read it with [`IndexQuery::host_blocks_of`]).
    pub host_blocks: Vec<u32>,
    /// Deepest prefix any holder matched, in blocks.
    pub deepest_blocks: u32,
    /// `children` of the deepest matched block (0 when nothing matched).
    pub branches: u32,
}

impl IndexQuery {
    /// The prefix `slot`'s host pool holds, in blocks (0 when none does).
    #[inline]
    pub fn host_blocks_of(&self, slot: u32) -> u32 {
        self.host_blocks.get(slot as usize).copied().unwrap_or(0)
    }
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
    /// Sent, not yet confirmed blocks per instance slot (§2.7; expired ones not yet purged count).
    pub pending_blocks: Vec<usize>,
    /// Answer credits per instance slot (§2.7; expired ones not yet purged count).
    pub answer_credits: Vec<usize>,
    /// Blocks held by each instance slot's host pool (§2.8; a shared pool's blocks count for
    /// each of its members).
    pub host_blocks: Vec<usize>,
}

/// The two-tier index. Not synchronised: the router wraps it in a read-write lock; the query
/// walk (`KvIndex::query_shared`) reads only and runs under the shared side.
#[derive(Debug)]
pub struct KvIndex {
    limits: IndexLimits,
    /// Entry ids keyed by their block hash (the hash lives in the entry, not twice).
    by_hash: BlockTable,
    entries: Vec<Entry>,
    free_entries: Vec<u32>,
    /// `words - 1` u64 per entry: the instance bitset of slots 64 and up (empty while every
    /// slot is below 64).
    more_bits: Vec<u64>,
    /// Words of an instance bitset (`⌈slots/64⌉`, at least 1).
    words: usize,
    live_mask: Vec<u64>,
    instances: Vec<InstanceHolder>,
    /// As [`InstanceHolder::lru`].
    global_lru: Mutex<RunLru>,
    global_held: usize,
    evictions: u64,
    /// The walk of the last [`KvIndex::query`] (for `touch_queried` and
    /// `send_queried`, test-only), or the entry ids the last touch resolved, in chain order
    /// (reused, after a liveness check, by the next touch of the same chain).
    last: Walk,
    /// Entries freed since creation: a [`Walk`]'s ids are trusted as they are while this has
    /// not moved since the walk.
    frees: u64,
    /// Writes that may have changed some holder's blocks since creation: a [`Walk`]'s
    /// confirmed prefixes hold while this has not moved since the walk.
    writes: u64,
    /// Blocks sent to an instance and not yet confirmed by its events (exact mode, §2.7).
    pending: PendingBlocks,
    /// The instances' host tiers (§2.8), once [`KvIndex::enable_host_tiers`] turned them on.
    hosts: Option<Box<HostTiers>>,
    /// Test only: trust a walk's ids even after entries were freed (the bug `frees` prevents),
    /// so that the tests can show they catch it.
    #[cfg(test)]
    trust_stale_walks: bool,
    /// Test only: walks used after an entry was freed since (so that a test can show it
    /// exercised them).
    #[cfg(test)]
    pub(crate) outdated_walks: u64,
    /// Test only: of those, the walks with an id that no longer names its block.
    #[cfg(test)]
    pub(crate) stale_walks: u64,
    /// Test only: re-fronts in place that made the chain a new run in some holder (not only
    /// renewals), counted so that a test can show it exercised them.
    #[cfg(test)]
    pub(crate) refronts: std::sync::atomic::AtomicU64,
    /// Test only: the broken variant of [`KvIndex::refront_walked`] that forgets the global
    /// tier's order (the negative control of the tests that compare it with `touch_walked`).
    #[cfg(test)]
    pub(crate) refront_skips_global: bool,
}

impl KvIndex {
    /// An empty index with no instance slot.
    pub fn new(limits: IndexLimits) -> Self {
        Self {
            limits,
            by_hash: BlockTable::default(),
            entries: Vec::new(),
            free_entries: Vec::new(),
            more_bits: Vec::new(),
            words: 1,
            live_mask: vec![0],
            instances: Vec::new(),
            global_lru: Mutex::default(),
            global_held: 0,
            evictions: 0,
            last: Walk::default(),
            frees: 0,
            writes: 0,
            pending: PendingBlocks::default(),
            hosts: None,
            #[cfg(test)]
            trust_stale_walks: false,
            #[cfg(test)]
            outdated_walks: 0,
            #[cfg(test)]
            stale_walks: 0,
            #[cfg(test)]
            refronts: std::sync::atomic::AtomicU64::new(0),
            #[cfg(test)]
            refront_skips_global: false,
        }
    }

    /// Makes the blocks sent to an instance (`KvIndex::send_walked`) count as present there
    /// for `ttl_ms` or until an event confirms or evicts them, at most `local_capacity` per
    /// instance (docs §2.7). `ttl_ms = 0` turns it off (the default).
    ///
    /// With `answers`, a finished request's answer counts there too
    /// ([`KvIndex::credit_answer`], docs §2.7 "The answer").
    pub fn enable_pending(&mut self, ttl_ms: u64, answers: bool) {
        let cap = usize::try_from(self.limits.local_capacity).unwrap_or(usize::MAX);
        self.pending = PendingBlocks::new(ttl_ms, cap, answers);
    }

    /// Exact mode's record of a finished request (docs §2.7, "The answer"): on `slot`, a chain
    /// matched through `anchor` (the request's last full prompt block) counts up to `blocks`
    /// more of its own blocks (the answer's full blocks), until the events confirm them, evict
    /// `anchor`, or the pending TTL passes. Nothing unless sent blocks and answer credits are on.
    ///
    /// `depth` is the anchor's position in the request's chain plus one (the chain's length).
    pub fn credit_answer(&mut self, slot: u32, anchor: BlockHash, depth: u32, blocks: u32, now_ms: u64) {
        if self.is_live(slot) && depth > 0 {
            self.pending.credit(slot, anchor, depth, blocks, now_ms);
        }
    }

    /// Gives every instance slot a host tier of `capacity` blocks, its own pool until
    /// [`KvIndex::set_host_pool`] names a shared one (§2.8). `capacity = 0` turns them off
    /// (host-tier writes are then ignored, as a disabled global tier's are).
    pub fn enable_host_tiers(&mut self, capacity: u64) {
        self.hosts = (capacity > 0).then(|| {
            let mut hosts = HostTiers::new(capacity);
            for (s, h) in self.instances.iter().enumerate() {
                if h.live {
                    hosts.add_slot(s as u32);
                }
            }
            Box::new(hosts)
        });
    }

    /// Moves instance `slot` into `pool` (its own, or a named one shared with the instances
    /// named into it); what its old pool held stays there (it is the old pool's), and an old
    /// pool left without members is dropped. Nothing when host tiers are off or the slot is free.
    pub fn set_host_pool(&mut self, slot: u32, pool: &HostPool) {
        if self.is_live(slot)
            && let Some(hosts) = &mut self.hosts
        {
            self.writes += 1;
            hosts.join(slot, pool);
        }
    }

    /// The host pool of instance `slot` (None when host tiers are off or the slot is free).
    pub fn host_pool(&self, slot: u32) -> Option<HostPool> {
        self.hosts.as_ref().filter(|_| self.is_live(slot))?.pool_name(slot)
    }

    /// Records that `slot`'s host pool now holds `run` (continuing `parent`).
    pub fn touch_host(&mut self, slot: u32, run: &[BlockHash], parent: Option<BlockHash>, now_ms: u64) {
        if self.is_live(slot)
            && let Some(hosts) = &mut self.hosts
        {
            self.writes += 1;
            hosts.touch(slot, run, parent, now_ms);
        }
    }

    /// Records that `slot`'s host pool dropped `hashes`.
    pub fn remove_host(&mut self, slot: u32, hashes: &[BlockHash]) {
        if self.is_live(slot)
            && let Some(hosts) = &mut self.hosts
        {
            self.writes += 1;
            hosts.remove(slot, hashes);
        }
    }

    /// Touches `chain` in `slot`'s host pool in place, under a shared borrow, when the pool
    /// already holds all of it; see [`KvIndex::refront_walked`]. Only right after this thread's
    /// query of `chain` ([`KvIndex::query_shared`]), whose host walk it reuses.
    pub(crate) fn refront_host_walked(&self, slot: u32, chain: &[BlockHash], now_ms: u64) -> bool {
        self.is_live(slot) && self.hosts.as_ref().is_some_and(|h| h.refront(slot, chain, now_ms))
    }

    /// Drops everything `slot`'s host pool holds.
    pub fn clear_host(&mut self, slot: u32) {
        if self.is_live(slot)
            && let Some(hosts) = &mut self.hosts
        {
            self.writes += 1;
            hosts.clear(slot);
        }
    }

    /// Whether `slot`'s host pool holds `hash`.
    pub fn host_holds(&self, slot: u32, hash: BlockHash) -> bool {
        self.is_live(slot) && self.hosts.as_ref().is_some_and(|h| h.holds(slot, hash))
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
        self.pending.clear(slot);
        self.writes += 1;
        self.live_mask[s / 64] |= 1 << (s % 64);
        if let Some(hosts) = &mut self.hosts {
            hosts.add_slot(slot);
        }
    }

    /// Drops everything `slot` holds and marks it free.
    pub fn remove_slot(&mut self, slot: u32) {
        self.writes += 1;
        self.clear_instance(slot);
        if let Some(h) = self.instances.get_mut(slot as usize) {
            h.live = false;
            let s = slot as usize;
            self.live_mask[s / 64] &= !(1 << (s % 64));
        }
        if let Some(hosts) = &mut self.hosts {
            hosts.remove_slot(slot);
        }
    }

    fn restride(&mut self, words: usize) {
        let (old, new) = (self.words - 1, words - 1);
        let mut bits = vec![0u64; self.entries.len() * new];
        for e in 0..self.entries.len() {
            bits[e * new..e * new + old].copy_from_slice(&self.more_bits[e * old..(e + 1) * old]);
        }
        self.more_bits = bits;
        self.live_mask.resize(words, 0);
        self.words = words;
    }

    // ---- instance bitsets ---------------------------------------------------------------------

    /// The bitset word of entry `e` holding slot `s`'s bit, and that bit.
    #[inline]
    fn bit_of(&mut self, e: u32, s: u32) -> (&mut u64, u64) {
        let bit = 1u64 << (s % 64);
        if s < 64 {
            (&mut self.entries[e as usize].held, bit)
        } else {
            let extra = self.words - 1;
            (&mut self.more_bits[e as usize * extra + s as usize / 64 - 1], bit)
        }
    }

    /// Whether no instance holds entry `e`.
    fn no_instance_holds(&self, e: u32) -> bool {
        let extra = self.words - 1;
        self.entries[e as usize].held == 0
            && self.more_bits[e as usize * extra..(e as usize + 1) * extra]
                .iter()
                .all(|&w| w == 0)
    }

    fn is_live(&self, slot: u32) -> bool {
        self.instances.get(slot as usize).is_some_and(|h| h.live)
    }

    // ---- per-holder sequence store -------------------------------------------------------

    #[inline]
    fn seq_of(&mut self, holder: Holder, e: u32) -> Option<u32> {
        let (_, seqs) = order_of(&mut self.instances, &mut self.global_lru, holder);
        seq_in(&self.entries, holder, seqs.as_deref(), e)
    }

    /// [`KvIndex::seq_of`] under a shared borrow: the instance's order mutex taken for the
    /// lookup.
    fn seq_locked(&self, holder: Holder, e: u32) -> Option<u32> {
        let order = match holder {
            Holder::Instance(s) => Some(self.instances[s as usize].order.lock()),
            Holder::Global => None,
        };
        seq_in(&self.entries, holder, order.as_deref().map(|o| &o.seqs), e)
    }

    /// `holder`'s LRU order, and a view of the sequence numbers it stores (split borrows, so
    /// that the order's stale-id checks read the entries directly).
    fn lru_and_seqs(&mut self, holder: Holder) -> (&mut RunLru, impl Fn(u32, u32) -> bool + '_) {
        let (lru, seqs) = order_of(&mut self.instances, &mut self.global_lru, holder);
        let (entries, seqs) = (&self.entries, seqs.map(|m| &*m));
        (lru, move |e, seq| seq_in(entries, holder, seqs, e) == Some(seq))
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
        order_of(&mut self.instances, &mut self.global_lru, holder).0
    }

    /// Records `seq` as `holder`'s current touch of `e`, adding `e` to the holder if needed;
    /// returns the number `e` stored before ([`NOT_HELD`] if the holder did not hold it;
    /// `seq` itself if nothing changed).
    #[inline]
    fn mark(&mut self, holder: Holder, e: u32, seq: u32) -> u32 {
        let entry = &mut self.entries[e as usize];
        match holder {
            Holder::Instance(s) if u32::from(entry.inline_slot) == s => {
                std::mem::replace(entry.inline_seq.get_mut(), seq)
            }
            Holder::Instance(s) if u32::from(entry.second_slot) == s => {
                std::mem::replace(entry.second_seq.get_mut(), seq)
            }
            Holder::Instance(s) => self.mark_shared(s, e, seq),
            Holder::Global => {
                let old = std::mem::replace(entry.global_seq.get_mut(), seq);
                self.global_held += usize::from(old == NOT_HELD);
                old
            }
        }
    }

    /// [`KvIndex::mark`] for an instance that does not hold `e` inline: it claims a free inline
    /// seat (the first, else the second), else it uses its map. The holder bit tells whether
    /// it holds `e`.
    #[cold]
    fn mark_shared(&mut self, s: u32, e: u32, seq: u32) -> u32 {
        let (word, bit) = self.bit_of(e, s);
        let held = *word & bit != 0;
        *word |= bit;
        let entry = &mut self.entries[e as usize];
        let holder = &mut self.instances[s as usize];
        holder.held += usize::from(!held);
        if !held && entry.inline_slot == NO_SLOT {
            entry.inline_slot = s as u16;
            *entry.inline_seq.get_mut() = seq;
            NOT_HELD
        } else if !held && entry.second_slot == NO_SLOT {
            entry.second_slot = s as u16;
            *entry.second_seq.get_mut() = seq;
            NOT_HELD
        } else {
            holder.order.get_mut().seqs.insert(e, seq).unwrap_or(NOT_HELD)
        }
    }

    /// Takes `e` away from `holder` (which must hold it) and frees the entry if nobody else does.
    fn drop_membership(&mut self, holder: Holder, e: u32) {
        let entry = &mut self.entries[e as usize];
        match holder {
            Holder::Instance(s) => {
                if u32::from(entry.inline_slot) == s {
                    entry.inline_slot = NO_SLOT;
                } else if u32::from(entry.second_slot) == s {
                    entry.second_slot = NO_SLOT;
                } else {
                    self.instances[s as usize].order.get_mut().seqs.remove(&e);
                }
                self.instances[s as usize].held -= 1;
                let (word, bit) = self.bit_of(e, s);
                *word &= !bit;
            }
            Holder::Global => {
                *entry.global_seq.get_mut() = NOT_HELD;
                self.global_held -= 1;
            }
        }
        if !self.entries[e as usize].in_global() && self.no_instance_holds(e) {
            let entry = &mut self.entries[e as usize];
            entry.inline_slot = FREE_ENTRY;
            let hash = entry.hash;
            self.by_hash.remove(table_hash(hash), e);
            self.free_entries.push(e);
            self.frees += 1;
        }
    }

    fn entry_of(&self, hash: BlockHash) -> Option<u32> {
        self.by_hash
            .find(table_hash(hash), |id| self.entries[id as usize].hash == hash)
    }

    fn create_entry(&mut self, hash: BlockHash) -> u32 {
        let entry = Entry {
            hash,
            held: 0,
            global_seq: AtomicU32::new(NOT_HELD),
            inline_seq: AtomicU32::new(0),
            second_seq: AtomicU32::new(0),
            last_child: AtomicU32::new(NOT_HELD),
            inline_slot: NO_SLOT,
            second_slot: NO_SLOT,
            children: 0,
        };
        let id = if let Some(id) = self.free_entries.pop() {
            self.entries[id as usize] = entry;
            let extra = self.words - 1;
            // Not even an empty `fill` while `more_bits` is unallocated: glibc's memset of 0
            // bytes at its dangling pointer takes a slow masked-store microcode assist.
            if extra > 0 {
                self.more_bits[id as usize * extra..(id as usize + 1) * extra].fill(0);
            }
            id
        } else {
            // Grow by an eighth, not by doubling: the slab sits at the sum of the capacities for
            // a router's whole life, so doubling would waste up to half of it.
            if self.entries.len() == self.entries.capacity() {
                let more = (self.entries.len() / 8).max(1024);
                self.entries.reserve_exact(more);
                self.more_bits.reserve_exact(more * (self.words - 1));
            }
            self.entries.push(entry);
            if self.words > 1 {
                self.more_bits.resize(self.more_bits.len() + self.words - 1, 0);
            }
            (self.entries.len() - 1) as u32
        };
        self.by_hash.insert_unique(table_hash(hash), id);
        id
    }

    // ---- LRU maintenance --------------------------------------------------------------------

    /// The LRU block of `holder` and its touch time, after dropping stale queue ids.
    fn lru_front(&mut self, holder: Holder) -> Option<(u32, u64)> {
        let (lru, current) = self.lru_and_seqs(holder);
        lru.settle(current);
        lru.peek()
    }

    /// Evicts `holder`'s least recently used block (for capacity); returns false when it holds none.
    fn evict_lru(&mut self, holder: Holder) -> bool {
        let Some((e, touched_ms)) = self.lru_front(holder) else {
            return false;
        };
        self.note_evicted(holder, touched_ms);
        self.lru_mut(holder).pop();
        self.drop_membership(holder, e);
        self.evictions += 1;
        true
    }

    /// Ahead of an eviction loop's next [`PREFETCH_DISTANCE`] pops: asks the memory for the
    /// entries `2·D..3·D` evictions from now and, of those `D..2·D` from now that the eviction
    /// will free, for their table slots (their hashes read from the entries asked for one batch
    /// ago), so that each eviction's lookups find their lines in cache. Once a batch, not once
    /// a pop: where the evicted lines were cached anyway (a moved session's old copy) the
    /// lookahead's own cost must stay small. Hints only.
    #[inline]
    fn prefetch_evictions(&mut self, holder: Holder) {
        const D: usize = PREFETCH_DISTANCE;
        let (lru, _) = order_of(&mut self.instances, &mut self.global_lru, holder);
        let (entries, table) = (&self.entries, &self.by_hash);
        // One look at the oldest run: its ids `D..3·D` evictions ahead, the nearer `D` last.
        let ahead = lru.peek_ahead(D, 3 * D);
        let (far, near) = ahead.split_at(ahead.len().saturating_sub(D));
        for entry in far.iter().filter_map(|&e| entries.get(e as usize)) {
            prefetch_read(entry);
        }
        // Only for an entry the eviction will free (no other holder, as far as the entry's
        // first 64 bits tell): a slot nobody will look up would only displace useful lines.
        let freed = |x: &Entry| match holder {
            Holder::Instance(_) => !x.in_global() && x.held.count_ones() <= 1,
            Holder::Global => x.held == 0,
        };
        for entry in near.iter().filter_map(|&e| entries.get(e as usize)) {
            if freed(entry) {
                table.prefetch(table_hash(entry.hash));
            }
        }
    }

    /// Records that `holder` evicted a block last touched at `touched_ms` (instances only).
    fn note_evicted(&mut self, holder: Holder, touched_ms: u64) {
        if let Holder::Instance(s) = holder {
            let latest = &mut self.instances[s as usize].evicted_touch_ms;
            *latest = Some(latest.map_or(touched_ms, |t| t.max(touched_ms)));
        }
    }

    /// The latest touch time of a block instance `slot`'s GPU cache has evicted, for capacity or
    /// by an engine's removal event (not for age), ms; `None` until one is, or for a free slot.
    /// `now − it` is the *retention* of the cache: how recently used the KV$ it is giving up is
    /// (`smetric`'s displacement guard, `RouterConfig::smetric_retention_s`). O(1).
    #[inline]
    pub fn evicted_touch_ms(&self, slot: u32) -> Option<u64> {
        self.instances.get(slot as usize).and_then(|h| h.evicted_touch_ms)
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

    /// [`compact`] of `holder`'s queue.
    fn maybe_compact(&mut self, holder: Holder, work: usize) {
        let held = self.held(holder);
        let (lru, seqs) = order_of(&mut self.instances, &mut self.global_lru, holder);
        compact(lru, held, work, &self.entries, holder, seqs);
    }

    /// The entry ids of `run` into `ids` (docs §2.2, creation pass): missing entries are
    /// created (bumping their parent's `children`) and each block's `last_child` is pointed
    /// at its successor in the run.
    ///
    /// On entry `ids` holds guesses, position by position (a walk or touch of this chain);
    /// the first `trusted` are taken as they are (the caller knows the walk that found them
    /// was of this very run, and that no entry has been freed since), the following ones are
    /// kept while they still name the block, and the rest is looked up or created.
    fn resolve(&mut self, run: &[BlockHash], parent: Option<BlockHash>, trusted: usize, ids: &mut Vec<u32>) {
        debug_assert!(trusted <= ids.len().min(run.len()));
        // (The test-only broken variant must get past this, for the tests to show they see it.)
        #[cfg(test)]
        let checked = !self.trust_stale_walks;
        #[cfg(not(test))]
        let checked = true;
        debug_assert!(
            !checked
                || ids[..trusted]
                    .iter()
                    .zip(run)
                    .all(|(&e, &h)| self.entries[e as usize].live() && self.entries[e as usize].hash == h)
        );
        ids.truncate(run.len());
        let known = trusted + self.check_hint(&run[trusted..], &ids[trusted..], ids[..trusted].last().copied());
        ids.truncate(known);
        ids.reserve(run.len() - known);
        let mut prev = ids.last().copied();
        for (i, &h) in run.iter().enumerate().skip(known) {
            if let Some(&ahead) = run.get(i + PREFETCH_DISTANCE) {
                self.by_hash.prefetch(table_hash(ahead));
            }
            let parent = if i > 0 {
                prev.map(Parent::Entry)
            } else {
                parent.map(Parent::Hash)
            };
            let id = self.find_or_create(h, parent);
            if let Some(p) = prev {
                *self.entries[p as usize].last_child.get_mut() = id;
            }
            ids.push(id);
            prev = Some(id);
        }
    }

    /// For [`KvIndex::resolve`]: how many leading blocks of `run` the ids in `hint` still name
    /// (live entries with these hashes), pointing each one's predecessor (`prev` for the
    /// first) `last_child` at it.
    fn check_hint(&mut self, run: &[BlockHash], hint: &[u32], mut prev: Option<u32>) -> usize {
        let entries = self.entries.as_slice();
        let mut known = 0;
        for (&h, &e) in run.iter().zip(hint) {
            if named(entries, e, h).is_none() {
                break;
            }
            if let Some(p) = prev {
                set_child(&entries[p as usize], e);
            }
            prev = Some(e);
            known += 1;
        }
        known
    }

    /// The entry of `h`, created if missing (bumping its parent's `children`). Out of line:
    /// [`KvIndex::resolve`]'s loop stays small, its state in registers.
    #[inline(never)]
    fn find_or_create(&mut self, h: BlockHash, parent: Option<Parent>) -> u32 {
        if let Some(e) = self.entry_of(h) {
            return e;
        }
        let id = self.create_entry(h);
        let parent_id = match parent {
            Some(Parent::Entry(p)) => Some(p),
            Some(Parent::Hash(p)) => self.entry_of(p),
            None => None,
        };
        if let Some(p) = parent_id {
            let c = &mut self.entries[p as usize].children;
            *c = c.saturating_add(1);
        }
        id
    }

    /// Touch pass and eviction (docs §2.2 steps 3–4) of the resolved chain `ids` for `holder`:
    /// [`front_run`], then evictions down to capacity.
    fn apply(&mut self, holder: Holder, now_ms: u64, ids: &[u32]) {
        let mut lru = std::mem::take(self.lru_mut(holder));
        let work = front_run(&mut lru, ids, now_ms, |e, seq| match seq {
            Some(seq) => self.mark(holder, e, seq),
            None => self.seq_of(holder, e).unwrap_or(NOT_HELD),
        });
        *self.lru_mut(holder) = lru;
        let cap = self.capacity(holder);
        let mut evicted = 0usize;
        while self.held(holder) as u64 > cap {
            if evicted.is_multiple_of(PREFETCH_DISTANCE) {
                self.prefetch_evictions(holder);
            }
            if !self.evict_lru(holder) {
                break;
            }
            evicted += 1;
        }
        self.maybe_compact(holder, work);
    }

    // ---- public operations --------------------------------------------------------------------

    /// Touches a run of blocks for `holder` at `now_ms` (docs §2.2): creates missing entries
    /// (bumping their parent's `children`), makes the run's first block the most recent,
    /// then evicts down to capacity. A disabled global tier or a free slot ignores the call.
    ///
    /// Entry ids found by the previous `query` or `touch` of the same chain are reused.
    pub fn touch(&mut self, holder: Holder, run: &[BlockHash], parent: Option<BlockHash>, now_ms: u64) {
        let mut last = std::mem::take(&mut self.last);
        // Not trusted: the last walk need not be of this run.
        last.untrust();
        self.touch_hinted(holder, run, parent, now_ms, &mut last);
        self.last = last;
    }

    /// [`KvIndex::touch`] with `hint`'s ids as the guesses of `run`'s entries (trusted when
    /// `hint` is a walk of `run` and no entry has been freed since); leaves in `hint` the ids
    /// resolved, no longer trusted.
    fn touch_hinted(
        &mut self,
        holder: Holder,
        run: &[BlockHash],
        parent: Option<BlockHash>,
        now_ms: u64,
        hint: &mut Walk,
    ) {
        match holder {
            Holder::Instance(s) if !self.is_live(s) => return,
            Holder::Global if !self.global_enabled() => return,
            Holder::Instance(s) => {
                self.purge_expired(s, now_ms);
                if !self.pending.is_empty() {
                    // The engine stored them: they are confirmed, no longer only sent.
                    self.pending.end(s, run);
                    self.pending.confirm_credits(s, run, parent);
                }
            }
            Holder::Global => {}
        }
        self.writes += 1;
        // After the purge, which may have freed entries.
        let trusted = self.trusted(hint, run);
        self.resolve(run, parent, trusted, &mut hint.ids);
        hint.untrust();
        self.apply(holder, now_ms, &hint.ids);
    }

    /// How many of `walk`'s leading ids may be used unchecked for a chain of `len` blocks:
    /// all of them while no entry has been freed since the walk, else none.
    fn trusted(&mut self, walk: &Walk, run: &[BlockHash]) -> usize {
        let len = run.len();
        #[cfg(test)]
        if walk.frees != u64::MAX && walk.frees != self.frees {
            self.outdated_walks += 1;
            let stale = walk.ids.iter().zip(run).any(|(&e, &h)| {
                let x = &self.entries[e as usize];
                !x.live() || x.hash != h
            });
            self.stale_walks += u64::from(stale);
            if self.trust_stale_walks {
                return walk.ids.len().min(len);
            }
        }
        if walk.frees == self.frees {
            walk.ids.len().min(len)
        } else {
            0
        }
    }

    /// Insert on route (docs §2.6): `touch(Instance(slot), chain)` then `touch(Global, chain)`.
    ///
    /// When the chain fits the instance's capacity, the first touch cannot evict any of the
    /// chain's blocks, so the second would find every entry the first resolved: the chain is
    /// resolved once and both holders are touched from it, which is the same sequence of
    /// state changes. A longer chain takes the two touches one after the other.
    pub fn touch_routed(&mut self, slot: u32, chain: &[BlockHash], now_ms: u64) {
        let mut last = std::mem::take(&mut self.last);
        last.untrust();
        self.touch_walked(slot, chain, now_ms, &mut last);
        self.last = last;
    }

    /// [`KvIndex::touch_routed`] of the chain the last [`KvIndex::query`] walked, at the
    /// same `now_ms`: the entry ids that walk found are used without being looked at again
    /// (unless an entry has been freed since). The caller guarantees that `chain` is that
    /// query's chain.
    #[cfg(test)]
    pub(crate) fn touch_queried(&mut self, slot: u32, chain: &[BlockHash], now_ms: u64) {
        let mut last = std::mem::take(&mut self.last);
        self.touch_walked(slot, chain, now_ms, &mut last);
        self.last = last;
    }

    /// [`KvIndex::touch_routed`] of the chain `walk` walked ([`KvIndex::query_shared`]), at
    /// the same `now_ms`: the walk's entry ids are used without being looked at again while
    /// no entry has been freed since (other writes may have come between: entries created
    /// since are found, ids of freed ones are not trusted). The caller guarantees that
    /// `chain` is the walk's chain. Leaves in `walk` the ids resolved, no longer trusted.
    pub(crate) fn touch_walked(&mut self, slot: u32, chain: &[BlockHash], now_ms: u64, walk: &mut Walk) {
        if !self.is_live(slot) || !self.global_enabled() || chain.len() as u64 > self.limits.local_capacity {
            self.touch_hinted(Holder::Instance(slot), chain, None, now_ms, walk);
            self.touch_hinted(Holder::Global, chain, None, now_ms, walk);
            return;
        }
        self.purge_expired(slot, now_ms);
        self.writes += 1;
        let trusted = self.trusted(walk, chain);
        self.resolve(chain, None, trusted, &mut walk.ids);
        walk.untrust();
        self.apply(Holder::Instance(slot), now_ms, &walk.ids);
        self.apply(Holder::Global, now_ms, &walk.ids);
    }

    /// [`KvIndex::touch_walked`] under a shared borrow, for the case where it moves no block
    /// in or out of any holder: `walk` and `query` (of this very index state) found the whole
    /// chain held by the instance and, when the global tier is on, by the tier. No entry is
    /// created or freed and nobody's held blocks change, so nothing is evicted; the touch only
    /// reorders the two holders' LRU (the chain becomes their newest blocks: a renewal in
    /// place when their newest run already is its prefix, else a new run whose sequence number
    /// each entry takes) and lets the queues clean, as `apply` does. That is all `touch_walked`
    /// would do (its TTL purge of the instance is checked to evict nothing). Returns false,
    /// having changed nothing, in every other case (exact mode, a walk the index has moved on
    /// from, a block missing, an instance block due to expire): the caller then calls
    /// `touch_walked` under the exclusive lock.
    ///
    /// Concurrent re-fronts are safe and have one order: each takes the instance's mutex (its
    /// order and its map), writes the instance's part, then takes the global tier's and
    /// writes its part, and releases nothing before the end (two-phase locking), so two of
    /// them that share a holder are ordered by that holder's mutex, and two that share none
    /// commute. Sequence numbers that run high are renumbered in place, under the holder's
    /// mutex ([`compact`]), as the write under `&mut` would. Walks beside it read only holder
    /// bits and whether the tier holds a block, which it does not change. `applied` runs with
    /// the mutexes still held, after the write: what it records is in the writes' order.
    ///
    /// Complexity: O(chain) id comparisons when the chain already is both holders' newest run
    /// (a renewal), else one sequence number written per block and holder; plus the cleaning's
    /// bounded share, as for any touch.
    pub(crate) fn refront_walked(
        &self,
        slot: u32,
        chain: &[BlockHash],
        now_ms: u64,
        walk: &Walk,
        query: &IndexQuery,
        applied: impl FnOnce(),
    ) -> bool {
        let len = chain.len();
        let stamps_hold = walk.frees == self.frees && walk.writes == self.writes;
        if len == 0 || walk.ids.len() != len || !stamps_hold || !self.is_live(slot) || self.pending.enabled() {
            return false;
        }
        let global_on = self.global_enabled();
        let all_held = query.local_blocks.get(slot as usize) == Some(&(len as u32))
            && (!global_on || query.global_blocks == len as u32);
        if !all_held {
            return false;
        }
        let h = &self.instances[slot as usize];
        let mut order = h.order.lock();
        let Order { lru: local, seqs } = &mut *order;
        let expired = self.limits.local_ttl_ms.is_some_and(|ttl| {
            local
                .oldest_live_time()
                .is_some_and(|t| now_ms.saturating_sub(t) >= ttl)
        });
        if expired {
            return false;
        }
        let entries = self.entries.as_slice();
        let holder = Holder::Instance(slot);
        #[cfg(test)]
        let runs_before = local.next_seq();
        let work = front_run(local, &walk.ids, now_ms, |e, seq| match seq {
            Some(seq) => remark_held(entries, holder, Some(&mut *seqs), e, seq),
            None => seq_in(entries, holder, Some(&*seqs), e).unwrap_or(NOT_HELD),
        });
        compact(local, h.held, work, entries, holder, Some(seqs));
        #[cfg(test)]
        let mut refronted = local.next_seq() != runs_before;
        #[cfg(test)]
        let global_on = global_on && !self.refront_skips_global;
        // The global tier's mutex only now, after the instance's part, so that one thread's
        // global part runs beside another's instance part; and before any mutex is released,
        // so that the re-fronts stay ordered (see above).
        let mut global = global_on.then(|| self.global_lru.lock());
        if let Some(g) = global.as_deref_mut() {
            #[cfg(test)]
            let runs_before = g.next_seq();
            let work = front_run(g, &walk.ids, now_ms, |e, seq| match seq {
                Some(seq) => remark_held(entries, Holder::Global, None, e, seq),
                None => seq_in(entries, Holder::Global, None, e).unwrap_or(NOT_HELD),
            });
            compact(g, self.global_held, work, entries, Holder::Global, None);
            #[cfg(test)]
            {
                refronted |= g.next_seq() != runs_before;
            }
        }
        #[cfg(test)]
        if refronted {
            self.refronts.fetch_add(1, Ordering::Relaxed);
        }
        applied();
        true
    }

    /// Removes the listed blocks from `holder` (blocks it does not hold are ignored).
    pub fn remove(&mut self, holder: Holder, hashes: &[BlockHash]) {
        self.writes += 1;
        if let Holder::Instance(s) = holder {
            if !self.is_live(s) {
                return;
            }
            if !self.pending.is_empty() {
                // Evicted by the engine: a sent block stops counting too, and so does an
                // answer past an evicted anchor (vLLM frees a chain tail first).
                self.pending.end(s, hashes);
                self.pending.end_credits(s, hashes);
            }
        }
        for &h in hashes {
            if let Some(e) = self.entry_of(h)
                && let Some(seq) = self.seq_of(holder, e)
            {
                let touched_ms = self.lru_mut(holder).superseded(seq, 1);
                if let Some(t) = touched_ms {
                    self.note_evicted(holder, t);
                }
                self.drop_membership(holder, e);
            }
        }
        self.maybe_compact(holder, hashes.len());
    }

    /// Drops every block `holder` holds (each is current in exactly one queued run).
    fn clear_holder(&mut self, holder: Holder) {
        self.writes += 1;
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
            self.pending.clear(slot);
            // An emptied cache (an engine restarted or reset) gives up nothing yet.
            self.instances[slot as usize].evicted_touch_ms = None;
        }
    }

    /// Removes every block of the global tier.
    pub fn clear_global(&mut self) {
        self.clear_holder(Holder::Global);
    }

    /// Block counts for `stats()`.
    pub fn stats(&self) -> IndexStats {
        IndexStats {
            entries: self.by_hash.len(),
            local_blocks: self.instances.iter().map(|h| if h.live { h.held } else { 0 }).collect(),
            global_blocks: self.global_held,
            evictions: self.evictions + self.hosts.as_ref().map_or(0, |h| h.evictions()),
            pending_blocks: (0..self.instances.len() as u32)
                .map(|s| if self.is_live(s) { self.pending.len(s) } else { 0 })
                .collect(),
            answer_credits: (0..self.instances.len() as u32)
                .map(|s| {
                    if self.is_live(s) {
                        self.pending.credits_len(s)
                    } else {
                        0
                    }
                })
                .collect(),
            host_blocks: (0..self.instances.len() as u32)
                .map(|s| {
                    if self.is_live(s) {
                        self.hosts.as_ref().map_or(0, |h| h.held(s))
                    } else {
                        0
                    }
                })
                .collect(),
        }
    }

    /// Whether `holder` holds `hash` (for tests and introspection).
    pub fn holds(&self, holder: Holder, hash: BlockHash) -> bool {
        match holder {
            Holder::Instance(s) if !self.is_live(s) => false,
            _ => self
                .entry_of(hash)
                .is_some_and(|e| self.seq_locked(holder, e).is_some()),
        }
    }

    /// Heap bytes of the index by component, from the containers' capacities.
    pub fn memory_breakdown(&self) -> [(&'static str, usize); 8] {
        use std::mem::size_of;
        // hashbrown: one control byte per bucket plus the slot; buckets = capacity · 8/7.
        let table_bytes = |cap: usize, slot: usize| cap * 8 / 7 * (slot + 1);
        let seqs: usize = self
            .instances
            .iter()
            .map(|h| table_bytes(h.order.lock().seqs.capacity(), size_of::<(u32, u32)>()))
            .sum();
        let runs: usize = self
            .instances
            .iter()
            .map(|h| h.order.lock().lru.heap_bytes())
            .sum::<usize>()
            + self.global_lru.lock().heap_bytes();
        [
            ("hash_table", self.by_hash.heap_bytes()),
            (
                "entries",
                self.entries.capacity() * size_of::<Entry>() + self.free_entries.capacity() * size_of::<u32>(),
            ),
            ("holder_bits", self.more_bits.capacity() * 8),
            ("extra_holder_maps", seqs),
            ("lru_runs", runs),
            ("pending", self.pending.heap_bytes()),
            ("host_tiers", self.hosts.as_ref().map_or(0, |h| h.memory_bytes())),
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

/// `holder`'s LRU order and (an instance's) map, from the index's two holder fields under
/// `&mut` (split borrows: the caller keeps the entries and the table).
fn order_of<'a>(
    instances: &'a mut [InstanceHolder],
    global_lru: &'a mut Mutex<RunLru>,
    holder: Holder,
) -> (&'a mut RunLru, Option<&'a mut MixMap<u32, u32>>) {
    match holder {
        Holder::Instance(s) => {
            let order = instances[s as usize].order.get_mut();
            (&mut order.lru, Some(&mut order.seqs))
        }
        Holder::Global => (global_lru.get_mut(), None),
    }
}

/// The blocks through whose stored number [`front_run`] looks for the chain's previous touch to
/// relink: the middle one (past a prefix other sessions share, and within the previous turn's
/// part of a follow-up, whose new blocks are few), then the last (a chain sent again whole).
fn relink_anchors(ids: &[u32]) -> [Option<u32>; 2] {
    [ids.get(ids.len() / 2).copied(), ids.last().copied()]
}

/// Makes the resolved chain `ids` the newest blocks of the holder whose order is `lru`, at
/// `now_ms`; `mark(e, Some(seq))` records `seq` as entry `e`'s current number for the holder and
/// returns the number it stored before ([`NOT_HELD`] if the holder did not hold `e`, `seq`
/// itself if it already was); `mark(e, None)` only reads that number. Returns the ids written to the queue, the budget of the cleaning
/// that follows.
///
/// The chain's blocks become the holder's most recent ones, first block newest. When the
/// holder's newest run is a prefix of the chain and all its blocks are still current (the same
/// prompt routed again, a follow-up right after its previous turn), that order already holds:
/// the run is renewed, in O(its length) id comparisons and no entry access, and only the
/// blocks beyond it are marked. Otherwise the chain becomes a new run, each block once, at its
/// first position.
#[inline]
fn front_run(lru: &mut RunLru, ids: &[u32], now_ms: u64, mut mark: impl FnMut(u32, Option<u32>) -> u32) -> usize {
    let prefix_of_chain = |run: &[u32]| run.len() <= ids.len() && *run == ids[..run.len()];
    let renewable = lru.newest_current().is_some_and(prefix_of_chain);
    // Else a run whose ids (stale ones included, unless cleaned away) are a stretch of the
    // chain, found through the number an anchor block stores: the chain's previous touch, to
    // relink (see `relink_anchors`), and where the stretch starts in the chain.
    let relink = if renewable {
        None
    } else {
        // Looked up only here, off the renewal path (a route sent again, the most common touch).
        let anchors = relink_anchors(ids).map(|e| e.map_or(NOT_HELD, |e| mark(e, None)));
        anchors
            .into_iter()
            .filter(|&stored| stored != NOT_HELD)
            .find_map(|stored| {
                let run = lru.run_ids(stored)?;
                let at = ids.iter().position(|&e| e == run[0])?;
                (ids.get(at..at + run.len()) == Some(run)).then_some((stored, at))
            })
    };
    // Blocks moved from an older run are reported to it a stretch at a time: a chain's blocks
    // mostly come in long stretches from one run (its previous touch).
    let mut moved = Moved::default();
    // `kept`: `ids` are a relinked run's own, all queued in the run: those still current store
    // its number already (read, not written); the others (moved to another run since, e.g. a
    // prefix another session shares, or no longer held) take it again.
    let mut mark_all = |ids: &[u32], seq: u32, run: &mut Vec<u32>, kept: bool| {
        for &e in ids {
            let old = mark(e, Some(seq));
            if old != seq || kept {
                run.push(e);
            }
            if old != seq && old != NOT_HELD {
                moved.add(old);
            }
        }
    };
    let work = if renewable {
        lru.renew_newest(now_ms, |seq, run| {
            let kept = run.len();
            mark_all(&ids[kept..], seq, run, false);
        })
    } else if let Some((stored, at)) = relink {
        let added = lru.relink(stored, now_ms, |seq, kept, all_current| {
            if at == 0 && all_current {
                // The run begins the chain and is current whole: its ids stay as they are, and
                // no entry of it is even read.
                let mut run = kept;
                let end = run.len();
                mark_all(&ids[end..], seq, &mut run, false);
                return run;
            }
            let mut run = Vec::with_capacity(ids.len());
            mark_all(&ids[..at], seq, &mut run, false);
            mark_all(&kept, seq, &mut run, true);
            mark_all(&ids[at + kept.len()..], seq, &mut run, false);
            run
        });
        added + lru::RUN_WEIGHT
    } else {
        let seq = lru.next_seq();
        let mut run = Vec::with_capacity(ids.len());
        mark_all(ids, seq, &mut run, false);
        let written = run.len();
        lru.push(run, now_ms);
        written + lru::RUN_WEIGHT
    };
    moved.flush(lru);
    work
}

/// Keeps the queue `lru` of `holder` (which holds `held` blocks; `seqs` its map) bounded:
/// cleans up to `CLEAN_FACTOR · work` ids' worth of it (see [`lru`]; `work` is what the caller
/// added to the queue), or, in the rare case sequence numbers run high, renumbers it whole and
/// stores every current block's new number. Changes nobody's held blocks, so it also runs
/// under a shared borrow, the holder's mutexes held.
fn compact(
    lru: &mut RunLru,
    held: usize,
    work: usize,
    entries: &[Entry],
    holder: Holder,
    mut seqs: Option<&mut MixMap<u32, u32>>,
) {
    if !lru.needs_renumbering() {
        lru.clean(held, lru::CLEAN_FACTOR * work, |e, seq| {
            seq_in(entries, holder, seqs.as_deref(), e) == Some(seq)
        });
        return;
    }
    lru.renumber(|e, seq| seq_in(entries, holder, seqs.as_deref(), e) == Some(seq));
    for (seq, e) in lru.all() {
        remark_held(entries, holder, seqs.as_deref_mut(), e, seq);
    }
}

/// [`KvIndex::mark`] of a pair the holder already holds, under a shared borrow (the holder's
/// mutexes held: `seqs` is its map, locked): rewrites the holder's sequence number of `e`
/// and returns the one before. Plain loads and stores, not read-modify-writes: the holder's
/// mutex already makes this thread the only writer of these numbers (an atomic swap is a
/// locked instruction, ≈ 20 cycles a block).
#[inline]
fn remark_held(entries: &[Entry], holder: Holder, seqs: Option<&mut MixMap<u32, u32>>, e: u32, seq: u32) -> u32 {
    let entry = &entries[e as usize];
    let number = match holder {
        Holder::Instance(s) if u32::from(entry.inline_slot) == s => &entry.inline_seq,
        Holder::Instance(s) if u32::from(entry.second_slot) == s => &entry.second_seq,
        Holder::Instance(_) => {
            let number = seqs.and_then(|m| m.get_mut(&e));
            debug_assert!(number.is_some(), "a re-front of a block its holder does not hold");
            return number.map_or(seq, |number| std::mem::replace(number, seq));
        }
        Holder::Global => &entry.global_seq,
    };
    let old = number.load(Ordering::Relaxed);
    debug_assert!(old != NOT_HELD, "a re-front of a block its holder does not hold");
    if old != seq {
        number.store(seq, Ordering::Relaxed);
    }
    old
}

/// The older runs a touch moves blocks out of, counted a stretch at a time and reported to
/// the holder's LRU ([`lru::RunLru::superseded`]).
#[derive(Default)]
struct Moved {
    /// The run of the current stretch and its length.
    seq: u32,
    n: usize,
    /// Stretches completed, waiting for [`Moved::flush`].
    done: Vec<(u32, usize)>,
}

impl Moved {
    #[inline]
    fn add(&mut self, seq: u32) {
        if self.n > 0 && self.seq == seq {
            self.n += 1;
        } else {
            if self.n > 0 {
                self.done.push((self.seq, self.n));
            }
            (self.seq, self.n) = (seq, 1);
        }
    }

    fn flush(mut self, lru: &mut RunLru) {
        if self.n > 0 {
            self.done.push((self.seq, self.n));
        }
        for (seq, n) in self.done {
            lru.superseded(seq, n);
        }
    }
}

/// `holder`'s sequence number of entry `e` (`seqs`: the instance's map of the entries it
/// does not hold inline).
#[inline]
fn seq_in(entries: &[Entry], holder: Holder, seqs: Option<&MixMap<u32, u32>>, e: u32) -> Option<u32> {
    let entry = &entries[e as usize];
    match holder {
        Holder::Instance(s) if u32::from(entry.inline_slot) == s => Some(entry.inline_seq.load(Ordering::Relaxed)),
        Holder::Instance(s) if u32::from(entry.second_slot) == s => Some(entry.second_seq.load(Ordering::Relaxed)),
        Holder::Instance(_) => seqs.and_then(|m| m.get(&e).copied()),
        Holder::Global => Some(entry.global_seq.load(Ordering::Relaxed)).filter(|&seq| seq != NOT_HELD),
    }
}

/// Entry `e`, if it is live and holds the block hashed `h` (a guessed id, checked before use).
#[inline]
fn named(entries: &[Entry], e: u32, h: BlockHash) -> Option<&Entry> {
    match entries.get(e as usize) {
        Some(x) if x.hash == h && x.live() => Some(x),
        _ => None,
    }
}

/// [`KvIndex::entry_of`] out of line, on split borrows, for the slow path of a hot loop.
#[inline(never)]
fn lookup(by_hash: &BlockTable, entries: &[Entry], hash: BlockHash) -> Option<u32> {
    by_hash.find(table_hash(hash), |id| entries[id as usize].hash == hash)
}

/// Points `parent.last_child` at `child`, writing only when it changes (a renewed chain
/// leaves its entries' cache lines clean, and walks on other cores keep them shared).
#[inline]
fn set_child(parent: &Entry, child: u32) {
    if parent.last_child.load(Ordering::Relaxed) != child {
        parent.last_child.store(child, Ordering::Relaxed);
    }
}

/// Hash of a block hash for the entry table: block hashes from xxh3 are already uniform,
/// but trace ids are small sequential integers, hence the multiply-fold.
#[inline]
fn table_hash(hash: BlockHash) -> u64 {
    let m = hash.0.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    m ^ (m >> 29)
}
