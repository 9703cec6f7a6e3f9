//! Live decodes' E2E contracts: what the `smetric` v2 decode mask protects
//! (`RouterConfig::smetric_decode_mask`, `policy/smetric_paper.rs`).
//!
//! The SMetric authors' shipped co-located configuration (`contract_safe: true`) lets a prefill
//! land on an instance only if its own service seconds fit inside the remaining budget of every
//! live decode there. A live decode `d` (routed, first token out, not finished) has the
//! contract `base + L_d / input_rate + out_d · tpot` seconds end to end (the
//! `smetric_contract_*` fields). Its *balance* is the stall it can still absorb:
//!
//! * honest (the authors' form, every term backward-looking): `base + L_d / input_rate +
//!   e_d · tpot − elapsed_d`, where `e_d` is the tokens emitted by now. A router does not see
//!   the stream, so `e_d` is estimated: `1 + (now − first token) / pace_i`, `pace_i` the
//!   instance's observed seconds per output token ([`DecodePace`], learned from the
//!   lifecycle calls a deployment already makes: `on_prefilled` and `on_finished` with the
//!   output length), the contract's `tpot` until the instance has finished a stream. An
//!   estimate rather than a per-token `on_tokens` call because it needs nothing new from a
//!   proxy or the simulator; a decode that runs exactly at `pace_i` is estimated exactly;
//! * oracle: the same stream's balance at its end, from its recorded output length `o_d`
//!   (`RouteRequest::output_tokens`): `base + L_d / input_rate + o_d · tpot − (elapsed_d +
//!   (o_d − e_d) · pace_i)`, `e_d` capped at `o_d`: the stall after which the stream misses
//!   its contract at the end, which is when the scorer checks it. A simulator's upper bound.
//!
//! A stream whose balance is already negative is exempt (nothing left to protect). An
//! instance is *safe* for a request when its own prefill seconds (own work over the drain rate)
//! are at most the smallest non-negative balance there.
//!
//! Invariants: a balance is finite; an instance without live decodes has balance `+∞`.
//!
//! Complexity: O(1) per decode; the router computes every instance's smallest balance in one
//! pass over its in-flight table, only when the mask is on.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::config::{DecodeMask, RouterConfig};

/// Weight of a new sample in an instance's decode pace (an exponential moving average).
const PACE_WEIGHT: f64 = 1.0 / 8.0;

/// An instance's observed decode pace, seconds per output token: an exponential moving
/// average over finished streams of `(finish − first token) / (output − 1)`. Lock-free; a
/// lost update under a race costs one sample.
#[derive(Debug, Default)]
pub struct DecodePace {
    /// `f64` bits of the pace; 0 (`+0.0`) until the first sample.
    bits: AtomicU64,
}

impl DecodePace {
    /// The learned pace, or `fallback` before any sample.
    pub fn or(&self, fallback: f64) -> f64 {
        let pace = f64::from_bits(self.bits.load(Ordering::Relaxed));
        if pace > 0.0 { pace } else { fallback }
    }

    /// A stream decoded `output_tokens` tokens in `decode_ms` after its first token. A stream of
    /// fewer than two tokens has no gap and teaches nothing.
    pub fn record(&self, output_tokens: u64, decode_ms: u64) {
        if output_tokens < 2 {
            return;
        }
        let sample = decode_ms as f64 / 1000.0 / (output_tokens - 1) as f64;
        let old = f64::from_bits(self.bits.load(Ordering::Relaxed));
        let new = if old > 0.0 {
            old + PACE_WEIGHT * (sample - old)
        } else {
            sample
        };
        // A zero sample (a stream decoded within the clock's millisecond) would read as "none".
        self.bits.store(new.max(f64::MIN_POSITIVE).to_bits(), Ordering::Relaxed);
    }
}

/// One live decode as the mask sees it.
#[derive(Debug, Clone, Copy)]
pub struct LiveDecode {
    /// Its prompt tokens.
    pub prompt_tokens: u64,
    /// When it was routed, router ms.
    pub routed_ms: u64,
    /// When its first token came out, router ms.
    pub first_token_ms: u64,
    /// Its recorded output length (the oracle's input), when the caller said.
    pub output_tokens: Option<u64>,
}

/// The seconds of stall `d` can absorb at `now_ms` and still meet its contract, under `mask`
/// (see the module docs), on an instance decoding at `pace_s` seconds per token. `None` when
/// the mask is off.
pub fn balance_s(cfg: &RouterConfig, d: &LiveDecode, now_ms: u64, pace_s: f64) -> Option<f64> {
    let elapsed = now_ms.saturating_sub(d.routed_ms) as f64 / 1000.0;
    let decoding = now_ms.saturating_sub(d.first_token_ms) as f64 / 1000.0;
    let emitted = 1.0 + decoding / pace_s;
    let fixed = cfg.smetric_contract_base_s + d.prompt_tokens as f64 / cfg.smetric_contract_input_tokens_per_s;
    match cfg.smetric_decode_mask {
        DecodeMask::Off => None,
        DecodeMask::Honest => Some(fixed + emitted * cfg.smetric_contract_tpot_s - elapsed),
        DecodeMask::Oracle => {
            // Without a recorded length the oracle knows no more than the honest form.
            let Some(out) = d.output_tokens else {
                return Some(fixed + emitted * cfg.smetric_contract_tpot_s - elapsed);
            };
            let out = out.max(1) as f64;
            let left = (out - emitted.min(out)) * pace_s;
            Some(fixed + out * cfg.smetric_contract_tpot_s - (elapsed + left))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(mask: DecodeMask) -> RouterConfig {
        RouterConfig {
            smetric_decode_mask: mask,
            ..RouterConfig::PAPER
        }
    }

    #[test]
    #[allow(clippy::float_cmp)] // the fallback is returned as given
    fn pace_learns_an_average_and_ignores_single_tokens() {
        let p = DecodePace::default();
        assert_eq!(p.or(0.02), 0.02);
        p.record(1, 5_000);
        assert_eq!(p.or(0.02), 0.02);
        p.record(101, 3_000); // 30 ms per token
        assert!((p.or(0.02) - 0.030).abs() < 1e-12);
        p.record(101, 1_000); // 10 ms: 30 + (10 − 30)/8 = 27.5 ms
        assert!((p.or(0.02) - 0.0275).abs() < 1e-12);
    }

    #[test]
    fn honest_balance_is_backward_looking() {
        // 8,000-token prompt: 1 + 1 = 2 s fixed. Routed at 0, first token at 1 s; now 3 s at
        // 40 ms per token: 1 + 50 tokens emitted, 51 · 0.02 = 1.02 s earned; 2 + 1.02 − 3 = 0.02 s.
        let d = LiveDecode {
            prompt_tokens: 8_000,
            routed_ms: 0,
            first_token_ms: 1_000,
            output_tokens: Some(1_000),
        };
        let b = balance_s(&cfg(DecodeMask::Honest), &d, 3_000, 0.040).unwrap();
        assert!((b - 0.02).abs() < 1e-9, "{b}");
        assert_eq!(balance_s(&cfg(DecodeMask::Off), &d, 3_000, 0.040), None);
    }

    #[test]
    fn oracle_balance_is_the_stream_end() {
        // As above, 1,000 tokens recorded: contract 2 + 20 = 22 s; 949 tokens left at 40 ms is
        // 37.96 s more, so the stream ends at 40.96 s: −18.96 s, already lost (exempt), which
        // the honest form cannot know yet.
        let d = LiveDecode {
            prompt_tokens: 8_000,
            routed_ms: 0,
            first_token_ms: 1_000,
            output_tokens: Some(1_000),
        };
        let b = balance_s(&cfg(DecodeMask::Oracle), &d, 3_000, 0.040).unwrap();
        assert!((b + 18.96).abs() < 1e-9, "{b}");
        // At 10 ms per token: 201 emitted, 799 left (7.99 s): 2 + 20 − (3 + 7.99) = 11.01 s.
        let b = balance_s(&cfg(DecodeMask::Oracle), &d, 3_000, 0.010).unwrap();
        assert!((b - 11.01).abs() < 1e-9, "{b}");
        // No recorded length: the honest balance.
        let d = LiveDecode {
            output_tokens: None,
            ..d
        };
        let honest = balance_s(&cfg(DecodeMask::Honest), &d, 3_000, 0.040).unwrap();
        assert_eq!(balance_s(&cfg(DecodeMask::Oracle), &d, 3_000, 0.040), Some(honest));
    }
}
