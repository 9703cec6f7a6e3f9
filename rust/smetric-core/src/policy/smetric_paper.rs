//! `smetric` v2 — the SMetric paper's current rule (arXiv 2607.08565 v2, Figure 13): a
//! follow-up sticks to its home only if the home can still serve it within its TTFT budget.
//!
//! Algorithm, for a request of `L` prompt tokens with global-tier hit `G`, on instance `i`
//! with local (GPU) hit `c_i`, queued work `q_i`, drain rate `RATE_i` and `bs_i` requests in
//! flight:
//! * own work `w_i = work(n_i, L) = n_i + n_i·(L − n_i/2)/L_EQ` with `n_i = L − max(c_i, H_i, G)`
//!   (`H_i` the hit in `i`'s host pool, §2.8) under `smetric_store_pricing`, else
//!   `n_i = L − max(c_i, H_i)` (local-only pricing, the authors' shipped form: a global-tier hit
//!   is not free; the load board still queues what the engine will compute),
//!   the tokens `i` would compute (cold-token equivalents: causal attention makes a token at
//!   depth `p` cost `1 + p/L_EQ`; `config::L_EQ_QWEN3_CODER_30B_A3B` derives `L_EQ`); the tier's
//!   fetch is not priced, as the paper prices none, unless `smetric_learn_fetch_cost` (with
//!   store pricing): then `w_i` adds `⌈F_i · f_i⌉`, `F_i` the tokens `i` would load from the
//!   store and `f_i` its fetch cost learned from first tokens (`fetch_cost.rs`);
//! * `e_i = q_i + w_i`; `meets(i)` iff `e_i / RATE_i ≤ SLACK · (b + a·L)`;
//! * the least-loaded score `s_i = e_i` on a prefill pool (PD prefill, prefill-only), and
//!   `e_i × bs_i` co-located (the authors' co-located form: pending work times active
//!   requests; every idle instance scores 0 and the tie is drawn at random);
//! * the decode mask (`smetric_decode_mask`, `decode_contract.rs`): `safe(i)` iff
//!   `w_i / RATE_i ≤` the smallest non-negative balance of `i`'s live decodes; only safe
//!   instances are targets, unless none is (then all are: the mask never holds a request);
//! * home `h = argmax_i c_i` — local hits only (the GPU's, or the instance's own host pool's,
//!   §2.8), so the shared tier's hit (equal everywhere) cannot blind the eviction test — ties to
//!   the least `s_i`;
//! * a first turn goes to `argmin s_i` (reason `first-turn: least-loaded`);
//! * a follow-up whose home holds no more than `HIT_RATIO × expected hit` (expected: the
//!   whole prompt, the authors' stricter form, since the request does not carry its history
//!   length) was evicted: `argmin s_i` (`migrate (local KV$ evicted)`);
//! * a home the mask removes is left for `argmin s_i` over the safe instances
//!   (`migrate (home would break a live decode)`), also when no instance is safe;
//! * otherwise it sticks if `meets(h)` (`sticky`), or if no instance meets its budget
//!   (`sticky (no instance meets TTFT budget)`: moving would re-prefill for nothing), and
//!   moves to `argmin s_i` when the home misses and another instance meets
//!   (`migrate (home misses TTFT budget)`).
//!
//! The `smetric_paper` preset (`RouterConfig::PAPER`) is the authors' shipped co-located
//! configuration: local-only pricing, the honest mask, a fixed rate of 21,400 work/s;
//! `smetric_v2_port` (`RouterConfig::V2_PORT`) prices the global hit free, has no mask and
//! learns the rate. smetric+ options on top (all off in both presets):
//! * `smetric_active_weight` `w` (co-located): the score is `(e_i + w·a_i) × bs_i`, `a_i` the
//!   prompt tokens in flight on `i` (its decode load and KV occupancy, `linear`'s second
//!   term); `smetric_batch_term = false` drops the `× bs_i` (an additive score). The gate
//!   (`meets`) and the `work` comparison keep `e_i`; a prefill pool keeps `s_i = e_i`;
//! * `smetric_kv_fit`: instances whose in-flight prompt tokens plus this request's (plus the
//!   growth headroom for a first turn) exceed their GPU KV are not targets while one has
//!   room; a home without room is left (`migrate (home overloaded)`);
//! * `smetric_retention_s` `R` (the displacement guard): instance `i` is *churning* when its
//!   GPU cache has evicted a block used less than `R` seconds ago (`evicted_age_s < R`, read
//!   from the index: the KV$ a chain placed there pushes out is a resident session's, whose
//!   next turn then finds its home evicted and moves in turn — the cascade that sinks moving
//!   rules where GPU KV binds, docs/results.md §21). Every placement prefers calm instances
//!   while one is a target; a follow-up whose home still holds its prefix (the gate's or the
//!   cost rule's move) stays home when every target churns
//!   (`sticky (every target churning)`);
//! * `smetric_kv_bound_share` `K` (the KV-bound regime, measured per decision): while the
//!   candidates' in-flight prompt tokens `Σ a_i` are at least `K × N × capacity`, a follow-up
//!   whose home still holds its prefix stays there when its rule would move it
//!   (`sticky (fleet KV-bound)`; a forced move — home evicted, without room, unsafe — still
//!   moves). Where GPU KV binds a move brings a whole prefix into the binding resource and what
//!   it displaces moves in turn; where it does not, moves spread prefill and decode load;
//! * `smetric_tpot_budget_s` `T` (the decode budget): `paced(i)` iff `i`'s predicted pace with
//!   this request, `t0 + κ·(a_i + L)` from the router's online fit of finished streams
//!   (`decode_model.rs`), is at most `T` seconds per output token (no fit yet: every instance is
//!   paced). Every placement prefers paced targets while one is; a follow-up its rule keeps home
//!   (`sticky`) whose home is not paced moves to the least score over the targets that are paced
//!   and meet the TTFT budget (`migrate (home misses TPOT budget)`), and stays when there is none
//!   or while the fleet is KV-bound (a move then displaces; so a `sticky (fleet KV-bound)` stay
//!   stands too);
//! * `smetric_migration = cost | work | fetch` replaces the gate (everywhere, or where the tier
//!   holds at least `HIT_RATIO` of the prompt for `fetch`): the home is kept while its score
//!   (`cost`) or its `e` (`work`) is at most `1 + smetric_migration_margin` times the best
//!   target's, else the request moves to the best (`migrate (cheaper elsewhere)`).
//!
//! Invariants: no per-session state (the turn comes from the request); every constant is a
//! `RouterConfig` field; scores are integer-valued floats, so ties are exact and the Python
//! reference finds the same ones; a single best candidate takes no random draw.
//!
//! Complexity: O(N) per decision (a constant number of passes over the candidates); the
//! router's pass over the in-flight table that fills `decode_room_s` is the mask's only extra.

use super::{Candidate, Reason, Selection, SelectionInput, argmin_by, prefill_work};
use crate::config::{DecodeMask, MigrationRule};

/// The v2 decision.
pub(super) fn select(input: &SelectionInput<'_>) -> Selection {
    let c = input.candidates;
    let cfg = input.config;
    let n = input.num_tokens;
    let g = input.global_hit_tokens.min(n);
    // Local-only pricing: a global hit is computed like a miss (the authors' `store_pricing`).
    let priced_g = if cfg.smetric_store_pricing { g } else { 0 };
    // A store hit loaded at the instance's learned cost, or free (`fetch_cost.rs`).
    let fetch_priced = cfg.smetric_store_pricing && cfg.smetric_learn_fetch_cost;
    let work = |x: &Candidate| {
        let computed = prefill_work(x.prefill_tokens(n, priced_g), n, cfg.smetric_l_eq_tokens);
        if fetch_priced {
            computed + x.store_fetch_work(n, g)
        } else {
            computed
        }
    };
    let pending = |i: usize| (c[i].queued_work + work(&c[i])) as f64;
    let budget_s = cfg.smetric_ttft_slack * (cfg.smetric_ttft_base_s + cfg.smetric_ttft_s_per_token * n as f64);
    let meets = |i: usize| pending(i) / c[i].drain_rate <= budget_s;
    let load = |i: usize| pending(i) + cfg.smetric_active_weight * c[i].active as f64;
    let score = |i: usize| {
        if input.prefill_only {
            pending(i)
        } else if cfg.smetric_batch_term {
            // An idle instance scores 0 whatever its load (finite, never negative): no work to price.
            if c[i].bs == 0 { 0.0 } else { load(i) * c[i].bs as f64 }
        } else {
            load(i)
        }
    };
    let capacity = cfg.local_capacity_blocks as f64 * f64::from(input.block_size);
    let headroom = if input.first_turn {
        cfg.smetric_growth_headroom_tokens
    } else {
        0.0
    };
    let roomy = |i: usize| !cfg.smetric_kv_fit || (c[i].active as f64 + n as f64 + headroom) <= capacity;
    let any_roomy = (0..c.len()).any(roomy);
    // The decode mask: this prefill's own seconds fit every live decode's balance here
    // (`decode_room_s` is only set when the mask is on). When no instance is safe the whole
    // fleet is (work-conserving: the mask never holds a request).
    let masked = cfg.smetric_decode_mask != DecodeMask::Off;
    let safe = |i: usize| {
        !masked
            || c[i]
                .decode_room_s
                .is_none_or(|room| work(&c[i]) as f64 / c[i].drain_rate <= room)
    };
    let any_safe = (0..c.len()).any(safe);
    let placeable = |i: usize| (!any_roomy || roomy(i)) && (!any_safe || safe(i));
    // The displacement guard: a churning instance evicts KV$ used within the retention window,
    // so a chain placed there pushes out a resident session's next turn (which then moves in
    // its turn). Placements prefer calm instances while one is placeable.
    let guard = cfg.smetric_retention_s > 0.0;
    let calm = |i: usize| !guard || c[i].evicted_age_s.is_none_or(|age| age >= cfg.smetric_retention_s);
    let any_calm = guard && (0..c.len()).any(|i| placeable(i) && calm(i));
    let settled = |i: usize| placeable(i) && (!any_calm || calm(i));
    // The decode budget: an instance is *paced* when its predicted pace with this request is
    // within the budget per output token (no prediction yet: paced). Placements prefer paced
    // instances while one is a target.
    let budget = cfg.smetric_tpot_budget_s;
    let paced = |i: usize| budget <= 0.0 || c[i].tpot_s.is_none_or(|p| p <= budget);
    let any_paced = budget > 0.0 && (0..c.len()).any(|i| settled(i) && paced(i));
    let target = |i: usize| settled(i) && (!any_paced || paced(i));
    let least = |fallback: usize| argmin_by(c.len(), input.rng, target, score).unwrap_or(fallback);
    // A voluntary move (the home still holds the prefix and may keep it) needs a calm target.
    let churning_everywhere = guard && !any_calm;
    // The KV-bound regime: the fleet's in-flight prompts fill this share of its GPU KV. Asked
    // only of a voluntary move (one pass over the candidates), not of every decision.
    let kv_bound = || {
        cfg.smetric_kv_bound_share > 0.0
            && c.iter().map(|x| x.active).sum::<u64>() as f64 >= cfg.smetric_kv_bound_share * capacity * c.len() as f64
    };

    if input.first_turn {
        return Selection {
            index: least(0),
            reason: Reason::FirstTurnLeastLoaded,
        };
    }
    // The home holds the session's prefix on its GPU or in its own host pool (§2.8).
    let best_hit = c.iter().map(Candidate::resident_hit_tokens).max().unwrap_or(0);
    let home = argmin_by(c.len(), input.rng, |i| c[i].resident_hit_tokens() == best_hit, score).unwrap_or(0);
    // A stay the rule chose stands unless the home is predicted over the decode budget and a
    // target is predicted within it and meets its TTFT budget: then the least-scoring such. Not
    // while the fleet is KV-bound: a move then displaces what the switch keeps home.
    // (While one target is paced, every target is: `target` implies `paced`.)
    let unless_over_budget = |stay: Selection| {
        if paced(home) || !any_paced || kv_bound() {
            return stay;
        }
        argmin_by(c.len(), input.rng, |i| target(i) && meets(i), score).map_or(stay, |index| Selection {
            index,
            reason: Reason::MigrateTpot,
        })
    };
    let expected_hit = n as f64;
    if c[home].resident_hit_tokens() as f64 <= cfg.min_local_hit_ratio * expected_hit {
        return Selection {
            index: least(home),
            reason: Reason::MigrateEvicted,
        };
    }
    if any_roomy && !roomy(home) {
        return Selection {
            index: least(home),
            reason: Reason::MigrateOverloaded,
        };
    }
    // The home must survive the mask like any other instance, also when none does.
    if !safe(home) {
        return Selection {
            index: least(home),
            reason: Reason::MigrateUnsafe,
        };
    }
    let by_cost = match cfg.smetric_migration {
        MigrationRule::Threshold => false,
        MigrationRule::Cost | MigrationRule::Work => true,
        MigrationRule::Fetch => g as f64 >= cfg.min_local_hit_ratio * n as f64,
    };
    if by_cost {
        if churning_everywhere {
            return Selection {
                index: home,
                reason: Reason::StayChurning,
            };
        }
        let margin = 1.0 + cfg.smetric_migration_margin;
        if cfg.smetric_migration != MigrationRule::Work {
            // The home stays when its score is within the margin of the least. Asked in one
            // pass before the argmin, a stay skips the argmin's second pass over the ties (an
            // idle fleet ties everywhere); it takes the argmin's tie draw all the same, so the
            // draws — and every later decision — are the ones the argmin would have made (the
            // draw's value is not used: only whether it happens, `ties > 1`).
            let (least_score, ties) = least_and_ties((0..c.len()).filter(|&i| target(i)).map(score));
            if score(home) <= margin * least_score {
                input.rng.pick(ties);
                return unless_over_budget(Selection {
                    index: home,
                    reason: Reason::Sticky,
                });
            }
        }
        let best = least(home);
        let compared = |i: usize| {
            if cfg.smetric_migration == MigrationRule::Work {
                pending(i)
            } else {
                score(i)
            }
        };
        return if compared(home) <= margin * compared(best) {
            unless_over_budget(Selection {
                index: home,
                reason: Reason::Sticky,
            })
        } else if kv_bound() {
            Selection {
                index: home,
                reason: Reason::StayKvBound,
            }
        } else {
            Selection {
                index: best,
                reason: Reason::MigrateCheaper,
            }
        };
    }
    if meets(home) {
        return unless_over_budget(Selection {
            index: home,
            reason: Reason::Sticky,
        });
    }
    if !(0..c.len()).any(|i| target(i) && meets(i)) {
        return Selection {
            index: home,
            reason: Reason::StayNoneFeasible,
        };
    }
    if churning_everywhere {
        return Selection {
            index: home,
            reason: Reason::StayChurning,
        };
    }
    if kv_bound() {
        return Selection {
            index: home,
            reason: Reason::StayKvBound,
        };
    }
    Selection {
        index: least(home),
        reason: Reason::MigrateInfeasible,
    }
}

/// The least of `scores` and how many equal it (exact float equality, as [`argmin_by`]'s ties),
/// except that the count stops at two once two scores are 0: scores are never negative (every
/// term of one is validated non-negative), so two zeros settle both the least and that the
/// argmin would draw — all a stay needs. `(∞, 0)` when there are none. O(candidates), and O(1)
/// past the second idle target (an idle instance scores 0 co-located).
#[allow(clippy::float_cmp)]
fn least_and_ties(scores: impl Iterator<Item = f64>) -> (f64, usize) {
    let (mut least, mut ties) = (f64::INFINITY, 0);
    for s in scores {
        if ties == 0 || s < least {
            (least, ties) = (s, 1);
        } else if s == least {
            ties += 1;
            if least <= 0.0 {
                break;
            }
        }
    }
    (least, ties)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RouterConfig;
    use crate::policy::test_support::{cand, input};
    use crate::rng::DrawCounter;

    const CFG: RouterConfig = RouterConfig::V2_PORT;
    const SHIPPED: RouterConfig = RouterConfig::PAPER;

    /// An instance with `hit` local tokens, `bs` requests, `q` queued work and a drain rate.
    fn inst(slot: u32, hit: u64, bs: u64, q: u64, rate: f64) -> Candidate {
        Candidate {
            queued_work: q,
            drain_rate: rate,
            ..cand(slot, hit, bs, 0)
        }
    }

    /// With the fetch cost learned, a store hit is loaded, not free: a follow-up the fetch
    /// rule moves to an idle instance holding nothing (its whole prefix free from the store)
    /// stays home once loading it costs a work unit a token; with the option off the learned
    /// cost is not read (negative control).
    #[test]
    fn a_learned_fetch_cost_prices_the_store_hit() {
        let rng = DrawCounter::new(0);
        let n = 10_000;
        let cfg = RouterConfig {
            smetric_migration: MigrationRule::Fetch,
            smetric_learn_fetch_cost: true,
            ..RouterConfig::DEFAULT
        };
        // Home: 9,000 local tokens, 20,000 work queued, 2 in flight (score ≈ 2 × 21,300).
        // Target: nothing local, 1 in flight; its score is its fetch: 0 free, 10,000 at 1.0.
        let c = |fetch_cost: f64| {
            [
                inst(0, 9_000, 2, 20_000, RATE),
                Candidate {
                    fetch_cost,
                    ..inst(1, 0, 1, 0, RATE)
                },
            ]
        };
        let decide = |cands: &[Candidate], cfg: &RouterConfig| {
            let mut sel = input(cands, n, false, cfg, &rng);
            sel.global_hit_tokens = n;
            let s = select(&sel);
            (s.index, s.reason)
        };
        assert_eq!(decide(&c(0.0), &cfg), (1, Reason::MigrateCheaper), "a free store hit");
        assert_eq!(decide(&c(1.0), &cfg), (0, Reason::Sticky), "a store hit at 1.0 a token");
        let off = RouterConfig {
            smetric_learn_fetch_cost: false,
            ..cfg
        };
        assert_eq!(decide(&c(1.0), &off), (1, Reason::MigrateCheaper), "the option off");
    }

    #[test]
    fn work_prices_attention() {
        // The paper's example: 4K tokens after a 60K reused prefix cost ≈7.7× a cold 4K request.
        let l_eq = RouterConfig::DEFAULT.smetric_l_eq_tokens;
        let appended = prefill_work(4096, 60_000 + 4096, l_eq) as f64;
        let cold = prefill_work(4096, 4096, l_eq) as f64;
        assert!((appended / cold - 7.7).abs() < 0.15, "{}", appended / cold);
        assert_eq!(prefill_work(0, 50_000, l_eq), 0);
        assert_eq!(prefill_work(1, 1, 2.0), 2, "1 + 1·0.5/2 = 1.25, rounded up");
        // A load from the store is rounded up the same way.
        assert_eq!(crate::policy::fetch_work(0, 0.3), 0);
        assert_eq!(crate::policy::fetch_work(10, 0.25), 3);
        assert_eq!(crate::policy::fetch_work(8, 0.25), 2);
    }

    // A 16,000-token follow-up has a budget of 1 + 1 = 2 s; at 10,000 work/s, 20,000 units.
    const N: u64 = 16_000;
    const RATE: f64 = 10_000.0;

    #[test]
    fn first_turn_goes_to_the_least_pending_work_times_batch() {
        let rng = DrawCounter::new(0);
        // Instance 0 holds most of the prompt but is busy (43,239 · 2); 1 has the least
        // pending work but a batch of 4 (35,489 · 4); 2 wins (54,489 · 1).
        let c = [
            inst(0, 15_000, 2, 40_000, RATE),
            inst(1, 0, 4, 1_000, RATE),
            inst(2, 0, 1, 20_000, RATE),
        ];
        let s = select(&input(&c, N, true, &CFG, &rng));
        assert_eq!((s.index, s.reason), (2, Reason::FirstTurnLeastLoaded));
        // On a prefill pool the batch does not count: least `q + w` is instance 1.
        let mut sel = input(&c, N, true, &CFG, &rng);
        sel.prefill_only = true;
        assert_eq!(select(&sel).index, 1);
    }

    #[test]
    fn gate_sticks_when_the_home_meets_its_budget() {
        let rng = DrawCounter::new(0);
        // Home 1: 1,000 new tokens → w = 1000 + 1000·15,500/6,923 ≈ 3,239; with 10,000 queued,
        // 13,239 units / 10,000 per s = 1.3 s ≤ 2 s.
        let c = [inst(0, 0, 0, 0, RATE), inst(1, 15_000, 5, 10_000, RATE)];
        let s = select(&input(&c, N, false, &CFG, &rng));
        assert_eq!((s.index, s.reason), (1, Reason::Sticky));
    }

    #[test]
    fn gate_moves_when_the_home_misses_and_another_meets() {
        let rng = DrawCounter::new(0);
        // Home 1: 30,000 queued → 3.3 s > 2 s. Instance 0 idle: a cold 16K prompt is
        // 16,000 + 16,000·8,000/6,923 ≈ 34,489 units → 3.4 s at 10K/s: misses too, but at
        // 20,000/s it takes 1.7 s and meets.
        let c = [inst(0, 0, 0, 0, 2.0 * RATE), inst(1, 15_000, 5, 30_000, RATE)];
        let s = select(&input(&c, N, false, &CFG, &rng));
        assert_eq!((s.index, s.reason), (0, Reason::MigrateInfeasible));
    }

    #[test]
    fn gate_stays_home_when_no_instance_meets() {
        let rng = DrawCounter::new(0);
        let c = [inst(0, 0, 0, 0, RATE), inst(1, 15_000, 5, 30_000, RATE)];
        let s = select(&input(&c, N, false, &CFG, &rng));
        assert_eq!((s.index, s.reason), (1, Reason::StayNoneFeasible));
    }

    #[test]
    fn an_evicted_home_is_left_whatever_the_gate_says() {
        let rng = DrawCounter::new(0);
        // The home holds 8,000 of 16,000 tokens: not more than half, so evicted, although it
        // is idle and meets its budget.
        let c = [inst(0, 0, 1, 0, 2.0 * RATE), inst(1, 8_000, 0, 0, 2.0 * RATE)];
        let s = select(&input(&c, N, false, &CFG, &rng));
        assert_eq!(s.reason, Reason::MigrateEvicted);
        // The global tier's hit does not count towards the home test.
        let mut sel = input(&c, N, false, &CFG, &rng);
        sel.global_hit_tokens = N;
        assert_eq!(select(&sel).reason, Reason::MigrateEvicted);
        // One more local token and it is home.
        let c = [inst(0, 0, 1, 0, 2.0 * RATE), inst(1, 8_016, 0, 0, 2.0 * RATE)];
        assert_eq!(select(&input(&c, N, false, &CFG, &rng)).reason, Reason::Sticky);
    }

    #[test]
    fn the_slack_scales_the_budget() {
        let rng = DrawCounter::new(0);
        // Home: 1.3 s; instance 0: a cold 16K prompt at 40,000/s, 0.86 s.
        let c = [inst(0, 0, 0, 0, 4.0 * RATE), inst(1, 15_000, 5, 10_000, RATE)];
        assert_eq!(select(&input(&c, N, false, &CFG, &rng)).reason, Reason::Sticky);
        let tight = RouterConfig {
            smetric_ttft_slack: 0.5,
            ..CFG
        };
        assert_eq!(
            select(&input(&c, N, false, &tight, &rng)).reason,
            Reason::MigrateInfeasible
        );
    }

    #[test]
    fn active_weight_and_additive_form_sit_on_top() {
        let rng = DrawCounter::new(0);
        // Two idle-queue instances, cold prompt: equal `e`. Instance 0 runs one request with
        // 60,000 prompt tokens in flight, instance 1 two requests with 1,000 each.
        let mut c = [inst(0, 0, 1, 0, RATE), inst(1, 0, 2, 0, RATE)];
        c[0].active = 60_000;
        c[1].active = 2_000;
        // The paper's score `e × bs` prefers the smaller batch.
        assert_eq!(select(&input(&c, N, true, &CFG, &rng)).index, 0);
        // `(e + a) × bs`: 94,489 · 1 against 36,489 · 2 = 72,978 — instance 1.
        let active = RouterConfig {
            smetric_active_weight: 1.0,
            ..CFG
        };
        assert_eq!(select(&input(&c, N, true, &active, &rng)).index, 1);
        // Additive `e + a`: 94,489 against 36,489 — instance 1.
        let additive = RouterConfig {
            smetric_batch_term: false,
            ..active
        };
        assert_eq!(select(&input(&c, N, true, &additive, &rng)).index, 1);
        // A prefill pool ignores both.
        let mut sel = input(&c, N, true, &additive, &rng);
        sel.prefill_only = true;
        let s = select(&sel);
        assert_eq!(s.reason, Reason::FirstTurnLeastLoaded);
        // The gate still reads `e` alone: a home that meets its budget sticks whatever its `a`.
        let mut c = [inst(0, 0, 1, 0, RATE), inst(1, 15_000, 1, 10_000, RATE)];
        c[1].active = 200_000;
        assert_eq!(select(&input(&c, N, false, &additive, &rng)).reason, Reason::Sticky);
    }

    #[test]
    fn kv_fit_and_cost_options_sit_on_top() {
        let rng = DrawCounter::new(0);
        let fit = RouterConfig {
            smetric_kv_fit: true,
            local_capacity_blocks: 2_000, // 32,000 tokens of KV
            ..CFG
        };
        let mut c = [inst(0, 0, 1, 0, RATE), inst(1, 15_000, 1, 0, RATE)];
        c[1].active = 20_000;
        assert_eq!(select(&input(&c, N, false, &CFG, &rng)).reason, Reason::Sticky);
        let s = select(&input(&c, N, false, &fit, &rng));
        assert_eq!((s.index, s.reason), (0, Reason::MigrateOverloaded));
        // Cost rule: the home meets its budget but its score is far above the best.
        let cost = RouterConfig {
            smetric_migration: MigrationRule::Cost,
            smetric_migration_margin: 0.25,
            ..CFG
        };
        let c = [inst(0, 0, 1, 0, RATE), inst(1, 15_000, 20, 10_000, RATE)];
        assert_eq!(select(&input(&c, N, false, &CFG, &rng)).reason, Reason::Sticky);
        let s = select(&input(&c, N, false, &cost, &rng));
        assert_eq!((s.index, s.reason), (0, Reason::MigrateCheaper));
    }

    // The shipped configuration (`RouterConfig::PAPER`): one test per branch of the gate, the
    // mask (its balances come from the router, `router/tests.rs`; here as `decode_room_s`) and
    // local-only pricing.

    /// `inst` with the smallest live-decode balance `room` seconds.
    fn decoding(c: Candidate, room: f64) -> Candidate {
        Candidate {
            decode_room_s: Some(room),
            ..c
        }
    }

    #[test]
    fn shipped_first_turn_takes_the_least_score_among_safe_instances() {
        let rng = DrawCounter::new(0);
        // Instance 0 is idle but decoding a stream with 0.5 s of room; a cold 16K prompt takes
        // 3.4 s there. Instance 1 scores 34,489 · 1 and has no live decode.
        let c = [decoding(inst(0, 0, 0, 0, RATE), 0.5), inst(1, 0, 1, 0, RATE)];
        let s = select(&input(&c, N, true, &SHIPPED, &rng));
        assert_eq!((s.index, s.reason), (1, Reason::FirstTurnLeastLoaded));
        // Negative control: without the mask the idle instance wins.
        let off = RouterConfig {
            smetric_decode_mask: DecodeMask::Off,
            ..SHIPPED
        };
        assert_eq!(select(&input(&c, N, true, &off, &rng)).index, 0);
    }

    #[test]
    fn shipped_evicted_home_is_left() {
        let rng = DrawCounter::new(0);
        // Half the prompt at home is not more than half: evicted, although the home meets.
        let c = [inst(0, 0, 1, 0, 2.0 * RATE), inst(1, 8_000, 3, 0, 2.0 * RATE)];
        let s = select(&input(&c, N, false, &SHIPPED, &rng));
        assert_eq!((s.index, s.reason), (0, Reason::MigrateEvicted));
    }

    #[test]
    fn shipped_home_that_meets_its_budget_sticks() {
        let rng = DrawCounter::new(0);
        // Home: (10,000 + 3,239) / 10,000 = 1.3 s ≤ 2 s; its decodes have 0.5 s of room and this
        // prefill takes 0.32 s there: safe.
        let c = [inst(0, 0, 0, 0, RATE), decoding(inst(1, 15_000, 5, 10_000, RATE), 0.5)];
        let s = select(&input(&c, N, false, &SHIPPED, &rng));
        assert_eq!((s.index, s.reason), (1, Reason::Sticky));
    }

    #[test]
    fn shipped_home_that_misses_moves_to_one_that_meets() {
        let rng = DrawCounter::new(0);
        let c = [inst(0, 0, 0, 0, 2.0 * RATE), inst(1, 15_000, 5, 30_000, RATE)];
        let s = select(&input(&c, N, false, &SHIPPED, &rng));
        assert_eq!((s.index, s.reason), (0, Reason::MigrateInfeasible));
    }

    #[test]
    fn shipped_home_stays_when_no_instance_meets() {
        let rng = DrawCounter::new(0);
        let c = [inst(0, 0, 0, 0, RATE), inst(1, 15_000, 5, 30_000, RATE)];
        let s = select(&input(&c, N, false, &SHIPPED, &rng));
        assert_eq!((s.index, s.reason), (1, Reason::StayNoneFeasible));
    }

    #[test]
    fn shipped_mask_removes_the_home_and_ranks_safe_instances_first() {
        let rng = DrawCounter::new(0);
        // The home meets its budget, but its decodes have 0.2 s of room and this prefill takes
        // 0.32 s: it spills. Instance 0 scores lowest (idle) but is unsafe too (3.4 s of cold
        // prefill against 1 s of room); instance 2 (34,489 · 1) is safe.
        let home = inst(1, 15_000, 5, 10_000, RATE);
        let c = [
            decoding(inst(0, 0, 0, 0, RATE), 1.0),
            decoding(home, 0.2),
            inst(2, 0, 1, 0, RATE),
        ];
        let s = select(&input(&c, N, false, &SHIPPED, &rng));
        assert_eq!((s.index, s.reason), (2, Reason::MigrateUnsafe));
        // Negative control: with 0.5 s of room at home it sticks; without the mask too.
        let c2 = [c[0], decoding(home, 0.5), c[2]];
        assert_eq!(select(&input(&c2, N, false, &SHIPPED, &rng)).reason, Reason::Sticky);
        let off = RouterConfig {
            smetric_decode_mask: DecodeMask::Off,
            ..SHIPPED
        };
        assert_eq!(select(&input(&c, N, false, &off, &rng)).reason, Reason::Sticky);
    }

    #[test]
    fn shipped_mask_that_removes_every_instance_leaves_the_whole_fleet() {
        let rng = DrawCounter::new(0);
        // No instance is safe: the home is still left (it is unsafe), for the least score over
        // the whole fleet (the idle instance 0), never held.
        let c = [
            decoding(inst(0, 0, 0, 0, RATE), 0.1),
            decoding(inst(1, 15_000, 5, 10_000, RATE), 0.2),
            decoding(inst(2, 0, 1, 0, RATE), 0.1),
        ];
        let s = select(&input(&c, N, false, &SHIPPED, &rng));
        assert_eq!((s.index, s.reason), (0, Reason::MigrateUnsafe));
        // And a first turn goes where the unmasked rule sends it.
        assert_eq!(select(&input(&c, N, true, &SHIPPED, &rng)).index, 0);
    }

    #[test]
    fn a_global_hit_changes_the_decision_only_with_store_pricing() {
        let rng = DrawCounter::new(0);
        // Home: (25,000 + 3,239) / 10,000 = 2.8 s > 2 s. Instance 0 cold: 3.4 s. With the tier
        // holding 15,000 tokens and store pricing, instance 0 prices 3,239 units (0.32 s).
        let c = [inst(0, 0, 0, 0, RATE), inst(1, 15_000, 5, 25_000, RATE)];
        let stay = (1, Reason::StayNoneFeasible);
        for g in [0, 15_000] {
            let mut sel = input(&c, N, false, &SHIPPED, &rng);
            sel.global_hit_tokens = g;
            let s = select(&sel);
            assert_eq!((s.index, s.reason), stay, "local-only, global hit {g}");
        }
        let store = RouterConfig {
            smetric_store_pricing: true,
            ..SHIPPED
        };
        let mut sel = input(&c, N, false, &store, &rng);
        assert_eq!(select(&sel).reason, Reason::StayNoneFeasible);
        sel.global_hit_tokens = 15_000;
        let s = select(&sel);
        assert_eq!((s.index, s.reason), (0, Reason::MigrateInfeasible));
    }

    #[test]
    fn shipped_preset_is_the_authors_configuration() {
        assert_eq!(
            (SHIPPED.smetric_store_pricing, SHIPPED.smetric_decode_mask),
            (false, DecodeMask::Honest)
        );
        assert_eq!(SHIPPED.smetric_drain_rate, Some(21_400.0));
        assert_eq!((SHIPPED.min_local_hit_ratio, SHIPPED.smetric_ttft_slack), (0.5, 1.0));
        assert_eq!(
            (SHIPPED.smetric_ttft_base_s, SHIPPED.smetric_ttft_s_per_token),
            (1.0, 1.0 / 16_000.0)
        );
        assert_eq!(SHIPPED.smetric_rule, crate::config::SmetricRule::V2);
        // The v2 port keeps today's form.
        assert_eq!(
            (
                CFG.smetric_store_pricing,
                CFG.smetric_decode_mask,
                CFG.smetric_drain_rate
            ),
            (true, DecodeMask::Off, None)
        );
    }

    #[test]
    fn the_displacement_guard_keeps_a_follow_up_off_churning_instances() {
        let rng = DrawCounter::new(0);
        let guarded = RouterConfig {
            smetric_retention_s: 60.0,
            ..CFG
        };
        // Home 1 misses its budget (3.3 s); 0 and 2 are idle and meet it (1.7 s at 20K/s).
        // Instance 0 gave up KV$ used 10 s ago (churning), 2 KV$ used 100 s ago (calm).
        let mut c = [
            inst(0, 0, 0, 0, 2.0 * RATE),
            inst(1, 15_000, 5, 30_000, RATE),
            inst(2, 0, 1, 0, 2.0 * RATE),
        ];
        c[0].evicted_age_s = Some(10.0);
        c[1].evicted_age_s = Some(5.0);
        c[2].evicted_age_s = Some(100.0);
        // Without the guard the least score (an empty batch) takes it: instance 0.
        assert_eq!(
            select(&input(&c, N, false, &CFG, &rng)),
            Selection {
                index: 0,
                reason: Reason::MigrateInfeasible
            }
        );
        // With it, the calm instance.
        assert_eq!(
            select(&input(&c, N, false, &guarded, &rng)),
            Selection {
                index: 2,
                reason: Reason::MigrateInfeasible
            }
        );
        // Every instance churning, the home too (a calm home would itself be the one calm
        // target: the gate's own stay): the session stays home, under the cost rule as well.
        c[2].evicted_age_s = Some(59.9);
        assert_eq!(
            select(&input(&c, N, false, &guarded, &rng)),
            Selection {
                index: 1,
                reason: Reason::StayChurning
            }
        );
        let cost = RouterConfig {
            smetric_migration: MigrationRule::Cost,
            smetric_migration_margin: 0.0,
            ..guarded
        };
        assert_eq!(select(&input(&c, N, false, &cost, &rng)).reason, Reason::StayChurning);
        // An instance that never gave anything up is calm.
        c[2].evicted_age_s = None;
        assert_eq!(select(&input(&c, N, false, &guarded, &rng)).index, 2);
        // A forced move (the home lost its KV$) still goes somewhere: the least score when all churn.
        c[1].local_hit_tokens = 0;
        c[2].evicted_age_s = Some(1.0);
        let s = select(&input(&c, N, false, &guarded, &rng));
        assert_eq!((s.index, s.reason), (0, Reason::MigrateEvicted));
        // First turns prefer a calm instance too.
        c[2].evicted_age_s = Some(600.0);
        assert_eq!(select(&input(&c, N, true, &guarded, &rng)).index, 2);
        assert_eq!(select(&input(&c, N, true, &CFG, &rng)).index, 0);
    }

    #[test]
    fn the_kv_bound_regime_keeps_a_follow_up_home_that_its_rule_would_move() {
        let rng = DrawCounter::new(0);
        let bound = RouterConfig {
            smetric_kv_bound_share: 0.5,
            local_capacity_blocks: 1_000, // 16,000 tokens of KV each: 32,000 on two instances
            ..CFG
        };
        // The gate's move (home 1 misses, instance 0 meets), 15,999 prompt tokens in flight.
        let mut c = [inst(0, 0, 0, 0, 2.0 * RATE), inst(1, 15_000, 5, 30_000, RATE)];
        c[1].active = 15_999;
        let moved = Selection {
            index: 0,
            reason: Reason::MigrateInfeasible,
        };
        assert_eq!(select(&input(&c, N, false, &bound, &rng)), moved);
        // 16,000 of 32,000: half the fleet's KV, the regime is KV-bound.
        c[1].active = 16_000;
        let kept = Selection {
            index: 1,
            reason: Reason::StayKvBound,
        };
        assert_eq!(select(&input(&c, N, false, &bound, &rng)), kept);
        // Off (the default), the same fleet moves it.
        let off = RouterConfig {
            smetric_kv_bound_share: 0.0,
            ..bound
        };
        assert_eq!(select(&input(&c, N, false, &off, &rng)), moved);
        // The cost rule's move is kept home too.
        let cost = RouterConfig {
            smetric_migration: MigrationRule::Cost,
            smetric_migration_margin: 0.0,
            ..bound
        };
        assert_eq!(select(&input(&c, N, false, &cost, &rng)), kept);
        // A forced move still moves: the home lost its KV$.
        c[1].local_hit_tokens = 0;
        assert_eq!(
            select(&input(&c, N, false, &bound, &rng)).reason,
            Reason::MigrateEvicted
        );
        // First turns are placed as before.
        assert_eq!(select(&input(&c, N, true, &bound, &rng)).index, 0);
    }

    #[test]
    fn a_fetch_rule_stay_takes_the_argmins_tie_draw() {
        // Three idle instances (score 0 each: a three-way tie), the tier holds the prompt so the
        // fetch rule decides; the home stays. The argmin the stay skips would have drawn once
        // for its tie, and the stay must too, or every later tie breaks differently.
        let fetch = RouterConfig {
            smetric_migration: MigrationRule::Fetch,
            ..CFG
        };
        let c = [
            inst(0, 0, 0, 0, RATE),
            inst(1, 15_000, 0, 0, RATE),
            inst(2, 0, 0, 0, RATE),
        ];
        let rng = DrawCounter::new(0);
        let mut sel = input(&c, N, false, &fetch, &rng);
        sel.global_hit_tokens = N;
        assert_eq!(
            select(&sel),
            Selection {
                index: 1,
                reason: Reason::Sticky
            }
        );
        assert_eq!(rng.draws(), 1);
        // A single least score takes no draw.
        let c = [
            inst(0, 0, 1, 9_000, RATE),
            inst(1, 15_000, 0, 0, RATE),
            inst(2, 0, 2, 9_000, RATE),
        ];
        let rng = DrawCounter::new(0);
        let mut sel = input(&c, N, false, &fetch, &rng);
        sel.global_hit_tokens = N;
        assert_eq!(select(&sel).index, 1);
        assert_eq!(rng.draws(), 0);
    }

    #[test]
    #[allow(clippy::float_cmp)]
    fn least_and_ties_stops_at_two_zeros_and_agrees_with_a_full_count_on_the_draw() {
        assert_eq!(least_and_ties([3.0, 0.0, 5.0, 0.0, 0.0, 0.0].into_iter()), (0.0, 2));
        assert_eq!(least_and_ties([3.0, 2.0, 5.0, 2.0, 2.0].into_iter()), (2.0, 3));
        assert_eq!(least_and_ties(std::iter::empty()), (f64::INFINITY, 0));
        // What a stay reads — the least, and whether the argmin draws — equals a full count's.
        let rng = DrawCounter::new(3);
        for _ in 0..2_000 {
            let scores: Vec<f64> = (0..=rng.pick(8)).map(|_| [0.0, 0.0, 1.0, 7.0][rng.pick(4)]).collect();
            let (least, ties) = least_and_ties(scores.iter().copied());
            let full_least = scores.iter().copied().fold(f64::INFINITY, f64::min);
            let full_ties = scores.iter().filter(|&&s| s == full_least).count();
            assert_eq!(least, full_least, "{scores:?}");
            assert_eq!(ties > 1, full_ties > 1, "{scores:?}");
        }
    }

    #[test]
    fn the_decode_budget_moves_a_stay_off_a_home_predicted_over_it() {
        let rng = DrawCounter::new(0);
        let budget = RouterConfig {
            smetric_tpot_budget_s: 0.020,
            ..CFG
        };
        // The gate keeps the follow-up home (1.3 s of a 2 s TTFT budget); the home is predicted
        // at 25 ms a token, instance 0 at 12 ms (idle and twice as fast: a cold prefill in
        // 1.7 s meets), instance 2 at 15 ms but behind 4 s of queue (misses its TTFT budget).
        let mut c = [
            inst(0, 0, 0, 0, 2.0 * RATE),
            inst(1, 15_000, 5, 10_000, RATE),
            inst(2, 0, 1, 40_000, RATE),
        ];
        (c[0].tpot_s, c[1].tpot_s, c[2].tpot_s) = (Some(0.012), Some(0.025), Some(0.015));
        let moved = Selection {
            index: 0,
            reason: Reason::MigrateTpot,
        };
        assert_eq!(select(&input(&c, N, false, &budget, &rng)), moved);
        // Negative control: the budget off keeps it home.
        let sticky = Selection {
            index: 1,
            reason: Reason::Sticky,
        };
        assert_eq!(select(&input(&c, N, false, &CFG, &rng)), sticky);
        // A paced home stays.
        c[1].tpot_s = Some(0.019);
        assert_eq!(select(&input(&c, N, false, &budget, &rng)), sticky);
        // No paced target that meets its TTFT budget: the home stays, over budget or not.
        c[1].tpot_s = Some(0.025);
        c[0].tpot_s = Some(0.030);
        assert_eq!(select(&input(&c, N, false, &budget, &rng)), sticky);
        // No fit yet (no prediction anywhere): every instance is paced, the home stays.
        for x in &mut c {
            x.tpot_s = None;
        }
        assert_eq!(select(&input(&c, N, false, &budget, &rng)), sticky);
    }

    #[test]
    fn the_decode_budget_yields_to_the_kv_bound_stay_and_steers_first_turns() {
        let rng = DrawCounter::new(0);
        let bound = RouterConfig {
            smetric_kv_bound_share: 0.5,
            local_capacity_blocks: 1_000,
            smetric_tpot_budget_s: 0.020,
            ..CFG
        };
        // As the KV-bound test: the gate would move it, the regime keeps it home, and a home
        // predicted over the decode budget stays all the same: while KV binds, a move displaces.
        let mut c = [inst(0, 0, 0, 0, 2.0 * RATE), inst(1, 15_000, 5, 30_000, RATE)];
        c[1].active = 16_000;
        (c[0].tpot_s, c[1].tpot_s) = (Some(0.010), Some(0.021));
        let kept = Selection {
            index: 1,
            reason: Reason::StayKvBound,
        };
        assert_eq!(select(&input(&c, N, false, &bound, &rng)), kept);
        // Below the share the gate's own move stands (the home misses its TTFT budget).
        c[1].active = 15_999;
        assert_eq!(
            select(&input(&c, N, false, &bound, &rng)).reason,
            Reason::MigrateInfeasible
        );
        // And a stay the gate chose gives way to the budget only outside the regime: a home that
        // meets its TTFT budget (10,000 queued), predicted over the decode budget.
        c[1].queued_work = 10_000;
        let moved = Selection {
            index: 0,
            reason: Reason::MigrateTpot,
        };
        assert_eq!(select(&input(&c, N, false, &bound, &rng)), moved);
        c[1].active = 16_000;
        assert_eq!(
            select(&input(&c, N, false, &bound, &rng)),
            Selection {
                index: 1,
                reason: Reason::Sticky
            }
        );
        // A first turn goes to the least score among paced instances while one is.
        let c = {
            let mut c = [inst(0, 0, 1, 0, RATE), inst(1, 0, 2, 0, RATE)];
            (c[0].tpot_s, c[1].tpot_s) = (Some(0.030), Some(0.015));
            c
        };
        let budget = RouterConfig {
            smetric_tpot_budget_s: 0.020,
            ..CFG
        };
        assert_eq!(select(&input(&c, N, true, &CFG, &rng)).index, 0);
        assert_eq!(select(&input(&c, N, true, &budget, &rng)).index, 1);
    }
}
