//! Disaggregated prefill/decode (PD) in the simulator: the model, and the event loop's side of it.
//! Its settings are [`crate::config::PdSimConfig`], its report [`crate::metrics::PdReport`].
//!
//! Instances `0..P` are prefill instances, `P..P+D` decode
//! instances. A request is routed once, by the real `smetric_core::PdRouter`
//! ([`crate::placers::CorePdPlacer`]), to a pair. Its prefill instance runs it as vLLM's
//! proxy asks (`max_tokens = 1`): chunked prefill with the prefix cache and the global tier's
//! loads as in co-located mode; when the step that computes its last prompt token ends, the
//! prefill instance keeps the request's blocks (vLLM's `delay_free_blocks`) and the request
//! joins its decode instance's queue. There the scheduler allocates the whole context before
//! pulling it (`WAITING_FOR_REMOTE_KVS`); blocks its own prefix cache holds are not pulled.
//! The pull crosses the decode node's NIC (the `transfer` model: per-rank FIFO, the node's
//! NIC shared fairly, each rank capped); when it ends the prefill instance frees its blocks
//! (they stay cached there until LRU eviction), and the decode instance recomputes the last
//! prompt token, which samples the first output token (TTFT ends there), then decodes.
//!
//! The node NIC is `global_tier.nic_bytes_per_s` (87 GB/s, Mooncake's transfer engine on
//! 4 × 200 Gbps) and nodes hold `global_tier.gpus_per_node / tp` instances, decode nodes
//! apart from prefill nodes. A pull is timed on the decode node's ingress only; the prefill
//! node's egress is not modelled (with D ≤ P each prefill node sends less than a decode node
//! receives).
//!
//! A PD request's path: `Arrive` (one decision: prefill and decode instance) → `Deliver` to
//! its prefill instance, which runs it with `max_tokens = 1` and `hold_blocks` → the step
//! that computes its last prompt token ends: the placer hears `on_prefilled`, the blocks move
//! to the held table, and the request, reset to its decode phase (`remote_kv`), joins its
//! decode instance's queue → that scheduler allocates the context and the pull is submitted
//! on the decode node's link (`PdTransfer` events) → the pull ends: the prefill instance frees
//! the held blocks (cached, evictable), the placer hears `on_transferred`, and `FetchDone`
//! `transfer_latency_s` later makes the pulled blocks computed KV → the decode instance
//! recomputes the last token (first token: TTFT) and decodes; `on_finished` as co-located.
//!
//! Invariants: a request's prefill blocks are held from its prefill's end to its pull's end,
//! never longer, and released exactly once; a pull starts only after its decode blocks are
//! allocated; a pull of `t` tokens moves `t · kv_bytes_per_token_rank` bytes per rank.
//!
//! A pull alone on its decode node's link takes [`uncontended_pull_s`]: the closed form of the
//! link model for one transfer, which `smetric fake-engine` waits (through the bindings) so
//! that the fake engine and the simulator price a pull alike.
//!
//! Complexity: O(1) per phase change plus the link's reshare (`transfer`); O(decode
//! instances) per load sample.

use super::{Kind, Sim};
use crate::config::PdSimConfig;
use crate::config::SimConfig;
use crate::error::{Result, SimError};
use crate::instance::PdRole;
use crate::metrics::PdReport;
use crate::metrics::Percentiles;
use crate::placement::Placement;
use crate::transfer::{Direction, Transfer, Transfers};

/// Seconds from the submission of a pull of `tokens` KV tokens to its blocks being usable on
/// the decode instance, when nothing else crosses the decode node's link: each of the
/// profile's `tp` ranks moves its `tokens · kv_bytes_per_token_rank` bytes at the per-rank cap
/// or its fair share of the node NIC, whichever is lower (the water-fill of `transfer` for one
/// transfer of weight `tp`), then `transfer_latency_s`. O(1).
pub fn uncontended_pull_s(config: &SimConfig, pd: &PdSimConfig, tokens: u64) -> f64 {
    let ranks = f64::from(config.profile.tp.max(1));
    let rate = pd
        .transfer_rank_bytes_per_s
        .min(config.global_tier.nic_bytes_per_s / ranks);
    tokens as f64 * config.profile.kv_bytes_per_token_rank / rate + pd.transfer_latency_s
}

/// PD state of a run.
#[derive(Debug)]
pub(super) struct PdRun {
    config: PdSimConfig,
    /// Prefill instances: slots `0..prefill`.
    pub(super) prefill: u32,
    prefill_of: Vec<u32>,
    decode_of: Vec<u32>,
    /// The request is in its decode phase.
    decoding: Vec<bool>,
    /// Blocks a prefill instance holds for the request until its pull ends.
    held: Vec<Vec<u32>>,
    prefilled_at: Vec<f64>,
    submitted_at: Vec<f64>,
    /// The decode nodes' ingress links; transfers name decode instances `0..D`.
    links: Transfers<u32>,
    scratch: Vec<Transfer<u32>>,
    transfer_times: Vec<f64>,
    admission_waits: Vec<f64>,
    transfers: u64,
    transfer_bytes: f64,
    decode_hit_tokens: u64,
    kv_samples: Vec<f64>,
}

impl PdRun {
    pub(super) fn new(config: &SimConfig, pd: &PdSimConfig, requests: usize) -> Self {
        let per_node = config.global_tier.gpus_per_node / config.profile.tp.max(1);
        Self {
            config: pd.clone(),
            prefill: pd.prefill_instances,
            prefill_of: vec![u32::MAX; requests],
            decode_of: vec![u32::MAX; requests],
            decoding: vec![false; requests],
            held: vec![Vec::new(); requests],
            prefilled_at: vec![0.0; requests],
            submitted_at: vec![0.0; requests],
            links: Transfers::new(pd.decode_instances, per_node, config.global_tier.nic_bytes_per_s),
            scratch: Vec::new(),
            transfer_times: Vec::new(),
            admission_waits: Vec::new(),
            transfers: 0,
            transfer_bytes: 0.0,
            decode_hit_tokens: 0,
            kv_samples: Vec::new(),
        }
    }

    /// The report; `decode_preemptions` from the decode instances.
    pub(super) fn report(mut self, policy_rule: String, decode_preemptions: u64) -> PdReport {
        let (mean, max) = if self.kv_samples.is_empty() {
            (0.0, 0.0)
        } else {
            (
                self.kv_samples.iter().sum::<f64>() / self.kv_samples.len() as f64,
                self.kv_samples.iter().copied().fold(0.0, f64::max),
            )
        };
        PdReport {
            prefill_instances: self.config.prefill_instances,
            decode_instances: self.config.decode_instances,
            decode_rule: policy_rule,
            transfers: self.transfers,
            transfer_bytes: self.transfer_bytes,
            decode_hit_tokens: self.decode_hit_tokens,
            transfer_time: Percentiles::of(&mut self.transfer_times),
            decode_admission_wait: Percentiles::of(&mut self.admission_waits),
            decode_kv_usage_mean: mean,
            decode_kv_usage_max: max,
            decode_preemptions,
        }
    }
}

impl Sim<'_> {
    /// Whether instance `i` is a PD prefill instance.
    pub(super) fn is_prefill_instance(&self, i: u32) -> bool {
        self.pd.as_ref().is_some_and(|pd| i < pd.prefill)
    }

    /// The instance `r` is queued or running on now.
    pub(super) fn serving_instance(&self, r: u32) -> usize {
        match &self.pd {
            Some(pd) if pd.decoding[r as usize] => pd.decode_of[r as usize] as usize,
            _ => self.records[r as usize].instance.unwrap_or(0) as usize,
        }
    }

    /// Checks and records a PD placement; the request's prefill runs with `max_tokens = 1`
    /// and keeps its blocks.
    pub(super) fn pd_placed(&mut self, r: u32, placed: &Placement) -> Result<()> {
        let Some(pd) = &mut self.pd else { return Ok(()) };
        let total = self.config.instances;
        let d = placed
            .decode_instance
            .ok_or_else(|| SimError::Router("a PD run needs a placer that names a decode instance".to_owned()))?;
        if placed.instance >= pd.prefill || d < pd.prefill || d >= total {
            return Err(SimError::Router(format!(
                "placer chose prefill {} and decode {d}; prefill slots are 0..{}, decode {}..{total}",
                placed.instance, pd.prefill, pd.prefill
            )));
        }
        pd.prefill_of[r as usize] = placed.instance;
        pd.decode_of[r as usize] = d;
        let req = &mut self.reqs[r as usize];
        req.output = 1;
        req.pd = PdRole::Prefill;
        Ok(())
    }

    /// Prefill instance `i` computed `r`'s last prompt token: it keeps the blocks, and the
    /// request joins its decode instance's queue.
    pub(super) fn pd_prefill_finished(&mut self, r: u32) {
        let now = self.now;
        let Some(pd) = &mut self.pd else { return };
        let req = &mut self.reqs[r as usize];
        pd.held[r as usize] = std::mem::take(&mut req.blocks);
        pd.decoding[r as usize] = true;
        pd.prefilled_at[r as usize] = now;
        let spec = &self.workload.requests()[r as usize];
        req.num_tokens = req.prompt;
        req.computed = 0;
        req.generated = 0;
        req.registered = 0;
        req.output = spec.output_tokens.max(1);
        req.pd = PdRole::RemoteDecode;
        req.expected_prefill = 0;
        let d = pd.decode_of[r as usize] as usize;
        self.instances[d].waiting.push_back(r);
        if !self.instances[d].busy {
            self.start_step(d);
        }
    }

    /// Decode instance `d` allocated `blocks` blocks for `r`, the ones after its prefix hit:
    /// the pull starts on `d`'s node link.
    pub(super) fn pd_submit_pull(&mut self, d: usize, r: u32, blocks: usize) {
        let now = self.now;
        let b = self.limits.block_tokens;
        let profile = &self.config.profile;
        let Some(pd) = &mut self.pd else { return };
        let req = &self.reqs[r as usize];
        debug_assert_eq!(
            req.blocks.len() as u64,
            req.num_tokens.div_ceil(b),
            "a decode instance allocates the whole context before it pulls"
        );
        debug_assert!(
            !pd.held[r as usize].is_empty(),
            "the prefill instance still holds the blocks"
        );
        let hit_tokens = (req.blocks.len() - blocks) as u64 * b;
        let tokens = req.num_tokens - hit_tokens;
        pd.decode_hit_tokens += hit_tokens;
        pd.transfer_bytes += tokens as f64 * profile.kv_bytes_per_token;
        pd.submitted_at[r as usize] = now;
        pd.admission_waits.push(now - pd.prefilled_at[r as usize]);
        let transfer = Transfer {
            instance: d as u32 - pd.prefill,
            bytes: tokens as f64 * profile.kv_bytes_per_token_rank,
            cap: pd.config.transfer_rank_bytes_per_s,
            weight: f64::from(profile.tp),
            payload: r,
        };
        if let Some((time, link, version)) = pd.links.submit(now, Direction::In, transfer) {
            self.push(time, Kind::PdTransfer { link, version });
        }
    }

    /// A decode node link's earliest pulls ended.
    pub(super) fn pd_transfer_done(&mut self, link: u32, version: u64) {
        let now = self.now;
        let Some(pd) = &mut self.pd else { return };
        let mut done = std::mem::take(&mut pd.scratch);
        let next = pd.links.wake(now, link, version, &mut done);
        let latency = pd.config.transfer_latency_s;
        if let Some((time, link, version)) = next {
            self.push(time, Kind::PdTransfer { link, version });
        }
        for t in done.drain(..) {
            let r = t.payload;
            let Some(pd) = &mut self.pd else { return };
            pd.transfers += 1;
            pd.transfer_times.push(now - pd.submitted_at[r as usize]);
            let p = pd.prefill_of[r as usize] as usize;
            let held = std::mem::take(&mut pd.held[r as usize]);
            self.instances[p].pool.release(&held);
            self.placer.on_transferred(u64::from(r), now);
            self.push(now + latency, Kind::FetchDone(r));
            if !self.instances[p].busy {
                self.start_step(p);
            }
        }
        if let Some(pd) = &mut self.pd {
            pd.scratch = done;
        }
    }

    /// A load sample of the decode pool's KV usage.
    pub(super) fn pd_sample(&mut self) {
        let Some(pd) = &mut self.pd else { return };
        let decode = &self.instances[pd.prefill as usize..];
        let usage = decode.iter().map(|i| i.pool.usage()).sum::<f64>() / decode.len().max(1) as f64;
        pd.kv_samples.push(usage);
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Kind, build};
    use super::uncontended_pull_s;
    use crate::config::PdSimConfig;
    use crate::config::{GlobalTierConfig, SimConfig};
    use crate::workload::{ArrivalKind, RequestSpec, Workload, WorkloadBuilder};
    use crate::{PolicyKind, core_pd_placer};

    const B: u32 = 16;

    fn spec(input: u32, output: u32, time_s: f64) -> RequestSpec {
        RequestSpec {
            trace_id: 0,
            input_tokens: input,
            output_tokens: output,
            time_s,
            think_s: 0.0,
            prev: None,
            session: 0,
            root_session: 0,
            first_turn: None,
        }
    }

    /// `requests` open-loop requests of distinct prompts.
    fn workload(requests: &[(u32, u32, f64)]) -> Workload {
        let mut b = WorkloadBuilder::new("pd", B, ArrivalKind::OpenLoop);
        let mut next = 0_u64;
        for &(input, output, t) in requests {
            let blocks = u64::from(input / B);
            b.push(spec(input, output, t), next..next + blocks);
            next += blocks;
        }
        b.build().unwrap()
    }

    fn config(prefill: u32, decode: u32) -> SimConfig {
        SimConfig {
            instances: prefill + decode,
            global_tier: GlobalTierConfig {
                enabled: false,
                ..GlobalTierConfig::default()
            },
            keep_records: true,
            pd: Some(PdSimConfig {
                prefill_instances: prefill,
                decode_instances: decode,
                ..PdSimConfig::default()
            }),
            ..SimConfig::default()
        }
    }

    /// Steps a PD run event by event and checks the lifecycle at each: the prefill instance
    /// holds a request's blocks from its prefill's end to its pull's end; the decode instance
    /// holds the whole context before the pull starts; the first token comes after the pull.
    #[test]
    fn prefill_holds_until_the_pull_ends_and_decode_allocates_first() {
        let w = workload(&[(4096, 20, 0.0), (8192, 10, 0.01), (2048, 5, 0.02), (6000, 30, 0.03)]);
        let config = config(2, 2);
        let mut placer = core_pd_placer(&config, &w, PolicyKind::Smetric).unwrap();
        let mut sim = build(&config, &w, &mut placer).unwrap();
        sim.init();
        let n = w.len();
        let mut pulled_at = vec![None; n];
        while let Some(ev) = sim.heap.pop() {
            sim.now = ev.time;
            sim.queued_work -= u64::from(!ev.kind.is_background());
            let held_before: Vec<usize> = (0..n).map(|r| sim.pd.as_ref().unwrap().held[r].len()).collect();
            match ev.kind {
                Kind::Arrive(r) => sim.arrive(r).unwrap(),
                Kind::Deliver(r) => sim.enqueue(r),
                Kind::FetchDone(r) => sim.fetch_done(r),
                Kind::StepDone(i) => sim.step_done(i).unwrap(),
                Kind::PdTransfer { link, version } => sim.pd_transfer_done(link, version),
                Kind::Transfer { link, version } => sim.transfer_done(link, version),
                Kind::Sample => sim.sample().unwrap(),
                Kind::LoadReport => sim.load_report(),
                Kind::KvEvents => sim.deliver_kv_events(),
                Kind::Release(r) => {
                    sim.release(r).unwrap();
                }
            }
            let pd = sim.pd.as_ref().unwrap();
            for r in 0..n {
                let held = pd.held[r].len();
                if held_before[r] > 0 && held == 0 {
                    assert!(
                        matches!(ev.kind, Kind::PdTransfer { .. }),
                        "request {r}'s prefill blocks were freed by {:?}, not by its pull's end",
                        ev.kind
                    );
                    pulled_at[r] = Some(sim.now);
                }
                if held > 0 {
                    // Held blocks are in use on the prefill instance, not free.
                    let p = pd.prefill_of[r] as usize;
                    let pool = &sim.instances[p].pool;
                    assert!(pool.num_free() as usize + held <= pool.capacity() as usize);
                    assert!(pd.decoding[r] && sim.records[r].first_token_s.is_none());
                }
            }
        }
        let pd = sim.pd.as_ref().unwrap();
        assert_eq!(pd.transfers, n as u64);
        for (r, pulled) in pulled_at.iter().enumerate() {
            let rec = &sim.records[r];
            let pulled = pulled.expect("every request was pulled");
            assert!(
                rec.first_token_s.unwrap() > pulled,
                "request {r}: first token after the pull"
            );
            assert!(rec.finish_s.is_some());
            assert!(rec.instance.unwrap() < 2 && pd.decode_of[r] >= 2);
        }
        // Every block is back in every pool (cached or free).
        for inst in &sim.instances {
            assert_eq!(inst.pool.num_free(), inst.pool.capacity());
        }
    }

    /// One pull alone runs at the rank cap; two pulls into one decode node share its NIC.
    #[test]
    fn transfer_time_is_bytes_over_the_nic_share() {
        let tokens = 32_768_u32;
        let c = config(1, 1);
        let rank_bytes = c.profile.kv_bytes_per_token_rank;
        let report = crate::run(&c, &workload(&[(tokens, 4, 0.0)]), PolicyKind::RoundRobin).unwrap();
        let pd = report.pd.unwrap();
        let cap = c.pd.as_ref().unwrap().transfer_rank_bytes_per_s;
        let alone = f64::from(tokens) * rank_bytes / cap.min(c.global_tier.nic_bytes_per_s);
        assert_eq!(pd.transfers, 1);
        assert!(
            (pd.transfer_time.p50 - alone).abs() < 1e-9,
            "{} vs {alone}",
            pd.transfer_time.p50
        );
        // The closed form the fake engine waits: the simulated pull plus the fixed latency.
        let pd_config = c.pd.as_ref().unwrap();
        let latency = pd_config.transfer_latency_s;
        let closed = uncontended_pull_s(&c, pd_config, u64::from(tokens));
        assert!((closed - (pd.transfer_time.p50 + latency)).abs() < 1e-12, "{closed}");
        assert!((pd.transfer_bytes - f64::from(tokens) * c.profile.kv_bytes_per_token).abs() < 1.0);
        // Two equal requests prefilled side by side on two prefill instances: their pulls
        // start together into two decode instances of one node and share its 87 GB/s.
        let c = config(2, 2);
        let w = workload(&[(tokens, 4, 0.0), (tokens, 4, 0.0)]);
        let report = crate::run(&c, &w, PolicyKind::RoundRobin).unwrap();
        let pd = report.pd.unwrap();
        let share = (c.global_tier.nic_bytes_per_s / 2.0).min(cap);
        let shared = f64::from(tokens) * rank_bytes / share;
        assert_eq!(pd.transfers, 2);
        assert!(
            (pd.transfer_time.p50 - shared).abs() < 1e-9,
            "{} vs {shared}",
            pd.transfer_time.p50
        );
        assert!((pd.transfer_time.p99 - shared).abs() < 1e-9);
        assert!(shared > alone);
    }

    /// A TP instance's ranks share the node NIC: with TP4 each rank gets a quarter of 87 GB/s,
    /// below the per-rank cap, and the closed form is still the simulated pull.
    #[test]
    fn a_tp_instance_pulls_at_its_share_of_the_nic() {
        let tokens = 8192_u32;
        let c = SimConfig {
            profile: crate::Profile::by_name("h20-qwen3-235b-a22b-fp8-tp4").unwrap(),
            ..config(1, 1)
        };
        let pd_config = c.pd.clone().unwrap();
        let share = c.global_tier.nic_bytes_per_s / 4.0;
        assert!(share < pd_config.transfer_rank_bytes_per_s, "the NIC share binds");
        let report = crate::run(&c, &workload(&[(tokens, 4, 0.0)]), PolicyKind::RoundRobin).unwrap();
        let pd = report.pd.unwrap();
        assert_eq!(pd.transfers, 1);
        let expected = f64::from(tokens) * c.profile.kv_bytes_per_token_rank / share + pd_config.transfer_latency_s;
        let closed = uncontended_pull_s(&c, &pd_config, u64::from(tokens));
        assert!((closed - expected).abs() < 1e-12, "{closed} vs {expected}");
        assert!((pd.transfer_time.p50 + pd_config.transfer_latency_s - closed).abs() < 1e-9);
    }

    /// A follow-up decoded where its previous turn decoded pulls only the new tokens.
    #[test]
    fn a_decode_prefix_hit_is_not_pulled() {
        let mut b = WorkloadBuilder::new("pd", B, ArrivalKind::OpenLoop);
        b.push(spec(4096, 4, 0.0), 0..256);
        b.push(spec(8192, 4, 5.0), 0..512);
        let w = b.build().unwrap();
        let c = config(1, 1);
        let report = crate::run(&c, &w, PolicyKind::Smetric).unwrap();
        let pd = report.pd.unwrap();
        // The second request's first 4096 tokens are cached on the one decode instance.
        assert_eq!(pd.decode_hit_tokens, 4096);
        let pulled = (4096.0 + 4096.0) * c.profile.kv_bytes_per_token;
        assert!((pd.transfer_bytes - pulled).abs() < 1.0);
        // And on the prefill side: the follow-up hit its prefix there too.
        assert!(report.local_hit_ratio > 0.3);
    }

    #[test]
    fn pd_config_is_checked() {
        let mut c = config(2, 2);
        c.instances = 5;
        assert!(c.validate().is_err());
        let mut c = config(2, 2);
        c.index_feed = crate::IndexFeed::Oracle;
        assert!(c.validate().is_err());
        assert!(config(0, 4).validate().is_err());
    }
}
