//! `power_of_two`: vllm-router's power-of-two choices, one of the router arms of the
//! real-hardware reproduction (`clateral912/smetric-router-repro`).
//!
//! Source, read and restated in our words: `src/policies/power_of_two.rs` of
//! `vllm-project/router` (the version stored at `fa999f9`). It draws two distinct healthy
//! workers uniformly (the second redrawn until it differs), reads each one's load — the
//! router's own in-flight count, plus the last load the external monitor reported when there is
//! one — and takes the first unless the second is strictly less loaded. One healthy worker is
//! taken without a draw.
//!
//! Mapping to this router: the load → `bs`, requests in flight (the router's count fused with
//! a fresh engine snapshot, as every policy here reads it). The pair comes from the router's
//! counter-based stream (§5) so the Python reference draws the same: `a = pick(N)`,
//! `b = pick(N − 1)`, `b += 1` if `b ≥ a` — uniform over ordered distinct pairs, as the
//! redraw is, without a loop. The PD router's `power_of_two` decode rule draws alike.
//!
//! Invariants: two draws when N ≥ 3, one when N = 2 (`pick(1)` takes none: the second of two
//! is forced), none when N = 1; a tie goes to the first draw.
//!
//! Complexity: O(1) beyond the candidates the router builds.

use super::{Policy, Reason, Selection, SelectionInput};

/// vllm-router's power-of-two choices.
#[derive(Debug, Default)]
pub struct PowerOfTwo;

impl Policy for PowerOfTwo {
    fn name(&self) -> &'static str {
        "power_of_two"
    }

    fn select(&self, input: &SelectionInput<'_>) -> Selection {
        let c = input.candidates;
        let index = if c.len() < 2 {
            0
        } else {
            let first = input.rng.pick(c.len());
            let mut second = input.rng.pick(c.len() - 1);
            if second >= first {
                second += 1;
            }
            if c[second].bs < c[first].bs { second } else { first }
        };
        Selection {
            index,
            reason: Reason::PowerOfTwo,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RouterConfig;
    use crate::policy::test_support::{cand, input};
    use crate::rng::DrawCounter;

    #[test]
    fn the_less_loaded_of_two_distinct_draws_wins() {
        let cfg = RouterConfig::default();
        let c = [cand(0, 0, 9, 0), cand(1, 0, 1, 0), cand(2, 0, 5, 0)];
        let mut seen = [0u32; 3];
        for seed in 0..300 {
            let rng = DrawCounter::new(seed);
            let s = PowerOfTwo.select(&input(&c, 100, true, &cfg, &rng));
            assert_eq!(rng.draws(), 2);
            assert_eq!(s.reason, Reason::PowerOfTwo);
            // Replay the two draws: the choice is the less loaded of a distinct pair.
            let replay = DrawCounter::new(seed);
            let a = replay.pick(3);
            let mut b = replay.pick(2);
            if b >= a {
                b += 1;
            }
            assert_ne!(a, b);
            let expect = if c[b].bs < c[a].bs { b } else { a };
            assert_eq!(s.index, expect);
            seen[s.index] += 1;
        }
        // The busiest (9) never wins: every pair holds a less loaded one. The idlest wins the
        // two pairs it is in (2/3 of draws); 5 wins only against 9.
        assert_eq!(seen[0], 0);
        assert!(seen[1] > seen[2] && seen[2] > 0, "{seen:?}");
    }

    #[test]
    fn one_or_two_candidates_take_fewer_draws_and_ties_go_to_the_first() {
        let cfg = RouterConfig::default();
        let rng = DrawCounter::new(1);
        let one = [cand(0, 0, 3, 0)];
        assert_eq!(PowerOfTwo.select(&input(&one, 10, false, &cfg, &rng)).index, 0);
        assert_eq!(rng.draws(), 0);
        let even = [cand(0, 0, 2, 0), cand(1, 0, 2, 0)];
        for seed in 0..20 {
            let rng = DrawCounter::new(seed);
            let s = PowerOfTwo.select(&input(&even, 10, false, &cfg, &rng));
            assert_eq!(s.index, DrawCounter::new(seed).pick(2));
            assert_eq!(rng.draws(), 1, "of two, the second is forced");
        }
    }
}
