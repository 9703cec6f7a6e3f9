//! `llmd_prefix_load`: llm-d's prefix + load scorer profile, as the SMetric paper's authors
//! ran it as a baseline (arXiv 2607.08565 v2; their port is `python/ssched/scheduler/policy/
//! external.py`, class `LlmdPrefixLoad`, in `clateral912/smetric-router-repro`, which ports
//! the prefix-cache, kv-cache-utilization and queue scorers of `llm-d/llm-d-inference-scheduler`
//! at `08dce7a` with the sample profile's weights; this file follows the port, whose reading of
//! upstream was not re-checked against the Go source).
//!
//! Algorithm: three scores in [0, 1] per instance, summed with the profile's weights 2 : 1 : 1,
//! and the highest total wins (llm-d's max-score picker: ties at random):
//! * prefix `min(1, L_i / F)`, `F` the prompt's tokens in full blocks (upstream divides the
//!   matched blocks by the prompt's hashed blocks; a partial last block is never hashed);
//! * free KV `1 − min(1, active_i / (local_capacity_blocks · B))`: upstream reads the engine's
//!   `kv_cache_usage_perc`; the router's in-flight prompt tokens over the instance's GPU KV are
//!   the same quantity without the output tokens (vLLM counts cached but idle blocks as free);
//! * inverse queue `(max q − q_i)/(max q − min q)` over the fleet, 1 for all when every `q`
//!   is equal. Upstream's `q` is the engine's waiting-queue length; the authors' port reads the
//!   requests in flight (`bs_i`) because their router had no reliable waiting count, and so
//!   does this one, to run the baseline the paper measured.
//!
//! Invariants: reads no tunable but `local_capacity_blocks`; no state; scores are computed in
//! one fixed order so the Python reference finds the same ties.
//!
//! Complexity: O(N), two passes (the queue's range, then the scores).

use super::{Policy, Reason, Selection, SelectionInput, argmin};

/// Weight of the prefix score in the profile (the queue and free-KV scores weigh 1).
const PREFIX_WEIGHT: f64 = 2.0;

/// llm-d's prefix + load profile.
#[derive(Debug, Default)]
pub struct LlmdPrefixLoad;

impl Policy for LlmdPrefixLoad {
    fn name(&self) -> &'static str {
        "llmd_prefix_load"
    }

    fn select(&self, input: &SelectionInput<'_>) -> Selection {
        let c = input.candidates;
        let block = u64::from(input.block_size);
        let hashed = (input.num_tokens / block * block) as f64;
        let per_hashed = if hashed > 0.0 { 1.0 / hashed } else { 0.0 };
        let capacity = input.config.local_capacity_blocks as f64 * block as f64;
        let q_lo = c.iter().map(|x| x.bs).min().unwrap_or(0);
        let q_hi = c.iter().map(|x| x.bs).max().unwrap_or(0);
        let total = |i: usize| {
            let prefix = (c[i].local_hit_tokens as f64 * per_hashed).min(1.0);
            let free_kv = 1.0 - (c[i].active as f64 / capacity).clamp(0.0, 1.0);
            let queue = if q_lo == q_hi {
                1.0
            } else {
                (q_hi - c[i].bs) as f64 / (q_hi - q_lo) as f64
            };
            PREFIX_WEIGHT * prefix + free_kv + queue
        };
        // The highest total as the lowest negated one: the same exact-equality ties.
        let index = argmin(c.len(), input.rng, |i| -total(i));
        Selection {
            index,
            reason: Reason::LlmdPrefixLoad,
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
    fn scores_prefix_twice_free_kv_and_inverse_queue() {
        // 1,000 tokens in blocks of 16: 992 hashed. GPU KV of 100 blocks = 1,600 tokens.
        let cfg = RouterConfig {
            local_capacity_blocks: 100,
            ..RouterConfig::default()
        };
        let rng = DrawCounter::new(0);
        let mut c = [cand(0, 496, 4, 0), cand(1, 0, 0, 0), cand(2, 992, 8, 0)];
        c[0].active = 800; // half full
        c[2].active = 1_600; // full
        // 0: 2·0.5 + 0.5 + (8−4)/8 = 2.0; 1: 0 + 1 + 1 = 2.0; 2: 2·1 + 0 + 0 = 2.0 → a three-way tie.
        let picks: Vec<usize> = (0..30)
            .map(|seed| {
                let rng = DrawCounter::new(seed);
                LlmdPrefixLoad.select(&input(&c, 1_000, false, &cfg, &rng)).index
            })
            .collect();
        assert!([0, 1, 2].iter().all(|k| picks.contains(k)), "{picks:?}");
        // Loads 5, 1, 8 and 160 tokens in flight on instance 1 break the tie:
        // 0: 1 + 0.5 + 3/7 ≈ 1.93; 1: 0 + 0.9 + 1 = 1.9; 2: 2 + 0 + 0 = 2 → instance 2.
        c[0].bs = 5;
        c[1].bs = 1;
        c[1].active = 160;
        let s = LlmdPrefixLoad.select(&input(&c, 1_000, false, &cfg, &rng));
        assert_eq!((s.index, s.reason), (2, Reason::LlmdPrefixLoad));
        assert_eq!(rng.draws(), 0);
    }
}
