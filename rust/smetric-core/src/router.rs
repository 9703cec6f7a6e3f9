//! The router: hash → query the index → read the load board → policy → record.
//!
//! Under the index mutex, a decision hashes the prompt while it queries the two-tier index
//! (`KvIndex::query_tokens`: along blocks the index holds, each block's hash is seeded from
//! the previous block's entry, so the hashes do not wait for each other), reads every
//! candidate's load from the lock-free board, asks the policy, inserts the chain on route
//! (approximate mode; reusing the entry ids the query found) and bumps the chosen
//! instance's counters. Holding the index mutex across the whole decision serialises
//! decisions, so two concurrent requests always see each other's load (no thundering herd
//! onto one idle instance); the critical section is the hashing walk plus an O(N) scoring
//! loop and the insert (for a prompt the index holds, hashing dominates it).
//!
//! Lifecycle calls (`on_prefilled`, `on_finished`, `on_aborted`) only take the request-table
//! mutex and update atomics. Control-plane calls (fleet changes, index feeds) take the
//! index mutex.
//!
//! Complexity per decision: O(prompt tokens) hashing + O(matched blocks · ⌈N/64⌉) query +
//! O(N) scoring + O(prompt blocks) insert.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use arc_swap::ArcSwap;
use parking_lot::Mutex;

use crate::config::{IndexMode, RouterConfig};
use crate::error::{Result, SmetricError};
use crate::fleet::Fleet;
use crate::hash::{chain_root, hash_tokens_into};
use crate::ids::{BlockHash, InstanceId, RequestId};
use crate::index::{Holder, IndexLimits, IndexQuery, IndexStats, KvIndex, MixMap};
use crate::load::LoadSnapshot;
use crate::policy::{Candidate, Policy, PolicyKind, Reason, SelectionInput};
use crate::rng::DrawCounter;
use crate::turn::{TurnHint, TurnSource, infer};

/// The prompt of a request.
#[derive(Debug, Clone, Copy)]
pub enum Prompt<'a> {
    /// Token ids; the router hashes full blocks.
    Tokens(&'a [u32]),
    /// A pre-hashed block chain (e.g. a trace's `hash_ids`) and the prompt length, which
    /// defaults to `hashes.len() · block_size`.
    Hashes {
        /// The chain.
        hashes: &'a [BlockHash],
        /// Prompt length in tokens.
        num_tokens: Option<u64>,
    },
}

/// One routing request.
#[derive(Debug, Clone, Copy)]
pub struct RouteRequest<'a> {
    /// The prompt.
    pub prompt: Prompt<'a>,
    /// Namespace mixed into the hash chain (LoRA name, cache salt); tokens only.
    pub namespace: Option<&'a str>,
    /// What the caller knows about the turn.
    pub turn: TurnHint,
    /// The caller's id; the router issues one when absent.
    pub request_id: Option<RequestId>,
    /// Time in seconds; the router's own clock when absent.
    pub now: Option<f64>,
}

impl<'a> RouteRequest<'a> {
    /// A request with only a prompt.
    pub fn new(prompt: Prompt<'a>) -> Self {
        Self {
            prompt,
            namespace: None,
            turn: TurnHint::Unknown,
            request_id: None,
            now: None,
        }
    }
}

/// The router's answer.
#[derive(Debug, Clone)]
pub struct Decision {
    /// Chosen instance slot.
    pub instance: InstanceId,
    /// Chosen instance name.
    pub instance_name: Arc<str>,
    /// Whether the request was treated as a first turn.
    pub first_turn: bool,
    /// Where that verdict came from.
    pub turn_source: TurnSource,
    /// Local prefix hit on the chosen instance, in tokens.
    pub local_hit_tokens: u64,
    /// Global-tier prefix hit, in tokens.
    pub global_hit_tokens: u64,
    /// Tokens the chosen instance will prefill: `n − max(local, global)`.
    pub prefill_tokens: u64,
    /// Prompt length in tokens.
    pub num_tokens: u64,
    /// Why the policy chose it.
    pub reason: Reason,
    /// The request's id (the caller's or an issued one).
    pub request_id: RequestId,
}

/// Hits of every live instance for one prompt (introspection; `Router::query`).
#[derive(Debug, Clone)]
pub struct Hits {
    /// `(name, local hit tokens)` in slot order.
    pub local: Vec<(Arc<str>, u64)>,
    /// Global-tier hit in tokens.
    pub global_hit_tokens: u64,
    /// Deepest match over all holders, in blocks.
    pub deepest_blocks: u32,
    /// Children of the deepest matched block.
    pub branches: u32,
}

/// Which tier an explicit index call addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    /// An instance's GPU cache.
    Local,
    /// The cluster-wide CPU/store tier.
    Global,
}

/// One index write of a batch applied by [`Router::apply_blocks`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IndexOp<'a> {
    /// As [`Router::store_blocks`]: the tier now holds `hashes`, a run continuing `parent`.
    Store {
        /// The tier written.
        tier: Tier,
        /// The run.
        hashes: &'a [BlockHash],
        /// The block the run continues.
        parent: Option<BlockHash>,
    },
    /// As [`Router::remove_blocks`]: the tier dropped `hashes`.
    Remove {
        /// The tier written.
        tier: Tier,
        /// The dropped blocks.
        hashes: &'a [BlockHash],
    },
}

#[derive(Debug, Clone, Copy)]
struct InFlight {
    slot: u32,
    generation: u32,
    prefill: u64,
    num_tokens: u64,
    prefilled: bool,
}

#[derive(Debug)]
struct Guarded {
    index: KvIndex,
    query: IndexQuery,
    candidates: Vec<Candidate>,
    /// The hash chain of the token prompt being routed (a buffer kept between calls).
    chain: Vec<BlockHash>,
}

/// Chain buffer capacity (in blocks) kept between calls; a longer prompt's buffer is freed.
const KEPT_CHAIN_BLOCKS: usize = 1 << 16;

/// Counters reported by `stats()`.
#[derive(Debug, Clone, Default)]
pub struct RouterStats {
    /// Decisions made.
    pub routed: u64,
    /// Decisions treated as first turns.
    pub first_turns: u64,
    /// Decisions per reason, in [`Reason::ALL`] order.
    pub reasons: Vec<(&'static str, u64)>,
    /// Lifecycle calls for unknown or already finished requests.
    pub unknown_request_events: u64,
    /// Requests in flight.
    pub in_flight: usize,
    /// Random draws taken.
    pub draws: u64,
    /// Index counts.
    pub index: IndexStats,
    /// Blocks each live instance holds, by name in slot order.
    pub local_blocks: Vec<(Arc<str>, usize)>,
    /// Heap bytes of the index.
    pub index_bytes: usize,
    /// Heap bytes of the index by component (see `KvIndex::memory_breakdown`).
    pub index_breakdown: Vec<(&'static str, usize)>,
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
    requests: Mutex<MixMap<RequestId, InFlight>>,
    next_request_id: AtomicU64,
    routed: AtomicU64,
    first_turns: AtomicU64,
    reasons: [AtomicU64; Reason::ALL.len()],
    unknown_events: AtomicU64,
    epoch: Instant,
}

/// Converts seconds to the index's millisecond clock.
fn to_ms(seconds: f64) -> u64 {
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
        Ok(Self {
            policy: kind.build(),
            kind,
            block_size,
            rng: DrawCounter::new(seed),
            guarded: Mutex::new(Guarded {
                index,
                query: IndexQuery::default(),
                candidates: Vec::new(),
                chain: Vec::new(),
            }),
            fleet: ArcSwap::from_pointee(fleet),
            requests: Mutex::new(MixMap::default()),
            next_request_id: AtomicU64::new(RequestId::FIRST_GENERATED),
            routed: AtomicU64::new(0),
            first_turns: AtomicU64::new(0),
            reasons: Default::default(),
            unknown_events: AtomicU64::new(0),
            epoch: Instant::now(),
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
    pub fn instances(&self) -> Vec<Arc<str>> {
        self.fleet.load().members().map(|(_, m)| m.name.clone()).collect()
    }

    fn now_ms(&self, now: Option<f64>) -> Result<u64> {
        match now {
            None => Ok(to_ms(self.epoch.elapsed().as_secs_f64())),
            Some(t) if t.is_finite() && t >= 0.0 => Ok(to_ms(t)),
            Some(t) => Err(SmetricError::InvalidArgument {
                argument: "now",
                reason: format!("must be finite and >= 0, got {t}"),
            }),
        }
    }

    /// The block chain of a token prompt under this router's seed and block size.
    pub fn hash_tokens(&self, tokens: &[u32], namespace: Option<&str>) -> Vec<BlockHash> {
        let mut out = Vec::new();
        hash_tokens_into(
            tokens,
            self.block_size as usize,
            self.config.hash_seed,
            namespace,
            &mut out,
        );
        out
    }

    fn hit_tokens(&self, blocks: u32, n: u64) -> u64 {
        (u64::from(blocks) * u64::from(self.block_size)).min(n.saturating_sub(1))
    }

    /// Queries the index for a prompt (docs §2.4), hashing a token prompt into `scratch` on the
    /// way (see [`KvIndex::query_tokens`]); returns the chain and the prompt length.
    fn query_prompt<'a>(
        &self,
        index: &mut KvIndex,
        prompt: Prompt<'a>,
        namespace: Option<&str>,
        now_ms: u64,
        scratch: &'a mut Vec<BlockHash>,
        out: &mut IndexQuery,
    ) -> (&'a [BlockHash], u64) {
        match prompt {
            Prompt::Tokens(tokens) => {
                let root = chain_root(self.config.hash_seed, namespace);
                index.query_tokens(tokens, self.block_size as usize, root, now_ms, scratch, out);
                (scratch.as_slice(), tokens.len() as u64)
            }
            Prompt::Hashes { hashes, num_tokens } => {
                index.query(hashes, now_ms, out);
                (
                    hashes,
                    num_tokens.unwrap_or(hashes.len() as u64 * u64::from(self.block_size)),
                )
            }
        }
    }

    /// Routes one request.
    pub fn route(&self, req: &RouteRequest<'_>) -> Result<Decision> {
        let now_ms = self.now_ms(req.now)?;
        if let TurnHint::Turn(0) = req.turn {
            return Err(SmetricError::InvalidArgument {
                argument: "turn",
                reason: "turns count from 1".to_owned(),
            });
        }
        let staleness_ms = to_ms(self.config.engine_load_staleness_s);

        let mut g = self.guarded.lock();
        let fleet = self.fleet.load_full();
        if fleet.is_empty() {
            return Err(SmetricError::NoInstances);
        }
        let Guarded {
            index,
            query,
            candidates,
            chain: scratch,
        } = &mut *g;
        scratch.clear();
        if scratch.capacity() > KEPT_CHAIN_BLOCKS {
            *scratch = Vec::new();
        }
        let (chain, n) = self.query_prompt(index, req.prompt, req.namespace, now_ms, scratch, query);
        candidates.clear();
        for (slot, m) in fleet.members() {
            let load = m.load.effective(now_ms, staleness_ms);
            candidates.push(Candidate {
                slot,
                local_hit_tokens: self.hit_tokens(query.local_blocks[slot as usize], n),
                bs: load.bs,
                waiting: load.waiting,
                queued: load.queued,
                active: load.active,
            });
        }
        let global_hit_tokens = self.hit_tokens(query.global_blocks, n);
        let (first_turn, turn_source) = infer(
            req.turn,
            query.deepest_blocks,
            query.branches,
            self.config.first_turn_min_branches,
        );
        let selection = self.policy.select(&SelectionInput {
            candidates,
            num_tokens: n,
            global_hit_tokens,
            first_turn,
            block_size: self.block_size,
            config: &self.config,
            rng: &self.rng,
        });
        let chosen = candidates[selection.index];
        if self.config.index_mode == IndexMode::Approximate {
            index.touch_queried(chosen.slot, chain, now_ms);
        }
        let member = fleet.member(chosen.slot).expect("candidates are live members");
        let prefill = n - chosen.local_hit_tokens.max(global_hit_tokens).min(n);
        member.load.on_routed(prefill, n);
        // Issued only for a decision that happened, so a failed call consumes no id.
        let request_id = req
            .request_id
            .unwrap_or_else(|| RequestId(self.next_request_id.fetch_add(1, Ordering::Relaxed)));
        drop(g);

        self.requests.lock().insert(
            request_id,
            InFlight {
                slot: chosen.slot,
                generation: member.generation,
                prefill,
                num_tokens: n,
                prefilled: false,
            },
        );
        self.routed.fetch_add(1, Ordering::Relaxed);
        self.first_turns.fetch_add(u64::from(first_turn), Ordering::Relaxed);
        let reason_idx = Reason::ALL.iter().position(|r| *r == selection.reason).unwrap_or(0);
        self.reasons[reason_idx].fetch_add(1, Ordering::Relaxed);
        Ok(Decision {
            instance: InstanceId(chosen.slot),
            instance_name: member.name.clone(),
            first_turn,
            turn_source,
            local_hit_tokens: chosen.local_hit_tokens,
            global_hit_tokens,
            prefill_tokens: prefill,
            num_tokens: n,
            reason: selection.reason,
            request_id,
        })
    }

    /// Index hits of a prompt on every live instance (touches nothing but TTL purges).
    pub fn query(&self, prompt: Prompt<'_>, namespace: Option<&str>, now: Option<f64>) -> Result<Hits> {
        let now_ms = self.now_ms(now)?;
        let mut g = self.guarded.lock();
        let fleet = self.fleet.load_full();
        let Guarded {
            index,
            query,
            chain: scratch,
            ..
        } = &mut *g;
        scratch.clear();
        let (_, n) = self.query_prompt(index, prompt, namespace, now_ms, scratch, query);
        Ok(Hits {
            local: fleet
                .members()
                .map(|(slot, m)| (m.name.clone(), self.hit_tokens(query.local_blocks[slot as usize], n)))
                .collect(),
            global_hit_tokens: self.hit_tokens(query.global_blocks, n),
            deepest_blocks: query.deepest_blocks,
            branches: query.branches,
        })
    }

    /// The load counters of the slot a request was routed to, if that occupant is still there.
    fn load_of(&self, rec: &InFlight) -> Option<Arc<crate::load::InstanceLoad>> {
        let fleet = self.fleet.load();
        fleet
            .member(rec.slot)
            .filter(|m| m.generation == rec.generation)
            .map(|m| m.load.clone())
    }

    fn unknown(&self) -> bool {
        self.unknown_events.fetch_add(1, Ordering::Relaxed);
        false
    }

    /// The request finished its prefill (its first token is out). Returns whether a counter
    /// changed; repeated or unknown calls change nothing.
    pub fn on_prefilled(&self, id: RequestId) -> bool {
        let mut requests = self.requests.lock();
        let Some(rec) = requests.get_mut(&id) else {
            return self.unknown();
        };
        if rec.prefilled {
            return false;
        }
        let Some(load) = self.load_of(rec) else { return false };
        rec.prefilled = true;
        load.on_prefilled(rec.prefill);
        true
    }

    /// The request finished. `output_tokens` is accepted for accounting symmetry with
    /// engines; the board tracks prompt tokens only.
    pub fn on_finished(&self, id: RequestId, _output_tokens: u64) -> bool {
        self.done(id)
    }

    /// The request was aborted (client gone, engine error).
    pub fn on_aborted(&self, id: RequestId) -> bool {
        self.done(id)
    }

    /// Forgets a request, applying its prefill step first if it never came.
    fn done(&self, id: RequestId) -> bool {
        let Some(rec) = self.requests.lock().remove(&id) else {
            return self.unknown();
        };
        let Some(load) = self.load_of(&rec) else { return false };
        if !rec.prefilled {
            load.on_prefilled(rec.prefill);
        }
        load.on_done(rec.num_tokens);
        true
    }

    /// Adds an instance (empty index, zero load).
    pub fn add_instance(&self, name: &str) -> Result<InstanceId> {
        let mut g = self.guarded.lock();
        let mut fleet = (**self.fleet.load()).clone();
        let slot = fleet.add(name)?;
        g.index.add_slot(slot);
        self.fleet.store(Arc::new(fleet));
        Ok(InstanceId(slot))
    }

    /// Removes an instance; its index entries and load go with it. Requests in flight on it
    /// are forgotten by their later lifecycle calls.
    pub fn remove_instance(&self, name: &str) -> Result<()> {
        let mut g = self.guarded.lock();
        let mut fleet = (**self.fleet.load()).clone();
        let slot = fleet.remove(name)?;
        g.index.remove_slot(slot);
        self.fleet.store(Arc::new(fleet));
        Ok(())
    }

    /// Stores an engine load snapshot for `instance`.
    pub fn update_load(
        &self,
        instance: &str,
        running: Option<u64>,
        waiting: Option<u64>,
        kv_usage: Option<f64>,
        now: Option<f64>,
    ) -> Result<()> {
        let now_ms = self.now_ms(now)?;
        if let Some(k) = kv_usage {
            if !(k.is_finite() && (0.0..=1.0).contains(&k)) {
                return Err(SmetricError::InvalidArgument {
                    argument: "kv_usage",
                    reason: format!("must be in [0, 1], got {k}"),
                });
            }
        }
        let fleet = self.fleet.load();
        let (_, m) = fleet.by_name(instance)?;
        m.load.update_engine(running, waiting, kv_usage, now_ms);
        Ok(())
    }

    /// The load counters of `instance`.
    pub fn load(&self, instance: &str) -> Result<LoadSnapshot> {
        let fleet = self.fleet.load();
        Ok(fleet.by_name(instance)?.1.load.snapshot())
    }

    fn holder(&self, instance: Option<&str>, tier: Tier) -> Result<Holder> {
        match (tier, instance) {
            (Tier::Global, _) => Ok(Holder::Global),
            (Tier::Local, Some(name)) => Ok(Holder::Instance(self.fleet.load().by_name(name)?.0)),
            (Tier::Local, None) => Err(SmetricError::InvalidArgument {
                argument: "instance",
                reason: "tier=\"local\" needs an instance name".to_owned(),
            }),
        }
    }

    /// Records that `instance` (or the global tier) now holds `hashes`, a run continuing `parent`.
    pub fn store_blocks(
        &self,
        instance: Option<&str>,
        tier: Tier,
        hashes: &[BlockHash],
        parent: Option<BlockHash>,
        now: Option<f64>,
    ) -> Result<()> {
        let now_ms = self.now_ms(now)?;
        let mut g = self.guarded.lock();
        let holder = self.holder(instance, tier)?;
        g.index.touch(holder, hashes, parent, now_ms);
        Ok(())
    }

    /// Records that `instance` (or the global tier) dropped `hashes`.
    pub fn remove_blocks(&self, instance: Option<&str>, tier: Tier, hashes: &[BlockHash]) -> Result<()> {
        let mut g = self.guarded.lock();
        let holder = self.holder(instance, tier)?;
        g.index.remove(holder, hashes);
        Ok(())
    }

    /// Applies `ops` in order under one index lock and one clock reading: the same as calling
    /// [`Router::store_blocks`] / [`Router::remove_blocks`] with `instance` for each op, but
    /// `instance` is resolved once. An op that fails (its tier is `Local` and `instance` is
    /// absent or unknown) is skipped and the others still apply; the first error is returned.
    ///
    /// Complexity: the sum of the ops' costs, plus one lock acquisition and one name lookup.
    pub fn apply_blocks(&self, instance: Option<&str>, ops: &[IndexOp<'_>], now: Option<f64>) -> Result<()> {
        let now_ms = self.now_ms(now)?;
        let mut g = self.guarded.lock();
        let mut local = None;
        let mut first_error = None;
        for op in ops {
            let tier = match *op {
                IndexOp::Store { tier, .. } | IndexOp::Remove { tier, .. } => tier,
            };
            let holder = match tier {
                Tier::Global => Holder::Global,
                Tier::Local => match local.get_or_insert_with(|| self.holder(instance, Tier::Local)) {
                    Ok(holder) => *holder,
                    Err(e) => {
                        first_error.get_or_insert_with(|| e.clone());
                        continue;
                    }
                },
            };
            match *op {
                IndexOp::Store { hashes, parent, .. } => g.index.touch(holder, hashes, parent, now_ms),
                IndexOp::Remove { hashes, .. } => g.index.remove(holder, hashes),
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Drops everything `instance` (or the global tier) holds.
    pub fn clear(&self, instance: Option<&str>, tier: Tier) -> Result<()> {
        let mut g = self.guarded.lock();
        match self.holder(instance, tier)? {
            Holder::Instance(slot) => g.index.clear_instance(slot),
            Holder::Global => g.index.clear_global(),
        }
        Ok(())
    }

    /// Counters and index sizes.
    pub fn stats(&self) -> RouterStats {
        let g = self.guarded.lock();
        let index = g.index.stats();
        let fleet = self.fleet.load();
        let local_blocks = fleet
            .members()
            .map(|(slot, m)| {
                (
                    m.name.clone(),
                    index.local_blocks.get(slot as usize).copied().unwrap_or(0),
                )
            })
            .collect();
        RouterStats {
            routed: self.routed.load(Ordering::Relaxed),
            first_turns: self.first_turns.load(Ordering::Relaxed),
            reasons: Reason::ALL
                .iter()
                .zip(&self.reasons)
                .map(|(r, c)| (r.as_str(), c.load(Ordering::Relaxed)))
                .collect(),
            unknown_request_events: self.unknown_events.load(Ordering::Relaxed),
            in_flight: self.requests.lock().len(),
            draws: self.rng.draws(),
            index,
            local_blocks,
            index_bytes: g.index.memory_bytes(),
            index_breakdown: g.index.memory_breakdown().to_vec(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("i{i}")).collect()
    }

    #[test]
    fn follow_up_returns_home_and_lifecycle_balances() {
        let r = Router::new(&names(4), PolicyKind::Smetric, 4, 1, RouterConfig::default()).unwrap();
        let turn1: Vec<u32> = (0..40).collect();
        let d1 = r
            .route(&RouteRequest {
                now: Some(0.0),
                ..RouteRequest::new(Prompt::Tokens(&turn1))
            })
            .unwrap();
        assert!(d1.first_turn);
        let mut turn2 = turn1.clone();
        turn2.extend(100..140);
        let d2 = r
            .route(&RouteRequest {
                now: Some(1.0),
                ..RouteRequest::new(Prompt::Tokens(&turn2))
            })
            .unwrap();
        assert!(!d2.first_turn);
        assert_eq!(d2.instance, d1.instance);
        assert_eq!(d2.local_hit_tokens, 40);
        for id in [d1.request_id, d2.request_id] {
            assert!(r.on_prefilled(id));
            assert!(r.on_finished(id, 10));
            assert!(!r.on_finished(id, 10), "a second finish changes nothing");
        }
        let l = r.load(&d1.instance_name).unwrap();
        assert_eq!((l.bs, l.waiting, l.queued, l.active), (0, 0, 0, 0));
        assert_eq!(r.stats().unknown_request_events, 2);
    }

    #[test]
    fn removed_instance_is_never_chosen_and_slot_reuse_is_safe() {
        let r = Router::new(&names(2), PolicyKind::RoundRobin, 16, 0, RouterConfig::default()).unwrap();
        let d = r.route(&RouteRequest::new(Prompt::Tokens(&[1, 2, 3]))).unwrap();
        let gone = d.instance_name.clone();
        r.remove_instance(&gone).unwrap();
        r.add_instance("new").unwrap();
        assert!(
            !r.on_finished(d.request_id, 0),
            "the new occupant's counters are not touched"
        );
        let l = r.load("new").unwrap();
        assert_eq!(l.bs, 0);
        for _ in 0..4 {
            let d = r.route(&RouteRequest::new(Prompt::Tokens(&[1, 2, 3]))).unwrap();
            assert_ne!(d.instance_name, gone);
        }
        assert!(matches!(
            r.add_instance("new"),
            Err(SmetricError::DuplicateInstance { .. })
        ));
        assert!(matches!(
            r.remove_instance("zzz"),
            Err(SmetricError::UnknownInstance { .. })
        ));
    }

    #[test]
    fn bad_construction() {
        assert!(matches!(
            Router::new(&[], PolicyKind::Smetric, 16, 0, RouterConfig::default()),
            Err(SmetricError::NoInstances)
        ));
        assert!(matches!(
            Router::new(&names(1), PolicyKind::Smetric, 0, 0, RouterConfig::default()),
            Err(SmetricError::InvalidBlockSize { .. })
        ));
        let r = Router::new(&names(1), PolicyKind::Smetric, 16, 0, RouterConfig::default()).unwrap();
        r.remove_instance("i0").unwrap();
        assert!(matches!(
            r.route(&RouteRequest::new(Prompt::Tokens(&[1]))),
            Err(SmetricError::NoInstances)
        ));
    }

    #[test]
    fn apply_blocks_matches_one_call_per_op() {
        let (a, b) = (BlockHash(11), BlockHash(12));
        let ops = [
            IndexOp::Store {
                tier: Tier::Local,
                hashes: &[a, b],
                parent: None,
            },
            IndexOp::Store {
                tier: Tier::Global,
                hashes: &[a],
                parent: None,
            },
            IndexOp::Remove {
                tier: Tier::Local,
                hashes: &[b],
            },
        ];
        let hits = |r: &Router| {
            let h = r
                .query(
                    Prompt::Hashes {
                        hashes: &[a, b],
                        num_tokens: Some(9),
                    },
                    None,
                    Some(0.0),
                )
                .unwrap();
            (h.local, h.global_hit_tokens)
        };
        let batched = Router::new(&names(2), PolicyKind::Smetric, 4, 0, RouterConfig::default()).unwrap();
        batched.apply_blocks(Some("i1"), &ops, Some(0.0)).unwrap();
        let single = Router::new(&names(2), PolicyKind::Smetric, 4, 0, RouterConfig::default()).unwrap();
        single
            .store_blocks(Some("i1"), Tier::Local, &[a, b], None, Some(0.0))
            .unwrap();
        single.store_blocks(None, Tier::Global, &[a], None, Some(0.0)).unwrap();
        single.remove_blocks(Some("i1"), Tier::Local, &[b]).unwrap();
        assert_eq!(hits(&batched), hits(&single));
        assert_eq!(hits(&batched).1, 4);
        // Ops on an unknown instance fail; the others still apply.
        let r = Router::new(&names(1), PolicyKind::Smetric, 4, 0, RouterConfig::default()).unwrap();
        assert!(matches!(
            r.apply_blocks(Some("zzz"), &ops, Some(0.0)),
            Err(SmetricError::UnknownInstance { .. })
        ));
        assert_eq!(hits(&r), (vec![(Arc::from("i0"), 0)], 4));
    }
}
