//! Simulation configuration. Every default is defined here, once, with its reason.
//!
//! | field | default | why |
//! |---|---|---|
//! | `instances` | 16 | the LMetric evaluation fleet: 16 H20, one instance per GPU |
//! | `profile` | H20 + Qwen3-Coder-30B-A3B, TP1 | the reference deployment of perf-model.md |
//! | `max_num_batched_tokens` | 8192 | vLLM v1's default on ≥ 70 GiB GPUs, which the §3B H20 anchors ran with |
//! | `max_num_seqs` | 256 | the LMetric AE flag; on long agent prompts KV capacity binds long before it |
//! | `max_model_len` | min(context window, KV capacity) | vLLM refuses a longer `max_model_len`; longer requests are rejected |
//! | `global_tier.capacity_bytes` | 1.5 TiB | the router's default global tier: 16M tokens of the 30B model's 96 KiB/token |
//! | `global_tier.fetch_latency_s` | 2 ms | lookup/RPC, middle of the [A] 1–5 ms of perf-model §6 |
//! | `global_tier.bandwidth_bytes_per_s` | 20 GB/s | middle of the {6, 20, 40} GB/s sweep of §6; matches the router's `global_fetch_cost` 0.1 |
//! | `global_tier.fifo_link` | true | one PCIe/NIC link per GPU: concurrent fetches to one instance queue |
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

use smetric_core::RouterConfig;

use crate::cache_events::IndexFeed;
use crate::error::{Result, SimError};
use crate::perf_model::Profile;

/// 1.5 TiB in bytes: 16,777,216 tokens × 96 KiB, the router's default global capacity.
pub const DEFAULT_TIER_CAPACITY_BYTES: u64 = 16_777_216 * 98_304;
/// Default global-tier lookup latency, seconds.
pub const DEFAULT_TIER_LATENCY_S: f64 = 0.002;
/// Default global-tier read bandwidth per GPU, bytes/s.
pub const DEFAULT_TIER_BANDWIDTH: f64 = 20.0e9;
/// Default delay between an engine publishing a KV-event batch and the router applying it, seconds.
pub const DEFAULT_EVENT_DELAY_S: f64 = 0.01;
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

/// The cluster-wide CPU KV store.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct GlobalTierConfig {
    /// Switches the tier on or off (off: no stores, no fetches; the router's tier is off too).
    pub enabled: bool,
    /// Store capacity, bytes of KV (the whole model's KV per token, see `Profile`).
    pub capacity_bytes: u64,
    /// Fixed cost of one fetch (`α_f`), seconds.
    pub fetch_latency_s: f64,
    /// Fetch bandwidth per instance link (`B_eff`), bytes/s.
    pub bandwidth_bytes_per_s: f64,
    /// Fetches to one instance share one FIFO link.
    pub fifo_link: bool,
}

impl Default for GlobalTierConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            capacity_bytes: DEFAULT_TIER_CAPACITY_BYTES,
            fetch_latency_s: DEFAULT_TIER_LATENCY_S,
            bandwidth_bytes_per_s: DEFAULT_TIER_BANDWIDTH,
            fifo_link: true,
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
        if let Some(t) = self.arrivals_until_s {
            non_negative("arrivals_until_s", t)?;
        }
        if let Some(t) = self.series_interval_s {
            positive("series_interval_s", t)?;
        }
        if self.global_tier.enabled {
            non_negative("global_tier.fetch_latency_s", self.global_tier.fetch_latency_s)?;
            positive(
                "global_tier.bandwidth_bytes_per_s",
                self.global_tier.bandwidth_bytes_per_s,
            )?;
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
    }
}
