//! Disaggregated prefill/decode (PD) in the simulator: its settings and its report.
//!
//! The cluster (`cluster::pd`): instances `0..P` are prefill instances, `P..P+D` decode
//! instances. A request is routed once, by the real `smetric_core::PdRouter`
//! ([`crate::pd_placer::CorePdPlacer`]), to a pair. Its prefill instance runs it as vLLM's
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
//! | field | default | why |
//! |---|---|---|
//! | `prefill_instances` / `decode_instances` | 8 / 8 | the default 16-GPU fleet split in half; the CLI always sets them |
//! | `decode_rule` | none | the peer form of the prefill policy (`DecodeRule::peer_form`) |
//! | `transfer_rank_bytes_per_s` | 54 GB/s | a GPU's own link: GPUDirect RDMA reads cross its PCIe link, measured at 54 GB/s on H20 (perf-model §3B) |
//! | `transfer_latency_s` | 0.4 ms | Mooncake's 1P1D figure for 128 tokens (0.54 ms for 20 MB) minus its bytes at the measured 142 GB/s (`docs/pd-and-tier.md` §A.3) |
//!
//! The node NIC is `global_tier.nic_bytes_per_s` (87 GB/s, Mooncake's transfer engine on
//! 4 × 200 Gbps) and nodes hold `global_tier.gpus_per_node / tp` instances, decode nodes
//! apart from prefill nodes. A pull is timed on the decode node's ingress only; the prefill
//! node's egress is not modelled (with D ≤ P each prefill node sends less than a decode node
//! receives).

use serde::Serializer;
use smetric_core::pd::DecodeRule;

use crate::config::DEFAULT_PCIE_BYTES_PER_S;
use crate::error::{Result, SimError};
use crate::metrics::Percentiles;

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

/// What a PD run reports beyond the co-located metrics.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct PdReport {
    /// Prefill instances.
    pub prefill_instances: u32,
    /// Decode instances.
    pub decode_instances: u32,
    /// The decode rule applied.
    pub decode_rule: String,
    /// Pulls completed.
    pub transfers: u64,
    /// Bytes pulled, summed over ranks (the whole model's KV).
    pub transfer_bytes: f64,
    /// Prompt tokens a decode instance's own prefix cache held (not pulled), summed.
    pub decode_hit_tokens: u64,
    /// Seconds from the pull's submission to its end (queueing behind the rank included).
    pub transfer_time: Percentiles,
    /// Seconds from the prefill instance's last step to the decode instance's allocation
    /// (waiting for decode KV space: the decode side's KV pressure).
    pub decode_admission_wait: Percentiles,
    /// Mean share of decode KV blocks in use, sampled every `sample_interval_s`.
    pub decode_kv_usage_mean: f64,
    /// Largest sampled share of decode KV blocks in use.
    pub decode_kv_usage_max: f64,
    /// Preemptions on decode instances.
    pub decode_preemptions: u64,
}
