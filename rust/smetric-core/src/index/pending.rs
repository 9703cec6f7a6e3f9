//! Sent, not yet confirmed: the blocks an exact (event-fed) index counts as present on an
//! instance because the router has just sent it a prompt holding them, before the engine's KV
//! events say so (docs/routing-semantics.md §2.7).
//!
//! Why: vLLM publishes KV events after the fact (measured on CPU vLLM: p50 1.9 ms, p90 32 ms,
//! p99 243 ms). A follow-up sent as soon as its predecessor answered is routed before the
//! predecessor's blocks are in the event-fed index; without this set its home showed a 0 hit,
//! it was decided "migrate (local KV$ evicted)" and left its cache behind.
//!
//! Learnt from Dynamo (read, not copied): its KV router keeps, next to the event-fed radix tree,
//! a short-TTL *approximate* tree written on every routing decision ("predict on route") and
//! scores each worker with the larger of the two overlaps; its approximate indexer expires each
//! (block, worker) after a fixed TTL with a lazily cleaned timer queue, and prunes the tree to a
//! size bound. Dynamo needs two trees because an engine's event hashes are salted digests the
//! router cannot recompute; smetric's ingestor maps every event back onto smetric's own chain
//! hashes (through the published token ids), so one key space serves both and an event can
//! *confirm* a sent block by hash. Taken: the fixed TTL, a lazily cleaned timer queue (here a
//! FIFO: with one TTL, send order is deadline order, so no heap is needed), a size bound. Changed: the hit is the longest prefix of the *union* of
//! confirmed and sent blocks (a per-block union, not the larger of two overlaps, so a chain
//! half confirmed, half sent counts whole), a confirming or evicting event ends a sent block
//! at once (not only its TTL), and the bound is per instance.
//!
//! Algorithm: per instance, a map block hash → ([`Mark`]: send stamp, deadline, whether a sent
//! chain continued past it) and a FIFO of (stamp, hash) in send order, a chain sent tail to
//! head; a re-sent block gets a fresh stamp at the back and its old FIFO item goes stale (the
//! stamps differ), as does a confirmed or evicted block's. Expiry and the memory bound pop from
//! the front, skipping stale items; the FIFO is compacted when stale items outnumber live ones,
//! so its cost stays amortised O(1) per sent block. Least recently sent first, the head of a
//! chain last: a shared prefix re-sent by every turn is the last thing the bound drops.
//!
//! The answer (docs §2.7 "The answer"): vLLM also caches a finished request's answer, the full
//! blocks of its first `n + output − 1` tokens past the prompt's; the router knows their number
//! (`on_finished`'s `output_tokens`) but not their ids. Per instance, a second map *anchor* (the
//! request's last full prompt block) → [`Credit`] (answer blocks, deadline, stamp), with its own
//! FIFO in credit order: a query whose match on the instance runs through an anchor counts up to
//! that many more of its own blocks (the larger of that and its match, never the sum). A store
//! event under the anchor confirms the credit's first blocks: the credit moves to the run's
//! last block with the rest, or ends when none is left; an event evicting the anchor ends it
//! (vLLM frees a chain tail first, so the answer went before). Why not end it at the first
//! store under the anchor, as a cursor-free design would: the answer's first blocks are stored
//! while it still decodes, often before `on_finished`, and its last ones are the events that
//! lag. Same TTL as sent blocks; at most `capacity` credited blocks per instance, the least
//! recently credited dropped first. Assumes the follow-up repeats the answer token for token;
//! a re-rendered answer over-predicts by at most the credit, for at most the TTL.
//!
//! Invariants: a sent block counts on its instance iff it is in the map and `now < deadline`
//! (a purge is only memory hygiene: lookups check the deadline themselves); every map key has
//! exactly one current FIFO item (same stamp); an instance never has more than `capacity` sent
//! blocks after a call returns; the FIFO holds at most `2·len + COMPACT_SLACK` items after one.
//! The same holds for credits (one current FIFO item each, `Σ blocks <= capacity` after
//! `credit`, which a confirmation only lowers); `credit_reach` is at least every live credit's
//! `blocks`. Memory is therefore O(instances · capacity).
//!
//! Complexity: `send` O(chain blocks not held) amortised; `counts` O(1); `confirm` O(1) per
//! block; purge and bound O(1) amortised per sent block. `credit` O(1) amortised; a store
//! event O(run) credit lookups (only when the instance has credits); a query `credit_reach`
//! lookups per instance with credits.

use std::collections::{BTreeMap, VecDeque};

use crate::ids::BlockHash;
use crate::mix_map::MixMap;

/// Stale FIFO items tolerated beyond the live ones before a compaction.
const COMPACT_SLACK: usize = 64;

/// What the index knows about one sent block.
#[derive(Clone, Copy, Debug)]
struct Mark {
    /// Send order on its instance: the FIFO item with this stamp is the current one.
    stamp: u64,
    /// The block stops counting at this time (ms).
    deadline_ms: u64,
    /// Some chain sent to this instance continued past this block (turn inference: a match
    /// ending here ends where another request branched off, docs §4).
    has_child: bool,
}

/// A finished request's answer, credited on its instance (docs §2.7, "The answer").
#[derive(Clone, Copy, Debug)]
pub(crate) struct Credit {
    /// Full blocks of the answer past the anchor (the request's last full prompt block).
    pub(crate) blocks: u32,
    /// The anchor's depth: blocks of the chain up to and including it (a chain hash fixes its
    /// position, so a query looks for the anchor at `chain[depth − 1]` only).
    depth: u32,
    /// The credit stops counting at this time (ms).
    deadline_ms: u64,
    /// Finish order on its instance: the credit FIFO item with this stamp is the current one.
    stamp: u64,
}

#[derive(Debug)]
struct SlotPending {
    marks: MixMap<u64, Mark>,
    fifo: VecDeque<(u64, u64)>,
    next_stamp: u64,
    /// Answer credits by anchor hash, and their FIFO of (stamp, anchor) in finish order.
    credits: MixMap<u64, Credit>,
    credit_fifo: VecDeque<(u64, u64)>,
    /// Σ `blocks` of the credits in the map (expired ones included until purged).
    credit_blocks: usize,
    /// The largest `blocks` of any credit since the map was last empty: how far back from
    /// its match end a query looks for an anchor.
    credit_reach: u32,
    /// Credits per anchor depth, so that a query visits only the depths its match covers.
    depths: BTreeMap<u32, u32>,
    /// The smallest key of `depths` (`u32::MAX` when empty): a match shallower than every
    /// anchor is rejected without a lookup.
    min_depth: u32,
}

impl SlotPending {
    fn is_current(&self, stamp: u64, hash: u64) -> bool {
        self.marks.get(&hash).is_some_and(|m| m.stamp == stamp)
    }

    /// Drops the oldest sent block (skipping stale FIFO items); false when none is left.
    fn pop_oldest(&mut self) -> bool {
        while let Some((stamp, hash)) = self.fifo.pop_front() {
            if self.is_current(stamp, hash) {
                self.marks.remove(&hash);
                return true;
            }
        }
        false
    }

    /// Drops, least recently sent first, the sent blocks whose deadline has passed, up to the
    /// first that has not (send order is deadline order while the clock does not go back;
    /// lookups check deadlines themselves, this only frees memory).
    fn purge(&mut self, now_ms: u64) {
        while let Some(&(stamp, hash)) = self.fifo.front() {
            match self.marks.get(&hash) {
                Some(m) if m.stamp == stamp && m.deadline_ms > now_ms => break,
                Some(m) if m.stamp == stamp => {
                    self.marks.remove(&hash);
                }
                _ => {}
            }
            self.fifo.pop_front();
        }
    }

    fn compact(&mut self) {
        if self.fifo.len() > 2 * self.marks.len() + COMPACT_SLACK {
            let marks = &self.marks;
            self.fifo
                .retain(|&(stamp, hash)| marks.get(&hash).is_some_and(|m| m.stamp == stamp));
        }
        if self.credit_fifo.len() > 2 * self.credits.len() + COMPACT_SLACK {
            let credits = &self.credits;
            self.credit_fifo
                .retain(|&(stamp, hash)| credits.get(&hash).is_some_and(|c| c.stamp == stamp));
        }
    }

    /// Drops the credit anchored at `anchor`, if any (its FIFO item goes stale).
    fn drop_credit(&mut self, anchor: u64) {
        if let Some(c) = self.credits.remove(&anchor) {
            self.credit_blocks -= c.blocks as usize;
            if self.credits.is_empty() {
                self.credit_reach = 0;
            }
            if let Some(n) = self.depths.get_mut(&c.depth) {
                *n -= 1;
                if *n == 0 {
                    self.depths.remove(&c.depth);
                    if c.depth == self.min_depth {
                        self.min_depth = self.depths.keys().next().copied().unwrap_or(u32::MAX);
                    }
                }
            }
        }
    }

    /// Inserts `c` at `anchor` (no credit there) as the most recently credited.
    fn insert_credit(&mut self, anchor: u64, c: Credit) {
        let stamp = self.next_stamp;
        self.next_stamp += 1;
        self.credits.insert(anchor, Credit { stamp, ..c });
        self.credit_fifo.push_back((stamp, anchor));
        self.credit_blocks += c.blocks as usize;
        self.credit_reach = self.credit_reach.max(c.blocks);
        *self.depths.entry(c.depth).or_insert(0) += 1;
        self.min_depth = self.min_depth.min(c.depth);
    }

    /// Drops, least recently finished first, the credits whose deadline has passed, up to
    /// the first that has not (memory hygiene: lookups check deadlines themselves).
    fn purge_credits(&mut self, now_ms: u64) {
        while let Some(&(stamp, anchor)) = self.credit_fifo.front() {
            match self.credits.get(&anchor) {
                Some(c) if c.stamp == stamp && c.deadline_ms > now_ms => break,
                Some(c) if c.stamp == stamp => self.drop_credit(anchor),
                _ => {}
            }
            self.credit_fifo.pop_front();
        }
    }

    /// Drops the least recently finished credit; false when none is left.
    fn pop_oldest_credit(&mut self) -> bool {
        while let Some((stamp, anchor)) = self.credit_fifo.pop_front() {
            if self.credits.get(&anchor).is_some_and(|c| c.stamp == stamp) {
                self.drop_credit(anchor);
                return true;
            }
        }
        false
    }

    fn is_empty(&self) -> bool {
        self.marks.is_empty() && self.credits.is_empty()
    }
}

impl Default for SlotPending {
    fn default() -> Self {
        Self {
            marks: MixMap::default(),
            fifo: VecDeque::new(),
            next_stamp: 0,
            credits: MixMap::default(),
            credit_fifo: VecDeque::new(),
            credit_blocks: 0,
            credit_reach: 0,
            depths: BTreeMap::new(),
            min_depth: u32::MAX,
        }
    }
}

/// The sent-not-confirmed blocks of every instance slot. Disabled (and free) when its TTL is 0.
#[derive(Debug, Default)]
pub(crate) struct PendingBlocks {
    ttl_ms: u64,
    capacity: usize,
    slots: Vec<SlotPending>,
    /// Sent blocks and answer credits over all slots (expired ones included until purged):
    /// lets a query skip this set entirely when it is empty.
    total: usize,
    /// Whether finished requests' answers are credited (`exact_answer_credit`).
    answers: bool,
}

impl PendingBlocks {
    /// Sent blocks count for `ttl_ms` (0 disables the set), at most `capacity` per instance.
    /// With `answers`, a finished request's answer is credited too ([`PendingBlocks::credit`]).
    pub(crate) fn new(ttl_ms: u64, capacity: usize, answers: bool) -> Self {
        Self {
            ttl_ms,
            capacity,
            slots: Vec::new(),
            total: 0,
            answers,
        }
    }

    pub(crate) fn enabled(&self) -> bool {
        self.ttl_ms > 0
    }

    /// Whether no instance has a sent block (expired ones not yet purged count).
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// Whether `slot` has a sent block (expired ones not yet purged count).
    #[inline]
    pub(crate) fn slot_is_empty(&self, slot: u32) -> bool {
        self.slots.get(slot as usize).is_none_or(SlotPending::is_empty)
    }

    /// Records that `chain` (the tail of a chain: its last block ends the sent prompt) was sent
    /// to `slot` at `now_ms`: every block for which `held(i)` is false (the instance does not
    /// hold `chain[i]` yet) counts on `slot` until `now_ms + ttl` and becomes the most recently
    /// sent, the chain's head last. Then the least recently sent blocks go while the slot has
    /// more than `capacity`.
    pub(crate) fn send(&mut self, slot: u32, chain: &[BlockHash], now_ms: u64, mut held: impl FnMut(usize) -> bool) {
        if !self.enabled() {
            return;
        }
        let s = slot as usize;
        if self.slots.len() <= s {
            self.slots.resize_with(s + 1, SlotPending::default);
        }
        let p = &mut self.slots[s];
        let before = p.marks.len();
        p.purge(now_ms);
        let deadline_ms = now_ms.saturating_add(self.ttl_ms);
        let last = chain.len().saturating_sub(1);
        // Tail to head, as the index touches a chain (docs §2.2): the head ends up the most
        // recently sent, so the memory bound drops a chain's tail before its head.
        for (i, h) in chain.iter().enumerate().rev() {
            if held(i) {
                continue;
            }
            let stamp = p.next_stamp;
            p.next_stamp += 1;
            let has_child = i < last;
            match p.marks.entry(h.0) {
                // Sent again: the old FIFO item goes stale (its stamp is no longer the mark's).
                std::collections::hash_map::Entry::Occupied(mut m) => {
                    let m = m.get_mut();
                    *m = Mark {
                        stamp,
                        deadline_ms,
                        has_child: m.has_child || has_child,
                    };
                }
                std::collections::hash_map::Entry::Vacant(v) => {
                    v.insert(Mark {
                        stamp,
                        deadline_ms,
                        has_child,
                    });
                }
            }
            p.fifo.push_back((stamp, h.0));
        }
        while p.marks.len() > self.capacity {
            if !p.pop_oldest() {
                break;
            }
        }
        p.compact();
        self.total = self.total - before + p.marks.len();
    }

    /// Whether `hash` counts as present on `slot` at `now_ms`.
    #[inline]
    pub(crate) fn counts(&self, slot: u32, hash: BlockHash, now_ms: u64) -> bool {
        self.mark(slot, hash, now_ms).is_some()
    }

    /// Whether `hash` counts on `slot` at `now_ms` and a chain sent there continued past it.
    pub(crate) fn has_child(&self, slot: u32, hash: BlockHash, now_ms: u64) -> bool {
        self.mark(slot, hash, now_ms).is_some_and(|m| m.has_child)
    }

    fn mark(&self, slot: u32, hash: BlockHash, now_ms: u64) -> Option<&Mark> {
        self.slots
            .get(slot as usize)?
            .marks
            .get(&hash.0)
            .filter(|m| now_ms < m.deadline_ms)
    }

    /// Ends the listed blocks on `slot`: an event confirmed them (they are now in the index
    /// proper) or evicted them. Their FIFO items go stale.
    pub(crate) fn end(&mut self, slot: u32, hashes: &[BlockHash]) {
        let Some(p) = self.slots.get_mut(slot as usize) else {
            return;
        };
        if p.marks.is_empty() {
            return;
        }
        let before = p.marks.len();
        for h in hashes {
            p.marks.remove(&h.0);
        }
        p.compact();
        self.total -= before - p.marks.len();
    }

    /// Forgets every sent block of `slot` (the instance was cleared or removed).
    pub(crate) fn clear(&mut self, slot: u32) {
        if let Some(p) = self.slots.get_mut(slot as usize) {
            self.total -= p.marks.len() + p.credits.len();
            *p = SlotPending::default();
        }
    }

    /// Whether answers are credited (the set is on and `exact_answer_credit` is set).
    pub(crate) fn credits_answers(&self) -> bool {
        self.enabled() && self.answers
    }

    /// Credits, on `slot` at `now_ms`, the `blocks` full blocks of a finished request's answer
    /// past `anchor` (its last full prompt block): a chain matched there through `anchor`
    /// counts up to `blocks` more of its own blocks, until `now_ms + ttl`, an event evicts
    /// `anchor` ([`PendingBlocks::end_credits`]), or the instance's events confirm as much
    /// ([`PendingBlocks::confirm_credit`]). A credit for the same anchor is replaced. Then the
    /// least recently finished credits go while their blocks exceed `capacity`.
    /// `depth`: the anchor's position in its chain, plus one (the request's chain length).
    pub(crate) fn credit(&mut self, slot: u32, anchor: BlockHash, depth: u32, blocks: u32, now_ms: u64) {
        if !self.credits_answers() || blocks == 0 {
            return;
        }
        let s = slot as usize;
        if self.slots.len() <= s {
            self.slots.resize_with(s + 1, SlotPending::default);
        }
        let p = &mut self.slots[s];
        let before = p.credits.len();
        p.purge_credits(now_ms);
        p.drop_credit(anchor.0);
        let credit = Credit {
            blocks,
            depth,
            deadline_ms: now_ms.saturating_add(self.ttl_ms),
            stamp: 0,
        };
        p.insert_credit(anchor.0, credit);
        while p.credit_blocks > self.capacity {
            if !p.pop_oldest_credit() {
                break;
            }
        }
        p.compact();
        self.total = self.total - before + p.credits.len();
    }

    /// The unexpired credit anchored at `anchor` on `slot`.
    #[inline]
    pub(crate) fn credit_at(&self, slot: u32, anchor: BlockHash, now_ms: u64) -> Option<Credit> {
        self.slots
            .get(slot as usize)?
            .credits
            .get(&anchor.0)
            .filter(|c| now_ms < c.deadline_ms)
            .copied()
    }

    /// How far back from a match end a query looks for an anchor on `slot` (0: no credit).
    #[inline]
    pub(crate) fn credit_reach(&self, slot: u32) -> u32 {
        self.slots.get(slot as usize).map_or(0, |p| p.credit_reach)
    }

    /// The anchor depths of `slot`'s credits within `lo..=hi`, deepest first (none when `hi`
    /// is below every anchor: O(1)).
    #[inline]
    pub(crate) fn credit_depths(&self, slot: u32, lo: u32, hi: u32) -> impl Iterator<Item = u32> + '_ {
        self.slots
            .get(slot as usize)
            .filter(|p| p.min_depth <= hi && lo <= hi)
            .into_iter()
            .flat_map(move |p| p.depths.range(lo..=hi).rev().map(|(&d, _)| d))
    }

    /// Ends the credits anchored at any of `hashes` on `slot`: an event evicted the anchor,
    /// and vLLM frees a chain tail first, so the answer past it is gone too.
    pub(crate) fn end_credits(&mut self, slot: u32, hashes: &[BlockHash]) {
        let Some(p) = self.slots.get_mut(slot as usize) else {
            return;
        };
        if p.credits.is_empty() {
            return;
        }
        let before = p.credits.len();
        for h in hashes {
            p.drop_credit(h.0);
        }
        p.compact();
        self.total -= before - p.credits.len();
    }

    /// A store event on `slot`: `run` continuing `parent`. A credit anchored at `parent` or
    /// at a block of `run` (not its last) sees its first blocks confirmed: it ends when the
    /// run covers it whole, else it moves to the run's last block with the blocks still
    /// unconfirmed (same deadline), so the next event of the same answer continues it.
    pub(crate) fn confirm_credits(&mut self, slot: u32, run: &[BlockHash], parent: Option<BlockHash>) {
        let Some(p) = self.slots.get_mut(slot as usize) else {
            return;
        };
        if p.credits.is_empty() || run.is_empty() {
            return;
        }
        let before = p.credits.len();
        let last = run.len() - 1;
        // (anchor, blocks of the run after it)
        let anchors = parent
            .map(|h| (h, run.len()))
            .into_iter()
            .chain(run[..last].iter().enumerate().map(|(i, &h)| (h, last - i)));
        let mut moved: Option<Credit> = None;
        for (anchor, after) in anchors {
            let Some(c) = p.credits.get(&anchor.0).copied() else {
                continue;
            };
            p.drop_credit(anchor.0);
            if (c.blocks as usize) > after {
                let rest = Credit {
                    blocks: c.blocks - after as u32,
                    depth: c.depth + after as u32,
                    ..c
                };
                // Two credits along one run (an older turn's answer, then this one's) reach
                // past its end: the one reaching further stands.
                moved = Some(moved.map_or(rest, |m| if m.blocks >= rest.blocks { m } else { rest }));
            }
        }
        if let Some(c) = moved {
            let anchor = run[last].0;
            p.drop_credit(anchor);
            p.insert_credit(anchor, c);
        }
        p.compact();
        self.total = self.total - before + p.credits.len();
    }

    /// Answer credits of `slot` (expired ones not yet purged count).
    pub(crate) fn credits_len(&self, slot: u32) -> usize {
        self.slots.get(slot as usize).map_or(0, |p| p.credits.len())
    }

    /// Sent blocks of `slot` (expired ones not yet purged count).
    pub(crate) fn len(&self, slot: u32) -> usize {
        self.slots.get(slot as usize).map_or(0, |p| p.marks.len())
    }

    /// Heap bytes of the maps and FIFOs, from their capacities.
    pub(crate) fn heap_bytes(&self) -> usize {
        use std::mem::size_of;
        self.slots
            .iter()
            .map(|p| {
                p.marks.capacity() * 8 / 7 * (size_of::<(u64, Mark)>() + 1)
                    + p.fifo.capacity() * size_of::<(u64, u64)>()
                    + p.credits.capacity() * 8 / 7 * (size_of::<(u64, Credit)>() + 1)
                    + p.credit_fifo.capacity() * size_of::<(u64, u64)>()
            })
            .sum::<usize>()
            + self.slots.capacity() * size_of::<SlotPending>()
    }
}

#[cfg(test)]
impl PendingBlocks {
    /// FIFO items of `slot`, stale ones included (for the memory-bound tests).
    pub(crate) fn queued(&self, slot: u32) -> usize {
        self.slots.get(slot as usize).map_or(0, |p| p.fifo.len())
    }

    /// Σ blocks of `slot`'s credits (for the memory-bound tests).
    pub(crate) fn credit_blocks(&self, slot: u32) -> usize {
        self.slots.get(slot as usize).map_or(0, |p| p.credit_blocks)
    }

    /// Credit FIFO items of `slot`, stale ones included (for the memory-bound tests).
    pub(crate) fn credits_queued(&self, slot: u32) -> usize {
        self.slots.get(slot as usize).map_or(0, |p| p.credit_fifo.len())
    }
}
