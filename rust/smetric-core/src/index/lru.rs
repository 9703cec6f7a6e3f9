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
//! Each run also counts its current ids (`live`). The holder reports every id that stops
//! being current — moved to a newer run ([`RunLru::superseded`], once per stretch of a chain
//! that came from the same run), removed, or popped — so a run whose chain was touched again
//! whole (a session's previous turn, when its next one is routed) is dropped at once, its
//! ids never checked one by one; a run with `live` equal to its length is known current
//! without looking at its entries. Only runs partly superseded (e.g. a shared system
//! prompt's blocks moved by another session) need their ids checked, by the cleaning below
//! or when they reach the LRU end. A run whose ids are all current, newest of its holder,
//! can be renewed in place ([`RunLru::renew_newest`]).
//!
//! A run that is not the newest and whose ids are a stretch of the chain being touched (the
//! chain's previous touch: a session's chain, when another was touched since) is *relinked*
//! ([`RunLru::relink`]): its id vector becomes a new run at the newest end, and its current
//! entries keep the number they store; only the chain's other blocks (new ones, or ones another
//! touch moved since) take it. So a run has a sequence number (its place in the order) and the
//! *number its entries store*, the sequence number it was first pushed with; the holder maps the
//! stored number of a relinked run to its sequence number (`aliases`). A re-touch of a session's
//! chain then costs an id comparison per block and no write to its current entries, and two
//! threads routing one session's turns in turn no longer pull each other's lines (measured:
//! `BENCHMARKS.md`, "Relinked runs").
//!
//! Dropped runs and stale ids are removed incrementally: once the queue's ids plus
//! [`RUN_WEIGHT`] per run exceed `2·held + COMPACT_SLACK` a *cleaning cycle* starts, and
//! every later touch also cleans up to `CLEAN_FACTOR` times its own size, oldest runs first,
//! so no single call ever pays for a whole-queue compaction (a router's tail latency stays
//! flat).
//!
//! Invariants: every held (entry, holder) pair is current in exactly one run (the live run whose
//! stored number the entry stores); a run's `live` is the number of its ids that are current;
//! stored numbers of live runs are distinct, and `aliases` maps the stored number of every live
//! relinked run to its sequence number (and nothing else); runs are in increasing sequence-number
//! order and non-decreasing time order (logical order: cleaned, then pending, then recent runs);
//! the queue stays within a constant factor of `held + COMPACT_SLACK` ids, which bounds memory.
//! Sequence numbers never change except in the rare full renumbering before they reach
//! `u32::MAX / 2`.
//!
//! Complexity: a touch O(run) plus O(run) cleaning plus O(log runs) per stretch of the chain
//! taken from one older run; an LRU pop amortised O(1).

use std::collections::VecDeque;

/// Stale ids tolerated beyond `held` before a cleaning cycle starts (small under test, so
/// that the model tests run many cleaning cycles).
#[cfg(not(test))]
pub(crate) const COMPACT_SLACK: usize = 4096;
#[cfg(test)]
pub(crate) const COMPACT_SLACK: usize = 8;

/// Ids cleaned per id touched while a cleaning cycle runs.
pub(crate) const CLEAN_FACTOR: usize = 4;

/// What a queued run costs, in ids, beyond its ids: its bytes over an id's.
pub(crate) const RUN_WEIGHT: usize = std::mem::size_of::<Run>() / std::mem::size_of::<u32>();

/// A full renumbering is forced before sequence numbers get this large.
const SEQ_LIMIT: u32 = u32::MAX / 2;

#[derive(Debug)]
struct Run {
    seq: u32,
    /// The number the run's current entries store: `seq`, or for a relinked run the sequence
    /// number its ids were first pushed with.
    stored: u32,
    /// How many of `ids` are current; 0 once the run is dropped (its ids freed, the run
    /// itself left in its queue until a cleaning or the LRU end removes it).
    live: u32,
    time_ms: u64,
    /// Entry ids in chain order; the LRU end is the back.
    ids: Vec<u32>,
}

impl Run {
    fn all_current(&self) -> bool {
        self.live as usize == self.ids.len()
    }
}

/// Test only: how [`RunLru`] relinks.
#[cfg(test)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TestRelink {
    /// As in production.
    #[default]
    On,
    /// Never: a re-touch writes every entry's number anew, as before relinking existed.
    Off,
    /// Broken: the relinked run's ids are queued in reverse (its head becomes its LRU end).
    Reversed,
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
    /// Stored number → sequence number, for the live relinked runs.
    aliases: crate::mix_map::MixMap<u32, u32>,
    /// Test only: whether runs are relinked, and a broken variant for the negative control.
    #[cfg(test)]
    pub(crate) test_relink: TestRelink,
    /// Test only: runs relinked so far.
    #[cfg(test)]
    pub(crate) relinked: usize,
    /// Ids queued, stale included.
    queued: usize,
}

impl RunLru {
    /// The sequence number the next run will carry; entries touched by it store this number.
    #[inline]
    pub(crate) fn next_seq(&self) -> u32 {
        self.next_seq
    }

    /// Appends a run (its ids must be distinct and already store `next_seq()` as their
    /// current number).
    pub(crate) fn push(&mut self, ids: Vec<u32>, time_ms: u64) {
        if !ids.is_empty() {
            self.queued += ids.len();
            self.recent.push_back(Run {
                seq: self.next_seq,
                stored: self.next_seq,
                live: ids.len() as u32,
                time_ms,
                ids,
            });
        }
        self.next_seq += 1;
    }

    fn runs(&self) -> usize {
        self.cleaned.len() + self.pending.len() + self.recent.len()
    }

    /// The newest run, wherever the cleaning cycle has it.
    fn newest_run(&self) -> Option<&Run> {
        [&self.recent, &self.pending, &self.cleaned]
            .into_iter()
            .find_map(|q| q.back())
    }

    /// The ids (chain order) of the newest run when every one of them is current: then they
    /// are the holder's most recent blocks, in order.
    pub(crate) fn newest_current(&self) -> Option<&[u32]> {
        self.newest_run()
            .filter(|r| r.live > 0 && r.all_current())
            .map(|r| r.ids.as_slice())
    }

    /// Touches the newest run again at `time_ms`, letting `extend` append ids at its LRU end
    /// (they must store the run's stored number, passed to `extend`, and be distinct and
    /// current);
    /// returns how many were appended. Only when [`RunLru::newest_current`] is `Some`: the
    /// run then stays the most recent blocks in order, and the appended ones come right
    /// after them.
    pub(crate) fn renew_newest(&mut self, time_ms: u64, extend: impl FnOnce(u32, &mut Vec<u32>)) -> usize {
        let run = [&mut self.recent, &mut self.pending, &mut self.cleaned]
            .into_iter()
            .find_map(|q| q.back_mut())
            .expect("a newest run to renew");
        let before = run.ids.len();
        extend(run.stored, &mut run.ids);
        run.time_ms = time_ms;
        let added = run.ids.len() - before;
        run.live += added as u32;
        self.queued += added;
        added
    }

    /// The sequence number of the live run whose entries store `stored`.
    #[inline]
    fn seq_of_stored(&self, stored: u32) -> u32 {
        if self.aliases.is_empty() {
            return stored;
        }
        self.aliases.get(&stored).copied().unwrap_or(stored)
    }

    /// The run numbered `seq` (its sequence number), wherever the cleaning cycle has it: the
    /// queue whose front is not newer, then a binary search in it (each queue is in `seq` order).
    fn run(&self, seq: u32) -> Option<&Run> {
        [&self.recent, &self.pending, &self.cleaned]
            .into_iter()
            .find(|q| q.front().is_some_and(|r| r.seq <= seq))
            .and_then(|q| q.binary_search_by_key(&seq, |r| r.seq).ok().map(|i| &q[i]))
    }

    /// [`RunLru::run`], mutable.
    fn run_mut(&mut self, seq: u32) -> Option<&mut Run> {
        [&mut self.recent, &mut self.pending, &mut self.cleaned]
            .into_iter()
            .find(|q| q.front().is_some_and(|r| r.seq <= seq))
            .and_then(|q| match q.binary_search_by_key(&seq, |r| r.seq) {
                Ok(i) => q.get_mut(i),
                Err(_) => None,
            })
    }

    /// `n` ids of the run whose entries store `stored` stopped being current (moved to a newer
    /// run, or removed from the holder). A run left with none is dropped: its ids are freed at
    /// once. Returns the run's touch time (`None`, in release builds, for a number no run
    /// carries).
    pub(crate) fn superseded(&mut self, stored: u32, n: usize) -> Option<u64> {
        let seq = self.seq_of_stored(stored);
        let Some(run) = self.run_mut(seq) else {
            debug_assert!(false, "no run stores {stored}");
            return None;
        };
        debug_assert!(run.live as usize >= n);
        run.live -= n as u32;
        let time_ms = run.time_ms;
        if run.live == 0 {
            let freed = run.ids.len();
            run.ids = Vec::new();
            self.queued -= freed;
            self.forget(seq, stored);
        }
        Some(time_ms)
    }

    /// The run numbered `seq`, storing `stored`, has no current id left: its alias goes.
    fn forget(&mut self, seq: u32, stored: u32) {
        if seq != stored && self.aliases.get(&stored) == Some(&seq) {
            self.aliases.remove(&stored);
        }
    }

    /// The ids (chain order, stale ones included) of the live run whose entries store `stored`
    /// (when relinking is on: always, but in tests that turn it off).
    pub(crate) fn run_ids(&self, stored: u32) -> Option<&[u32]> {
        #[cfg(test)]
        if self.test_relink == TestRelink::Off {
            return None;
        }
        self.run(self.seq_of_stored(stored))
            .filter(|r| r.stored == stored && r.live > 0)
            .map(|r| r.ids.as_slice())
    }

    /// Touches again at `time_ms` the live run whose entries store `stored`
    /// ([`RunLru::run_ids`] is `Some`): `build` gets the stored number, the run's ids and whether
    /// all of them are current, and returns the new run's ids in chain order, every one made
    /// current under that number (the run's current entries store it already: not written); the
    /// new run goes at the newest end, and the old one is left dropped. Returns how many ids the
    /// new run has beyond the old one's.
    pub(crate) fn relink(
        &mut self,
        stored: u32,
        time_ms: u64,
        build: impl FnOnce(u32, Vec<u32>, bool) -> Vec<u32>,
    ) -> usize {
        let old = self.seq_of_stored(stored);
        let run = self.run_mut(old).expect("a current run to relink");
        debug_assert!(run.stored == stored && run.live > 0);
        let all_current = run.all_current();
        let kept = std::mem::take(&mut run.ids);
        run.live = 0;
        let seq = self.next_seq;
        self.next_seq += 1;
        if seq != stored {
            self.aliases.insert(stored, seq);
        }
        let before = kept.len();
        #[cfg_attr(not(test), allow(unused_mut))]
        let mut ids = build(stored, kept, all_current);
        let added = ids.len() - before;
        self.queued += added;
        #[cfg(test)]
        {
            self.relinked += 1;
            if self.test_relink == TestRelink::Reversed {
                ids.reverse();
            }
        }
        self.recent.push_back(Run {
            seq,
            stored,
            live: ids.len() as u32,
            time_ms,
            ids,
        });
        added
    }

    fn oldest_mut(&mut self) -> Option<&mut VecDeque<Run>> {
        [&mut self.cleaned, &mut self.pending, &mut self.recent]
            .into_iter()
            .find(|q| !q.is_empty())
    }

    /// Drops stale ids and dropped runs from the LRU end until the oldest run ends in a
    /// current block; `current(entry, seq)` tells whether `entry` is current in the run
    /// numbered `seq` (asked only of runs partly superseded).
    pub(crate) fn settle(&mut self, current: impl Fn(u32, u32) -> bool) {
        let mut dropped = 0;
        while let Some(queue) = self.oldest_mut() {
            let run = queue.front_mut().expect("non-empty queue");
            if run.live > 0 {
                if run.all_current() {
                    break;
                }
                while let Some(&e) = run.ids.last() {
                    if current(e, run.stored) {
                        self.queued -= dropped;
                        return;
                    }
                    run.ids.pop();
                    dropped += 1;
                }
            }
            dropped += run.ids.len();
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

    /// The ids `from..to` places before [`RunLru::peek`]'s in the oldest run (as far as it
    /// reaches; stale ids included, order not kept): the blocks about that many evictions from
    /// now, for prefetching them.
    #[inline]
    pub(crate) fn peek_ahead(&self, from: usize, to: usize) -> &[u32] {
        let Some(run) = [&self.cleaned, &self.pending, &self.recent]
            .into_iter()
            .find_map(|q| q.front())
        else {
            return &[];
        };
        let len = run.ids.len();
        &run.ids[len.saturating_sub(to)..len.saturating_sub(from)]
    }

    /// The touch time [`RunLru::peek`] would report after [`RunLru::settle`], read without
    /// settling: that of the oldest run with a current id (dropped runs before it are skipped,
    /// not removed), so that a shared reader can tell whether a TTL purge has work to do.
    pub(crate) fn oldest_live_time(&self) -> Option<u64> {
        self.cleaned
            .iter()
            .chain(&self.pending)
            .chain(&self.recent)
            .find(|r| r.live > 0)
            .map(|r| r.time_ms)
    }

    /// Drops the block [`RunLru::peek`] returned (a current one: the holder drops it too).
    pub(crate) fn pop(&mut self) {
        let mut dropped = 0;
        if let Some(queue) = self.oldest_mut() {
            let run = queue.front_mut().expect("non-empty queue");
            if run.ids.pop().is_some() {
                run.live -= 1;
                dropped += 1;
            }
            if run.live == 0 {
                // Nothing current left: the stale ids go with the run.
                dropped += run.ids.len();
                let (seq, stored) = (run.seq, run.stored);
                queue.pop_front();
                self.forget(seq, stored);
            }
        }
        self.queued -= dropped;
    }

    /// Cleans up to `budget` queued ids' worth (a run counts [`RUN_WEIGHT`] besides the ids it
    /// checks), starting a cycle when the queue has grown past `2·held + COMPACT_SLACK`:
    /// drops dropped runs, keeps whole the runs known current, and removes the stale ids of
    /// the others. Order is unchanged.
    pub(crate) fn clean(&mut self, held: usize, budget: usize, current: impl Fn(u32, u32) -> bool) {
        if self.pending.is_empty() && self.cleaned.is_empty() {
            if self.queued + RUN_WEIGHT * self.runs() <= 2 * held + COMPACT_SLACK {
                return;
            }
            self.pending = std::mem::take(&mut self.recent);
        }
        let mut left = budget;
        while left > 0 {
            let Some(mut run) = self.pending.pop_front() else { break };
            left = left.saturating_sub(RUN_WEIGHT);
            if run.live == 0 {
                self.queued -= run.ids.len();
                continue;
            }
            if !run.all_current() {
                let before = run.ids.len();
                run.ids.retain(|&e| current(e, run.stored));
                debug_assert!(run.all_current());
                self.queued -= before - run.ids.len();
                left = left.saturating_sub(before);
                // A run that lost most of its ids gives the memory back.
                if run.ids.capacity() > 2 * run.ids.len() + 16 {
                    run.ids.shrink_to_fit();
                }
            }
            self.cleaned.push_back(run);
        }
        if self.pending.is_empty() {
            // Cycle over: the cleaned runs are older than everything pushed meanwhile.
            let mut all = std::mem::take(&mut self.cleaned);
            all.append(&mut self.recent);
            self.recent = all;
        }
    }

    /// Test only: numbers the next run at the renumbering threshold (the runs queued keep theirs,
    /// all lower), so that a test reaches the renumbering in a few touches.
    #[cfg(test)]
    pub(crate) fn skip_to_seq_limit(&mut self) {
        self.next_seq = self.next_seq.max(SEQ_LIMIT);
    }

    /// Whether sequence numbers need the (rare) full renumbering of [`RunLru::renumber`].
    pub(crate) fn needs_renumbering(&self) -> bool {
        self.next_seq > SEQ_LIMIT
    }

    /// Drops stale ids and dropped runs and renumbers runs from 0; every id left is current,
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
            if !run.all_current() {
                run.ids.retain(|&e| current(e, run.stored));
            }
            if run.ids.is_empty() {
                continue;
            }
            run.seq = next;
            run.stored = next;
            run.live = run.ids.len() as u32;
            next += 1;
            queued += run.ids.len();
            kept.push_back(run);
        }
        self.recent = kept;
        self.next_seq = next;
        self.queued = queued;
        self.aliases.clear();
    }

    /// Every (stored number, entry) pair queued, oldest run first, stale ids included.
    pub(crate) fn all(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        self.cleaned
            .iter()
            .chain(&self.pending)
            .chain(&self.recent)
            .flat_map(|r| r.ids.iter().map(move |&e| (r.stored, e)))
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

    /// Runs queued, dropped ones included.
    #[cfg(test)]
    pub(crate) fn queued_runs(&self) -> usize {
        self.runs()
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
        lru.superseded(0, 1);
        let current = |e: u32, seq: u32| if e == 2 { seq == 1 } else { seq == 0 };
        assert_eq!(pop(&mut lru, current), Some((3, 0)));
        assert_eq!(pop(&mut lru, current), Some((1, 0)), "the stale copy of 2 is skipped");
        assert_eq!(pop(&mut lru, current), Some((2, 5)));
        assert_eq!(pop(&mut lru, current), None);
        assert_eq!(lru.queued(), 0);
    }

    #[test]
    fn a_wholly_superseded_run_is_dropped_unchecked() {
        let mut lru = RunLru::default();
        lru.push(vec![1, 2, 3], 0); // seq 0
        lru.push(vec![4], 1); // seq 1
        lru.push(vec![1, 2, 3, 5], 2); // seq 2: the first run's chain, extended
        lru.superseded(0, 3);
        assert_eq!(lru.queued(), 5, "the first run's ids are freed at once");
        let never = |_: u32, _: u32| -> bool { panic!("no id needs a check") };
        assert_eq!(pop(&mut lru, never), Some((4, 1)));
        assert_eq!(lru.newest_current(), Some(&[1, 2, 3, 5][..]));
        lru.superseded(2, 1);
        assert_eq!(lru.newest_current(), None, "a run with a stale id cannot be renewed");
    }

    /// A run touched again whole, not the newest, moves to the newest end under the number its
    /// entries store; the blocks appended store it too; its alias goes with it.
    #[test]
    fn a_run_touched_again_whole_is_relinked_under_its_stored_number() {
        let mut lru = RunLru::default();
        lru.push(vec![1, 2, 3], 0); // seq 0: entries 1, 2, 3 store 0
        lru.push(vec![4, 5], 1); // seq 1
        assert_eq!(lru.run_ids(0), Some(&[1, 2, 3][..]));
        let added = lru.relink(0, 7, |stored, mut ids, all_current| {
            assert!(all_current);
            assert_eq!(stored, 0, "appended blocks store the run's number");
            ids.push(6);
            ids
        });
        assert_eq!((added, lru.next_seq(), lru.queued()), (1, 3, 6));
        assert_eq!(lru.run_ids(0), Some(&[1, 2, 3, 6][..]));
        let current = |e: u32, stored: u32| stored == u32::from(e > 3 && e < 6);
        // The LRU end is now the other run's tail; the relinked run keeps chain order.
        let order: Vec<_> = std::iter::from_fn(|| pop(&mut lru, current)).collect();
        assert_eq!(order, vec![(5, 1), (4, 1), (6, 7), (3, 7), (2, 7), (1, 7)]);
        assert!(lru.aliases.is_empty(), "the alias went with the run");
        assert_eq!(lru.queued(), 0);

        // Relinked twice, then superseded through the stored number.
        let mut lru = RunLru::default();
        lru.push(vec![1, 2], 0);
        lru.push(vec![3], 1);
        lru.relink(0, 2, |_, ids, _| ids);
        lru.push(vec![4], 3);
        lru.relink(0, 4, |_, ids, _| ids);
        assert_eq!(lru.aliases.get(&0), Some(&4));
        assert_eq!(lru.superseded(0, 2), Some(4));
        assert!(lru.aliases.is_empty());
        assert_eq!(lru.run_ids(0), None);
    }

    #[test]
    fn renumbering_and_incremental_cleaning() {
        let mut lru = RunLru::default();
        lru.push(vec![1, 2], 0);
        lru.push(vec![2], 1);
        lru.superseded(0, 1);
        let current = |e: u32, seq: u32| if e == 2 { seq == 1 } else { seq == 0 };
        lru.renumber(current);
        assert_eq!(lru.all().collect::<Vec<_>>(), vec![(0, 1), (1, 2)]);
        assert_eq!((lru.queued(), lru.next_seq()), (2, 2));

        // 5,000 touches of one block: runs are dropped as they are superseded, and the
        // cleaning keeps the number of (dropped) runs queued bounded.
        let mut lru = RunLru::default();
        for t in 0..5_000u64 {
            let seq = lru.next_seq();
            if seq > 0 {
                lru.superseded(seq - 1, 1);
            }
            lru.push(vec![9], t);
            lru.clean(1, CLEAN_FACTOR * (1 + RUN_WEIGHT), |_, s| s == seq);
        }
        assert_eq!(lru.queued(), 1);
        assert!(
            lru.queued_runs() * RUN_WEIGHT <= 2 + COMPACT_SLACK + 2 * RUN_WEIGHT,
            "{}",
            lru.queued_runs()
        );
        assert_eq!(lru.all().last(), Some((4_999, 9)));
    }
}
