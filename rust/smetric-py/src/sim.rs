//! `Workload`, `load_workload`, `simulate`: thin bindings of the `smetric-sim` cluster
//! simulator. `smetric.sim` is the typed facade.
//!
//! * Loading a trace and running a simulation release the GIL (`py.detach`): both are pure
//!   Rust over owned data, so a thread pool of simulations runs in parallel.
//! * A [`PyWorkload`] is frozen and holds an `Arc<Workload>`: loaded once, shared by any
//!   number of runs without copying the (up to ~141 MB) block-id arrays.
//! * Configuration crosses as a plain dict whose keys are `SimConfig`'s field names, with
//!   `global_tier` and `slo` as nested dicts and `profile` as a built-in profile name; every
//!   key left out keeps `SimConfig::default()`, which `sim_config_defaults()` exposes so that
//!   Python never restates a default.
//! * The report comes back as plain dicts and lists (the `SimReport` field names).
//! * `SimError` maps to the classes of `smetric/errors.py`: `TraceFormatError` (path, line,
//!   reason), `InvalidConfigError` (field, reason), `EmptyWorkloadError`,
//!   `SimulationStalledError` (time_s, in_flight), `SimulationError`; an unreadable file is
//!   the built-in `OSError` subclass for its errno (e.g. `FileNotFoundError`).

use std::path::PathBuf;
use std::sync::Arc;

use pyo3::exceptions::{PyOSError, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyModule};
use smetric_core::PolicyKind;
use smetric_sim::workload::ArrivalKind;
use smetric_sim::{
    BailianOptions, IndexFeed, LoadSeries, Percentiles, Profile, RequestRecord, SimConfig, SimError, SimReport,
    SloConfig, SloReport, WekaOptions, Workload, evaluate_slo, load_azure, load_bailian, load_mooncake, load_weka, run,
};

use crate::config::PyRouterConfig;
use crate::errors::{IntoPyResult, python_error};

/// The Python exception for a simulator error.
fn sim_error(py: Python<'_>, err: &SimError) -> PyErr {
    let message = err.to_string();
    match err {
        SimError::Io { path, source } => {
            // OSError(errno, strerror, filename) instantiates the errno's subclass.
            let errno = source.raw_os_error().unwrap_or(0);
            PyOSError::new_err((errno, source.to_string(), path.display().to_string()))
        }
        SimError::Parse { path, line, reason } => python_error(py, "TraceFormatError", &message, |k| {
            k.set_item("path", path.display().to_string())?;
            k.set_item("line", line)?;
            k.set_item("reason", reason)
        }),
        SimError::InvalidConfig { field, reason } => python_error(py, "InvalidConfigError", &message, |k| {
            k.set_item("field", field)?;
            k.set_item("reason", reason)
        }),
        SimError::EmptyWorkload => python_error(py, "EmptyWorkloadError", &message, |_| Ok(())),
        SimError::Stalled { time_s, in_flight } => python_error(py, "SimulationStalledError", &message, |k| {
            k.set_item("time_s", time_s)?;
            k.set_item("in_flight", in_flight)
        }),
        SimError::EventBudget { .. } => python_error(py, "SimulationError", &message, |k| {
            k.set_item("reason", "event budget")
        }),
        SimError::Router(reason) => python_error(py, "SimulationError", &message, |k| k.set_item("reason", reason)),
    }
}

fn invalid_config(py: Python<'_>, field: &'static str, reason: String) -> PyErr {
    sim_error(py, &SimError::InvalidConfig { field, reason })
}

/// A loaded trace: immutable, shared by every run (``Workload`` in ``smetric.sim``).
#[pyclass(frozen, module = "smetric._core", name = "Workload")]
pub(crate) struct PyWorkload {
    inner: Arc<Workload>,
}

fn arrival_name(kind: ArrivalKind) -> &'static str {
    match kind {
        ArrivalKind::OpenLoop => "open_loop",
        ArrivalKind::GatedOpenLoop => "gated_open_loop",
        ArrivalKind::ClosedLoop => "closed_loop",
    }
}

#[pymethods]
impl PyWorkload {
    /// Short description, e.g. ``"weka(1 file)"``.
    #[getter]
    fn name(&self) -> &str {
        self.inner.name()
    }

    /// Tokens per block of the hash chains (after any coarsening).
    #[getter]
    fn block_tokens(&self) -> u32 {
        self.inner.block_tokens()
    }

    /// ``"closed_loop"`` (sessions), ``"open_loop"`` or ``"gated_open_loop"``.
    #[getter]
    fn arrival(&self) -> &'static str {
        arrival_name(self.inner.arrival())
    }

    /// Number of (sub)sessions.
    #[getter]
    fn sessions(&self) -> u32 {
        self.inner.sessions()
    }

    /// Number of root sessions (the unit of closed-loop arrivals).
    #[getter]
    fn root_sessions(&self) -> u32 {
        self.inner.root_sessions()
    }

    /// Block ids stored over all requests.
    #[getter]
    fn total_hash_ids(&self) -> usize {
        self.inner.total_hash_ids()
    }

    /// Prompt tokens over all requests.
    #[getter]
    fn input_tokens(&self) -> u64 {
        self.inner.requests().iter().map(|r| u64::from(r.input_tokens)).sum()
    }

    /// Output tokens over all requests.
    #[getter]
    fn output_tokens(&self) -> u64 {
        self.inner.requests().iter().map(|r| u64::from(r.output_tokens)).sum()
    }

    /// Latest trace time of any request, seconds (open loop: the last arrival at 1×).
    #[getter]
    fn span_s(&self) -> f64 {
        self.inner.requests().iter().map(|r| r.time_s).fold(0.0, f64::max)
    }

    fn __len__(&self) -> usize {
        self.inner.len()
    }

    /// ``copies`` copies of a closed-loop workload with private block ids per copy (shared
    /// system-prompt ids stay shared), root sessions in a seeded random order.
    ///
    /// Args:
    ///     copies: how many copies (1 only shuffles the session order).
    ///     seed: seed of the shuffle.
    ///
    /// Raises:
    ///     InvalidConfigError: ``copies`` is 0 or the workload is open-loop.
    #[pyo3(signature = (copies, *, seed = 0))]
    fn replicate(&self, py: Python<'_>, copies: u32, seed: u64) -> PyResult<Self> {
        let inner = &self.inner;
        let replica = py
            .detach(|| inner.replicate(copies, seed))
            .map_err(|e| sim_error(py, &e))?;
        Ok(Self {
            inner: Arc::new(replica),
        })
    }

    fn __repr__(&self) -> String {
        format!(
            "Workload(name={:?}, requests={}, sessions={}, root_sessions={}, block_tokens={}, arrival={:?})",
            self.inner.name(),
            self.inner.len(),
            self.inner.sessions(),
            self.inner.root_sessions(),
            self.inner.block_tokens(),
            arrival_name(self.inner.arrival()),
        )
    }
}

/// Paths from a str / os.PathLike or a sequence of them.
fn paths(obj: &Bound<'_, PyAny>) -> PyResult<Vec<PathBuf>> {
    if let Ok(one) = obj.extract::<PathBuf>() {
        return Ok(vec![one]);
    }
    obj.extract::<Vec<PathBuf>>()
        .map_err(|_| PyTypeError::new_err("paths must be a str, an os.PathLike or a sequence of them"))
}

fn invalid_argument(py: Python<'_>, argument: &str, reason: &str) -> PyErr {
    python_error(py, "InvalidArgumentError", &format!("{argument}: {reason}"), |k| {
        k.set_item("argument", argument)?;
        k.set_item("reason", reason)
    })
}

/// Loads a trace file (or, for ``"weka"``, several files as one workload).
///
/// Args:
///     paths: the trace file(s): JSON Lines, gzipped or not.
///     format: ``"weka"``, ``"bailian"``, ``"mooncake"`` or ``"azure"``.
///     coarsen: Weka only: keep every ``coarsen``-th 64-token id (block = 64·coarsen tokens).
///     shared_prefix: Weka only: share the tool + system-prompt blocks across sessions.
///     gate_on_parent: Bailian only: a child request also waits for its parent to finish.
///
/// Returns:
///     Workload: the loaded trace.
///
/// Raises:
///     TraceFormatError: a bad record (with ``path`` and 1-based ``line``).
///     OSError: the file cannot be read (``FileNotFoundError``, …).
///     InvalidArgumentError: an unknown format, or several files for a one-file format.
///     EmptyWorkloadError: no request in the file(s).
#[pyfunction]
#[allow(clippy::doc_markdown)] // a Python docstring (it becomes `__doc__`), not rustdoc
#[pyo3(signature = (paths, format, *, coarsen = smetric_sim::workload::weka::DEFAULT_COARSEN, shared_prefix = true, gate_on_parent = false))]
fn load_workload(
    py: Python<'_>,
    paths: &Bound<'_, PyAny>,
    format: &str,
    coarsen: u32,
    shared_prefix: bool,
    gate_on_parent: bool,
) -> PyResult<PyWorkload> {
    let files = self::paths(paths)?;
    if files.is_empty() {
        return Err(invalid_argument(py, "paths", "at least one file is needed"));
    }
    if format != "weka" && files.len() != 1 {
        return Err(invalid_argument(
            py,
            "paths",
            &format!("format {format:?} reads exactly one file, got {}", files.len()),
        ));
    }
    if coarsen == 0 {
        return Err(invalid_argument(py, "coarsen", "must be >= 1"));
    }
    let loaded = match format {
        "weka" => {
            let options = WekaOptions { coarsen, shared_prefix };
            py.detach(|| load_weka(&files, &options))
        }
        "bailian" => {
            let options = BailianOptions { gate_on_parent };
            py.detach(|| load_bailian(&files[0], &options))
        }
        "mooncake" => py.detach(|| load_mooncake(&files[0])),
        "azure" => py.detach(|| load_azure(&files[0])),
        other => {
            return Err(invalid_argument(
                py,
                "format",
                &format!("{other:?} is not one of \"weka\", \"bailian\", \"mooncake\", \"azure\""),
            ));
        }
    };
    let workload = loaded.map_err(|e| sim_error(py, &e))?;
    Ok(PyWorkload {
        inner: Arc::new(workload),
    })
}

/// Extracts `value` as `T`, naming the config key in the `TypeError`.
fn field<'py, T: FromPyObjectOwned<'py>>(key: &str, value: &Bound<'py, PyAny>) -> PyResult<T> {
    value.extract::<T>().map_err(|e| {
        let e: PyErr = e.into();
        PyTypeError::new_err(format!("config[{key:?}]: {e}"))
    })
}

fn nested<'py>(key: &str, value: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyDict>> {
    value
        .cast::<PyDict>()
        .cloned()
        .map_err(|_| PyTypeError::new_err(format!("config[{key:?}] must be a dict")))
}

fn unknown_key(py: Python<'_>, section: &'static str, key: &str) -> PyErr {
    invalid_config(py, section, format!("unknown key {key:?}"))
}

fn apply_slo(py: Python<'_>, slo: &mut SloConfig, d: &Bound<'_, PyDict>) -> PyResult<()> {
    for (k, v) in d.iter() {
        let key: String = k.extract()?;
        match key.as_str() {
            "ttft_base_s" => slo.ttft_base_s = field(&key, &v)?,
            "ttft_s_per_token" => slo.ttft_s_per_token = field(&key, &v)?,
            "tpot_s" => slo.tpot_s = field(&key, &v)?,
            _ => return Err(unknown_key(py, "slo", &key)),
        }
    }
    Ok(())
}

/// `SimConfig::default()` updated with the keys of `config` and the router config.
fn sim_config(
    py: Python<'_>,
    config: Option<&Bound<'_, PyDict>>,
    router: Option<&Bound<'_, PyRouterConfig>>,
) -> PyResult<SimConfig> {
    let mut c = SimConfig::default();
    if let Some(r) = router {
        c.router = r.get().inner.clone();
    }
    let Some(config) = config else {
        return Ok(c);
    };
    for (k, v) in config.iter() {
        let key: String = k
            .extract()
            .map_err(|_| PyTypeError::new_err("config keys must be str"))?;
        match key.as_str() {
            "instances" => c.instances = field(&key, &v)?,
            "profile" => {
                let name: String = field(&key, &v)?;
                c.profile = Profile::by_name(&name).map_err(|e| sim_error(py, &e))?;
            }
            "max_num_batched_tokens" => c.max_num_batched_tokens = field(&key, &v)?,
            "max_num_seqs" => c.max_num_seqs = field(&key, &v)?,
            "max_model_len" => c.max_model_len = field(&key, &v)?,
            "kv_capacity_tokens" => c.kv_capacity_tokens = field(&key, &v)?,
            "global_tier" => {
                let d = nested(&key, &v)?;
                let tier = &mut c.global_tier;
                for (k, v) in d.iter() {
                    let key: String = k.extract()?;
                    match key.as_str() {
                        "enabled" => tier.enabled = field(&key, &v)?,
                        "capacity_bytes" => tier.capacity_bytes = field(&key, &v)?,
                        "fetch_latency_s" => tier.fetch_latency_s = field(&key, &v)?,
                        "bandwidth_bytes_per_s" => tier.bandwidth_bytes_per_s = field(&key, &v)?,
                        "fifo_link" => tier.fifo_link = field(&key, &v)?,
                        _ => return Err(unknown_key(py, "global_tier", &key)),
                    }
                }
            }
            "time_scale" => c.time_scale = field(&key, &v)?,
            "session_rate_per_s" => c.session_rate_per_s = field(&key, &v)?,
            "max_think_s" => c.max_think_s = field(&key, &v)?,
            "arrivals_until_s" => c.arrivals_until_s = field(&key, &v)?,
            "seed" => c.seed = field(&key, &v)?,
            "slo" => apply_slo(py, &mut c.slo, &nested(&key, &v)?)?,
            "measure_start_s" => c.measure_start_s = field(&key, &v)?,
            "measure_end_s" => c.measure_end_s = field(&key, &v)?,
            "sample_interval_s" => c.sample_interval_s = field(&key, &v)?,
            "load_report_interval_s" => c.load_report_interval_s = field(&key, &v)?,
            "series_interval_s" => c.series_interval_s = field(&key, &v)?,
            "max_events" => c.max_events = field(&key, &v)?,
            "keep_records" => c.keep_records = field(&key, &v)?,
            "index_feed" => {
                let name: String = field(&key, &v)?;
                c.index_feed = IndexFeed::parse(&name).ok_or_else(|| {
                    let known: Vec<&str> = IndexFeed::ALL.iter().map(|f| f.name()).collect();
                    invalid_config(
                        py,
                        "index_feed",
                        format!("unknown feed {name:?}; known: {}", known.join(", ")),
                    )
                })?;
            }
            "event_delay_s" => c.event_delay_s = field(&key, &v)?,
            _ => return Err(unknown_key(py, "config", &key)),
        }
    }
    c.validate().map_err(|e| sim_error(py, &e))?;
    Ok(c)
}

/// `SimConfig::default()` as a dict (``router`` excluded: see ``RouterConfig()``).
#[pyfunction]
fn sim_config_defaults(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let c = SimConfig::default();
    let d = PyDict::new(py);
    d.set_item("instances", c.instances)?;
    d.set_item("profile", &c.profile.name)?;
    d.set_item("max_num_batched_tokens", c.max_num_batched_tokens)?;
    d.set_item("max_num_seqs", c.max_num_seqs)?;
    d.set_item("max_model_len", c.max_model_len)?;
    d.set_item("kv_capacity_tokens", c.kv_capacity_tokens)?;
    let tier = PyDict::new(py);
    tier.set_item("enabled", c.global_tier.enabled)?;
    tier.set_item("capacity_bytes", c.global_tier.capacity_bytes)?;
    tier.set_item("fetch_latency_s", c.global_tier.fetch_latency_s)?;
    tier.set_item("bandwidth_bytes_per_s", c.global_tier.bandwidth_bytes_per_s)?;
    tier.set_item("fifo_link", c.global_tier.fifo_link)?;
    d.set_item("global_tier", tier)?;
    d.set_item("time_scale", c.time_scale)?;
    d.set_item("session_rate_per_s", c.session_rate_per_s)?;
    d.set_item("max_think_s", c.max_think_s)?;
    d.set_item("arrivals_until_s", c.arrivals_until_s)?;
    d.set_item("seed", c.seed)?;
    d.set_item("slo", slo_config_dict(py, &c.slo)?)?;
    d.set_item("measure_start_s", c.measure_start_s)?;
    d.set_item("measure_end_s", c.measure_end_s)?;
    d.set_item("sample_interval_s", c.sample_interval_s)?;
    d.set_item("load_report_interval_s", c.load_report_interval_s)?;
    d.set_item("series_interval_s", c.series_interval_s)?;
    d.set_item("max_events", c.max_events)?;
    d.set_item("keep_records", c.keep_records)?;
    d.set_item("index_feed", c.index_feed.name())?;
    d.set_item("event_delay_s", c.event_delay_s)?;
    Ok(d)
}

fn slo_config_dict<'py>(py: Python<'py>, slo: &SloConfig) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("ttft_base_s", slo.ttft_base_s)?;
    d.set_item("ttft_s_per_token", slo.ttft_s_per_token)?;
    d.set_item("tpot_s", &slo.tpot_s)?;
    Ok(d)
}

/// Names of the built-in hardware/model profiles.
#[pyfunction]
fn sim_profiles() -> Vec<&'static str> {
    Profile::BUILTIN.to_vec()
}

fn percentiles<'py>(py: Python<'py>, p: &Percentiles) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("p50", p.p50)?;
    d.set_item("p90", p.p90)?;
    d.set_item("p99", p.p99)?;
    d.set_item("mean", p.mean)?;
    d.set_item("count", p.count)?;
    Ok(d)
}

fn slo_reports<'py>(py: Python<'py>, reports: &[SloReport]) -> PyResult<Bound<'py, PyList>> {
    let out = PyList::empty(py);
    for s in reports {
        let d = PyDict::new(py);
        d.set_item("tpot_s", s.tpot_s)?;
        d.set_item("ttft_base_s", s.ttft_base_s)?;
        d.set_item("ttft_s_per_token", s.ttft_s_per_token)?;
        d.set_item("met", s.met)?;
        d.set_item("attainment", s.attainment)?;
        d.set_item("ttft_attainment", s.ttft_attainment)?;
        d.set_item("tpot_attainment", s.tpot_attainment)?;
        d.set_item("tps_under_slo", s.tps_under_slo)?;
        d.set_item("output_tps_under_slo", s.output_tps_under_slo)?;
        out.append(d)?;
    }
    Ok(out)
}

/// Rows of `instances` values each.
fn rows<'py, T: Copy + IntoPyObject<'py>>(py: Python<'py>, flat: &[T], instances: u32) -> PyResult<Bound<'py, PyList>> {
    let out = PyList::empty(py);
    for row in flat.chunks(instances.max(1) as usize) {
        out.append(PyList::new(py, row.iter().copied())?)?;
    }
    Ok(out)
}

fn load_series<'py>(py: Python<'py>, s: &LoadSeries) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("instances", s.instances)?;
    d.set_item("time_s", &s.time_s)?;
    d.set_item("requests", rows(py, &s.requests, s.instances)?)?;
    d.set_item("queued_tokens", rows(py, &s.queued_tokens, s.instances)?)?;
    d.set_item("kv_usage", rows(py, &s.kv_usage, s.instances)?)?;
    Ok(d)
}

/// Per-request outcomes as columns (one list per field, `None` where unknown).
fn records<'py>(py: Python<'py>, records: &[RequestRecord]) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    let col = |f: &dyn Fn(&RequestRecord) -> Option<f64>| records.iter().map(f).collect::<Vec<_>>();
    d.set_item("index", records.iter().map(|r| r.index).collect::<Vec<_>>())?;
    d.set_item("instance", records.iter().map(|r| r.instance).collect::<Vec<_>>())?;
    d.set_item("arrival_s", col(&|r| r.arrival_s))?;
    d.set_item("first_token_s", col(&|r| r.first_token_s))?;
    d.set_item("finish_s", col(&|r| r.finish_s))?;
    d.set_item("ttft_s", col(&RequestRecord::ttft_s))?;
    d.set_item("tpot_s", col(&RequestRecord::tpot_s))?;
    d.set_item(
        "input_tokens",
        records.iter().map(|r| r.input_tokens).collect::<Vec<_>>(),
    )?;
    d.set_item(
        "output_tokens",
        records.iter().map(|r| r.output_tokens).collect::<Vec<_>>(),
    )?;
    d.set_item(
        "local_hit_tokens",
        records.iter().map(|r| r.local_hit_tokens).collect::<Vec<_>>(),
    )?;
    d.set_item(
        "global_hit_tokens",
        records.iter().map(|r| r.global_hit_tokens).collect::<Vec<_>>(),
    )?;
    d.set_item(
        "first_turn_truth",
        records.iter().map(|r| r.first_turn_truth).collect::<Vec<_>>(),
    )?;
    d.set_item(
        "first_turn_inferred",
        records.iter().map(|r| r.first_turn_inferred).collect::<Vec<_>>(),
    )?;
    d.set_item("reason", records.iter().map(|r| r.reason).collect::<Vec<_>>())?;
    d.set_item("rejected", records.iter().map(|r| r.rejected).collect::<Vec<_>>())?;
    d.set_item("preemptions", records.iter().map(|r| r.preemptions).collect::<Vec<_>>())?;
    Ok(d)
}

fn report_dict<'py>(
    py: Python<'py>,
    r: &SimReport,
    variants: &[Vec<SloReport>],
    with_records: bool,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("policy", &r.policy)?;
    d.set_item("workload", &r.workload)?;
    d.set_item("profile", &r.profile)?;
    d.set_item("instances", r.instances)?;
    d.set_item("requests", r.requests)?;
    d.set_item("completed", r.completed)?;
    d.set_item("rejected", r.rejected)?;
    d.set_item("measured", r.measured)?;
    d.set_item("measured_rejected", r.measured_rejected)?;
    d.set_item("window_start_s", r.window_start_s)?;
    d.set_item("window_end_s", r.window_end_s)?;
    d.set_item("makespan_s", r.makespan_s)?;
    d.set_item("ttft", percentiles(py, &r.ttft)?)?;
    d.set_item("tpot", percentiles(py, &r.tpot)?)?;
    d.set_item("slo", slo_reports(py, &r.slo)?)?;
    let v = PyList::empty(py);
    for reports in variants {
        v.append(slo_reports(py, reports)?)?;
    }
    d.set_item("slo_variants", v)?;
    d.set_item("input_tokens", r.input_tokens)?;
    d.set_item("output_tokens", r.output_tokens)?;
    d.set_item("local_hit_ratio", r.local_hit_ratio)?;
    d.set_item("global_hit_ratio", r.global_hit_ratio)?;
    d.set_item("followup_home_share", r.followup_home_share)?;
    d.set_item("followups", r.followups)?;
    d.set_item("migrations", r.migrations)?;
    d.set_item("router_migrations", r.router_migrations)?;
    d.set_item("turn_inference_accuracy", r.turn_inference_accuracy)?;
    d.set_item("turn_inference_samples", r.turn_inference_samples)?;
    d.set_item("imbalance_queued_cv_mean", r.imbalance_queued_cv_mean)?;
    d.set_item("imbalance_queued_cv_p90", r.imbalance_queued_cv_p90)?;
    d.set_item("imbalance_requests_cv_mean", r.imbalance_requests_cv_mean)?;
    d.set_item("imbalance_samples", r.imbalance_samples)?;
    d.set_item("preemptions", r.preemptions)?;
    d.set_item("gpu_evictions", r.gpu_evictions)?;
    d.set_item("tier_evictions", r.tier_evictions)?;
    d.set_item("tier_fetches", r.tier_fetches)?;
    d.set_item("tier_fetch_bytes", r.tier_fetch_bytes)?;
    d.set_item("iterations", r.iterations)?;
    d.set_item("events", r.events)?;
    let reasons = PyDict::new(py);
    for (reason, n) in &r.reasons {
        reasons.set_item(reason, n)?;
    }
    d.set_item("reasons", reasons)?;
    d.set_item("index_feed", &r.index_feed)?;
    d.set_item("event_delay_s", r.event_delay_s)?;
    d.set_item("local_hit_overpredicted_share", r.local_hit_overpredicted_share)?;
    d.set_item("local_hit_prediction_error", r.local_hit_prediction_error)?;
    let feed = PyDict::new(py);
    for (name, n) in &r.feed_counters {
        feed.set_item(name, n)?;
    }
    d.set_item("feed_counters", feed)?;
    d.set_item("load_series", load_series(py, &r.load_series)?)?;
    if with_records {
        d.set_item("records", records(py, &r.records)?)?;
    }
    Ok(d)
}

/// Simulates ``workload`` on a vLLM cluster, routing every request with the real router.
///
/// Args:
///     workload: a :class:`Workload` from :func:`load_workload`.
///     policy: one of ``smetric.POLICIES``.
///     config: ``SimConfig`` fields to override (see :func:`sim_config_defaults`), with
///         ``global_tier`` and ``slo`` as nested dicts and ``profile`` a built-in name.
///     router: the router's tunables; its capacities are always set from the simulated
///         pools and tier.
///     slo_variants: more SLOs (dicts of ``ttft_base_s``, ``ttft_s_per_token``, ``tpot_s``,
///         each key optional) to score the same run under; one list of SLO results each
///         in ``report["slo_variants"]``.
///
/// Returns:
///     dict: the report (``SimReport`` field names; ``records`` only with ``keep_records``).
///
/// Raises:
///     UnknownPolicyError, InvalidConfigError, EmptyWorkloadError, SimulationStalledError,
///     SimulationError; TypeError for a value of the wrong type.
#[pyfunction]
#[allow(clippy::doc_markdown)] // a Python docstring (it becomes `__doc__`), not rustdoc
#[pyo3(signature = (workload, policy, *, config = None, router = None, slo_variants = Vec::new()))]
fn simulate<'py>(
    py: Python<'py>,
    workload: &Bound<'py, PyWorkload>,
    policy: &str,
    config: Option<&Bound<'py, PyDict>>,
    router: Option<&Bound<'py, PyRouterConfig>>,
    slo_variants: Vec<Bound<'py, PyDict>>,
) -> PyResult<Bound<'py, PyDict>> {
    let kind = PolicyKind::parse(policy).py()?;
    let mut config = sim_config(py, config, router)?;
    let mut variants = Vec::with_capacity(slo_variants.len());
    for d in &slo_variants {
        let mut slo = config.slo.clone();
        apply_slo(py, &mut slo, d)?;
        let probe = SimConfig {
            slo,
            ..SimConfig::default()
        };
        probe.validate().map_err(|e| sim_error(py, &e))?;
        variants.push(probe.slo);
    }
    let with_records = config.keep_records;
    // Re-scoring needs the records; they are dropped again unless the caller asked for them.
    config.keep_records |= !variants.is_empty();
    let inner = Arc::clone(&workload.get().inner);
    let report = py
        .detach(|| run(&config, &inner, kind))
        .map_err(|e| sim_error(py, &e))?;
    let scored: Vec<Vec<SloReport>> = variants
        .iter()
        .map(|slo| evaluate_slo(slo, &report.records, report.window_start_s, report.window_end_s))
        .collect();
    report_dict(py, &report, &scored, with_records)
}

/// Adds the simulator to `smetric._core`.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyWorkload>()?;
    m.add_function(wrap_pyfunction!(load_workload, m)?)?;
    m.add_function(wrap_pyfunction!(simulate, m)?)?;
    m.add_function(wrap_pyfunction!(sim_config_defaults, m)?)?;
    m.add_function(wrap_pyfunction!(sim_profiles, m)?)?;
    Ok(())
}
