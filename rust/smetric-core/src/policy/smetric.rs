//! `smetric`: session-aware routing for agent workloads (SMetric, IPADS SJTU + Alibaba).
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
//! Invariants: no per-session state (the turn comes from the request); every threshold is
//! a `RouterConfig` field. Complexity: O(N) per decision.

use super::{Candidate, Policy, Reason, Selection, SelectionInput, argmin, argmin_by};

/// SMetric.
#[derive(Debug, Default)]
pub struct Smetric;

/// Tier-aware prefill cost of the request on candidate `c`, in prefilled-token equivalents.
fn cost(c: &Candidate, n: u64, global: u64, fetch: f64) -> f64 {
    c.prefill_tokens(n, global) as f64 + global.saturating_sub(c.local_hit_tokens) as f64 * fetch
}

fn score(c: &Candidate, n: u64, global: u64, fetch: f64) -> f64 {
    (c.queued as f64 + cost(c, n, global, fetch)).max(1.0) * (c.bs + 1) as f64
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
}

impl Policy for Smetric {
    fn name(&self) -> &'static str {
        "smetric"
    }

    fn select(&self, input: &SelectionInput<'_>) -> Selection {
        let c = input.candidates;
        let (n, g, f) = (
            input.num_tokens,
            input.global_hit_tokens.min(input.num_tokens),
            input.config.global_fetch_cost,
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
        let best_hit = c.iter().map(|x| x.local_hit_tokens).max().unwrap_or(0);
        let home = argmin_by(
            c.len(),
            input.rng,
            |i| c[i].local_hit_tokens == best_hit,
            |i| score(&c[i], n, g, f),
        )
        .unwrap_or(0);
        if (c[home].local_hit_tokens as f64) < input.config.min_local_hit_ratio * n as f64 {
            let index = argmin(c.len(), input.rng, |i| score(&c[i], n, g, f));
            return Selection {
                index,
                reason: Reason::MigrateEvicted,
            };
        }
        let overloaded = Self::overloaded(input);
        if overloaded(&c[home]) {
            let all_overloaded = c.iter().all(&overloaded);
            let index = argmin_by(
                c.len(),
                input.rng,
                |i| all_overloaded || !overloaded(&c[i]),
                |i| score(&c[i], n, g, f),
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RouterConfig;
    use crate::policy::test_support::{cand, input};
    use crate::rng::DrawCounter;

    #[test]
    fn first_turn_ignores_local_hits() {
        let (cfg, rng) = (RouterConfig::default(), DrawCounter::new(0));
        let c = [cand(0, 4000, 3, 0), cand(1, 0, 0, 0), cand(2, 4000, 1, 0)];
        let s = Smetric.select(&input(&c, 4200, true, &cfg, &rng));
        assert_eq!((s.index, s.reason), (1, Reason::FirstTurnLeastLoaded));
    }

    #[test]
    fn follow_up_sticks_then_migrates() {
        let (cfg, rng) = (RouterConfig::default(), DrawCounter::new(0));
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
}
