//! An instance's recently routed requests over a sliding time window: the load signal of the
//! `preble` policy (AIBrix's sliding-window histogram, `policy/preble.rs`).
//!
//! Algorithm: every decision that chooses the instance appends one entry `(routed_ms, cost_us)`;
//! a read at `now_ms` first drops, from the front, every entry with `routed_ms + window_ms <=
//! now_ms` (AIBrix keeps an entry while its time is after `now − window`), then returns how
//! many entries are left and the sum of their costs. The count and the sum are kept as running
//! integers, so a read costs the expired entries only; costs are whole microseconds, so the sum
//! is exact and independent of the order entries leave in (the Python reference adds the same
//! integers).
//!
//! Invariants: entries are in recording order; expiry looks at the front only, so with a clock
//! that steps back an entry recorded after the step leaves no earlier than the entries recorded
//! before it (the router's clocks do not step back: the simulator's and the monotonic one). The
//! window holds what the router did, never what the engine did: an aborted request stays until
//! it ages out, as AIBrix never rolls its histogram back. A read or a record takes the
//! instance's own small mutex, never the index mutex, and only the `preble` policy calls them.
//!
//! Complexity: `record` O(1) amortised; `read` O(expired entries), amortised O(1) per recorded
//! entry; memory O(entries recorded within one window).

use std::collections::VecDeque;

use parking_lot::Mutex;

/// The window's entries and their running totals.
#[derive(Debug, Default)]
struct Entries {
    /// `(routed_ms, cost_us)` in recording order.
    queue: VecDeque<(u64, u64)>,
    /// Sum of the queued costs, microseconds.
    cost_us: u64,
}

/// One instance's requests routed within the last window.
#[derive(Debug, Default)]
pub struct RecentLoad {
    entries: Mutex<Entries>,
}

impl RecentLoad {
    /// A request costing `cost_us` was routed here at `now_ms`.
    pub fn record(&self, now_ms: u64, cost_us: u64) {
        let mut e = self.entries.lock();
        e.queue.push_back((now_ms, cost_us));
        e.cost_us = e.cost_us.saturating_add(cost_us);
    }

    /// `(requests, cost_us)` routed within `window_ms` of `now_ms`, after dropping the older
    /// entries at the front.
    pub fn read(&self, now_ms: u64, window_ms: u64) -> (u64, u64) {
        let mut e = self.entries.lock();
        while let Some(&(routed_ms, cost_us)) = e.queue.front() {
            if routed_ms.saturating_add(window_ms) > now_ms {
                break;
            }
            e.queue.pop_front();
            e.cost_us -= cost_us;
        }
        (e.queue.len() as u64, e.cost_us)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_leave_when_they_reach_the_window_edge() {
        let w = RecentLoad::default();
        assert_eq!(w.read(0, 1000), (0, 0));
        w.record(100, 5);
        w.record(600, 7);
        assert_eq!(w.read(1099, 1000), (2, 12));
        assert_eq!(w.read(1100, 1000), (1, 7), "100 + 1000 <= 1100: the first entry is out");
        assert_eq!(w.read(1600, 1000), (0, 0));
        w.record(1600, 3);
        assert_eq!(w.read(1600, 1000), (1, 3), "an entry of this very ms counts");
        assert_eq!(w.read(1600, 0), (0, 0), "a zero window holds nothing");
    }
}
