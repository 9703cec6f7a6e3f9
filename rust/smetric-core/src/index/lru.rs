//! A lazy LRU order for one holder of the KV$ index.
//!
//! Algorithm: every touch appends `(entry, seq, time)` to a queue and records `seq` as the
//! entry's current sequence number for this holder; older queue items of the same entry
//! become stale. The front of the queue, skipping stale items, is the least recently used
//! block. A touch is therefore one map write and one `push_back`, with no list relinking:
//! touching a 2,000-block chain stays sequential in memory.
//!
//! Invariants: for every held entry exactly one queue item carries its current `seq`; the
//! queue never holds more than `2·held + COMPACT_SLACK` items (compaction drops stale items
//! and renumbers `seq` from 0, which also keeps `seq` far below `u32::MAX`).
//!
//! Complexity: touch O(1); pop of the LRU block amortised O(1); compaction O(queue) and
//! runs at most once per `held + COMPACT_SLACK` touches, so amortised O(1) per touch.

use std::collections::VecDeque;

/// Stale items tolerated beyond the number of held blocks before compaction.
pub(crate) const COMPACT_SLACK: usize = 64;

/// One touch of one block.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Touch {
    pub entry: u32,
    pub seq: u32,
    pub time_ms: u64,
}

/// Touch order of one holder.
#[derive(Debug, Default)]
pub(crate) struct LazyLru {
    queue: VecDeque<Touch>,
    next_seq: u32,
}

impl LazyLru {
    /// Records a touch and returns the sequence number the caller must store for `entry`.
    #[inline]
    pub(crate) fn push(&mut self, entry: u32, time_ms: u64) -> u32 {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.queue.push_back(Touch { entry, seq, time_ms });
        seq
    }

    /// The oldest queue item (possibly stale; the caller checks it against its seq store).
    #[inline]
    pub(crate) fn front(&self) -> Option<Touch> {
        self.queue.front().copied()
    }

    /// Drops the oldest queue item.
    #[inline]
    pub(crate) fn pop_front(&mut self) {
        self.queue.pop_front();
    }

    /// Whether the queue has grown enough stale items to be worth compacting.
    #[inline]
    pub(crate) fn needs_compaction(&self, held: usize) -> bool {
        self.queue.len() > 2 * held + COMPACT_SLACK
    }

    /// Keeps only the items for which `is_current` holds and renumbers their `seq` from 0 in
    /// queue order; the caller then stores the new numbers (see [`LazyLru::iter`]).
    pub(crate) fn compact(&mut self, mut is_current: impl FnMut(Touch) -> bool) {
        self.queue.retain(|t| is_current(*t));
        for (seq, t) in self.queue.iter_mut().enumerate() {
            t.seq = seq as u32;
        }
        self.next_seq = self.queue.len() as u32;
    }

    /// Forgets every touch.
    pub(crate) fn clear(&mut self) {
        self.queue.clear();
        self.next_seq = 0;
    }

    /// Queue items, stale ones included (for memory accounting).
    pub(crate) fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Iterates the queue from least to most recent, stale items included.
    pub(crate) fn iter(&self) -> impl Iterator<Item = Touch> + '_ {
        self.queue.iter().copied()
    }
}
