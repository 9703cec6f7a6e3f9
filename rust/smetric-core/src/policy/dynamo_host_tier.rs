//! `dynamo_host_tier`: NVIDIA Dynamo's KV-router cost with its tiered overlap credit, the form
//! the SMetric paper's authors ran as a baseline (arXiv 2607.08565 v2; their port is
//! `python/ssched/scheduler/policy/external.py`, class `DynamoPrefillRouter`, in
//! `clateral912/smetric-router-repro`, which ports `ai-dynamo/dynamo`'s selector at
//! `KvRouterConfig::default()`; this file follows the port). Beside it, `linear` is the same
//! cost with every cached token free and the global tier ignored.
//!
//! Algorithm, prompt of `n` tokens, blocks of `B`, on instance `i` with queued uncached prompt
//! tokens `q_i`, local hit `L_i`, global-tier hit `G`, in-flight prompt tokens `a_i`:
//! * device blocks `d_i = min(L_i, n)/B`, host blocks `h_i = max(min(T_i, n) − min(L_i, n), 0)/B`
//!   with `T_i = max(H_i, G)` the off-GPU hit `i` can load (its own host pool's `H_i`, which
//!   Dynamo credits to the pod that offloaded it, or the shared tier's, §2.8): the tier's hit
//!   beyond what the instance holds, so no block is credited twice;
//! * raw prefill blocks `(q_i + n)/B` — Dynamo subtracts the cached tokens from the prompt and
//!   adds them back, so the raw term ignores the cache and all credit comes after, per tier;
//! * `cost_i = w · max(0, raw − (d_i + 0.75 · h_i)) + a_i/B`, argmin, ties at random;
//!   `w` is `linear_prefill_weight` (Dynamo's `prefill_load_scale`, 1 by default), 0.75 is
//!   Dynamo's `host_cache_hit_weight`: a block fetched from the host tier still costs a quarter
//!   of a fresh one. Dynamo's overlap decay and active-request weight default to off and are
//!   left out.
//!
//! Invariants: no state; the float operations run in one fixed order so the Python reference
//! finds the same ties.
//!
//! Complexity: O(N).

use super::{Policy, Reason, Selection, SelectionInput, argmin};

/// Credit of a block the host (global) tier holds, relative to a device (GPU) block.
const HOST_HIT_CREDIT: f64 = 0.75;

/// Dynamo's tiered cost.
#[derive(Debug, Default)]
pub struct DynamoHostTier;

impl Policy for DynamoHostTier {
    fn name(&self) -> &'static str {
        "dynamo_host_tier"
    }

    fn select(&self, input: &SelectionInput<'_>) -> Selection {
        let c = input.candidates;
        let (w, b) = (input.config.linear_prefill_weight, f64::from(input.block_size));
        let n = input.num_tokens;
        let index = argmin(c.len(), input.rng, |i| {
            let device = c[i].local_hit_tokens.min(n);
            let host = c[i]
                .tier_hit_tokens(input.global_hit_tokens)
                .min(n)
                .saturating_sub(device);
            let raw = (c[i].queued + n) as f64 / b;
            let credit = device as f64 / b + HOST_HIT_CREDIT * (host as f64 / b);
            w * (raw - credit).max(0.0) + c[i].active as f64 / b
        });
        Selection {
            index,
            reason: Reason::DynamoHostTier,
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
    fn host_tier_hits_cost_a_quarter_of_a_block() {
        let (cfg, rng) = (RouterConfig::default(), DrawCounter::new(0));
        // 1,600 tokens (100 blocks), the tier holds 1,280 (80 blocks).
        // 0: holds 640 locally, 320 queued: raw 120 − (40 + 0.75·40) = 50 blocks.
        // 1: holds nothing, idle but 640 tokens in flight: raw 100 − 0.75·80 = 40, + 40 = 80.
        // 2: holds 1,280, 800 queued: raw 150 − 80 = 70.
        let mut c = [cand(0, 640, 1, 320), cand(1, 0, 1, 0), cand(2, 1_280, 1, 800)];
        c[1].active = 640;
        let mut sel = input(&c, 1_600, false, &cfg, &rng);
        sel.global_hit_tokens = 1_280;
        let s = DynamoHostTier.select(&sel);
        assert_eq!((s.index, s.reason), (0, Reason::DynamoHostTier));
        // Without the tier instance 1 pays its whole prompt: 100 + 40 = 140; 0: 120 − 40 = 80;
        // 2: 70 → instance 2.
        sel.global_hit_tokens = 0;
        assert_eq!(DynamoHostTier.select(&sel).index, 2);
        assert_eq!(rng.draws(), 0);
    }
}
