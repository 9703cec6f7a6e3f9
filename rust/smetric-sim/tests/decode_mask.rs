//! `smetric_paper`'s decode-contract mask in the simulator: the core placer tells the router
//! each request's recorded output length only for the mask's oracle form, and a run completes
//! under every form (the mask never holds a request).

use smetric_core::DecodeMask;
use smetric_sim::{
    PolicyKind, RouterConfig, SimConfig, SyntheticSessions, Workload, core_placer, simulate, synthetic_sessions,
};

fn sessions() -> Workload {
    let shape = SyntheticSessions {
        sessions: 12,
        turns: 4,
        shared_tokens: 1024,
        turn_tokens: 2048,
        output_tokens: 300,
        think_s: 0.5,
    };
    synthetic_sessions(16, shape).unwrap()
}

fn config(mask: DecodeMask) -> SimConfig {
    SimConfig {
        instances: 3,
        session_rate_per_s: 6.0,
        router: RouterConfig {
            smetric_decode_mask: mask,
            ..RouterConfig::PAPER
        },
        ..SimConfig::default()
    }
}

#[test]
fn only_the_oracle_reads_recorded_output_lengths() {
    let w = sessions();
    let outputs: Vec<u32> = w.requests().iter().map(|r| r.output_tokens).collect();
    for mask in [DecodeMask::Off, DecodeMask::Honest, DecodeMask::Oracle] {
        let c = config(mask);
        let mut placer = core_placer(&c, &w, PolicyKind::Smetric).unwrap();
        let told = placer.recorded_outputs().map(<[u32]>::to_vec);
        assert_eq!(told, (mask == DecodeMask::Oracle).then(|| outputs.clone()), "{mask:?}");
        let report = simulate(&c, &w, &mut placer).unwrap();
        assert_eq!(
            report.completed + report.rejected,
            report.requests,
            "{mask:?}: every request served"
        );
    }
    // Another policy never gets them, whatever the config says.
    let placer = core_placer(&config(DecodeMask::Oracle), &w, PolicyKind::Lmetric).unwrap();
    assert!(placer.recorded_outputs().is_none());
}
