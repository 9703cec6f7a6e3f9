//! The router: hash → query the index → read the load board → policy → record.
//!
//! Algorithm, one decision ([`Router::route`]): hash the prompt's full blocks, before any
//! lock, into a buffer of the calling thread; then, under the index mutex, walk the chain
//! through the two-tier index, read every live instance's load off the lock-free board, ask
//! the policy, insert the chain on route (approximate mode; reusing the entry ids the walk
//! found) or record its blocks as sent, not yet confirmed (exact mode, docs §2.7) and bump the
//! chosen instance's counters; then, outside it, record the request in
//! the in-flight table and count the decision.
//!
//! Invariants:
//! * Decisions serialise on the index mutex from the query to the load bump, so two
//!   concurrent decisions always see each other's load (no thundering herd onto one idle
//!   instance) and each sees the other's insert-on-route.
//! * Nothing that grows with the prompt but the index walk runs under the mutex: hashing
//!   (O(prompt tokens)) runs before it, so threads hash in parallel. The walk costs one cache
//!   line per matched block; scoring is O(instances).
//! * Lifecycle calls (`on_prefilled`, `on_finished`, `on_aborted`) take the in-flight table's
//!   mutex and update atomics; only `on_finished` in exact mode takes the index mutex, once,
//!   to credit the answer's blocks (docs §2.7). Index feeds (KV events)
//!   and fleet changes take the index mutex; a fleet change publishes a new [`Fleet`]
//!   through an `ArcSwap`, so readers of the fleet never block.
//! * Every load counter a decision raised is lowered exactly once by the request's
//!   lifecycle, whatever order or repetition the calls come in.
//!
//! Rooms: `request` (what goes in and out), `decide` (route and query), `lifecycle`,
//! `fleet_ops` (instances and engine load), `index_feed` (explicit index writes), `stats`.
//!
//! Complexity per decision: O(prompt tokens) hashing outside the lock, then O(matched blocks
//! · ⌈N/64⌉) query + O(N) scoring + O(prompt blocks) insert under it.

mod decide;
mod fleet_ops;
mod index_feed;
mod lifecycle;
mod request;
mod stats;
#[cfg(test)]
mod tests;

use std::sync::atomic::AtomicU64;
use std::time::Instant;

use arc_swap::ArcSwap;
use parking_lot::Mutex;

pub use request::{Decision, Hits, IndexOp, Prompt, RouteRequest, Tier};
pub use stats::RouterStats;

use crate::config::{IndexMode, RouterConfig};
use crate::error::{Result, SmetricError};
use crate::fleet::Fleet;
use crate::index::{IndexLimits, IndexQuery, KvIndex};
use crate::mix_map::MixMap;
use crate::policy::{Candidate, Policy, PolicyKind, Reason};
use crate::rng::DrawCounter;
use lifecycle::InFlight;

/// What the index mutex guards: the index and the buffers of the decision it serialises.
#[derive(Debug)]
struct Guarded {
    index: KvIndex,
    query: IndexQuery,
    candidates: Vec<Candidate>,
}

/// The routing core. `Send + Sync`: share it behind an `Arc` between threads.
#[derive(Debug)]
pub struct Router {
    policy: Box<dyn Policy>,
    kind: PolicyKind,
    config: RouterConfig,
    block_size: u32,
    rng: DrawCounter,
    guarded: Mutex<Guarded>,
    fleet: ArcSwap<Fleet>,
    requests: Mutex<MixMap<crate::ids::RequestId, InFlight>>,
    next_request_id: AtomicU64,
    routed: AtomicU64,
    first_turns: AtomicU64,
    reasons: [AtomicU64; Reason::ALL.len()],
    unknown_events: AtomicU64,
    output_tokens: AtomicU64,
    epoch: Instant,
    /// Whether this router places prefills only (a PD router's prefill pool): `smetric` v2
    /// then scores `q + w` instead of `(q + w) × active requests`.
    pub(crate) prefill_only: bool,
}

/// Converts seconds to the index's millisecond clock.
pub(crate) fn to_ms(seconds: f64) -> u64 {
    (seconds * 1000.0).floor() as u64
}

impl Router {
    /// A router over `instances` (non-empty, unique names).
    pub fn new(
        instances: &[String],
        kind: PolicyKind,
        block_size: u32,
        seed: u64,
        config: RouterConfig,
    ) -> Result<Self> {
        if block_size == 0 {
            return Err(SmetricError::InvalidBlockSize { block_size: 0 });
        }
        config.validate()?;
        if instances.is_empty() {
            return Err(SmetricError::NoInstances);
        }
        let fleet = Fleet::new(instances)?;
        let mut index = KvIndex::new(IndexLimits {
            local_capacity: config.local_capacity_blocks,
            global_capacity: config.global_capacity_blocks,
            local_ttl_ms: config.local_ttl_s.map(to_ms),
        });
        for (slot, _) in fleet.members() {
            index.add_slot(slot);
        }
        if config.index_mode == IndexMode::Exact {
            index.enable_pending(to_ms(config.exact_pending_ttl_s), config.exact_answer_credit);
        }
        Ok(Self {
            policy: kind.build(),
            kind,
            block_size,
            rng: DrawCounter::new(seed),
            guarded: Mutex::new(Guarded {
                index,
                query: IndexQuery::default(),
                candidates: Vec::new(),
            }),
            fleet: ArcSwap::from_pointee(fleet),
            requests: Mutex::new(MixMap::default()),
            next_request_id: AtomicU64::new(crate::ids::RequestId::FIRST_GENERATED),
            routed: AtomicU64::new(0),
            first_turns: AtomicU64::new(0),
            reasons: Default::default(),
            unknown_events: AtomicU64::new(0),
            output_tokens: AtomicU64::new(0),
            epoch: Instant::now(),
            prefill_only: false,
            config,
        })
    }

    /// The policy in use.
    pub fn policy(&self) -> PolicyKind {
        self.kind
    }

    /// Tokens per block.
    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    /// The configuration.
    pub fn config(&self) -> &RouterConfig {
        &self.config
    }

    /// Live instance names in slot order.
    pub fn instances(&self) -> Vec<std::sync::Arc<str>> {
        self.fleet.load().members().map(|(_, m)| m.name.clone()).collect()
    }

    /// `now` (seconds) on the index's millisecond clock; the router's own clock when absent.
    /// The router's clock in ms: the caller's `now`, or the time since the router was made.
    /// (The PD router reads its prefill router's clock, so both sides share one.)
    pub(crate) fn now_ms(&self, now: Option<f64>) -> Result<u64> {
        match now {
            None => Ok(to_ms(self.epoch.elapsed().as_secs_f64())),
            Some(t) if t.is_finite() && t >= 0.0 => Ok(to_ms(t)),
            Some(t) => Err(SmetricError::InvalidArgument {
                argument: "now",
                reason: format!("must be finite and >= 0, got {t}"),
            }),
        }
    }

    /// A hit of `blocks` blocks in tokens, capped at `n − 1` (the last token is always
    /// computed, as vLLM does).
    fn hit_tokens(&self, blocks: u32, n: u64) -> u64 {
        (u64::from(blocks) * u64::from(self.block_size)).min(n.saturating_sub(1))
    }
}
