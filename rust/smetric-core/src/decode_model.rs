//! The fleet's decode pace, learned online: seconds per output token against the context in
//! flight on the instance that decodes (`RouterConfig::smetric_tpot_budget_s`).
//!
//! Algorithm: a decode step reads the KV of every request in its batch, so a stream's pace (its
//! TPOT) grows with the context in flight on its instance: `pace ≈ t0 + κ · A`, `A` the
//! instance's in-flight prompt tokens (the load board's `active`, peers' included). Each
//! finished stream is one sample: its pace `(finish − first token) / (output − 1)` — what the
//! lifecycle calls a deployment already makes give (`on_prefilled`, `on_finished` with the
//! output length) — against the mean of `A` at its first token and at its finish; streams of
//! fewer than [`MIN_OUTPUT_TOKENS`] are not samples. The fit is
//! least squares with exponential forgetting (a new sample weighs `1/WINDOW` of the sums, so
//! the fit follows a drifting fleet), one fit for the fleet: a deployment's instances share the
//! model and the hardware, and per-instance fits would learn N times slower. Chunked prefills
//! that share a stream's steps are in its pace, so the fit carries their average cost. A
//! candidate's prediction is `t0 + κ · (A_i + n)`: its pace with the request's `n` tokens added.
//!
//! Invariants: no prediction before [`MIN_SAMPLES`] samples, nor while the samples' `A` has
//! no spread (κ undetermined); κ and t0 are clamped non-negative, so a noisy fit never predicts
//! a pace that falls as context grows; a prediction is finite.
//!
//! Complexity: O(1) per sample under a mutex (on the lifecycle path, never the decision's);
//! a prediction reads two published atomics.

use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

/// Samples the sums remember: each new one weighs `1/WINDOW` of them.
const WINDOW: f64 = 256.0;
/// Samples before the fit predicts.
pub const MIN_SAMPLES: u64 = 16;
/// Output tokens a stream needs to be a sample: a shorter one's pace is a few steps, one of
/// which may have carried a long prefill chunk (0.1 s and more), not its batch's pace.
pub const MIN_OUTPUT_TOKENS: u64 = 16;
/// `f64` bits marking "no fit yet" (a NaN no fit publishes).
const NONE: u64 = u64::MAX;

/// Exponentially weighted sums of the samples `(x = A, y = pace)`.
#[derive(Debug, Default)]
struct Sums {
    w: f64,
    x: f64,
    y: f64,
    xx: f64,
    xy: f64,
    samples: u64,
}

/// The fleet's learned decode pace against in-flight context.
#[derive(Debug)]
pub struct DecodeModel {
    sums: Mutex<Sums>,
    /// `(t0, κ)` as `f64` bits, or [`NONE`] while there is no fit.
    t0_bits: AtomicU64,
    kappa_bits: AtomicU64,
}

impl Default for DecodeModel {
    fn default() -> Self {
        Self {
            sums: Mutex::new(Sums::default()),
            t0_bits: AtomicU64::new(NONE),
            kappa_bits: AtomicU64::new(NONE),
        }
    }
}

impl DecodeModel {
    /// A stream decoded at `pace_s` seconds per output token while `context_tokens` were in
    /// flight on its instance. Non-finite or negative inputs are ignored.
    pub fn record(&self, context_tokens: f64, pace_s: f64) {
        if !(context_tokens.is_finite() && pace_s.is_finite() && context_tokens >= 0.0 && pace_s >= 0.0) {
            return;
        }
        let mut s = self.sums.lock();
        let keep = 1.0 - 1.0 / WINDOW;
        s.w = s.w * keep + 1.0;
        s.x = s.x * keep + context_tokens;
        s.y = s.y * keep + pace_s;
        s.xx = s.xx * keep + context_tokens * context_tokens;
        s.xy = s.xy * keep + context_tokens * pace_s;
        s.samples += 1;
        let fit = (s.samples >= MIN_SAMPLES).then(|| fit(&s)).flatten();
        drop(s);
        let (t0, kappa) = fit.map_or((NONE, NONE), |(t0, k)| (t0.to_bits(), k.to_bits()));
        self.t0_bits.store(t0, Ordering::Relaxed);
        self.kappa_bits.store(kappa, Ordering::Relaxed);
    }

    /// The predicted pace, seconds per output token, of a stream decoding beside
    /// `context_tokens` of in-flight context; `None` until the fit exists.
    pub fn predict(&self, context_tokens: f64) -> Option<f64> {
        self.fit().map(|fit| fit.pace_at(context_tokens))
    }

    /// The current fit, if any. (Its two halves are published one after the other: a reader
    /// racing a sample may pair a new `t0` with the previous `κ`, both from valid fits.)
    pub fn fit(&self) -> Option<PaceFit> {
        let (t0, kappa) = (
            self.t0_bits.load(Ordering::Relaxed),
            self.kappa_bits.load(Ordering::Relaxed),
        );
        (t0 != NONE && kappa != NONE).then(|| PaceFit {
            t0: f64::from_bits(t0),
            kappa: f64::from_bits(kappa),
        })
    }
}

/// A fit of the decode pace: `t0 + κ · context`, both non-negative.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PaceFit {
    /// Seconds per output token with no context in flight.
    pub t0: f64,
    /// Seconds per output token per in-flight context token.
    pub kappa: f64,
}

impl PaceFit {
    /// The pace beside `context_tokens` of in-flight context, seconds per output token.
    pub fn pace_at(self, context_tokens: f64) -> f64 {
        self.t0 + self.kappa * context_tokens.max(0.0)
    }
}

/// Weighted least squares of the sums: `(t0, κ)` clamped non-negative, or `None` when the
/// samples' contexts have (relatively) no spread.
fn fit(s: &Sums) -> Option<(f64, f64)> {
    let det = s.w * s.xx - s.x * s.x;
    // The spread of the contexts, relative to their size: below it κ is noise.
    if det.is_nan() || det <= 1e-9 * s.w * s.xx {
        return None;
    }
    let kappa = ((s.w * s.xy - s.x * s.y) / det).max(0.0);
    let t0 = ((s.y - kappa * s.x) / s.w).max(0.0);
    (t0.is_finite() && kappa.is_finite()).then_some((t0, kappa))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn learns_a_linear_pace_and_predicts_it() {
        let m = DecodeModel::default();
        // 5 ms a step plus 50 ns a token of context.
        for i in 0..64u32 {
            let a = f64::from(i % 16) * 20_000.0;
            assert!(m.fit().is_none() || u64::from(i) >= MIN_SAMPLES);
            m.record(a, 0.005 + 50e-9 * a);
        }
        let PaceFit { t0, kappa } = m.fit().expect("a fit after 64 samples");
        assert!(
            (t0 - 0.005).abs() < 1e-9 && (kappa - 50e-9).abs() < 1e-15,
            "{t0} {kappa}"
        );
        let p = m.predict(300_000.0).expect("fit");
        assert!((p - 0.020).abs() < 1e-9, "{p}");
    }

    #[test]
    fn no_prediction_before_enough_samples_or_without_spread() {
        let m = DecodeModel::default();
        for _ in 0..(MIN_SAMPLES - 1) {
            m.record(f64::from(7u32) * 1000.0, 0.01);
        }
        assert_eq!(m.predict(1000.0), None, "too few samples");
        m.record(7000.0, 0.01);
        assert_eq!(m.predict(1000.0), None, "every sample at one context: κ undetermined");
        m.record(20_000.0, 0.02);
        assert!(m.predict(1000.0).is_some(), "two contexts: a fit");
    }

    #[test]
    fn a_fit_never_predicts_a_pace_that_falls_with_context() {
        let m = DecodeModel::default();
        for i in 0..32u32 {
            let a = f64::from(i) * 10_000.0;
            m.record(a, (0.05 - 1e-7 * a).max(0.0));
        }
        let PaceFit { t0, kappa } = m.fit().expect("fit");
        assert!(kappa >= 0.0 && t0 >= 0.0);
        assert!(m.predict(1e6).expect("fit") >= m.predict(0.0).expect("fit"));
        m.record(f64::NAN, 0.01);
        m.record(1.0, -1.0);
        assert!(m.fit().is_some(), "bad samples are ignored");
    }

    #[test]
    fn forgets_an_old_regime() {
        let m = DecodeModel::default();
        for i in 0..512u32 {
            let a = f64::from(i % 8) * 40_000.0;
            m.record(a, 0.010 + 20e-9 * a);
        }
        for i in 0..2048u32 {
            let a = f64::from(i % 8) * 40_000.0;
            m.record(a, 0.004 + 60e-9 * a);
        }
        let PaceFit { t0, kappa } = m.fit().expect("fit");
        assert!(
            (t0 - 0.004).abs() < 1e-4 && (kappa - 60e-9).abs() < 1e-9,
            "{t0} {kappa}"
        );
    }
}
