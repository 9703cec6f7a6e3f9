//! Session admission in the event loop: held requests wait and are served, `off` is the run
//! without the stage, and the two forms differ where the policy's instance has no room.

use smetric_core::session_admission::AdmissionMode;
use smetric_sim::{
    GlobalTierConfig, PolicyKind, SimConfig, SimReport, SyntheticSessions, Workload, run, synthetic_sessions,
};

/// 24 closed-loop sessions of 4 turns, each turn ~24K tokens deep, arriving fast on 2
/// instances of 64K KV tokens: a few sessions' working sets fill an instance.
fn workload() -> Workload {
    synthetic_sessions(
        16,
        SyntheticSessions {
            sessions: 24,
            turns: 4,
            shared_tokens: 512,
            turn_tokens: 6_000,
            output_tokens: 200,
            think_s: 1.0,
        },
    )
    .unwrap()
}

fn config(mode: AdmissionMode) -> SimConfig {
    SimConfig {
        instances: 2,
        kv_capacity_tokens: Some(65_536),
        max_model_len: Some(32_768),
        session_rate_per_s: 4.0,
        keep_records: true,
        global_tier: GlobalTierConfig {
            enabled: false,
            ..GlobalTierConfig::default()
        },
        session_admission: mode,
        ..SimConfig::default()
    }
}

fn counter(report: &SimReport, name: &str) -> u64 {
    report
        .feed_counters
        .iter()
        .find(|(n, _)| n == name)
        .map_or(0, |&(_, v)| v)
}

#[test]
fn held_requests_are_served_and_their_wait_counts_in_ttft() {
    let w = workload();
    for mode in [AdmissionMode::Pause, AdmissionMode::Smetric] {
        for policy in [PolicyKind::Smetric, PolicyKind::LeastLoad] {
            let report = run(&config(mode), &w, policy).unwrap();
            assert_eq!(
                report.completed + report.rejected,
                report.requests,
                "{mode:?} {policy:?}"
            );
            assert!(
                counter(&report, "admission_held") > 0,
                "{mode:?} {policy:?}: nothing held"
            );
            let held = report
                .records
                .iter()
                .filter(|r| r.reason == "session admission: resumed")
                .count();
            // A held request's TTFT runs from its arrival, not its admission.
            for r in report
                .records
                .iter()
                .filter(|r| r.reason == "session admission: resumed")
            {
                assert!(r.first_token_s.unwrap() > r.arrival_s.unwrap());
            }
            assert!(held > 0 || mode == AdmissionMode::Smetric, "{mode:?} {policy:?}");
        }
    }
}

#[test]
fn off_is_the_run_without_the_stage() {
    let w = workload();
    let off = run(&config(AdmissionMode::Off), &w, PolicyKind::Smetric).unwrap();
    assert!(off.feed_counters.iter().all(|(n, _)| !n.starts_with("admission_")));
    assert!(off.records.iter().all(|r| !r.reason.starts_with("session admission")));
    // Negative control: the stage on changes the run.
    let pause = run(&config(AdmissionMode::Pause), &w, PolicyKind::Smetric).unwrap();
    assert_ne!(
        (off.ttft.p50, off.preemptions, off.makespan_s),
        (pause.ttft.p50, pause.preemptions, pause.makespan_s)
    );
}

#[test]
fn smetric_places_elsewhere_where_pause_holds() {
    let w = workload();
    let smetric = run(&config(AdmissionMode::Smetric), &w, PolicyKind::Smetric).unwrap();
    let pause = run(&config(AdmissionMode::Pause), &w, PolicyKind::Smetric).unwrap();
    assert!(counter(&smetric, "admission_moved") > 0);
    assert_eq!(counter(&pause, "admission_moved"), 0);
}

#[test]
fn admission_needs_one_co_located_router() {
    let mut c = config(AdmissionMode::Pause);
    c.router_replicas = 2;
    assert!(c.validate().is_err());
}

#[test]
fn a_bounded_hold_admits_held_requests_when_it_runs_out() {
    let w = workload();
    let pause_holding = |max_hold_s: Option<f64>| {
        let config = SimConfig {
            session_admission_max_hold_s: max_hold_s,
            ..config(AdmissionMode::Pause)
        };
        run(&config, &w, PolicyKind::Smetric).unwrap()
    };
    let unbounded = pause_holding(None);
    let bounded = pause_holding(Some(0.2));
    assert_eq!(bounded.completed + bounded.rejected, bounded.requests);
    assert!(counter(&bounded, "admission_released") > 0);
    assert_eq!(counter(&unbounded, "admission_released"), 0);
    assert!(counter(&bounded, "admission_held") < counter(&unbounded, "admission_held"));
    // A hold longer than the run releases nothing: the same run as the unbounded one.
    let never = pause_holding(Some(1.0e6));
    assert_eq!(
        (never.ttft.p50, never.preemptions, never.makespan_s),
        (unbounded.ttft.p50, unbounded.preemptions, unbounded.makespan_s)
    );
}

#[test]
fn a_negative_or_nan_hold_is_refused() {
    for bad in [-1.0, f64::NAN] {
        let c = SimConfig {
            session_admission_max_hold_s: Some(bad),
            ..config(AdmissionMode::Smetric)
        };
        assert!(c.validate().is_err());
    }
}
