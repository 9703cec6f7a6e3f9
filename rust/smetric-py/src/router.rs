//! `Router`, `Decision` and `IndexHits`: thin wrappers over `smetric_core::Router`.
//!
//! Per request: arguments are converted with the GIL held, then hashing, the index query,
//! scoring and bookkeeping run with the GIL released
//! (`py.detach`), so `route()` from many Python threads proceeds in parallel: hashing and the
//! index walk (under the core's shared index lock) overlap, and so do decisions (each commits
//! its load bump with a compare-and-swap; a write that moves blocks takes the exclusive lock or
//! is handed to its holder).
//!
//! The GIL, per call: taken once on the way in (the arguments), released for the whole core
//! call, taken once on the way out (the result), whatever the core does — except where the
//! release costs more than it frees: a prompt of at most [`HOLD_GIL_MAX_IDS`] ids is routed
//! with it held, and so is a lifecycle call (`on_prefilled`, `on_finished`, `on_aborted`,
//! O(1)) unless it may wait for a lock held for long (`Router::lifecycle_may_wait`: exact
//! mode's answer credit, the decode mask). No call holds it while waiting for more than
//! another call's O(1) work under a core lock, and the core never takes it. Token ids
//! in a contiguous, 8-byte-aligned int32/uint32 buffer are not copied: the core reads them in
//! place after the release, through atomic loads, checking them as it hashes
//! (`convert::InPlaceIds`; a 32K-token prompt 13.5 → 11.3 µs, BENCHMARKS.md "Token ids read in
//! place"). Any other buffer is copied with the GIL held (≈ 2 µs of `memcpy` for 128 KB, the
//! range check after the release); a list of ints costs one C-level conversion per element
//! (≈ 120 µs at 32K).

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use smetric_core::{
    BlockHash, DEFAULT_BLOCK_SIZE, HostPool, PeerLoad, PolicyKind, Prompt, RequestId, RouteRequest, Router,
    RouterConfig, SmetricError, Tier, TurnHint, first_turn_from_roles,
};

use crate::config::PyRouterConfig;
use crate::convert;
use crate::errors::{IntoPyResult, to_py};
use crate::names::NameStrings;

/// The outcome of :meth:`Router.route`.
#[pyclass(frozen, module = "smetric._core", name = "Decision")]
pub(crate) struct PyDecision {
    /// Name of the chosen instance.
    #[pyo3(get)]
    instance: Py<PyAny>,
    /// Whether the request was treated as the first turn of its session.
    #[pyo3(get)]
    first_turn: bool,
    /// Where ``first_turn`` came from: ``"hint"``, ``"messages"`` or ``"index"``.
    #[pyo3(get)]
    turn_source: &'static str,
    /// Prompt tokens already cached on the chosen instance's GPU.
    #[pyo3(get)]
    local_hit_tokens: u64,
    /// Prompt tokens available from the global KV$ tier.
    #[pyo3(get)]
    global_hit_tokens: u64,
    /// Prompt tokens held in the chosen instance's host pool (its own host memory, or a store
    /// it shares with its pool).
    #[pyo3(get)]
    host_hit_tokens: u64,
    /// Tokens the chosen instance is expected to prefill.
    #[pyo3(get)]
    prefill_tokens: u64,
    /// Prompt length in tokens.
    #[pyo3(get)]
    num_tokens: u64,
    /// Why the policy chose this instance.
    #[pyo3(get)]
    reason: &'static str,
    /// The request's id: the caller's (int or str) or one the router issued (int).
    #[pyo3(get)]
    request_id: Py<PyAny>,
    /// The policy that decided.
    #[pyo3(get)]
    policy: &'static str,
}

#[pymethods]
impl PyDecision {
    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!(
            "Decision(instance={}, first_turn={}, turn_source={:?}, local_hit_tokens={}, global_hit_tokens={}, \
             host_hit_tokens={}, prefill_tokens={}, num_tokens={}, reason={:?}, request_id={}, policy={:?})",
            self.instance.bind(py).repr()?,
            if self.first_turn { "True" } else { "False" },
            self.turn_source,
            self.local_hit_tokens,
            self.global_hit_tokens,
            self.host_hit_tokens,
            self.prefill_tokens,
            self.num_tokens,
            self.reason,
            self.request_id.bind(py).repr()?,
            self.policy,
        ))
    }
}

/// Index hits of a prompt on every instance (:meth:`Router.query`).
#[pyclass(frozen, module = "smetric._core", name = "IndexHits")]
pub(crate) struct PyIndexHits {
    /// Instance name → local hit tokens, in slot order.
    #[pyo3(get)]
    local: Py<PyDict>,
    /// Global-tier hit tokens.
    #[pyo3(get)]
    global_hit_tokens: u64,
    /// Instance name → hit tokens in its host pool, in slot order.
    #[pyo3(get)]
    host: Py<PyDict>,
    /// Deepest prefix any holder matched, in blocks.
    #[pyo3(get)]
    deepest_blocks: u32,
    /// Children of the deepest matched block (earlier requests that branched off there).
    #[pyo3(get)]
    branches: u32,
}

/// Routes requests of LLM-agent sessions to a fleet of vLLM instances.
#[pyclass(frozen, module = "smetric._core", name = "Router")]
pub(crate) struct PyRouter {
    inner: Arc<Router>,
    config: Py<PyRouterConfig>,
    /// The instances' names as Python strings, reused as the keys of every query's dicts.
    names: NameStrings,
}

/// Prompts of at most this many ids are routed with the GIL held. Releasing and re-taking it
/// cost ≈ 0.12 µs a call, a twelfth of a 1K-token route (`BENCHMARKS.md`, "Short prompts keep
/// the GIL"), and another Python thread gains nothing from the release: it waits for the
/// hand-off longer than for such a call (two threads routing 1K prompts went faster with it
/// held). numpy holds the GIL below a size for the same reason.
pub(crate) const HOLD_GIL_MAX_IDS: usize = 2048;

/// A router's constructor arguments checked: the policy parsed, the block size positive and
/// within `u32`, the configuration given or the default (shared by `Router` and `PdRouter`).
pub(crate) fn router_arguments(
    py: Python<'_>,
    policy: &str,
    block_size: i64,
    config: Option<Py<PyRouterConfig>>,
) -> PyResult<(PolicyKind, u32, Py<PyRouterConfig>)> {
    let kind = PolicyKind::parse(policy).py()?;
    let block_size = u32::try_from(block_size).ok().filter(|&b| b > 0).ok_or_else(|| {
        to_py(&SmetricError::InvalidBlockSize {
            block_size: block_size.max(0) as u64,
        })
    })?;
    let config = match config {
        Some(c) => c,
        None => Py::new(
            py,
            PyRouterConfig {
                inner: RouterConfig::default(),
            },
        )?,
    };
    Ok((kind, block_size, config))
}

/// Runs a lifecycle call of `router`, with the GIL held unless the call may wait for a lock
/// held for long ([`Router::lifecycle_may_wait`]). Such a call is O(1) (≈ 0.1–0.2 µs) and its
/// locks are held only for O(1) work by threads that never need the GIL, so the wait with it
/// held is short; releasing and re-taking it would cost about as much as the call, and a
/// second Python thread would be handed the GIL twice per call for nothing.
fn lifecycle_call<T: Send>(py: Python<'_>, router: &Router, call: impl FnOnce() -> T + Send) -> T {
    if router.lifecycle_may_wait() {
        py.detach(call)
    } else {
        call()
    }
}

/// A prompt as converted with the GIL held: owned, so it can cross `py.detach`, where
/// [`PromptArg::check`] finishes it.
pub(crate) enum PromptArg {
    Tokens(convert::TokenIds),
    InPlace(convert::InPlaceIds),
    Hashes(Vec<BlockHash>, Option<u64>),
}

impl PromptArg {
    /// The prompt of a call routed at `block_size` (a buffer of 4-byte ids may then be read in
    /// place).
    pub(crate) fn from_args(
        tokens: Option<&Bound<'_, PyAny>>,
        hashes: Option<&Bound<'_, PyAny>>,
        num_tokens: Option<u64>,
        block_size: u32,
    ) -> PyResult<Self> {
        match (tokens, hashes) {
            (Some(t), _) => Ok(match convert::prompt_tokens(t, block_size as usize)? {
                convert::PromptIds::InPlace(ids) => Self::InPlace(ids),
                convert::PromptIds::Copied(ids) => Self::Tokens(ids),
            }),
            (None, Some(h)) => Ok(Self::Hashes(convert::hashes(h)?, num_tokens)),
            (None, None) => Err(to_py(&SmetricError::MissingPrompt)),
        }
    }

    /// The checked prompt (token ids validated and narrowed; no GIL needed). Ids read in place
    /// are checked by the router as it hashes them.
    pub(crate) fn check(self) -> Result<OwnedPrompt, SmetricError> {
        Ok(match self {
            Self::InPlace(ids) => OwnedPrompt::InPlace(ids),
            Self::Tokens(ids) => OwnedPrompt::Tokens(ids.check()?),
            Self::Hashes(h, n) => OwnedPrompt::Hashes(h, n),
        })
    }

    /// Runs `f` on the checked prompt, with the GIL released unless the prompt is short
    /// ([`HOLD_GIL_MAX_IDS`]). A buffer read in place is released once the GIL is back (its
    /// release needs the GIL: inside, it would take it).
    pub(crate) fn detached<T: Send>(
        self,
        py: Python<'_>,
        f: impl FnOnce(Prompt<'_>) -> Result<T, SmetricError> + Send,
    ) -> PyResult<T> {
        let short = self.ids() <= HOLD_GIL_MAX_IDS;
        let run = move || match self.check() {
            Ok(prompt) => (f(prompt.borrow()), Some(prompt)),
            Err(e) => (Err(e), None),
        };
        let (result, prompt) = if short { run() } else { py.detach(run) };
        if let Some(OwnedPrompt::InPlace(ids)) = prompt {
            ids.release(py);
        }
        result.py()
    }

    /// The prompt's length in ids (a chain of hashes: its blocks, each counted as a default-size
    /// block of ids).
    fn ids(&self) -> usize {
        match self {
            Self::Tokens(ids) => ids.len(),
            Self::InPlace(ids) => ids.len(),
            Self::Hashes(hashes, _) => hashes.len().saturating_mul(smetric_core::DEFAULT_BLOCK_SIZE as usize),
        }
    }
}

/// A checked prompt, borrowed as the core's [`Prompt`].
pub(crate) enum OwnedPrompt {
    Tokens(Vec<u32>),
    InPlace(convert::InPlaceIds),
    Hashes(Vec<BlockHash>, Option<u64>),
}

impl OwnedPrompt {
    pub(crate) fn borrow(&self) -> Prompt<'_> {
        match self {
            Self::Tokens(t) => Prompt::Tokens(t),
            Self::InPlace(ids) => Prompt::Shared(ids.ids()),
            Self::Hashes(h, n) => Prompt::Hashes {
                hashes: h,
                num_tokens: *n,
            },
        }
    }
}

/// The turn hint of `route(turn=..., messages=...)`: the caller's turn, else the roles of the
/// messages, else nothing.
pub(crate) fn turn_hint(turn: Option<i64>, messages: Option<&Bound<'_, PyAny>>) -> PyResult<TurnHint> {
    Ok(match (turn, messages) {
        (Some(t), _) => TurnHint::Turn(u32::try_from(t).ok().filter(|&t| t >= 1).ok_or_else(|| {
            to_py(&SmetricError::InvalidArgument {
                argument: "turn",
                reason: format!("turns count from 1, got {t}"),
            })
        })?),
        (None, Some(m)) => {
            let roles = convert::roles(m)?;
            TurnHint::Messages {
                first_turn: first_turn_from_roles(roles.iter().map(String::as_str)),
            }
        }
        (None, None) => TurnHint::Unknown,
    })
}

/// The arguments `Router.route` and `PdRouter.route` share, converted with the GIL held; [`RouteArgs::run`]
/// checks the prompt and calls the core with the GIL released.
pub(crate) struct RouteArgs {
    prompt: PromptArg,
    hint: TurnHint,
    id: Option<RequestId>,
    namespace: Option<String>,
    now: Option<f64>,
    exclude: Vec<String>,
    previous_instance: Option<String>,
    session_key: Option<u64>,
    output_tokens: Option<u64>,
}

impl RouteArgs {
    /// The arguments of a call routed at `block_size`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        block_size: u32,
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
    ) -> PyResult<Self> {
        Ok(Self {
            prompt: PromptArg::from_args(tokens, hashes, num_tokens, block_size)?,
            hint: turn_hint(turn, messages)?,
            id: request_id.map(convert::request_id).transpose()?,
            namespace,
            now,
            exclude: exclude.unwrap_or_default(),
            previous_instance,
            session_key: session_key.map(convert::session_key).transpose()?,
            output_tokens: None,
        })
    }

    /// The same arguments with the request's recorded output length (the decode mask's oracle).
    pub(crate) fn with_output_tokens(mut self, output_tokens: Option<u64>) -> Self {
        self.output_tokens = output_tokens;
        self
    }

    /// Runs `route` on the checked request, without the GIL.
    pub(crate) fn run<T: Send>(
        self,
        py: Python<'_>,
        route: impl FnOnce(&RouteRequest<'_>) -> Result<T, SmetricError> + Send,
    ) -> PyResult<T> {
        let Self {
            prompt,
            hint,
            id,
            namespace,
            now,
            exclude,
            previous_instance,
            session_key,
            output_tokens,
        } = self;
        prompt.detached(py, move |prompt| {
            let exclude: Vec<&str> = exclude.iter().map(String::as_str).collect();
            route(&RouteRequest {
                prompt,
                namespace: namespace.as_deref(),
                turn: hint,
                request_id: id,
                now,
                exclude: &exclude,
                previous_instance: previous_instance.as_deref(),
                session_key,
                output_tokens,
            })
        })
    }
}

/// The request id a decision reports: the caller's own object when it gave one, else the id the
/// router issued.
pub(crate) fn reported_request_id(
    py: Python<'_>,
    given: Option<&Bound<'_, PyAny>>,
    issued: RequestId,
) -> PyResult<Py<PyAny>> {
    Ok(match given {
        Some(obj) => obj.clone().unbind(),
        None => issued.0.into_pyobject(py)?.into_any().unbind(),
    })
}

/// An instance's load counters as the ``InstanceLoad`` dict (the core's terse field names
/// `bs`, `running_e`, `waiting_e` spelled out).
pub(crate) fn load_dict<'py>(py: Python<'py>, l: &smetric_core::LoadSnapshot) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("batch_size", l.bs)?;
    d.set_item("waiting", l.waiting)?;
    d.set_item("queued", l.queued)?;
    d.set_item("queued_work", l.queued_work)?;
    d.set_item("active", l.active)?;
    d.set_item("drain_rate", l.drain_rate)?;
    d.set_item("fetch_cost", l.fetch_cost)?;
    d.set_item("engine_running", l.running_e)?;
    d.set_item("engine_waiting", l.waiting_e)?;
    d.set_item("kv_usage", l.kv_usage)?;
    Ok(d)
}

fn tier(name: &str) -> PyResult<Tier> {
    match name {
        "local" => Ok(Tier::Local),
        "global" => Ok(Tier::Global),
        "host" => Ok(Tier::Host),
        other => Err(to_py(&SmetricError::InvalidArgument {
            argument: "tier",
            reason: format!("{other:?} is not one of \"local\", \"global\", \"host\""),
        })),
    }
}

impl PyRouter {
    /// The core router, for the other binding modules (the KV-event ingestor feeds it directly).
    pub(crate) fn core(&self) -> &Arc<Router> {
        &self.inner
    }
}

#[pymethods]
impl PyRouter {
    #[new]
    #[pyo3(signature = (instances, *, policy = "smetric", block_size = i64::from(DEFAULT_BLOCK_SIZE), seed = 0, config = None))]
    fn new(
        py: Python<'_>,
        instances: Vec<String>,
        policy: &str,
        block_size: i64,
        seed: u64,
        config: Option<Py<PyRouterConfig>>,
    ) -> PyResult<Self> {
        let (kind, block_size, config) = router_arguments(py, policy, block_size, config)?;
        let inner = Router::new(&instances, kind, block_size, seed, config.get().inner.clone()).py()?;
        Ok(Self {
            inner: Arc::new(inner),
            config,
            names: NameStrings::default(),
        })
    }

    /// Chooses the instance for one request.
    #[pyo3(signature = (tokens = None, *, hashes = None, num_tokens = None, messages = None, turn = None, request_id = None, namespace = None, now = None, exclude = None, previous_instance = None, session_key = None, output_tokens = None))]
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
        output_tokens: Option<u64>,
    ) -> PyResult<PyDecision> {
        let args = RouteArgs::new(
            self.inner.block_size(),
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
        )?
        .with_output_tokens(output_tokens);
        let inner = &self.inner;
        let decision = args.run(py, |req| inner.route(req))?;
        let request_id = reported_request_id(py, request_id, decision.request_id)?;
        Ok(PyDecision {
            // A new string, not `self.names`' shared one: see `names.rs` for what that cost.
            instance: decision.instance_name.as_ref().into_pyobject(py)?.into_any().unbind(),
            first_turn: decision.first_turn,
            turn_source: decision.turn_source.name(),
            local_hit_tokens: decision.local_hit_tokens,
            global_hit_tokens: decision.global_hit_tokens,
            host_hit_tokens: decision.host_hit_tokens,
            prefill_tokens: decision.prefill_tokens,
            num_tokens: decision.num_tokens,
            reason: decision.reason.name(),
            request_id,
            policy: inner.policy().name(),
        })
    }

    /// Prefix hits of a prompt on every instance and in the global tier; changes nothing.
    #[pyo3(signature = (tokens = None, *, hashes = None, num_tokens = None, namespace = None, now = None))]
    fn query(
        &self,
        py: Python<'_>,
        tokens: Option<&Bound<'_, PyAny>>,
        hashes: Option<&Bound<'_, PyAny>>,
        num_tokens: Option<u64>,
        namespace: Option<String>,
        now: Option<f64>,
    ) -> PyResult<PyIndexHits> {
        let inner = &self.inner;
        let prompt = PromptArg::from_args(tokens, hashes, num_tokens, inner.block_size())?;
        let hits = prompt.detached(py, |prompt| inner.query(prompt, namespace.as_deref(), now))?;
        let local = PyDict::new(py);
        for (name, tokens) in &hits.local {
            local.set_item(self.names.get(py, name), tokens)?;
        }
        let host = PyDict::new(py);
        for (name, tokens) in &hits.host {
            host.set_item(self.names.get(py, name), tokens)?;
        }
        Ok(PyIndexHits {
            local: local.unbind(),
            global_hit_tokens: hits.global_hit_tokens,
            host: host.unbind(),
            deepest_blocks: hits.deepest_blocks,
            branches: hits.branches,
        })
    }

    /// The request's prefill is done (first token out), at ``now`` (the router's clock when absent).
    #[pyo3(signature = (request_id, now = None))]
    fn on_prefilled(&self, py: Python<'_>, request_id: &Bound<'_, PyAny>, now: Option<f64>) -> PyResult<bool> {
        let (id, inner) = (convert::request_id(request_id)?, &self.inner);
        lifecycle_call(py, inner, || inner.on_prefilled_at(id, now)).py()
    }

    /// The request finished, having generated ``output_tokens`` tokens, at ``now``.
    #[pyo3(signature = (request_id, output_tokens = 0, now = None))]
    fn on_finished(
        &self,
        py: Python<'_>,
        request_id: &Bound<'_, PyAny>,
        output_tokens: u64,
        now: Option<f64>,
    ) -> PyResult<bool> {
        let (id, inner) = (convert::request_id(request_id)?, &self.inner);
        lifecycle_call(py, inner, || inner.on_finished_at(id, output_tokens, now)).py()
    }

    /// The request was aborted.
    fn on_aborted(&self, py: Python<'_>, request_id: &Bound<'_, PyAny>) -> PyResult<bool> {
        let (id, inner) = (convert::request_id(request_id)?, &self.inner);
        Ok(lifecycle_call(py, inner, || inner.on_aborted(id)))
    }

    /// Adds an instance to the fleet.
    fn add_instance(&self, name: &str) -> PyResult<()> {
        self.inner.add_instance(name).py().map(|_| ())
    }

    /// Removes an instance from the fleet, with its index entries and load.
    fn remove_instance(&self, name: &str) -> PyResult<()> {
        self.inner.remove_instance(name).py()
    }

    /// Stores an engine load snapshot (e.g. scraped from vLLM's ``/metrics``).
    #[pyo3(signature = (instance, *, running = None, waiting = None, kv_usage = None, now = None))]
    fn update_load(
        &self,
        instance: &str,
        running: Option<u64>,
        waiting: Option<u64>,
        kv_usage: Option<f64>,
        now: Option<f64>,
    ) -> PyResult<()> {
        self.inner.update_load(instance, running, waiting, kv_usage, now).py()
    }

    /// Replaces the in-flight work peer router replicas have on ``instance`` (the sum of their
    /// own boards' counters, from their last snapshots on the replica bus); decisions add it to
    /// this router's own counts. ``load()`` keeps showing this router's own counters.
    #[pyo3(signature = (instance, *, batch_size = 0, waiting = 0, queued = 0, queued_work = 0, active = 0))]
    fn set_peer_load(
        &self,
        instance: &str,
        batch_size: u64,
        waiting: u64,
        queued: u64,
        queued_work: u64,
        active: u64,
    ) -> PyResult<()> {
        let peers = PeerLoad {
            bs: batch_size,
            waiting,
            queued,
            queued_work,
            active,
        };
        self.inner.set_peer_load(instance, peers).py()
    }

    /// The peers' in-flight work on ``instance`` as last set: a dict of ``batch_size``,
    /// ``waiting``, ``queued``, ``queued_work`` and ``active``.
    fn peer_load<'py>(&self, py: Python<'py>, instance: &str) -> PyResult<Bound<'py, PyDict>> {
        let p = self.inner.peer_load(instance).py()?;
        let d = PyDict::new(py);
        d.set_item("batch_size", p.bs)?;
        d.set_item("waiting", p.waiting)?;
        d.set_item("queued", p.queued)?;
        d.set_item("queued_work", p.queued_work)?;
        d.set_item("active", p.active)?;
        Ok(d)
    }

    /// Records that ``instance`` (or the global tier) holds ``hashes``, a run continuing ``parent``.
    #[pyo3(signature = (instance, hashes, tier = "local", *, parent = None, now = None))]
    fn store_blocks(
        &self,
        py: Python<'_>,
        instance: Option<&str>,
        hashes: &Bound<'_, PyAny>,
        tier: &str,
        parent: Option<u64>,
        now: Option<f64>,
    ) -> PyResult<()> {
        let hashes = convert::hashes(hashes)?;
        let tier = self::tier(tier)?;
        let inner = &self.inner;
        py.detach(|| inner.store_blocks(instance, tier, &hashes, parent.map(BlockHash), now))
            .py()
    }

    /// Records that ``instance`` (or the global tier) dropped ``hashes``.
    #[pyo3(signature = (instance, hashes, tier = "local"))]
    fn remove_blocks(
        &self,
        py: Python<'_>,
        instance: Option<&str>,
        hashes: &Bound<'_, PyAny>,
        tier: &str,
    ) -> PyResult<()> {
        let hashes = convert::hashes(hashes)?;
        let tier = self::tier(tier)?;
        let inner = &self.inner;
        py.detach(|| inner.remove_blocks(instance, tier, &hashes)).py()
    }

    /// Drops everything ``instance`` (or, with ``tier="global"``, the global tier; with
    /// ``tier="host"``, ``instance``'s host pool) holds.
    #[pyo3(signature = (instance = None, tier = "local"))]
    fn clear(&self, instance: Option<&str>, tier: &str) -> PyResult<()> {
        self.inner.clear(instance, self::tier(tier)?).py()
    }

    /// Puts ``instance``'s non-GPU KV$ in a host pool: its own host memory (``pool=None``, the
    /// default: credited to it alone) or a store shared with every instance given the same
    /// ``pool`` name (a node-local store).
    #[pyo3(signature = (instance, pool = None))]
    fn set_host_pool(&self, py: Python<'_>, instance: &str, pool: Option<&str>) -> PyResult<()> {
        let pool = match pool {
            None => HostPool::Own,
            Some("") => {
                return Err(to_py(&SmetricError::InvalidArgument {
                    argument: "pool",
                    reason: "a shared pool's name must not be empty".to_owned(),
                }));
            }
            Some(name) => HostPool::Shared(Arc::from(name)),
        };
        let inner = &self.inner;
        py.detach(|| inner.set_host_pool(instance, &pool)).py()
    }

    /// ``instance``'s shared host pool's name; None for its own host memory (or when host tiers
    /// are off, ``host_capacity_blocks=0``).
    fn host_pool(&self, instance: &str) -> PyResult<Option<String>> {
        Ok(match self.inner.host_pool(instance).py()? {
            Some(HostPool::Shared(name)) => Some(name.to_string()),
            Some(HostPool::Own) | None => None,
        })
    }

    /// The load counters of one instance (keys: ``InstanceLoad`` in ``_core.pyi``; the core's
    /// terse field names `bs`, `running_e`, `waiting_e` are spelled out here).
    fn load<'py>(&self, py: Python<'py>, instance: &str) -> PyResult<Bound<'py, PyDict>> {
        load_dict(py, &self.inner.load(instance).py()?)
    }

    /// The chained block hashes this router computes for ``tokens``.
    #[pyo3(signature = (tokens, namespace = None))]
    fn hash_tokens(&self, py: Python<'_>, tokens: &Bound<'_, PyAny>, namespace: Option<String>) -> PyResult<Vec<u64>> {
        let tokens = convert::checked_tokens(tokens)?;
        let inner = &self.inner;
        Ok(py.detach(|| {
            inner
                .hash_tokens(&tokens, namespace.as_deref())
                .into_iter()
                .map(|h| h.0)
                .collect()
        }))
    }

    /// Counters of decisions, lifecycle events and the index.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        // Without the GIL: the index's shared lock can wait behind a route's commit, and a
        // thread waiting there with the GIL would stall every other router thread.
        let inner = &self.inner;
        let s = py.detach(|| inner.stats());
        let d = PyDict::new(py);
        d.set_item("routed", s.routed)?;
        d.set_item("first_turns", s.first_turns)?;
        let reasons = PyDict::new(py);
        for (r, c) in &s.reasons {
            reasons.set_item(*r, c)?;
        }
        d.set_item("reasons", reasons)?;
        d.set_item("unknown_request_events", s.unknown_request_events)?;
        d.set_item("in_flight", s.in_flight)?;
        d.set_item("output_tokens", s.output_tokens)?;
        d.set_item("random_draws", s.draws)?;
        d.set_item("decision_retries", s.decision_retries)?;
        d.set_item("index_entries", s.index.entries)?;
        let local = PyDict::new(py);
        for (name, blocks) in &s.local_blocks {
            local.set_item(name.as_ref(), blocks)?;
        }
        d.set_item("index_local_blocks", local)?;
        d.set_item("index_global_blocks", s.index.global_blocks)?;
        let host = PyDict::new(py);
        for ((name, _), blocks) in s.local_blocks.iter().zip(&s.host_blocks) {
            host.set_item(name.as_ref(), blocks)?;
        }
        d.set_item("index_host_blocks", host)?;
        d.set_item("index_evictions", s.index.evictions)?;
        d.set_item("index_bytes", s.index_bytes)?;
        let breakdown = PyDict::new(py);
        for (component, bytes) in &s.index_breakdown {
            breakdown.set_item(*component, bytes)?;
        }
        d.set_item("index_breakdown", breakdown)?;
        Ok(d)
    }

    /// Live instance names, in slot order.
    #[getter]
    fn instances<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        PyList::new(py, self.inner.instances().iter().map(AsRef::<str>::as_ref))
    }

    /// The policy's name.
    #[getter]
    fn policy(&self) -> &'static str {
        self.inner.policy().name()
    }

    /// Tokens per block.
    #[getter]
    fn block_size(&self) -> u32 {
        self.inner.block_size()
    }

    /// The router's configuration.
    #[getter]
    fn config(&self, py: Python<'_>) -> Py<PyRouterConfig> {
        self.config.clone_ref(py)
    }

    fn __repr__(&self) -> String {
        format!(
            "Router(policy={:?}, instances={}, block_size={})",
            self.inner.policy().name(),
            self.inner.instances().len(),
            self.inner.block_size()
        )
    }
}
