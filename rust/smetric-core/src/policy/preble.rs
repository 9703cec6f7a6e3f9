//! `preble`: Preble's routing rule as AIBrix ports it, the "Preble (AIBrix port)" baseline of
//! the SMetric paper (arXiv 2607.08565 v2).
//!
//! Sources, read and restated here in our words: AIBrix's port,
//! `pkg/plugins/gateway/algorithms/prefix_cache_preble.go` in `vllm-project/aibrix` (read at
//! `0338af7` and `6ae9628`; routing algorithm `prefix-cache-preble`), and the SMetric
//! authors' re-implementation of that port as they ran it (`python/ssched/scheduler/policy/
//! external.py`, class `AibrixPreble`, in `clateral912/smetric-router-repro` at `a1c815b`,
//! which froze AIBrix at `e397f98`). Preble itself (Srivatsa et al., `WukLab/preble`) places a
//! request on the instance with the longest cached prefix when that prefix is long (exploit),
//! else on the least of a cost that adds each instance's load over a recent window (prefill of
//! the missed tokens plus decode), the eviction the request would cause, and its own missed
//! prefill (explore). AIBrix keeps the two branches and simplifies the cost; this file follows
//! AIBrix, mapping what its gateway observes to what this router observes.
//!
//! The peer form. AIBrix keeps a radix tree of every prompt it routed (a node lists the pods
//! it sent a prompt through there; nodes idle for 5 minutes are evicted) and a 3-minute
//! histogram of routed prompts (one entry per routing, keyed by the prompt's tree node):
//! 1. (in the version the SMetric authors froze) when the pods' running-request counts differ
//!    by more than 8, only the pods with the fewest are candidates;
//! 2. `ratio` = the prompt's longest match anywhere in the tree / its length; if `ratio > 0.5`,
//!    exploit: walk up from the match to the deepest node held by a candidate and take the
//!    candidate there with the fewest histogram entries on nodes it holds;
//! 3. else explore: the candidate with the least cost, the sum over the histogram's nodes it
//!    holds of `miss · count · T(new, context) + 45 · 0.15`, where `miss` is the node's own
//!    (new) tokens over its context, `T` a fixed V100/Mistral-7B prefill-time model
//!    (linear-layer, attention and quadratic-attention curves over 0.9 utilisation, seconds)
//!    and `45 · 0.15` a decode cost (a hard-coded 45 output tokens at a default 0.15 s per
//!    token; AIBrix never fills its per-pod time-per-token samples). No eviction cost and no
//!    cost of the request itself, unlike Preble's paper;
//! 4. the chosen pod is added to the prompt's tree path and the prompt to the histogram, at
//!    routing, never rolled back.
//!
//! Mapping to this router (nothing else differs):
//! * running requests → `bs` (the router's in-flight count fused with the engine's);
//! * the tree → the KV$ index: an instance's match is its local hit `L_i`, the tree's longest
//!   match is `max_i L_i` over the candidates before the gate, and "the deepest node a
//!   candidate holds" is the gated candidates with the largest `L_i` — all of them when that
//!   is 0 (AIBrix's root, which lists every pod it ever routed to). The index's TTL and
//!   capacity stand in for the tree's 5-minute eviction;
//! * the histogram → each instance's window of its own routings (`recent_load.rs`, one entry
//!   per request charged to the instance it went to, `preble_window_s`). AIBrix charges a
//!   node's entries to every pod the node lists, so a session moved to a new pod brings its
//!   earlier entries to that pod too; per-request charging does not. `recent_requests` stands
//!   for the exploit count and `recent_cost_us` for the explore cost;
//! * an entry's cost (recorded by the router after each decision, [`routed_cost_us`]) takes
//!   `new = n − max_i L_i` and `context = n`: a prompt routed once is one tree node, its own
//!   tokens what the tree did not hold. `miss = new / n` (1 when `n = 0`), `count = 1`;
//! * ties: AIBrix takes the first of equal pods in map order (exploit) or pod-list order
//!   (explore); here ties are at random, as every policy here breaks them.
//!
//! Invariants: reads `preble_window_s` (through the router), `preble_hit_threshold` and
//! `preble_imbalance_requests`; the candidates' `recent_*` fields are the only state, kept by
//! the router; an entry's cost is whole microseconds, so sums are exact.
//!
//! Complexity: O(N) per decision, three passes (the gate's range, the longest match, the
//! argmin); the window reads are the router's (`recent_load.rs`).

use super::{Candidate, Policy, Reason, Selection, SelectionInput, argmin_by};

/// AIBrix's hard-coded decode length of every request, tokens.
const DECODE_TOKENS: f64 = 45.0;
/// AIBrix's default time per output token, seconds (its per-pod samples are never filled).
const TIME_PER_TOKEN_S: f64 = 0.15;
/// The utilisation AIBrix divides its prefill-time model by.
const UTILISATION: f64 = 0.9;

/// AIBrix's V100 linear-layer time of `t` tokens, seconds (its A6000 Mistral-7B fit scaled ×2.5).
fn linear_time_s(t: f64) -> f64 {
    if t >= 384.0 {
        (0.271_064_28 * t + 10.524_442_63) / 1000.0
    } else if t >= 192.0 {
        (-295.0 + 3.125 * t - 6.4e-3 * (t * t)) / 1000.0
    } else {
        55.0 / 1000.0
    }
}

/// AIBrix's V100 attention time of one request of `context` tokens, `unique` of them new,
/// seconds (halved when the new tokens are few).
fn attention_time_s(context: u64, unique: u64) -> f64 {
    let unique = if unique == 0 { context } else { unique };
    if context <= 1024 {
        return 0.80 / 1000.0;
    }
    let mut forward = 4.65e-4 * context as f64 + 0.398;
    // Upstream also requires `requests · unique <= 32 · 256 · 2048`, implied for one request.
    if unique <= 1024 {
        forward /= 2.0;
    }
    forward / 1000.0
}

/// AIBrix's V100 quadratic-attention time of `t` new tokens, seconds (0 below 4,096).
fn quadratic_time_s(t: f64) -> f64 {
    if t >= 4096.0 {
        (-18.425 + 9.65e-3 * t + 5.4e-6 * (t * t)) / 1000.0
    } else {
        0.0
    }
}

/// AIBrix's cost of one routed prompt of `context` tokens, `new` of them not in its tree,
/// seconds: `miss · T(new, context) + 45 · 0.15`.
fn entry_cost_s(new: u64, context: u64) -> f64 {
    let miss = if context > 0 { new as f64 / context as f64 } else { 1.0 };
    let t = new as f64;
    let prefill = (linear_time_s(t) + attention_time_s(context, new) + quadratic_time_s(t)) / UTILISATION;
    miss * prefill + DECODE_TOKENS * TIME_PER_TOKEN_S
}

/// The longest cached prefix of the prompt over `candidates` (AIBrix's tree match).
fn tree_match(candidates: &[Candidate]) -> u64 {
    candidates.iter().map(|c| c.local_hit_tokens).max().unwrap_or(0)
}

/// What a request of `num_tokens` adds to the window of the instance it is routed to, whole
/// microseconds (truncated): [`entry_cost_s`] with `new = n − max_i L_i` over the candidates.
pub(crate) fn routed_cost_us(num_tokens: u64, candidates: &[Candidate]) -> u64 {
    let new = num_tokens - tree_match(candidates).min(num_tokens);
    (entry_cost_s(new, num_tokens) * 1e6) as u64
}

/// Preble as AIBrix ports it.
#[derive(Debug, Default)]
pub struct Preble;

impl Policy for Preble {
    fn name(&self) -> &'static str {
        "preble"
    }

    fn select(&self, input: &SelectionInput<'_>) -> Selection {
        let c = input.candidates;
        let cfg = input.config;
        let lo = c.iter().map(|x| x.bs).min().unwrap_or(0);
        let hi = c.iter().map(|x| x.bs).max().unwrap_or(0);
        let imbalanced = hi - lo > cfg.preble_imbalance_requests;
        let gated = |i: usize| !imbalanced || c[i].bs == lo;
        let n = input.num_tokens;
        let ratio = if n > 0 { tree_match(c) as f64 / n as f64 } else { 0.0 };
        if ratio > cfg.preble_hit_threshold {
            let longest = (0..c.len())
                .filter(|&i| gated(i))
                .map(|i| c[i].local_hit_tokens)
                .max()
                .unwrap_or(0);
            let holds = |i: usize| gated(i) && c[i].local_hit_tokens == longest;
            if let Some(index) = argmin_by(c.len(), input.rng, holds, |i| c[i].recent_requests as f64) {
                return Selection {
                    index,
                    reason: Reason::PrebleExploit,
                };
            }
        }
        let index = argmin_by(c.len(), input.rng, gated, |i| c[i].recent_cost_us as f64).unwrap_or(0);
        Selection {
            index,
            reason: Reason::PrebleExplore,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RouterConfig;
    use crate::policy::test_support::{cand, input};
    use crate::rng::DrawCounter;

    fn with_window(mut c: Candidate, requests: u64, cost_us: u64) -> Candidate {
        c.recent_requests = requests;
        c.recent_cost_us = cost_us;
        c
    }

    #[test]
    fn a_long_match_goes_to_the_least_counted_holder_of_it() {
        let cfg = RouterConfig::default();
        let rng = DrawCounter::new(0);
        // 1,000 tokens; instances 1 and 2 hold 600 (> 0.5), instance 0 holds 100 and is idle.
        let c = [
            with_window(cand(0, 100, 0, 0), 0, 0),
            with_window(cand(1, 600, 3, 0), 5, 1),
            with_window(cand(2, 600, 3, 0), 4, 9_000_000),
        ];
        let s = Preble.select(&input(&c, 1_000, false, &cfg, &rng));
        assert_eq!(
            (s.index, s.reason),
            (2, Reason::PrebleExploit),
            "the fewest entries, whatever their cost"
        );
        assert_eq!(rng.draws(), 0);
    }

    #[test]
    fn a_short_match_explores_by_cost() {
        let cfg = RouterConfig::default();
        let rng = DrawCounter::new(0);
        // 500 of 1,000 tokens is not more than half: explore.
        let c = [
            with_window(cand(0, 500, 0, 0), 0, 7_000_000),
            with_window(cand(1, 0, 2, 0), 9, 6_900_000),
        ];
        let s = Preble.select(&input(&c, 1_000, false, &cfg, &rng));
        assert_eq!((s.index, s.reason), (1, Reason::PrebleExplore));
        // An empty prompt has no ratio: explore too.
        let s = Preble.select(&input(&c, 0, false, &cfg, &rng));
        assert_eq!((s.index, s.reason), (1, Reason::PrebleExplore));
    }

    #[test]
    fn an_imbalanced_fleet_keeps_only_its_least_busy_instances() {
        let cfg = RouterConfig::default();
        let rng = DrawCounter::new(0);
        // In flight 10 and 1: 9 > 8, so only instance 1 is a candidate, though instance 0
        // holds the whole prefix and the tree's ratio still says exploit.
        let c = [
            with_window(cand(0, 900, 10, 0), 0, 0),
            with_window(cand(1, 0, 1, 0), 50, 99_000_000),
        ];
        let s = Preble.select(&input(&c, 1_000, false, &cfg, &rng));
        assert_eq!(
            (s.index, s.reason),
            (1, Reason::PrebleExploit),
            "the root: every gated candidate"
        );
        // A difference of exactly 8 is not imbalanced.
        let c = [
            with_window(cand(0, 900, 9, 0), 0, 0),
            with_window(cand(1, 0, 1, 0), 0, 0),
        ];
        let s = Preble.select(&input(&c, 1_000, false, &cfg, &rng));
        assert_eq!((s.index, s.reason), (0, Reason::PrebleExploit));
        // Explore is gated too.
        let c = [
            with_window(cand(0, 0, 10, 0), 0, 0),
            with_window(cand(1, 0, 1, 0), 50, 99_000_000),
        ];
        let s = Preble.select(&input(&c, 1_000, false, &cfg, &rng));
        assert_eq!((s.index, s.reason), (1, Reason::PrebleExplore));
    }

    #[test]
    fn ties_are_random() {
        let cfg = RouterConfig::default();
        let c = [cand(0, 0, 0, 0), cand(1, 0, 0, 0), cand(2, 0, 0, 0)];
        let picks: Vec<usize> = (0..30)
            .map(|seed| {
                let rng = DrawCounter::new(seed);
                Preble.select(&input(&c, 100, false, &cfg, &rng)).index
            })
            .collect();
        assert!([0, 1, 2].iter().all(|k| picks.contains(k)), "{picks:?}");
    }

    #[test]
    fn entry_costs_follow_the_v100_curves() {
        // A fully cached prompt of 1,000 tokens (one new): 1/1000 · (55 + 0.8) ms / 0.9 + 6.75 s.
        let one = (55.0 / 1000.0 + 0.80 / 1000.0) / 0.9 / 1000.0 + 45.0 * 0.15;
        assert!((entry_cost_s(1, 1000) - one).abs() < 1e-12);
        // A cold 12,000-token prompt: every curve in, no halving (12,000 new tokens > 1,024).
        let t = 12_000.0;
        let linear = (0.271_064_28 * t + 10.524_442_63) / 1000.0;
        let attention = (4.65e-4 * t + 0.398) / 1000.0;
        let quad = (-18.425 + 9.65e-3 * t + 5.4e-6 * t * t) / 1000.0;
        let cold = (linear + attention + quad) / 0.9 + 6.75;
        assert!(
            (entry_cost_s(12_000, 12_000) - cold).abs() < 1e-9,
            "{}",
            entry_cost_s(12_000, 12_000)
        );
        assert!(cold > 11.0 && cold < 12.0, "{cold}");
        // 2,000 new tokens over a 70,000-token context: the decode constant dominates.
        let warm = entry_cost_s(2_000, 70_000);
        assert!(warm > 6.75 && warm < 6.8, "{warm}");
        // The router records n − max L over the candidates, truncated to microseconds.
        let c = [cand(0, 500, 0, 0), cand(1, 999, 0, 0)];
        assert_eq!(routed_cost_us(1_000, &c), (entry_cost_s(1, 1_000) * 1e6) as u64);
        assert_eq!(routed_cost_us(0, &c), (entry_cost_s(0, 0) * 1e6) as u64);
    }
}
