use super::*;
use crate::router::{Prompt, RouteRequest};

fn names(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}{i}")).collect()
}

fn router(policy: PolicyKind) -> PdRouter {
    PdRouter::new(
        &names("p", 3),
        &names("d", 2),
        policy,
        4,
        7,
        RouterConfig::default(),
        PdConfig::default(),
    )
    .unwrap()
}

fn route(r: &PdRouter, tokens: &[u32], now: f64) -> PdDecision {
    r.route(&RouteRequest {
        now: Some(now),
        ..RouteRequest::new(Prompt::Tokens(tokens))
    })
    .unwrap()
}

#[test]
fn follow_up_prefills_at_home_and_decodes_where_its_kv_is() {
    // The paper's form: turn 2 arrives while turn 1 is still in flight at home, which the
    // smetric+ defaults (KV-fit, fetch-rule migration) may move; this test is about the phases.
    let r = PdRouter::new(
        &names("p", 3),
        &names("d", 2),
        PolicyKind::Smetric,
        4,
        7,
        RouterConfig::V1,
        PdConfig::default(),
    )
    .unwrap();
    assert_eq!(r.decode_rule(), DecodeRule::KvFit);
    let turn1: Vec<u32> = (0..40).collect();
    let d1 = route(&r, &turn1, 0.0);
    assert!(d1.prefill.first_turn);
    assert_eq!((d1.decode_hit_tokens, d1.transfer_tokens), (0, 40));
    let mut turn2 = turn1.clone();
    turn2.extend(100..140);
    let d2 = route(&r, &turn2, 1.0);
    assert!(!d2.prefill.first_turn);
    assert_eq!(d2.prefill.instance, d1.prefill.instance, "sticky on the prefill side");
    assert_eq!(d2.prefill.local_hit_tokens, 40);
    // The first decode instance has 10 blocks reserved and holds the 10-block prefix: the
    // other one would need 0 + 20 blocks pulled, this one 10 + 10. Tied on tokens, the
    // smaller batch wins, which is the other one.
    assert_ne!(d2.decode_instance, d1.decode_instance);
    // Once both finished, turn 3 goes where turn 2 decoded: that instance's prefix cache
    // holds turn 2's 20 blocks, so only the new 10 are pulled.
    for phase in [
        r.on_prefilled(d1.prefill.request_id),
        r.on_transferred(d1.prefill.request_id),
    ] {
        assert!(phase);
    }
    assert!(r.on_finished(d1.prefill.request_id, 5));
    assert!(r.on_aborted(d2.prefill.request_id));
    let mut turn3 = turn2.clone();
    turn3.extend(200..240);
    let d3 = route(&r, &turn3, 2.0);
    assert_eq!(d3.decode_instance, d2.decode_instance);
    assert_eq!((d3.decode_hit_tokens, d3.transfer_tokens), (80, 40));
}

#[test]
fn every_counter_returns_to_zero_whatever_the_order() {
    for policy in PolicyKind::ALL {
        let r = router(policy);
        let prompts: Vec<Vec<u32>> = (0..12).map(|k| (k * 1000..k * 1000 + 37).collect()).collect();
        let ids: Vec<RequestId> = prompts
            .iter()
            .enumerate()
            .map(|(k, p)| route(&r, p, k as f64).prefill.request_id)
            .collect();
        let loaded = r.stats();
        assert_eq!(loaded.routed, 12);
        assert_eq!(loaded.decode.iter().map(|(_, l)| l.bs).sum::<u64>(), 12);
        assert_eq!(
            loaded.decode.iter().map(|(_, l)| l.reserved_blocks).sum::<u64>(),
            12 * 10
        );
        for (k, &id) in ids.iter().enumerate() {
            match k % 4 {
                0 => {
                    assert!(r.on_prefilled(id));
                    assert!(r.on_transferred(id));
                    assert!(!r.on_transferred(id), "a second transfer end changes nothing");
                    assert!(r.on_finished(id, 3));
                }
                1 => assert!(r.on_finished(id, 3), "finish before the earlier phases"),
                2 => {
                    assert!(r.on_prefilled(id));
                    assert!(r.on_aborted(id));
                }
                _ => {
                    assert!(r.on_transferred(id));
                    assert!(!r.on_prefilled(id), "after the transfer the prefill phase is over");
                    assert!(r.on_finished(id, 3));
                }
            }
            assert!(!r.on_finished(id, 3));
        }
        let s = r.stats();
        assert_eq!(s.in_flight, 0);
        for (_, l) in &s.decode {
            assert_eq!(
                (l.bs, l.reserved_blocks, l.pulling, l.pull_tokens),
                (0, 0, 0, 0),
                "{policy:?}"
            );
        }
        for name in r.prefill().instances() {
            let l = r.prefill().load(&name).unwrap();
            assert_eq!((l.bs, l.waiting, l.queued, l.active), (0, 0, 0, 0), "{policy:?}");
        }
        assert!(s.unknown_request_events >= 12);
    }
}

#[test]
fn prefill_counters_follow_the_phases() {
    let r = router(PolicyKind::Lmetric);
    let p: Vec<u32> = (0..64).collect();
    let d = route(&r, &p, 0.0);
    let id = d.prefill.request_id;
    let l = r.prefill().load(&d.prefill.instance_name).unwrap();
    assert_eq!((l.bs, l.waiting, l.queued), (1, 1, 64));
    r.on_prefilled(id);
    let l = r.prefill().load(&d.prefill.instance_name).unwrap();
    assert_eq!(
        (l.bs, l.waiting, l.queued),
        (1, 0, 0),
        "P holds the request until the transfer"
    );
    let dl = r.decode_load(&d.decode_instance_name).unwrap();
    assert_eq!((dl.bs, dl.pulling, dl.pull_tokens), (1, 1, 64));
    r.on_transferred(id);
    let l = r.prefill().load(&d.prefill.instance_name).unwrap();
    assert_eq!(l.bs, 0);
    let dl = r.decode_load(&d.decode_instance_name).unwrap();
    assert_eq!((dl.bs, dl.pulling, dl.reserved_blocks), (1, 0, 16));
}

#[test]
fn full_decode_instances_are_avoided_and_engine_usage_counts() {
    let pd = PdConfig {
        decode_capacity_blocks: 20,
        ..PdConfig::default()
    };
    let r = PdRouter::new(
        &names("p", 1),
        &names("d", 2),
        PolicyKind::Smetric,
        4,
        0,
        RouterConfig::default(),
        pd,
    )
    .unwrap();
    r.update_decode_load("d0", 0.9, Some(0.0)).unwrap();
    let p: Vec<u32> = (0..40).collect();
    // d0 reports 18 of 20 blocks used: the 10-block context fits only on d1.
    assert_eq!(&*route(&r, &p, 0.5).decode_instance_name, "d1");
    assert!(r.update_decode_load("d9", 0.1, None).is_err());
    assert!(r.update_decode_load("d0", 1.5, None).is_err());
}

#[test]
fn bad_pools_are_refused() {
    let cfg = RouterConfig::default;
    assert!(matches!(
        PdRouter::new(
            &names("p", 2),
            &[],
            PolicyKind::Smetric,
            16,
            0,
            cfg(),
            PdConfig::default()
        ),
        Err(SmetricError::NoInstances)
    ));
    assert!(matches!(
        PdRouter::new(
            &names("x", 2),
            &names("x", 1),
            PolicyKind::Smetric,
            16,
            0,
            cfg(),
            PdConfig::default()
        ),
        Err(SmetricError::DuplicateInstance { .. })
    ));
    let bad = PdConfig {
        decode_max_batch: 0,
        ..PdConfig::default()
    };
    assert!(PdRouter::new(&names("p", 1), &names("d", 1), PolicyKind::Smetric, 16, 0, cfg(), bad).is_err());
}

#[test]
fn excluded_instances_are_skipped_on_both_sides() {
    let r = router(PolicyKind::Smetric);
    let tokens: Vec<u32> = (0..64).collect();
    let exclude = ["p0", "p1", "d0"];
    for _ in 0..6 {
        let d = r
            .route(&RouteRequest {
                exclude: &exclude,
                ..RouteRequest::new(Prompt::Tokens(&tokens))
            })
            .unwrap();
        assert_eq!(&*d.prefill.instance_name, "p2");
        assert_eq!(&*d.decode_instance_name, "d1");
        r.on_aborted(d.prefill.request_id);
    }
    let none_left = ["d0", "d1"];
    let err = r
        .route(&RouteRequest {
            exclude: &none_left,
            ..RouteRequest::new(Prompt::Tokens(&tokens))
        })
        .unwrap_err();
    assert_eq!(err, SmetricError::NoInstances);
    assert_eq!(
        r.prefill().stats().routed,
        6,
        "no prefill decision was counted for the failed call"
    );
}

/// `smetric` v2 on a PD router's prefill pool scores `q + w` (a prefill instance's batch is
/// requests waiting for their transfer, which costs no prefill time), where a co-located
/// router scores `(q + w) × active requests`. p0 holds two prefilled requests awaiting their
/// transfer (batch 2, nothing queued); p1 one request not yet prefilled (batch 1, a 16-token
/// prompt's 17 work units queued). A 64-token first turn (65 units): the prefill pool picks p0
/// (65 against 82); the co-located form would pick p1 (65 · 2 = 130 against 82 · 1).
#[test]
fn v2_scores_pending_work_alone_on_the_prefill_pool() {
    let r = PdRouter::new(
        &names("p", 2),
        &names("d", 1),
        PolicyKind::Smetric,
        4,
        7,
        RouterConfig::PAPER,
        PdConfig::default(),
    )
    .unwrap();
    let at = |tokens: &[u32], now: f64, exclude: &[&str]| {
        r.route(&RouteRequest {
            now: Some(now),
            exclude,
            ..RouteRequest::new(Prompt::Tokens(tokens))
        })
        .unwrap()
    };
    for k in 0..2u32 {
        let tokens: Vec<u32> = (1000 * (k + 1)..1000 * (k + 1) + 16).collect();
        let d = at(&tokens, 0.0, &["p1"]);
        assert!(r.on_prefilled_at(d.prefill.request_id, Some(0.01)).unwrap());
    }
    let waiting: Vec<u32> = (5000..5016).collect();
    assert_eq!(&*at(&waiting, 0.02, &["p0"]).prefill.instance_name, "p1");
    let (p0, p1) = (r.prefill().load("p0").unwrap(), r.prefill().load("p1").unwrap());
    assert_eq!((p0.bs, p0.queued_work, p1.bs, p1.queued_work), (2, 0, 1, 17));
    let first: Vec<u32> = (9000..9064).collect();
    assert_eq!(&*at(&first, 0.03, &[]).prefill.instance_name, "p0");
}
