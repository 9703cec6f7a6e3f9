//! Session admission: hold back (or place elsewhere) a session's request when the instance it
//! was routed to cannot keep the KV working set of its resident sessions.
//!
//! A stage after the policy's choice, independent of the policy (ThunderAgent, arXiv
//! 2602.13692: programs, not requests, are the unit that thrashes a KV cache).
//!
//! **Resident sessions.** Per instance, the sessions with a request in flight there, or whose
//! last request there finished less than `idle_window_s` ago (their next turn is expected).
//! A resident session's *working set* is its context: prompt + `output_reserve_tokens` while a
//! request is in flight, prompt + actual output once it finished. An instance's working set
//! is the sum over its resident sessions; its *active* set the sum over those in flight.
//!
//! **The decision** ([`SessionAdmission::decide`]) for a request of session `s`, routed by the
//! policy to instance `c`, needing `need = prompt + reserve` tokens:
//! 1. `s` is resident on `c`: admit (its KV is there; it is the session admission protects).
//!    Idle sessions are paused, least recently active first, while `c`'s set overflows.
//! 2. `c` has room once its idle sessions are paused (`active(c) + need ≤ capacity`): pause
//!    them, least recently active first, until `set(c) + need ≤ capacity`, and admit.
//! 3. `c` has no in-flight work: admit anyway (a request alone never waits: progress).
//! 4. [`AdmissionMode::Smetric`] only: the other instances with room as they stand (their whole
//!    working set, idle sessions included: a move pauses no one) whose
//!    source for the prefix is no worse than `c`'s (the caller's per-instance cost in
//!    prefill-equivalent tokens; the simulator passes the tokens to prefill, a token held on the
//!    GPU, in a host pool or in a shared store free — pricing loads at the router's fetch costs
//!    measured worse, docs/results.md §20 — never trade a cheaper source for a dearer one: a
//!    move that recomputes a long history costs more than the wait),
//!    the cheapest, ties to the smaller working set, then the lower slot: place it there
//!    ([`Admission::Elsewhere`]).
//! 5. The request has already waited `max_hold_s` (the caller says since when, `held_since`):
//!    admit it at `c` anyway, pausing what idle sessions it can. A hold trades the request's
//!    TTFT for the co-runners' KV; past some wait the trade no longer pays (holding a
//!    68K-token turn until its instance had room lost 3.1% of peak TPS to no admission where
//!    KV binds without a tier, docs/results.md §20). [`AdmissionMode::Pause`] never gives up
//!    (ThunderAgent's form: `max_hold_s` infinite); [`AdmissionMode::Smetric`] gives up after
//!    [`DEFAULT_SMETRIC_MAX_HOLD_S`].
//! 6. Otherwise [`Admission::Hold`]: the caller queues the request and asks again when a
//!    request finishes or its `max_hold_s` has passed ([`AdmissionMode::Pause`] holds at `c`,
//!    ThunderAgent's per-pod form).
//!
//! Pausing a session only forgets it here: its KV is left to the engine's LRU (or the tier),
//! and its next turn is a newcomer that must pass the test again. Requests without a session
//! key, and every request with [`AdmissionMode::Off`], are admitted at `c` untouched.
//!
//! **Invariants.** A session is resident on at most one instance (admitting it elsewhere
//! removes it from its old one). An instance holds at most `max_sessions_per_instance`
//! residents (the least recently active idle one goes first, else the least recently
//! active). `decide` changes state only when it admits; a held request leaves no trace.
//!
//! **Complexity.** `decide` is O(R) for the chosen instance's R residents, plus O(N · R) over
//! the N instances in step 4 (only when `c` has no room); `on_finished` is O(R).
//!
//! Callers: the simulator's placer (`smetric-sim`, `placers/core.rs`) and `smetric serve`'s
//! gateway (`smetric-gateway`, `session_gate.rs`); both price step 4 with
//! [`tokens_to_prefill`].

use std::sync::Arc;

use crate::router::Hits;

/// How (whether) requests are admitted per session.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AdmissionMode {
    /// Every request is admitted where the policy sends it (no stage).
    #[default]
    Off,
    /// ThunderAgent's per-pod form: pause idle sessions, else hold the request at its instance.
    Pause,
    /// Pause idle sessions, else place the request on another instance with room and the
    /// cheapest source for its prefix, else hold it.
    Smetric,
}

impl AdmissionMode {
    /// Every mode, in CLI order.
    pub const ALL: [Self; 3] = [Self::Off, Self::Pause, Self::Smetric];

    /// The longest this mode holds a request by default, seconds (module docs, step 5).
    pub fn default_max_hold_s(self) -> f64 {
        match self {
            Self::Off | Self::Pause => f64::INFINITY,
            Self::Smetric => DEFAULT_SMETRIC_MAX_HOLD_S,
        }
    }

    /// The CLI / report name: `off`, `pause`, `smetric`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::Pause => "pause",
            Self::Smetric => "smetric",
        }
    }

    /// The mode called `name`.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.name() == name)
    }
}

/// A session idle this long is no longer resident, seconds: 30 s covers the p90 think time of
/// agent sessions (23 s in the Codex statistics, `docs/codex-workload.md`), so a session
/// between two tool calls keeps its place and one that went away does not.
pub const DEFAULT_IDLE_WINDOW_S: f64 = 30.0;
/// Tokens reserved for a request's output before it finishes (its length is unknown then).
pub const DEFAULT_OUTPUT_RESERVE_TOKENS: u64 = 1024;
/// Most resident sessions tracked per instance (the bound on per-session state).
pub const DEFAULT_MAX_SESSIONS_PER_INSTANCE: usize = 4096;
/// The longest [`AdmissionMode::Smetric`] holds a request before admitting it where its policy
/// sent it, seconds (chosen by its worst tuning cell, docs/results.md §20: the bounded hold).
pub const DEFAULT_SMETRIC_MAX_HOLD_S: f64 = f64::INFINITY;

/// The stage's settings.
#[derive(Clone, Debug, PartialEq)]
pub struct AdmissionConfig {
    /// The mode.
    pub mode: AdmissionMode,
    /// KV capacity of one instance, tokens.
    pub capacity_tokens: u64,
    /// See [`DEFAULT_IDLE_WINDOW_S`].
    pub idle_window_s: f64,
    /// See [`DEFAULT_OUTPUT_RESERVE_TOKENS`].
    pub output_reserve_tokens: u64,
    /// See [`DEFAULT_MAX_SESSIONS_PER_INSTANCE`].
    pub max_sessions_per_instance: usize,
    /// The longest a request is held before it is admitted at its policy's instance anyway,
    /// seconds; infinite: held until there is room (see [`AdmissionMode::default_max_hold_s`]).
    pub max_hold_s: f64,
}

impl AdmissionConfig {
    /// `mode` over instances of `capacity_tokens` KV tokens each, every other field defaulted.
    pub fn new(mode: AdmissionMode, capacity_tokens: u64) -> Self {
        Self {
            mode,
            capacity_tokens,
            idle_window_s: DEFAULT_IDLE_WINDOW_S,
            output_reserve_tokens: DEFAULT_OUTPUT_RESERVE_TOKENS,
            max_sessions_per_instance: DEFAULT_MAX_SESSIONS_PER_INSTANCE,
            max_hold_s: mode.default_max_hold_s(),
        }
    }
}

/// The stage's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// Serve it on the policy's choice; `paused` idle sessions were paused to make room.
    Admit {
        /// The policy's instance.
        instance: u32,
        /// Sessions paused for it.
        paused: u32,
    },
    /// Serve it on `instance`, not the policy's choice (which had no room).
    Elsewhere {
        /// The instance with room and the cheapest source.
        instance: u32,
        /// Sessions paused for it there.
        paused: u32,
    },
    /// No room: queue it and ask again when a request finishes.
    Hold,
}

/// One request as the stage sees it.
#[derive(Clone, Copy, Debug)]
pub struct AdmitRequest {
    /// The session key (`RouteRequest::session_key`); `None` is admitted untouched.
    pub session: Option<u64>,
    /// The policy's instance slot.
    pub chosen: u32,
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// When the request was first held, on the clock of `decide`'s `now` (`None` when first
    /// asked); it is released once `held_since + max_hold_s <= now` ([`SessionAdmission::release_at`]).
    pub held_since: Option<f64>,
}

/// Counters of the stage's decisions.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AdmissionCounters {
    /// Admitted on the policy's choice.
    pub admitted: u64,
    /// Placed on another instance.
    pub moved: u64,
    /// Answers "hold" (a request held and retried n times counts n).
    pub held: u64,
    /// Admitted at the policy's instance without room, once held `max_hold_s` (also in `admitted`).
    pub released: u64,
    /// Sessions paused.
    pub paused: u64,
}

#[derive(Clone, Copy, Debug)]
struct Resident {
    session: u64,
    tokens: u64,
    in_flight: u32,
    last_active: f64,
    /// The session was ended while a request of it was in flight: it leaves when none is.
    ended: bool,
}

/// The resident-session table of every instance and the admission decision.
#[derive(Clone, Debug)]
pub struct SessionAdmission {
    config: AdmissionConfig,
    instances: Vec<Vec<Resident>>,
    counters: AdmissionCounters,
}

impl SessionAdmission {
    /// The stage over `instances` slots.
    pub fn new(instances: u32, config: AdmissionConfig) -> Self {
        Self {
            config,
            instances: vec![Vec::new(); instances as usize],
            counters: AdmissionCounters::default(),
        }
    }

    /// Grows the stage to `instances` slots (a fleet that gained instances); never shrinks.
    pub fn ensure_instances(&mut self, instances: u32) {
        if self.instances.len() < instances as usize {
            self.instances.resize(instances as usize, Vec::new());
        }
    }

    /// The mode.
    pub fn mode(&self) -> AdmissionMode {
        self.config.mode
    }

    /// The decision counters so far.
    pub fn counters(&self) -> AdmissionCounters {
        self.counters
    }

    /// Instance `i`'s working set (resident sessions' context tokens) at `now` (0 for a slot
    /// out of range).
    pub fn working_set(&mut self, i: u32, now: f64) -> u64 {
        if i as usize >= self.instances.len() {
            return 0;
        }
        self.expire(i as usize, now);
        self.instances[i as usize].iter().map(|r| r.tokens).sum()
    }

    /// Sessions resident on instance `i` at `now` (0 for a slot out of range).
    pub fn residents(&mut self, i: u32, now: f64) -> usize {
        if i as usize >= self.instances.len() {
            return 0;
        }
        self.expire(i as usize, now);
        self.instances[i as usize].len()
    }

    /// Admits, places elsewhere or holds `req` at `now` (module docs). `costs` gives, per
    /// instance slot, the cost of the request's prefix there in prefill-equivalent tokens; it
    /// is called only when the policy's instance has no room and the mode is
    /// [`AdmissionMode::Smetric`].
    pub fn decide(&mut self, req: &AdmitRequest, now: f64, costs: impl FnOnce() -> Vec<f64>) -> Admission {
        let c = req.chosen as usize;
        let session = match (self.config.mode, req.session) {
            (AdmissionMode::Off, _) | (_, None) => {
                return Admission::Admit {
                    instance: req.chosen,
                    paused: 0,
                };
            }
            (_, Some(s)) if c < self.instances.len() => s,
            _ => {
                return Admission::Admit {
                    instance: req.chosen,
                    paused: 0,
                };
            }
        };
        let need = req.prompt_tokens + self.config.output_reserve_tokens;
        self.expire(c, now);
        let cap = self.config.capacity_tokens;
        let home = self.instances[c].iter().any(|r| r.session == session);
        if home || self.active(c, session) + need <= cap || self.active(c, session) == 0 {
            let paused = self.admit_at(c, session, need, now);
            self.counters.admitted += 1;
            return Admission::Admit {
                instance: req.chosen,
                paused,
            };
        }
        if self.config.mode == AdmissionMode::Smetric {
            let costs = costs();
            let at_chosen = costs.get(c).copied().unwrap_or(f64::INFINITY);
            let mut best: Option<(f64, u64, usize)> = None;
            for j in 0..self.instances.len() {
                if j == c {
                    continue;
                }
                self.expire(j, now);
                // Room as it stands: a moved request pauses no one (moves that evicted the
                // target's idle sessions cascaded past the peak, docs/results.md §20).
                let set = self.instances[j]
                    .iter()
                    .filter(|r| r.session != session)
                    .map(|r| r.tokens)
                    .sum::<u64>();
                if set + need > cap {
                    continue;
                }
                let key = (costs.get(j).copied().unwrap_or(f64::INFINITY), set, j);
                if key.0 > at_chosen {
                    continue;
                }
                let better = |b: (f64, u64, usize)| key.0.total_cmp(&b.0).then((key.1, key.2).cmp(&(b.1, b.2))).is_lt();
                if best.is_none_or(better) {
                    best = Some(key);
                }
            }
            if let Some((_, _, j)) = best {
                let paused = self.admit_at(j, session, need, now);
                self.counters.moved += 1;
                return Admission::Elsewhere {
                    instance: j as u32,
                    paused,
                };
            }
        }
        if req
            .held_since
            .and_then(|t| self.release_at(t))
            .is_some_and(|t| t <= now)
        {
            let paused = self.admit_at(c, session, need, now);
            self.counters.admitted += 1;
            self.counters.released += 1;
            return Admission::Admit {
                instance: req.chosen,
                paused,
            };
        }
        self.counters.held += 1;
        Admission::Hold
    }

    /// When a request first held at `held_since` should be asked again even if nothing
    /// finishes: `held_since + max_hold_s`, or `None` when holds are unbounded.
    pub fn release_at(&self, held_since: f64) -> Option<f64> {
        let hold = self.config.max_hold_s;
        hold.is_finite().then_some(held_since + hold)
    }

    /// Session `session`'s request on instance `instance` finished at `now` with a context of
    /// `context_tokens` (prompt + output): the session is now idle there with that working set.
    pub fn on_finished(&mut self, session: u64, instance: u32, context_tokens: u64, now: f64) {
        let Some(list) = self.instances.get_mut(instance as usize) else {
            return;
        };
        if let Some(k) = list.iter().position(|r| r.session == session) {
            let r = &mut list[k];
            r.in_flight = r.in_flight.saturating_sub(1);
            r.tokens = context_tokens;
            r.last_active = now;
            if r.ended && r.in_flight == 0 {
                list.swap_remove(k);
            }
        }
    }

    /// Session `session` ended (its client said so, `smetric serve`'s session end): it is no
    /// longer resident anywhere — at once where it is idle, when its last request in flight
    /// finishes elsewhere — so its working set stops counting against its instance. O(N · R).
    pub fn end(&mut self, session: u64) {
        for list in &mut self.instances {
            list.retain_mut(|r| {
                if r.session != session {
                    return true;
                }
                r.ended = true;
                r.in_flight > 0
            });
        }
    }

    /// Tokens of instance `i`'s sessions in flight, other than `session`.
    fn active(&self, i: usize, session: u64) -> u64 {
        self.instances[i]
            .iter()
            .filter(|r| r.in_flight > 0 && r.session != session)
            .map(|r| r.tokens)
            .sum()
    }

    /// Drops instance `i`'s idle sessions whose window has passed.
    fn expire(&mut self, i: usize, now: f64) {
        let window = self.config.idle_window_s;
        self.instances[i].retain(|r| r.in_flight > 0 || now - r.last_active < window);
    }

    /// Makes `session` resident and in flight on `i` with `need` tokens, pausing `i`'s idle
    /// sessions (least recently active first) while the set overflows; returns how many.
    fn admit_at(&mut self, i: usize, session: u64, need: u64, now: f64) -> u32 {
        for (j, list) in self.instances.iter_mut().enumerate() {
            if j != i {
                list.retain(|r| r.session != session);
            }
        }
        let list = &mut self.instances[i];
        let mut total: u64 = list
            .iter()
            .filter(|r| r.session != session)
            .map(|r| r.tokens)
            .sum::<u64>()
            + need;
        let mut paused = 0;
        while total > self.config.capacity_tokens {
            let victim = list
                .iter()
                .enumerate()
                .filter(|(_, r)| r.in_flight == 0 && r.session != session)
                .min_by(|(_, a), (_, b)| a.last_active.total_cmp(&b.last_active))
                .map(|(k, _)| k);
            let Some(k) = victim else { break };
            total -= list.swap_remove(k).tokens;
            paused += 1;
        }
        if let Some(r) = list.iter_mut().find(|r| r.session == session) {
            r.in_flight += 1;
            r.tokens = r.tokens.max(need);
            r.last_active = now;
            r.ended = false; // the session's id started over
        } else {
            if list.len() >= self.config.max_sessions_per_instance.max(1) {
                // The bound: the least recently active idle session, else the least recently active.
                let k = (0..list.len())
                    .min_by(|&a, &b| {
                        (list[a].in_flight > 0)
                            .cmp(&(list[b].in_flight > 0))
                            .then(list[a].last_active.total_cmp(&list[b].last_active))
                    })
                    .unwrap_or(0);
                list.swap_remove(k);
            }
            list.push(Resident {
                session,
                tokens: need,
                in_flight: 1,
                last_active: now,
                ended: false,
            });
        }
        self.counters.paused += u64::from(paused);
        paused
    }
}

/// Per instance of `hits` (the router's fleet order), the tokens of a `prompt_tokens` prompt it
/// would prefill: each token from the deepest source that holds it (its GPU, its host pool, the
/// shared store) costs nothing, the rest are recomputed. The step-4 cost both callers pass
/// (pricing loads at the router's fetch costs measured worse, docs/results.md §20).
pub fn tokens_to_prefill(hits: &Hits, prompt_tokens: u64) -> impl Iterator<Item = (&Arc<str>, u64)> {
    let global = hits.global_hit_tokens;
    hits.local.iter().enumerate().map(move |(k, (name, local))| {
        let host = hits.host.get(k).map_or(0, |&(_, h)| h);
        (name, prompt_tokens.saturating_sub((*local).max(host).max(global)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const CAP: u64 = 100_000;

    fn stage(mode: AdmissionMode, instances: u32) -> SessionAdmission {
        stage_holding(mode, instances, mode.default_max_hold_s())
    }

    /// A stage whose longest hold is `max_hold_s`.
    fn stage_holding(mode: AdmissionMode, instances: u32, max_hold_s: f64) -> SessionAdmission {
        let mut config = AdmissionConfig::new(mode, CAP);
        config.output_reserve_tokens = 0;
        config.max_hold_s = max_hold_s;
        SessionAdmission::new(instances, config)
    }

    fn req(session: u64, chosen: u32, prompt: u64) -> AdmitRequest {
        AdmitRequest {
            session: Some(session),
            chosen,
            prompt_tokens: prompt,
            held_since: None,
        }
    }

    fn no_costs() -> Vec<f64> {
        panic!("costs asked for")
    }

    #[test]
    fn off_admits_everything_and_keeps_no_state() {
        let mut s = stage(AdmissionMode::Off, 2);
        for k in 0..10 {
            assert_eq!(
                s.decide(&req(k, 0, 60_000), 0.0, no_costs),
                Admission::Admit { instance: 0, paused: 0 }
            );
        }
        assert_eq!(s.working_set(0, 0.0), 0);
    }

    #[test]
    fn pause_holds_a_newcomer_while_in_flight_sessions_fill_the_instance() {
        let mut s = stage(AdmissionMode::Pause, 2);
        assert!(matches!(
            s.decide(&req(1, 0, 60_000), 0.0, no_costs),
            Admission::Admit { .. }
        ));
        // 60K + 60K > 100K with session 1 in flight: held, and nothing changed.
        assert_eq!(s.decide(&req(2, 0, 60_000), 1.0, no_costs), Admission::Hold);
        assert_eq!(s.working_set(0, 1.0), 60_000);
        // Session 1 finishes: it is idle, so it is paused for the newcomer.
        s.on_finished(1, 0, 61_000, 2.0);
        assert_eq!(
            s.decide(&req(2, 0, 60_000), 2.0, no_costs),
            Admission::Admit { instance: 0, paused: 1 }
        );
        assert_eq!(s.working_set(0, 2.0), 60_000);
        assert_eq!(s.counters().held, 1);
    }

    #[test]
    fn a_resident_session_is_always_admitted_at_home() {
        let mut s = stage(AdmissionMode::Pause, 1);
        s.decide(&req(1, 0, 60_000), 0.0, no_costs);
        s.decide(&req(2, 0, 30_000), 0.0, no_costs);
        // Session 2's second request grows its context past the capacity: it is at home.
        assert!(matches!(
            s.decide(&req(2, 0, 50_000), 1.0, no_costs),
            Admission::Admit { .. }
        ));
    }

    #[test]
    fn an_ended_session_stops_counting_at_once_when_idle_and_when_its_request_ends_if_not() {
        let mut s = stage(AdmissionMode::Pause, 1);
        s.decide(&req(1, 0, 30_000), 0.0, no_costs);
        s.decide(&req(2, 0, 20_000), 0.0, no_costs);
        s.on_finished(1, 0, 31_000, 1.0);
        s.end(1); // idle: gone now
        assert_eq!(s.working_set(0, 1.0), 20_000);
        s.end(2); // in flight: stays until its request ends
        assert_eq!(s.working_set(0, 1.0), 20_000);
        s.on_finished(2, 0, 21_000, 2.0);
        assert_eq!((s.working_set(0, 2.0), s.residents(0, 2.0)), (0, 0));
        // Negative control: a session that was not ended stays resident, idle.
        s.decide(&req(3, 0, 10_000), 3.0, no_costs);
        s.on_finished(3, 0, 11_000, 3.5);
        s.end(4);
        assert_eq!(s.working_set(0, 3.5), 11_000);
        // An ended id that comes back is a session again (its end no longer applies).
        s.decide(&req(5, 0, 10_000), 4.0, no_costs);
        s.end(5);
        s.decide(&req(5, 0, 12_000), 4.5, no_costs);
        s.on_finished(5, 0, 13_000, 5.0);
        assert_eq!(s.residents(0, 5.0), 2, "5 kept: one of its requests is still in flight");
    }

    #[test]
    fn a_request_alone_is_never_held() {
        let mut s = stage(AdmissionMode::Pause, 1);
        assert!(matches!(
            s.decide(&req(1, 0, 500_000), 0.0, no_costs),
            Admission::Admit { .. }
        ));
    }

    #[test]
    fn smetric_places_on_the_cheapest_instance_with_room() {
        let mut s = stage(AdmissionMode::Smetric, 3);
        s.decide(&req(1, 0, 60_000), 0.0, no_costs);
        // Instances 1 and 2 both have room; 2 holds more of the prefix (fewer tokens to prefill).
        let got = s.decide(&req(2, 0, 60_000), 1.0, || vec![20_000.0, 60_000.0, 10_000.0]);
        assert_eq!(got, Admission::Elsewhere { instance: 2, paused: 0 });
        // A move pauses no one: instance 2 now has no room as it stands (session 2 is on it),
        // and instance 1 recomputes more than 0 would: held.
        assert_eq!(
            s.decide(&req(3, 0, 60_000), 2.0, || vec![20_000.0, 60_000.0, 10_000.0]),
            Admission::Hold
        );
        // Negative control: the same request under ThunderAgent's form is held.
        let mut p = stage(AdmissionMode::Pause, 3);
        p.decide(&req(1, 0, 60_000), 0.0, no_costs);
        assert_eq!(
            p.decide(&req(2, 0, 60_000), 1.0, || vec![20_000.0, 60_000.0, 10_000.0]),
            Admission::Hold
        );
    }

    #[test]
    fn smetric_never_trades_a_hit_for_a_recompute() {
        let mut s = stage(AdmissionMode::Smetric, 2);
        s.decide(&req(1, 0, 60_000), 0.0, no_costs);
        // Session 2's prefix is on instance 0 (nothing to prefill); instance 1 would recompute.
        assert_eq!(
            s.decide(&req(2, 0, 60_000), 1.0, || vec![0.0, 60_000.0]),
            Admission::Hold
        );
        // The same prefix loaded from a shared store on 1 costs more than the GPU hit on 0: held.
        assert_eq!(
            s.decide(&req(2, 0, 60_000), 1.0, || vec![0.0, 16_200.0]),
            Admission::Hold
        );
        // A prefix that 0 would load from the store too (its GPU copy evicted): moved.
        assert_eq!(
            s.decide(&req(2, 0, 60_000), 1.0, || vec![16_200.0, 16_200.0]),
            Admission::Elsewhere { instance: 1, paused: 0 }
        );
    }

    #[test]
    fn smetric_holds_when_no_instance_has_room() {
        let mut s = stage(AdmissionMode::Smetric, 2);
        s.decide(&req(1, 0, 60_000), 0.0, no_costs);
        s.decide(&req(2, 1, 60_000), 0.0, no_costs);
        assert_eq!(s.decide(&req(3, 0, 60_000), 1.0, || vec![0.0, 0.0]), Admission::Hold);
    }

    #[test]
    fn idle_sessions_expire_after_the_window_and_are_paused_lru_first() {
        let mut s = stage(AdmissionMode::Pause, 1);
        s.decide(&req(1, 0, 30_000), 0.0, no_costs);
        s.decide(&req(2, 0, 30_000), 0.0, no_costs);
        s.on_finished(1, 0, 30_000, 1.0);
        s.on_finished(2, 0, 30_000, 2.0);
        // 30K + 30K + 60K > 100K: one idle session goes, the least recently active (1).
        assert_eq!(
            s.decide(&req(3, 0, 60_000), 3.0, no_costs),
            Admission::Admit { instance: 0, paused: 1 }
        );
        assert_eq!(s.residents(0, 3.0), 2);
        // Session 2's window passes.
        s.on_finished(3, 0, 60_000, 4.0);
        assert_eq!(s.residents(0, 2.0 + DEFAULT_IDLE_WINDOW_S), 1);
    }

    #[test]
    fn a_session_is_resident_on_one_instance_and_the_table_is_bounded() {
        let mut config = AdmissionConfig::new(AdmissionMode::Smetric, CAP);
        config.max_sessions_per_instance = 3;
        let mut s = SessionAdmission::new(2, config);
        s.decide(&req(1, 0, 1_000), 0.0, no_costs);
        s.decide(&req(1, 1, 1_000), 1.0, no_costs);
        assert_eq!((s.residents(0, 1.0), s.residents(1, 1.0)), (0, 1));
        for k in 10..20 {
            s.decide(&req(k, 0, 10), 2.0, no_costs);
        }
        assert_eq!(s.residents(0, 2.0), 3);
    }

    #[test]
    fn sessionless_requests_pass_untouched() {
        let mut s = stage(AdmissionMode::Pause, 1);
        s.decide(&req(1, 0, 90_000), 0.0, no_costs);
        let anon = AdmitRequest {
            session: None,
            chosen: 0,
            prompt_tokens: 90_000,
            held_since: None,
        };
        assert_eq!(
            s.decide(&anon, 0.0, no_costs),
            Admission::Admit { instance: 0, paused: 0 }
        );
        assert_eq!(s.working_set(0, 0.0), 90_000);
    }

    #[test]
    fn modes_round_trip_by_name() {
        for m in AdmissionMode::ALL {
            assert_eq!(AdmissionMode::parse(m.name()), Some(m));
        }
        assert_eq!(AdmissionMode::parse("thunder"), None);
        assert_eq!(AdmissionMode::default(), AdmissionMode::Off);
    }

    #[test]
    fn a_bounded_hold_admits_at_the_policys_instance_once_it_has_waited() {
        let mut s = stage_holding(AdmissionMode::Smetric, 1, 2.0);
        assert!(matches!(
            s.decide(&req(1, 0, 60_000), 0.0, no_costs),
            Admission::Admit { .. }
        ));
        let waiter = AdmitRequest {
            held_since: Some(0.1),
            ..req(2, 0, 60_000)
        };
        // One instance: nowhere to move, so held until 0.1 + 2 s.
        assert_eq!(s.decide(&waiter, 2.0, Vec::new), Admission::Hold);
        assert_eq!(s.release_at(0.5), Some(2.5));
        let at = s.release_at(0.1).unwrap_or(f64::NAN);
        assert_eq!(
            s.decide(&waiter, at, Vec::new),
            Admission::Admit { instance: 0, paused: 0 }
        );
        let c = s.counters();
        assert_eq!((c.admitted, c.released, c.held), (2, 1, 1));
        // Admitted over capacity: both sessions are in flight there now.
        assert_eq!(s.working_set(0, at), 120_000);
    }

    #[test]
    fn a_move_to_an_instance_with_room_comes_before_the_release() {
        let mut s = stage_holding(AdmissionMode::Smetric, 2, 0.0);
        assert!(matches!(
            s.decide(&req(1, 0, 60_000), 0.0, no_costs),
            Admission::Admit { .. }
        ));
        let long_waiter = AdmitRequest {
            held_since: Some(-10.0),
            ..req(2, 0, 60_000)
        };
        assert_eq!(
            s.decide(&long_waiter, 1.0, || vec![60_000.0, 60_000.0]),
            Admission::Elsewhere { instance: 1, paused: 0 }
        );
        assert_eq!(s.counters().released, 0);
    }

    #[test]
    fn pause_holds_without_bound_by_default() {
        let mut s = stage(AdmissionMode::Pause, 1);
        assert_eq!(s.release_at(3.0), None);
        assert!(matches!(
            s.decide(&req(1, 0, 60_000), 0.0, no_costs),
            Admission::Admit { .. }
        ));
        let waited = AdmitRequest {
            held_since: Some(0.0),
            ..req(2, 0, 60_000)
        };
        assert_eq!(s.decide(&waited, 1.0e9, no_costs), Admission::Hold);
        assert!(AdmissionMode::Pause.default_max_hold_s().is_infinite());
    }
}
