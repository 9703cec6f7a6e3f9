//! # smetric-sim
//!
//! A trace-driven, discrete-event simulator of a vLLM cluster that routes every request
//! through the real `smetric_core::Router` — the same policy code the router ships, never a
//! second implementation — and scores each policy by cluster TPS under SLO.
//!
//! * [`perf_model`] — named hardware/model profiles and the analytic iteration time of
//!   `docs/perf-model.md` §6, pinned to the §7 anchors by tests; [`profile_file`] — profiles
//!   read from JSON and single constants overridden (§9);
//! * [`block_pool`] — a vLLM v1 GPU block pool with prefix caching;
//! * `instance` — the vLLM v1 scheduler (running first, chunked prefill, admission,
//!   preemption by recompute);
//! * [`global_tier`] — the cluster-wide KV store; `transfer` — loads and write-throughs over
//!   the nodes' shared links (per-rank FIFO, fair-share NIC, PCIe caps);
//! * [`cache_events`] — how the router's index is fed: insert on route, the engines' vLLM
//!   KV-event batches through the production encoder and ingestor, or an oracle;
//! * [`workload`] — streaming loaders (Bailian, Mooncake, Weka Claude Code, Azure) into a
//!   compact form;
//! * `cluster` — the event loop, and `cluster::pd`, the disaggregated prefill/decode model
//!   (pulls from prefill to decode instances, the decode admission); [`config`] holds every
//!   setting (the PD ones in [`PdSimConfig`]), [`metrics`] the report (the PD part in
//!   [`PdReport`]);
//! * [`placement`] — the seam to the routing core; [`placers`] — the real `Router` and
//!   `PdRouter` behind it, and their builders [`core_placer`] and [`core_pd_placer`];
//! * [`token_gaps`] — each request's tail token gap (Mooncake's TBT), exact in O(tail) memory.
//!
//! ```no_run
//! use smetric_sim::{PolicyKind, SimConfig, WekaOptions, load_weka, run};
//! let workload = load_weka(&["weka_cc_sessions_0001-0175.jsonl.gz"], &WekaOptions::default())?;
//! let report = run(&SimConfig::default(), &workload, PolicyKind::Smetric)?;
//! println!("{} TPS under SLO", report.slo[0].tps_under_slo);
//! # Ok::<(), smetric_sim::SimError>(())
//! ```
//!
//! No pyo3 here: a binding crate wraps [`run`], [`SimConfig`] and [`SimReport`], whose
//! fields are plain numbers, strings and vectors.

// Every public item is documented; the workspace lints do not ask for it, this crate does.
#![warn(missing_docs)]

pub mod block_pool;
pub mod cache_events;
mod cluster;
pub mod config;
pub mod error;
pub mod global_tier;
mod instance;
pub mod metrics;
pub mod perf_model;
pub mod placement;
pub mod placers;
pub mod profile_file;
pub mod token_gaps;
mod transfer;
pub mod workload;

pub use cache_events::IndexFeed;
pub use cluster::pd::uncontended_pull_s;
pub use cluster::simulate;
pub use config::{GlobalTierConfig, PdSimConfig, ReplicaSync, SimConfig, SloConfig, TierPath, TurnFeed};
pub use error::{Result, SimError};
pub use metrics::{LoadSeries, PdReport, Percentiles, RequestRecord, SimReport, SloReport, evaluate_slo};
pub use perf_model::{BatchShape, Profile};
pub use placement::{EngineLoadReport, PlaceRequest, Placement, Placer, RoundRobinPlacer};
pub use placers::{CorePdPlacer, CorePlacer, ReplicatedPlacer, core_pd_placer, core_placer, replicated_placer};
pub use smetric_core::{PolicyKind, RouterConfig};
pub use workload::azure::load_azure;
pub use workload::bailian::{BailianOptions, load_bailian};
pub use workload::codex::{CodexOptions, codex_sessions};
pub use workload::mooncake::load_mooncake;
pub use workload::synthetic::{ReuseStats, SyntheticOptions, reuse_stats, synthetic_agent_sessions};
pub use workload::weka::{WekaOptions, load_weka};
pub use workload::{ArrivalKind, RequestSpec, SyntheticSessions, Workload, WorkloadBuilder, synthetic_sessions};

/// Runs `workload` on the cluster of `config`, routing with the real router running `policy`
/// (built by [`core_placer`]; [`replicated_placer`] for several router replicas).
pub fn run(config: &SimConfig, workload: &Workload, policy: PolicyKind) -> Result<SimReport> {
    if config.pd.is_some() {
        let mut placer = core_pd_placer(config, workload, policy)?;
        return simulate(config, workload, &mut placer);
    }
    if config.router_replicas > 1 {
        let mut placer = replicated_placer(config, workload, policy)?;
        return simulate(config, workload, &mut placer);
    }
    let mut placer = core_placer(config, workload, policy)?;
    simulate(config, workload, &mut placer)
}
