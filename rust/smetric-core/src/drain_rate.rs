//! A per-instance prefill drain rate, learned online from first-token latencies (the v2
//! rule's `RATE`, in work units per second).
//!
//! Algorithm: when a request's first token comes out, the instance has, since the request
//! was routed, drained the work queued ahead of it plus its own: one sample is
//! `(work ahead at routing + own work) / (first-token time − routing time)`. Each instance
//! keeps its last `window` samples (a ring) and publishes their **median** once it holds at
//! least `min_samples`; before that, and for every instance when the config fixes a rate,
//! the caller uses its fallback ([`DrainRate::rate_or`]). The median is robust to the two
//! ways a sample goes wrong: a request that waited on something else than prefill (a
//! preemption, a chunked-prefill interleave, network or tokenisation time — rates too low)
//! and one whose queue was drained early by requests finishing out of order (too high).
//! Samples of zero elapsed time (below the router's millisecond clock) or zero work carry
//! no information and are skipped. On an idle instance a sample is the request's own
//! prefill rate plus overheads, so a lightly loaded fleet learns a slightly low rate: the
//! gate then errs towards "infeasible", which sends a follow-up to the least loaded
//! instance only if that one is feasible, else keeps it home.
//!
//! Beside it, for the `vllm_router_smetric` peer policy only, the estimator of vllm-router's
//! `smetric` (vllm-project/router PR #330, `src/policies/smetric.rs`): a sample is the request's
//! *own* work over the same elapsed time (the queue ahead is not counted, so a sample under load
//! is low), and the published rate is the **90th percentile** (`sorted[round((k − 1)·0.9)]`) of
//! the last [`PEER_WINDOW`] samples once there are [`PEER_MIN_SAMPLES`] — the high percentile
//! picks the samples taken when the instance was idle. Without one, that policy treats every
//! instance as meeting its budget, as vllm-router does.
//!
//! Invariants: the published rate is finite and > 0, or absent; a sample never blocks a
//! decision (decisions read one atomic; samples take the instance's own small mutex, never
//! the index mutex).
//!
//! Complexity: `record` O(window · log window) (sorting a copy of at most
//! `MAX_DRAIN_WINDOW` samples, once per first token), `record_own_work` O(64 · log 64);
//! `rate_or` and `peer_p90` O(1), one relaxed load.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

/// The bit pattern that means "no learned rate yet" (a NaN, never a published rate).
const NONE: u64 = u64::MAX;

/// vllm-router's `RATE_WINDOW`: own-work samples its p90 is taken over.
pub const PEER_WINDOW: usize = 64;
/// vllm-router's `RATE_MIN_SAMPLES`: samples before its p90 is published.
pub const PEER_MIN_SAMPLES: usize = 8;

/// The median of the last `window` samples of one quantity, published once there are
/// `min_samples` (the drain rate's estimator; the tier fetch's cost, `fetch_cost.rs`, learns
/// through one too). Recording takes the window's own mutex; reading is one relaxed load.
#[derive(Debug)]
pub struct MedianWindow {
    samples: Mutex<VecDeque<f64>>,
    published_bits: AtomicU64,
}

impl Default for MedianWindow {
    fn default() -> Self {
        Self {
            samples: Mutex::new(VecDeque::new()),
            published_bits: AtomicU64::new(NONE),
        }
    }
}

impl MedianWindow {
    /// Adds `sample`, keeping the last `window`, and publishes their median once there are
    /// `min_samples`.
    pub fn record(&self, sample: f64, window: usize, min_samples: usize) {
        let mut samples = self.samples.lock();
        samples.push_back(sample);
        while samples.len() > window.max(1) {
            samples.pop_front();
        }
        if samples.len() < min_samples.max(1) {
            return;
        }
        let median = median(samples.iter().copied());
        self.published_bits.store(median.to_bits(), Ordering::Relaxed);
    }

    /// The published median, if enough samples came in.
    #[inline]
    pub fn learned(&self) -> Option<f64> {
        match self.published_bits.load(Ordering::Relaxed) {
            NONE => None,
            bits => Some(f64::from_bits(bits)),
        }
    }

    /// The published median, or `fallback` while too few samples came in.
    #[inline]
    pub fn or(&self, fallback: f64) -> f64 {
        self.learned().unwrap_or(fallback)
    }
}

/// One instance's learned drain rate.
#[derive(Debug)]
pub struct DrainRate {
    rate: MedianWindow,
    own_work_samples: Mutex<VecDeque<f64>>,
    peer_bits: AtomicU64,
}

impl Default for DrainRate {
    fn default() -> Self {
        Self {
            rate: MedianWindow::default(),
            own_work_samples: Mutex::new(VecDeque::new()),
            peer_bits: AtomicU64::new(NONE),
        }
    }
}

impl DrainRate {
    /// Records that `work` units drained in `elapsed_ms` milliseconds, keeping the last
    /// `window` samples and publishing their median once there are `min_samples`.
    pub fn record(&self, work: u64, elapsed_ms: u64, window: usize, min_samples: usize) {
        if work == 0 || elapsed_ms == 0 {
            return;
        }
        self.rate
            .record(work as f64 * 1000.0 / elapsed_ms as f64, window, min_samples);
    }

    /// The learned rate, or `fallback` while too few samples came in.
    #[inline]
    pub fn rate_or(&self, fallback: f64) -> f64 {
        self.rate.or(fallback)
    }

    /// Records vllm-router's sample: the request's own `work` drained in `elapsed_ms`
    /// milliseconds; publishes the p90 of the last [`PEER_WINDOW`] once there are
    /// [`PEER_MIN_SAMPLES`].
    pub fn record_own_work(&self, work: u64, elapsed_ms: u64) {
        if work == 0 || elapsed_ms == 0 {
            return;
        }
        let mut samples = self.own_work_samples.lock();
        if samples.len() == PEER_WINDOW {
            samples.pop_front();
        }
        samples.push_back(work as f64 * 1000.0 / elapsed_ms as f64);
        if samples.len() < PEER_MIN_SAMPLES {
            return;
        }
        let mut sorted: Vec<f64> = samples.iter().copied().collect();
        sorted.sort_by(f64::total_cmp);
        let p90 = sorted[((sorted.len() - 1) as f64 * 0.9).round() as usize];
        self.peer_bits.store(p90.to_bits(), Ordering::Relaxed);
    }

    /// vllm-router's learned rate (the p90 of own-work samples), if enough came in.
    #[inline]
    pub fn peer_p90(&self) -> Option<f64> {
        match self.peer_bits.load(Ordering::Relaxed) {
            NONE => None,
            bits => Some(f64::from_bits(bits)),
        }
    }

    /// The learned rate, if enough samples came in.
    pub fn learned(&self) -> Option<f64> {
        self.rate.learned()
    }
}

/// The median of a non-empty sample: the middle value, or the mean of the two middle ones.
fn median(values: impl Iterator<Item = f64>) -> f64 {
    let mut v: Vec<f64> = values.collect();
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    if v.len() % 2 == 1 {
        v[mid]
    } else {
        f64::midpoint(v[mid - 1], v[mid])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::DrawCounter;

    // The rates compared are exact (a fallback returned as given, medians of exact samples).
    #[allow(clippy::float_cmp)]
    #[test]
    fn fallback_until_enough_samples() {
        let d = DrainRate::default();
        assert_eq!(d.rate_or(5.0), 5.0);
        d.record(1000, 100, 8, 3);
        d.record(1000, 100, 8, 3);
        assert_eq!(d.learned(), None);
        d.record(0, 100, 8, 3);
        d.record(1000, 0, 8, 3);
        assert_eq!(d.learned(), None, "empty samples are skipped");
        d.record(3000, 100, 8, 3);
        assert_eq!(d.learned(), Some(10_000.0));
    }

    /// A known rate of 20,000 work/s, observed through latencies inflated by up to 50 ms of
    /// overhead on a third of the requests and deflated by early drains on a tenth: the
    /// median lands within 2% of the truth, where the mean would not.
    #[test]
    fn learns_a_known_rate_despite_outliers() {
        const TRUE_RATE: f64 = 20_000.0;
        let (d, rng) = (DrainRate::default(), DrawCounter::new(3));
        let mut mean = 0.0;
        for k in 0..200u64 {
            let work = 2_000 + rng.pick(60_000) as u64;
            let mut ms = (work as f64 / TRUE_RATE * 1000.0).round() as u64;
            if k % 3 == 0 {
                ms += 50 + rng.pick(2000) as u64;
            } else if k % 10 == 1 {
                ms = (ms / 4).max(1);
            }
            mean += work as f64 * 1000.0 / ms as f64 / 200.0;
            d.record(work, ms, 64, 8);
        }
        let learned = d.learned().unwrap();
        assert!((learned / TRUE_RATE - 1.0).abs() < 0.02, "learned {learned}");
        assert!(
            (mean / TRUE_RATE - 1.0).abs() > 0.05,
            "the outliers must matter to a mean: {mean}"
        );
    }

    #[allow(clippy::float_cmp)]
    #[test]
    fn the_peer_estimator_is_the_p90_of_own_work_samples() {
        let d = DrainRate::default();
        for k in 1..=7u64 {
            d.record_own_work(k * 1000, 1000); // k·1,000 work/s
        }
        assert_eq!(d.peer_p90(), None);
        assert_eq!(d.learned(), None, "the two estimators are separate");
        d.record_own_work(8000, 1000);
        // 8 samples 1K..8K: index round(7·0.9) = round(6.3) = 6 → 7,000.
        assert_eq!(d.peer_p90(), Some(7000.0));
        for _ in 0..PEER_WINDOW {
            d.record_own_work(500, 1000);
        }
        assert_eq!(d.peer_p90(), Some(500.0), "the window holds the last 64 only");
    }

    #[test]
    fn the_window_forgets_old_samples() {
        let d = DrainRate::default();
        for _ in 0..10 {
            d.record(1000, 100, 4, 2); // 10,000/s
        }
        for _ in 0..3 {
            d.record(1000, 50, 4, 2); // 20,000/s
        }
        assert_eq!(d.learned(), Some(20_000.0), "3 of the 4 kept samples are new");
    }
}
