//! The router: hash → query the index → read the load board → policy → record.
//!
//! Algorithm, one decision ([`Router::route`]): hash the prompt's full blocks, before any
//! lock, into a buffer of the calling thread; then, under the index's *shared* lock, walk the
//! chain through the two-tier index into buffers of the thread (hits, entry ids, held
//! prefixes); then, still under it and with no other lock, read every live instance's
//! decision count and load off the lock-free board, ask the policy, and commit the bump of the
//! chosen instance's counters if its count has not moved since (a compare-and-swap; else read
//! and decide again), issue the request id (exact mode: and tell whether there is anything to
//! record as sent). Then, still under the shared lock, the insert on route is done in
//! place when it moves no block in or out of any holder (approximate mode: the chosen instance
//! and the global tier already hold the whole chain, which only becomes their newest blocks:
//! `KvIndex::refront_walked`, behind those holders' own mutexes). Then, if the index write
//! does change blocks (new blocks, a new holder, evictions, blocks recorded as sent, docs
//! §2.7), it runs under the *exclusive* lock, reusing the walk's entry ids
//! unless an entry has been freed since — or, when another thread holds the index, it is
//! queued for the next taker of the lock instead of waited for (`index_lock.rs`, which also
//! has every waiter on the index spin briefly before it sleeps); and, outside the locks, the
//! request is recorded in the in-flight table and the decision counted. A TTL purge the walk needs first is a write:
//! it runs under the exclusive lock when one is due (`KvIndex::purge_due`), before the walk.
//!
//! Invariants:
//! * Decisions walk and decide in parallel. A decision's load bump commits only if no other
//!   decision committed on the chosen instance since its load was read
//!   (`InstanceLoad::commit_routed`), else it decides again: the chosen instance's load is
//!   never stale at the commit, and the others' can only read low, so concurrent decisions see
//!   each other's load wherever it would change a least-score rule's choice (no thundering herd
//!   onto one idle instance; the lockstep tests and their negative controls; a rule normalised
//!   by the fleet's extremes is bounded, not exact: docs §3). Lock-free: a retry means another
//!   decision committed.
//! * A decision's index hits are those of its own walk, which may precede a concurrent
//!   decision's insert on route or an index feed's write: two concurrent decisions of one
//!   chain may both score it as cold, or both count a hit. (Before, one mutex from the walk
//!   to the load bump made each see the other's insert.) The index writes are applied one at
//!   a time — those under the exclusive lock alone, those in place each holding the mutexes of
//!   the holders it reorders from its first check to its last write, so that two which share
//!   a holder are ordered and two which do not commute — each to the index as it is then (entry ids trusted only while no entry has been
//!   freed since the walk; nothing written for an instance that has left), so the index after
//!   any interleaving equals the index after the same writes applied one by one in the order
//!   they were applied (the concurrent replay test checks it, re-fronts in place included). A
//!   write may land after later decisions' walks — a queued one at the latest before the next exclusive-lock write or the next
//!   walk that finds the index free, with at most `MAX_DEFERRED` (64) waiting (`index_lock.rs`).
//!   From one thread, every decision is exactly what it was under one mutex (nothing is queued).
//! * Under the exclusive lock run only the writes that change some holder's blocks: inserts
//!   on route that add or move blocks (O(prompt blocks)), records of sent blocks, index feeds
//!   (KV events), fleet changes and TTL purges. A write in place changes nothing a walk reads
//!   (holder bits, whether the tier holds a block): it costs O(prompt blocks) id comparisons
//!   when the chain already is the holders' newest run (a renewal, no entry written), else one
//!   sequence number written per block and holder.
//!   parking_lot's lock is fair to a waiting writer: it holds new walks back, so feeds are
//!   not starved, and waits for at most the walks and decisions in progress.
//! * Lock order: index (shared or exclusive) → the chosen instance's order mutex (its LRU and
//!   map) → the global tier's LRU mutex → its host pool's (in the pools' own index, the same
//!   order); or the in-flight table's mutex (read by the decode mask; a leaf, held with no
//!   other lock requested).
//! * Lifecycle calls (`on_prefilled`, `on_finished`, `on_aborted`) take the in-flight table's
//!   mutex and update atomics; only `on_finished` in exact mode takes the index's exclusive
//!   lock, once, to credit the answer's blocks (docs §2.7). A fleet change publishes a new
//!   [`Fleet`] through an `ArcSwap`, so readers of the fleet never block.
//! * Every load counter a decision raised is lowered exactly once by the request's
//!   lifecycle, whatever order or repetition the calls come in.
//!
//! Rooms: `request` (what goes in and out), `decide` (route and query), `lifecycle`,
//! `fleet_ops` (instances and engine load), `index_feed` (explicit index writes), `stats`.
//!
//! Complexity per decision: O(prompt tokens) hashing outside the locks; O(matched blocks
//! · ⌈N/64⌉) walk, O(N) scoring (again on a retry) and a write in place's O(prompt
//! blocks) under the shared lock; an insert that adds or evicts blocks, O(prompt blocks),
//! under the exclusive lock.

mod decide;
#[cfg(test)]
mod decode_budget_tests;
#[cfg(test)]
mod decode_mask_tests;
#[cfg(test)]
mod fetch_cost_tests;
mod fleet_ops;
#[cfg(test)]
mod host_tier_tests;
mod index_feed;
mod index_lock;
mod lifecycle;
mod request;
mod stats;
#[cfg(test)]
mod test_routes;
#[cfg(test)]
mod tests;

use std::sync::atomic::AtomicU64;
use std::time::Instant;

use arc_swap::ArcSwap;
use parking_lot::{Mutex, RwLock};

pub use request::{Decision, Hits, IndexOp, Prompt, RouteRequest, Tier};
pub use stats::RouterStats;

use crate::config::{DecodeMask, IndexMode, RouterConfig, SmetricRule};
use crate::decode_model::DecodeModel;
use crate::error::{Result, SmetricError};
use crate::fleet::Fleet;
use crate::index::{IndexLimits, KvIndex};
use crate::mix_map::MixMap;
use crate::policy::{Policy, PolicyKind, Reason};
use crate::rng::DrawCounter;
use lifecycle::InFlight;

/// The routing core. `Send + Sync`: share it behind an `Arc` between threads.
#[derive(Debug)]
pub struct Router {
    policy: Box<dyn Policy>,
    kind: PolicyKind,
    config: RouterConfig,
    block_size: u32,
    rng: DrawCounter,
    /// The index: decisions walk it (and re-front a chain its holders already hold, in place)
    /// under the shared lock; writes that change a holder's blocks take the exclusive lock.
    index: RwLock<KvIndex>,
    /// Decisions that found their chosen instance's load changed by another decision's commit
    /// since they read it, and decided again (`InstanceLoad::commit_routed`).
    decision_retries: AtomicU64,
    /// Index writes of decisions that found the index busy (`index_lock.rs`), applied by the next
    /// taker of the exclusive lock; `deferred_count` is their number, read without the mutex.
    deferred: Mutex<Vec<index_lock::RouteWrite>>,
    deferred_count: std::sync::atomic::AtomicUsize,
    /// Writes ever queued (counted under `deferred`'s mutex, so a write's count is its place in
    /// queue order) and ever applied from the queue: a thread's queued write is still waiting
    /// while `deferred_applied` is below its count.
    deferred_queued: AtomicU64,
    deferred_applied: AtomicU64,
    /// Test only: off, a thread may queue a write while its previous one still waits (the
    /// negative control of the rule that it may not).
    #[cfg(test)]
    pub(crate) one_queued_per_thread: bool,
    /// Test only: writes queued so far (the concurrent tests check they exercised the queue).
    #[cfg(test)]
    pub(crate) deferred_total: AtomicU64,
    fleet: ArcSwap<Fleet>,
    requests: Mutex<MixMap<crate::ids::RequestId, InFlight>>,
    next_request_id: AtomicU64,
    routed: AtomicU64,
    first_turns: AtomicU64,
    reasons: [AtomicU64; Reason::ALL.len()],
    unknown_events: AtomicU64,
    output_tokens: AtomicU64,
    /// The fleet's decode pace against in-flight context, learned from finished streams while
    /// `smetric_tpot_budget_s` is on (`decode_model.rs`).
    decode_model: DecodeModel,
    epoch: Instant,
    /// Whether this router places prefills only (a PD router's prefill pool): `smetric` v2
    /// then scores `q + w` instead of `(q + w) × active requests`.
    pub(crate) prefill_only: bool,
    /// Test only: every decision waits here after its walk (the shared lock held), so that a
    /// test can make all its threads' walks precede their decisions and index writes.
    #[cfg(test)]
    pub(crate) after_walk: Option<std::sync::Arc<crate::lockstep::Lockstep>>,
    /// Test only: every decision waits here once, after its first selection and before its
    /// commit, so that a test can make concurrent decisions read the same loads.
    #[cfg(test)]
    pub(crate) after_select: Option<std::sync::Arc<crate::lockstep::Lockstep>>,
    /// Test only: on, a decision bumps its instance's load without checking that no other
    /// decision committed there since it read it (the negative control of that check).
    #[cfg(test)]
    pub(crate) unchecked_commit: bool,
    /// Test only: request ids in the order their index writes were applied, and whether each
    /// was applied in place (under the shared lock).
    #[cfg(test)]
    pub(crate) write_order: Mutex<Vec<(crate::ids::RequestId, bool)>>,
}

/// Converts seconds to the index's millisecond clock, rounded down. (`as` truncates toward zero
/// and saturates, which is the floor for every value a clock gives, and 0 for a negative or NaN
/// one as the floor would give: no call into libm's `floor` on each decision.)
pub(crate) fn to_ms(seconds: f64) -> u64 {
    (seconds * 1000.0) as u64
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
        index.enable_host_tiers(config.host_capacity_blocks);
        if config.index_mode == IndexMode::Exact {
            index.enable_pending(to_ms(config.exact_pending_ttl_s), config.exact_answer_credit);
        }
        Ok(Self {
            policy: kind.build(),
            kind,
            block_size,
            rng: DrawCounter::new(seed),
            index: RwLock::new(index),
            decision_retries: AtomicU64::new(0),
            deferred: Mutex::new(Vec::new()),
            deferred_count: std::sync::atomic::AtomicUsize::new(0),
            deferred_queued: AtomicU64::new(0),
            deferred_applied: AtomicU64::new(0),
            #[cfg(test)]
            one_queued_per_thread: true,
            #[cfg(test)]
            deferred_total: AtomicU64::new(0),
            fleet: ArcSwap::from_pointee(fleet),
            requests: Mutex::new(MixMap::default()),
            next_request_id: AtomicU64::new(crate::ids::RequestId::FIRST_GENERATED),
            routed: AtomicU64::new(0),
            first_turns: AtomicU64::new(0),
            reasons: Default::default(),
            unknown_events: AtomicU64::new(0),
            output_tokens: AtomicU64::new(0),
            decode_model: DecodeModel::default(),
            epoch: Instant::now(),
            prefill_only: false,
            #[cfg(test)]
            after_walk: None,
            #[cfg(test)]
            after_select: None,
            #[cfg(test)]
            unchecked_commit: false,
            #[cfg(test)]
            write_order: Mutex::default(),
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

    /// Whether a lifecycle call (`on_prefilled`, `on_finished`, `on_aborted`) may wait for a
    /// lock another caller holds for more than O(1) work: the index's exclusive lock, which an
    /// exact-mode `on_finished` takes to credit an answer (a decision's write holds it for
    /// O(prompt blocks)), or the in-flight table's mutex, which a decision holds for
    /// O(in flight) while the decode mask reads live decodes. Otherwise every holder of the
    /// locks a lifecycle call takes does O(1) work under them (a map operation, a drain-rate
    /// window's update), so a binding may wait for them without releasing its interpreter lock.
    pub fn lifecycle_may_wait(&self) -> bool {
        self.decode_mask_on() || self.credits_answers()
    }

    /// Whether a finished request's answer blocks are credited on its instance (exact mode with
    /// `exact_answer_credit`, docs §2.7): `on_finished` then takes the index's exclusive lock.
    pub(crate) fn credits_answers(&self) -> bool {
        self.config.index_mode == IndexMode::Exact && self.config.exact_answer_credit
    }

    /// Whether decisions apply `smetric` v2's decode mask (co-located routers only: a prefill
    /// pool has no decodes), so that the router tracks live decodes for it.
    pub(crate) fn decode_mask_on(&self) -> bool {
        self.kind == PolicyKind::Smetric
            && self.config.smetric_rule == SmetricRule::V2
            && self.config.smetric_decode_mask != DecodeMask::Off
            && !self.prefill_only
    }

    /// Whether decisions apply `smetric` v2's decode budget (co-located routers only, as the
    /// mask), so that the router learns the fleet's decode pace for it.
    pub(crate) fn decode_budget_on(&self) -> bool {
        self.kind == PolicyKind::Smetric
            && self.config.smetric_rule == SmetricRule::V2
            && self.config.smetric_tpot_budget_s > 0.0
            && !self.prefill_only
    }

    /// Whether `smetric` v2 prices a shared-store hit at each instance's learned fetch cost
    /// (`fetch_cost.rs`), so that decisions charge it and first tokens teach it.
    pub(crate) fn fetch_learning_on(&self) -> bool {
        self.kind == PolicyKind::Smetric
            && self.config.smetric_rule == SmetricRule::V2
            && self.config.smetric_store_pricing
            && self.config.smetric_learn_fetch_cost
    }

    /// How a hit counts in tokens for an `n`-token prompt, as vLLM counts one (see
    /// [`HitTokens`]).
    fn hit_tokens(&self, n: u64) -> HitTokens {
        let block_size = u64::from(self.block_size);
        HitTokens {
            max_blocks: n.saturating_sub(1) / block_size,
            block_size,
        }
    }
}

/// A hit of some blocks in tokens, as vLLM counts one for a prompt of `n` tokens: whole blocks
/// within the first `n − 1` tokens (the last token is always computed, and vLLM's longest-hit
/// search stops at the last block that fits in `n − 1`), so a cached prompt of whole blocks
/// hits `n − B`, not `n − 1` (docs §2.4). The cap is divided out once per request, not once
/// per candidate (a 64-bit division each: perf's hottest spot in a 1K-token decision).
#[derive(Clone, Copy)]
struct HitTokens {
    max_blocks: u64,
    block_size: u64,
}

impl HitTokens {
    fn of(self, blocks: u32) -> u64 {
        u64::from(blocks).min(self.max_blocks) * self.block_size
    }
}
