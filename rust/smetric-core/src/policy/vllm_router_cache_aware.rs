//! `vllm_router_cache_aware`: vllm-router's `cache_aware` policy, one of the router arms of the
//! real-hardware reproduction (`clateral912/smetric-router-repro`).
//!
//! Source, read and restated in our words: `src/policies/cache_aware.rs` of
//! `vllm-project/router` (the version stored at `16917f4`; its rule came from sglang's
//! `sgl-router`), and the reproduction's provenance (`router-provenance.json`: vllm-router at
//! `631fd01` with its CLI defaults `cache_threshold` 0.3, `balance_abs_threshold` 64,
//! `balance_rel_threshold` 1.5, `eviction_interval_secs` 120, `max_tree_size` 2^26; the
//! reproduction's `patches/vllm-router-token-prefix.patch` turns a token-id prompt into one
//! character per token, so its tree matched tokens).
//!
//! The peer form. vllm-router keeps an approximate radix tree of request text per model, each
//! node tagged with the workers it was routed to (inserted on every routing decision, whatever
//! the branch), and a per-worker in-flight count (`load`: incremented when a request is sent,
//! decremented when it ends). Per request, with `lo`/`hi` the least and most loaded worker:
//! 1. imbalanced iff `hi − lo > balance_abs_threshold` and `hi > balance_rel_threshold · lo`
//!    → the least loaded worker;
//! 2. else the tree's deepest match: if `matched / input` characters `> cache_threshold` → the
//!    worker holding that match;
//! 3. else → the least loaded worker (sglang's older form took the worker with the smallest
//!    tree here; the vllm-router version read takes the least load).
//!
//! Mapping to this router: the tree → the index's local hits (`local_hit_tokens`), which the
//! router's approximate mode also inserts on route (every branch, as vllm-router does); the
//! match rate → `max_i L_i / n` in tokens (the reproduction's one-character-per-token adapter
//! makes vllm-router's rate a token rate too). Differences: our hits are whole blocks
//! (`block_size` tokens), its matches single characters; our index evicts by LRU at the
//! configured capacity (and follows KV events in exact mode), its tree evicts least recently
//! used leaves every 120 s above `max_tree_size` nodes, so its tree forgets far later than an
//! engine's cache does; load `bs` is the router's in-flight count fused with engine scrapes;
//! ties (least load, or several holders of the deepest match) are broken at random (§5), where
//! vllm-router takes the first worker in its list or the tree's own pick.
//!
//! Invariants: no per-policy state; the three branches are tried in order; `n = 0` has match
//! rate 0.
//!
//! Complexity: O(N), a constant number of passes.

use super::{Policy, Reason, Selection, SelectionInput, argmin, argmin_by};

/// vllm-router's cache-aware policy.
#[derive(Debug, Default)]
pub struct VllmRouterCacheAware;

impl Policy for VllmRouterCacheAware {
    fn name(&self) -> &'static str {
        "vllm_router_cache_aware"
    }

    fn select(&self, input: &SelectionInput<'_>) -> Selection {
        let c = input.candidates;
        let cfg = input.config;
        let lo = c.iter().map(|x| x.bs).min().unwrap_or(0);
        let hi = c.iter().map(|x| x.bs).max().unwrap_or(0);
        let least = |reason| Selection {
            index: argmin(c.len(), input.rng, |i| c[i].bs as f64),
            reason,
        };
        if hi - lo > cfg.cache_aware_balance_abs_threshold
            && hi as f64 > lo as f64 * cfg.cache_aware_balance_rel_threshold
        {
            return least(Reason::CacheAwareBalance);
        }
        let best = c.iter().map(|x| x.local_hit_tokens).max().unwrap_or(0);
        let n = input.num_tokens;
        let rate = if n == 0 { 0.0 } else { best as f64 / n as f64 };
        if rate > cfg.cache_aware_cache_threshold {
            let index = argmin_by(c.len(), input.rng, |i| c[i].local_hit_tokens == best, |_| 0.0).unwrap_or(0);
            return Selection {
                index,
                reason: Reason::CacheAwareMatch,
            };
        }
        least(Reason::CacheAwareLowMatch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RouterConfig;
    use crate::policy::test_support::{cand, input};
    use crate::rng::DrawCounter;

    fn pick(c: &[crate::policy::Candidate], n: u64) -> Selection {
        let cfg = RouterConfig::default();
        let rng = DrawCounter::new(0);
        VllmRouterCacheAware.select(&input(c, n, false, &cfg, &rng))
    }

    #[test]
    fn shipped_thresholds() {
        let d = RouterConfig::DEFAULT;
        assert_eq!(
            (
                d.cache_aware_cache_threshold,
                d.cache_aware_balance_abs_threshold,
                d.cache_aware_balance_rel_threshold
            ),
            (0.3, 64, 1.5)
        );
    }

    #[test]
    fn imbalance_sends_to_the_least_loaded_even_past_a_full_match() {
        // 100 − 20 = 80 > 64 and 100 > 1.5·20: imbalanced.
        let c = [cand(0, 1000, 100, 0), cand(1, 0, 20, 0), cand(2, 0, 50, 0)];
        let s = pick(&c, 1000);
        assert_eq!((s.index, s.reason), (1, Reason::CacheAwareBalance));
        // 69 > 64 and 149 > 1.5·80: imbalanced.
        let c = [cand(0, 1000, 149, 0), cand(1, 0, 80, 0)];
        assert_eq!(pick(&c, 1000).index, 1);
        // 130 − 90 = 40 ≤ 64: balanced, the full match wins.
        let c = [cand(0, 1000, 130, 0), cand(1, 0, 90, 0)];
        assert_eq!(pick(&c, 1000).reason, Reason::CacheAwareMatch);
        // 90 > 64 but 300 ≤ 1.5·210: balanced (both tests must hold).
        let c = [cand(0, 1000, 300, 0), cand(1, 0, 210, 0)];
        assert_eq!(pick(&c, 1000).reason, Reason::CacheAwareMatch);
    }

    #[test]
    fn a_match_above_the_threshold_wins_else_the_least_loaded() {
        // Best match 400 of 1000 = 0.4 > 0.3: its holder, although busier.
        let c = [cand(0, 400, 9, 0), cand(1, 100, 1, 0), cand(2, 0, 4, 0)];
        assert_eq!(
            (pick(&c, 1000).index, pick(&c, 1000).reason),
            (0, Reason::CacheAwareMatch)
        );
        // 300 of 1000 is not above 0.3: cold, the least loaded.
        let c = [cand(0, 300, 9, 0), cand(1, 100, 1, 0), cand(2, 0, 4, 0)];
        let s = pick(&c, 1000);
        assert_eq!((s.index, s.reason), (1, Reason::CacheAwareLowMatch));
        // An empty prompt has rate 0.
        assert_eq!(pick(&c, 0).reason, Reason::CacheAwareLowMatch);
    }
}
