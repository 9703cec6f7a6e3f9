//! `cache_first`: the Bailian production scheduler (algorithms.md §1.4, blitz-router
//! `bailian-impl`). Three indicators are min-max normalised over the fleet — hit % (higher
//! is better), batch size and active tokens (lower is better) — and combined as
//! `p = α·hit + β·batch + γ·tokens` (default 0.7/0.15/0.15). The deployed scheduler samples an
//! instance with probability `p / Σp`; `argmax` takes the highest `p` (the deterministic run of
//! blitz-router's artifact); `max_hit` takes the most local hit tokens, ties to the smallest batch. Either way the shared system prompt of agent first
//! turns pulls sessions onto the instances that already hold it. O(N).

use super::{Reason, Selection, SelectionInput, argmin_by};
use crate::config::CacheFirstMode;

/// Normalisation floor of a min-max range, as deployed.
const RANGE_FLOOR: f64 = 1e-6;

/// The Bailian production scheduler.
#[derive(Debug, Default)]
pub struct CacheFirst;

fn min_max(values: impl Iterator<Item = f64> + Clone) -> (f64, f64) {
    let lo = values.clone().fold(f64::INFINITY, f64::min);
    let hi = values.fold(f64::NEG_INFINITY, f64::max);
    (lo, hi)
}

impl CacheFirst {
    /// The normalised score `p_i = α·hit + β·batch + γ·tokens` of every candidate.
    fn scores(input: &SelectionInput<'_>) -> Vec<f64> {
        let c = input.candidates;
        let n = input.num_tokens.max(1) as f64;
        let hit = |i: usize| c[i].local_hit_tokens as f64 / n;
        let (hit_lo, hit_hi) = min_max((0..c.len()).map(hit));
        let (bs_lo, bs_hi) = min_max(c.iter().map(|x| x.bs as f64));
        let (a_lo, a_hi) = min_max(c.iter().map(|x| x.active as f64));
        let (alpha, beta, gamma) = input.config.cache_first_weights;
        (0..c.len())
            .map(|i| {
                let n0 = ((hit(i) - hit_lo) / (hit_hi - hit_lo).max(RANGE_FLOOR)).clamp(0.0, 1.0);
                let n1 = ((bs_hi - c[i].bs as f64) / (bs_hi - bs_lo).max(RANGE_FLOOR)).clamp(0.0, 1.0);
                let n2 = ((a_hi - c[i].active as f64) / (a_hi - a_lo).max(RANGE_FLOOR)).clamp(0.0, 1.0);
                alpha * n0 + beta * n1 + gamma * n2
            })
            .collect()
    }

    fn weighted(input: &SelectionInput<'_>) -> Selection {
        let c = input.candidates;
        let p = Self::scores(input);
        let total = p.iter().fold(0.0, |acc, x| acc + x);
        let index = if total <= 0.0 {
            input.rng.pick(c.len())
        } else {
            let u = input.rng.uniform() * total;
            let mut sum = 0.0;
            p.iter()
                .position(|&x| {
                    sum += x;
                    sum > u
                })
                .unwrap_or(c.len() - 1)
        };
        Selection {
            index,
            reason: Reason::CacheFirstWeighted,
        }
    }

    fn argmax(input: &SelectionInput<'_>) -> Selection {
        let p = Self::scores(input);
        // argmax as argmin of −p: the same exact-equality ties.
        let index = super::argmin(p.len(), input.rng, |i| -p[i]);
        Selection {
            index,
            reason: Reason::CacheFirstArgmax,
        }
    }

    fn max_hit(input: &SelectionInput<'_>) -> Selection {
        let c = input.candidates;
        let best_hit = c.iter().map(|x| x.local_hit_tokens).max().unwrap_or(0);
        let index = argmin_by(
            c.len(),
            input.rng,
            |i| c[i].local_hit_tokens == best_hit,
            |i| c[i].bs as f64,
        )
        .unwrap_or(0);
        Selection {
            index,
            reason: Reason::CacheFirstMaxHit,
        }
    }
}

impl super::Policy for CacheFirst {
    fn name(&self) -> &'static str {
        "cache_first"
    }

    fn select(&self, input: &SelectionInput<'_>) -> Selection {
        match input.config.cache_first_mode {
            CacheFirstMode::Weighted => Self::weighted(input),
            CacheFirstMode::Argmax => Self::argmax(input),
            CacheFirstMode::MaxHit => Self::max_hit(input),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RouterConfig;
    use crate::policy::Policy;
    use crate::policy::test_support::{cand, input};
    use crate::rng::DrawCounter;

    #[test]
    fn weighted_prefers_hits() {
        let cfg = RouterConfig::default();
        let c = [cand(0, 900, 5, 0), cand(1, 0, 0, 0), cand(2, 0, 0, 0)];
        let mut wins = 0;
        for seed in 0..200 {
            let rng = DrawCounter::new(seed);
            wins += usize::from(CacheFirst.select(&input(&c, 1000, true, &cfg, &rng)).index == 0);
        }
        // p = (0.7, 0.15, 0.15) → P(0) = 0.7.
        assert!((120..160).contains(&wins), "{wins}");
    }

    #[test]
    fn max_hit_is_deterministic() {
        let cfg = RouterConfig {
            cache_first_mode: CacheFirstMode::MaxHit,
            ..RouterConfig::default()
        };
        let rng = DrawCounter::new(0);
        let c = [cand(0, 900, 5, 0), cand(1, 900, 2, 0), cand(2, 0, 0, 0)];
        assert_eq!(CacheFirst.select(&input(&c, 1000, true, &cfg, &rng)).index, 1);
        assert_eq!(rng.draws(), 0);
    }
}
