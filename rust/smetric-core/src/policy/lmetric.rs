//! `lmetric`: `argmin max(queued + new, 1) · (bs + 1)` (LMetric, arXiv 2603.15202; the
//! deployed blitz-router form). `queued` is the instance's backlog of uncached prompt
//! tokens, `new` this request's uncached tokens there, `bs` its batch size. The product
//! cancels units and weights; `+1` keeps idle instances comparable, and `max(·, 1)` stops a
//! fully cached instance from winning whatever its batch (the degenerate case the paper
//! warns about). O(N).

use super::{Policy, Reason, Selection, SelectionInput, argmin};

/// LMetric's multiplicative score.
#[derive(Debug, Default)]
pub struct Lmetric;

impl Policy for Lmetric {
    fn name(&self) -> &'static str {
        "lmetric"
    }

    fn select(&self, input: &SelectionInput<'_>) -> Selection {
        let c = input.candidates;
        let n = input.num_tokens;
        let index = argmin(c.len(), input.rng, |i| {
            let new = n - c[i].local_hit_tokens.min(n);
            ((c[i].queued + new) as f64).max(1.0) * (c[i].bs + 1) as f64
        });
        Selection {
            index,
            reason: Reason::Lmetric,
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
    fn trades_hit_against_batch() {
        let (cfg, rng) = (RouterConfig::default(), DrawCounter::new(0));
        // Instance 0 caches 900 of 1000 tokens but runs 9 requests: 100·10 = 1000.
        // Instance 1 caches nothing and runs 0: 1000·1 = 1000 → tie; instance 2 has 1 request: 2000.
        let c = [cand(0, 900, 9, 0), cand(1, 0, 0, 0), cand(2, 0, 1, 0)];
        let s = Lmetric.select(&input(&c, 1000, false, &cfg, &rng));
        assert!(s.index < 2);
        let c = [cand(0, 900, 8, 0), cand(1, 0, 0, 0)];
        assert_eq!(Lmetric.select(&input(&c, 1000, false, &cfg, &rng)).index, 0);
    }
}
