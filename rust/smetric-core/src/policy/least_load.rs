//! `least_load`: vLLM's data-parallel load balancer, `argmin 4·waiting + running`
//! (`vllm/v1/engine/core_client.py`, DPLBAsyncMPClient). Not prefix-aware: it spreads work
//! and throws local KV$ away. O(N).

use super::{Policy, Reason, Selection, SelectionInput, argmin};

/// vLLM's DP balancer.
#[derive(Debug, Default)]
pub struct LeastLoad;

impl Policy for LeastLoad {
    fn name(&self) -> &'static str {
        "least_load"
    }

    fn select(&self, input: &SelectionInput<'_>) -> Selection {
        let c = input.candidates;
        let index = argmin(c.len(), input.rng, |i| (4 * c[i].waiting + c[i].bs) as f64);
        Selection {
            index,
            reason: Reason::LeastLoad,
        }
    }
}
