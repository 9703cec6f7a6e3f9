//! `linear`: NVIDIA Dynamo's KV router cost at temperature 0,
//! `argmin w·(queued + new prefill tokens)/B + active tokens/B`: prefill blocks weighted by
//! `linear_prefill_weight` plus decode blocks. A linear combination whose weight must be
//! tuned per workload — the thing LMetric's product avoids. O(N).

use super::{Policy, Reason, Selection, SelectionInput, argmin};

/// Dynamo's linear cost.
#[derive(Debug, Default)]
pub struct Linear;

impl Policy for Linear {
    fn name(&self) -> &'static str {
        "linear"
    }

    fn select(&self, input: &SelectionInput<'_>) -> Selection {
        let c = input.candidates;
        let (w, b) = (input.config.linear_prefill_weight, f64::from(input.block_size));
        let n = input.num_tokens;
        let index = argmin(c.len(), input.rng, |i| {
            let new = n - c[i].local_hit_tokens.min(n);
            w * (c[i].queued + new) as f64 / b + c[i].active as f64 / b
        });
        Selection {
            index,
            reason: Reason::Linear,
        }
    }
}
