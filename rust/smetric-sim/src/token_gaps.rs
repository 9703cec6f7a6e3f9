//! Tail token gaps: Mooncake's TBT (FAST'25), the mean of the longest 10% of a request's
//! inter-token gaps. A mean TPOT spreads a stall (a preemption, a synchronous KV load that
//! holds the batch) over the whole output; the tail keeps it.
//!
//! A request with `m` output tokens has `m − 1` gaps (first token excluded, as for TPOT) and
//! a tail of `k = ⌈(m − 1) / 10⌉` gaps. The output length is known when the request starts
//! (the trace fixes it), so `k` is too, and the tail is exactly the `k` largest gaps seen: a
//! min-heap of `k` gaps, where a new gap replaces the smallest kept one when it is larger.
//! Nothing else is kept: memory is `4·k` bytes per request *in flight* (a tenth of its gaps,
//! released when it finishes; its KV block list is already larger), and a gap costs O(1) when
//! it does not enter the tail (the common case: most gaps are one decode step) and O(log k)
//! when it does.
//!
//! The only approximation is storage: gaps are kept as `f32` (relative error ≤ 2⁻²⁴ each), summed
//! in `f64`. Positive `f32`s order like their bit patterns, so the heap holds `u32`s.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// The tail is the longest `1 / TAIL_DIVISOR` of a request's gaps (a tenth), rounded up.
pub const TAIL_DIVISOR: usize = 10;

/// Tail size for a request with `output_tokens` output tokens (0 when it has no gap).
pub fn tail_len(output_tokens: u32) -> usize {
    (output_tokens.saturating_sub(1) as usize).div_ceil(TAIL_DIVISOR)
}

/// One request's running tail.
#[derive(Clone, Debug, Default)]
struct Tail {
    last_s: f64,
    tokens: u32,
    keep: usize,
    largest: BinaryHeap<Reverse<u32>>,
}

/// Every request's running tail, indexed by request.
#[derive(Clone, Debug, Default)]
pub(crate) struct TokenGaps {
    tails: Vec<Tail>,
}

impl TokenGaps {
    /// Room for `requests` requests.
    pub fn new(requests: usize) -> Self {
        Self {
            tails: vec![Tail::default(); requests],
        }
    }

    /// Request `r` (of `output_tokens` output tokens) sampled a token at `now`.
    pub fn on_token(&mut self, r: u32, output_tokens: u32, now: f64) {
        let t = &mut self.tails[r as usize];
        if t.tokens > 0 {
            let gap = Reverse(((now - t.last_s).max(0.0) as f32).to_bits());
            if t.largest.len() < t.keep {
                t.largest.push(gap);
            } else if let Some(mut smallest) = t.largest.peek_mut() {
                // `Reverse` makes the heap's top the smallest kept gap.
                if gap < *smallest {
                    *smallest = gap;
                }
            }
        } else {
            t.keep = tail_len(output_tokens);
            t.largest.reserve_exact(t.keep);
        }
        t.tokens += 1;
        t.last_s = now;
    }

    /// Request `r` finished: its tail TBT in seconds (`None` with fewer than two tokens). Frees
    /// its tail.
    pub fn finish(&mut self, r: u32) -> Option<f64> {
        let t = std::mem::take(&mut self.tails[r as usize]);
        if t.largest.is_empty() {
            return None;
        }
        let sum: f64 = t.largest.iter().map(|g| f64::from(f32::from_bits(g.0))).sum();
        Some(sum / t.largest.len() as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The definition, computed the obvious way: sort every gap, average the top tenth.
    fn exact(times: &[f64]) -> Option<f64> {
        let mut gaps: Vec<f64> = times.windows(2).map(|w| w[1] - w[0]).collect();
        if gaps.is_empty() {
            return None;
        }
        gaps.sort_by(|a, b| b.total_cmp(a));
        let k = tail_len(times.len() as u32);
        Some(gaps[..k].iter().sum::<f64>() / k as f64)
    }

    fn tracked(times: &[f64]) -> Option<f64> {
        let mut g = TokenGaps::new(1);
        for &t in times {
            g.on_token(0, times.len() as u32, t);
        }
        g.finish(0)
    }

    #[test]
    fn tail_sizes() {
        assert_eq!([0, 1, 2, 11, 12, 31, 32, 101].map(tail_len), [0, 0, 1, 1, 2, 3, 4, 10]);
    }

    #[test]
    fn matches_the_exact_tail_on_random_streams() {
        // Decode-like streams: mostly one step (20–40 ms), now and then a stall of up to 3 s.
        let mut state = 0x2545_F491_4F6C_DD1D_u64;
        let mut uniform = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 11) as f64 / (1u64 << 53) as f64
        };
        let mut worst = 0.0_f64;
        for case in 0..300 {
            let tokens = 1 + (uniform() * if case % 10 == 0 { 5000.0 } else { 300.0 }) as usize;
            let mut now = uniform() * 100.0;
            let times: Vec<f64> = (0..tokens)
                .map(|_| {
                    now += 0.02 + 0.02 * uniform() + if uniform() < 0.02 { 3.0 * uniform() } else { 0.0 };
                    now
                })
                .collect();
            match (exact(&times), tracked(&times)) {
                (None, None) => assert_eq!(tokens, 1),
                (Some(want), Some(got)) => worst = worst.max((got - want).abs() / want),
                other => panic!("case {case}: {other:?}"),
            }
        }
        // Each gap is rounded to f32 once (≤ 2^-24 ≈ 6e-8 relative); nothing else differs.
        assert!(worst < 1e-7, "worst relative error {worst:e}");
        eprintln!("tail TBT vs exact: worst relative error {worst:e} over 300 streams");
    }

    #[test]
    fn a_stall_dominates_the_tail_but_not_the_mean() {
        // 21 tokens 10 ms apart except one 1 s stall: 20 gaps, tail of 2 = (1 s + 10 ms) / 2.
        let mut times: Vec<f64> = (0..21).map(|k| f64::from(k) * 0.01).collect();
        for t in &mut times[10..] {
            *t += 0.99;
        }
        let tail = tracked(&times).unwrap();
        assert!((tail - 0.505).abs() < 1e-6, "{tail}");
        let tpot = (times[20] - times[0]) / 20.0;
        assert!(tpot < 0.06, "the mean gap hides it: {tpot}");
    }

    #[test]
    fn finishing_frees_and_resets() {
        let mut g = TokenGaps::new(2);
        g.on_token(1, 1, 5.0);
        assert_eq!(g.finish(1), None, "one token, no gap");
        for (k, t) in [1.0, 1.5, 1.7].into_iter().enumerate() {
            g.on_token(0, 3, t);
            assert_eq!(g.tails[0].tokens as usize, k + 1);
        }
        assert!((g.finish(0).unwrap() - 0.5).abs() < 1e-6);
        assert_eq!(g.tails[0].largest.capacity(), 0);
        assert_eq!(g.finish(0), None);
    }
}
