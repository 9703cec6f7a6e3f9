//! `lpwl`: least pending prefill work, `argmin queued + uncached`. `queued` is the instance's
//! backlog of uncached prompt tokens (the load board's counter), `uncached = n − max(L, G)` the
//! prefill this request would add there, with the local hit `L` and the global-tier hit `G`
//! counted exactly as the board's `prefill(r, X)` counts them (docs §3), so the score is the
//! backlog the instance would hold right after this decision.
//!
//! No batch term: unlike LMetric's `· (bs + 1)` it ignores decodes in flight, which makes it
//! the pure prefill-time baseline (a third-party H20 replication on an agent trace found it
//! ahead of LMetric on cache hits and TTFT p90). No `max(·, 1)` guard either: without a
//! product a zero score cannot swamp another term. Ties at random (docs §5). O(N).

use super::{Policy, Reason, Selection, SelectionInput, argmin};

/// Least pending prefill work.
#[derive(Debug, Default)]
pub struct Lpwl;

impl Policy for Lpwl {
    fn name(&self) -> &'static str {
        "lpwl"
    }

    fn select(&self, input: &SelectionInput<'_>) -> Selection {
        let c = input.candidates;
        let (n, g) = (input.num_tokens, input.global_hit_tokens);
        let index = argmin(c.len(), input.rng, |i| (c[i].queued + c[i].prefill_tokens(n, g)) as f64);
        Selection {
            index,
            reason: Reason::Lpwl,
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
    fn picks_the_least_backlog_after_the_request() {
        let (cfg, rng) = (RouterConfig::default(), DrawCounter::new(0));
        // 0: 500 queued + 100 uncached = 600; 1: 0 + 1000 = 1000; 2: 200 + 300 = 500.
        let c = [cand(0, 900, 0, 500), cand(1, 0, 0, 0), cand(2, 700, 0, 200)];
        let s = Lpwl.select(&input(&c, 1000, false, &cfg, &rng));
        assert_eq!((s.index, s.reason), (2, Reason::Lpwl));
        assert_eq!(rng.draws(), 0, "a single best candidate takes no draw");
    }

    #[test]
    fn ignores_the_batch_and_the_turn() {
        let (cfg, rng) = (RouterConfig::default(), DrawCounter::new(0));
        // LMetric would take instance 1 (1000·1 < 100·50); least pending work takes 0.
        let c = [cand(0, 900, 49, 0), cand(1, 0, 0, 0)];
        for first_turn in [true, false] {
            assert_eq!(Lpwl.select(&input(&c, 1000, first_turn, &cfg, &rng)).index, 0);
        }
    }

    #[test]
    fn counts_the_global_hit_like_the_load_board() {
        let (cfg, rng) = (RouterConfig::default(), DrawCounter::new(0));
        // With a 800-token global hit every instance's uncached part is at most 200, so the
        // queue decides: 1 (50 + 200) beats 0 (300 + 100).
        let c = [cand(0, 900, 0, 300), cand(1, 0, 0, 50)];
        let mut sel = input(&c, 1000, false, &cfg, &rng);
        sel.global_hit_tokens = 800;
        assert_eq!(Lpwl.select(&sel).index, 1);
        // A hit longer than the prompt (a stale index) leaves nothing uncached, never underflows.
        sel.global_hit_tokens = 5000;
        assert_eq!(Lpwl.select(&sel).index, 1);
    }

    #[test]
    fn ties_are_random_and_reproducible() {
        let cfg = RouterConfig::default();
        let c = [cand(0, 0, 3, 100), cand(1, 100, 0, 200), cand(2, 0, 9, 500)];
        let picks: Vec<usize> = (0..40)
            .map(|seed| {
                let rng = DrawCounter::new(seed);
                let index = Lpwl.select(&input(&c, 1000, false, &cfg, &rng)).index;
                assert_eq!(rng.draws(), 1);
                index
            })
            .collect();
        assert!(picks.iter().all(|&p| p < 2));
        assert!(picks.contains(&0) && picks.contains(&1));
    }
}
