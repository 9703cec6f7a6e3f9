//! `smetric`: session-aware routing for agent workloads (SMetric, IPADS SJTU + Alibaba).
//!
//! This file is the July (v1) rule, `RouterConfig::smetric_rule = v1`; the paper's current
//! rule (v2, SLO feasibility) is `smetric_paper.rs`, which `select` hands over to.
//!
//! Agent sessions re-send their whole history every turn, so where a session's *first*
//! request lands decides where its whole life runs (96.6% of follow-ups return there under
//! cache-first routing). Cache-first routers send first turns to the few instances holding
//! the shared system prompt; SMetric instead:
//!
//! * **first turn** — places it for load balance over the whole fleet, ignoring local hits:
//!   `argmin (queued + c)·(bs + 1)` with the cache-blind cost `c = (n − G) + G·f`, where `G` is the
//!   global-tier hit and `f` the fetch cost per token (a global KV$ tier makes the shared
//!   prefix cheap anywhere);
//! * **follow-up** — stays cache-aware: its home is the instance with the longest local hit;
//!   it goes home unless the home lost its KV$ (hit < `min_local_hit_ratio`·n) or is
//!   overloaded (`q > factor·mean q + slack_tokens` or `bs > factor·mean bs + slack_requests`);
//!   then it migrates to `argmin max(queued + cost, 1)·(bs + 1)` over the instances that are not
//!   overloaded, where `cost = (n − max(L, G)) + max(G − L, 0)·f` counts local hits as free and
//!   global hits at their fetch cost — LMetric's score with a tier-aware prefill term.
//!
//! **smetric+ switches** (`RouterConfig::smetric_*`; all off is the July paper's form, the
//! `smetric_v1` preset `RouterConfig::V1`):
//! * `smetric_active_weight` `w` adds `w·active` (in-flight prompt tokens: decode load and KV
//!   occupancy, `linear`'s second term) to the load `queued + cost` of every score;
//! * `smetric_batch_term = false` drops the `(bs + 1)` factor (an additive score, as `linear`);
//! * `smetric_migration = cost`: a follow-up stays home while `score(home) ≤ (1 + margin)·
//!   min score` over the targets, else moves to the minimum (queueing at home against
//!   re-prefill or tier fetch elsewhere, one unit); the fixed thresholds are not used;
//! * `smetric_kv_fit`: an instance is *full* when `active + n` (+ the growth headroom for a
//!   first turn) exceeds its GPU KV; full instances are not targets while one has room, and a
//!   full home is treated as overloaded.
//!
//! Invariants: no per-session state (the turn comes from the request); every threshold is
//! a `RouterConfig` field; with every switch off the arithmetic is the paper's, operation for
//! operation. Complexity: O(N) per decision.

use super::{Candidate, Policy, Reason, Selection, SelectionInput, argmin_by, smetric_paper};
use crate::config::{MigrationRule, RouterConfig, SmetricRule};

/// SMetric.
#[derive(Debug, Default)]
pub struct Smetric;

/// Source-priced prefill cost of the request on candidate `c`, in prefilled-token equivalents:
/// the tokens computed, plus each loaded token at its source's cost — `host_fetch` from the
/// instance's host pool, `fetch` from the shared store (docs §2.8; a GPU hit is free).
fn cost(c: &Candidate, n: u64, global: u64, fetch: f64, host_fetch: f64) -> f64 {
    let (from_host, from_store) = c.loaded_tokens(n, global);
    c.prefill_tokens(n, global) as f64 + from_host as f64 * host_fetch + from_store as f64 * fetch
}

/// The work a prefill placed on `c` waits for and does: `queued + cost + w·active`.
fn pending_work(c: &Candidate, cost: f64, cfg: &RouterConfig) -> f64 {
    c.queued as f64 + cost + cfg.smetric_active_weight * c.active as f64
}

/// The score of placing a request whose prefill `cost` on `c` is given.
fn score(c: &Candidate, cost: f64, cfg: &RouterConfig) -> f64 {
    let load = pending_work(c, cost, cfg);
    if cfg.smetric_batch_term {
        load.max(1.0) * (c.bs + 1) as f64
    } else {
        load
    }
}

impl Smetric {
    fn overloaded(input: &SelectionInput<'_>) -> impl Fn(&Candidate) -> bool + use<> {
        let c = input.candidates;
        let len = c.len() as f64;
        let mean_q = c.iter().map(|x| x.queued).sum::<u64>() as f64 / len;
        let mean_bs = c.iter().map(|x| x.bs).sum::<u64>() as f64 / len;
        let cfg = input.config;
        let (factor, slack_q, slack_bs) = (
            cfg.overload_factor,
            cfg.overload_slack_tokens,
            cfg.overload_slack_requests,
        );
        move |x: &Candidate| x.queued as f64 > factor * mean_q + slack_q || x.bs as f64 > factor * mean_bs + slack_bs
    }

    /// Whether `c` lacks the GPU KV for `need` more tokens (always false without `smetric_kv_fit`).
    fn full(input: &SelectionInput<'_>, c: &Candidate, need: f64) -> bool {
        let cfg = input.config;
        let capacity = cfg.local_capacity_blocks as f64 * f64::from(input.block_size);
        cfg.smetric_kv_fit && c.active as f64 + need > capacity
    }
}

impl Policy for Smetric {
    fn name(&self) -> &'static str {
        "smetric"
    }

    fn select(&self, input: &SelectionInput<'_>) -> Selection {
        if input.config.smetric_rule == SmetricRule::V2 {
            return smetric_paper::select(input);
        }
        let c = input.candidates;
        let cfg = input.config;
        let (n, g, f) = (
            input.num_tokens,
            input.global_hit_tokens.min(input.num_tokens),
            cfg.global_fetch_cost,
        );
        if input.first_turn {
            let blind = (n - g) as f64 + g as f64 * f;
            let need = n as f64 + cfg.smetric_growth_headroom_tokens;
            let roomy = |i: usize| !Self::full(input, &c[i], need);
            let any_roomy = (0..c.len()).any(roomy);
            let first_score = |i: usize| {
                let load = c[i].queued as f64 + blind + cfg.smetric_active_weight * c[i].active as f64;
                if cfg.smetric_batch_term {
                    load * (c[i].bs + 1) as f64
                } else {
                    load
                }
            };
            let index = argmin_by(c.len(), input.rng, |i| !any_roomy || roomy(i), first_score).unwrap_or(0);
            return Selection {
                index,
                reason: Reason::FirstTurnLeastLoaded,
            };
        }
        let follow_score = |i: usize| score(&c[i], cost(&c[i], n, g, f, cfg.host_fetch_cost), cfg);
        // The home holds the session's prefix on its GPU or in its own host pool.
        let best_hit = c.iter().map(Candidate::resident_hit_tokens).max().unwrap_or(0);
        let home = argmin_by(
            c.len(),
            input.rng,
            |i| c[i].resident_hit_tokens() == best_hit,
            follow_score,
        )
        .unwrap_or(0);
        let roomy = |i: usize| !Self::full(input, &c[i], n as f64);
        let any_roomy = (0..c.len()).any(roomy);
        let target = |i: usize| !any_roomy || roomy(i);
        let evicted = (c[home].resident_hit_tokens() as f64) < cfg.min_local_hit_ratio * n as f64;
        let by_cost = match cfg.smetric_migration {
            MigrationRule::Threshold => false,
            MigrationRule::Cost | MigrationRule::Work => true,
            MigrationRule::Fetch => g as f64 >= cfg.min_local_hit_ratio * n as f64,
        };
        if by_cost {
            let best = argmin_by(c.len(), input.rng, target, follow_score).unwrap_or(home);
            let compared = |i: usize| {
                if cfg.smetric_migration == MigrationRule::Work {
                    pending_work(&c[i], cost(&c[i], n, g, f, cfg.host_fetch_cost), cfg)
                } else {
                    follow_score(i)
                }
            };
            if target(home) && compared(home) <= (1.0 + cfg.smetric_migration_margin) * compared(best) {
                return Selection {
                    index: home,
                    reason: Reason::Sticky,
                };
            }
            let reason = if evicted {
                Reason::MigrateEvicted
            } else {
                Reason::MigrateCheaper
            };
            return Selection { index: best, reason };
        }
        if evicted {
            let index = argmin_by(c.len(), input.rng, target, follow_score).unwrap_or(0);
            return Selection {
                index,
                reason: Reason::MigrateEvicted,
            };
        }
        let overloaded = Self::overloaded(input);
        // A home without room is left even when no instance has room: the least score of all
        // then decides (often the home itself, which its local hit makes cheapest).
        let blocked = |i: usize| overloaded(&c[i]) || !roomy(i);
        if blocked(home) {
            let all_blocked = (0..c.len()).all(blocked);
            let index = argmin_by(c.len(), input.rng, |i| all_blocked || !blocked(i), follow_score).unwrap_or(home);
            return Selection {
                index,
                reason: Reason::MigrateOverloaded,
            };
        }
        Selection {
            index: home,
            reason: Reason::Sticky,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RouterConfig;
    use crate::policy::argmin;
    use crate::policy::test_support::{cand, input};
    use crate::rng::DrawCounter;

    #[test]
    fn first_turn_ignores_local_hits() {
        for cfg in [RouterConfig::V1, RouterConfig::default()] {
            let rng = DrawCounter::new(0);
            let c = [cand(0, 4000, 3, 0), cand(1, 0, 0, 0), cand(2, 4000, 1, 0)];
            let s = Smetric.select(&input(&c, 4200, true, &cfg, &rng));
            assert_eq!((s.index, s.reason), (1, Reason::FirstTurnLeastLoaded));
        }
    }

    #[test]
    fn follow_up_sticks_then_migrates() {
        let (cfg, rng) = (RouterConfig::V1, DrawCounter::new(0));
        let c = [cand(0, 0, 0, 0), cand(1, 9000, 3, 0), cand(2, 0, 2, 0)];
        let s = Smetric.select(&input(&c, 10_000, false, &cfg, &rng));
        assert_eq!((s.index, s.reason), (1, Reason::Sticky));
        // Home overloaded: 20 requests vs mean ≈ 7.3 → 1.5·7.3 + 4 ≈ 15 < 20.
        let c = [cand(0, 0, 0, 0), cand(1, 9000, 20, 0), cand(2, 0, 2, 0)];
        let s = Smetric.select(&input(&c, 10_000, false, &cfg, &rng));
        assert_eq!((s.index, s.reason), (0, Reason::MigrateOverloaded));
        // Home evicted: only 2,000 of 10,000 tokens left.
        let c = [cand(0, 0, 0, 0), cand(1, 2000, 3, 0), cand(2, 0, 2, 0)];
        let s = Smetric.select(&input(&c, 10_000, false, &cfg, &rng));
        assert_eq!(s.reason, Reason::MigrateEvicted);
    }

    /// SMetric as it was before the smetric+ switches (commit d532eb1), verbatim: the
    /// `smetric_v1` preset (formerly `smetric_paper`) must decide exactly as it did.
    fn before_switches(input: &SelectionInput<'_>) -> Selection {
        fn score(c: &Candidate, n: u64, global: u64, fetch: f64, host_fetch: f64) -> f64 {
            (c.queued as f64 + cost(c, n, global, fetch, host_fetch)).max(1.0) * (c.bs + 1) as f64
        }
        let c = input.candidates;
        let (n, g, f, hf) = (
            input.num_tokens,
            input.global_hit_tokens.min(input.num_tokens),
            input.config.global_fetch_cost,
            input.config.host_fetch_cost,
        );
        if input.first_turn {
            let blind = (n - g) as f64 + g as f64 * f;
            let index = argmin(c.len(), input.rng, |i| {
                (c[i].queued as f64 + blind) * (c[i].bs + 1) as f64
            });
            return Selection {
                index,
                reason: Reason::FirstTurnLeastLoaded,
            };
        }
        let best_hit = c.iter().map(Candidate::resident_hit_tokens).max().unwrap_or(0);
        let home = argmin_by(
            c.len(),
            input.rng,
            |i| c[i].resident_hit_tokens() == best_hit,
            |i| score(&c[i], n, g, f, hf),
        )
        .unwrap_or(0);
        if (c[home].resident_hit_tokens() as f64) < input.config.min_local_hit_ratio * n as f64 {
            let index = argmin(c.len(), input.rng, |i| score(&c[i], n, g, f, hf));
            return Selection {
                index,
                reason: Reason::MigrateEvicted,
            };
        }
        let overloaded = Smetric::overloaded(input);
        if overloaded(&c[home]) {
            let all_overloaded = c.iter().all(&overloaded);
            let index = argmin_by(
                c.len(),
                input.rng,
                |i| all_overloaded || !overloaded(&c[i]),
                |i| score(&c[i], n, g, f, hf),
            )
            .unwrap_or(home);
            return Selection {
                index,
                reason: Reason::MigrateOverloaded,
            };
        }
        Selection {
            index: home,
            reason: Reason::Sticky,
        }
    }

    #[test]
    fn paper_preset_decides_as_before_the_switches() {
        let cfg = RouterConfig::V1;
        let draws_src = DrawCounter::new(7);
        let mut differ_from_default = 0;
        for case in 0..4000u64 {
            let len = 1 + draws_src.pick(6);
            let n = 1 + draws_src.pick(300_000) as u64;
            let c: Vec<Candidate> = (0..len)
                .map(|slot| Candidate {
                    slot: slot as u32,
                    name_hash: 0,
                    local_hit_tokens: [0, n / 4, n / 2, n - n / 10, n][draws_src.pick(5)],
                    host_hit_tokens: 0,
                    bs: draws_src.pick(12) as u64,
                    waiting: 0,
                    queued: [0, 1000, 9000, 40_000][draws_src.pick(4)],
                    active: draws_src.pick(300_000) as u64,
                    queued_work: draws_src.pick(300_000) as u64,
                    drain_rate: 20_000.0,
                    peer_drain_rate: None,
                    recent_requests: 0,
                    recent_cost_us: 0,
                    decode_room_s: None,
                    evicted_age_s: None,
                    tpot_s: None,
                    fetch_cost: 0.0,
                })
                .collect();
            let mut sel = input(&c, n, draws_src.pick(3) == 0, &cfg, &draws_src);
            sel.global_hit_tokens = [0, n / 3, n][draws_src.pick(3)];
            let (rng_now, rng_then) = (DrawCounter::new(case), DrawCounter::new(case));
            let now = Smetric.select(&SelectionInput { rng: &rng_now, ..sel });
            let then = before_switches(&SelectionInput { rng: &rng_then, ..sel });
            assert_eq!(now, then, "case {case}: {c:?}");
            assert_eq!(rng_now.draws(), rng_then.draws(), "case {case}");
            let rng_new = DrawCounter::new(case);
            let default = RouterConfig::default();
            let new = Smetric.select(&SelectionInput {
                rng: &rng_new,
                config: &default,
                ..sel
            });
            differ_from_default += usize::from(new != now);
        }
        assert!(
            differ_from_default > 100,
            "the new defaults must change decisions: {differ_from_default}"
        );
    }

    #[test]
    fn kv_fit_skips_instances_without_room() {
        let cfg = RouterConfig {
            smetric_kv_fit: true,
            local_capacity_blocks: 100,
            ..RouterConfig::V1
        };
        let rng = DrawCounter::new(0);
        // 1,600 tokens of KV each (100 blocks of 16). Instance 1 is idle by the score but has
        // 1,200 tokens in flight: a 1,000-token first turn does not fit there.
        let mut c = [cand(0, 0, 2, 0), cand(1, 0, 0, 0), cand(2, 0, 3, 0)];
        c[1].active = 1200;
        let s = Smetric.select(&input(&c, 1000, true, &cfg, &rng));
        assert_eq!(s.index, 0);
        let paper = Smetric.select(&input(&c, 1000, true, &RouterConfig::V1, &rng));
        assert_eq!(paper.index, 1);
        // A follow-up whose home has no room leaves it as if overloaded.
        let mut c = [cand(0, 0, 1, 0), cand(1, 900, 1, 0)];
        c[1].active = 1000;
        let s = Smetric.select(&input(&c, 1000, false, &cfg, &rng));
        assert_eq!((s.index, s.reason), (0, Reason::MigrateOverloaded));
        // When no instance has room, the least score of all decides: here the home.
        c[0].active = 1000;
        let s = Smetric.select(&input(&c, 1000, false, &cfg, &rng));
        assert_eq!((s.index, s.reason), (1, Reason::MigrateOverloaded));
    }

    #[test]
    fn cost_rule_compares_home_with_the_best_score() {
        let cfg = RouterConfig {
            smetric_migration: MigrationRule::Cost,
            smetric_migration_margin: 0.25,
            ..RouterConfig::V1
        };
        let rng = DrawCounter::new(0);
        // Home (1): 1,000 uncached · 7 = 7,000; elsewhere 10,000 · 1 = 10,000 → stay.
        let c = [cand(0, 0, 0, 0), cand(1, 9000, 6, 0)];
        let s = Smetric.select(&input(&c, 10_000, false, &cfg, &rng));
        assert_eq!((s.index, s.reason), (1, Reason::Sticky));
        // Home (1): 1,000 · 13 = 13,000 > 1.25 · 10,000: move, although the thresholds
        // (1.5 · 6 + 4 = 13 ≥ 12 requests) would keep it home.
        let c = [cand(0, 0, 0, 0), cand(1, 9000, 12, 0)];
        let s = Smetric.select(&input(&c, 10_000, false, &cfg, &rng));
        assert_eq!((s.index, s.reason), (0, Reason::MigrateCheaper));
        let paper = Smetric.select(&input(&c, 10_000, false, &RouterConfig::V1, &rng));
        assert_eq!(paper.reason, Reason::Sticky);
    }

    #[test]
    fn fetch_rule_uses_the_cost_rule_only_where_the_tier_holds_the_prompt() {
        let cfg = RouterConfig {
            smetric_migration: MigrationRule::Fetch,
            smetric_migration_margin: 0.25,
            ..RouterConfig::V1
        };
        let rng = DrawCounter::new(0);
        let c = [cand(0, 0, 0, 0), cand(1, 9000, 12, 0)];
        // No tier hit: a move is a re-prefill, the thresholds keep the session home.
        let s = Smetric.select(&input(&c, 10_000, false, &cfg, &rng));
        assert_eq!((s.index, s.reason), (1, Reason::Sticky));
        // The tier holds the whole prompt: a move costs 0.27 a token, so the score moves it.
        let mut sel = input(&c, 10_000, false, &cfg, &rng);
        sel.global_hit_tokens = 10_000;
        let s = Smetric.select(&sel);
        assert_eq!((s.index, s.reason), (0, Reason::MigrateCheaper));
    }

    #[test]
    fn active_weight_and_additive_form() {
        let rng = DrawCounter::new(0);
        // Equal queues and batches; instance 0 decodes 50,000 tokens of context.
        let mut c = [cand(0, 0, 1, 0), cand(1, 0, 1, 0)];
        c[0].active = 50_000;
        c[1].queued = 10_000;
        let paper = Smetric.select(&input(&c, 1000, true, &RouterConfig::V1, &rng));
        assert_eq!(paper.index, 0);
        let weighted = RouterConfig {
            smetric_active_weight: 1.0,
            smetric_batch_term: false,
            ..RouterConfig::V1
        };
        assert_eq!(Smetric.select(&input(&c, 1000, true, &weighted, &rng)).index, 1);
    }
}
