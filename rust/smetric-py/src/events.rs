//! `KvEventIngestor`: the binding of `smetric_vllm::Ingestor`, which applies vLLM's KV-cache
//! events to a router's index. `smetric.events.KvEventSubscriber` owns the ZMQ sockets and hands
//! each multipart message to it.
//!
//! The ingestor writes straight into the core router behind the `smetric.Router` it was given,
//! with the GIL released: decoding, hash mapping and index updates are all Rust. Calls are
//! serialised by the ingestor's mutex (taken without holding the GIL while waiting).

use std::sync::{Arc, Mutex};

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyBytesMethods, PyDict, PyModule};
use smetric_core::{Router, SmetricError};
use smetric_vllm::{IngestConfig, IngestStats, Ingestor, Offload, SourceId, Step, UnknownSource};

use crate::errors::to_py;
use crate::router::PyRouter;

/// Applies vLLM KV-cache events (raw ZMQ frames) to a router's index.
#[pyclass(frozen, module = "smetric._core", name = "KvEventIngestor")]
pub(crate) struct PyKvEventIngestor {
    router: Py<PyRouter>,
    core: Arc<Router>,
    inner: Mutex<Ingestor>,
}

fn unknown_source(err: UnknownSource) -> PyErr {
    to_py(&SmetricError::InvalidArgument {
        argument: "source",
        reason: err.to_string(),
    })
}

fn non_negative(argument: &'static str, value: i64) -> PyResult<usize> {
    usize::try_from(value).map_err(|_| {
        to_py(&SmetricError::InvalidArgument {
            argument,
            reason: format!("must be >= 0, got {value}"),
        })
    })
}

/// What the caller must do after handing in a message (``IngestStep`` in Python).
#[pyclass(frozen, eq, module = "smetric._core", name = "IngestStep")]
#[derive(PartialEq)]
pub(crate) struct PyIngestStep {
    /// Send a replay request from this sequence number on the source's DEALER, if not None.
    #[pyo3(get)]
    replay_from: Option<u64>,
    /// The replay ended (its end marker arrived or it was given up): stop waiting for it.
    #[pyo3(get)]
    replay_done: bool,
    /// Why the message was dropped (it did not decode; already counted in ``stats()``), or None.
    #[pyo3(get)]
    error: Option<String>,
}

#[pymethods]
impl PyIngestStep {
    fn __repr__(&self) -> String {
        let from = self.replay_from.map_or_else(|| "None".to_owned(), |s| s.to_string());
        let done = if self.replay_done { "True" } else { "False" };
        let error = self
            .error
            .as_ref()
            .map_or_else(|| "None".to_owned(), |e| format!("{e:?}"));
        format!("IngestStep(replay_from={from}, replay_done={done}, error={error})")
    }
}

fn py_step(step: Step) -> PyIngestStep {
    PyIngestStep {
        replay_from: step.replay_from,
        replay_done: step.replay_done,
        error: step.error.map(|e| e.to_string()),
    }
}

/// The ingestor's limits when the caller gives none, defined once in `smetric_vllm`.
const DEFAULTS: IngestConfig = IngestConfig::DEFAULT;

fn stats_dict<'py>(py: Python<'py>, stats: &IngestStats) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    for (name, value) in stats.counters() {
        d.set_item(name, value)?;
    }
    let kinds = PyDict::new(py);
    for (kind, n) in &stats.decode_errors_by_kind {
        kinds.set_item(*kind, n)?;
    }
    d.set_item("decode_errors_by_kind", kinds)?;
    Ok(d)
}

impl PyKvEventIngestor {
    /// Runs `f` on the ingestor with the core router as its sink, the GIL released.
    fn with<T: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut Ingestor, &Router) -> Result<T, UnknownSource> + Send,
    ) -> PyResult<T> {
        let (inner, core) = (&self.inner, &*self.core);
        py.detach(|| {
            let mut ingestor = inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            f(&mut ingestor, core)
        })
        .map_err(unknown_source)
    }
}

fn frames<'a>(frames: &'a [Bound<'_, PyBytes>]) -> Vec<&'a [u8]> {
    frames.iter().map(PyBytesMethods::as_bytes).collect()
}

#[pymethods]
impl PyKvEventIngestor {
    #[new]
    #[pyo3(signature = (
        router,
        *,
        max_mapped_blocks = DEFAULTS.max_mapped_blocks as i64,
        max_pending_batches = DEFAULTS.max_pending_batches as i64,
    ))]
    fn new(router: &Bound<'_, PyRouter>, max_mapped_blocks: i64, max_pending_batches: i64) -> PyResult<Self> {
        let config = IngestConfig {
            max_mapped_blocks: non_negative("max_mapped_blocks", max_mapped_blocks)?.max(1),
            max_pending_batches: non_negative("max_pending_batches", max_pending_batches)?,
            ..DEFAULTS
        };
        Ok(Self {
            core: router.get().core().clone(),
            router: router.clone().unbind(),
            inner: Mutex::new(Ingestor::new(config)),
        })
    }

    /// ``max_mapped_blocks`` when not given (``smetric.events`` reads it from here).
    #[classattr]
    const DEFAULT_MAX_MAPPED_BLOCKS: usize = DEFAULTS.max_mapped_blocks;

    /// ``max_pending_batches`` when not given.
    #[classattr]
    const DEFAULT_MAX_PENDING_BATCHES: usize = DEFAULTS.max_pending_batches;

    /// The router whose index this ingestor feeds.
    #[getter]
    fn router(&self, py: Python<'_>) -> Py<PyRouter> {
        self.router.clone_ref(py)
    }

    /// Registers a publisher feeding ``instance``; returns its source id. ``offload`` says
    /// where its CPU and STORAGE blocks live: ``"shared"`` (a store every instance reads: the
    /// global tier) or ``"host"`` (the instance's own host memory, or its host pool: vLLM's
    /// ``OffloadingConnector``, LMCache's local CPU backend).
    #[pyo3(signature = (instance, *, replay = false, offload = "shared"))]
    fn add_source(&self, py: Python<'_>, instance: &str, replay: bool, offload: &str) -> PyResult<u32> {
        let offload = Offload::parse(offload).ok_or_else(|| {
            to_py(&SmetricError::InvalidArgument {
                argument: "offload",
                reason: format!("{offload:?} is not one of \"shared\", \"host\""),
            })
        })?;
        self.with(py, |ing, _| Ok(ing.add_source_with(instance, replay, offload).0))
    }

    /// Unregisters a source and removes what it put in the index.
    fn remove_source(&self, py: Python<'_>, source: u32) -> PyResult<()> {
        self.with(py, |ing, sink| ing.remove_source(sink, SourceId(source)))
    }

    /// Removes what a source put in the index and forgets its sequence state.
    fn reset_source(&self, py: Python<'_>, source: u32) -> PyResult<()> {
        self.with(py, |ing, sink| ing.reset_source(sink, SourceId(source)))
    }

    /// Hands in one PUB message ``[topic, seq, payload]``.
    fn on_message(&self, py: Python<'_>, source: u32, frames: Vec<Bound<'_, PyBytes>>) -> PyResult<PyIngestStep> {
        let frames = self::frames(&frames);
        self.with(py, |ing, sink| ing.on_message(sink, SourceId(source), &frames))
            .map(py_step)
    }

    /// Hands in several PUB messages of one source, in order, under one release of the GIL
    /// and one acquisition of the router's index lock: the same steps and index as
    /// ``on_message`` for each. Returns only the steps that ask something of the caller (a
    /// replay to send, a replay ended, a dropped message), each with its message's position:
    /// most batches return an empty list, so the call holds the GIL for almost nothing. A
    /// subscriber that drains its socket hands the messages in together, so that a thread
    /// routing beside it waits once per batch instead of once per message.
    fn on_messages(
        &self,
        py: Python<'_>,
        source: u32,
        messages: Vec<Vec<Bound<'_, PyBytes>>>,
    ) -> PyResult<Vec<(usize, PyIngestStep)>> {
        let messages: Vec<Vec<&[u8]>> = messages.iter().map(|m| self::frames(m)).collect();
        let steps = self.with(py, |ing, sink| ing.on_messages(sink, SourceId(source), &messages))?;
        Ok(steps
            .into_iter()
            .enumerate()
            .filter(|(_, step)| *step != Step::default())
            .map(|(i, step)| (i, py_step(step)))
            .collect())
    }

    /// Hands in one reply received on the source's replay DEALER.
    fn on_replay_reply(&self, py: Python<'_>, source: u32, frames: Vec<Bound<'_, PyBytes>>) -> PyResult<PyIngestStep> {
        let frames = self::frames(&frames);
        self.with(py, |ing, sink| ing.on_replay_reply(sink, SourceId(source), &frames))
            .map(py_step)
    }

    /// The source's replay timed out: resume from the held-back batches.
    fn on_replay_failed(&self, py: Python<'_>, source: u32) -> PyResult<PyIngestStep> {
        self.with(py, |ing, sink| ing.on_replay_failed(sink, SourceId(source)))
            .map(py_step)
    }

    /// Counters of one source, or of all sources (then with ``held_local_blocks`` and
    /// ``held_global_blocks``: what the sources' events hold in the index now).
    #[pyo3(signature = (source = None))]
    fn stats<'py>(&self, py: Python<'py>, source: Option<u32>) -> PyResult<Bound<'py, PyDict>> {
        let (stats, held) = self.with(py, |ing, _| match source {
            None => Ok((ing.stats(), Some(ing.held_blocks()))),
            Some(id) => ing.source_stats(SourceId(id)).map(|s| (s, None)),
        })?;
        let d = stats_dict(py, &stats)?;
        if let Some((local, global)) = held {
            d.set_item("held_local_blocks", local)?;
            d.set_item("held_global_blocks", global)?;
        }
        Ok(d)
    }
}

/// Adds `KvEventIngestor` to `smetric._core`.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyKvEventIngestor>()?;
    m.add_class::<PyIngestStep>()
}
