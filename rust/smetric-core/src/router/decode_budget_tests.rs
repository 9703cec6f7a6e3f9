//! The decode budget end to end (`decode_model.rs`, `policy/smetric_paper.rs`): the fleet's
//! decode pace learned from the lifecycle calls a deployment makes, and each candidate's
//! prediction fed to `smetric` v2, with a negative control.

use super::test_routes::route_chain;
use super::*;
use crate::decode_model::PaceFit;
use crate::ids::{BlockHash, RequestId};
use crate::router::request::Decision;

fn router(budget_s: f64) -> Router {
    // The paper's TTFT gate decides stays (the fetch rule would move these follow-ups to the
    // idle instance by score alone, budget or not).
    let config = RouterConfig {
        smetric_tpot_budget_s: budget_s,
        smetric_migration: crate::config::MigrationRule::Threshold,
        ..RouterConfig::default()
    };
    let names = vec!["i0".to_owned(), "i1".to_owned()];
    Router::new(&names, PolicyKind::Smetric, 16, 0, config).unwrap()
}

/// Request `id`: `tokens` prompt tokens of a chain of its own (or, with `prefix_of`, that
/// request's chain continued: a follow-up), at `now`, on `i0` unless `exclude` says otherwise.
fn route(r: &Router, id: u64, tokens: u64, prefix_of: Option<u64>, now: f64, exclude: &[&str]) -> Decision {
    let owner = prefix_of.unwrap_or(id);
    let chain: Vec<BlockHash> = (0..tokens / 16).map(|k| BlockHash(owner << 32 | k)).collect();
    let turn = if prefix_of.is_some() { 2 } else { 1 };
    route_chain(r, id, &chain, tokens, turn, now, exclude)
}

/// Teaches the router 40 streams on `i0`, each decoding 101 tokens at `5 ms + 50 ns × context`
/// beside a background prompt of 1–4 × 16,384 tokens, and releases every request.
fn teach(r: &Router) {
    for k in 0..40u64 {
        let t = k as f64 * 10.0;
        let background = (k % 4 + 1) * 16_384;
        route(r, 1_000 + k, background, None, t, &["i1"]);
        let d = route(r, 2_000 + k, 1_024, None, t, &["i1"]);
        let context = (background + 1_024) as f64;
        let pace = 0.005 + 50e-9 * context;
        r.on_prefilled_at(d.request_id, Some(t + 0.5)).unwrap();
        r.on_finished_at(d.request_id, 101, Some(t + 0.5 + 100.0 * pace))
            .unwrap();
        assert!(r.on_aborted(RequestId(1_000 + k)));
    }
}

#[test]
fn the_pace_is_learned_from_the_lifecycle_calls() {
    let r = router(0.015);
    teach(&r);
    let PaceFit { t0, kappa } = r.decode_model.fit().expect("a fit from 40 streams");
    // The finish clock is in whole milliseconds: 100 tokens, so ≤ 10 µs a token of error.
    assert!(
        (t0 - 0.005).abs() < 2e-5 && (kappa - 50e-9).abs() < 5e-10,
        "{t0} {kappa}"
    );
    // Negative control: with the budget off nothing is learned.
    let off = router(0.0);
    teach(&off);
    assert_eq!(off.decode_model.fit(), None);
}

#[test]
fn a_home_predicted_over_the_budget_loses_its_stay_unless_the_fleet_is_kv_bound() {
    // (budget, tokens decoding at home, expected reason, instance). Predicted paces with the
    // follow-up (2,560 tokens) added: 5 ms + 50 ns × context — at home 11.1 ms beside 120,000
    // tokens, 17.6 ms beside 250,000 (the fleet past 30% of its 573,440 tokens of KV); i1 5.1 ms.
    let cases = [
        (0.010, 120_000, Reason::MigrateTpot, "i1"),
        // Negative control: the budget off keeps it home.
        (0.0, 120_000, Reason::Sticky, "i0"),
        // KV-bound: the stay stands.
        (0.015, 250_000, Reason::Sticky, "i0"),
    ];
    for (budget_s, busy_tokens, expected, instance) in cases {
        let r = router(budget_s);
        teach(&r);
        // Session 7's first turn on i0, finished.
        let first = route(&r, 7, 2_048, None, 500.0, &["i1"]);
        r.on_prefilled_at(first.request_id, Some(500.1)).unwrap();
        r.on_finished_at(first.request_id, 2, Some(500.2)).unwrap();
        // Prompts decoding on i0 (prefilled: no queue ahead, so the home meets its TTFT budget).
        let busy = route(&r, 8, busy_tokens, None, 501.0, &["i1"]);
        r.on_prefilled_at(busy.request_id, Some(501.5)).unwrap();
        let follow_up = route(&r, 9, 2_560, Some(7), 502.0, &[]);
        assert_eq!(
            (follow_up.reason, &*follow_up.instance_name),
            (expected, instance),
            "budget {budget_s}, {busy_tokens} tokens"
        );
    }
}
