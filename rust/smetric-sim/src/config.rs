//! Simulation configuration. Every default is defined here, once, with its reason.
//!
//! | field | default | why |
//! |---|---|---|
//! | `instances` | 16 | the LMetric evaluation fleet: 16 H20, one instance per GPU |
//! | `profile` | H20 + Qwen3-Coder-30B-A3B, TP1 | the reference deployment of perf-model.md |
//! | `max_num_batched_tokens` | 8192 | vLLM v1's default on ≥ 70 GiB GPUs, which the §3B H20 anchors ran with |
//! | `max_num_seqs` | 256 | the LMetric AE flag; on long agent prompts KV capacity binds long before it |
//! | `max_model_len` | min(context window, KV capacity) | vLLM refuses a longer `max_model_len`; longer requests are rejected |
//! | `global_tier.path` | `lmcache` | the seed's stack: vLLM + LMCache's v1 connector over a Mooncake store (perf-model §6.4) |
//! | `global_tier.layerwise` | false | LMCache's `use_layerwise` default |
//! | `global_tier.capacity_bytes` | 1.5 TiB | see [`DEFAULT_TIER_CAPACITY_BYTES`]; [`MOONCAKE_VLLM_SEGMENT_BYTES_PER_RANK`] is the small end of the sweep |
//! | `global_tier.fetch_latency_s` | 0 | the paths' rates are effective rates measured end to end, lookup and RPC included |
//! | `global_tier.bandwidth_bytes_per_s` | none | the path's measured per-rank rate ([`TierPath::load_bytes_per_s`]) |
//! | `global_tier.gpus_per_node` | 8 | the seed's 4 × 8 H20 testbed |
//! | `global_tier.nic_bytes_per_s` | 87 GB/s | Mooncake's transfer engine on 4 × 200 Gbps RoCE, per node (perf-model §4) |
//! | `global_tier.pcie_bytes_per_s` | 54 GB/s | the pinned host-device copy measured on H20 (perf-model §3B), per GPU and direction |
//! | `global_tier.connector_step_overhead_s` | 1.4 ms | per scheduler step with a connector configured, measured for the Mooncake connector on H20 (perf-model §4) |
//! | `time_scale` | 1.0 | replay traces at recorded speed |
//! | `session_rate_per_s` | 0.05 | one agent session every 20 s: the 520 Weka sessions start within ≈3 h |
//! | `slo.ttft_base_s` / `slo.ttft_s_per_token` | 2 s + 0.1 ms/token | see [`SloConfig`] |
//! | `slo.tpot_s` | [0.1, 0.05] | the two TPOT tiers of perf-model §5; the first is the headline |
//! | `slo.tbt_tail_s` | none | the tail-TBT bound is an extra SLO setting to ask for, not part of the headline (see [`SloConfig`]) |
//! | `sample_interval_s` | 1 s | load-imbalance sampling; finer than queueing changes, cheap |
//! | `arrivals_until_s` | none | issue every request; set it to cut a long (replicated) session stream at the end of the measured window instead of simulating its drain |
//! | `max_events` | none | no limit; sweeps set one so that a pathological run fails instead of running for hours |
//! | `series_interval_s` | none | per-instance load series for plots; off unless asked (it grows with the run) |
//! | `load_report_interval_s` | none | the router's own board is exact here (every lifecycle event is delivered) |
//! | `index_feed` | approximate | the router's insert-on-route index, as without a KV-event feed |
//! | `turns` | request | a real request re-sends its history, so the router sees its turn (`TurnHint::Turn`): a session's k-th request carries turn k. `index` withholds it and the router infers first turns from its index alone. Sessionless traces (Mooncake, Azure) carry no turn either way |
//! | `event_delay_s` | 10 ms | publication to index write with `index_feed = events`: a ZMQ hop across the data-centre network plus the subscriber's loop (the published step itself already lags the cache change by up to one step) |
//! | `pd` | none | co-located; [`PdSimConfig`] splits the fleet into prefill and decode pools (model: `cluster::pd`) |
//! | `pd.prefill_instances` / `pd.decode_instances` | 8 / 8 | the default 16-GPU fleet split in half; the CLI always sets them |
//! | `pd.decode_rule` | none | the peer form of the prefill policy (`DecodeRule::peer_form`) |
//! | `pd.transfer_rank_bytes_per_s` | 54 GB/s | a GPU's own link: GPUDirect RDMA reads cross its PCIe link, measured at 54 GB/s on H20 (perf-model §3B) |
//! | `pd.transfer_latency_s` | 0.4 ms | Mooncake's 1P1D figure for 128 tokens (0.54 ms for 20 MB) minus its bytes at the measured 142 GB/s (`docs/pd-and-tier.md` §A.3) |
//! | `answer_rerender_share` | 1.0 | see [`DEFAULT_ANSWER_RERENDER_SHARE`] |
//! | `router_replicas` | 1 | one router process; more model the replicas a fleet runs for fault tolerance and rate, each a whole router of its own behind a round-robin load balancer (`placers::replicated`) |
//! | `replica_sync` | off | each replica's board holds its own requests only (with `router_replicas` = 1 there is nothing to sync) |
//! | `replica_sync_delay_s` | 50 ms | see [`DEFAULT_REPLICA_SYNC_DELAY_S`] |
//! | `session_admission` | off | every request is served where the policy sends it, as before the stage existed; `pause` / `smetric` turn on `smetric_core::session_admission` (its window, reserve and bound are that module's defaults) |
//! | `session_admission_max_hold_s` | none | the mode's own (`AdmissionMode::default_max_hold_s`: `pause` holds until there is room) |

use serde::Serializer;
use smetric_core::RouterConfig;
use smetric_core::pd::DecodeRule;
use smetric_core::session_admission::AdmissionMode;

use crate::cache_events::IndexFeed;
use crate::error::{Result, SimError};
use crate::perf_model::Profile;

/// Default store capacity, bytes: 1.5 TiB, 16,777,216 tokens × 96 KiB (the router's default
/// global capacity). Spread over the default 16 GPUs that is 96 GiB per rank, the order of the
/// "80GB" global segment of vLLM's Mooncake-store example (`docs/pd-and-tier.md` §B.10): a store that every
/// rank feeds with a large share of its host DRAM. A deployment parameter, not a measurement:
/// the report sweeps it down to [`MOONCAKE_VLLM_SEGMENT_BYTES_PER_RANK`] per rank.
pub const DEFAULT_TIER_CAPACITY_BYTES: u64 = 16_777_216 * 98_304;
/// The global segment each rank contributes to the Mooncake store when vLLM's Mooncake-store
/// connector runs with its defaults (`DEFAULT_GLOBAL_SEGMENT_SIZE` = 4 GiB, `docs/pd-and-tier.md` §B.10):
/// 64 GiB for 16 single-GPU instances, the small end of a capacity sweep.
pub const MOONCAKE_VLLM_SEGMENT_BYTES_PER_RANK: u64 = 4 << 30;
/// GPUs per node: the seed's 4 × 8 H20 testbed.
pub const DEFAULT_GPUS_PER_NODE: u32 = 8;
/// One node's RDMA bandwidth, bytes/s per direction: Mooncake's transfer engine measured
/// 87 GB/s on 4 × 200 Gbps RoCE (perf-model §4).
pub const DEFAULT_NIC_BYTES_PER_S: f64 = 87.0e9;
/// One GPU's host link, bytes/s per direction: the pinned copy measured at a flat 54 GB/s on
/// H20 (perf-model §3B).
pub const DEFAULT_PCIE_BYTES_PER_S: f64 = 54.0e9;
/// Added to every scheduler step while a KV connector is configured, seconds: measured for
/// the Mooncake connector on H20 (an O(cache) metadata walk per step, perf-model §4).
pub const DEFAULT_CONNECTOR_STEP_OVERHEAD_S: f64 = 1.4e-3;
/// Effective load rate per rank through a KV connector from a Mooncake store over RDMA,
/// bytes/s: (0.97 − 0.11 s) for 6.44 GB on H20 (perf-model §4); LMCache#3018 measures
/// 6.4 GB/s for LMCache's Mooncake backend.
pub const MOONCAKE_RDMA_LOAD_BYTES_PER_S: f64 = 7.4e9;
/// Store rate per rank into a Mooncake store over RDMA, bytes/s (LMCache#3018: 8.09 GB/s).
pub const MOONCAKE_RDMA_STORE_BYTES_PER_S: f64 = 8.1e9;
/// Effective load rate of vLLM's `OffloadingConnector` from host DRAM on H20, bytes/s:
/// (272 − 111 ms) for 6.44 GB (perf-model §4).
pub const CPU_OFFLOAD_LOAD_BYTES_PER_S: f64 = 40.0e9;
/// Default delay between an engine publishing a KV-event batch and the router applying it, seconds.
pub const DEFAULT_EVENT_DELAY_S: f64 = 0.01;
/// Most router replicas a run may model (each is a whole router with its own index).
pub const MAX_ROUTER_REPLICAS: u32 = 64;

/// Delay between a router replica's load effect (a decision, a prefill done, a request done)
/// and its application to the other replicas' boards with `replica_sync = bus`, seconds: the
/// worst case of `smetric serve`'s bus, which publishes a replica's board every 50 ms
/// (`replica_bus_period_s`) over one NATS hop (sub-millisecond in a data centre), so an effect
/// reaches the peers between a hop and one period plus a hop after it happened. Every effect
/// here takes the whole period: the simulated bus is never fresher than the real one.
pub const DEFAULT_REPLICA_SYNC_DELAY_S: f64 = 0.05;

/// How router replicas share their in-flight work ([`SimConfig::replica_sync`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ReplicaSync {
    /// Each replica's board holds its own requests only: what a fleet of replicas without a
    /// bus routes on.
    #[default]
    Off,
    /// Every replica applies the others' load effects, `replica_sync_delay_s` late (the
    /// `--replica-bus` of `smetric serve`).
    Bus,
}

impl serde::Serialize for ReplicaSync {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl ReplicaSync {
    /// Report name: `off`, `bus`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::Bus => "bus",
        }
    }

    /// Parses a report name.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "off" => Some(Self::Off),
            "bus" => Some(Self::Bus),
            _ => None,
        }
    }
}

/// Share of an answer's tokens that the next turn of its session re-sends token for token, so
/// that their blocks, cached on the instance that generated them, hit there (`instance`'s
/// "Answers re-sent"). 1.0: every answer token re-renders identically, as measured for the
/// Qwen3-Coder chat template that the built-in 30B profiles serve (vLLM 0.32 on CPU, 352 second
/// turns checked against the engine's `cached_tokens`; perf-model §6.5).
pub const DEFAULT_ANSWER_RERENDER_SHARE: f64 = 1.0;
/// vLLM v1 `max_num_batched_tokens` on large GPUs.
pub const DEFAULT_MAX_BATCHED_TOKENS: u32 = 8192;
/// vLLM `max_num_seqs` used by the LMetric evaluation.
pub const DEFAULT_MAX_NUM_SEQS: u32 = 256;

/// What the simulated router is told about a request's turn ([`SimConfig::turns`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TurnFeed {
    /// The turn the request carries ([`crate::Workload::turn`]) goes to the router's `turn`
    /// hint, as a real request's re-sent history would show it; a request of a sessionless
    /// trace carries none and is left to the index.
    #[default]
    Request,
    /// No hint: the router infers first turns from its index alone.
    Index,
}

/// Serialised by name (`"request"`, `"index"`).
impl serde::Serialize for TurnFeed {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl TurnFeed {
    /// Every source, in report order.
    pub const ALL: [Self; 2] = [Self::Request, Self::Index];

    /// Report name: `request`, `index`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Request => "request",
            Self::Index => "index",
        }
    }

    /// Parses a report name.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.name() == name)
    }
}

/// How KV moves between the engines and the tier: which connector, hence when a load runs
/// and what it stalls, and at what rate (perf-model §6.4).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum TierPath {
    /// LMCache's vLLM v1 connector as deployed by default, Mooncake backend: the load runs
    /// inside the step that admits the request, before its forward pass, so every request of
    /// that step waits for it; stores copy GPU → host inside the step, then put over RDMA.
    Lmcache,
    /// vLLM's native Mooncake-store connector: asynchronous loads (the request waits in
    /// `WAITING_FOR_REMOTE_KVS`, the engine keeps stepping); stores put from GPU memory off the
    /// critical path.
    MooncakeStore,
    /// vLLM's `OffloadingConnector`: asynchronous DMA to and from host DRAM, no network.
    CpuOffload,
}

impl TierPath {
    /// Every path, in CLI order.
    pub const ALL: [Self; 3] = [Self::Lmcache, Self::MooncakeStore, Self::CpuOffload];

    /// The CLI / config name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Lmcache => "lmcache",
            Self::MooncakeStore => "mooncake-store",
            Self::CpuOffload => "cpu-offload",
        }
    }

    /// The path called `name`.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.name() == name)
    }

    /// Whether each instance has a store of its own (vLLM's `OffloadingConnector` copies to
    /// the engine's own host DRAM), not one every instance reads: the store's capacity is then
    /// split evenly between the instances, and the router credits a block to the instance that
    /// offloaded it (its host pool, docs/routing-semantics.md §2.8).
    pub fn per_instance(self) -> bool {
        self == Self::CpuOffload
    }

    /// Whether a load stalls the step that admits its request.
    pub fn synchronous_load(self) -> bool {
        self == Self::Lmcache
    }

    /// Whether stores copy GPU → host inside the step (LMCache's `wait_for_save`).
    pub fn store_copy_in_step(self) -> bool {
        self == Self::Lmcache
    }

    /// Whether transfers cross the node's NIC (a remote store) or stay on the host.
    pub fn uses_nic(self) -> bool {
        self != Self::CpuOffload
    }

    /// Measured effective load rate per rank, bytes/s.
    pub fn load_bytes_per_s(self) -> f64 {
        match self {
            Self::Lmcache | Self::MooncakeStore => MOONCAKE_RDMA_LOAD_BYTES_PER_S,
            Self::CpuOffload => CPU_OFFLOAD_LOAD_BYTES_PER_S,
        }
    }

    /// Store rate per rank past the GPU, bytes/s: the RDMA put, or the host DMA (PCIe).
    pub fn store_bytes_per_s(self, pcie_bytes_per_s: f64) -> f64 {
        match self {
            Self::Lmcache | Self::MooncakeStore => MOONCAKE_RDMA_STORE_BYTES_PER_S,
            Self::CpuOffload => pcie_bytes_per_s,
        }
    }
}

/// The cluster-wide KV store, the connector that reaches it, and the links it shares.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct GlobalTierConfig {
    /// Switches the tier on or off (off: no connector, no stores, no fetches; the router's
    /// tier is off too).
    pub enabled: bool,
    /// The connector and store: load semantics and measured rates.
    pub path: TierPath,
    /// With [`TierPath::Lmcache`]: LMCache's layer-wise pipelining, the load overlapping the
    /// step's compute (step time = max(compute, load) instead of the sum).
    pub layerwise: bool,
    /// Store capacity, bytes of KV (the whole model's KV per token, see `Profile`).
    pub capacity_bytes: u64,
    /// Fixed cost of one load on top of its transfer (`α_f`), seconds.
    pub fetch_latency_s: f64,
    /// Load rate per rank, bytes/s; `None`: the path's measured rate.
    pub bandwidth_bytes_per_s: Option<f64>,
    /// GPUs per node: instances `0..gpus_per_node / tp` share node 0's NIC, and so on.
    pub gpus_per_node: u32,
    /// A node's NIC bandwidth per direction, bytes/s, shared fairly by its transfers.
    pub nic_bytes_per_s: f64,
    /// A GPU's host link per direction, bytes/s: caps every transfer of one rank.
    pub pcie_bytes_per_s: f64,
    /// Added to every engine step while the tier (a connector) is on, seconds.
    pub connector_step_overhead_s: f64,
}

impl Default for GlobalTierConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            path: TierPath::Lmcache,
            layerwise: false,
            capacity_bytes: DEFAULT_TIER_CAPACITY_BYTES,
            fetch_latency_s: 0.0,
            bandwidth_bytes_per_s: None,
            gpus_per_node: DEFAULT_GPUS_PER_NODE,
            nic_bytes_per_s: DEFAULT_NIC_BYTES_PER_S,
            pcie_bytes_per_s: DEFAULT_PCIE_BYTES_PER_S,
            connector_step_overhead_s: DEFAULT_CONNECTOR_STEP_OVERHEAD_S,
        }
    }
}

impl GlobalTierConfig {
    /// Load rate of one rank, bytes/s: the path's (or the override), capped by PCIe.
    pub fn load_rank_bytes_per_s(&self) -> f64 {
        self.bandwidth_bytes_per_s
            .unwrap_or_else(|| self.path.load_bytes_per_s())
            .min(self.pcie_bytes_per_s)
    }

    /// Store rate of one rank past the GPU, bytes/s, capped by PCIe.
    pub fn store_rank_bytes_per_s(&self) -> f64 {
        self.path
            .store_bytes_per_s(self.pcie_bytes_per_s)
            .min(self.pcie_bytes_per_s)
    }

    /// The node link a transfer of this path shares, bytes/s (unbounded off the network).
    pub fn node_bytes_per_s(&self) -> f64 {
        if self.path.uses_nic() {
            self.nic_bytes_per_s
        } else {
            f64::INFINITY
        }
    }
}

/// Service-level objectives.
///
/// **TTFT** is length-aware: `ttft_base_s + ttft_s_per_token · input_tokens`, by default
/// 2 s + 0.1 ms/token. The 2 s base is perf-model §5's fixed tier for short prompts. The
/// slope is twice the H20 linear prefill cost (50 µs/token), so a cold prompt on an idle
/// H20 meets it up to ≈35K tokens (4.7 s at 32K vs a 5.2 s bound); beyond that only a cache
/// hit can — exactly the regime where routing matters. A fixed bound would make long agent
/// turns impossible (a cold 33.6K prompt alone needs ≈4.9 s), and at the Weka p90 prompt
/// (271K tokens) the bound reaches 29 s, Mooncake's 30 s SLO.
///
/// **TPOT** = (finish − first token) / (output − 1), which includes every chunked-prefill step
/// the request shared. A request meets the SLO when it meets both bounds; one with a single
/// output token has no TPOT and meets that half trivially.
///
/// **Tail TBT** (optional, off by default): the mean of the longest tenth of a request's token
/// gaps (Mooncake FAST'25's TBT) must stay under `tbt_tail_s` too. A mean TPOT hides a stall
/// (a batch held by a synchronous KV load, a preemption) in a long output; the tail shows it.
/// Off by default because no measured deployment fixes its value; reports add it as a setting.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct SloConfig {
    /// TTFT bound at zero input tokens, seconds.
    pub ttft_base_s: f64,
    /// TTFT bound growth per input token, seconds.
    pub ttft_s_per_token: f64,
    /// TPOT bounds to report, seconds; the first is the headline.
    pub tpot_s: Vec<f64>,
    /// Tail-TBT bound, seconds, applied with every TPOT bound; `None`: no such bound.
    pub tbt_tail_s: Option<f64>,
}

impl Default for SloConfig {
    fn default() -> Self {
        Self {
            ttft_base_s: 2.0,
            ttft_s_per_token: 1.0e-4,
            tpot_s: vec![0.1, 0.05],
            tbt_tail_s: None,
        }
    }
}

impl SloConfig {
    /// TTFT bound of a request with `input_tokens` prompt tokens, seconds.
    pub fn ttft_bound(&self, input_tokens: u32) -> f64 {
        self.ttft_base_s + self.ttft_s_per_token * f64::from(input_tokens)
    }
}

/// Everything a simulation run needs besides the workload and the policy.
///
/// Serialises (for `sim_config_defaults()` in Python) with the profile and the index feed by
/// name and without `router`, whose fields Python reads from its own `RouterConfig`.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct SimConfig {
    /// Number of vLLM instances.
    pub instances: u32,
    /// Hardware + model profile of every instance.
    #[serde(serialize_with = "profile_name")]
    pub profile: Profile,
    /// Token budget of one engine step (`max_num_batched_tokens`).
    pub max_num_batched_tokens: u32,
    /// Most requests in the running batch (`max_num_seqs`).
    pub max_num_seqs: u32,
    /// Longest prompt + output accepted; `None`: min(profile context window, KV capacity).
    pub max_model_len: Option<u32>,
    /// KV cache per instance in tokens; `None`: the profile's.
    pub kv_capacity_tokens: Option<u64>,
    /// The global KV tier.
    pub global_tier: GlobalTierConfig,
    /// Open-loop speed-up: 2.0 replays a trace twice as fast.
    pub time_scale: f64,
    /// Closed-loop root-session arrival rate (Poisson), sessions/s.
    pub session_rate_per_s: f64,
    /// Caps closed-loop think times (e.g. a user away for an hour); `None` keeps them.
    pub max_think_s: Option<f64>,
    /// Requests due after this time are not issued, nor are their successors; `None`
    /// issues every request. Requests in flight at that time still finish.
    pub arrivals_until_s: Option<f64>,
    /// Seed of the session arrivals and of the router's tie-breaks.
    pub seed: u64,
    /// Service-level objectives.
    pub slo: SloConfig,
    /// Requests arriving before this time are not measured, seconds.
    pub measure_start_s: f64,
    /// Requests arriving after this time are not measured; `None`: the last finish.
    pub measure_end_s: Option<f64>,
    /// Period of the load-imbalance samples, seconds.
    pub sample_interval_s: f64,
    /// Period of engine load reports to the router; `None` sends none.
    pub load_report_interval_s: Option<f64>,
    /// Period of the per-instance load series ([`crate::metrics::LoadSeries`]); `None`
    /// records none. Rounded up to a multiple of `sample_interval_s` (it is taken at samples).
    pub series_interval_s: Option<f64>,
    /// Stops the run with [`SimError::EventBudget`] after this many events; `None`: no limit.
    pub max_events: Option<u64>,
    /// Keep one [`crate::metrics::RequestRecord`] per request in the report.
    pub keep_records: bool,
    /// How the router's KV$ index is fed (see `cache_events`): insert on route, the engines'
    /// KV events, or the oracle.
    pub index_feed: IndexFeed,
    /// With `index_feed = events`: seconds from a batch's publication to its application.
    pub event_delay_s: f64,
    /// Whether the router is told each request's turn, or infers it from its index.
    pub turns: TurnFeed,
    /// Router tunables. Its `local_capacity_blocks` and `global_capacity_blocks` are always
    /// overwritten with the simulated pool and tier sizes, in the workload's blocks, and its
    /// `index_mode` with the one `index_feed` needs.
    #[serde(skip)]
    pub router: RouterConfig,
    /// Disaggregated prefill/decode: `instances` split into a prefill and a decode pool
    /// ([`PdSimConfig`]); `None`: co-located.
    pub pd: Option<PdSimConfig>,
    /// Share of an answer's tokens the next turn re-sends token for token, in [0, 1]: their
    /// blocks stay cached on the instance that generated them ([`DEFAULT_ANSWER_RERENDER_SHARE`]).
    pub answer_rerender_share: f64,
    /// Router replicas behind a round-robin load balancer, each with its own index and board
    /// (`placers::replicated`); 1: one router.
    pub router_replicas: u32,
    /// Whether replicas share their load effects ([`ReplicaSync`]).
    pub replica_sync: ReplicaSync,
    /// With `replica_sync = bus`: seconds from a replica's load effect to the others' boards.
    pub replica_sync_delay_s: f64,
    /// Session admission after the policy (`smetric_core::session_admission`): a request that
    /// its instance's resident sessions leave no KV room for is held (`pause`) or placed where
    /// there is room (`smetric`); held requests wait in the cluster's queue.
    #[serde(serialize_with = "admission_name")]
    pub session_admission: AdmissionMode,
    /// The longest session admission holds a request before admitting it where its policy sent
    /// it, seconds; `None`: the mode's default (`AdmissionMode::default_max_hold_s`).
    pub session_admission_max_hold_s: Option<f64>,
}

// serde's `serialize_with` hands over a reference.
#[allow(clippy::trivially_copy_pass_by_ref)]
fn admission_name<S: serde::Serializer>(mode: &AdmissionMode, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_str(mode.name())
}

fn profile_name<S: serde::Serializer>(profile: &Profile, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_str(&profile.name)
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            instances: 16,
            profile: Profile::h20_qwen3_coder_30b(),
            max_num_batched_tokens: DEFAULT_MAX_BATCHED_TOKENS,
            max_num_seqs: DEFAULT_MAX_NUM_SEQS,
            max_model_len: None,
            kv_capacity_tokens: None,
            global_tier: GlobalTierConfig::default(),
            time_scale: 1.0,
            session_rate_per_s: 0.05,
            max_think_s: None,
            arrivals_until_s: None,
            seed: 0,
            slo: SloConfig::default(),
            measure_start_s: 0.0,
            measure_end_s: None,
            sample_interval_s: 1.0,
            load_report_interval_s: None,
            series_interval_s: None,
            max_events: None,
            keep_records: false,
            index_feed: IndexFeed::Approximate,
            event_delay_s: DEFAULT_EVENT_DELAY_S,
            turns: TurnFeed::Request,
            router: RouterConfig::default(),
            pd: None,
            answer_rerender_share: DEFAULT_ANSWER_RERENDER_SHARE,
            router_replicas: 1,
            replica_sync: ReplicaSync::Off,
            replica_sync_delay_s: DEFAULT_REPLICA_SYNC_DELAY_S,
            session_admission: AdmissionMode::Off,
            session_admission_max_hold_s: None,
        }
    }
}

fn positive(field: &'static str, value: f64) -> Result<()> {
    if value.is_finite() && value > 0.0 {
        Ok(())
    } else {
        Err(SimError::InvalidConfig {
            field,
            reason: format!("must be a finite number > 0, got {value}"),
        })
    }
}

fn non_negative(field: &'static str, value: f64) -> Result<()> {
    if value.is_finite() && value >= 0.0 {
        Ok(())
    } else {
        Err(SimError::InvalidConfig {
            field,
            reason: format!("must be a finite number >= 0, got {value}"),
        })
    }
}

impl SimConfig {
    /// KV capacity of one instance in tokens.
    pub fn kv_tokens(&self) -> u64 {
        self.kv_capacity_tokens.unwrap_or(self.profile.kv_capacity_tokens)
    }

    /// Effective `max_model_len`.
    pub fn model_len(&self) -> u64 {
        self.max_model_len.map_or_else(
            || u64::from(self.profile.max_context_tokens).min(self.kv_tokens()),
            u64::from,
        )
    }

    /// Checks every field; `run` calls it first.
    pub fn validate(&self) -> Result<()> {
        self.profile.validate()?;
        if self.instances == 0 {
            return Err(SimError::InvalidConfig {
                field: "instances",
                reason: "must be >= 1".into(),
            });
        }
        if self.max_num_batched_tokens == 0 || self.max_num_seqs == 0 {
            return Err(SimError::InvalidConfig {
                field: "max_num_batched_tokens",
                reason: "max_num_batched_tokens and max_num_seqs must be >= 1".into(),
            });
        }
        if self.model_len() > self.kv_tokens() {
            return Err(SimError::InvalidConfig {
                field: "max_model_len",
                reason: format!(
                    "{} exceeds the KV capacity of {} tokens (vLLM refuses to start)",
                    self.model_len(),
                    self.kv_tokens()
                ),
            });
        }
        if self.model_len() == 0 {
            return Err(SimError::InvalidConfig {
                field: "max_model_len",
                reason: "must be >= 1".into(),
            });
        }
        positive("time_scale", self.time_scale)?;
        positive("session_rate_per_s", self.session_rate_per_s)?;
        positive("sample_interval_s", self.sample_interval_s)?;
        non_negative("measure_start_s", self.measure_start_s)?;
        non_negative("event_delay_s", self.event_delay_s)?;
        if !(0.0..=1.0).contains(&self.answer_rerender_share) {
            return Err(SimError::InvalidConfig {
                field: "answer_rerender_share",
                reason: format!("must be in [0, 1], got {}", self.answer_rerender_share),
            });
        }
        non_negative("slo.ttft_base_s", self.slo.ttft_base_s)?;
        non_negative("slo.ttft_s_per_token", self.slo.ttft_s_per_token)?;
        if self.slo.tpot_s.is_empty() {
            return Err(SimError::InvalidConfig {
                field: "slo.tpot_s",
                reason: "needs at least one bound".into(),
            });
        }
        for &t in &self.slo.tpot_s {
            positive("slo.tpot_s", t)?;
        }
        if let Some(t) = self.slo.tbt_tail_s {
            positive("slo.tbt_tail_s", t)?;
        }
        if let Some(end) = self.measure_end_s {
            positive("measure_end_s", end)?;
            if end <= self.measure_start_s {
                return Err(SimError::InvalidConfig {
                    field: "measure_end_s",
                    reason: format!("{end} is not after measure_start_s {}", self.measure_start_s),
                });
            }
        }
        if let Some(t) = self.max_think_s {
            non_negative("max_think_s", t)?;
        }
        if let Some(t) = self.load_report_interval_s {
            positive("load_report_interval_s", t)?;
        }
        non_negative("replica_sync_delay_s", self.replica_sync_delay_s)?;
        if self.router_replicas == 0 || self.router_replicas > MAX_ROUTER_REPLICAS {
            return Err(SimError::InvalidConfig {
                field: "router_replicas",
                reason: format!("must be in 1..={MAX_ROUTER_REPLICAS}, got {}", self.router_replicas),
            });
        }
        if self.router_replicas > 1 && self.pd.is_some() {
            return Err(SimError::InvalidConfig {
                field: "router_replicas",
                reason: "PD mode runs one router".into(),
            });
        }
        if self.session_admission != AdmissionMode::Off && (self.pd.is_some() || self.router_replicas > 1) {
            return Err(SimError::InvalidConfig {
                field: "session_admission",
                reason: "session admission runs with one co-located router".into(),
            });
        }
        if let Some(t) = self.session_admission_max_hold_s {
            non_negative("session_admission_max_hold_s", t)?;
        }
        if let Some(t) = self.arrivals_until_s {
            non_negative("arrivals_until_s", t)?;
        }
        if let Some(t) = self.series_interval_s {
            positive("series_interval_s", t)?;
        }
        if let Some(pd) = &self.pd {
            pd.validate(self.instances)?;
            positive("global_tier.nic_bytes_per_s", self.global_tier.nic_bytes_per_s)?;
            if self.global_tier.gpus_per_node == 0 {
                return Err(SimError::InvalidConfig {
                    field: "global_tier.gpus_per_node",
                    reason: "must be >= 1".into(),
                });
            }
            if self.index_feed != IndexFeed::Approximate {
                return Err(SimError::InvalidConfig {
                    field: "index_feed",
                    reason: "PD mode feeds the prefill router by insert on route only".into(),
                });
            }
        }
        let tier = &self.global_tier;
        if tier.enabled {
            non_negative("global_tier.fetch_latency_s", tier.fetch_latency_s)?;
            if let Some(b) = tier.bandwidth_bytes_per_s {
                positive("global_tier.bandwidth_bytes_per_s", b)?;
            }
            positive("global_tier.nic_bytes_per_s", tier.nic_bytes_per_s)?;
            positive("global_tier.pcie_bytes_per_s", tier.pcie_bytes_per_s)?;
            non_negative("global_tier.connector_step_overhead_s", tier.connector_step_overhead_s)?;
            if tier.gpus_per_node == 0 {
                return Err(SimError::InvalidConfig {
                    field: "global_tier.gpus_per_node",
                    reason: "must be >= 1".into(),
                });
            }
            if tier.layerwise && !tier.path.synchronous_load() {
                return Err(SimError::InvalidConfig {
                    field: "global_tier.layerwise",
                    reason: format!(
                        "layer-wise pipelining is LMCache's; the {} path loads asynchronously",
                        tier.path.name()
                    ),
                });
            }
        }
        Ok(())
    }
}

/// PD cluster settings ([`crate::SimConfig::pd`]).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct PdSimConfig {
    /// Prefill instances (slots `0..prefill_instances`).
    pub prefill_instances: u32,
    /// Decode instances (the slots after them).
    pub decode_instances: u32,
    /// The decode rule; `None`: the prefill policy's peer form.
    #[serde(serialize_with = "rule_name")]
    pub decode_rule: Option<DecodeRule>,
    /// Per-rank cap of a pull, bytes/s.
    pub transfer_rank_bytes_per_s: f64,
    /// Fixed cost of one pull on top of its bytes, seconds.
    pub transfer_latency_s: f64,
}

// serde's `serialize_with` hands the field by reference.
#[allow(clippy::ref_option, clippy::trivially_copy_pass_by_ref)]
fn rule_name<S: Serializer>(rule: &Option<DecodeRule>, s: S) -> std::result::Result<S::Ok, S::Error> {
    match rule {
        Some(r) => s.serialize_str(r.name()),
        None => s.serialize_none(),
    }
}

/// A pull's fixed cost, seconds (see the module table).
pub const DEFAULT_TRANSFER_LATENCY_S: f64 = 0.4e-3;

impl Default for PdSimConfig {
    fn default() -> Self {
        Self {
            prefill_instances: 8,
            decode_instances: 8,
            decode_rule: None,
            transfer_rank_bytes_per_s: DEFAULT_PCIE_BYTES_PER_S,
            transfer_latency_s: DEFAULT_TRANSFER_LATENCY_S,
        }
    }
}

impl PdSimConfig {
    /// Checks the fields against the cluster's `instances`.
    pub fn validate(&self, instances: u32) -> Result<()> {
        if self.prefill_instances == 0 || self.decode_instances == 0 {
            return Err(SimError::InvalidConfig {
                field: "pd",
                reason: "needs at least one prefill and one decode instance".into(),
            });
        }
        if self.prefill_instances + self.decode_instances != instances {
            return Err(SimError::InvalidConfig {
                field: "pd",
                reason: format!(
                    "prefill_instances + decode_instances = {} must equal instances = {instances}",
                    self.prefill_instances + self.decode_instances
                ),
            });
        }
        if !(self.transfer_rank_bytes_per_s.is_finite() && self.transfer_rank_bytes_per_s > 0.0) {
            return Err(SimError::InvalidConfig {
                field: "pd.transfer_rank_bytes_per_s",
                reason: format!("must be a finite number > 0, got {}", self.transfer_rank_bytes_per_s),
            });
        }
        if !(self.transfer_latency_s.is_finite() && self.transfer_latency_s >= 0.0) {
            return Err(SimError::InvalidConfig {
                field: "pd.transfer_latency_s",
                reason: format!("must be a finite number >= 0, got {}", self.transfer_latency_s),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_consistent() {
        let c = SimConfig::default();
        c.validate().unwrap();
        assert_eq!(c.model_len(), 262_144);
        assert!(c.kv_tokens() > 280_000);
        assert!((c.slo.ttft_bound(10_000) - 3.0).abs() < 1e-12);
    }

    #[test]
    fn invalid_fields_are_named() {
        let c = SimConfig {
            instances: 0,
            ..SimConfig::default()
        };
        assert!(matches!(
            c.validate(),
            Err(SimError::InvalidConfig { field: "instances", .. })
        ));
        let c = SimConfig {
            max_model_len: Some(10_000_000),
            ..SimConfig::default()
        };
        assert!(matches!(
            c.validate(),
            Err(SimError::InvalidConfig {
                field: "max_model_len",
                ..
            })
        ));
        let c = SimConfig {
            time_scale: 0.0,
            ..SimConfig::default()
        };
        assert!(c.validate().is_err());
        let c = SimConfig {
            measure_start_s: 5.0,
            measure_end_s: Some(1.0),
            ..SimConfig::default()
        };
        assert!(c.validate().is_err());
        let tier = |t: GlobalTierConfig| SimConfig {
            global_tier: t,
            ..SimConfig::default()
        };
        let bad = [
            (
                GlobalTierConfig {
                    gpus_per_node: 0,
                    ..GlobalTierConfig::default()
                },
                "global_tier.gpus_per_node",
            ),
            (
                GlobalTierConfig {
                    path: TierPath::MooncakeStore,
                    layerwise: true,
                    ..GlobalTierConfig::default()
                },
                "global_tier.layerwise",
            ),
            (
                GlobalTierConfig {
                    bandwidth_bytes_per_s: Some(0.0),
                    ..GlobalTierConfig::default()
                },
                "global_tier.bandwidth_bytes_per_s",
            ),
        ];
        for (t, name) in bad {
            assert!(
                matches!(tier(t).validate(), Err(SimError::InvalidConfig { field, .. }) if field == name),
                "{name}"
            );
        }
    }

    #[test]
    fn tier_paths_name_their_semantics_and_rates() {
        for path in TierPath::ALL {
            assert_eq!(TierPath::parse(path.name()), Some(path));
        }
        assert_eq!(TierPath::parse("nixl"), None);
        assert_eq!(GlobalTierConfig::default().path, TierPath::ALL[0]);
        assert!(TierPath::Lmcache.synchronous_load() && TierPath::Lmcache.store_copy_in_step());
        assert!(!TierPath::MooncakeStore.synchronous_load() && !TierPath::CpuOffload.synchronous_load());
        let t = GlobalTierConfig::default();
        assert!((t.load_rank_bytes_per_s() - 7.4e9).abs() < 1.0);
        assert!((t.store_rank_bytes_per_s() - 8.1e9).abs() < 1.0);
        assert!((t.node_bytes_per_s() - 87e9).abs() < 1.0);
        let offload = GlobalTierConfig {
            path: TierPath::CpuOffload,
            ..GlobalTierConfig::default()
        };
        assert!((offload.load_rank_bytes_per_s() - 40e9).abs() < 1.0);
        assert!((offload.store_rank_bytes_per_s() - 54e9).abs() < 1.0);
        assert!(offload.node_bytes_per_s().is_infinite());
        let fast = GlobalTierConfig {
            bandwidth_bytes_per_s: Some(100e9),
            ..GlobalTierConfig::default()
        };
        assert!((fast.load_rank_bytes_per_s() - 54e9).abs() < 1.0, "PCIe caps a rank");
    }
}
