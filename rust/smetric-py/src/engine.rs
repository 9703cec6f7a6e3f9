//! `PerfModel` and `encode_kv_batch`: what `smetric fake-engine` needs from the simulator's
//! performance model and from `smetric-vllm`'s KV-event encoder, and nothing more.
//!
//! * `PerfModel` wraps a built-in `smetric_sim::Profile`. `step_time` builds one
//!   `BatchShape` from a step's prefill chunks and decode contexts, so the engine's scheduler
//!   loop costs one call per step, O(requests in the step). `pd_pull_time` is
//!   `smetric_sim::uncontended_pull_s` with the simulator's default PD and node settings for
//!   the profile, so a fake decode engine waits what the simulator would for the same pull.
//! * `encode_kv_batch` turns a list of plain tuples into a `KvEventBatch` and encodes it as
//!   vLLM's `ZmqEventPublisher` does (the map form, `smetric_vllm::encode_batch`). Hashes are
//!   the 64-bit ints vLLM publishes by default.

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyModule, PyTuple};
use smetric_sim::{BatchShape, PdSimConfig, Profile, SimConfig, uncontended_pull_s};
use smetric_vllm::{BlockRemoved, BlockStored, ExternalBlockHash, KvEvent, KvEventBatch, Medium};

use crate::errors::python_error;

/// The analytic step time of one vLLM instance (``docs/perf-model.md``), for a built-in profile.
#[pyclass(frozen, module = "smetric._core", name = "PerfModel")]
pub(crate) struct PyPerfModel {
    profile: Profile,
}

#[pymethods]
impl PyPerfModel {
    #[new]
    #[pyo3(signature = (profile = "h20-qwen3-coder-30b-a3b"))]
    fn new(py: Python<'_>, profile: &str) -> PyResult<Self> {
        let profile = Profile::by_name(profile).map_err(|e| {
            let message = e.to_string();
            python_error(py, "InvalidConfigError", &message, |k| {
                k.set_item("field", "profile")?;
                k.set_item("reason", &message)
            })
        })?;
        Ok(Self { profile })
    }

    /// The profile's name.
    #[getter]
    fn profile(&self) -> &str {
        &self.profile.name
    }

    /// The instance's GPU KV cache, tokens.
    #[getter]
    fn kv_capacity_tokens(&self) -> u64 {
        self.profile.kv_capacity_tokens
    }

    /// KV bytes of one token across the instance's GPUs.
    #[getter]
    fn kv_bytes_per_token(&self) -> f64 {
        self.profile.kv_bytes_per_token
    }

    /// Seconds of one engine step.
    ///
    /// Args:
    ///     prefills: ``(new, cached)`` token counts of each prefill chunk in the step.
    ///     decode_contexts: the KV context length of each decoding request in the step.
    ///
    /// Returns:
    ///     float: seconds on the profile's hardware; 0.0 for an empty step.
    fn step_time(&self, prefills: Vec<(u64, u64)>, decode_contexts: Vec<u64>) -> f64 {
        let mut batch = BatchShape::default();
        for (new, cached) in prefills {
            batch.add_prefill(new, cached);
        }
        for context in decode_contexts {
            batch.add_decode(context);
        }
        self.profile.iteration_time(&batch)
    }

    /// Seconds the API server spends on a request of ``prompt_tokens`` before the engine sees it.
    fn frontend_time(&self, prompt_tokens: u64) -> f64 {
        self.profile.frontend_time(prompt_tokens)
    }

    /// Seconds a decode instance waits to pull ``tokens`` KV tokens from a prefill instance when
    /// nothing else crosses its node's link, under the simulator's default PD settings (per-rank
    /// cap, fixed latency) and node NIC.
    fn pd_pull_time(&self, tokens: u64) -> f64 {
        let config = SimConfig {
            profile: self.profile.clone(),
            ..SimConfig::default()
        };
        uncontended_pull_s(&config, &PdSimConfig::default(), tokens)
    }

    fn __repr__(&self) -> String {
        format!("PerfModel(profile={:?})", self.profile.name)
    }
}

fn hashes(values: Vec<u64>) -> Vec<ExternalBlockHash> {
    values.into_iter().map(ExternalBlockHash::Int).collect()
}

/// `("BlockStored", hashes, parent, token_ids, block_size, lora_name, medium)`.
type StoredTuple = (
    String,
    Vec<u64>,
    Option<u64>,
    Vec<u32>,
    u32,
    Option<String>,
    Option<String>,
);

fn event(item: &Bound<'_, PyAny>) -> PyResult<KvEvent> {
    let tuple = item
        .cast::<PyTuple>()
        .map_err(|_| PyTypeError::new_err("each event must be a tuple"))?;
    let kind: String = tuple.get_item(0)?.extract()?;
    match (kind.as_str(), tuple.len()) {
        ("BlockStored", 7) => {
            let (_, block_hashes, parent, token_ids, block_size, lora_name, medium): StoredTuple = tuple.extract()?;
            Ok(KvEvent::BlockStored(Box::new(BlockStored {
                block_hashes: hashes(block_hashes),
                parent_block_hash: parent.map(ExternalBlockHash::Int),
                token_ids,
                block_size,
                lora_id: None,
                medium: medium.as_deref().map(Medium::parse),
                lora_name,
                extra_keys: None,
                group_idx: None,
                kv_cache_spec_kind: None,
                kv_cache_spec_sliding_window: None,
                locality: None,
                ownership: None,
                session_id: None,
                lookahead_token_ids: None,
            })))
        }
        ("BlockRemoved", 3) => {
            let (_, block_hashes, medium): (String, Vec<u64>, Option<String>) = tuple.extract()?;
            Ok(KvEvent::BlockRemoved(BlockRemoved {
                block_hashes: hashes(block_hashes),
                medium: medium.as_deref().map(Medium::parse),
                group_idx: None,
                locality: None,
                ownership: None,
            }))
        }
        ("AllBlocksCleared", 1) => Ok(KvEvent::AllBlocksCleared),
        _ => Err(PyTypeError::new_err(format!(
            "unknown event {kind:?} with {} fields (BlockStored: 7, BlockRemoved: 3, AllBlocksCleared: 1)",
            tuple.len()
        ))),
    }
}

/// The msgpack payload vLLM's ``ZmqEventPublisher`` sends for a ``KVEventBatch`` (map form).
///
/// Args:
///     ts: the batch timestamp (seconds since the epoch).
///     events: tuples ``("BlockStored", hashes, parent, token_ids, block_size, lora_name,
///         medium)``, ``("BlockRemoved", hashes, medium)`` or ``("AllBlocksCleared",)``;
///         hashes are the 64-bit ints of ``vllm_event_hash``.
///     dp_rank: the engine's data-parallel rank.
///
/// Returns:
///     bytes: the third frame of a PUB message.
///
/// Raises:
///     TypeError: an event is not one of the three shapes.
#[pyfunction]
#[allow(clippy::doc_markdown)] // a Python docstring (it becomes `__doc__`), not rustdoc
#[pyo3(signature = (ts, events, dp_rank = Some(0)), text_signature = "(ts, events, dp_rank=0)")]
fn encode_kv_batch<'py>(
    py: Python<'py>,
    ts: f64,
    events: Vec<Bound<'py, PyAny>>,
    dp_rank: Option<i64>,
) -> PyResult<Bound<'py, PyBytes>> {
    let batch = KvEventBatch {
        ts,
        events: events.iter().map(event).collect::<PyResult<_>>()?,
        dp_rank,
        unknown_events: 0,
    };
    let mut out = Vec::new();
    smetric_vllm::encode_batch(&batch, &mut out);
    Ok(PyBytes::new(py, &out))
}

/// Adds the fake engine's bindings to `smetric._core`.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyPerfModel>()?;
    m.add_function(wrap_pyfunction!(encode_kv_batch, m)?)?;
    Ok(())
}
