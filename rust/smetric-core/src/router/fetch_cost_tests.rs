//! The tier fetch's cost end to end (`fetch_cost.rs`): learned per instance from the lifecycle
//! calls a deployment makes, charged on the load board and priced into `smetric` v2's work,
//! with a negative control.

use super::test_routes::route_chain;
use super::*;
use crate::ids::BlockHash;
use crate::policy::prefill_work;
use crate::router::request::Decision;

const RATE: f64 = 20_000.0;
const FIRST: u64 = 8_192;
const FOLLOW_UP: u64 = 9_216;

fn router(learn: bool) -> Router {
    // A fixed drain rate, so that the first tokens below mean exactly one fetch cost.
    let config = RouterConfig {
        smetric_learn_fetch_cost: learn,
        smetric_drain_rate: Some(RATE),
        ..RouterConfig::default()
    };
    let names = vec!["i0".to_owned(), "i1".to_owned()];
    Router::new(&names, PolicyKind::Smetric, 16, 0, config).unwrap()
}

/// Request `id` of session `session` (turn 1: `FIRST` tokens; turn 2: the same chain
/// continued to `FOLLOW_UP`), at `now`, kept off `exclude`.
fn route(r: &Router, id: u64, session: u64, turn: u32, now: f64, exclude: &[&str]) -> Decision {
    let tokens = if turn == 1 { FIRST } else { FOLLOW_UP };
    let chain: Vec<BlockHash> = (0..tokens / 16).map(|k| BlockHash(session << 32 | k)).collect();
    route_chain(r, id, &chain, tokens, turn, now, exclude)
}

/// The work computed for a follow-up that loads its first turn's `FIRST` tokens.
fn computed() -> u64 {
    prefill_work(FOLLOW_UP - FIRST, FOLLOW_UP, RouterConfig::DEFAULT.smetric_l_eq_tokens)
}

/// Sessions whose first turn ran on `i0` (so the store holds it) and whose follow-up is sent
/// to `i1`, which loads the first turn from the store; each follow-up's first token comes as
/// if a loaded token cost `true_cost` work units. Returns the work `i1`'s board was charged
/// for each follow-up.
fn teach(r: &Router, sessions: u64, true_cost: f64) -> Vec<u64> {
    let mut charged = Vec::new();
    for s in 0..sessions {
        let t = s as f64 * 10.0;
        let first = route(r, 2 * s, s, 1, t, &["i1"]);
        r.on_prefilled_at(first.request_id, Some(t + 0.5)).unwrap();
        r.on_finished_at(first.request_id, 1, Some(t + 0.6)).unwrap();
        let follow_up = route(r, 2 * s + 1, s, 2, t + 1.0, &["i0"]);
        assert_eq!(
            (
                &*follow_up.instance_name,
                follow_up.global_hit_tokens,
                follow_up.local_hit_tokens
            ),
            ("i1", FIRST, 0)
        );
        charged.push(r.load("i1").unwrap().queued_work);
        let elapsed = (computed() as f64 + true_cost * FIRST as f64) / RATE;
        r.on_prefilled_at(follow_up.request_id, Some(t + 1.0 + elapsed))
            .unwrap();
        r.on_finished_at(follow_up.request_id, 1, Some(t + 2.0 + elapsed))
            .unwrap();
    }
    charged
}

#[test]
fn the_fetch_cost_is_learned_and_charged() {
    let r = router(true);
    let charged = teach(&r, 12, 0.1);
    let min_samples = RouterConfig::DEFAULT.smetric_drain_min_samples as usize;
    // Until it has its samples, a follow-up is charged its fetch at `global_fetch_cost`.
    let fallback = (0.27 * FIRST as f64).ceil() as u64;
    assert!(
        charged[..min_samples].iter().all(|&w| w == computed() + fallback),
        "{charged:?}"
    );
    // Then at the learned cost: the first token's clock is in whole milliseconds, 20 work.
    let learned = r.load("i1").unwrap().fetch_cost.expect("learned from 12 follow-ups");
    assert!((learned - 0.1).abs() < 0.005, "learned {learned}");
    let at_learned = computed() + (learned * FIRST as f64).ceil() as u64;
    assert_eq!(charged[min_samples..], vec![at_learned; 12 - min_samples][..]);
    // `i0` fetched nothing and learned nothing.
    assert_eq!(r.load("i0").unwrap().fetch_cost, None);
    // A dearer path is learned as dearer.
    let slow = router(true);
    teach(&slow, 12, 0.6);
    let learned = slow.load("i1").unwrap().fetch_cost.unwrap();
    assert!((learned - 0.6).abs() < 0.005, "learned {learned}");
}

#[test]
fn with_the_option_off_nothing_is_learned_or_charged() {
    let r = router(false);
    let charged = teach(&r, 12, 0.1);
    assert!(charged.iter().all(|&w| w == computed()), "{charged:?}");
    assert_eq!(r.load("i1").unwrap().fetch_cost, None);
}
