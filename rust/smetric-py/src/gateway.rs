//! `Gateway`: the compiled data plane (`smetric_gateway`), started and stopped from
//! `smetric serve`, and `GatewayNative`, what arms its native path. Conversion and error
//! mapping only: a bad limit is `InvalidConfigError`, an address that cannot be bound
//! `OSError`, a thread or runtime that cannot start `RuntimeError`. Starting and stopping
//! release the GIL (`stop` waits for the drain); the native path's records cross as dicts.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pyo3::exceptions::{PyOSError, PyRuntimeError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use smetric_core::session_admission::AdmissionMode;
use smetric_gateway::session_gate::SessionGateConfig;
use smetric_gateway::session_table::SessionTable;
use smetric_gateway::shared::BYTE_CHUNK_BYTES;
use smetric_gateway::tokens::{ContentFormat, PiecewiseEncoder, SourceError, TokenSettings, TokenSource};
use smetric_gateway::{
    AdmissionLimits, FleetView, Gateway, GatewayConfig, GatewayError, Limits, NativeApis, NativeConfig, NativeHandles,
    Record, Routing,
};

use crate::errors::python_error;
use crate::pd::PyPdRouter;
use crate::router::PyRouter;
use crate::sessions::PySessionTable;

/// The core router behind a Python `Router` or `PdRouter`.
pub(crate) fn routing_of(router: &Bound<'_, PyAny>) -> PyResult<Routing> {
    Ok(if let Ok(pd) = router.cast::<PyPdRouter>() {
        Routing::Pd(Arc::clone(pd.get().core()))
    } else {
        Routing::Colocated(Arc::clone(router.cast::<PyRouter>()?.get().core()))
    })
}

#[pyclass(frozen, module = "smetric._core", name = "Gateway")]
pub(crate) struct PyGateway {
    inner: Mutex<Option<Gateway>>,
    native: Option<NativeHandles>,
    address: SocketAddr,
}

/// What arms the gateway's native path: the gateway crate's own typed `NativeConfig`, built and
/// checked once here from `smetric serve`'s configuration (a bad duration is an
/// `InvalidConfigError` naming its field at construction), then handed to `Gateway` as it is.
#[pyclass(frozen, module = "smetric._core", name = "GatewayNative")]
pub(crate) struct PyGatewayNative {
    config: NativeConfig,
}

/// The `InvalidConfigError` of gateway setting `field`.
fn invalid_setting(py: Python<'_>, field: &'static str, reason: &str) -> PyErr {
    python_error(
        py,
        "InvalidConfigError",
        &format!("invalid gateway setting {field}: {reason}"),
        |k| {
            k.set_item("field", field)?;
            k.set_item("reason", reason)
        },
    )
}

/// `value` seconds as a duration, or the `InvalidConfigError` naming `field`.
fn seconds(py: Python<'_>, field: &'static str, value: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(value).map_err(|_| {
        invalid_setting(
            py,
            field,
            &format!("must be a non-negative number of seconds, got {value}"),
        )
    })
}

#[pymethods]
impl PyGatewayNative {
    #[new]
    #[pyo3(signature = (
        router, *, secret, client_keys, upstream_key, max_body_bytes, body_timeout_s,
        connect_timeout_s, first_byte_timeout_s, idle_timeout_s, client_timeout_s, max_in_flight,
        max_in_flight_per_instance, queue_size, queue_timeout_s, chat, completions, messages, responses,
        response_id_key,
        resume_streams, max_attempts, eject_after, labels, max_records, session_admission = "off", session_capacity_tokens = 0,
        session_max_held = 0, session_hold_timeout_s = 0.0, session_max_hold_s = None, tokens = None, ids_only = false,
        sessions = None, parent_affinity_margin = None, approx_chunk_bytes = None
    ))]
    #[allow(clippy::too_many_arguments, clippy::fn_params_excessive_bools)] // keyword arguments, one per setting
    fn new(
        router: &Bound<'_, PyAny>,
        secret: String,
        client_keys: Vec<String>,
        upstream_key: Option<String>,
        max_body_bytes: usize,
        body_timeout_s: f64,
        connect_timeout_s: f64,
        first_byte_timeout_s: f64,
        idle_timeout_s: f64,
        client_timeout_s: f64,
        max_in_flight: usize,
        max_in_flight_per_instance: usize,
        queue_size: usize,
        queue_timeout_s: f64,
        chat: bool,
        completions: bool,
        messages: bool,
        responses: bool,
        response_id_key: String,
        resume_streams: bool,
        max_attempts: u32,
        eject_after: u32,
        labels: HashMap<String, String>,
        max_records: usize,
        session_admission: &str,
        session_capacity_tokens: u64,
        session_max_held: usize,
        session_hold_timeout_s: f64,
        session_max_hold_s: Option<f64>,
        tokens: Option<&Bound<'_, PyGatewayTokenSource>>,
        ids_only: bool,
        sessions: Option<&Bound<'_, PySessionTable>>,
        parent_affinity_margin: Option<u64>,
        approx_chunk_bytes: Option<usize>,
    ) -> PyResult<Self> {
        let py = router.py();
        let approx_chunk_bytes = approx_chunk_bytes.unwrap_or(BYTE_CHUNK_BYTES);
        if approx_chunk_bytes == 0 {
            return Err(invalid_setting(py, "approx_chunk_bytes", "must be at least 1, got 0"));
        }
        let routing = routing_of(router)?;
        let mode = AdmissionMode::parse(session_admission).ok_or_else(|| {
            let known: Vec<&str> = AdmissionMode::ALL.iter().map(|m| m.name()).collect();
            invalid_setting(
                py,
                "session_admission",
                &format!("must be one of {}, got {session_admission:?}", known.join(", ")),
            )
        })?;
        let session_gate = match mode {
            AdmissionMode::Off => None,
            _ if session_capacity_tokens == 0 => {
                return Err(invalid_setting(py, "session_capacity_tokens", "must be at least 1"));
            }
            _ if session_max_held == 0 => {
                return Err(invalid_setting(py, "session_max_held", "must be at least 1"));
            }
            _ => Some(SessionGateConfig {
                mode,
                capacity_tokens: session_capacity_tokens,
                max_held: session_max_held,
                hold_timeout: seconds(py, "session_hold_timeout_s", session_hold_timeout_s)?,
                max_hold: session_max_hold_s
                    .map(|s| seconds(py, "session_max_hold_s", s))
                    .transpose()?,
                // The door's Retry-After, set when the gateway starts.
                retry_after_s: 0,
            }),
        };
        Ok(Self {
            config: NativeConfig {
                routing,
                secret,
                client_keys,
                upstream_key,
                max_body_bytes,
                body_timeout: seconds(py, "body_timeout_s", body_timeout_s)?,
                connect_timeout: seconds(py, "connect_timeout_s", connect_timeout_s)?,
                first_byte_timeout: seconds(py, "first_byte_timeout_s", first_byte_timeout_s)?,
                idle_timeout: seconds(py, "idle_timeout_s", idle_timeout_s)?,
                client_timeout: seconds(py, "client_timeout_s", client_timeout_s)?,
                admission: AdmissionLimits {
                    max_in_flight,
                    max_in_flight_per_instance,
                    queue_size,
                    queue_timeout: seconds(py, "queue_timeout_s", queue_timeout_s)?,
                    // The door's Retry-After: the gateway's own setting, set when it starts.
                    retry_after_s: 0,
                },
                apis: NativeApis {
                    chat,
                    completions,
                    messages,
                    responses,
                },
                response_id_key,
                resume_streams,
                max_attempts: max_attempts.max(1),
                eject_after: eject_after.max(1),
                labels,
                max_records,
                session_gate,
                tokens: tokens.map(|t| Arc::clone(&t.get().inner)),
                ids_only,
                approx_chunk_bytes,
                // Without the app's table (a gateway armed on its own) the native path keeps one.
                sessions: match sessions {
                    Some(table) => Arc::clone(&table.get().inner),
                    None => Arc::new(SessionTable::default()),
                },
                parent_affinity_margin,
            },
        })
    }

    /// Whether only token-id prompts are routed (`--tokens ids`; the app refuses the rest).
    #[getter]
    fn ids_only(&self) -> bool {
        self.config.ids_only
    }

    /// The APIs the native path serves, by name (`chat`, `completions`, `messages`, `responses`).
    #[getter]
    fn apis(&self) -> Vec<&'static str> {
        let a = self.config.apis;
        [
            (a.chat, "chat"),
            (a.completions, "completions"),
            (a.messages, "messages"),
            (a.responses, "responses"),
        ]
        .into_iter()
        .filter_map(|(armed, name)| armed.then_some(name))
        .collect()
    }
}

/// One request the native path served, as the app (`smetric.serve.compiled`) takes it into its
/// telemetry, fleet health and decision log: the gateway's `Record`, field for field, typed.
#[pyclass(frozen, get_all, module = "smetric._core", name = "GatewayRecord")]
pub(crate) struct PyGatewayRecord {
    /// The request's id (the client's `x-request-id`, or one minted).
    request_id: String,
    /// The API: `chat`, `completions`, `messages` or `responses`.
    api: &'static str,
    /// The session key the headers gave.
    session: Option<String>,
    /// The parent agent's session key (a sub-agent's request).
    parent: Option<String>,
    /// The requested model.
    model: Option<String>,
    /// The instance that answered (or the last one tried).
    instance: Option<String>,
    /// PD: the prefill instance that answered its leg.
    prefill_instance: Option<String>,
    /// The core's reason (`Decision.reason`), when a decision was made.
    reason: Option<&'static str>,
    /// The policy that decided.
    policy: Option<&'static str>,
    /// Whether the decision treated the request as a first turn.
    first_turn: Option<bool>,
    /// The turn counted in the session table (a hinted request without messages).
    turn: Option<u32>,
    /// The router's predicted local (GPU) hit, tokens.
    predicted_local_hit: Option<u64>,
    /// The router's predicted global-tier hit, tokens.
    predicted_global_hit: Option<u64>,
    /// Prompt tokens (the engine's count when it reported usage).
    prompt_tokens: Option<u64>,
    /// Where the routing ids came from: `ids`, `approximate` or `tokenizer`.
    tokens_source: Option<&'static str>,
    /// Seconds the routing decision took.
    decision_s: Option<f64>,
    /// The engine's cached prompt tokens (the realized hit).
    cached_tokens: Option<u64>,
    /// Output tokens the engine reported.
    output_tokens: Option<u64>,
    /// Seconds from the request's arrival to the engine's answer head.
    first_byte_s: Option<f64>,
    /// Seconds to the first token.
    ttft_s: Option<f64>,
    /// Mean inter-token latency, seconds.
    itl_s: Option<f64>,
    /// Instances tried.
    attempts: u32,
    /// The HTTP status answered.
    status: u16,
    /// The admission refusal's reason, when refused.
    refused: Option<&'static str>,
    /// Seconds from arrival to the answer's end.
    latency_s: f64,
    /// The instance the answer came from gets its health back.
    succeeded: bool,
    /// Attempts that failed before the client had a byte, in order, or a stream cut and not
    /// continued: `(instance, cause, charged)` (charged to its health, else a retry only).
    failures: Vec<(String, String, bool)>,
    /// Instances this request's failures ejected from the gateway's fleet view.
    ejected: Vec<String>,
    /// A cut stream ended with the API's error event (not continued).
    unresumed: bool,
    /// Cut streams the gateway continued on another instance.
    resumed: u32,
    /// A sub-agent's request: what the parent rule did (`parent`, `overloaded`,
    /// `parent_unavailable`, `parent_unknown`).
    grouping: Option<&'static str>,
    /// The request ended its session: whether the session table held state for it.
    session_end_held: Option<bool>,
}

impl From<&Record> for PyGatewayRecord {
    fn from(r: &Record) -> Self {
        Self {
            request_id: r.request_id.clone(),
            api: r.api,
            session: r.session.clone(),
            parent: r.parent.clone(),
            model: r.model.clone(),
            instance: r.instance.clone(),
            prefill_instance: r.prefill_instance.clone(),
            reason: r.reason,
            policy: r.policy,
            first_turn: r.first_turn,
            turn: r.turn,
            predicted_local_hit: r.predicted_local_hit,
            predicted_global_hit: r.predicted_global_hit,
            prompt_tokens: r.prompt_tokens,
            tokens_source: r.tokens_source,
            decision_s: r.decision_s,
            cached_tokens: r.cached_tokens,
            output_tokens: r.output_tokens,
            first_byte_s: r.first_byte_s,
            ttft_s: r.ttft_s,
            itl_s: r.itl_s,
            attempts: r.attempts,
            status: r.status,
            refused: r.refused,
            latency_s: r.latency_s,
            succeeded: r.succeeded,
            failures: r
                .failures
                .iter()
                .map(|f| (f.instance.clone(), f.cause.clone(), f.charged))
                .collect(),
            ejected: r.ejected.clone(),
            unresumed: r.unresumed,
            resumed: r.resumed,
            grouping: r.grouping,
            session_end_held: r.session_end_held,
        }
    }
}

fn not_armed() -> PyErr {
    PyRuntimeError::new_err("the gateway's native path is not armed")
}

fn to_py_err(py: Python<'_>, err: &GatewayError) -> PyErr {
    match err {
        GatewayError::Config { field, reason } => python_error(py, "InvalidConfigError", &err.to_string(), |k| {
            k.set_item("field", field)?;
            k.set_item("reason", reason)
        }),
        GatewayError::Bind { .. } => PyOSError::new_err(err.to_string()),
        GatewayError::Start(_) | GatewayError::Exited | GatewayError::Tls(_) => {
            PyRuntimeError::new_err(err.to_string())
        }
    }
}

#[pymethods]
impl PyGateway {
    #[new]
    #[pyo3(signature = (
        host, port, control_plane_port, *, max_head_bytes, max_field_bytes, head_timeout_s, drain_timeout_s, max_connections,
        retry_after_s, native = None, instances = Vec::new()
    ))]
    #[allow(clippy::too_many_arguments)] // the constructor's keyword arguments, one per limit
    fn new(
        py: Python<'_>,
        host: &str,
        port: u16,
        control_plane_port: u16,
        max_head_bytes: usize,
        max_field_bytes: usize,
        head_timeout_s: f64,
        drain_timeout_s: f64,
        max_connections: usize,
        retry_after_s: u64,
        native: Option<&Bound<'_, PyGatewayNative>>,
        instances: Vec<String>,
    ) -> PyResult<Self> {
        let ip: IpAddr = host.parse().map_err(|_| {
            python_error(
                py,
                "InvalidConfigError",
                &format!("invalid gateway setting host: not an IP address: {host}"),
                |k| {
                    k.set_item("field", "host")?;
                    k.set_item("reason", "not an IP address")
                },
            )
        })?;
        let config = GatewayConfig {
            listen: SocketAddr::new(ip, port),
            control_plane: SocketAddr::from(([127, 0, 0, 1], control_plane_port)),
            limits: Limits {
                max_head_bytes,
                max_field_bytes,
                head_timeout: seconds(py, "head_timeout_s", head_timeout_s)?,
                drain_timeout: seconds(py, "drain_timeout_s", drain_timeout_s)?,
                max_connections,
                retry_after_s,
            },
        };
        let native = match native {
            None => None,
            Some(n) => {
                let mut native = n.get().config.clone();
                native.admission.retry_after_s = retry_after_s;
                if let Some(gate) = &mut native.session_gate {
                    gate.retry_after_s = retry_after_s;
                }
                let fleet = FleetView {
                    instances,
                    ..FleetView::default()
                };
                Some((native, fleet))
            }
        };
        let gateway = py
            .detach(|| Gateway::start(config, native))
            .map_err(|e| to_py_err(py, &e))?;
        Ok(Self {
            address: gateway.address(),
            native: gateway.native(),
            inner: Mutex::new(Some(gateway)),
        })
    }

    /// Replaces the native path's view of the fleet: every instance in order, the ejected ones,
    /// model id → the instances serving it, and the LoRA adapters.
    fn set_fleet(
        &self,
        instances: Vec<String>,
        ejected: HashSet<String>,
        models: HashMap<String, HashSet<String>>,
        adapters: HashSet<String>,
    ) -> PyResult<()> {
        let native = self.native.as_ref().ok_or_else(not_armed)?;
        native.set_fleet(FleetView {
            instances,
            ejected,
            models,
            adapters,
        });
        Ok(())
    }

    /// The native path's records since the last call, oldest first.
    fn take_records(&self) -> PyResult<Vec<PyGatewayRecord>> {
        let native = self.native.as_ref().ok_or_else(not_armed)?;
        Ok(native.take_records().iter().map(PyGatewayRecord::from).collect())
    }

    /// A descriptor that turns readable when records wait to be taken (the gateway owns it;
    /// :meth:`take_records` clears it): the app's event loop watches it instead of polling.
    fn records_fd(&self) -> PyResult<i32> {
        Ok(self.native.as_ref().ok_or_else(not_armed)?.records_bell_fd())
    }

    /// Records dropped because they were not taken in time.
    fn records_dropped(&self) -> PyResult<u64> {
        Ok(self.native.as_ref().ok_or_else(not_armed)?.records_dropped())
    }

    /// Requests holding an admission slot at the door now.
    fn admitted(&self) -> PyResult<usize> {
        Ok(self.native.as_ref().ok_or_else(not_armed)?.admitted())
    }

    /// The door's admission for ``/metrics``: ``admitted``, ``capacity``, ``queued``,
    /// ``wait_counts`` (per bucket of ``WAIT_BUCKETS_S`` and one past it), ``wait_sum_s``,
    /// ``rejections`` (reason → count).
    fn admission<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.native.as_ref().ok_or_else(not_armed)?.admission();
        let d = PyDict::new(py);
        d.set_item("admitted", s.admitted)?;
        d.set_item("capacity", s.capacity)?;
        d.set_item("queued", s.queued)?;
        d.set_item("wait_counts", s.wait_counts)?;
        d.set_item("wait_sum_s", s.wait_sum_s)?;
        d.set_item("rejections", s.rejections.into_iter().collect::<HashMap<_, _>>())?;
        Ok(d)
    }

    /// Releases session ``key`` at the session gate (the end endpoint's part the session
    /// table, shared, does not cover); nothing when session admission is off.
    fn end_session(&self, key: &str) -> PyResult<()> {
        self.native.as_ref().ok_or_else(not_armed)?.end_session(key);
        Ok(())
    }

    /// The session admission for ``/metrics`` (None: off): the stage's decisions ``admitted``
    /// (``released``: of them, admitted without room once their longest hold ran out), ``moved``, ``held`` (answers "hold"; a request held n times counts n), ``paused``
    /// (sessions paused), ``holding`` (requests waiting now), and the refusals ``held_full``
    /// and ``hold_timeout``.
    fn session_admission<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let Some(s) = self.native.as_ref().ok_or_else(not_armed)?.session_admission() else {
            return Ok(None);
        };
        let d = PyDict::new(py);
        d.set_item("admitted", s.counters.admitted)?;
        d.set_item("moved", s.counters.moved)?;
        d.set_item("held", s.counters.held)?;
        d.set_item("released", s.counters.released)?;
        d.set_item("paused", s.counters.paused)?;
        d.set_item("holding", s.held)?;
        d.set_item("held_full", s.held_full)?;
        d.set_item("hold_timeout", s.hold_timeout)?;
        Ok(Some(d))
    }

    /// The port it listens on (the one the system chose for port 0).
    #[getter]
    fn port(&self) -> u16 {
        self.address.port()
    }

    /// What the door refused or cut so far: ``{kind: count}`` under the proxy's kind names.
    fn client_errors(&self) -> Vec<(&'static str, u64)> {
        self.inner.lock().map_or_else(
            |_| Vec::new(),
            |inner| inner.as_ref().map_or_else(Vec::new, Gateway::client_errors),
        )
    }

    /// Stops accepting, lets requests in flight finish (at most the drain time); idempotent.
    fn stop(&self, py: Python<'_>) {
        let gateway = self.inner.lock().map_or(None, |mut inner| inner.take());
        if let Some(mut gateway) = gateway {
            py.detach(move || gateway.stop());
        }
    }
}

/// The routing ids (native-endian u32s, an `array('I')`'s bytes) and the turn verdict the
/// gateway's native path would route a body posted to `path` on, or None when it would hand the
/// body to the app (`smetric_gateway::native::routing_ids`); with `tokens`, a chat template's.
#[pyfunction]
#[pyo3(signature = (path, raw, *, tokens = None, approx_chunk_bytes = None))]
pub(crate) fn gateway_routing_ids<'py>(
    py: Python<'py>,
    path: &str,
    raw: &[u8],
    tokens: Option<&Bound<'py, PyGatewayTokenSource>>,
    approx_chunk_bytes: Option<usize>,
) -> Option<(Bound<'py, pyo3::types::PyBytes>, Option<bool>)> {
    let source = tokens.map(|t| Arc::clone(&t.get().inner));
    let chunk = approx_chunk_bytes.unwrap_or(BYTE_CHUNK_BYTES).max(1);
    let (ids, first_turn) = py.detach(|| smetric_gateway::native::routing_ids(path, raw, source.as_deref(), chunk))?;
    Some((pyo3::types::PyBytes::new(py, &ids_bytes(&ids)), first_turn))
}

/// Token ids as an `array('I')`'s bytes (native-endian u32s).
fn ids_bytes(ids: &[u32]) -> Vec<u8> {
    ids.iter().flat_map(|id| id.to_ne_bytes()).collect()
}

/// A chat template's token source for the gateway (`smetric_gateway::tokens::TokenSource`): the
/// `tokenizer.json` (tokenizer mode; none: the rendered text's approximate ids), the chat
/// templates the control plane resolved (name, Jinja text, content format), the named special
/// tokens and the piece cache's bound. A tokenizer that does not load or a template that does
/// not compile is an `InvalidConfigError`.
#[pyclass(frozen, module = "smetric._core", name = "GatewayTokenSource")]
pub(crate) struct PyGatewayTokenSource {
    inner: Arc<TokenSource>,
}

#[pymethods]
impl PyGatewayTokenSource {
    #[new]
    #[pyo3(signature = (
        tokenizer, *, templates, special_tokens, piece_cache_bytes, approx_chunk_bytes = None
    ))]
    fn new(
        py: Python<'_>,
        tokenizer: Option<std::path::PathBuf>,
        templates: Vec<(String, String, String)>,
        special_tokens: Vec<(String, String)>,
        piece_cache_bytes: usize,
        approx_chunk_bytes: Option<usize>,
    ) -> PyResult<Self> {
        let approx_chunk_bytes = approx_chunk_bytes.unwrap_or(BYTE_CHUNK_BYTES);
        if approx_chunk_bytes == 0 {
            return Err(invalid_setting(py, "approx_chunk_bytes", "must be at least 1, got 0"));
        }
        let mut resolved = Vec::with_capacity(templates.len());
        for (name, source, format) in templates {
            let format = match format.as_str() {
                "string" => ContentFormat::String,
                "openai" => ContentFormat::OpenAi,
                other => {
                    return Err(invalid_setting(
                        py,
                        "content_format",
                        &format!("must be string or openai, got {other:?}"),
                    ));
                }
            };
            resolved.push((name, source, format));
        }
        let settings = TokenSettings {
            tokenizer,
            templates: resolved,
            special_tokens,
            piece_cache_bytes,
            approx_chunk_bytes,
        };
        let inner = py.detach(|| TokenSource::new(&settings)).map_err(|e| {
            let field = match e {
                SourceError::Tokenizer(_) => "tokenizer",
                SourceError::Template { .. } | SourceError::NoDefault => "chat_template",
            };
            invalid_setting(py, field, &e.to_string())
        })?;
        Ok(Self { inner: Arc::new(inner) })
    }

    /// Whether texts are encoded piece by piece (the tokenizer allows it and the probe agreed).
    #[getter]
    fn exact_pieces(&self) -> bool {
        self.inner.encoder().is_some_and(|e| e.exact_pieces)
    }

    /// `tokenizer` (the tokenizer's ids) or `approximate` (byte chunks of the rendered text).
    #[getter]
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }

    /// `text`'s ids (an `array('I')`'s bytes), with the tokenizer's special tokens when asked.
    #[pyo3(signature = (text, *, add_special_tokens = false))]
    fn encode<'py>(
        &self,
        py: Python<'py>,
        text: &str,
        add_special_tokens: bool,
    ) -> PyResult<Bound<'py, pyo3::types::PyBytes>> {
        let ids = py
            .detach(|| self.inner.text_ids(text, add_special_tokens))
            .map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
        Ok(pyo3::types::PyBytes::new(py, &ids_bytes(&ids)))
    }

    /// The piece cache's `hits`, `misses`, `pieces` and charged `bytes`.
    fn cache_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let stats = self.inner.encoder().map_or((0, 0, 0, 0), PiecewiseEncoder::cache_stats);
        cache_dict(py, stats, "pieces")
    }

    /// The message cache's `hits`, `misses`, `messages` (texts kept, of every API) and charged
    /// `bytes`.
    fn message_cache_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        cache_dict(py, self.inner.message_cache().stats(), "messages")
    }
}

/// A cache's figures as the stub types them: `hits`, `misses`, the entries under `entries`'
/// name, and the charged `bytes`.
fn cache_dict<'py>(
    py: Python<'py>,
    (hits, misses, kept, bytes): (u64, u64, usize, usize),
    entries: &str,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("hits", hits)?;
    d.set_item("misses", misses)?;
    d.set_item(entries, kept)?;
    d.set_item("bytes", bytes)?;
    Ok(d)
}
