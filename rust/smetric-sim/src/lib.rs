//! # smetric-sim
//!
//! A trace-driven, discrete-event simulator of a vLLM cluster that routes every request
//! through the real `smetric_core::Router` — the same policy code the router ships, never a
//! second implementation — and scores each policy by cluster TPS under SLO.
//!
//! * [`perf_model`] — named hardware/model profiles and the analytic iteration time of
//!   `docs/perf-model.md` §6, pinned to the §7 anchors by tests;
//! * [`block_pool`] — a vLLM v1 GPU block pool with prefix caching;
//! * `instance` — the vLLM v1 scheduler (running first, chunked prefill, admission,
//!   preemption by recompute);
//! * [`global_tier`] — the cluster-wide KV store; `transfer` — loads and write-throughs over
//!   the nodes' shared links (per-rank FIFO, fair-share NIC, PCIe caps);
//! * [`cache_events`] — how the router's index is fed: insert on route, the engines' vLLM
//!   KV-event batches through the production encoder and ingestor, or an oracle;
//! * [`workload`] — streaming loaders (Bailian, Mooncake, Weka Claude Code, Azure) into a
//!   compact form;
//! * `cluster` — the event loop; [`metrics`] — the report;
//! * [`placement`] / [`core_placer`] — the seam to the routing core;
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
pub mod core_placer;
pub mod error;
pub mod global_tier;
mod instance;
pub mod metrics;
pub mod pd;
pub mod pd_placer;
pub mod perf_model;
pub mod placement;
pub mod token_gaps;
mod transfer;
pub mod workload;

pub use cache_events::IndexFeed;
pub use cluster::simulate;
pub use config::{GlobalTierConfig, SimConfig, SloConfig, TierPath, TurnFeed};
pub use core_placer::CorePlacer;
pub use error::{Result, SimError};
pub use metrics::{LoadSeries, Percentiles, RequestRecord, SimReport, SloReport, evaluate_slo};
pub use pd::{PdReport, PdSimConfig};
pub use pd_placer::CorePdPlacer;
pub use perf_model::{BatchShape, Profile};
pub use placement::{EngineLoadReport, PlaceRequest, Placement, Placer, RoundRobinPlacer};
pub use smetric_core::{PolicyKind, RouterConfig};
pub use workload::azure::load_azure;
pub use workload::bailian::{BailianOptions, load_bailian};
pub use workload::codex::{CodexOptions, codex_sessions};
pub use workload::mooncake::load_mooncake;
pub use workload::synthetic::{ReuseStats, SyntheticOptions, reuse_stats, synthetic_agent_sessions};
pub use workload::weka::{WekaOptions, load_weka};
pub use workload::{ArrivalKind, RequestSpec, SyntheticSessions, Workload, WorkloadBuilder, synthetic_sessions};

/// Runs `workload` on the cluster of `config`, routing with the real router running `policy`
/// (built by [`core_placer`]).
pub fn run(config: &SimConfig, workload: &Workload, policy: PolicyKind) -> Result<SimReport> {
    if config.pd.is_some() {
        let mut placer = core_pd_placer(config, workload, policy)?;
        return simulate(config, workload, &mut placer);
    }
    let mut placer = core_placer(config, workload, policy)?;
    simulate(config, workload, &mut placer)
}

/// The real PD router running `policy` on the prefill side, for a PD `config`: the prefill
/// side set up as [`core_placer`] sets up a co-located router (capacities from the simulated
/// pools and tier, insert on route), the decode side's capacity the simulated pool and its
/// batch bound `max_num_seqs`, its rule `config.pd.decode_rule`.
pub fn core_pd_placer(config: &SimConfig, workload: &Workload, policy: PolicyKind) -> Result<CorePdPlacer> {
    config.validate()?;
    let pd = config.pd.as_ref().ok_or(SimError::InvalidConfig {
        field: "pd",
        reason: "a PD placer needs a PD configuration".into(),
    })?;
    let block = u64::from(workload.block_tokens());
    let mut router_config = config.router.clone();
    router_config.local_capacity_blocks = config.kv_tokens() / block;
    router_config.global_capacity_blocks = if config.global_tier.enabled {
        (config.global_tier.capacity_bytes as f64 / (block as f64 * config.profile.kv_bytes_per_token)) as u64
    } else {
        0
    };
    let pd_config = smetric_core::PdConfig {
        decode_rule: pd.decode_rule,
        decode_capacity_blocks: router_config.local_capacity_blocks,
        decode_max_batch: u64::from(config.max_num_seqs),
        ..smetric_core::PdConfig::default()
    };
    let placer = CorePdPlacer::new(
        pd.prefill_instances,
        pd.decode_instances,
        policy,
        workload.block_tokens(),
        config.seed,
        router_config,
        pd_config,
    )?;
    Ok(placer.with_turns(config.turns))
}

/// The real router running `policy`, set up for `config` and `workload`: its block size is
/// the workload's, its per-instance capacity is the simulated pool (`kv_tokens / block`), its
/// global capacity is the simulated tier (0 when the tier is off), and its index is fed as
/// `config.index_feed` says, and it hears each request's turn as `config.turns` says; every other router field comes from `config.router`. Its seed
/// is `config.seed`.
pub fn core_placer(config: &SimConfig, workload: &Workload, policy: PolicyKind) -> Result<CorePlacer> {
    config.validate()?;
    let block_tokens = workload.block_tokens();
    let block = u64::from(block_tokens);
    let mut router_config = config.router.clone();
    router_config.local_capacity_blocks = config.kv_tokens() / block;
    let tier_blocks =
        (config.global_tier.capacity_bytes as f64 / (block as f64 * config.profile.kv_bytes_per_token)) as u64;
    router_config.global_capacity_blocks = match (config.global_tier.enabled, config.index_feed) {
        (false, _) => 0,
        // Insert on route: the router's own LRU is its model of the store.
        (true, IndexFeed::Approximate) => tier_blocks,
        // Fed by the store's own changes: its removals keep the index exact, and an LRU of the
        // router's, which sees stores but not the reads that refresh the store's order, would
        // evict other blocks than the store does. Twice the store leaves room for removals
        // that arrive late.
        (true, IndexFeed::Events | IndexFeed::Oracle) => tier_blocks.saturating_mul(2),
    };
    // An ingestor source maps what its instance holds: its pool, plus the store blocks it
    // announced (at most the whole store).
    let max_mapped = router_config.local_capacity_blocks + router_config.global_capacity_blocks;
    let placer = CorePlacer::with_feed(
        config.instances,
        policy,
        block_tokens,
        config.seed,
        router_config,
        config.index_feed,
        usize::try_from(max_mapped).unwrap_or(usize::MAX),
    )?;
    Ok(placer.with_turns(config.turns))
}
