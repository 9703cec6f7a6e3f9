//! `round_robin`: candidate `rr mod N`, then `rr += 1`. Ignores caches and load; the
//! baseline every router ships. O(1).

use std::sync::atomic::{AtomicU64, Ordering};

use super::{Policy, Reason, Selection, SelectionInput};

/// Rotates through the live instances.
#[derive(Debug, Default)]
pub struct RoundRobin {
    next: AtomicU64,
}

impl Policy for RoundRobin {
    fn name(&self) -> &'static str {
        "round_robin"
    }

    fn select(&self, input: &SelectionInput<'_>) -> Selection {
        let k = self.next.fetch_add(1, Ordering::Relaxed);
        Selection {
            index: (k % input.candidates.len() as u64) as usize,
            reason: Reason::RoundRobin,
        }
    }
}
