//! `PdRouter` and `PdDecision`: thin wrappers over `smetric_core::pd::PdRouter`, the router of
//! a disaggregated prefill/decode fleet (one decision names a prefill and a decode instance).
//!
//! Arguments are converted with the GIL held, the decision runs with it released
//! (`py.detach`), exactly as `Router.route` (the prompt and turn conversions are shared).

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use smetric_core::DEFAULT_BLOCK_SIZE;
use smetric_core::pd::{DecodeRule, PdConfig, PdRouter};

use crate::config::PyRouterConfig;
use crate::convert;
use crate::errors::IntoPyResult;
use crate::router::{RouteArgs, load_dict, reported_request_id, router_arguments};

/// The outcome of :meth:`PdRouter.route`.
#[pyclass(frozen, module = "smetric._core", name = "PdDecision")]
pub(crate) struct PyPdDecision {
    /// Name of the prefill instance.
    #[pyo3(get)]
    prefill_instance: Py<PyAny>,
    /// Name of the decode instance.
    #[pyo3(get)]
    decode_instance: Py<PyAny>,
    /// Whether the request was treated as the first turn of its session.
    #[pyo3(get)]
    first_turn: bool,
    /// Where ``first_turn`` came from: ``"hint"``, ``"messages"`` or ``"index"``.
    #[pyo3(get)]
    turn_source: &'static str,
    /// Prompt tokens already cached on the prefill instance's GPU.
    #[pyo3(get)]
    local_hit_tokens: u64,
    /// Prompt tokens available from the global KV$ tier.
    #[pyo3(get)]
    global_hit_tokens: u64,
    /// Tokens the prefill instance is expected to compute.
    #[pyo3(get)]
    prefill_tokens: u64,
    /// Prompt tokens the decode instance's prefix cache holds (not transferred).
    #[pyo3(get)]
    decode_hit_tokens: u64,
    /// Prompt tokens to transfer from the prefill to the decode instance.
    #[pyo3(get)]
    transfer_tokens: u64,
    /// Prompt length in tokens.
    #[pyo3(get)]
    num_tokens: u64,
    /// Why the prefill policy chose the prefill instance.
    #[pyo3(get)]
    reason: &'static str,
    /// The decode rule that chose the decode instance.
    #[pyo3(get)]
    decode_rule: &'static str,
    /// The request's id: the caller's (int or str) or one the router issued (int).
    #[pyo3(get)]
    request_id: Py<PyAny>,
    /// The prefill policy.
    #[pyo3(get)]
    policy: &'static str,
}

#[pymethods]
impl PyPdDecision {
    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!(
            "PdDecision(prefill_instance={}, decode_instance={}, first_turn={}, local_hit_tokens={}, \
             prefill_tokens={}, decode_hit_tokens={}, transfer_tokens={}, reason={:?}, decode_rule={:?}, \
             request_id={})",
            self.prefill_instance.bind(py).repr()?,
            self.decode_instance.bind(py).repr()?,
            if self.first_turn { "True" } else { "False" },
            self.local_hit_tokens,
            self.prefill_tokens,
            self.decode_hit_tokens,
            self.transfer_tokens,
            self.reason,
            self.decode_rule,
            self.request_id.bind(py).repr()?,
        ))
    }
}

/// The router of a disaggregated prefill/decode fleet.
#[pyclass(frozen, module = "smetric._core", name = "PdRouter")]
pub(crate) struct PyPdRouter {
    /// Shared with the compiled gateway when it serves PD natively.
    inner: Arc<PdRouter>,
    config: Py<PyRouterConfig>,
}

impl PyPdRouter {
    /// The core router (the gateway routes on it too).
    pub(crate) fn core(&self) -> &Arc<PdRouter> {
        &self.inner
    }
}

#[pymethods]
impl PyPdRouter {
    #[new]
    #[pyo3(signature = (
        prefill,
        decode,
        *,
        policy = "smetric",
        block_size = i64::from(DEFAULT_BLOCK_SIZE),
        seed = 0,
        config = None,
        decode_rule = None,
        decode_capacity_blocks = PdConfig::DEFAULT.decode_capacity_blocks,
        decode_max_batch = PdConfig::DEFAULT.decode_max_batch,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        prefill: Vec<String>,
        decode: Vec<String>,
        policy: &str,
        block_size: i64,
        seed: u64,
        config: Option<Py<PyRouterConfig>>,
        decode_rule: Option<&str>,
        decode_capacity_blocks: u64,
        decode_max_batch: u64,
    ) -> PyResult<Self> {
        let (kind, block_size, config) = router_arguments(py, policy, block_size, config)?;
        let pd = PdConfig {
            decode_rule: decode_rule.map(DecodeRule::parse).transpose().py()?,
            decode_capacity_blocks,
            decode_max_batch,
            ..PdConfig::DEFAULT
        };
        let inner = Arc::new(
            PdRouter::new(
                &prefill,
                &decode,
                kind,
                block_size,
                seed,
                config.get().inner.clone(),
                pd,
            )
            .py()?,
        );
        Ok(Self { inner, config })
    }

    /// Chooses the prefill and the decode instance of one request.
    #[pyo3(signature = (tokens = None, *, hashes = None, num_tokens = None, messages = None, turn = None, request_id = None, namespace = None, now = None, exclude = None, previous_instance = None, session_key = None))]
    #[allow(clippy::too_many_arguments)]
    fn route(
        &self,
        py: Python<'_>,
        tokens: Option<&Bound<'_, PyAny>>,
        hashes: Option<&Bound<'_, PyAny>>,
        num_tokens: Option<u64>,
        messages: Option<&Bound<'_, PyAny>>,
        turn: Option<i64>,
        request_id: Option<&Bound<'_, PyAny>>,
        namespace: Option<String>,
        now: Option<f64>,
        exclude: Option<Vec<String>>,
        previous_instance: Option<String>,
        session_key: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyPdDecision> {
        let args = RouteArgs::new(
            self.inner.prefill().block_size(),
            tokens,
            hashes,
            num_tokens,
            messages,
            turn,
            request_id,
            namespace,
            now,
            exclude,
            previous_instance,
            session_key,
        )?;
        let inner = &self.inner;
        let d = args.run(py, |req| inner.route(req))?;
        let request_id = reported_request_id(py, request_id, d.prefill.request_id)?;
        let p = &d.prefill;
        Ok(PyPdDecision {
            prefill_instance: p.instance_name.as_ref().into_pyobject(py)?.into_any().unbind(),
            decode_instance: d.decode_instance_name.as_ref().into_pyobject(py)?.into_any().unbind(),
            first_turn: p.first_turn,
            turn_source: p.turn_source.name(),
            local_hit_tokens: p.local_hit_tokens,
            global_hit_tokens: p.global_hit_tokens,
            prefill_tokens: p.prefill_tokens,
            decode_hit_tokens: d.decode_hit_tokens,
            transfer_tokens: d.transfer_tokens,
            num_tokens: p.num_tokens,
            reason: p.reason.name(),
            decode_rule: d.decode_rule.name(),
            request_id,
            policy: inner.prefill().policy().name(),
        })
    }

    /// The prefill instance computed the prompt; the KV transfer starts.
    #[pyo3(signature = (request_id, now = None))]
    fn on_prefilled(&self, request_id: &Bound<'_, PyAny>, now: Option<f64>) -> PyResult<bool> {
        self.inner.on_prefilled_at(convert::request_id(request_id)?, now).py()
    }

    /// The decode instance has read the KV; the prefill instance frees its blocks.
    fn on_transferred(&self, request_id: &Bound<'_, PyAny>) -> PyResult<bool> {
        Ok(self.inner.on_transferred(convert::request_id(request_id)?))
    }

    /// The request finished on its decode instance, having generated ``output_tokens`` tokens.
    #[pyo3(signature = (request_id, output_tokens = 0))]
    fn on_finished(&self, request_id: &Bound<'_, PyAny>, output_tokens: u64) -> PyResult<bool> {
        Ok(self.inner.on_finished(convert::request_id(request_id)?, output_tokens))
    }

    /// The request was aborted, in either phase.
    fn on_aborted(&self, request_id: &Bound<'_, PyAny>) -> PyResult<bool> {
        Ok(self.inner.on_aborted(convert::request_id(request_id)?))
    }

    /// Stores a prefill engine's load snapshot (as :meth:`Router.update_load`).
    #[pyo3(signature = (instance, *, running = None, waiting = None, kv_usage = None, now = None))]
    fn update_load(
        &self,
        instance: &str,
        running: Option<u64>,
        waiting: Option<u64>,
        kv_usage: Option<f64>,
        now: Option<f64>,
    ) -> PyResult<()> {
        self.inner
            .prefill()
            .update_load(instance, running, waiting, kv_usage, now)
            .py()
    }

    /// Stores a decode engine's KV cache usage (in [0, 1]).
    #[pyo3(signature = (instance, kv_usage, *, now = None))]
    fn update_decode_load(&self, instance: &str, kv_usage: f64, now: Option<f64>) -> PyResult<()> {
        self.inner.update_decode_load(instance, kv_usage, now).py()
    }

    /// A prefill instance's load counters (``InstanceLoad``).
    fn load<'py>(&self, py: Python<'py>, instance: &str) -> PyResult<Bound<'py, PyDict>> {
        load_dict(py, &self.inner.prefill().load(instance).py()?)
    }

    /// A decode instance's counters (``DecodeLoad``).
    fn decode_load<'py>(&self, py: Python<'py>, instance: &str) -> PyResult<Bound<'py, PyDict>> {
        decode_dict(py, &self.inner.decode_load(instance).py()?)
    }

    /// PD counters (``PdRouterStats``); the prefill side's own are those of a ``Router``.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        // Without the GIL, as `Router.stats`: the index lock can wait behind a commit.
        let inner = &self.inner;
        let s = py.detach(|| inner.stats());
        let d = PyDict::new(py);
        d.set_item("routed", s.routed)?;
        d.set_item("transfer_tokens", s.transfer_tokens)?;
        d.set_item("unknown_request_events", s.unknown_request_events)?;
        d.set_item("in_flight", s.in_flight)?;
        d.set_item("output_tokens", s.output_tokens)?;
        let decode = PyDict::new(py);
        for (name, load) in &s.decode {
            decode.set_item(name.as_ref(), decode_dict(py, load)?)?;
        }
        d.set_item("decode", decode)?;
        Ok(d)
    }

    /// Prefill instance names, in slot order.
    #[getter]
    fn prefill_instances<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        PyList::new(py, self.inner.prefill().instances().iter().map(AsRef::<str>::as_ref))
    }

    /// Decode instance names, in slot order.
    #[getter]
    fn decode_instances<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        PyList::new(py, self.inner.decode_instances().iter().map(AsRef::<str>::as_ref))
    }

    /// The prefill policy's name.
    #[getter]
    fn policy(&self) -> &'static str {
        self.inner.prefill().policy().name()
    }

    /// The decode rule's name.
    #[getter]
    fn decode_rule(&self) -> &'static str {
        self.inner.decode_rule().name()
    }

    /// Tokens per block.
    #[getter]
    fn block_size(&self) -> u32 {
        self.inner.prefill().block_size()
    }

    /// The prefill side's router configuration.
    #[getter]
    fn config(&self, py: Python<'_>) -> Py<PyRouterConfig> {
        self.config.clone_ref(py)
    }

    fn __repr__(&self) -> String {
        format!(
            "PdRouter(policy={:?}, decode_rule={:?}, prefill={}, decode={})",
            self.inner.prefill().policy().name(),
            self.inner.decode_rule().name(),
            self.inner.prefill().instances().len(),
            self.inner.decode_instances().len(),
        )
    }
}

fn decode_dict<'py>(py: Python<'py>, l: &smetric_core::pd::DecodeLoad) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("batch_size", l.bs)?;
    d.set_item("reserved_blocks", l.reserved_blocks)?;
    d.set_item("pulling", l.pulling)?;
    d.set_item("pull_tokens", l.pull_tokens)?;
    d.set_item("kv_usage", l.kv_usage)?;
    Ok(d)
}

/// Adds the PD router to `smetric._core`.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyPdRouter>()?;
    m.add_class::<PyPdDecision>()?;
    m.add(
        "DECODE_RULES",
        pyo3::types::PyTuple::new(m.py(), DecodeRule::ALL.map(DecodeRule::name))?,
    )?;
    Ok(())
}
