//! A per-instance cost of loading a prompt's prefix from the shared KV$ store, learned online
//! from first-token latencies (`smetric` v2's fetch pricing, `smetric_learn_fetch_cost`).
//!
//! Why: with store pricing, v2 prices a shared-store hit as free and the v1 rule at a fixed
//! `global_fetch_cost` (0.27 prefilled-token equivalents per token: a BF16 30B model's KV over
//! LMCache's Mooncake backend, perf-model §4). What a fetched token really costs depends on the
//! deployment: the KV's bytes per token (FP8 halves them), the path (a synchronous load stalls
//! the step that admits the request, an asynchronous one only the request) and the engine's
//! prefill speed. The router sees every request's routing and first-token times, so it can
//! measure it.
//!
//! Algorithm: a request routed to instance `i` with `F` tokens to load from the store (the
//! store's hit past `i`'s own), `W` work to compute (cold-token equivalents, `prefill_work`)
//! and `A` work queued ahead of it, whose first token came `T` seconds after routing, drained
//! `A + W` at `i`'s rate `R` and loaded `F`: one sample is the residual per loaded token,
//! `(T·R − A − W) / F`, clamped to `[0, MAX_FETCH_COST]` (in work units per token, the unit
//! the rule prices work in). A sample is taken only where it says something about the load:
//! `F` is at least [`MIN_FETCHED_SHARE`] of the prompt and the queue ahead is no larger than
//! the request's own work (`A ≤ W + c·F`, `c` the cost charged), so that the rate's error on
//! the queue does not swamp the residual. Each instance publishes the **median** of its last
//! `window` samples once it holds `min_samples` (the drain rate's window and count,
//! [`MedianWindow`]); until then the caller's fallback (`global_fetch_cost`) is used.
//!
//! What the residual holds besides the load itself: anything that grows with a fetching
//! request and not with the others (a frontend's per-token time on a long prompt whose
//! compute is short). The rate is learned from the same requests (`drain_rate.rs`) with the
//! fetch charged at the cost published then, so the two are read together: when every request
//! fetches the same share of its prompt, the data cannot tell a slower rate from a dearer
//! fetch, and the cost stays near where it started.
//!
//! Invariants: the published cost is finite and in `[0, MAX_FETCH_COST]`, or absent; a sample
//! never blocks a decision (decisions read one atomic; samples take the instance's own small
//! mutex, never the index's).
//!
//! Complexity: `record` O(window · log window), once per first token of a request that
//! fetched; `cost_or` O(1), one relaxed load.

use crate::drain_rate::MedianWindow;

/// The least share of its prompt a request must load from the store to give a sample.
pub const MIN_FETCHED_SHARE: f64 = 0.25;
/// The largest cost a sample may say, work units per loaded token: a load eight times dearer
/// than computing the token is a measurement gone wrong (a preemption, a stall), not a path.
pub const MAX_FETCH_COST: f64 = 8.0;

/// What one request's first token says about its instance's fetch cost.
#[derive(Debug, Clone, Copy)]
pub struct FetchSample {
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// Tokens loaded from the shared store.
    pub fetched_tokens: u64,
    /// Work computed (cold-token equivalents, the fetch not included).
    pub computed_work: u64,
    /// The fetch's work as charged at routing.
    pub fetch_work: u64,
    /// Work queued ahead at routing.
    pub work_ahead: u64,
    /// Seconds from routing to the first token.
    pub elapsed_s: f64,
    /// The instance's drain rate, work units per second.
    pub rate: f64,
}

impl FetchSample {
    /// The residual per loaded token, or `None` where the request says nothing about the load
    /// (too little fetched, too much queued ahead, no time measured, no rate).
    pub fn cost(&self) -> Option<f64> {
        let fetched = self.fetched_tokens as f64;
        if self.fetched_tokens == 0
            || fetched < MIN_FETCHED_SHARE * self.prompt_tokens as f64
            || self.work_ahead > self.computed_work + self.fetch_work
            || !(self.elapsed_s > 0.0 && self.rate.is_finite() && self.rate > 0.0)
        {
            return None;
        }
        let residual = self.elapsed_s * self.rate - self.work_ahead as f64 - self.computed_work as f64;
        Some((residual / fetched).clamp(0.0, MAX_FETCH_COST))
    }
}

/// One instance's learned fetch cost.
#[derive(Debug, Default)]
pub struct FetchCost {
    cost: MedianWindow,
}

impl FetchCost {
    /// Records `sample` if it says something about the load; keeps the last `window` and
    /// publishes their median once there are `min_samples`. Returns whether it was taken.
    pub fn record(&self, sample: &FetchSample, window: usize, min_samples: usize) -> bool {
        let Some(cost) = sample.cost() else { return false };
        self.cost.record(cost, window, min_samples);
        true
    }

    /// The learned cost, or `fallback` while too few samples came in.
    #[inline]
    pub fn cost_or(&self, fallback: f64) -> f64 {
        self.cost.or(fallback)
    }

    /// The learned cost, if enough samples came in.
    pub fn learned(&self) -> Option<f64> {
        self.cost.learned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::DrawCounter;

    fn sample(fetched: u64, computed: u64, ahead: u64, elapsed_s: f64) -> FetchSample {
        FetchSample {
            prompt_tokens: 40_000,
            fetched_tokens: fetched,
            computed_work: computed,
            fetch_work: 0,
            work_ahead: ahead,
            elapsed_s,
            rate: 20_000.0,
        }
    }

    // The costs compared are exact: small integers over powers of two.
    #[allow(clippy::float_cmp)]
    #[test]
    fn a_sample_is_the_residual_per_loaded_token() {
        // 32,000 fetched, 4,000 computed, 2,000 ahead: 6,000 work at 20,000/s is 0.3 s; the
        // request took 0.7 s, so the load took 0.4 s = 8,000 work, 0.25 a token.
        assert_eq!(sample(32_000, 4_000, 2_000, 0.7).cost(), Some(0.25));
        // Faster than the rate says: the load was free, not negative.
        assert_eq!(sample(32_000, 4_000, 2_000, 0.1).cost(), Some(0.0));
        // A stall far beyond any path is clamped.
        assert_eq!(sample(32_000, 4_000, 2_000, 100.0).cost(), Some(MAX_FETCH_COST));
    }

    #[test]
    fn requests_that_say_nothing_about_the_load_give_no_sample() {
        assert_eq!(sample(0, 4_000, 0, 0.7).cost(), None, "nothing fetched");
        assert_eq!(
            sample(9_999, 4_000, 0, 0.7).cost(),
            None,
            "under a quarter of the prompt"
        );
        assert!(sample(10_000, 4_000, 0, 0.7).cost().is_some(), "a quarter exactly");
        assert_eq!(
            sample(32_000, 4_000, 4_001, 0.7).cost(),
            None,
            "more queued ahead than its own work"
        );
        assert_eq!(sample(32_000, 4_000, 0, 0.0).cost(), None, "no time measured");
        let no_rate = FetchSample {
            rate: 0.0,
            ..sample(32_000, 4_000, 0, 0.7)
        };
        assert_eq!(no_rate.cost(), None);
        let charged = FetchSample {
            fetch_work: 8_000,
            ..sample(32_000, 4_000, 12_000, 1.0)
        };
        assert!(
            charged.cost().is_some(),
            "the fetch's charge counts as the request's own work"
        );
    }

    /// A known cost of 0.1 work a token, observed through first tokens inflated by up to a
    /// second on a third of the requests (a preemption, a frontend stall) and with queues
    /// drained early on a tenth: the median lands within 0.01 of the truth; a mean would not.
    #[test]
    fn learns_a_known_cost_despite_outliers() {
        const RATE: f64 = 20_000.0;
        const TRUE_COST: f64 = 0.1;
        let (f, rng) = (FetchCost::default(), DrawCounter::new(5));
        assert_eq!(f.learned(), None);
        let mut mean = 0.0;
        let mut taken = 0;
        for k in 0..300u64 {
            let n = 8_000 + rng.pick(60_000) as u64;
            let fetched = n / 2 + rng.pick((n / 2) as usize) as u64;
            let computed = n - fetched;
            let ahead = rng.pick(computed as usize) as u64;
            let mut elapsed = (ahead as f64 + computed as f64 + TRUE_COST * fetched as f64) / RATE;
            if k % 3 == 0 {
                elapsed += rng.pick(1000) as f64 / 1000.0;
            } else if k % 10 == 1 {
                elapsed -= ahead as f64 / RATE;
            }
            let s = FetchSample {
                prompt_tokens: n,
                fetched_tokens: fetched,
                computed_work: computed,
                fetch_work: 0,
                work_ahead: ahead,
                elapsed_s: elapsed,
                rate: RATE,
            };
            if f.record(&s, 64, 8) {
                taken += 1;
                mean += s.cost().unwrap_or(0.0);
            }
        }
        let learned = f.learned().expect("enough samples");
        assert!((learned - TRUE_COST).abs() < 0.01, "learned {learned}");
        assert!(
            (mean / f64::from(taken) - TRUE_COST).abs() > 0.05,
            "the outliers must matter to a mean: {}",
            mean / f64::from(taken)
        );
    }

    // A fallback is returned as given.
    #[allow(clippy::float_cmp)]
    #[test]
    fn the_fallback_until_enough_samples() {
        let f = FetchCost::default();
        for _ in 0..7 {
            assert!(f.record(&sample(32_000, 4_000, 0, 0.7), 64, 8));
            assert_eq!(f.cost_or(0.27), 0.27);
        }
        assert!(f.record(&sample(32_000, 4_000, 0, 0.7), 64, 8));
        assert_eq!(f.cost_or(0.27), 0.3125, "(0.7·20,000 − 4,000) / 32,000");
    }
}
