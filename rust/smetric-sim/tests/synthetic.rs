//! The synthetic agent-session workload through the whole simulator: every request is served,
//! runs are deterministic, and a cache-aware policy hits most of the reusable prefill.

use smetric_sim::{PolicyKind, SimConfig, SyntheticOptions, run, synthetic_agent_sessions};

#[test]
fn a_simulation_of_the_synthetic_sessions_serves_them_and_reuses_their_prefixes() {
    let options = SyntheticOptions {
        sessions: 40,
        ..SyntheticOptions::default()
    };
    let w = synthetic_agent_sessions(&options).unwrap();
    let c = SimConfig {
        instances: 4,
        session_rate_per_s: 0.2,
        ..SimConfig::default()
    };
    let report = run(&c, &w, PolicyKind::Smetric).unwrap();
    assert_eq!(report.completed, w.len() as u64);
    assert_eq!(report.rejected, 0);
    assert_eq!(report, run(&c, &w, PolicyKind::Smetric).unwrap(), "deterministic");
    let hits = report.local_hit_ratio + report.global_hit_ratio;
    assert!(hits > 0.7, "hit ratio {hits} of a workload that is 81.5 % reusable");
    let spread = run(&c, &w, PolicyKind::RoundRobin).unwrap();
    assert!(
        report.local_hit_ratio > spread.local_hit_ratio,
        "smetric {} vs round robin {}",
        report.local_hit_ratio,
        spread.local_hit_ratio
    );
}
