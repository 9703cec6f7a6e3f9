//! `vllm_router_smetric`: vllm-router's `smetric` policy (vllm-project/router PR #330,
//! `src/policies/smetric.rs`), a peer implementation of the SMetric paper's v2 rule
//! (arXiv 2607.08565 v2, Figure 13) written independently of ours (`smetric_paper.rs`). It is
//! kept as a baseline so that "the paper's rule" can be told apart from "our port of it".
//!
//! Algorithm, prompt of `L` tokens, instance `i` with local hit `c_i`, queued work `q_i` and
//! `bs_i` requests in flight:
//! * own work `w_i = work(L − min(c_i, L), L)` (the attention-aware work of `prefill_work`,
//!   local hits only: vllm-router sees no global tier); `e_i = q_i + w_i`;
//! * rate: `smetric_drain_rate` when configured, else vllm-router's estimator (the p90 of the
//!   last 64 own-work samples, `drain_rate.rs`), else none — and with no rate an instance
//!   *meets* its budget; otherwise `meets(i)` iff `e_i / rate_i ≤ SLACK · (b + a·L)` (the same
//!   `smetric_ttft_*` fields as `smetric_paper`; vllm-router counts characters, we tokens);
//! * score `e_i × bs_i` co-located (vllm-router's worker load is its in-flight count, with no
//!   `+1`, so idle instances all score 0), `e_i` on a prefill pool;
//! * home `h = argmax c_i`; a follow-up sticks iff `c_h > HIT_RATIO · L` and (`meets(h)` or no
//!   instance meets), else it goes to `argmin` score. A first turn goes to `argmin` score.
//!
//! Where it differs from `smetric_paper` (ours): the rate (p90 of own work against the median
//! of queue-plus-own work, and "no rate = feasible" against a fallback rate), the home's
//! tie-break (at random, vllm-router's rotating scan order, against the lowest score first), the
//! work model's view of the tier (none), and no smetric+ option. The queued work `q_i` is this
//! router's board, which charges each request the work of its tokens not in `max(local, tier)`.
//! vllm-router breaks score ties by a rotating start; this one at random (§5), which spreads
//! the same way without per-policy state. Reasons are `smetric`'s.
//!
//! **The PR-literal form** (`RouterConfig::vllm_router_smetric_form = PrLiteral`): PR #330's
//! policy as it ships (the version whose header states `HIT_RATIO`, `SLACK` and
//! `CHARS_PER_TOKEN`): it prices prefill by new tokens alone (its `attention_crossover_tokens`
//! defaults to none), so `e_i = queued_i + new_i` with `queued_i` the uncached prompt tokens
//! queued on the instance (`Candidate::queued`) and `new_i = L − min(c_i, L)`; the rate is the
//! p90 of `new / TTFT` over the last 64 first tokens (the router records linear work for this
//! form); the budget is its example SLO, `SLACK · (1 s + 0.0625 s per 1K tokens · L)` with
//! SLACK 1; the home is the deepest hit, ties to the lighter `e`, then at random; a follow-up
//! sticks iff `c_h > HIT_RATIO · L` (HIT_RATIO 0.5) and (`meets(h)` or none meets), else
//! `argmin e_i × bs_i` (the PR multiplies by in-flight requests on a prefill pool too).
//! The PR counts characters, `tokens = chars / CHARS_PER_TOKEN` with CHARS_PER_TOKEN 4: every
//! length here is that division already done (a scale that cancels in every test), so tokens
//! stand for its characters; its hits are a character tree's, ours whole blocks. Its history
//! (the prompt up to the latest assistant message, which the core does not see) is replaced by
//! the prompt `L`, a gate stricter by the last turn's share. Its tree remembers up to 2^26
//! characters per worker (evicted every 120 s); the router's approximate index is the same
//! insert-on-route tree but evicts by LRU at `local_capacity_blocks`, so run it with a large
//! capacity to match.
//!
//! Invariants: no per-session state; scores are integer-valued floats, so ties are exact and
//! the Python reference finds the same ones.
//!
//! Complexity: O(N), a constant number of passes.

use super::{Policy, Reason, Selection, SelectionInput, argmin, argmin_by, prefill_work};
use crate::config::VllmRouterSmetricForm;

/// PR #330's `HIT_RATIO`: a home keeps a session while its hit exceeds this share.
const PR_HIT_RATIO: f64 = 0.5;
/// PR #330's `SLACK` on its TTFT SLO.
const PR_SLACK: f64 = 1.0;
/// PR #330's example TTFT SLO, fixed part, seconds.
const PR_TTFT_BASE_S: f64 = 1.0;
/// PR #330's example TTFT SLO, seconds per prompt token (0.0625 s per 1K tokens).
const PR_TTFT_S_PER_TOKEN: f64 = 0.0625 / 1000.0;

/// PR #330 as it ships (the module's "PR-literal form").
fn select_pr_literal(input: &SelectionInput<'_>) -> Selection {
    let c = input.candidates;
    let n = input.num_tokens;
    let pending = |i: usize| (c[i].queued + (n - c[i].local_hit_tokens.min(n))) as f64;
    let budget_s = PR_SLACK * (PR_TTFT_BASE_S + PR_TTFT_S_PER_TOKEN * n as f64);
    let meets = |i: usize| c[i].peer_drain_rate.is_none_or(|rate| pending(i) / rate <= budget_s);
    let least = |reason| Selection {
        index: argmin(c.len(), input.rng, |i| pending(i) * c[i].bs as f64),
        reason,
    };
    if input.first_turn {
        return least(Reason::FirstTurnLeastLoaded);
    }
    let best_hit = c.iter().map(|x| x.local_hit_tokens).max().unwrap_or(0);
    let home = argmin_by(c.len(), input.rng, |i| c[i].local_hit_tokens == best_hit, pending).unwrap_or(0);
    if c[home].local_hit_tokens as f64 <= PR_HIT_RATIO * n as f64 {
        return least(Reason::MigrateEvicted);
    }
    if meets(home) {
        return Selection {
            index: home,
            reason: Reason::Sticky,
        };
    }
    if !(0..c.len()).any(meets) {
        return Selection {
            index: home,
            reason: Reason::StayNoneFeasible,
        };
    }
    least(Reason::MigrateInfeasible)
}

/// vllm-router's SMetric.
#[derive(Debug, Default)]
pub struct VllmRouterSmetric;

impl Policy for VllmRouterSmetric {
    fn name(&self) -> &'static str {
        "vllm_router_smetric"
    }

    fn select(&self, input: &SelectionInput<'_>) -> Selection {
        if input.config.vllm_router_smetric_form == VllmRouterSmetricForm::PrLiteral {
            return select_pr_literal(input);
        }
        let c = input.candidates;
        let cfg = input.config;
        let n = input.num_tokens;
        let pending = |i: usize| {
            let own = prefill_work(n - c[i].local_hit_tokens.min(n), n, cfg.smetric_l_eq_tokens);
            (c[i].queued_work + own) as f64
        };
        let budget_s = cfg.smetric_ttft_slack * (cfg.smetric_ttft_base_s + cfg.smetric_ttft_s_per_token * n as f64);
        let meets = |i: usize| c[i].peer_drain_rate.is_none_or(|rate| pending(i) / rate <= budget_s);
        let score = |i: usize| {
            if input.prefill_only {
                pending(i)
            } else {
                pending(i) * c[i].bs as f64
            }
        };
        let least = || argmin(c.len(), input.rng, score);
        if input.first_turn {
            return Selection {
                index: least(),
                reason: Reason::FirstTurnLeastLoaded,
            };
        }
        let best_hit = c.iter().map(|x| x.local_hit_tokens).max().unwrap_or(0);
        let home = argmin_by(c.len(), input.rng, |i| c[i].local_hit_tokens == best_hit, |_| 0.0).unwrap_or(0);
        if c[home].local_hit_tokens as f64 <= cfg.min_local_hit_ratio * n as f64 {
            return Selection {
                index: least(),
                reason: Reason::MigrateEvicted,
            };
        }
        if meets(home) {
            return Selection {
                index: home,
                reason: Reason::Sticky,
            };
        }
        if !(0..c.len()).any(meets) {
            return Selection {
                index: home,
                reason: Reason::StayNoneFeasible,
            };
        }
        Selection {
            index: least(),
            reason: Reason::MigrateInfeasible,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RouterConfig;
    use crate::policy::Candidate;
    use crate::policy::test_support::{cand, input};
    use crate::rng::DrawCounter;

    const CFG: RouterConfig = RouterConfig::PAPER;
    // A 16,000-token follow-up: budget 1 + 1 = 2 s.
    const N: u64 = 16_000;

    fn inst(slot: u32, hit: u64, bs: u64, q: u64, rate: Option<f64>) -> Candidate {
        Candidate {
            queued_work: q,
            peer_drain_rate: rate,
            ..cand(slot, hit, bs, 0)
        }
    }

    #[test]
    fn scores_pending_work_times_in_flight_and_gates_on_the_budget() {
        let rng = DrawCounter::new(0);
        // Home 1 holds 15,000: own work 1000 + 1000·15,500/6,923 → 3,239; plus 30,000 queued
        // = 33,239 → 3.3 s at 10K/s, misses. Instance 0 idle (bs 0): a cold 16K prompt is
        // 34,489 units, 1.7 s at 20K/s, meets; its score 34,489 · 0 = 0 wins.
        let c = [
            inst(0, 0, 0, 0, Some(20_000.0)),
            inst(1, 15_000, 5, 30_000, Some(10_000.0)),
        ];
        let s = VllmRouterSmetric.select(&input(&c, N, false, &CFG, &rng));
        assert_eq!((s.index, s.reason), (0, Reason::MigrateInfeasible));
        // At 10K/s instance 0 misses too: nobody meets, the follow-up stays home.
        let c = [
            inst(0, 0, 0, 0, Some(10_000.0)),
            inst(1, 15_000, 5, 30_000, Some(10_000.0)),
        ];
        let s = VllmRouterSmetric.select(&input(&c, N, false, &CFG, &rng));
        assert_eq!((s.index, s.reason), (1, Reason::StayNoneFeasible));
        // Before the home's rate is learned it meets by definition.
        let c = [inst(0, 0, 0, 0, Some(20_000.0)), inst(1, 15_000, 5, 30_000, None)];
        let s = VllmRouterSmetric.select(&input(&c, N, false, &CFG, &rng));
        assert_eq!((s.index, s.reason), (1, Reason::Sticky));
    }

    #[test]
    fn first_turns_take_the_least_pending_work_times_batch() {
        let rng = DrawCounter::new(0);
        // Cold 1,000-token prompt: work 1000 + 1000·500/6,923 → 1,073 everywhere.
        // Scores: (1,073 + 5,000)·2 = 12,146; (1,073 + 100)·12 = 14,076; (1,073 + 9,000)·1 = 10,073.
        let c = [
            inst(0, 0, 2, 5_000, None),
            inst(1, 0, 12, 100, None),
            inst(2, 0, 1, 9_000, None),
        ];
        let s = VllmRouterSmetric.select(&input(&c, 1_000, true, &CFG, &rng));
        assert_eq!((s.index, s.reason), (2, Reason::FirstTurnLeastLoaded));
        // On a prefill pool the batch does not count: instance 1.
        let mut sel = input(&c, 1_000, true, &CFG, &rng);
        sel.prefill_only = true;
        assert_eq!(VllmRouterSmetric.select(&sel).index, 1);
        assert_eq!(rng.draws(), 0);
    }

    #[test]
    fn pr_literal_prices_linear_work_with_its_constants() {
        let cfg = RouterConfig {
            vllm_router_smetric_form: VllmRouterSmetricForm::PrLiteral,
            ..RouterConfig::DEFAULT
        };
        let rng = DrawCounter::new(0);
        let lit = |q: u64, hit, bs, rate| Candidate {
            queued: q,
            ..inst(0, hit, bs, 0, rate)
        };
        // 16,000 tokens: budget 1 + 0.0625·16 = 2 s. Home (hit 15,000): e = 30,000 + 1,000 =
        // 31,000, 3.1 s at 10K/s, misses; instance 0 cold and idle: 16,000 / 10K = 1.6 s meets.
        let c = [
            Candidate {
                slot: 0,
                ..lit(0, 0, 0, Some(10_000.0))
            },
            Candidate {
                slot: 1,
                ..lit(30_000, 15_000, 5, Some(10_000.0))
            },
        ];
        let s = VllmRouterSmetric.select(&input(&c, N, false, &cfg, &rng));
        assert_eq!((s.index, s.reason), (0, Reason::MigrateInfeasible));
        // Queued 4,000: e = 5,000, 0.5 s, meets: sticky (the token form's attention-aware work
        // would be the same here, but its queued term is `queued_work`, 0 in these candidates).
        let c = [
            Candidate {
                slot: 0,
                ..lit(0, 0, 0, Some(10_000.0))
            },
            Candidate {
                slot: 1,
                ..lit(4_000, 15_000, 5, Some(10_000.0))
            },
        ];
        assert_eq!(
            VllmRouterSmetric.select(&input(&c, N, false, &cfg, &rng)).reason,
            Reason::Sticky
        );
        // HIT_RATIO 0.5 of the prompt: 8,000 of 16,000 is not above it, the follow-up moves to
        // argmin e × bs: (0 + 16,000)·0 = 0.
        let c = [
            Candidate {
                slot: 0,
                ..lit(0, 0, 0, None)
            },
            Candidate {
                slot: 1,
                ..lit(0, 8_000, 1, None)
            },
        ];
        let s = VllmRouterSmetric.select(&input(&c, N, false, &cfg, &rng));
        assert_eq!((s.index, s.reason), (0, Reason::MigrateEvicted));
        // Home ties go to the lighter pending work, without a draw.
        let c = [
            Candidate {
                slot: 0,
                ..lit(9_000, 15_000, 1, None)
            },
            Candidate {
                slot: 1,
                ..lit(2_000, 15_000, 1, None)
            },
        ];
        let rng = DrawCounter::new(3);
        assert_eq!(VllmRouterSmetric.select(&input(&c, N, false, &cfg, &rng)).index, 1);
        assert_eq!(rng.draws(), 0);
    }
}
