//! Session admission at the door: the core's `session_admission` stage between the router's
//! decision and the engine, for the requests the gateway serves natively (issue 35 item 2).
//!
//! **Algorithm.** A request that names a session is routed as usual; the stage then admits it
//! where the policy sent it (pausing that instance's idle sessions if their KV would not fit),
//! places it on another instance with room and a source no dearer than the policy's (mode
//! `smetric`), or holds it. A placement elsewhere gives the policy's decision back
//! (`on_aborted`) and routes again pinned to the stage's instance. A held request gives its
//! decision back too and waits in the hold queue until any gated request finishes (every
//! finish wakes every holder, which routes and asks the stage again) or its longest hold
//! (`max_hold`, the stage's `max_hold_s`) has passed, when the stage admits it where its policy
//! sends it; at most `hold_timeout` and never past the request's own deadline. A request
//! without a session key passes untouched (the stage's rule).
//!
//! **Refusals.** At most `max_held` requests wait at once: one more is refused at once
//! ([`GateRefusal::HeldFull`], a 429 in the API's error shape); a wait that outlives
//! `hold_timeout` is refused with [`GateRefusal::HoldTimeout`] (503). Both carry
//! `Retry-After`. A refused request was never sent to an engine and left nothing in the
//! router (its decisions were given back) or in the stage (a hold changes no state).
//!
//! **Invariants.** Every request the stage admitted ends in exactly one [`SessionGate::finished`]
//! (the forwarder's lifecycle calls it on every path, a dropped future included), so a
//! session's in-flight count there returns to zero; `held()` is exactly the requests waiting
//! now (a guard gives the place back on every exit). Memory: the stage's tables are bounded
//! by `max_sessions_per_instance` per instance, the hold queue by `max_held` waiters.
//!
//! **Complexity.** One mutex around the stage, held for `decide` (O(R) residents, O(N · R)
//! when a move is priced) or `on_finished` (O(R)); a wake-up costs each holder one route.

use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use smetric_core::session_admission::{
    self, Admission, AdmissionConfig, AdmissionCounters, AdmissionMode, AdmitRequest, SessionAdmission,
};
use smetric_core::{Decision, RouteRequest, Router, SmetricError};
use tokio::sync::Notify;

/// The gate's settings (no defaults here: `smetric serve`'s configuration has them).
#[derive(Clone, Copy, Debug)]
pub struct SessionGateConfig {
    /// `pause` or `smetric` (`off` arms no gate).
    pub mode: AdmissionMode,
    /// One instance's KV capacity, tokens.
    pub capacity_tokens: u64,
    /// Requests that may wait at once.
    pub max_held: usize,
    /// The longest wait before a refusal.
    pub hold_timeout: Duration,
    /// The longest hold before the stage admits the request where its policy sends it
    /// (`None`: the mode's own, `AdmissionMode::default_max_hold_s`).
    pub max_hold: Option<Duration>,
    /// The `Retry-After` of a refusal, in seconds.
    pub retry_after_s: u64,
}

/// Why a held request was not served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GateRefusal {
    /// `max_held` requests already wait (429).
    HeldFull,
    /// Its wait outlived `hold_timeout` (503).
    HoldTimeout,
}

impl GateRefusal {
    /// The metric's label.
    pub fn reason(self) -> &'static str {
        match self {
            Self::HeldFull => "held_full",
            Self::HoldTimeout => "hold_timeout",
        }
    }

    /// The HTTP status of the refusal.
    pub fn status(self) -> u16 {
        match self {
            Self::HeldFull => 429,
            Self::HoldTimeout => 503,
        }
    }
}

/// What `/metrics` shows of the gate.
#[derive(Clone, Copy, Debug, Default)]
pub struct SessionGateSnapshot {
    /// The stage's decision counters.
    pub counters: AdmissionCounters,
    /// Requests waiting now.
    pub held: usize,
    /// Refusals, per reason.
    pub held_full: u64,
    pub hold_timeout: u64,
}

/// The stage's answer, with the instance named.
enum Verdict {
    Admit,
    Elsewhere(Arc<str>),
    Hold,
}

/// The stage and the instance slots it is indexed by (names as the router gives them).
struct Stage {
    admission: SessionAdmission,
    slots: HashMap<Arc<str>, u32>,
    names: Vec<Arc<str>>,
}

impl Stage {
    fn slot(&mut self, name: &Arc<str>) -> u32 {
        if let Some(&slot) = self.slots.get(name) {
            return slot;
        }
        let slot = self.names.len() as u32;
        self.names.push(Arc::clone(name));
        self.slots.insert(Arc::clone(name), slot);
        self.admission.ensure_instances(slot + 1);
        slot
    }
}

/// The session-admission gate of the native path.
pub struct SessionGate {
    config: SessionGateConfig,
    stage: Mutex<Stage>,
    finished: Notify,
    held: AtomicUsize,
    held_full: AtomicU64,
    hold_timeout: AtomicU64,
    started: Instant,
}

/// Gives a held request's place in the hold queue back on every exit.
struct HeldPlace<'a>(&'a AtomicUsize);

impl Drop for HeldPlace<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl SessionGate {
    /// A gate in `config.mode` (`pause` or `smetric`).
    pub fn new(config: SessionGateConfig) -> Arc<Self> {
        let mut admission = AdmissionConfig::new(config.mode, config.capacity_tokens);
        if let Some(hold) = config.max_hold {
            admission.max_hold_s = hold.as_secs_f64();
        }
        Arc::new(Self {
            config,
            stage: Mutex::new(Stage {
                admission: SessionAdmission::new(0, admission),
                slots: HashMap::new(),
                names: Vec::new(),
            }),
            finished: Notify::new(),
            held: AtomicUsize::new(0),
            held_full: AtomicU64::new(0),
            hold_timeout: AtomicU64::new(0),
            started: Instant::now(),
        })
    }

    /// Gives every instance of the fleet its slot (the control plane's fleet view, at start and
    /// on every change): a move is priced over every instance, not only those chosen so far.
    /// A slot outlives its instance (a returning instance keeps it; the table is bounded by
    /// the names the fleet ever had).
    pub fn set_instances(&self, instances: &[String]) {
        let mut guard = self.lock();
        for name in instances {
            if !guard.slots.contains_key(name.as_str()) {
                guard.slot(&Arc::from(name.as_str()));
            }
        }
    }

    /// The settings.
    pub fn config(&self) -> &SessionGateConfig {
        &self.config
    }

    /// The stage's key of a session id (the same for every replica built from this code).
    pub fn session_key(session: &str) -> u64 {
        BuildHasherDefault::<DefaultHasher>::default().hash_one(session)
    }

    fn lock(&self) -> MutexGuard<'_, Stage> {
        self.stage.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn now(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// Routes `request` of `session` (`prompt_tokens` long) through the stage: the decision
    /// to serve it on, a refusal, or the router's error. Waits while the stage holds it, until
    /// `deadline` at most.
    pub async fn route(
        &self,
        router: &Router,
        request: &RouteRequest<'_>,
        session: u64,
        prompt_tokens: u64,
        deadline: tokio::time::Instant,
    ) -> Result<Result<Decision, SmetricError>, GateRefusal> {
        let mut place: Option<HeldPlace<'_>> = None;
        let give_up = deadline.min(tokio::time::Instant::now() + self.config.hold_timeout);
        // When the stage first held this request (its clock), and when it will admit it anyway.
        let mut held_since: Option<f64> = None;
        let mut release: Option<tokio::time::Instant> = None;
        loop {
            // Registered before the decision, so a finish between the two is not missed.
            let woken = self.finished.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            let decision = match router.route(request) {
                Ok(decision) => decision,
                Err(e) => return Ok(Err(e)),
            };
            match self.decide(router, request, &decision, session, prompt_tokens, &mut held_since) {
                Verdict::Admit => return Ok(Ok(decision)),
                Verdict::Elsewhere(instance) => {
                    router.on_aborted(decision.request_id);
                    let fleet = router.instances();
                    let others: Vec<&str> = fleet
                        .iter()
                        .filter(|name| ***name != *instance)
                        .map(|name| &**name)
                        .collect();
                    let pinned = RouteRequest {
                        exclude: &others,
                        ..*request
                    };
                    let moved = router.route(&pinned);
                    if moved.is_err() {
                        // The instance left the fleet in between: the session is not there.
                        self.finished(session, &instance, prompt_tokens);
                    }
                    return Ok(moved);
                }
                Verdict::Hold => {
                    router.on_aborted(decision.request_id);
                    if place.is_none() {
                        if self.held.fetch_add(1, Ordering::AcqRel) >= self.config.max_held {
                            self.held.fetch_sub(1, Ordering::AcqRel);
                            self.held_full.fetch_add(1, Ordering::Relaxed);
                            return Err(GateRefusal::HeldFull);
                        }
                        place = Some(HeldPlace(&self.held));
                        release = held_since
                            .and_then(|t| self.lock().admission.release_at(t))
                            .map(|t| tokio::time::Instant::from_std(self.started) + Duration::from_secs_f64(t));
                    }
                    let wake = release.map_or(give_up, |r| r.min(give_up));
                    if tokio::time::timeout_at(wake, woken).await.is_err() && wake == give_up {
                        self.hold_timeout.fetch_add(1, Ordering::Relaxed);
                        return Err(GateRefusal::HoldTimeout);
                    }
                }
            }
        }
    }

    /// The stage's verdict on `decision`, as the instance name to serve on when elsewhere;
    /// `held_since` is set to now on the request's first hold.
    fn decide(
        &self,
        router: &Router,
        request: &RouteRequest<'_>,
        decision: &Decision,
        session: u64,
        prompt_tokens: u64,
        held_since: &mut Option<f64>,
    ) -> Verdict {
        let now = self.now();
        let mut guard = self.lock();
        let chosen = guard.slot(&decision.instance_name);
        let Stage {
            admission,
            slots,
            names,
        } = &mut *guard;
        let verdict = admission.decide(
            &AdmitRequest {
                session: Some(session),
                chosen,
                prompt_tokens,
                held_since: *held_since,
            },
            now,
            || {
                // Step 4's prices, per slot: instances the request must skip never qualify.
                let mut costs = vec![f64::INFINITY; names.len()];
                let Ok(hits) = router.query(request.prompt, request.namespace, None) else {
                    return costs;
                };
                for (name, tokens) in session_admission::tokens_to_prefill(&hits, prompt_tokens) {
                    if request.exclude.contains(&&**name) {
                        continue;
                    }
                    if let Some(&slot) = slots.get(name) {
                        costs[slot as usize] = tokens as f64;
                    }
                }
                costs
            },
        );
        match verdict {
            Admission::Admit { .. } => Verdict::Admit,
            Admission::Elsewhere { instance, .. } => Verdict::Elsewhere(Arc::clone(&guard.names[instance as usize])),
            Admission::Hold => {
                held_since.get_or_insert(now);
                Verdict::Hold
            }
        }
    }

    /// A gated request of `session` on `instance` ended with `context_tokens` of context
    /// (prompt + output; the prompt alone when it failed): the session is idle there, and
    /// every holder tries again.
    pub fn finished(&self, session: u64, instance: &str, context_tokens: u64) {
        let now = self.now();
        {
            let mut guard = self.lock();
            if let Some(&slot) = guard.slots.get(instance) {
                guard.admission.on_finished(session, slot, context_tokens, now);
            }
        }
        self.finished.notify_waiters();
    }

    /// `session` ended (`x-session-end`): it is no longer resident (at once where it is idle),
    /// so its working set stops holding its instance's room; every holder tries again.
    pub fn end(&self, session: u64) {
        self.lock().admission.end(session);
        self.finished.notify_waiters();
    }

    /// Requests waiting now.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Acquire)
    }

    /// What `/metrics` shows.
    pub fn snapshot(&self) -> SessionGateSnapshot {
        SessionGateSnapshot {
            counters: self.lock().admission.counters(),
            held: self.held(),
            held_full: self.held_full.load(Ordering::Relaxed),
            hold_timeout: self.hold_timeout.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use smetric_core::{BlockHash, CacheFirstMode, PolicyKind, Prompt, RouterConfig, Tier};

    use super::*;

    /// A prompt of four 4-token blocks: 16 tokens. The stage reserves 1,024 output tokens per
    /// request, so one request needs 1,040 tokens and two in flight 2,080.
    const HASHES: [BlockHash; 4] = [BlockHash(1), BlockHash(2), BlockHash(3), BlockHash(4)];
    const PROMPT: u64 = 16;
    const ONE_FITS: u64 = 2_079;

    /// Two instances under `cache_first` taking the most local hit (deterministic), with a
    /// shared store (`global_capacity_blocks` > 0: what an instance holds is in the store too)
    /// or without one.
    fn router(store: bool) -> Router {
        let names = ["x".to_owned(), "y".to_owned()];
        let mut config = RouterConfig {
            cache_first_mode: CacheFirstMode::MaxHit,
            ..RouterConfig::default()
        };
        if !store {
            config.global_capacity_blocks = 0;
        }
        Router::new(&names, PolicyKind::CacheFirst, 4, 0, config).unwrap()
    }

    fn gate(mode: AdmissionMode, max_held: usize, hold_ms: u64) -> Arc<SessionGate> {
        gate_holding(mode, max_held, hold_ms, None)
    }

    /// A gate over `x` and `y` whose longest hold is `max_hold` (`None`: the mode's).
    fn gate_holding(
        mode: AdmissionMode,
        max_held: usize,
        hold_ms: u64,
        max_hold: Option<Duration>,
    ) -> Arc<SessionGate> {
        let gate = SessionGate::new(SessionGateConfig {
            mode,
            capacity_tokens: ONE_FITS,
            max_held,
            hold_timeout: Duration::from_millis(hold_ms),
            max_hold,
            retry_after_s: 1,
        });
        gate.set_instances(&["x".to_owned(), "y".to_owned()]);
        gate
    }

    fn prompt() -> Prompt<'static> {
        Prompt::Hashes {
            hashes: &HASHES,
            num_tokens: Some(PROMPT),
        }
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    fn far() -> tokio::time::Instant {
        tokio::time::Instant::now() + Duration::from_secs(60)
    }

    /// Session 1 in flight on `x` (pinned there), the prompt cached on `x` (as its KV events
    /// would say).
    async fn first_on_x(router: &Router, gate: &SessionGate) -> Decision {
        router
            .store_blocks(Some("x"), Tier::Local, &HASHES, None, None)
            .unwrap();
        let pinned = RouteRequest {
            exclude: &["y"],
            ..RouteRequest::new(prompt())
        };
        let d = gate.route(router, &pinned, 1, PROMPT, far()).await.unwrap().unwrap();
        assert_eq!(&*d.instance_name, "x");
        d
    }

    #[test]
    fn smetric_moves_a_request_to_an_instance_with_room_and_an_equal_source() {
        runtime().block_on(async {
            // The shared store holds the prompt: `y` loads it as cheaply as `x` hits it.
            let router = router(true);
            router.store_blocks(None, Tier::Global, &HASHES, None, None).unwrap();
            let gate = gate(AdmissionMode::Smetric, 4, 1_000);
            first_on_x(&router, &gate).await;
            // cache_first sends session 2 to `x` (its local hit); `x` has no room for two.
            let d = gate
                .route(&router, &RouteRequest::new(prompt()), 2, PROMPT, far())
                .await
                .unwrap()
                .unwrap();
            assert_eq!(&*d.instance_name, "y");
            let c = gate.snapshot().counters;
            assert_eq!((c.admitted, c.moved, c.held), (1, 1, 0));
            // The policy's decision on `x` was given back: only the two live ones are loaded.
            assert_eq!(router.stats().in_flight, 2);
        });
    }

    #[test]
    fn smetric_holds_rather_than_trade_a_hit_for_a_recompute() {
        runtime().block_on(async {
            let router = router(false); // no store: `y` would recompute the prompt
            let gate = gate(AdmissionMode::Smetric, 4, 50);
            first_on_x(&router, &gate).await;
            let refused = gate
                .route(&router, &RouteRequest::new(prompt()), 2, PROMPT, far())
                .await;
            assert_eq!(refused.err(), Some(GateRefusal::HoldTimeout));
            assert_eq!(gate.snapshot().hold_timeout, 1);
            assert_eq!(gate.held(), 0);
            assert_eq!(router.stats().in_flight, 1);
        });
    }

    #[test]
    fn a_held_request_is_admitted_when_a_gated_request_finishes() {
        runtime().block_on(async {
            let router = Arc::new(router(false));
            let gate = gate(AdmissionMode::Pause, 4, 10_000);
            let first = first_on_x(&router, &gate).await;
            let (r, g) = (Arc::clone(&router), Arc::clone(&gate));
            let held = tokio::spawn(async move {
                let pinned = RouteRequest {
                    exclude: &["y"],
                    ..RouteRequest::new(prompt())
                };
                g.route(&r, &pinned, 2, PROMPT, far())
                    .await
                    .map(|d| d.map(|d| d.instance_name))
            });
            tokio::time::sleep(Duration::from_millis(50)).await;
            assert_eq!(gate.held(), 1);
            assert!(!held.is_finished());
            // Session 1's context grew to 1,500 tokens: session 2 fits once it is paused.
            router.on_finished(first.request_id, 1_484);
            gate.finished(1, "x", 1_500);
            let served = tokio::time::timeout(Duration::from_secs(5), held)
                .await
                .unwrap()
                .unwrap();
            assert_eq!(served.unwrap().unwrap().as_ref(), "x");
            assert_eq!(gate.held(), 0);
            let c = gate.snapshot().counters;
            assert_eq!((c.admitted, c.paused), (2, 1));
        });
    }

    #[test]
    fn a_full_hold_queue_refuses_at_once() {
        runtime().block_on(async {
            let router = Arc::new(router(false));
            let gate = gate(AdmissionMode::Pause, 1, 10_000);
            first_on_x(&router, &gate).await;
            let (r, g) = (Arc::clone(&router), Arc::clone(&gate));
            let waiting = tokio::spawn(async move {
                let pinned = RouteRequest {
                    exclude: &["y"],
                    ..RouteRequest::new(prompt())
                };
                g.route(&r, &pinned, 2, PROMPT, far()).await.is_ok()
            });
            tokio::time::sleep(Duration::from_millis(50)).await;
            let pinned = RouteRequest {
                exclude: &["y"],
                ..RouteRequest::new(prompt())
            };
            let refused = gate.route(&router, &pinned, 3, PROMPT, far()).await;
            assert_eq!(refused.err(), Some(GateRefusal::HeldFull));
            assert_eq!(gate.snapshot().held_full, 1);
            waiting.abort();
            let _ = waiting.await;
            // The aborted waiter gave its place back.
            assert_eq!(gate.held(), 0);
        });
    }

    #[test]
    fn a_bounded_hold_admits_at_the_policys_instance_when_it_runs_out() {
        runtime().block_on(async {
            let router = router(false); // no store: nowhere cheaper to move
            let gate = gate_holding(AdmissionMode::Smetric, 4, 10_000, Some(Duration::from_millis(30)));
            first_on_x(&router, &gate).await;
            let start = tokio::time::Instant::now();
            let d = gate
                .route(&router, &RouteRequest::new(prompt()), 2, PROMPT, far())
                .await
                .unwrap()
                .unwrap();
            // Held (nothing finished), then admitted on `x` once 30 ms had passed, not refused.
            assert_eq!(&*d.instance_name, "x");
            assert!(start.elapsed() >= Duration::from_millis(30));
            let c = gate.snapshot().counters;
            assert_eq!((c.admitted, c.released, c.held), (2, 1, 1));
            assert_eq!(gate.snapshot().hold_timeout, 0);
            assert_eq!(router.stats().in_flight, 2);
        });
    }
}
