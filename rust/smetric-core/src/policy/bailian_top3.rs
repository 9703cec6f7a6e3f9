//! `bailian_top3`: Bailian's production scheduler as the SMetric paper's authors ported it for
//! their baselines (arXiv 2607.08565 v2 §evaluation; the port is
//! `python/ssched/scheduler/policy/baselines.py`, class `Ali`, "D2 tuned defaults
//! ali_a50b20k3", in `clateral912/smetric-router-repro`). Beside it, `cache_first` is the
//! min-max-normalised form of the same scheduler (blitz-router's `bailian-impl`), in three modes.
//!
//! Algorithm, prompt of `n` tokens, instance `i` with local hit `L_i` and `bs_i` requests in
//! flight:
//! * reuse `r_i = min(1, L_i/n)`; load `l_i = bs_i / max_j bs_j` (0 everywhere on an idle
//!   fleet), `l̄` its mean;
//! * weight `w_i = 2^(50·r_i + 20·(l̄ − l_i))`: every 2% of reuse doubles the odds, every 5% of
//!   load above the mean halves them;
//! * the three heaviest instances (ties in slot order) are kept and one is sampled with
//!   probability proportional to its weight. No session state.
//!
//! Invariants: no state; `2^x` is computed as `powf` to match Python's `**` (both libm; should
//! the compiler turn it into `exp2`, the two agree to an ulp, and a pick could only differ for a
//! draw within an ulp of a boundary); one draw per decision unless a single instance is kept.
//!
//! Complexity: O(N·K) with K = 3 (a selection of the top K, no sort, no allocation).

use super::{Policy, Reason, Selection, SelectionInput};

/// Exponent per unit of reuse (the authors' tuned α).
const REUSE_EXPONENT: f64 = 50.0;
/// Exponent per unit of load below the mean (the authors' tuned β).
const LOAD_EXPONENT: f64 = 20.0;
/// Instances kept for the weighted draw.
const TOP_K: usize = 3;

/// Bailian's production rule, the authors' port.
#[derive(Debug, Default)]
pub struct BailianTop3;

impl Policy for BailianTop3 {
    fn name(&self) -> &'static str {
        "bailian_top3"
    }

    fn select(&self, input: &SelectionInput<'_>) -> Selection {
        let c = input.candidates;
        let per_token = if input.num_tokens > 0 {
            1.0 / input.num_tokens as f64
        } else {
            0.0
        };
        let max_bs = c.iter().map(|x| x.bs).max().unwrap_or(0);
        let max_load = if max_bs == 0 { 1.0 } else { max_bs as f64 };
        let load = |i: usize| c[i].bs as f64 / max_load;
        let mean = (0..c.len()).fold(0.0, |acc, i| acc + load(i)) / c.len() as f64;
        let weight = |i: usize| {
            let reuse = (c[i].local_hit_tokens as f64 * per_token).min(1.0);
            2f64.powf(REUSE_EXPONENT * reuse + LOAD_EXPONENT * (mean - load(i)))
        };
        // The top K by weight, ties to the lower slot (a stable descending sort's first K).
        let mut top = [usize::MAX; TOP_K];
        let kept = TOP_K.min(c.len());
        for k in 0..kept {
            let mut best = None;
            for i in (0..c.len()).filter(|i| !top[..k].contains(i)) {
                if best.is_none_or(|(_, w)| weight(i) > w) {
                    best = Some((i, weight(i)));
                }
            }
            top[k] = best.map_or(0, |(i, _)| i);
        }
        let index = if kept == 1 {
            top[0]
        } else {
            let total = top[..kept].iter().fold(0.0, |acc, &i| acc + weight(i));
            let u = input.rng.uniform() * total;
            let mut sum = 0.0;
            top[..kept]
                .iter()
                .copied()
                .find(|&i| {
                    sum += weight(i);
                    sum > u
                })
                .unwrap_or(top[kept - 1])
        };
        Selection {
            index,
            reason: Reason::BailianTop3,
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
    fn samples_the_top_three_by_reuse_and_load() {
        let cfg = RouterConfig::default();
        // 1,000 tokens. Loads 4/4, 0, 2/4, 2/4: mean 0.5.
        // 0: reuse 0.9, load 1   → 2^(45 − 10) = 2^35
        // 1: reuse 0,   load 0   → 2^10
        // 2: reuse 0.9, load 0.5 → 2^45
        // 3: reuse 0.1, load 0.5 → 2^5 (not in the top three)
        let c = [
            cand(0, 900, 4, 0),
            cand(1, 0, 0, 0),
            cand(2, 900, 2, 0),
            cand(3, 100, 2, 0),
        ];
        let mut counts = [0usize; 4];
        for seed in 0..2_000 {
            let rng = DrawCounter::new(seed);
            let s = BailianTop3.select(&input(&c, 1_000, false, &cfg, &rng));
            assert_eq!((rng.draws(), s.reason), (1, Reason::BailianTop3));
            counts[s.index] += 1;
        }
        // P(2) = 2^45 / (2^45 + 2^35 + 2^10) ≈ 0.99902; P(0) ≈ 0.00098; 3 never.
        assert_eq!(counts[3], 0);
        assert!(counts[2] >= 1_990, "{counts:?}");
        // Equal reuse and load everywhere: uniform over the first three slots.
        let even = [cand(0, 0, 1, 0), cand(1, 0, 1, 0), cand(2, 0, 1, 0), cand(3, 0, 1, 0)];
        let mut seen = [0usize; 4];
        for seed in 0..300 {
            let rng = DrawCounter::new(seed);
            seen[BailianTop3.select(&input(&even, 1_000, true, &cfg, &rng)).index] += 1;
        }
        assert_eq!(seen[3], 0, "ties keep the lower slots: {seen:?}");
        assert!(seen[..3].iter().all(|&k| k > 60), "{seen:?}");
        // A single instance takes no draw.
        let rng = DrawCounter::new(0);
        assert_eq!(BailianTop3.select(&input(&c[..1], 1_000, false, &cfg, &rng)).index, 0);
        assert_eq!(rng.draws(), 0);
    }
}
