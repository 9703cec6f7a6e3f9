//! `EngineLoadScrape`: the engine-load scraper of `smetric_gateway::engine_load`, and the
//! `/metrics` parse under it (`engine_sample`, `parse_prometheus`). Conversion and error mapping
//! only: a bad argument is `ValueError`, a call on a stopped scraper or a second `start`
//! `RuntimeError`. `scrape_once` and `stop` release the GIL while they wait.

use std::collections::HashMap;
use std::time::Duration;

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};
use smetric_gateway::engine_load::{EngineLoadScraper, InstanceStats, LoadEndpoint, ScrapeConfig, ScrapeError};
use smetric_vllm::load_metrics;

use crate::gateway::routing_of;

/// One instance's load, summed over its engines (data-parallel ranks); every field is None when
/// its metric was absent.
#[pyclass(frozen, eq, get_all, module = "smetric._core", name = "EngineSample")]
#[derive(Clone, Copy, PartialEq)]
pub(crate) struct PyEngineSample {
    running: Option<u64>,
    waiting: Option<u64>,
    kv_usage: Option<f64>,
    prefix_cache_queries: Option<f64>,
    prefix_cache_hits: Option<f64>,
    external_prefix_cache_queries: Option<f64>,
    external_prefix_cache_hits: Option<f64>,
}

impl From<load_metrics::EngineSample> for PyEngineSample {
    fn from(s: load_metrics::EngineSample) -> Self {
        Self {
            running: s.running,
            waiting: s.waiting,
            kv_usage: s.kv_usage,
            prefix_cache_queries: s.prefix_cache_queries,
            prefix_cache_hits: s.prefix_cache_hits,
            external_prefix_cache_queries: s.external_prefix_cache_queries,
            external_prefix_cache_hits: s.external_prefix_cache_hits,
        }
    }
}

#[pymethods]
impl PyEngineSample {
    #[new]
    #[pyo3(signature = (
        *, running = None, waiting = None, kv_usage = None, prefix_cache_queries = None,
        prefix_cache_hits = None, external_prefix_cache_queries = None, external_prefix_cache_hits = None
    ))]
    fn new(
        running: Option<u64>,
        waiting: Option<u64>,
        kv_usage: Option<f64>,
        prefix_cache_queries: Option<f64>,
        prefix_cache_hits: Option<f64>,
        external_prefix_cache_queries: Option<f64>,
        external_prefix_cache_hits: Option<f64>,
    ) -> Self {
        Self {
            running,
            waiting,
            kv_usage,
            prefix_cache_queries,
            prefix_cache_hits,
            external_prefix_cache_queries,
            external_prefix_cache_hits,
        }
    }

    fn __repr__(&self) -> String {
        let f = |v: Option<f64>| v.map_or_else(|| "None".to_owned(), |v| format!("{v:?}"));
        let u = |v: Option<u64>| v.map_or_else(|| "None".to_owned(), |v| v.to_string());
        format!(
            "EngineSample(running={}, waiting={}, kv_usage={}, prefix_cache_queries={}, prefix_cache_hits={}, \
             external_prefix_cache_queries={}, external_prefix_cache_hits={})",
            u(self.running),
            u(self.waiting),
            f(self.kv_usage),
            f(self.prefix_cache_queries),
            f(self.prefix_cache_hits),
            f(self.external_prefix_cache_queries),
            f(self.external_prefix_cache_hits),
        )
    }
}

/// The load in one ``/metrics`` page; ``model_name`` keeps only that model's series.
#[pyfunction]
#[pyo3(signature = (text, model_name = None))]
pub(crate) fn engine_sample(py: Python<'_>, text: &str, model_name: Option<&str>) -> PyEngineSample {
    py.detach(|| load_metrics::engine_sample(text, model_name)).into()
}

/// The samples of a Prometheus text page (format 0.0.4) by metric name; with ``names``, only
/// those metrics' (the other lines are skipped before they are parsed).
#[pyfunction]
#[pyo3(signature = (text, names = None))]
pub(crate) fn parse_prometheus<'py>(
    py: Python<'py>,
    text: &str,
    names: Option<Vec<String>>,
) -> PyResult<Bound<'py, PyDict>> {
    let wanted: Option<Vec<&str>> = names.as_ref().map(|n| n.iter().map(String::as_str).collect());
    let out = PyDict::new(py);
    for sample in load_metrics::samples(text, wanted.as_deref()) {
        let labels = PyDict::new(py);
        for (label, value) in &sample.labels {
            labels.set_item(*label, value.as_ref())?;
        }
        let entry = PyTuple::new(py, [labels.into_any(), sample.value.into_pyobject(py)?.into_any()])?;
        match out.get_item(sample.name)? {
            Some(list) => list.cast::<PyList>()?.append(entry)?,
            None => out.set_item(sample.name, PyList::new(py, [entry])?)?,
        }
    }
    Ok(out)
}

/// One instance's scrape counters.
#[pyclass(frozen, get_all, module = "smetric._core", name = "EngineScrapeStats")]
pub(crate) struct PyEngineScrapeStats {
    name: String,
    url: String,
    ok: u64,
    errors: u64,
    slow: u64,
    last_error: Option<String>,
    last: Option<PyEngineSample>,
    prefix_cache_hit_rate: Option<f64>,
    external_prefix_cache_hit_rate: Option<f64>,
}

impl From<InstanceStats> for PyEngineScrapeStats {
    fn from(s: InstanceStats) -> Self {
        let c = s.counters;
        Self {
            name: s.name,
            url: s.url,
            ok: c.ok,
            errors: c.errors,
            slow: c.slow,
            last_error: c.last_error,
            last: c.last.map(Into::into),
            prefix_cache_hit_rate: c.hit_rate,
            external_prefix_cache_hit_rate: c.external_hit_rate,
        }
    }
}

fn to_py(e: &ScrapeError) -> PyErr {
    match e {
        ScrapeError::InvalidArgument(_) => PyValueError::new_err(e.to_string()),
        ScrapeError::Start(_) | ScrapeError::AlreadyStarted | ScrapeError::Stopped => {
            PyRuntimeError::new_err(e.to_string())
        }
    }
}

fn seconds(name: &str, s: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(s)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| PyValueError::new_err(format!("{name} must be a positive number of seconds, got {s}")))
}

/// Scrapes every instance's load on a runtime of its own and feeds the router's
/// ``update_load`` (a ``PdRouter``'s prefill pool). ``smetric.engine_load.EngineLoadScraper`` is
/// the public face.
#[pyclass(frozen, module = "smetric._core", name = "EngineLoadScrape")]
pub(crate) struct PyEngineLoadScrape {
    inner: EngineLoadScraper,
}

#[pymethods]
impl PyEngineLoadScrape {
    #[new]
    #[pyo3(signature = (router, instances, *, period_s, timeout_s, endpoint, model_name, headers, max_concurrent))]
    #[allow(clippy::too_many_arguments)] // keyword arguments, one per setting
    fn new(
        router: &Bound<'_, PyAny>,
        instances: Vec<(String, String)>,
        period_s: f64,
        timeout_s: f64,
        endpoint: &str,
        model_name: Option<String>,
        headers: HashMap<String, String>,
        max_concurrent: usize,
    ) -> PyResult<Self> {
        let endpoint = match endpoint {
            "metrics" => LoadEndpoint::Metrics,
            "load" => LoadEndpoint::Load,
            other => {
                return Err(PyValueError::new_err(format!(
                    "endpoint must be \"metrics\" or \"load\", got {other:?}"
                )));
            }
        };
        let config = ScrapeConfig {
            period: seconds("period_s", period_s)?,
            timeout: seconds("timeout_s", timeout_s)?,
            endpoint,
            model_name,
            headers: headers.into_iter().collect(),
            max_concurrent,
        };
        let routing = routing_of(router)?;
        let inner = EngineLoadScraper::new(routing, instances, config).map_err(|e| to_py(&e))?;
        Ok(Self { inner })
    }

    /// Scrapes every instance now and feeds the router; per instance, in the order given, its
    /// sample or None where the scrape failed.
    fn scrape_once(&self, py: Python<'_>) -> PyResult<Vec<Option<PyEngineSample>>> {
        let samples = py.detach(|| self.inner.scrape_once()).map_err(|e| to_py(&e))?;
        Ok(samples.into_iter().map(|s| s.map(Into::into)).collect())
    }

    /// Starts a round every ``period_s``.
    fn start(&self) -> PyResult<()> {
        self.inner.start().map_err(|e| to_py(&e))
    }

    /// Stops the rounds and drops the connections (idempotent).
    fn stop(&self, py: Python<'_>) {
        py.detach(|| self.inner.stop());
    }

    /// Rounds completed.
    #[getter]
    fn rounds(&self) -> u64 {
        self.inner.rounds()
    }

    /// Per instance, in the order given, its counters.
    fn stats(&self) -> Vec<PyEngineScrapeStats> {
        self.inner.stats().into_iter().map(Into::into).collect()
    }
}
