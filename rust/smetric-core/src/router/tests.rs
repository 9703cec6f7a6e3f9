use std::sync::Arc;

use super::*;
use crate::error::SmetricError;
use crate::ids::BlockHash;
use crate::router::request::{IndexOp, Prompt, RouteRequest, Tier};

fn names(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("i{i}")).collect()
}

#[test]
fn follow_up_returns_home_and_lifecycle_balances() {
    let r = Router::new(&names(4), PolicyKind::Smetric, 4, 1, RouterConfig::default()).unwrap();
    let turn1: Vec<u32> = (0..40).collect();
    let d1 = r
        .route(&RouteRequest {
            now: Some(0.0),
            ..RouteRequest::new(Prompt::Tokens(&turn1))
        })
        .unwrap();
    assert!(d1.first_turn);
    let mut turn2 = turn1.clone();
    turn2.extend(100..140);
    let d2 = r
        .route(&RouteRequest {
            now: Some(1.0),
            ..RouteRequest::new(Prompt::Tokens(&turn2))
        })
        .unwrap();
    assert!(!d2.first_turn);
    assert_eq!(d2.instance, d1.instance);
    assert_eq!(d2.local_hit_tokens, 40);
    for id in [d1.request_id, d2.request_id] {
        assert!(r.on_prefilled(id));
        assert!(r.on_finished(id, 10));
        assert!(!r.on_finished(id, 10), "a second finish changes nothing");
    }
    let l = r.load(&d1.instance_name).unwrap();
    assert_eq!((l.bs, l.waiting, l.queued, l.active), (0, 0, 0, 0));
    assert_eq!(r.stats().unknown_request_events, 2);
}

#[test]
fn removed_instance_is_never_chosen_and_slot_reuse_is_safe() {
    let r = Router::new(&names(2), PolicyKind::RoundRobin, 16, 0, RouterConfig::default()).unwrap();
    let d = r.route(&RouteRequest::new(Prompt::Tokens(&[1, 2, 3]))).unwrap();
    let gone = d.instance_name.clone();
    r.remove_instance(&gone).unwrap();
    r.add_instance("new").unwrap();
    assert!(
        !r.on_finished(d.request_id, 0),
        "the new occupant's counters are not touched"
    );
    let l = r.load("new").unwrap();
    assert_eq!(l.bs, 0);
    for _ in 0..4 {
        let d = r.route(&RouteRequest::new(Prompt::Tokens(&[1, 2, 3]))).unwrap();
        assert_ne!(d.instance_name, gone);
    }
    assert!(matches!(
        r.add_instance("new"),
        Err(SmetricError::DuplicateInstance { .. })
    ));
    assert!(matches!(
        r.remove_instance("zzz"),
        Err(SmetricError::UnknownInstance { .. })
    ));
}

#[test]
fn bad_construction() {
    assert!(matches!(
        Router::new(&[], PolicyKind::Smetric, 16, 0, RouterConfig::default()),
        Err(SmetricError::NoInstances)
    ));
    assert!(matches!(
        Router::new(&names(1), PolicyKind::Smetric, 0, 0, RouterConfig::default()),
        Err(SmetricError::InvalidBlockSize { .. })
    ));
    let r = Router::new(&names(1), PolicyKind::Smetric, 16, 0, RouterConfig::default()).unwrap();
    r.remove_instance("i0").unwrap();
    assert!(matches!(
        r.route(&RouteRequest::new(Prompt::Tokens(&[1]))),
        Err(SmetricError::NoInstances)
    ));
}

#[test]
fn apply_blocks_matches_one_call_per_op() {
    let (a, b) = (BlockHash(11), BlockHash(12));
    let ops = [
        IndexOp::Store {
            tier: Tier::Local,
            hashes: &[a, b],
            parent: None,
        },
        IndexOp::Store {
            tier: Tier::Global,
            hashes: &[a],
            parent: None,
        },
        IndexOp::Remove {
            tier: Tier::Local,
            hashes: &[b],
        },
    ];
    let hits = |r: &Router| {
        let h = r
            .query(
                Prompt::Hashes {
                    hashes: &[a, b],
                    num_tokens: Some(9),
                },
                None,
                Some(0.0),
            )
            .unwrap();
        (h.local, h.global_hit_tokens)
    };
    let batched = Router::new(&names(2), PolicyKind::Smetric, 4, 0, RouterConfig::default()).unwrap();
    batched.apply_blocks(Some("i1"), &ops, Some(0.0)).unwrap();
    let single = Router::new(&names(2), PolicyKind::Smetric, 4, 0, RouterConfig::default()).unwrap();
    single
        .store_blocks(Some("i1"), Tier::Local, &[a, b], None, Some(0.0))
        .unwrap();
    single.store_blocks(None, Tier::Global, &[a], None, Some(0.0)).unwrap();
    single.remove_blocks(Some("i1"), Tier::Local, &[b]).unwrap();
    assert_eq!(hits(&batched), hits(&single));
    assert_eq!(hits(&batched).1, 4);
    // Ops on an unknown instance fail; the others still apply.
    let r = Router::new(&names(1), PolicyKind::Smetric, 4, 0, RouterConfig::default()).unwrap();
    assert!(matches!(
        r.apply_blocks(Some("zzz"), &ops, Some(0.0)),
        Err(SmetricError::UnknownInstance { .. })
    ));
    assert_eq!(hits(&r), (vec![(Arc::from("i0"), 0)], 4));
}
