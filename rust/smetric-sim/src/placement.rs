//! The seam between the simulated cluster and a routing policy.
//!
//! The simulator asks a [`Placer`] where each request goes and tells it about every
//! lifecycle event at the simulated time it happens. The production implementation is
//! [`crate::placers::CorePlacer`], which forwards to the real `smetric_core::Router` (the same
//! code the router binary runs; there is no second implementation of any policy here).
//! [`RoundRobinPlacer`] is a dependency-free double for the engine's own tests.
//!
//! Call order per request: `place` at arrival → `on_prefilled` when its last prefill chunk
//! completes (the step that emits its first token) → `on_finished` when its last token is
//! out. In PD mode `on_transferred` comes between the two, when the decode instance has
//! pulled the KV (`on_prefilled` is then the end of the prefill instance's work). Requests rejected before routing (longer than `max_model_len`) get no call. Cache
//! changes reach it through `on_cache_changes` (oracle) or `on_kv_event_message` (events),
//! depending on `SimConfig::index_feed`. A placement may be *held* (session admission):
//! the request is not served yet, and `place` is called again for it after a request finishes.

use smetric_core::{BlockHash, Prompt, RequestId, RouteRequest, TurnHint};

use crate::cache_events::CacheLog;
use crate::config::TurnFeed;
use crate::error::Result;

/// What the simulator tells a placer about an arriving request.
#[derive(Clone, Copy, Debug)]
pub struct PlaceRequest<'a> {
    /// Simulator-wide request id (the request's index in the workload).
    pub request_id: u64,
    /// Full-block hash chain of the prompt.
    pub chain: &'a [u64],
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// The turn the request carries (1 = its session's first), `None` for a sessionless trace
    /// ([`crate::Workload::turn`]).
    pub turn: Option<u32>,
    /// Simulated time, seconds.
    pub now: f64,
    /// The instance the request's session placed its previous turn on, the way a client that
    /// echoes llm-d's session cookie names it (`None`: first turn, sessionless trace, or a
    /// previous turn that was never placed).
    pub previous_instance: Option<u32>,
    /// The request's session key: its (sub)session index, what vllm-router's hash policies
    /// hash from the `X-Session-Id` header the SMetric authors' replayer sends with every
    /// request (a subagent is a session of its own; a sessionless trace's request is its own).
    pub session_key: Option<u64>,
}

impl PlaceRequest<'_> {
    /// The core routing request of this placement over `chain` (the chain as the router hashes
    /// it): the prompt length, the request id, the simulated time, the turn when `turns` feeds
    /// it, and the previous turn's instance by its name in `names` (the router's instances in
    /// slot order).
    pub(crate) fn route_request<'c>(
        &self,
        chain: &'c [BlockHash],
        turns: TurnFeed,
        names: &'c [String],
    ) -> RouteRequest<'c> {
        RouteRequest {
            prompt: Prompt::Hashes {
                hashes: chain,
                num_tokens: Some(u64::from(self.prompt_tokens)),
            },
            namespace: None,
            turn: match (turns, self.turn) {
                (TurnFeed::Request, Some(k)) => TurnHint::Turn(k),
                _ => TurnHint::Unknown,
            },
            request_id: Some(RequestId(self.request_id)),
            now: Some(self.now),
            exclude: &[],
            previous_instance: self
                .previous_instance
                .and_then(|slot| names.get(slot as usize))
                .map(String::as_str),
            session_key: self.session_key,
            // The recorded output length is the simulator's knowledge, not the request's: only
            // a placer set up for the decode mask's oracle form adds it (`CorePlacer`).
            output_tokens: None,
        }
    }
}

/// A placer's decision.
#[derive(Clone, Debug, PartialEq)]
pub struct Placement {
    /// Instance slot, `0..instances`.
    pub instance: u32,
    /// The placer's belief that this is a session's first request (`None`: no opinion).
    pub first_turn: Option<bool>,
    /// Tokens the placer expects the chosen instance to hold already.
    pub local_hit_tokens: u64,
    /// Tokens the placer expects the global tier to supply.
    pub global_hit_tokens: u64,
    /// Tokens the placer expects the chosen instance to prefill.
    pub prefill_tokens: u64,
    /// Why this instance (the router's reason string, e.g. `"follow-up: sticky"`).
    pub reason: &'static str,
    /// PD mode: the decode instance (an index among all instances, after the prefill ones);
    /// `None` in co-located mode.
    pub decode_instance: Option<u32>,
    /// Session admission held the request back (`instance` is where the policy sent it): the
    /// cluster queues it and calls `place` again for it when a request finishes.
    pub held: bool,
    /// A request held for the first time whose hold runs out at this simulated time: the
    /// cluster calls `place` again for it then even if nothing finished (`None`: only on a
    /// finish, or already said at its first hold).
    pub release_at_s: Option<f64>,
}

/// An engine's load report, as vLLM's metrics endpoint would publish it (the router's own
/// counters are a different thing, `smetric_core::LoadSnapshot`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EngineLoadReport {
    /// Requests in the running batch.
    pub running: u32,
    /// Requests waiting (including those fetching KV from the global tier).
    pub waiting: u32,
    /// Share of GPU KV blocks in use.
    pub kv_usage: f64,
}

/// A routing policy as the simulator sees it.
pub trait Placer {
    /// Policy name, for reports.
    fn policy(&self) -> String;

    /// Chooses an instance for `request`.
    fn place(&mut self, request: &PlaceRequest<'_>) -> Result<Placement>;

    /// The request's prompt is fully computed (first token emitted).
    fn on_prefilled(&mut self, _request_id: u64, _now: f64) {}

    /// PD mode: the decode instance has pulled the request's KV from its prefill instance.
    fn on_transferred(&mut self, _request_id: u64, _now: f64) {}

    /// The request produced its last token.
    fn on_finished(&mut self, _request_id: u64, _output_tokens: u32, _now: f64) {}

    /// A periodic engine load report of `instance`.
    fn on_load(&mut self, _instance: u32, _snapshot: EngineLoadReport, _now: f64) {}

    /// The oracle feed: `instance`'s cache changes, the instant it made them.
    fn on_cache_changes(&mut self, _instance: u32, _log: &CacheLog, _now: f64) {}

    /// The event feed: one KV-event message `[topic, seq, payload]` that `instance` published,
    /// as it reaches the router.
    fn on_kv_event_message(&mut self, _instance: u32, _frames: &[Vec<u8>], _now: f64) {}

    /// PD mode: the name of the decode rule in use (empty co-located).
    fn decode_rule(&self) -> String {
        String::new()
    }

    /// Counters of the index feed, for the report (`(name, value)`, stable order).
    fn feed_counters(&self) -> Vec<(String, u64)> {
        Vec::new()
    }
}

/// Cycles through the instances; knows nothing about caches. Test double.
#[derive(Clone, Debug)]
pub struct RoundRobinPlacer {
    instances: u32,
    next: u32,
}

impl RoundRobinPlacer {
    /// A placer over `instances` slots (at least one).
    pub fn new(instances: u32) -> Self {
        Self {
            instances: instances.max(1),
            next: 0,
        }
    }
}

impl Placer for RoundRobinPlacer {
    fn policy(&self) -> String {
        "test-round-robin".to_owned()
    }

    fn place(&mut self, request: &PlaceRequest<'_>) -> Result<Placement> {
        let instance = self.next;
        self.next = (self.next + 1) % self.instances;
        Ok(Placement {
            instance,
            first_turn: None,
            local_hit_tokens: 0,
            global_hit_tokens: 0,
            prefill_tokens: u64::from(request.prompt_tokens),
            reason: "round-robin",
            decode_instance: None,
            held: false,
            release_at_s: None,
        })
    }
}
