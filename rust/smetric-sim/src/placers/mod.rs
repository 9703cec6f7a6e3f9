//! The placers the simulator routes with, and their builders: the seam itself ([`Placer`]) is
//! `crate::placement`.
//!
//! * [`CorePlacer`] (`core`) — the real `smetric_core::Router`, co-located serving;
//! * [`CorePdPlacer`] (`pd`) — the real `smetric_core::PdRouter`, disaggregated serving;
//! * [`ReplicatedPlacer`] (`replicated`) — R [`CorePlacer`]s behind a round-robin balancer,
//!   with or without a bus that shares their load effects (`router_replicas`, `replica_sync`);
//! * [`core_placer`] / [`core_pd_placer`] / [`replicated_placer`] — each set up for a
//!   [`SimConfig`] and a [`Workload`]: the router's capacities are the simulated pools and tier,
//!   in the workload's blocks.
//!
//! Complexity: a builder is O(instances); the placers' costs are stated in their modules.
//!
//! [`Placer`]: crate::placement::Placer

mod core;
mod pd;
mod replicated;

use smetric_core::{DecodeMask, PolicyKind};

pub use self::core::CorePlacer;
pub use self::pd::CorePdPlacer;
pub use self::replicated::ReplicatedPlacer;
use crate::cache_events::IndexFeed;
use crate::config::SimConfig;
use crate::error::{Result, SimError};
use crate::workload::Workload;

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
    // A store per instance (`TierPath::per_instance`): each holds an even share, and the router
    // models each as the instance's host pool (docs/routing-semantics.md §2.8), not a global tier.
    let per_instance = config.global_tier.path.per_instance();
    let tier_blocks = if per_instance {
        tier_blocks / u64::from(config.instances.max(1))
    } else {
        tier_blocks
    };
    let store_blocks = match (config.global_tier.enabled, config.index_feed) {
        (false, _) => 0,
        // Insert on route: the router's own LRU is its model of the store.
        (true, IndexFeed::Approximate) => tier_blocks,
        // Fed by the store's own changes: its removals keep the index exact, and an LRU of the
        // router's, which sees stores but not the reads that refresh the store's order, would
        // evict other blocks than the store does. Twice the store leaves room for removals
        // that arrive late.
        (true, IndexFeed::Events | IndexFeed::Oracle) => tier_blocks.saturating_mul(2),
    };
    (router_config.global_capacity_blocks, router_config.host_capacity_blocks) = if per_instance {
        (0, store_blocks)
    } else {
        (store_blocks, 0)
    };
    // An ingestor source maps what its instance holds: its pool, plus the store blocks it
    // announced (at most the whole store).
    let max_mapped = router_config.local_capacity_blocks + store_blocks;
    let placer = CorePlacer::with_feed(
        config.instances,
        policy,
        block_tokens,
        config.seed,
        router_config,
        config.index_feed,
        usize::try_from(max_mapped).unwrap_or(usize::MAX),
    )?;
    // Session admission weighs working sets against the simulated pool.
    let placer = placer.with_turns(config.turns).with_admission(
        config.session_admission,
        config.kv_tokens(),
        config.session_admission_max_hold_s,
    );
    // The decode mask's oracle form reads each request's recorded output length.
    if policy == PolicyKind::Smetric && config.router.smetric_decode_mask == DecodeMask::Oracle {
        let outputs = workload.requests().iter().map(|r| r.output_tokens).collect();
        return Ok(placer.with_recorded_outputs(outputs));
    }
    Ok(placer)
}

/// `config.router_replicas` routers running `policy`, each set up as [`core_placer`] sets one
/// up (replica `r` seeded `config.seed + r`), behind a round-robin balancer, their load effects
/// shared as `config.replica_sync` says.
pub fn replicated_placer(config: &SimConfig, workload: &Workload, policy: PolicyKind) -> Result<ReplicatedPlacer> {
    let replicas = (0..config.router_replicas)
        .map(|r| {
            let mut c = config.clone();
            c.seed = config.seed.wrapping_add(u64::from(r));
            core_placer(&c, workload, policy)
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(ReplicatedPlacer::new(
        replicas,
        config.replica_sync,
        config.replica_sync_delay_s,
    ))
}
