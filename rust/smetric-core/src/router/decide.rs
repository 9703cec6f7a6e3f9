//! The decision path: [`Router::route`] and its read-only twin [`Router::query`].
//!
//! Algorithm: a token prompt is hashed into a buffer owned by the calling thread before any
//! index lock is taken (so threads hash in parallel); the walk runs under the index's shared
//! lock (so threads walk in parallel), into buffers of the thread ([`Scratch`]); the scoring
//! and the load bump take no lock (the bump commits on the chosen instance if no decision
//! committed there since its load was read, else the loads are read and scored again:
//! `InstanceLoad::commit_routed`); an index write that changes no holder's blocks runs in
//! place under the shared lock; an index write that does change blocks runs after, under the
//! exclusive lock, or is queued for the next taker of that lock when another thread holds the
//! index (`index_lock.rs`); the in-flight record and the counters last.
//!
//! Invariants: a failed call changes nothing (no request id consumed, no counter bumped);
//! the chain inserted on route is exactly the chain queried; a decision uses the hits of its
//! own walk, which other decisions' writes may have followed (see the `router` module).
//!
//! Complexity: see the `router` module.

use std::cell::RefCell;
use std::sync::atomic::Ordering;

use parking_lot::{RwLockReadGuard, RwLockWriteGuard};

use super::index_lock::RouteWrite;
use super::{InFlight, Router, to_ms};
use crate::config::IndexMode;
use crate::decode_contract::{LiveDecode, balance_s};
use crate::error::{Result, SmetricError};
use crate::fleet::{Fleet, Member};
use crate::hash::{chain_root, chain_shared_into, chain_tokens_into, shared_ids_supported};
use crate::ids::{BlockHash, InstanceId, RequestId};
use crate::index::{IndexQuery, KvIndex, Walk};
use crate::load::InstanceLoad;
use crate::policy::{
    Candidate, PolicyKind, Reason, SelectionInput, fetch_work, preble_routed_cost_us, prefill_work, prompt_key,
};
use crate::router::request::{Decision, Hits, Prompt, RouteRequest};
use crate::turn::{TurnHint, infer};

/// Chain buffer capacity (in blocks) a thread keeps between calls; a longer prompt's buffer
/// is freed after its call (2^16 blocks = 512 KiB, a 1M-token prompt at block size 16).
const KEPT_CHAIN_BLOCKS: usize = 1 << 16;

/// A decision's buffers, kept by the calling thread between its calls: the query's answer,
/// the walk the index write reuses, the candidates.
#[derive(Default)]
struct Scratch {
    query: IndexQuery,
    walk: Walk,
    candidates: Vec<Candidate>,
    /// Per candidate, its instance's decision count read before its load (the commit's check).
    versions: Vec<u64>,
    /// Per slot, the smallest non-negative live-decode balance (the decode mask only).
    rooms: Vec<Option<f64>>,
}

thread_local! {
    /// The calling thread's chain buffer: a decision hashes into it outside the index lock.
    static CHAIN: RefCell<Vec<BlockHash>> = const { RefCell::new(Vec::new()) };
    /// The calling thread's decision buffers ([`Scratch`]).
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// Runs `f` with the calling thread's [`Scratch`]; a re-entrant call (none today) gets buffers
/// of its own rather than a panic.
fn with_scratch<T>(f: impl FnOnce(&mut Scratch) -> T) -> T {
    SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut scratch) => f(&mut scratch),
        Err(_) => f(&mut Scratch::default()),
    })
}

/// A decision committed on its instance: what the rest of the route records, writes and
/// answers.
struct Committed<'f> {
    reason: Reason,
    chosen: Candidate,
    member: &'f Member,
    /// Prompt tokens the instance is expected to prefill.
    prefill: u64,
    /// The prefill work charged on the instance (the store's load included).
    work: u64,
    /// Tokens loaded from the shared store (counted only while the fetch cost is learned).
    fetched: u64,
    /// Of `work`, the load from the shared store.
    fetch_work: u64,
}

impl Router {
    /// The block chain of a token prompt under this router's seed and block size.
    pub fn hash_tokens(&self, tokens: &[u32], namespace: Option<&str>) -> Vec<BlockHash> {
        let mut out = Vec::new();
        chain_tokens_into(
            tokens,
            self.block_size as usize,
            chain_root(self.config.hash_seed, namespace),
            &mut out,
        );
        out
    }

    /// Appends the block chain of any prompt to `out`: tokens and shared ids hashed under this
    /// router's seed and block size, pre-hashed input as given. Refuses a negative id of a
    /// signed shared prompt, and shared ids at a block size they cannot be read at.
    pub fn chain_prompt_into(
        &self,
        prompt: Prompt<'_>,
        namespace: Option<&str>,
        out: &mut Vec<BlockHash>,
    ) -> Result<()> {
        let root = chain_root(self.config.hash_seed, namespace);
        let block_size = self.block_size as usize;
        match prompt {
            Prompt::Hashes { hashes, .. } => out.extend_from_slice(hashes),
            Prompt::Tokens(tokens) => chain_tokens_into(tokens, block_size, root, out),
            Prompt::Shared(ids) => {
                if !shared_ids_supported(block_size) {
                    return Err(SmetricError::InvalidArgument {
                        argument: "tokens",
                        reason: format!("ids read in place need an even block size up to 128, not {block_size}"),
                    });
                }
                chain_shared_into(ids, block_size, root, out)
                    .map_err(|(position, value)| SmetricError::InvalidToken { position, value })?;
            }
        }
        Ok(())
    }

    /// A prompt's length in tokens.
    pub fn prompt_tokens(&self, prompt: Prompt<'_>) -> u64 {
        match prompt {
            Prompt::Hashes { hashes, num_tokens } => {
                num_tokens.unwrap_or(hashes.len() as u64 * u64::from(self.block_size))
            }
            Prompt::Tokens(tokens) => tokens.len() as u64,
            Prompt::Shared(ids) => ids.len() as u64,
        }
    }

    /// Runs `f` with the prompt's chain and length: a token prompt hashed into the thread's
    /// buffer, pre-hashed input as given.
    fn with_chain<T>(
        &self,
        prompt: Prompt<'_>,
        namespace: Option<&str>,
        f: impl FnOnce(&[BlockHash], u64) -> Result<T>,
    ) -> Result<T> {
        let n = self.prompt_tokens(prompt);
        if let Prompt::Hashes { hashes, .. } = prompt {
            return f(hashes, n);
        }
        CHAIN.with(|cell| {
            // A re-entrant call (none today) would find the buffer taken; it then hashes
            // into a buffer of its own rather than panicking.
            let Ok(mut chain) = cell.try_borrow_mut() else {
                let mut own = Vec::new();
                self.chain_prompt_into(prompt, namespace, &mut own)?;
                return f(&own, n);
            };
            chain.clear();
            self.chain_prompt_into(prompt, namespace, &mut chain)?;
            let out = f(&chain, n);
            if chain.capacity() > KEPT_CHAIN_BLOCKS {
                *chain = Vec::new();
            }
            out
        })
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
        self.with_chain(req.prompt, req.namespace, |chain, n| self.decide(req, chain, n, now_ms))
    }

    /// The locked part of [`Router::route`] and the bookkeeping after it, with the calling
    /// thread's buffers.
    fn decide(&self, req: &RouteRequest<'_>, chain: &[BlockHash], n: u64, now_ms: u64) -> Result<Decision> {
        with_scratch(|scratch| self.decide_with(req, chain, n, now_ms, scratch))
    }

    /// Commits a decision's load bump on its instance if no other decision committed there
    /// since `seen` was read (`InstanceLoad::commit_routed`). In tests, `unchecked_commit`
    /// adds it without the check (the herd test's negative control).
    #[cfg_attr(not(test), allow(clippy::unused_self))] // `self` is read by the test switch only
    fn commit(&self, load: &InstanceLoad, seen: u64, prefill: u64, n: u64, work: u64) -> bool {
        #[cfg(test)]
        if self.unchecked_commit {
            load.on_routed(prefill, n, work);
            return true;
        }
        load.commit_routed(seen, prefill, n, work)
    }

    /// The index under the shared lock, TTL-purged at `now_ms` (the purge, when one is due,
    /// under the exclusive lock first).
    fn read_index(&self, now_ms: u64) -> RwLockReadGuard<'_, KvIndex> {
        let index = self.read_index_fresh();
        if !index.purge_due(now_ms) {
            return index;
        }
        drop(index);
        let mut index = self.write_index();
        index.purge_all_expired(now_ms);
        RwLockWriteGuard::downgrade(index)
    }

    /// [`Router::decide`] with `scratch`: the walk and the decision under the index's shared
    /// lock (the load bump committed as `InstanceLoad::commit_routed` says), then, when the
    /// insert or the record of sent blocks changes some holder's blocks, that write under the
    /// exclusive lock.
    fn decide_with(
        &self,
        req: &RouteRequest<'_>,
        chain: &[BlockHash],
        n: u64,
        now_ms: u64,
        scratch: &mut Scratch,
    ) -> Result<Decision> {
        let staleness_ms = to_ms(self.config.engine_load_staleness_s);
        let Scratch {
            query,
            walk,
            candidates,
            versions,
            rooms,
        } = scratch;
        // The walk, under the shared lock: other decisions walk, decide and write in place at
        // the same time. (The fleet through `load`, a guard: `load_full` would bump the shared
        // `Arc`'s count, a cache line every routing core would then write.)
        let index = self.read_index(now_ms);
        let fleet = self.fleet.load();
        if fleet.is_empty() {
            return Err(SmetricError::NoInstances);
        }
        index.query_shared(chain, now_ms, query, walk);
        #[cfg(test)]
        if let Some(barrier) = &self.after_walk {
            barrier.wait();
        }
        // The decision: read the loads, select, commit the load bump on the chosen instance
        // if no other decision committed there since its load was read; else decide again.
        let (fixed_rate, fallback_rate) = (self.config.smetric_drain_rate, self.config.smetric_drain_rate_fallback);
        let preble = self.kind == PolicyKind::Preble;
        let window_ms = to_ms(self.config.preble_window_s);
        let mask = self.decode_mask_on();
        let guard = self.config.smetric_retention_s > 0.0;
        let fetch_learning = self.fetch_learning_on();
        // The decode budget's fit, read once: each candidate's pace with this request added.
        let pace_fit = if self.decode_budget_on() {
            self.decode_model.fit()
        } else {
            None
        };
        if mask {
            self.decode_rooms(&fleet, now_ms, rooms);
        }
        let hit_tokens = self.hit_tokens(n);
        let global_hit_tokens = hit_tokens.of(query.global_blocks);
        let (first_turn, turn_source) = infer(
            req.turn,
            query.deepest_blocks,
            query.branches,
            self.config.first_turn_min_branches,
        );
        let hash_key = req
            .session_key
            .unwrap_or_else(|| prompt_key(chain.last().map(|h| h.0), n));
        #[cfg(test)]
        let mut first_attempt = true;
        let Committed {
            reason,
            chosen,
            member,
            prefill,
            work,
            fetched,
            fetch_work,
        } = loop {
            candidates.clear();
            versions.clear();
            let mut previous = None;
            for (slot, m) in fleet.members() {
                if !req.exclude.is_empty() && req.exclude.iter().any(|name| *name == &*m.name) {
                    continue;
                }
                if req.previous_instance == Some(&*m.name) {
                    previous = Some(candidates.len());
                }
                // Before the load, so that the load read includes every commit it counts.
                versions.push(m.load.version());
                let load = m.load.effective(now_ms, staleness_ms);
                // Only Preble reads (and ages) the window: no other router pays for its lock.
                let (recent_requests, recent_cost_us) = if preble {
                    m.load.recent.read(now_ms, window_ms)
                } else {
                    (0, 0)
                };
                candidates.push(Candidate {
                    slot,
                    name_hash: m.name_hash,
                    local_hit_tokens: hit_tokens.of(query.local_blocks[slot as usize]),
                    host_hit_tokens: hit_tokens.of(query.host_blocks_of(slot)),
                    bs: load.bs,
                    waiting: load.waiting,
                    queued: load.queued,
                    active: load.active,
                    queued_work: load.queued_work,
                    drain_rate: fixed_rate.unwrap_or_else(|| m.load.drain.rate_or(fallback_rate)),
                    peer_drain_rate: fixed_rate.or_else(|| m.load.drain.peer_p90()),
                    recent_requests,
                    recent_cost_us,
                    decode_room_s: if mask { rooms[slot as usize] } else { None },
                    // Read only for the displacement guard: a line of the index per candidate.
                    evicted_age_s: if guard {
                        index
                            .evicted_touch_ms(slot)
                            .map(|t| now_ms.saturating_sub(t) as f64 / 1000.0)
                    } else {
                        None
                    },
                    tpot_s: pace_fit.map(|fit| fit.pace_at((load.active + n) as f64)),
                    // Filled below, and only while the fetch cost is learned: a decision that does
                    // not price it pays one store per candidate.
                    fetch_cost: 0.0,
                });
            }
            if fetch_learning {
                for c in candidates.iter_mut() {
                    if let Some(m) = fleet.member(c.slot) {
                        c.fetch_cost = m.load.fetch.cost_or(self.config.global_fetch_cost);
                    }
                }
            }
            if candidates.is_empty() {
                return Err(SmetricError::NoInstances);
            }
            let selection = self.policy.select(&SelectionInput {
                candidates,
                num_tokens: n,
                global_hit_tokens,
                first_turn,
                block_size: self.block_size,
                prefill_only: self.prefill_only,
                previous,
                hash_key,
                config: &self.config,
                rng: &self.rng,
            });
            let chosen = candidates[selection.index];
            let member = fleet.member(chosen.slot).expect("candidates are live members");
            let prefill = chosen.prefill_tokens(n, global_hit_tokens);
            let computed_work = prefill_work(prefill, n, self.config.smetric_l_eq_tokens);
            // The load from the store, charged at the cost the decision priced it at (none unless
            // the fetch cost is learned).
            let (fetched, fetch_work) = if fetch_learning {
                let fetched = chosen.loaded_tokens(n, global_hit_tokens).1;
                (fetched, fetch_work(fetched, chosen.fetch_cost))
            } else {
                (0, 0)
            };
            let work = computed_work + fetch_work;
            #[cfg(test)]
            if std::mem::take(&mut first_attempt)
                && let Some(barrier) = &self.after_select
            {
                barrier.wait();
            }
            if self.commit(&member.load, versions[selection.index], prefill, n, work) {
                break Committed {
                    reason: selection.reason,
                    chosen,
                    member,
                    prefill,
                    work,
                    fetched,
                    fetch_work,
                };
            }
            self.decision_retries.fetch_add(1, Ordering::Relaxed);
        };
        if preble {
            // AIBrix adds the routed prompt to its histogram at once and never takes it back.
            member.load.recent.record(now_ms, preble_routed_cost_us(n, candidates));
        }
        // Issued only for a decision that happened, so a failed call consumes no id.
        let request_id = req
            .request_id
            .unwrap_or_else(|| RequestId(self.next_request_id.fetch_add(1, Ordering::Relaxed)));
        // Exact mode: a route whose blocks are all held or already sent there records nothing
        // (docs §2.7).
        let exact_noop = self.config.index_mode == IndexMode::Exact && index.send_is_noop(chosen.slot, chain, walk);
        #[cfg(test)]
        if exact_noop {
            self.write_order.lock().push((request_id, true));
        }
        // Approximate mode: the insert on route, in place (still under the shared lock) when
        // the instance and the global tier already hold the whole chain, which then only
        // becomes their newest blocks (`KvIndex::refront_walked`); else under the exclusive
        // lock. With host tiers the route also records the prompt in the instance's host pool
        // (its offloading connector will copy it there): in place too when the pool holds all
        // of it, else that part alone under the exclusive lock.
        let host_write = self.config.index_mode == IndexMode::Approximate && self.config.host_capacity_blocks > 0;
        let mut host_done = !host_write;
        let gpu_done = exact_noop
            || (self.config.index_mode == IndexMode::Approximate
                && index.refront_walked(chosen.slot, chain, now_ms, walk, query, || {
                    if host_write {
                        host_done = index.refront_host_walked(chosen.slot, chain, now_ms);
                    }
                    #[cfg(test)]
                    if host_done {
                        self.write_order.lock().push((request_id, true));
                    }
                }));
        drop(index);
        if !(gpu_done && host_done) {
            self.write_or_defer(
                &RouteWrite {
                    slot: chosen.slot,
                    generation: member.generation,
                    chain: Vec::new(),
                    now_ms,
                    walk: Walk::default(),
                    gpu_done,
                    host_write: !host_done,
                    request_id,
                },
                chain,
                walk,
            );
        }

        // A write queued by this or another decision is applied now if the index is free.
        self.try_drain_deferred();
        self.requests.lock().insert(
            request_id,
            InFlight {
                slot: chosen.slot,
                generation: member.generation,
                prefill,
                work,
                fetch_work,
                fetched,
                work_ahead: chosen.queued_work,
                routed_ms: now_ms,
                num_tokens: n,
                prefilled: false,
                first_token_ms: 0,
                context_at_first_token: 0,
                output_tokens: req.output_tokens,
                anchor: chain.last().copied(),
                prompt_blocks: chain.len() as u64,
            },
        );
        self.routed.fetch_add(1, Ordering::Relaxed);
        self.first_turns.fetch_add(u64::from(first_turn), Ordering::Relaxed);
        let reason_idx = Reason::ALL.iter().position(|r| *r == reason).unwrap_or(0);
        self.reasons[reason_idx].fetch_add(1, Ordering::Relaxed);
        Ok(Decision {
            instance: InstanceId(chosen.slot),
            instance_name: member.name.clone(),
            first_turn,
            turn_source,
            local_hit_tokens: chosen.local_hit_tokens,
            global_hit_tokens,
            host_hit_tokens: chosen.host_hit_tokens,
            prefill_tokens: prefill,
            num_tokens: n,
            reason,
            request_id,
        })
    }

    /// Fills `rooms` (by slot) with each instance's smallest non-negative live-decode balance
    /// at `now_ms` (`decode_contract.rs`): one pass over the in-flight table, O(in flight),
    /// under its mutex (a leaf lock: nothing is locked while it is held). Only the decode
    /// mask calls it, so no other router pays for it.
    fn decode_rooms(&self, fleet: &Fleet, now_ms: u64, rooms: &mut Vec<Option<f64>>) {
        rooms.clear();
        rooms.resize(fleet.slots(), None);
        let fallback_pace = self.config.smetric_contract_tpot_s;
        let requests = self.requests.lock();
        for rec in requests.values().filter(|r| r.prefilled) {
            let Some(m) = fleet.member(rec.slot).filter(|m| m.generation == rec.generation) else {
                continue;
            };
            let live = LiveDecode {
                prompt_tokens: rec.num_tokens,
                routed_ms: rec.routed_ms,
                first_token_ms: rec.first_token_ms,
                output_tokens: rec.output_tokens,
            };
            let pace = m.load.decode_pace.or(fallback_pace);
            let Some(balance) = balance_s(&self.config, &live, now_ms, pace) else {
                continue;
            };
            // A stream already past its budget is exempt: nothing left to protect.
            if balance >= 0.0 {
                let room = &mut rooms[rec.slot as usize];
                *room = Some(room.map_or(balance, |r| r.min(balance)));
            }
        }
    }

    /// Index hits of a prompt on every live instance (touches nothing but TTL purges).
    pub fn query(&self, prompt: Prompt<'_>, namespace: Option<&str>, now: Option<f64>) -> Result<Hits> {
        let now_ms = self.now_ms(now)?;
        self.with_chain(prompt, namespace, |chain, n| {
            Ok(with_scratch(|scratch| self.query_with(chain, n, now_ms, scratch)))
        })
    }

    /// [`Router::query`] with `scratch`: the walk into the thread's buffers, as a decision's
    /// (a query allocates nothing but its answer).
    fn query_with(&self, chain: &[BlockHash], n: u64, now_ms: u64, scratch: &mut Scratch) -> Hits {
        let Scratch { query, walk, .. } = scratch;
        let index = self.read_index(now_ms);
        // A guard, not `load_full`: a clone of the shared `Arc` is a line every querying
        // core would write.
        let fleet = self.fleet.load();
        index.query_shared(chain, now_ms, query, walk);
        drop(index);
        let hit_tokens = self.hit_tokens(n);
        Hits {
            local: fleet
                .members()
                .map(|(slot, m)| (m.name.clone(), hit_tokens.of(query.local_blocks[slot as usize])))
                .collect(),
            global_hit_tokens: hit_tokens.of(query.global_blocks),
            host: fleet
                .members()
                .map(|(slot, m)| (m.name.clone(), hit_tokens.of(query.host_blocks_of(slot))))
                .collect(),
            deepest_blocks: query.deepest_blocks,
            branches: query.branches,
        }
    }
}
