//! The native path's state and its configuration: what the control plane arms it with
//! ([`NativeConfig`]), the fleet as the control plane sees it ([`FleetView`]), the state every
//! connection shares ([`Native`]: the router, the engines' client, the door's admission, the
//! session gate, the records for the app) and the handles the control plane keeps
//! ([`NativeHandles`]). No request logic here: that is `forward.rs`.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use smetric_core::{PdRouter, PolicyKind, Router};

use super::engines::Engines;
use super::response_ids::ResponseIds;
use crate::admission::{Admission, AdmissionLimits};
use crate::records::Records;
use crate::session_gate::{SessionGate, SessionGateConfig, SessionGateSnapshot};
use crate::session_table::SessionTable;
use crate::tokens::TokenSource;

/// What the control plane arms the native path with (no defaults here: `smetric serve`'s
/// configuration has them). Cloned once when the gateway starts (the router is shared).
#[derive(Clone)]
pub struct NativeConfig {
    /// The router the app routes on too.
    pub routing: Routing,
    /// Proves to the app that a request came from this gateway.
    pub secret: String,
    /// Client keys; empty: the proxy is open.
    pub client_keys: Vec<String>,
    /// The key every call to an engine carries, if any.
    pub upstream_key: Option<String>,
    pub max_body_bytes: usize,
    pub body_timeout: Duration,
    pub connect_timeout: Duration,
    pub first_byte_timeout: Duration,
    pub idle_timeout: Duration,
    /// A request's whole time in the proxy (504, or an error event once its stream started).
    pub client_timeout: Duration,
    pub admission: AdmissionLimits,
    /// The APIs served natively.
    pub apis: NativeApis,
    /// A cut stream is continued (by the app) rather than ended with an error event.
    pub resume_streams: bool,
    /// Attempts per request at most (`failover.rs`: each on another instance).
    pub max_attempts: u32,
    /// Charged failures in a row that eject an instance (`failover.rs`).
    pub eject_after: u32,
    /// The key the app issues and opens its response ids with (`pinning.ResponseIds`).
    pub response_id_key: String,
    /// The core reason → label table of `smetric.serve.labels`.
    pub labels: HashMap<String, String>,
    /// Records kept for the control plane at most.
    pub max_records: usize,
    /// Session admission after the router's decision (`None`: off).
    pub session_gate: Option<SessionGateConfig>,
    /// The source of a chat template's ids (`None`: plain ChatML's approximate ids).
    pub tokens: Option<Arc<TokenSource>>,
    /// `--tokens ids`: only a prompt of token ids is routed; the app refuses the rest (400).
    pub ids_only: bool,
    /// The bytes per approximate id of plain ChatML and text prompts (`approx_chunk_bytes`: 4,
    /// the fake engine's ids, or the CRC-32 of chunks of any other size).
    pub approx_chunk_bytes: usize,
    /// The proxy's session table, the app's own (turns, homes; ended sessions dropped).
    pub sessions: Arc<SessionTable>,
    /// The parent rule's margin (`parent_affinity_margin`) when sub-agents start at their
    /// parent's home (`parent_affinity`, co-located mode); `None`: off.
    pub parent_affinity_margin: Option<u64>,
}

/// The router the native path decides with: the co-located one, or the PD router over a prefill
/// and a decode pool (`native/pd.rs`). Shared with the control plane, which feeds it.
#[derive(Clone)]
pub enum Routing {
    Colocated(Arc<Router>),
    Pd(Arc<PdRouter>),
}

impl Routing {
    /// The router an engine's load snapshot feeds (the prefill pool's, for PD: a PD router's
    /// decode choice reads its own board).
    #[must_use]
    pub fn load_router(&self) -> &Router {
        match self {
            Self::Colocated(router) => router,
            Self::Pd(pd) => pd.prefill(),
        }
    }

    /// The policy's name (the prefill side's, for PD).
    pub(crate) fn policy_name(&self) -> &'static str {
        self.policy().name()
    }

    /// The policy (the prefill side's, for PD).
    fn policy(&self) -> PolicyKind {
        match self {
            Self::Colocated(router) => router.policy(),
            Self::Pd(pd) => pd.prefill().policy(),
        }
    }

    /// Whether the policy reads and sets llm-d's session cookie (`llmd_session_affinity`).
    pub(crate) fn session_cookie(&self) -> bool {
        self.policy() == PolicyKind::LlmdSessionAffinity
    }

    /// Whether the policy hashes the request's session key (vllm-router's `consistent_hash` and
    /// `rendezvous_hash`: the header session hint, else the prompt).
    pub(crate) fn hashes_session(&self) -> bool {
        matches!(self.policy(), PolicyKind::ConsistentHash | PolicyKind::RendezvousHash)
    }

    /// The pools the per-instance cap is applied in, each on its own: the fleet's instances
    /// (co-located), or the prefill and the decode pool.
    pub(crate) fn pools(&self, instances: &[String]) -> Vec<Vec<String>> {
        match self {
            Self::Colocated(_) => vec![instances.to_vec()],
            Self::Pd(pd) => {
                let names = |pool: Vec<Arc<str>>| pool.iter().map(ToString::to_string).collect();
                vec![names(pd.prefill().instances()), names(pd.decode_instances())]
            }
        }
    }

    /// The pools the fleet's exclusions keep an instance in each of (PD: prefill and decode);
    /// None: the fleet is one pool (co-located).
    pub(crate) fn exclusion_pools(&self, instances: &[String]) -> Option<Vec<Vec<String>>> {
        match self {
            Self::Colocated(_) => None,
            Self::Pd(_) => Some(self.pools(instances)),
        }
    }

    /// Requests in flight on `instance` as the router counts them (PD: on either pool).
    pub(crate) fn in_flight(&self, instance: &str) -> Option<u64> {
        match self {
            Self::Colocated(router) => router.load(instance).ok().map(|l| l.bs),
            Self::Pd(pd) => {
                (pd.prefill().load(instance).ok().map(|l| l.bs)).or_else(|| pd.decode_load(instance).ok().map(|l| l.bs))
            }
        }
    }
}

/// The APIs the native path serves (the rest are delegated).
#[derive(Clone, Copy, Debug, Default)]
#[allow(clippy::struct_excessive_bools)] // one switch per API, each read on its own
pub struct NativeApis {
    /// Chat (approximate ChatML routing ids, or the tokenizer's of the model's template).
    pub chat: bool,
    /// Completions (token ids, or the approximate ids of a text prompt).
    pub completions: bool,
    /// Anthropic Messages (the approximate ChatML ids of its chat conversion).
    pub messages: bool,
    /// OpenAI Responses that name no stored response (the approximate ChatML ids of its input).
    pub responses: bool,
}

/// The fleet as the control plane sees it now; replaced whole on every change.
#[derive(Clone, Debug, Default)]
pub struct FleetView {
    /// Every instance, in the fleet's order.
    pub instances: Vec<String>,
    /// Instances ejected after failures (a last resort only).
    pub ejected: HashSet<String>,
    /// Model id → the instances serving it (empty: models unknown, every request passes).
    pub models: HashMap<String, HashSet<String>>,
    /// LoRA adapters (each routed in its own cache namespace, `smetric_vllm::cache_namespace`).
    pub adapters: HashSet<String>,
}

impl FleetView {
    /// Instances an attempt for `model` must skip (the app's `Fleet.exclusions`), or None
    /// when none is left. `pools`: the pools each of which must keep an instance (PD: prefill
    /// and decode; ejected ones a last resort per pool); None: the fleet is one pool.
    pub(crate) fn exclusions(
        &self,
        model: Option<&str>,
        failed: &[String],
        pools: Option<&[Vec<String>]>,
    ) -> Option<Vec<String>> {
        let serving = model.and_then(|m| self.models.get(m));
        let eligible: Vec<&String> = self
            .instances
            .iter()
            .filter(|u| !failed.contains(u) && serving.is_none_or(|s| s.contains(*u)))
            .collect();
        if eligible.is_empty() {
            return None;
        }
        let groups: Vec<Vec<&String>> = match pools {
            None => vec![eligible],
            Some(pools) => pools
                .iter()
                .map(|pool| eligible.iter().copied().filter(|u| pool.contains(u)).collect())
                .collect(),
        };
        let mut chosen: HashSet<&String> = HashSet::new();
        for group in groups {
            if group.is_empty() {
                return None;
            }
            let healthy: Vec<&String> = group.iter().copied().filter(|u| !self.ejected.contains(*u)).collect();
            // Ejected instances are a last resort: better a try than a refusal.
            chosen.extend(if healthy.is_empty() { group } else { healthy });
        }
        Some(self.instances.iter().filter(|u| !chosen.contains(u)).cloned().collect())
    }

    /// Instances not ejected (at least one counts: admission's capacity rule).
    pub(crate) fn live(&self) -> usize {
        self.instances.iter().filter(|u| !self.ejected.contains(*u)).count()
    }
}

/// Consecutive charged failures per instance, for ejection (`failover.rs` counts them).
#[derive(Default)]
pub(crate) struct Health {
    /// Whether any instance has a count above zero (the success path's shortcut).
    pub(super) outstanding: AtomicBool,
    pub(super) failures: Mutex<HashMap<String, u32>>,
}

impl Health {
    /// Forgets the counts of instances `fleet` has and `old` had ejected no longer (re-admitted
    /// by the app's probes) or does not have at all.
    pub(crate) fn readmitted(&self, old: &FleetView, fleet: &FleetView) {
        if !self.outstanding.load(Ordering::Relaxed) {
            return;
        }
        let mut failures = self.failures.lock().unwrap_or_else(PoisonError::into_inner);
        failures.retain(|u, _| {
            let readmitted = old.ejected.contains(u) && !fleet.ejected.contains(u);
            fleet.instances.contains(u) && !readmitted
        });
        self.outstanding.store(!failures.is_empty(), Ordering::Relaxed);
    }
}

/// The native path's state, shared by every connection.
pub(crate) struct Native {
    pub(crate) config: NativeConfig,
    pub(crate) response_ids: Arc<ResponseIds>,
    pub(crate) fleet: RwLock<Arc<FleetView>>,
    pub(crate) admission: Arc<Admission>,
    pub(crate) records: Arc<Records>,
    pub(crate) engines: Engines,
    pub(crate) gate: Option<Arc<SessionGate>>,
    /// Failures in a row per instance, for ejection (`failover.rs`).
    pub(crate) health: Health,
}

impl Native {
    /// # Errors
    /// The engines' TLS configuration could not be built.
    pub(crate) fn new(
        config: NativeConfig,
        fleet: FleetView,
        admission: Arc<Admission>,
        records: Arc<Records>,
    ) -> Result<Self, rustls::Error> {
        let engines = Engines::new(config.connect_timeout)?;
        let gate = config.session_gate.map(SessionGate::new);
        if let Some(gate) = &gate {
            gate.set_instances(&fleet.instances);
        }
        Ok(Self {
            response_ids: Arc::new(ResponseIds::new(&config.response_id_key)),
            gate,
            config,
            fleet: RwLock::new(Arc::new(fleet)),
            admission,
            records,
            engines,
            health: Health::default(),
        })
    }

    pub(crate) fn fleet(&self) -> Arc<FleetView> {
        Arc::clone(&self.fleet.read().unwrap_or_else(PoisonError::into_inner))
    }
}

/// The shared handles `Gateway` keeps to talk to the native path from the control plane.
#[derive(Clone)]
pub struct NativeHandles {
    pub(crate) native: Arc<Native>,
}

impl NativeHandles {
    /// Every record queued since the last call, oldest first.
    pub fn take_records(&self) -> Vec<crate::records::Record> {
        self.native.records.take()
    }

    /// The descriptor that turns readable when records wait ([`crate::records::Records::bell_fd`]).
    pub fn records_bell_fd(&self) -> std::os::fd::RawFd {
        self.native.records.bell_fd()
    }

    /// Records dropped because the control plane did not take them in time.
    pub fn records_dropped(&self) -> u64 {
        self.native.records.dropped()
    }

    /// The admission's state, for `/metrics`.
    pub fn admission(&self) -> crate::admission::AdmissionSnapshot {
        self.native.admission.snapshot()
    }

    /// Ends session `key` at the session gate (the app's end endpoint; the table is shared):
    /// its residency is released. Nothing when session admission is off.
    pub fn end_session(&self, key: &str) {
        if let Some(gate) = &self.native.gate {
            gate.end(SessionGate::session_key(key));
        }
    }

    /// The session admission's state, for `/metrics` (`None`: off).
    pub fn session_admission(&self) -> Option<SessionGateSnapshot> {
        self.native.gate.as_ref().map(|gate| gate.snapshot())
    }

    /// Requests holding an admission slot now.
    pub fn admitted(&self) -> usize {
        self.native.admission.admitted()
    }

    /// Replaces the fleet view (and the admission's live-instance count).
    pub fn set_fleet(&self, fleet: FleetView) {
        let live = fleet.live();
        if let Some(gate) = &self.native.gate {
            gate.set_instances(&fleet.instances);
        }
        let mut view = self.native.fleet.write().unwrap_or_else(PoisonError::into_inner);
        self.native.health.readmitted(&view, &fleet);
        *view = Arc::new(fleet);
        self.native.admission.set_live(live);
    }
}
