//! A lazy, run-length LRU order for one holder of the KV$ index.
//!
//! Algorithm: a touch of a chain appends one *run* — the chain's entry ids in chain order,
//! a sequence number and the time — and every entry records that sequence number as its
//! current one for this holder. A block is current in exactly the run whose number it
//! stores; copies of it in older runs are stale and skipped. The least recently used block
//! is the last current id of the oldest run: within a run the chain's tail is older than
//! its head (vLLM frees blocks tail first), and runs are in touch order.
//!
//! Touching a 2,000-block chain therefore costs one sequential id copy and one entry write
//! per block, with no list relinking and no per-block queue item.
//!
//! Invariants: every held (entry, holder) pair is current in exactly one run; runs are in
//! non-decreasing time order; ids queued (stale included) stay below `8·held + COMPACT_SLACK`,
//! and sequence numbers below `u32::MAX / 2`, by compaction (stale ids dropped, runs
//! renumbered from 0), which bounds memory.
//!
//! Complexity: a touch O(run); an LRU pop amortised O(1); compaction O(queued ids), at most
//! once per `7·held + COMPACT_SLACK` touched blocks: amortised O(1) per block.

use std::collections::VecDeque;

/// Stale ids tolerated beyond `7·held` before compaction.
pub(crate) const COMPACT_SLACK: usize = 4096;

/// Renumbering is forced before sequence numbers get this large.
const SEQ_LIMIT: u32 = u32::MAX / 2;

#[derive(Debug)]
struct Run {
    seq: u32,
    time_ms: u64,
    /// Entry ids in chain order; the LRU end is the back.
    ids: Vec<u32>,
}

/// Touch order of one holder.
#[derive(Debug, Default)]
pub(crate) struct RunLru {
    runs: VecDeque<Run>,
    next_seq: u32,
    queued: usize,
}

impl RunLru {
    /// The sequence number the next run will carry; entries touched by it store this number.
    #[inline]
    pub(crate) fn next_seq(&self) -> u32 {
        self.next_seq
    }

    /// Appends a run (its ids must already store `next_seq()` as their current number).
    pub(crate) fn push(&mut self, ids: Vec<u32>, time_ms: u64) {
        if !ids.is_empty() {
            self.queued += ids.len();
            self.runs.push_back(Run {
                seq: self.next_seq,
                time_ms,
                ids,
            });
        }
        self.next_seq += 1;
    }

    /// Drops stale ids from the LRU end until the oldest run ends in a current block;
    /// `current(entry, seq)` tells whether `entry` is current in the run numbered `seq`.
    pub(crate) fn settle(&mut self, current: impl Fn(u32, u32) -> bool) {
        while let Some(run) = self.runs.front_mut() {
            while let Some(&e) = run.ids.last() {
                if current(e, run.seq) {
                    return;
                }
                run.ids.pop();
                self.queued -= 1;
            }
            self.runs.pop_front();
        }
    }

    /// The least recently used block and its touch time (call [`RunLru::settle`] first).
    pub(crate) fn peek(&self) -> Option<(u32, u64)> {
        self.runs.front().and_then(|r| r.ids.last().map(|&e| (e, r.time_ms)))
    }

    /// Drops the block [`RunLru::peek`] returned.
    pub(crate) fn pop(&mut self) {
        if let Some(run) = self.runs.front_mut() {
            if run.ids.pop().is_some() {
                self.queued -= 1;
            }
            if run.ids.is_empty() {
                self.runs.pop_front();
            }
        }
    }

    /// Whether compaction is due.
    pub(crate) fn needs_compaction(&self, held: usize) -> bool {
        self.queued > 8 * held + COMPACT_SLACK || self.next_seq > SEQ_LIMIT
    }

    /// Drops stale ids and empty runs and renumbers runs from 0; every id left is current,
    /// and the caller stores its new number (see [`RunLru::all`]).
    pub(crate) fn compact(&mut self, current: impl Fn(u32, u32) -> bool) {
        let mut next = 0u32;
        let mut queued = 0usize;
        let mut kept = VecDeque::with_capacity(self.runs.len());
        for mut run in self.runs.drain(..) {
            run.ids.retain(|&e| current(e, run.seq));
            if run.ids.is_empty() {
                continue;
            }
            run.seq = next;
            next += 1;
            queued += run.ids.len();
            kept.push_back(run);
        }
        self.runs = kept;
        self.next_seq = next;
        self.queued = queued;
    }

    /// Every (seq, entry) pair queued, oldest run first, stale ids included.
    pub(crate) fn all(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        self.runs.iter().flat_map(|r| r.ids.iter().map(move |&e| (r.seq, e)))
    }

    /// Ids queued, stale included (for memory accounting).
    pub(crate) fn queued(&self) -> usize {
        self.queued
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pop(lru: &mut RunLru, current: impl Fn(u32, u32) -> bool) -> Option<(u32, u64)> {
        lru.settle(current);
        let top = lru.peek();
        lru.pop();
        top
    }

    #[test]
    fn tail_of_oldest_run_first_and_stale_skipped() {
        let mut lru = RunLru::default();
        lru.push(vec![1, 2, 3], 0); // seq 0
        lru.push(vec![2], 5); // seq 1: block 2 re-touched
        let current = |e: u32, seq: u32| if e == 2 { seq == 1 } else { seq == 0 };
        assert_eq!(pop(&mut lru, current), Some((3, 0)));
        assert_eq!(pop(&mut lru, current), Some((1, 0)), "the stale copy of 2 is skipped");
        assert_eq!(pop(&mut lru, current), Some((2, 5)));
        assert_eq!(pop(&mut lru, current), None);
        assert_eq!(lru.queued(), 0);
    }

    #[test]
    fn compaction_renumbers() {
        let mut lru = RunLru::default();
        lru.push(vec![1, 2], 0);
        lru.push(vec![2], 1);
        lru.compact(|e, seq| if e == 2 { seq == 1 } else { seq == 0 });
        assert_eq!(lru.all().collect::<Vec<_>>(), vec![(0, 1), (1, 2)]);
        assert_eq!((lru.queued(), lru.next_seq()), (2, 2));
    }
}
