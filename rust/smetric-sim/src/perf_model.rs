//! Analytic iteration-time model of one vLLM instance (`docs/perf-model.md` §6).
//!
//! One engine step (an *iteration*) runs prefill chunks `i` (`n_i` new tokens on top of
//! `c_i` tokens already in KV) and decodes `j` (context `L_j`) together:
//!
//! ```text
//! N      = Σ n_i + B_dec
//! nEff   = E · (1 − (1 − k/E)^N)                       distinct experts touched
//! T_iter = t_fix
//!        + max(a·N, (W_dense + L_moe·nEff·W_exp) / (TP·BW·η_m))   linear compute vs weight read
//!        + 2b · Σ_i (n_i·c_i + n_i²/2)                              causal attention FLOPs
//!        + (Σ_j L_j + Σ_i c_i) · kv_rank / (BW·η_kv)                KV read
//!        + T_tp,   T_tp = 2·L·(α_ar + 2(TP−1)/TP · N·h·2 B / BW_ar)  (0 for TP1)
//! ```
//!
//! A batch is summarised by four sums ([`BatchShape`]), so the cost of a step is O(1) once
//! the batch is built, and building it is O(requests in the batch) — never per token.
//!
//! # Calibration (deviations from the §6 defaults, each checked by the anchor tests)
//! * **η_kv = 0.35** (KV read efficiency) instead of reading KV at η_m = 0.85. With η_m the
//!   Qwen3-30B BF16 column of the §3A speed table comes out +23…+29 % at 30K–129K inputs,
//!   outside the ±20 % tolerance of §7.2: batch-1 decode at long context is slower than a
//!   full-bandwidth KV read (paged, GQA-4 attention at batch 1). 0.35 puts all 24 cells within
//!   ±12 % and moves the vLLM TTFT anchors of §3B by < 3 %. The 235B columns barely depend on it.
//! * **Frontend 24 ms + 0.95 µs/token** instead of 15 ms + 1.1 µs/token: fitted to both vLLM
//!   GPU-hit anchors (42 ms at 1K, 111 ms at 64K); with the §6 value the 1K hit is −21 %.
//! * **235B: α_ar = 10 µs, t_fix = 10.45 ms** instead of 15 µs / 12.3 ms. §6 derived
//!   t_fix = 14.0 − 1.6 ms without the all-reduce term, so adding T_tp double-counted it
//!   (batch-1 decode +19 %). With α_ar at the low end of the [A] range, t_fix re-derived from
//!   the 14.0 ms anchor is 111 µs per layer — the same per-layer floor as the 30B model
//!   (5.4 ms / 48 layers = 112 µs), which is what a launch-bound floor should look like.
//!
//! The 235B prefill constant `a` is SGLang's (§6 table: ≈140 µs/token at TP4); vLLM may be
//! ≈1.5× faster [A] but no vLLM measurement exists, so the measured value is kept.

use crate::error::{Result, SimError};

/// Bytes in one GiB.
pub const GIB: f64 = 1_073_741_824.0;
/// H20 HBM3 bandwidth, bytes/s (perf-model §2).
pub const H20_HBM_BYTES_PER_S: f64 = 4.0e12;
/// H20 memory usable for the engine, GiB (perf-model §2, [A]).
pub const H20_USABLE_GIB: f64 = 95.6;
/// H200 HBM3e bandwidth, bytes/s (perf-model §2).
pub const H200_HBM_BYTES_PER_S: f64 = 4.8e12;
/// H200 memory usable for the engine, GiB: 141 GB is 131.3 GiB; nvidia-smi reports about
/// 140 GiB on the 143,771 MiB parts, of which we take 0.5 % less, as for the H20 [A].
pub const H200_USABLE_GIB: f64 = 139.3;
/// NVLink all-reduce bus bandwidth, bytes/s (perf-model §6, half of the 900 GB/s link).
pub const NVLINK_ALLREDUCE_BYTES_PER_S: f64 = 450.0e9;
/// Fraction of HBM bandwidth reached when streaming weights (perf-model §3D).
pub const WEIGHT_READ_EFFICIENCY: f64 = 0.85;
/// Fraction of HBM bandwidth reached when reading KV (calibrated; see the module docs).
pub const KV_READ_EFFICIENCY: f64 = 0.35;
/// Fixed frontend cost per request before the engine sees it, seconds (calibrated).
pub const FRONTEND_BASE_S: f64 = 0.024;
/// Frontend cost per prompt token, seconds (calibrated).
pub const FRONTEND_S_PER_TOKEN: f64 = 0.95e-6;
/// `gpu_memory_utilization` assumed by the built-in profiles (vLLM's 0.9 default).
pub const GPU_MEMORY_UTILIZATION: f64 = 0.9;
/// Memory kept for activations and CUDA graphs, GiB (perf-model §2, [A]).
pub const ACTIVATION_RESERVE_GIB: f64 = 3.0;
/// Native context window of the Qwen3 models (`max_position_embeddings` = 262,144).
pub const QWEN3_MAX_CONTEXT_TOKENS: u32 = 262_144;

/// Step floor of the 30B model on H20: batch-1 decode 7.3 ms minus a 1.8 ms weight read
/// (perf-model §3A), seconds.
const T_FIX_30B_S: f64 = 5.4e-3;
/// Step floor of the 235B model, re-derived with the all-reduce term (module docs), seconds.
const T_FIX_235B_S: f64 = 10.45e-3;
/// All-reduce launch latency per call, seconds (low end of the [A] 10–20 µs range).
const ALLREDUCE_LATENCY_S: f64 = 10.0e-6;
/// 30B linear prefill cost on H20 with vLLM, seconds/token (fit to 15.2 s at 64K, §3B).
const A_30B_H20_S: f64 = 50.0e-6;
/// 235B FP8 TP4 linear prefill cost with SGLang, seconds/token per instance (§6).
const A_235B_TP4_S: f64 = 140.0e-6;
/// 30B attention coefficient on H20, seconds per token pair (§3A quadratic fit).
const B_30B_H20_S: f64 = 2.8e-9;
/// 235B TP4 attention coefficient, seconds per token pair (§3A quadratic fit).
const B_235B_TP4_S: f64 = 2.9e-9;
/// KV bytes per token of Qwen3-30B-A3B: 48 layers · 2 · 4 heads · 128 · 2 B.
const KV_30B_BYTES: f64 = 98_304.0;
/// KV bytes per token of Qwen3-235B-A22B (whole model): 94 · 2 · 4 · 128 · 2 B.
const KV_235B_BYTES: f64 = 192_512.0;
/// KV bytes per token per rank of Qwen3-235B-A22B at TP4 or TP8: one KV head per rank.
const KV_235B_RANK_BYTES: f64 = 48_128.0;
/// Dense (attention, router, embeddings) weights of the 30B model in BF16, bytes (§6).
const W_DENSE_30B_BF16: f64 = 2.45e9;
/// Dense weights of the 30B model with FP8 attention and BF16 embeddings, bytes [D].
const W_DENSE_30B_FP8: f64 = 1.53e9;
/// One expert of one layer of the 30B model in BF16: 3 · 2048 · 768 · 2 B.
const W_EXP_30B_BF16: f64 = 9.44e6;
/// Dense weights of the 235B model in FP8, bytes (§6).
const W_DENSE_235B_FP8: f64 = 7.9e9;
/// Dense weights of the 235B model in BF16 (attention ×2, embeddings unchanged), bytes [D].
const W_DENSE_235B_BF16: f64 = 14.65e9;
/// One expert of one layer of the 235B model in FP8: 3 · 4096 · 1536 · 1 B.
const W_EXP_235B_FP8: f64 = 18.9e6;
/// Weights per GPU, GiB (perf-model §2 capacity table). For the 235B FP8 rows the table's
/// KV per GPU (≈27.5 GiB at TP4, ≈55 GiB at TP8) is the anchor, so the weights are
/// back-computed from it (95.6 · 0.9 − 3 − KV); the table's own "≈55 / ≈27.5 GiB" weights
/// are rounded and would give 2 % more KV.
const WEIGHTS_30B_BF16_GIB: f64 = 56.9;
const WEIGHTS_30B_FP8_GIB: f64 = 29.0;
const WEIGHTS_235B_FP8_TP4_GIB: f64 = 55.54;
const WEIGHTS_235B_FP8_TP8_GIB: f64 = 28.04;
/// 235B BF16 over 8 GPUs: 470 GB / 8 = 58.8 GB [D].
const WEIGHTS_235B_BF16_TP8_GIB: f64 = 54.7;
/// H200 linear prefill cost of the 30B model: 5.5 GFLOP/token at MFU 0.45 of 989 TF [A]
/// (BLIS' H100 roofline prefill MFU); to be replaced by the §7 H200 calibration run.
const A_30B_H200_S: f64 = 12.4e-6;
/// H200 attention coefficient: 393,216 FLOP per token pair at η_a = 0.6 of 989 TF [A].
const B_30B_H200_S: f64 = 0.66e-9;

/// H20-3e (the 141 GB HBM3e H20) bandwidth, bytes/s: the H200's memory system [S12b].
pub const H20_3E_HBM_BYTES_PER_S: f64 = 4.8e12;
/// H20-3e memory usable for the engine, GiB: the H200's 141 GB parts, taken as for the H200 [A].
pub const H20_3E_USABLE_GIB: f64 = 139.3;

/// What a 30B profile takes from its GPU: memory, bandwidth and the prefill constants.
struct Gpu {
    hbm_bytes_per_s: f64,
    usable_gib: f64,
    linear_s_per_token: f64,
    attention_s_per_pair: f64,
}

const H20: Gpu = Gpu {
    hbm_bytes_per_s: H20_HBM_BYTES_PER_S,
    usable_gib: H20_USABLE_GIB,
    linear_s_per_token: A_30B_H20_S,
    attention_s_per_pair: B_30B_H20_S,
};
/// H20 compute (its `a` and `b`), H200 memory: 141 GB of HBM3e at 4.8 TB/s.
const H20_3E: Gpu = Gpu {
    hbm_bytes_per_s: H20_3E_HBM_BYTES_PER_S,
    usable_gib: H20_3E_USABLE_GIB,
    ..H20
};
const H200: Gpu = Gpu {
    hbm_bytes_per_s: H200_HBM_BYTES_PER_S,
    usable_gib: H200_USABLE_GIB,
    linear_s_per_token: A_30B_H200_S,
    attention_s_per_pair: B_30B_H200_S,
};

/// Weight precision of a 30B profile.
#[derive(Clone, Copy)]
enum Weights {
    Bf16,
    Fp8,
}

/// A named hardware + model + deployment profile: every constant of the iteration model.
///
/// Serialises its numeric fields by name (a profile file's `profile` keys, `profile_file`),
/// which are also what [`Profile::set_field`] takes; the name is left to the caller.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Profile {
    /// Profile name, e.g. `"h20-qwen3-coder-30b-a3b"`.
    #[serde(skip)]
    pub name: String,
    /// Tensor-parallel degree (GPUs per instance).
    pub tp: u32,
    /// Transformer layers (`L`).
    pub layers: u32,
    /// Hidden size (`h`), used by the all-reduce term.
    pub hidden: u32,
    /// MoE layers (`L_moe`); 0 for a dense model.
    pub moe_layers: u32,
    /// Routed experts per MoE layer (`E`).
    pub experts: u32,
    /// Experts activated per token (`k`).
    pub top_k: u32,
    /// Attention, router and embedding weights of the whole model, bytes (`W_dense`).
    pub dense_weight_bytes: f64,
    /// Bytes of one expert in one layer, whole model (`W_exp`).
    pub expert_weight_bytes: f64,
    /// KV bytes per token held by one GPU (`kv_rank`).
    pub kv_bytes_per_token_rank: f64,
    /// KV bytes per token of the whole model (what the global tier stores).
    pub kv_bytes_per_token: f64,
    /// HBM bandwidth per GPU, bytes/s.
    pub hbm_bytes_per_s: f64,
    /// Weight-streaming efficiency (`η_m`).
    pub weight_read_efficiency: f64,
    /// KV-read efficiency (`η_kv`).
    pub kv_read_efficiency: f64,
    /// Fixed cost of every step, seconds (`t_fix`).
    pub step_overhead_s: f64,
    /// Linear prefill cost, seconds per batched token per instance (`a`).
    pub linear_s_per_token: f64,
    /// Attention cost, seconds per (query, key) token pair (`b`).
    pub attention_s_per_pair: f64,
    /// All-reduce launch latency, seconds (`α_ar`).
    pub allreduce_latency_s: f64,
    /// All-reduce bus bandwidth, bytes/s.
    pub allreduce_bytes_per_s: f64,
    /// Frontend cost per request, seconds.
    pub frontend_base_s: f64,
    /// Frontend cost per prompt token, seconds.
    pub frontend_s_per_token: f64,
    /// GPU KV cache of one instance, tokens (vLLM's `GPU KV cache size` log line).
    pub kv_capacity_tokens: u64,
    /// Longest context the model accepts (`max_position_embeddings`).
    pub max_context_tokens: u32,
}

/// Summary of one step's batch: the only inputs [`Profile::iteration_time`] needs.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BatchShape {
    /// Σ n_i over prefill chunks.
    pub prefill_tokens: u64,
    /// Number of decoding requests (`B_dec`).
    pub decodes: u64,
    /// Σ (n_i·c_i + n_i²/2) over prefill chunks.
    pub attention_pairs: f64,
    /// Σ L_j + Σ c_i: KV tokens read.
    pub kv_read_tokens: u64,
}

impl BatchShape {
    /// Adds a prefill chunk of `new` tokens on top of `cached` tokens already in KV.
    pub fn add_prefill(&mut self, new: u64, cached: u64) {
        self.prefill_tokens += new;
        let (n, c) = (new as f64, cached as f64);
        self.attention_pairs += n * c + n * n / 2.0;
        self.kv_read_tokens += cached;
    }

    /// Adds one decoding request with `context` tokens in KV.
    pub fn add_decode(&mut self, context: u64) {
        self.decodes += 1;
        self.kv_read_tokens += context;
    }

    /// Batched tokens `N`.
    pub fn tokens(&self) -> u64 {
        self.prefill_tokens + self.decodes
    }

    /// True when the step would do nothing.
    pub fn is_empty(&self) -> bool {
        self.tokens() == 0
    }
}

/// KV capacity of one instance in tokens (perf-model §2): what is left of `usable_gib · util`
/// after the weights and the activation reserve, divided by the per-GPU bytes of a token.
pub fn kv_capacity_tokens(
    usable_gib: f64,
    utilization: f64,
    weights_gib: f64,
    reserve_gib: f64,
    kv_bytes_per_token_rank: f64,
) -> u64 {
    let kv_gib = (usable_gib * utilization - weights_gib - reserve_gib).max(0.0);
    (kv_gib * GIB / kv_bytes_per_token_rank).floor() as u64
}

impl Profile {
    /// Names of the built-in profiles, for error messages and the CLI.
    pub const BUILTIN: [&'static str; 9] = [
        "h20-qwen3-coder-30b-a3b",
        "h20-qwen3-coder-30b-a3b-fp8",
        "h20-3e-qwen3-coder-30b-a3b",
        "h20-3e-qwen3-coder-30b-a3b-fp8",
        "h20-qwen3-235b-a22b-fp8-tp8",
        "h20-qwen3-235b-a22b-fp8-tp4",
        "h20-qwen3-235b-a22b-bf16-tp8",
        "h200-qwen3-coder-30b-a3b",
        "h200-qwen3-coder-30b-a3b-fp8",
    ];

    /// Looks a built-in profile up by name.
    pub fn by_name(name: &str) -> Result<Self> {
        match name {
            "h20-qwen3-coder-30b-a3b" => Ok(Self::h20_qwen3_coder_30b()),
            "h20-qwen3-coder-30b-a3b-fp8" => Ok(Self::h20_qwen3_coder_30b_fp8()),
            "h20-3e-qwen3-coder-30b-a3b" => Ok(Self::qwen3_30b(name, &H20_3E, Weights::Bf16)),
            "h20-3e-qwen3-coder-30b-a3b-fp8" => Ok(Self::qwen3_30b(name, &H20_3E, Weights::Fp8)),
            "h20-qwen3-235b-a22b-fp8-tp8" => Ok(Self::h20_qwen3_235b_fp8(8)),
            "h20-qwen3-235b-a22b-fp8-tp4" => Ok(Self::h20_qwen3_235b_fp8(4)),
            "h20-qwen3-235b-a22b-bf16-tp8" => Ok(Self::h20_qwen3_235b_bf16_tp8()),
            "h200-qwen3-coder-30b-a3b" => Ok(Self::h200_qwen3_coder_30b()),
            "h200-qwen3-coder-30b-a3b-fp8" => Ok(Self::qwen3_30b(name, &H200, Weights::Fp8)),
            other => Err(SimError::InvalidConfig {
                field: "profile",
                reason: format!("unknown profile {other:?} (known: {})", Self::BUILTIN.join(", ")),
            }),
        }
    }

    /// The 30B-A3B architecture on `gpu` with `weights`: every 30B profile. FP8 changes the
    /// weight bytes only — the streamed dense and expert bytes, and the memory the weights
    /// take, hence the KV capacity; `a` and `b` stay the GPU's (the §3A FP8 column gains
    /// mostly in decode).
    fn qwen3_30b(name: &str, gpu: &Gpu, weights: Weights) -> Self {
        let (dense_weight_bytes, expert_weight_bytes, weights_gib) = match weights {
            Weights::Bf16 => (W_DENSE_30B_BF16, W_EXP_30B_BF16, WEIGHTS_30B_BF16_GIB),
            Weights::Fp8 => (W_DENSE_30B_FP8, W_EXP_30B_BF16 / 2.0, WEIGHTS_30B_FP8_GIB),
        };
        Self {
            name: name.to_owned(),
            tp: 1,
            layers: 48,
            hidden: 2048,
            moe_layers: 48,
            experts: 128,
            top_k: 8,
            dense_weight_bytes,
            expert_weight_bytes,
            kv_bytes_per_token_rank: KV_30B_BYTES,
            kv_bytes_per_token: KV_30B_BYTES,
            hbm_bytes_per_s: gpu.hbm_bytes_per_s,
            weight_read_efficiency: WEIGHT_READ_EFFICIENCY,
            kv_read_efficiency: KV_READ_EFFICIENCY,
            step_overhead_s: T_FIX_30B_S,
            linear_s_per_token: gpu.linear_s_per_token,
            attention_s_per_pair: gpu.attention_s_per_pair,
            allreduce_latency_s: ALLREDUCE_LATENCY_S,
            allreduce_bytes_per_s: NVLINK_ALLREDUCE_BYTES_PER_S,
            frontend_base_s: FRONTEND_BASE_S,
            frontend_s_per_token: FRONTEND_S_PER_TOKEN,
            kv_capacity_tokens: kv_capacity_tokens(
                gpu.usable_gib,
                GPU_MEMORY_UTILIZATION,
                weights_gib,
                ACTIVATION_RESERVE_GIB,
                KV_30B_BYTES,
            ),
            max_context_tokens: QWEN3_MAX_CONTEXT_TOKENS,
        }
    }

    /// H20 + Qwen3-Coder-30B-A3B, BF16, TP1, `gpu_memory_utilization` 0.9 (≈286K KV tokens).
    pub fn h20_qwen3_coder_30b() -> Self {
        Self::qwen3_30b("h20-qwen3-coder-30b-a3b", &H20, Weights::Bf16)
    }

    /// H20 + Qwen3-Coder-30B-A3B with FP8 weights, TP1 (≈590K KV tokens). The prefill
    /// constant stays at the BF16 value: the §3A FP8 column gains mostly in decode.
    pub fn h20_qwen3_coder_30b_fp8() -> Self {
        Self::qwen3_30b("h20-qwen3-coder-30b-a3b-fp8", &H20, Weights::Fp8)
    }

    /// H200 + Qwen3-Coder-30B-A3B, BF16, TP1. `t_fix` and η carry over from H20 (perf-model
    /// §7 "transfer"); `a` and `b` are roofline priors until the H200 calibration run.
    pub fn h200_qwen3_coder_30b() -> Self {
        Self::qwen3_30b("h200-qwen3-coder-30b-a3b", &H200, Weights::Bf16)
    }

    /// H20 + Qwen3-235B-A22B-FP8 at TP4 or TP8 (≈613K / ≈1.23M KV tokens per instance).
    /// `a` and `b` scale as 1/TP from the TP4 values (compute splits across ranks).
    pub fn h20_qwen3_235b_fp8(tp: u32) -> Self {
        let tp = tp.max(1);
        let weights_gib = if tp >= 8 {
            WEIGHTS_235B_FP8_TP8_GIB
        } else {
            WEIGHTS_235B_FP8_TP4_GIB * 4.0 / f64::from(tp)
        };
        let scale = 4.0 / f64::from(tp);
        Self {
            name: format!("h20-qwen3-235b-a22b-fp8-tp{tp}"),
            tp,
            layers: 94,
            hidden: 4096,
            moe_layers: 94,
            experts: 128,
            top_k: 8,
            dense_weight_bytes: W_DENSE_235B_FP8,
            expert_weight_bytes: W_EXP_235B_FP8,
            kv_bytes_per_token_rank: KV_235B_RANK_BYTES,
            kv_bytes_per_token: KV_235B_BYTES,
            step_overhead_s: T_FIX_235B_S,
            linear_s_per_token: A_235B_TP4_S * scale,
            attention_s_per_pair: B_235B_TP4_S * scale,
            kv_capacity_tokens: kv_capacity_tokens(
                H20_USABLE_GIB,
                GPU_MEMORY_UTILIZATION,
                weights_gib,
                ACTIVATION_RESERVE_GIB,
                KV_235B_RANK_BYTES,
            ),
            ..Self::h20_qwen3_coder_30b()
        }
    }

    /// H20 + Qwen3-235B-A22B in BF16 at TP8 (the §3A "235B BF16 TP8" column).
    pub fn h20_qwen3_235b_bf16_tp8() -> Self {
        Self {
            name: "h20-qwen3-235b-a22b-bf16-tp8".to_owned(),
            dense_weight_bytes: W_DENSE_235B_BF16,
            expert_weight_bytes: W_EXP_235B_FP8 * 2.0,
            kv_capacity_tokens: kv_capacity_tokens(
                H20_USABLE_GIB,
                GPU_MEMORY_UTILIZATION,
                WEIGHTS_235B_BF16_TP8_GIB,
                ACTIVATION_RESERVE_GIB,
                KV_235B_RANK_BYTES,
            ),
            ..Self::h20_qwen3_235b_fp8(8)
        }
    }

    /// Checks that every constant is finite and in range, so the model cannot produce NaN.
    pub fn validate(&self) -> Result<()> {
        let positive = [
            ("profile.hbm_bytes_per_s", self.hbm_bytes_per_s),
            ("profile.kv_bytes_per_token_rank", self.kv_bytes_per_token_rank),
            ("profile.kv_bytes_per_token", self.kv_bytes_per_token),
            ("profile.allreduce_bytes_per_s", self.allreduce_bytes_per_s),
        ];
        for (field, value) in positive {
            if !(value.is_finite() && value > 0.0) {
                return Err(SimError::InvalidConfig {
                    field,
                    reason: format!("must be a finite number > 0, got {value}"),
                });
            }
        }
        let non_negative = [
            ("profile.step_overhead_s", self.step_overhead_s),
            ("profile.linear_s_per_token", self.linear_s_per_token),
            ("profile.attention_s_per_pair", self.attention_s_per_pair),
            ("profile.allreduce_latency_s", self.allreduce_latency_s),
            ("profile.frontend_base_s", self.frontend_base_s),
            ("profile.frontend_s_per_token", self.frontend_s_per_token),
            ("profile.dense_weight_bytes", self.dense_weight_bytes),
            ("profile.expert_weight_bytes", self.expert_weight_bytes),
        ];
        for (field, value) in non_negative {
            if !(value.is_finite() && value >= 0.0) {
                return Err(SimError::InvalidConfig {
                    field,
                    reason: format!("must be a finite number >= 0, got {value}"),
                });
            }
        }
        // Fractions of the HBM bandwidth: above 1 the model would read faster than the memory.
        let fractions = [
            ("profile.weight_read_efficiency", self.weight_read_efficiency),
            ("profile.kv_read_efficiency", self.kv_read_efficiency),
        ];
        for (field, value) in fractions {
            if !(value.is_finite() && value > 0.0 && value <= 1.0) {
                return Err(SimError::InvalidConfig {
                    field,
                    reason: format!("must be in (0, 1], got {value}"),
                });
            }
        }
        let at_least_one = [
            ("profile.tp", u64::from(self.tp)),
            ("profile.layers", u64::from(self.layers)),
            ("profile.hidden", u64::from(self.hidden)),
            ("profile.kv_capacity_tokens", self.kv_capacity_tokens),
            ("profile.max_context_tokens", u64::from(self.max_context_tokens)),
        ];
        for (field, value) in at_least_one {
            if value == 0 {
                return Err(SimError::InvalidConfig {
                    field,
                    reason: "must be >= 1".into(),
                });
            }
        }
        if self.moe_layers > self.layers {
            return Err(SimError::InvalidConfig {
                field: "profile.moe_layers",
                reason: format!("moe_layers {} exceeds layers {}", self.moe_layers, self.layers),
            });
        }
        if self.top_k > self.experts {
            return Err(SimError::InvalidConfig {
                field: "profile.top_k",
                reason: format!("top_k {} exceeds experts {}", self.top_k, self.experts),
            });
        }
        Ok(())
    }

    /// Distinct experts a step of `tokens` batched tokens touches per MoE layer (`nEff`).
    pub fn effective_experts(&self, tokens: u64) -> f64 {
        if self.experts == 0 || tokens == 0 {
            return 0.0;
        }
        let e = f64::from(self.experts);
        let miss = 1.0 - f64::from(self.top_k) / e;
        // powi would overflow its i32 exponent for huge batches; powf saturates to 0 instead.
        e * (1.0 - miss.powf(tokens as f64))
    }

    /// Duration of one engine step running `batch`, seconds. Zero for an empty batch.
    pub fn iteration_time(&self, batch: &BatchShape) -> f64 {
        let tokens = batch.tokens();
        if tokens == 0 {
            return 0.0;
        }
        let n = tokens as f64;
        let tp = f64::from(self.tp);
        let linear = self.linear_s_per_token * n;
        let weight_bytes = self.dense_weight_bytes
            + f64::from(self.moe_layers) * self.effective_experts(tokens) * self.expert_weight_bytes;
        let weight_read = weight_bytes / (tp * self.hbm_bytes_per_s * self.weight_read_efficiency);
        let attention = 2.0 * self.attention_s_per_pair * batch.attention_pairs;
        let kv_read = batch.kv_read_tokens as f64 * self.kv_bytes_per_token_rank
            / (self.hbm_bytes_per_s * self.kv_read_efficiency);
        let allreduce = if self.tp > 1 {
            // Two all-reduces per layer (after attention and after the MoE block), ring cost.
            let bytes = n * f64::from(self.hidden) * 2.0;
            2.0 * f64::from(self.layers)
                * (self.allreduce_latency_s + 2.0 * (tp - 1.0) / tp * bytes / self.allreduce_bytes_per_s)
        } else {
            0.0
        };
        self.step_overhead_s + linear.max(weight_read) + attention + kv_read + allreduce
    }

    /// Frontend time of a request with `prompt_tokens` tokens (tokenisation, API server), seconds.
    pub fn frontend_time(&self, prompt_tokens: u64) -> f64 {
        self.frontend_base_s + self.frontend_s_per_token * prompt_tokens as f64
    }

    /// Time of one isolated, unchunked prefill of `new` tokens on top of `cached` ones, seconds.
    pub fn isolated_prefill_time(&self, new: u64, cached: u64) -> f64 {
        let mut batch = BatchShape::default();
        batch.add_prefill(new, cached);
        self.iteration_time(&batch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_profiles_resolve_and_validate() {
        for name in Profile::BUILTIN {
            let p = Profile::by_name(name).unwrap();
            assert_eq!(p.name, name);
            p.validate().unwrap();
        }
        assert!(Profile::by_name("a100-llama").is_err());
    }

    #[test]
    fn thirty_b_profiles_differ_only_in_their_gpu_and_weights() {
        let p = |name: &str| Profile::by_name(name).unwrap();
        let h20 = p("h20-qwen3-coder-30b-a3b");
        // H20-3e: H20 compute, the H200's memory; BF16 holds the H200's KV capacity.
        let h20_3e = p("h20-3e-qwen3-coder-30b-a3b");
        assert_eq!(
            h20_3e,
            Profile {
                name: h20_3e.name.clone(),
                hbm_bytes_per_s: 4.8e12,
                kv_capacity_tokens: 715_106,
                ..h20.clone()
            }
        );
        assert_eq!(
            h20_3e.kv_capacity_tokens,
            p("h200-qwen3-coder-30b-a3b").kv_capacity_tokens
        );
        // FP8 changes the weight bytes and, through the memory they free, the KV capacity only.
        for (bf16, fp8, kv) in [
            ("h20-qwen3-coder-30b-a3b", "h20-qwen3-coder-30b-a3b-fp8", 590_260),
            (
                "h20-3e-qwen3-coder-30b-a3b",
                "h20-3e-qwen3-coder-30b-a3b-fp8",
                1_019_849,
            ),
            ("h200-qwen3-coder-30b-a3b", "h200-qwen3-coder-30b-a3b-fp8", 1_019_849),
        ] {
            let (bf16, fp8) = (p(bf16), p(fp8));
            assert_eq!(
                fp8,
                Profile {
                    name: fp8.name.clone(),
                    dense_weight_bytes: W_DENSE_30B_FP8,
                    expert_weight_bytes: W_EXP_30B_BF16 / 2.0,
                    kv_capacity_tokens: kv,
                    ..bf16
                }
            );
        }
    }

    #[test]
    fn empty_batch_costs_nothing_and_experts_saturate() {
        let p = Profile::h20_qwen3_coder_30b();
        assert!(p.iteration_time(&BatchShape::default()).abs() < f64::EPSILON);
        assert!((p.effective_experts(1) - 8.0).abs() < 1e-9);
        assert!((p.effective_experts(1_000_000) - 128.0).abs() < 1e-9);
    }

    #[test]
    fn mixed_step_is_slower_than_its_parts_alone() {
        let p = Profile::h20_qwen3_coder_30b();
        let mut decode = BatchShape::default();
        decode.add_decode(4096);
        let mut mixed = decode;
        mixed.add_prefill(2048, 0);
        assert!(p.iteration_time(&mixed) > p.iteration_time(&decode) + 0.09);
    }

    #[test]
    fn invalid_profile_is_rejected() {
        let p = Profile {
            hbm_bytes_per_s: f64::NAN,
            ..Profile::h20_qwen3_coder_30b()
        };
        assert!(p.validate().is_err());
        let p = Profile {
            tp: 0,
            ..Profile::h20_qwen3_coder_30b()
        };
        assert!(p.validate().is_err());
    }
}
