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
//! Stale ids are dropped incrementally: once the queue holds more than `2·held +
//! COMPACT_SLACK` ids a *cleaning cycle* starts, and every later touch of `n` blocks also
//! cleans up to `CLEAN_FACTOR·n` queued ids, oldest runs first, so no single call ever pays
//! for a whole-queue compaction (a router's tail latency stays flat).
//!
//! Invariants: every held (entry, holder) pair is current in exactly one run; runs are in
//! non-decreasing time order (logical order: cleaned, then pending, then recent runs); the
//! queue stays within a constant factor of `held + COMPACT_SLACK` ids, which bounds memory.
//! Sequence numbers never change except in the rare full renumbering before they reach
//! `u32::MAX / 2`.
//!
//! Complexity: a touch O(run) plus O(run) cleaning; an LRU pop amortised O(1).

use std::collections::VecDeque;

/// Stale ids tolerated beyond `held` before a cleaning cycle starts (small under test, so
/// that the model tests run many cleaning cycles).
#[cfg(not(test))]
pub(crate) const COMPACT_SLACK: usize = 4096;
#[cfg(test)]
pub(crate) const COMPACT_SLACK: usize = 8;

/// Ids cleaned per id touched while a cleaning cycle runs.
pub(crate) const CLEAN_FACTOR: usize = 4;

/// A full renumbering is forced before sequence numbers get this large.
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
    /// Runs already cleaned by the current cycle (oldest).
    cleaned: VecDeque<Run>,
    /// Runs the current cycle has still to clean.
    pending: VecDeque<Run>,
    /// Runs pushed since the cycle started, or all runs outside a cycle (newest).
    recent: VecDeque<Run>,
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
            self.recent.push_back(Run {
                seq: self.next_seq,
                time_ms,
                ids,
            });
        }
        self.next_seq += 1;
    }

    fn oldest_mut(&mut self) -> Option<&mut VecDeque<Run>> {
        [&mut self.cleaned, &mut self.pending, &mut self.recent]
            .into_iter()
            .find(|q| !q.is_empty())
    }

    /// Drops stale ids from the LRU end until the oldest run ends in a current block;
    /// `current(entry, seq)` tells whether `entry` is current in the run numbered `seq`.
    pub(crate) fn settle(&mut self, current: impl Fn(u32, u32) -> bool) {
        let mut dropped = 0;
        while let Some(queue) = self.oldest_mut() {
            let run = queue.front_mut().expect("non-empty queue");
            while let Some(&e) = run.ids.last() {
                if current(e, run.seq) {
                    self.queued -= dropped;
                    return;
                }
                run.ids.pop();
                dropped += 1;
            }
            queue.pop_front();
        }
        self.queued -= dropped;
    }

    /// The least recently used block and its touch time (call [`RunLru::settle`] first).
    pub(crate) fn peek(&self) -> Option<(u32, u64)> {
        [&self.cleaned, &self.pending, &self.recent]
            .into_iter()
            .find_map(|q| q.front())
            .and_then(|r| r.ids.last().map(|&e| (e, r.time_ms)))
    }

    /// Drops the block [`RunLru::peek`] returned.
    pub(crate) fn pop(&mut self) {
        let mut popped = false;
        if let Some(queue) = self.oldest_mut() {
            let run = queue.front_mut().expect("non-empty queue");
            popped = run.ids.pop().is_some();
            if run.ids.is_empty() {
                queue.pop_front();
            }
        }
        self.queued -= usize::from(popped);
    }

    /// Cleans up to `budget` queued ids (starting a cycle when the queue has grown past
    /// `2·held + COMPACT_SLACK`), dropping stale ids and empty runs; order is unchanged.
    pub(crate) fn clean(&mut self, held: usize, budget: usize, current: impl Fn(u32, u32) -> bool) {
        if self.pending.is_empty() && self.cleaned.is_empty() {
            if self.queued <= 2 * held + COMPACT_SLACK {
                return;
            }
            self.pending = std::mem::take(&mut self.recent);
        }
        let mut left = budget;
        while left > 0 {
            let Some(mut run) = self.pending.pop_front() else { break };
            let before = run.ids.len();
            run.ids.retain(|&e| current(e, run.seq));
            self.queued -= before - run.ids.len();
            left = left.saturating_sub(before);
            if !run.ids.is_empty() {
                // A run that lost most of its ids gives the memory back.
                if run.ids.capacity() > 2 * run.ids.len() + 16 {
                    run.ids.shrink_to_fit();
                }
                self.cleaned.push_back(run);
            }
        }
        if self.pending.is_empty() {
            // Cycle over: the cleaned runs are older than everything pushed meanwhile.
            let mut all = std::mem::take(&mut self.cleaned);
            all.append(&mut self.recent);
            self.recent = all;
        }
    }

    /// Whether sequence numbers need the (rare) full renumbering of [`RunLru::renumber`].
    pub(crate) fn needs_renumbering(&self) -> bool {
        self.next_seq > SEQ_LIMIT
    }

    /// Drops stale ids and empty runs and renumbers runs from 0; every id left is current,
    /// and the caller stores its new number (see [`RunLru::all`]).
    pub(crate) fn renumber(&mut self, current: impl Fn(u32, u32) -> bool) {
        let mut next = 0u32;
        let mut queued = 0usize;
        let mut kept = VecDeque::new();
        let runs = self
            .cleaned
            .drain(..)
            .chain(self.pending.drain(..))
            .chain(self.recent.drain(..));
        for mut run in runs {
            run.ids.retain(|&e| current(e, run.seq));
            if run.ids.is_empty() {
                continue;
            }
            run.seq = next;
            next += 1;
            queued += run.ids.len();
            kept.push_back(run);
        }
        self.recent = kept;
        self.next_seq = next;
        self.queued = queued;
    }

    /// Every (seq, entry) pair queued, oldest run first, stale ids included.
    pub(crate) fn all(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        self.cleaned
            .iter()
            .chain(&self.pending)
            .chain(&self.recent)
            .flat_map(|r| r.ids.iter().map(move |&e| (r.seq, e)))
    }

    /// Heap bytes held (run structs and id buffers, by capacity).
    pub(crate) fn heap_bytes(&self) -> usize {
        let runs = self.cleaned.capacity() + self.pending.capacity() + self.recent.capacity();
        let ids: usize = self
            .cleaned
            .iter()
            .chain(&self.pending)
            .chain(&self.recent)
            .map(|r| r.ids.capacity())
            .sum();
        runs * std::mem::size_of::<Run>() + ids * std::mem::size_of::<u32>()
    }

    /// Ids queued, stale included.
    #[cfg(test)]
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
    fn renumbering_and_incremental_cleaning() {
        let mut lru = RunLru::default();
        lru.push(vec![1, 2], 0);
        lru.push(vec![2], 1);
        let current = |e: u32, seq: u32| if e == 2 { seq == 1 } else { seq == 0 };
        lru.renumber(current);
        assert_eq!(lru.all().collect::<Vec<_>>(), vec![(0, 1), (1, 2)]);
        assert_eq!((lru.queued(), lru.next_seq()), (2, 2));

        // 5,000 touches of one block: the cleaning keeps the queue near `held + slack`.
        let mut lru = RunLru::default();
        for t in 0..5_000u64 {
            let seq = lru.next_seq();
            lru.push(vec![9], t);
            lru.clean(1, 4, |_, s| s == seq);
        }
        assert!(lru.queued() <= 2 + COMPACT_SLACK + 4, "{}", lru.queued());
        assert_eq!(lru.all().last(), Some((4_999, 9)));
    }
}
