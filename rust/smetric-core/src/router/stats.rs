//! Counters and index sizes, read for `stats()` and the Prometheus exporter.
//!
//! Invariants: counters are monotone; a read takes the index's shared lock once (for the index's
//! sizes) and reads every other counter lock-free, so the figures of one call are not one
//! atomic snapshot under concurrent routing (each is exact on its own).
//!
//! Complexity: O(instances) plus the index's O(1) size reads.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::Router;
use crate::index::IndexStats;
use crate::policy::Reason;

/// Counters reported by `stats()`.
#[derive(Debug, Clone, Default)]
pub struct RouterStats {
    /// Decisions made.
    pub routed: u64,
    /// Decisions treated as first turns.
    pub first_turns: u64,
    /// Decisions per reason, in [`Reason::ALL`] order.
    pub reasons: Vec<(&'static str, u64)>,
    /// Lifecycle calls for unknown or already finished requests.
    pub unknown_request_events: u64,
    /// Requests in flight.
    pub in_flight: usize,
    /// Output tokens reported by `on_finished`, summed.
    pub output_tokens: u64,
    /// Random draws taken.
    pub draws: u64,
    /// Decisions taken again because another decision committed on the chosen instance
    /// between their load read and their commit (concurrent routing only).
    pub decision_retries: u64,
    /// Index counts.
    pub index: IndexStats,
    /// Blocks each live instance holds, by name in slot order.
    pub local_blocks: Vec<(Arc<str>, usize)>,
    /// Blocks each live instance's host pool holds, in the order of `local_blocks` (§2.8).
    pub host_blocks: Vec<usize>,
    /// Heap bytes of the index.
    pub index_bytes: usize,
    /// Heap bytes of the index by component (see `KvIndex::memory_breakdown`).
    pub index_breakdown: Vec<(&'static str, usize)>,
}

impl Router {
    /// Counters and index sizes.
    pub fn stats(&self) -> RouterStats {
        let g = self.read_index_fresh();
        let index = g.stats();
        let index_bytes = g.memory_bytes();
        let index_breakdown = g.memory_breakdown().to_vec();
        drop(g);
        let fleet = self.fleet.load();
        let local_blocks = fleet
            .members()
            .map(|(slot, m)| {
                (
                    m.name.clone(),
                    index.local_blocks.get(slot as usize).copied().unwrap_or(0),
                )
            })
            .collect();
        let host_blocks = fleet
            .members()
            .map(|(slot, _)| index.host_blocks.get(slot as usize).copied().unwrap_or(0))
            .collect();
        RouterStats {
            routed: self.routed.load(Ordering::Relaxed),
            first_turns: self.first_turns.load(Ordering::Relaxed),
            reasons: Reason::ALL
                .iter()
                .zip(&self.reasons)
                .map(|(r, c)| (r.name(), c.load(Ordering::Relaxed)))
                .collect(),
            unknown_request_events: self.unknown_events.load(Ordering::Relaxed),
            in_flight: self.requests.lock().len(),
            output_tokens: self.output_tokens.load(Ordering::Relaxed),
            draws: self.rng.draws(),
            decision_retries: self.decision_retries.load(Ordering::Relaxed),
            index,
            local_blocks,
            host_blocks,
            index_bytes,
            index_breakdown,
        }
    }
}
