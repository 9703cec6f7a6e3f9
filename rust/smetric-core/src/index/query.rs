//! The query walk of the KV$ index: for a request's chain, the longest prefix every instance and
//! the global tier hold, in one pass (see the module docs of `index` for the algorithm).
//!
//! In exact mode an instance's hit also counts the blocks the router sent it and its events
//! have not confirmed yet (docs §2.7, module `pending`): after the walk, each instance with sent
//! blocks extends its confirmed prefix while the next block is sent there or held there, then
//! by the answer credited past an anchor its match runs through (`credited`).
//!
//! The walk reads the index only ([`KvIndex::query_shared`] takes `&self`), so decisions walk
//! under a shared lock, several at once. What the decision's write that follows needs from it
//! (the entry ids found, the prefixes held) it keeps in a [`Walk`] owned by the caller, with
//! stamps of the index's write counters that say whether those still hold when the write
//! comes: ids while no entry has been freed since, held prefixes while no holder changed.
//! A TTL purge is a write: [`KvIndex::purge_due`] tells a shared reader when one is needed.
//!
//! Invariants: a query changes no holder's blocks (only `last_child` links along the chain,
//! relaxed atomics, hints checked before use).
//! Complexity: O(matched blocks · ⌈instances/64⌉), one cache line per step on a slab chain;
//! with sent blocks, one map lookup per instance that has any, plus one per sent block matched,
//! plus at most the instance's largest credit in lookups when it has answer credits.
//! [`KvIndex::purge_due`] is O(live instances) when a TTL is set, O(1) otherwise.

#[allow(clippy::wildcard_imports)]
use super::*;

/// What a query walk found that the decision's write reuses, kept by the caller so that the
/// walk can run under a shared lock (see the module docs).
#[derive(Debug, Default, Clone)]
pub(crate) struct Walk {
    /// Entry ids of the chain's blocks in chain order, up to the first block without an entry.
    pub(super) ids: Vec<u32>,
    /// [`KvIndex::frees`] at the walk: the ids name the chain's entries while it is unchanged.
    pub(super) frees: u64,
    /// [`KvIndex::writes`] at the walk: `confirmed` holds while it is unchanged.
    pub(super) writes: u64,
    /// Per slot, the prefix of the chain the instance held (kept while sent blocks are on).
    pub(super) confirmed: Vec<u32>,
}

impl Walk {
    /// Marks the ids as guesses only (a touch resolved them, or they are not of the chain
    /// about to be used), and the held prefixes as unknown.
    pub(super) fn untrust(&mut self) {
        self.frees = u64::MAX;
        self.writes = u64::MAX;
    }
}

impl KvIndex {
    /// Longest prefix hits of `chain` for every instance and the global tier (docs §2.4).
    /// Purges expired blocks first; changes no holder's blocks (only the `last_child` links
    /// along the chain, to where the walk found the entries).
    pub fn query(&mut self, chain: &[BlockHash], now_ms: u64, out: &mut IndexQuery) {
        // A purge with nothing due would evict nothing: it is skipped as the router skips it.
        if self.purge_due(now_ms) {
            self.purge_all_expired(now_ms);
        }
        let mut last = std::mem::take(&mut self.last);
        self.query_shared(chain, now_ms, out, &mut last);
        self.last = last;
    }

    /// [`KvIndex::query`] without the TTL purge, for a reader sharing the index: the caller
    /// has purged (no [`KvIndex::purge_due`] at `now_ms`). Fills `walk` for the write that
    /// follows ([`KvIndex::touch_walked`], [`KvIndex::send_walked`]).
    pub(crate) fn query_shared(&self, chain: &[BlockHash], now_ms: u64, out: &mut IndexQuery, walk: &mut Walk) {
        self.walk(chain, out, &mut walk.ids);
        walk.frees = self.frees;
        walk.writes = self.writes;
        walk.confirmed.clear();
        if self.pending.enabled() {
            // Kept for `send_walked`, which skips the prefix the instance holds.
            walk.confirmed.extend_from_slice(&out.local_blocks);
        }
        if !self.pending.is_empty() {
            self.count_pending(chain, now_ms, out, &walk.ids);
        }
        match &self.hosts {
            Some(hosts) => hosts.query(chain, now_ms, out),
            None => out.host_blocks.clear(),
        }
    }

    /// Docs §2.7, query: each instance's hit is the longest prefix of `chain` whose blocks it
    /// holds *or* was sent (and no event has confirmed or evicted yet); `deepest` and
    /// `branches` follow (a sent chain that continued past the deepest block is a branch).
    /// `walked`: the entry ids the walk just found.
    #[inline(never)]
    fn count_pending(&self, chain: &[BlockHash], now_ms: u64, out: &mut IndexQuery, walked: &[u32]) {
        let mut deepest = out.deepest_blocks;
        for s in 0..self.instances.len() as u32 {
            if !self.instances[s as usize].live || self.pending.slot_is_empty(s) {
                continue;
            }
            let mut k = out.local_blocks[s as usize] as usize;
            while k < chain.len() && (self.pending.counts(s, chain[k], now_ms) || self.held_at(walked, s, chain, k)) {
                k += 1;
            }
            let reach = self.pending.credit_reach(s) as usize;
            if reach > 0 {
                k = self.credited(s, chain, k, reach, now_ms);
            }
            out.local_blocks[s as usize] = k as u32;
            deepest = deepest.max(k as u32);
        }
        if deepest == 0 {
            return;
        }
        let last = chain[deepest as usize - 1];
        let children = if deepest == out.deepest_blocks {
            out.branches
        } else {
            self.entry_at(walked, chain, deepest as usize - 1)
                .map_or(0, |e| u32::from(self.entries[e as usize].children))
        };
        let sent_child = (0..self.instances.len() as u32)
            .any(|s| self.instances[s as usize].live && self.pending.has_child(s, last, now_ms));
        out.deepest_blocks = deepest;
        out.branches = children.max(u32::from(sent_child));
    }

    /// Docs §2.7, "The answer": instance `s` matches `chain[..k]` (held or sent); a finished
    /// request's answer credited there, anchored at some `chain[p]` with `p < k`, extends the
    /// match to `p + 1 + blocks` (at most the chain). The larger of the two counts: blocks
    /// already confirmed past the anchor are not counted twice. Anchors are visited by depth,
    /// deepest first, only at the depths some credit has; an anchor at depth `d` reaches at most
    /// `d + reach` (the slot's largest credit), so the visit stops once that is not past the best.
    fn credited(&self, s: u32, chain: &[BlockHash], k: usize, reach: usize, now_ms: u64) -> usize {
        let mut best = k;
        let lo = (k + 1).saturating_sub(reach).max(1);
        for d in self.pending.credit_depths(s, lo as u32, k as u32) {
            let d = d as usize;
            if best >= chain.len() || d + reach <= best {
                break;
            }
            if let Some(c) = self.pending.credit_at(s, chain[d - 1], now_ms) {
                best = best.max((d + c.blocks as usize).min(chain.len()));
            }
        }
        best
    }

    /// The entry of `chain[i]`, `walked` holding entry ids of `chain`'s blocks that are
    /// current (a walk with no entry freed since): from there when it reaches that far, else
    /// looked up.
    fn entry_at(&self, walked: &[u32], chain: &[BlockHash], i: usize) -> Option<u32> {
        match walked.get(i) {
            Some(&e) => Some(e),
            None => self.entry_of(chain[i]),
        }
    }

    /// Whether instance `s` holds `chain[i]` (confirmed by its events); `walked` as for
    /// [`KvIndex::entry_at`].
    fn held_at(&self, walked: &[u32], s: u32, chain: &[BlockHash], i: usize) -> bool {
        self.entry_at(walked, chain, i).is_some_and(|e| {
            let bit = 1u64 << (s % 64);
            let word = if s < 64 {
                self.entries[e as usize].held
            } else {
                self.more_bits[e as usize * (self.words - 1) + s as usize / 64 - 1]
            };
            word & bit != 0
        })
    }

    /// Exact mode's record of a decision (docs §2.7): the blocks of `chain` (the chain the last
    /// [`KvIndex::query`] walked, at the same `now_ms`) that `slot` does not hold count as
    /// present there until an event confirms or evicts them or the pending TTL passes. Does
    /// nothing unless [`KvIndex::enable_pending`] turned sent blocks on.
    #[cfg(test)]
    pub(crate) fn send_queried(&mut self, slot: u32, chain: &[BlockHash], now_ms: u64) {
        let last = std::mem::take(&mut self.last);
        self.send_walked(slot, chain, now_ms, &last);
        self.last = last;
    }

    /// Exact mode's record of a decision (docs §2.7, as `send_queried`) for the chain `walk`
    /// walked ([`KvIndex::query_shared`]), at the same `now_ms`, other writes possibly in
    /// between: the prefix the walk found `slot` holding is skipped while no holder changed
    /// since, and its ids are used while no entry was freed since. The caller guarantees that
    /// `chain` is the walk's chain.
    pub(crate) fn send_walked(&mut self, slot: u32, chain: &[BlockHash], now_ms: u64, walk: &Walk) {
        if !self.pending.enabled() || !self.is_live(slot) {
            return;
        }
        // The confirmed prefix the query found holds by definition: start after it.
        let start = if walk.writes == self.writes {
            walk.confirmed
                .get(slot as usize)
                .map_or(0, |&k| (k as usize).min(chain.len()))
        } else {
            0
        };
        let walked: &[u32] = if walk.frees == self.frees { &walk.ids } else { &[] };
        let mut pending = std::mem::take(&mut self.pending);
        pending.send(slot, &chain[start..], now_ms, |i| {
            self.held_at(walked, slot, chain, start + i)
        });
        self.pending = pending;
    }

    /// Whether [`KvIndex::send_walked`] would change nothing: sent blocks are off, or `slot`
    /// held the whole chain at the walk (no holder changed since) and has nothing sent or
    /// credited there (so there is nothing to record and nothing expired to purge). The
    /// router then skips the exclusive lock.
    pub(crate) fn send_is_noop(&self, slot: u32, chain: &[BlockHash], walk: &Walk) -> bool {
        !self.pending.enabled()
            || !self.is_live(slot)
            || (walk.writes == self.writes
                && walk
                    .confirmed
                    .get(slot as usize)
                    .is_some_and(|&k| k as usize >= chain.len())
                && self.pending.slot_is_empty(slot))
    }

    /// Whether a TTL purge at `now_ms` ([`KvIndex::purge_all_expired`]) would evict anything:
    /// some live instance's least recently used block is as old as the TTL. A shared reader
    /// asks this before [`KvIndex::query_shared`] and, when it is true, purges under the
    /// write lock first; when it is false the purge would evict nothing.
    pub(crate) fn purge_due(&self, now_ms: u64) -> bool {
        let Some(ttl) = self.limits.local_ttl_ms else {
            return false;
        };
        self.instances
            .iter()
            .filter(|h| h.live)
            .filter_map(|h| h.order.lock().lru.oldest_live_time())
            .any(|t| now_ms.saturating_sub(t) >= ttl)
    }

    /// TTL purge of every live instance, in slot order (docs §2.4 step 1).
    pub(crate) fn purge_all_expired(&mut self, now_ms: u64) {
        if self.limits.local_ttl_ms.is_some() {
            self.writes += 1;
            for s in 0..self.instances.len() as u32 {
                if self.instances[s as usize].live {
                    self.purge_expired(s, now_ms);
                }
            }
        }
    }

    /// The query walk over `chain`. Fills `out`, and `walked` with the entry ids found, in
    /// chain order.
    ///
    /// [`KvIndex::follow`] finds the entries and, with at most 64 instance slots, reads the
    /// holders off each entry as it goes; with more, [`KvIndex::tally`] does so in a second
    /// pass.
    #[inline(never)]
    fn walk(&self, chain: &[BlockHash], out: &mut IndexQuery, walked: &mut Vec<u32>) {
        walked.clear();
        out.local_blocks.clear();
        out.local_blocks.resize(self.instances.len(), 0);
        out.global_blocks = 0;
        if self.words == 1 {
            let tally = self.follow::<true>(chain, walked, &mut out.local_blocks);
            tally.finish(&self.entries, walked, out);
        } else {
            self.follow::<false>(chain, walked, &mut out.local_blocks);
            self.tally(walked, out);
        }
    }

    /// Appends to `walked` the entry ids of the chain's blocks up to the first block without
    /// an entry (no holder can match past it). Each step tries the slab slot after the
    /// previous entry's, then that entry's `last_child`, then the hash table.
    ///
    /// With `TALLY`, the returned [`Tally`] holds the query's answer for slots 0–63 and the
    /// global tier (the hits of instances that stopped matching already in `local_blocks`).
    /// The walk runs in two phases: while some holder still matches, each step also tallies;
    /// after the last holder dropped out, the rest of the chain's entries are only found
    /// (for the insert that follows). Two loops instead of one with a "still matching" flag
    /// keep the tally's state in registers in the first and leave none in the second.
    #[inline]
    fn follow<const TALLY: bool>(&self, chain: &[BlockHash], walked: &mut Vec<u32>, local_blocks: &mut [u32]) -> Tally {
        let mut tally = Tally::new(self.live_mask[0], self.global_enabled());
        let (entries, by_hash) = (self.entries.as_slice(), &self.by_hash);
        // Sized up front and written in place, cut to the blocks found at the end.
        walked.resize(chain.len(), 0);
        let mut i = 0;
        let mut prev = NOT_HELD;
        if TALLY && tally.matching {
            // The tally's state in locals: `depth` is `i` while some holder matches.
            let (mut first, mut global_active, mut global_blocks) = (tally.first, tally.global_active, 0);
            let mut depth = None;
            while i < chain.len() {
                let Some((e, entry)) = step(entries, by_hash, prev, chain[i]) else {
                    break;
                };
                walked[i] = e;
                prev = e;
                let keep = first & entry.held;
                let global = global_active && entry.in_global();
                // Most steps change nothing (every holder still matching holds this block
                // too): one test, and the tally's bookkeeping only on a change.
                if keep != first || global != global_active {
                    if keep == 0 && !global {
                        depth = Some(i as u32);
                        i += 1;
                        break;
                    }
                    record_hits(local_blocks, 0, first & !keep, i as u32);
                    if global_active && !global {
                        global_active = false;
                        global_blocks = i as u32;
                    }
                    first = keep;
                }
                i += 1;
            }
            tally = Tally {
                first,
                global_active,
                matching: depth.is_none(),
                depth: depth.unwrap_or(i as u32),
                global_blocks,
            };
            if depth.is_none() && i < chain.len() {
                // The walk stopped at a block without an entry.
                walked.truncate(i);
                return tally;
            }
        }
        while i < chain.len() {
            let Some((e, _)) = step(entries, by_hash, prev, chain[i]) else {
                break;
            };
            walked[i] = e;
            prev = e;
            i += 1;
        }
        walked.truncate(i);
        tally
    }

    /// The query's answer (docs §2.4 steps 2–3) from the entry ids of the chain's prefix.
    fn tally(&self, walked: &[u32], out: &mut IndexQuery) {
        // Slots 0–63 stay in a register; higher slots (rare) take the general loop.
        let mut first = self.live_mask[0];
        let more = &self.live_mask[1..];
        let mut global_active = self.global_enabled();
        let mut depth = 0;
        if more.iter().all(|&w| w == 0) {
            for &e in walked {
                let entry = &self.entries[e as usize];
                let keep = first & entry.held;
                if !(keep != 0 || global_active && entry.in_global()) {
                    break;
                }
                record_hits(&mut out.local_blocks, 0, first & !keep, depth);
                first = keep;
                if global_active && !entry.in_global() {
                    global_active = false;
                    out.global_blocks = depth;
                }
                depth += 1;
            }
        } else {
            let extra = more.len();
            let mut active = more.to_vec();
            for &e in walked {
                let entry = &self.entries[e as usize];
                let bits = &self.more_bits[e as usize * extra..(e as usize + 1) * extra];
                let keep = first & entry.held;
                let any = keep != 0 || active.iter().zip(bits).any(|(&a, &b)| a & b != 0);
                if !(any || global_active && entry.in_global()) {
                    break;
                }
                record_hits(&mut out.local_blocks, 0, first & !keep, depth);
                first = keep;
                for (w, (a, &held)) in active.iter_mut().zip(bits).enumerate() {
                    record_hits(&mut out.local_blocks, w + 1, *a & !held, depth);
                    *a &= held;
                }
                if global_active && !entry.in_global() {
                    global_active = false;
                    out.global_blocks = depth;
                }
                depth += 1;
            }
            for (w, &a) in active.iter().enumerate() {
                record_hits(&mut out.local_blocks, w + 1, a, depth);
            }
        }
        // Holders still matching after the last block walked matched `depth` blocks: the
        // deepest match.
        record_hits(&mut out.local_blocks, 0, first, depth);
        if global_active {
            out.global_blocks = depth;
        }
        out.deepest_blocks = depth;
        out.branches = match depth {
            0 => 0,
            d => u32::from(self.entries[walked[d as usize - 1] as usize].children),
        };
    }
}

/// The query's answer (docs §2.4 steps 2–3) as a walk goes down a chain, for instance slots
/// 0–63 and the global tier.
struct Tally {
    /// Instances still matching.
    first: u64,
    global_active: bool,
    /// Some holder matched every block so far.
    matching: bool,
    /// Blocks matched so far (by some holder).
    depth: u32,
    global_blocks: u32,
}

impl Tally {
    fn new(live: u64, global_enabled: bool) -> Self {
        Self {
            first: live,
            global_active: global_enabled,
            matching: live != 0 || global_enabled,
            depth: 0,
            global_blocks: 0,
        }
    }

    /// Holders still matching matched `depth` blocks, the deepest match.
    fn finish(self, entries: &[Entry], walked: &[u32], out: &mut IndexQuery) {
        record_hits(&mut out.local_blocks, 0, self.first, self.depth);
        out.global_blocks = if self.global_active {
            self.depth
        } else {
            self.global_blocks
        };
        out.deepest_blocks = self.depth;
        out.branches = match self.depth {
            0 => 0,
            d => u32::from(entries[walked[d as usize - 1] as usize].children),
        };
    }
}

/// One step of the walk: the entry of the block hashed `h` that follows entry `prev`
/// ([`NOT_HELD`] before the first block) and a reference to it, or `None` when no holder has
/// it.
///
/// A chain's entries are often consecutive slab slots (created together, or reusing slots
/// freed tail first): the slot after `prev` is tried first, inline, needing no load to find it,
/// so consecutive steps overlap instead of waiting for each other's `last_child`. That path
/// leaves `prev`'s `last_child` alone: the hint is read only when the next slot fails, and a
/// hint naming the next slot would fail with it. Every other step takes [`step_off_slab`].
#[inline]
fn step<'e>(entries: &'e [Entry], by_hash: &BlockTable, prev: u32, h: BlockHash) -> Option<(u32, &'e Entry)> {
    let next = prev.wrapping_add(1);
    match named(entries, next, h) {
        Some(x) => Some((next, x)),
        None => step_off_slab(entries, by_hash, prev, h),
    }
}

/// [`step`] when the next slab slot is not the block: `prev`'s `last_child`, then the hash
/// table; keeps `prev`'s `last_child` pointing at the entry found, for the next walk. Out of
/// line so that the slab path's loop keeps its state in registers.
#[cold]
#[inline(never)]
fn step_off_slab<'e>(entries: &'e [Entry], by_hash: &BlockTable, prev: u32, h: BlockHash) -> Option<(u32, &'e Entry)> {
    let parent = entries.get(prev as usize);
    let child = parent.map_or(NOT_HELD, |p| p.last_child.load(Ordering::Relaxed));
    let e = match named(entries, child, h) {
        Some(_) => child,
        None => lookup(by_hash, entries, h)?,
    };
    if let Some(p) = parent {
        set_child(p, e);
    }
    Some((e, &entries[e as usize]))
}

/// Sets `local_blocks[slot] = depth` for every slot whose bit is set in `mask`, bitset word `word`.
#[inline]
fn record_hits(local_blocks: &mut [u32], word: usize, mut mask: u64, depth: u32) {
    while mask != 0 {
        local_blocks[word * 64 + mask.trailing_zeros() as usize] = depth;
        mask &= mask - 1;
    }
}
