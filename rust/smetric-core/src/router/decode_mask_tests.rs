//! The decode-contract mask end to end (`decode_contract.rs`, `policy/smetric_paper.rs`): live
//! decodes recorded by the lifecycle calls, their balances, the mask's two forms, each with a
//! negative control.

use std::sync::Arc;

use super::*;
use crate::config::DecodeMask;
use crate::ids::{BlockHash, RequestId};
use crate::router::request::{Decision, Prompt, RouteRequest};
use crate::turn::TurnHint;

fn router(mask: DecodeMask) -> Router {
    let config = RouterConfig {
        smetric_decode_mask: mask,
        ..RouterConfig::PAPER
    };
    let names = vec!["i0".to_owned(), "i1".to_owned()];
    Router::new(&names, PolicyKind::Smetric, 16, 0, config).unwrap()
}

/// A first turn of `tokens` cold tokens (a chain of its own), as request `id` at `now`.
fn route(r: &Router, id: u64, tokens: u64, now: f64, exclude: &[&str], output: Option<u64>) -> Decision {
    let chain: Vec<BlockHash> = (0..tokens / 16).map(|k| BlockHash(id << 32 | k)).collect();
    r.route(&RouteRequest {
        turn: TurnHint::Turn(1),
        request_id: Some(RequestId(id)),
        now: Some(now),
        exclude,
        output_tokens: output,
        ..RouteRequest::new(Prompt::Hashes {
            hashes: &chain,
            num_tokens: Some(tokens),
        })
    })
    .unwrap()
}

/// Stream A (8,000 prompt tokens: a 2 s contract fixed part) decodes on `i0`, its first token
/// at `first_token_s`; a 64K-token prefill queues on `i1`. Then a cold 16K first turn (1.61 s
/// of prefill at 21,400 work/s) arrives at `now`: unmasked it goes to `i0` (the lighter
/// queue). Returns where it went.
fn place_beside_a_decode(mask: DecodeMask, first_token_s: f64, a_output: Option<u64>, now: f64) -> Arc<str> {
    let r = router(mask);
    assert_eq!(&*route(&r, 1, 8_000, 0.0, &["i1"], a_output).instance_name, "i0");
    r.on_prefilled_at(RequestId(1), Some(first_token_s)).unwrap();
    assert_eq!(&*route(&r, 2, 64_000, 0.0, &["i0"], None).instance_name, "i1");
    route(&r, 3, 16_000, now, &[], None).instance_name
}

#[test]
fn honest_mask_keeps_a_prefill_off_a_live_decode_it_would_break() {
    // A's balance at the contract's pace: 2 + 0.02·(1 + (t − 1)/0.02) − t = 1.02 s < 1.61 s.
    assert_eq!(&*place_beside_a_decode(DecodeMask::Honest, 1.0, None, 2.0), "i1");
    // Negative control: the mask off places it on the unsafe instance.
    assert_eq!(&*place_beside_a_decode(DecodeMask::Off, 1.0, None, 2.0), "i0");
}

#[test]
fn a_blown_stream_is_exempt() {
    // A's first token came at 3 s, past its 2 s fixed part: its balance is 2.02 − 3 < 0, so it
    // protects nothing and `i0` is safe again.
    assert_eq!(&*place_beside_a_decode(DecodeMask::Honest, 3.0, None, 4.0), "i0");
}

#[test]
fn oracle_mask_protects_the_stream_at_its_recorded_end() {
    // A records 5 output tokens: at 2 s its end-of-stream balance is 2 + 5·0.02 − 2 = 0.1 s.
    assert_eq!(&*place_beside_a_decode(DecodeMask::Oracle, 1.0, Some(5), 2.0), "i1");
    // Negative control: the mask off places it on the unsafe instance.
    assert_eq!(&*place_beside_a_decode(DecodeMask::Off, 1.0, Some(5), 2.0), "i0");
    // At 2.2 s the oracle knows A has lost its contract (2.1 − 2.2 < 0): exempt. The honest
    // form, which sees only what A has emitted, still protects it (1.02 s of balance).
    assert_eq!(&*place_beside_a_decode(DecodeMask::Oracle, 1.0, Some(5), 2.2), "i0");
    assert_eq!(&*place_beside_a_decode(DecodeMask::Honest, 1.0, Some(5), 2.2), "i1");
}

#[test]
fn finished_streams_teach_the_decode_pace_only_under_the_mask() {
    for (mask, learns) in [(DecodeMask::Honest, true), (DecodeMask::Off, false)] {
        let r = router(mask);
        route(&r, 1, 1_600, 0.0, &["i1"], None);
        r.on_prefilled_at(RequestId(1), Some(0.5)).unwrap();
        // 101 tokens in 4 s after the first: 40 ms per token.
        r.on_finished_at(RequestId(1), 101, Some(4.5)).unwrap();
        let pace = r.fleet.load().member(0).unwrap().load.decode_pace.or(0.0);
        assert_eq!(pace > 0.0, learns, "{mask:?}");
        if learns {
            assert!((pace - 0.040).abs() < 1e-12, "{pace}");
        }
    }
}

#[test]
fn lifecycle_calls_may_wait_only_behind_the_long_holds() {
    // The binding keeps the GIL through a lifecycle call unless this says it may wait: the
    // decode mask (a decision's pass over the in-flight table) or exact mode's answer credit
    // (the index's exclusive lock behind a decision's write).
    assert!(router(DecodeMask::Honest).lifecycle_may_wait());
    assert!(router(DecodeMask::Oracle).lifecycle_may_wait());
    assert!(!router(DecodeMask::Off).lifecycle_may_wait());
    let names = vec!["i0".to_owned(), "i1".to_owned()];
    let with = |config: RouterConfig| Router::new(&names, PolicyKind::Smetric, 16, 0, config).unwrap();
    assert!(!with(RouterConfig::default()).lifecycle_may_wait());
    let exact = RouterConfig {
        index_mode: IndexMode::Exact,
        ..RouterConfig::default()
    };
    assert!(!with(exact.clone()).lifecycle_may_wait());
    assert!(
        with(RouterConfig {
            exact_answer_credit: true,
            ..exact
        })
        .lifecycle_may_wait()
    );
}
