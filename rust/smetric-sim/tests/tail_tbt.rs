//! Tail TBT (the mean of a request's longest tenth of token gaps) in a whole run, and the SLO
//! option that bounds it.

use smetric_sim::{PolicyKind, SimConfig, SloConfig, SyntheticSessions, evaluate_slo, run, synthetic_sessions};

fn report() -> smetric_sim::SimReport {
    let shape = SyntheticSessions {
        sessions: 24,
        turns: 4,
        shared_tokens: 2048,
        turn_tokens: 3000,
        output_tokens: 120,
        think_s: 0.2,
    };
    let w = synthetic_sessions(16, shape).unwrap();
    let config = SimConfig {
        instances: 2,
        session_rate_per_s: 3.0,
        keep_records: true,
        ..SimConfig::default()
    };
    run(&config, &w, PolicyKind::Lpwl).unwrap()
}

#[test]
fn the_tail_is_at_least_the_mean_gap_and_shows_chunked_prefill_stalls() {
    let r = report();
    let mut longer = 0;
    for rec in &r.records {
        let (Some(tail), Some(tpot)) = (rec.tbt_tail_s, rec.tpot_s()) else {
            assert!(rec.output_tokens <= 1 || rec.finish_s.is_none());
            continue;
        };
        // The mean of the largest gaps is never below the mean of all gaps (f32 storage aside).
        assert!(tail >= tpot * (1.0 - 1e-6), "request {}: {tail} < {tpot}", rec.index);
        longer += usize::from(tail > 1.5 * tpot);
    }
    // Decodes that share steps with 3,000-token prefill chunks have a few long gaps.
    assert!(longer > 0);
    assert_eq!(r.tbt_tail.count, r.tpot.count);
    assert!(r.tbt_tail.p90 >= r.tpot.p90 * (1.0 - 1e-6));
}

#[test]
fn a_tail_bound_only_removes_requests() {
    let r = report();
    let score = |tbt_tail_s| {
        let slo = SloConfig {
            tbt_tail_s,
            ..SloConfig::default()
        };
        evaluate_slo(&slo, &r.records, r.window_start_s, r.window_end_s)
    };
    let off = score(None);
    assert_eq!(off, r.slo, "off by default");
    assert!(off.iter().all(|s| s.tbt_tail_s.is_none()));
    assert_eq!(score(Some(1e9))[0].met, off[0].met, "a loose bound changes nothing");
    let tight = score(Some(r.tbt_tail.p50));
    assert!(tight[0].met < off[0].met);
    assert!(tight[0].output_tps_under_slo < off[0].output_tps_under_slo);
    assert!(
        (0.45..=0.6).contains(&tight[0].tbt_tail_attainment),
        "{}",
        tight[0].tbt_tail_attainment
    );
    assert_eq!(tight[0].tbt_tail_s, Some(r.tbt_tail.p50));
    let bad = SimConfig {
        slo: SloConfig {
            tbt_tail_s: Some(0.0),
            ..SloConfig::default()
        },
        ..SimConfig::default()
    };
    assert!(bad.validate().is_err());
}
