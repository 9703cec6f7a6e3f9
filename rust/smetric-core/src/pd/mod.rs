//! Disaggregated prefill/decode (PD) routing: one decision per request names a prefill
//! instance and a decode instance.
//!
//! Algorithm ([`PdRouter::route`]):
//! 1. **Prefill side** — the co-located [`Router`] over the prefill pool, unchanged: the same
//!    policy, index, load board, turn inference and migration. For `smetric`: first turns
//!    balanced, follow-ups to the prefill instance whose prefix cache holds the session's
//!    KV$ (a prefill instance keeps the blocks it computed cached after the transfer, until
//!    LRU eviction, so the index's insert-on-route model holds as in co-located mode).
//! 2. **Decode side** — under the decode pool's mutex: every decode instance's load (requests
//!    in flight, KV blocks reserved by the router or reported by the engine, whichever is
//!    higher) and its prefix hit in the decode pool's own index (insert on route: the blocks
//!    a decode instance pulled stay in its prefix cache, and vLLM pulls only the blocks it
//!    lacks), then the [`DecodeRule`] (see `decode_choice`), then the reservation.
//!
//! Per-phase load counters: the prefill pool's board counts the prefill backlog (queued
//! tokens, waiting) and the prefill instance's batch until the transfer ends (vLLM's
//! prefill instance holds the request's blocks until the decode instance has read them); the
//! decode pool counts requests in flight, reserved blocks and pending pulls.
//!
//! Lifecycle: `on_prefilled` (the prefill instance is done computing; the transfer starts)
//! lowers the prefill backlog; `on_transferred` releases the prefill instance's share (its
//! batch and active tokens) and the pending pull; `on_finished` / `on_aborted` release the
//! decode reservation, applying the earlier steps first if they never came.
//!
//! Invariants: every counter a decision raised is lowered exactly once whatever the order or
//! repetition of the lifecycle calls; a call for an unknown request changes nothing and is
//! counted; a failed `route` changes nothing on either side (the decode choice cannot fail
//! once the prefill decision is made, so no prefill counter is left raised).
//!
//! Complexity: the co-located router's cost for the prefill side, plus O(matched blocks) for
//! the decode index walk and O(decode instances) for the rule; lifecycle calls O(1).

mod decode_choice;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

pub use decode_choice::{DecodeCandidate, DecodeInput, DecodeRule, choose};

use crate::config::RouterConfig;
use crate::error::{Result, SmetricError};
use crate::ids::{BlockHash, InstanceId, RequestId};
use crate::index::{Holder, IndexLimits, IndexQuery, KvIndex};
use crate::mix_map::MixMap;
use crate::policy::PolicyKind;
use crate::rng::DrawCounter;
use crate::router::{Decision, Prompt, RouteRequest, Router, to_ms};

/// PD settings. Every default is defined here, in [`PdConfig::DEFAULT`].
#[derive(Clone, Debug, PartialEq)]
pub struct PdConfig {
    /// The decode rule; `None`: the peer form of the prefill policy ([`DecodeRule::peer_form`]).
    pub decode_rule: Option<DecodeRule>,
    /// KV blocks one decode instance holds (the fit test, and its index's capacity). Default:
    /// the co-located default capacity (17,920 blocks of 16 tokens, one H20 with
    /// Qwen3-Coder-30B-A3B at TP1).
    pub decode_capacity_blocks: u64,
    /// Requests one decode instance batches at most: vLLM's `max_num_seqs` default, 256.
    pub decode_max_batch: u64,
    /// Engine KV usage snapshots of decode instances older than this are ignored, seconds (as
    /// `RouterConfig::engine_load_staleness_s`).
    pub engine_load_staleness_s: f64,
}

impl PdConfig {
    /// The defaults.
    pub const DEFAULT: PdConfig = PdConfig {
        decode_rule: None,
        decode_capacity_blocks: RouterConfig::DEFAULT.local_capacity_blocks,
        decode_max_batch: 256,
        engine_load_staleness_s: RouterConfig::DEFAULT.engine_load_staleness_s,
    };

    /// Checks every field.
    pub fn validate(&self) -> Result<()> {
        if !(1..=crate::config::MAX_CAPACITY_BLOCKS).contains(&self.decode_capacity_blocks) {
            return Err(SmetricError::InvalidConfig {
                field: "decode_capacity_blocks",
                reason: format!("must be in [1, 2^30], got {}", self.decode_capacity_blocks),
            });
        }
        if self.decode_max_batch == 0 {
            return Err(SmetricError::InvalidConfig {
                field: "decode_max_batch",
                reason: "must be >= 1".to_owned(),
            });
        }
        if !(self.engine_load_staleness_s.is_finite() && self.engine_load_staleness_s >= 0.0) {
            return Err(SmetricError::InvalidConfig {
                field: "engine_load_staleness_s",
                reason: format!("must be a finite number >= 0, got {}", self.engine_load_staleness_s),
            });
        }
        Ok(())
    }
}

impl Default for PdConfig {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// A PD decision: the prefill side's co-located decision plus the decode instance.
#[derive(Debug, Clone)]
pub struct PdDecision {
    /// The prefill instance and everything the co-located router says about it (its
    /// `request_id` is the PD request's id).
    pub prefill: Decision,
    /// Chosen decode instance slot.
    pub decode_instance: InstanceId,
    /// Chosen decode instance name.
    pub decode_instance_name: Arc<str>,
    /// Prefix tokens the decode instance's cache holds (not pulled), per the decode index.
    pub decode_hit_tokens: u64,
    /// Tokens to transfer from the prefill instance to the decode instance.
    pub transfer_tokens: u64,
    /// The decode rule applied.
    pub decode_rule: DecodeRule,
}

/// Counters of one decode instance.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct DecodeLoad {
    /// Requests routed here and not finished.
    pub bs: u64,
    /// KV blocks reserved by those requests' contexts.
    pub reserved_blocks: u64,
    /// Requests whose transfer has not ended.
    pub pulling: u64,
    /// Tokens those transfers move.
    pub pull_tokens: u64,
    /// Engine-reported KV usage in [0, 1] (last snapshot).
    pub kv_usage: f64,
    /// Time of that snapshot in ms, if any.
    pub stamp_ms: Option<u64>,
}

#[derive(Debug)]
struct DecodePool {
    names: Vec<Arc<str>>,
    load: Vec<DecodeLoad>,
    index: KvIndex,
    query: IndexQuery,
    candidates: Vec<DecodeCandidate>,
    rr: u64,
}

#[derive(Debug, Clone, Copy)]
struct PdInFlight {
    decode: u32,
    blocks: u64,
    pull_tokens: u64,
    transferred: bool,
}

/// Counters of a PD router (the prefill side's own are in `prefill().stats()`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PdStats {
    /// Decisions made.
    pub routed: u64,
    /// Tokens the decisions will transfer, summed.
    pub transfer_tokens: u64,
    /// Lifecycle calls for unknown or finished requests.
    pub unknown_request_events: u64,
    /// Requests in flight.
    pub in_flight: usize,
    /// Output tokens reported by `on_finished`, summed.
    pub output_tokens: u64,
    /// Every decode instance's counters, by name in slot order.
    pub decode: Vec<(Arc<str>, DecodeLoad)>,
}

/// The PD router. `Send + Sync`.
#[derive(Debug)]
pub struct PdRouter {
    prefill: Router,
    decode: Mutex<DecodePool>,
    rule: DecodeRule,
    config: PdConfig,
    rng: DrawCounter,
    requests: Mutex<MixMap<RequestId, PdInFlight>>,
    routed: AtomicU64,
    transfer_tokens: AtomicU64,
    unknown_events: AtomicU64,
    output_tokens: AtomicU64,
}

impl PdRouter {
    /// A PD router over the `prefill` and `decode` pools (each non-empty, names unique across
    /// both). `policy`, `block_size`, `seed` and `config` configure the prefill side exactly as
    /// a co-located [`Router`]; `pd` the decode side.
    pub fn new(
        prefill: &[String],
        decode: &[String],
        policy: PolicyKind,
        block_size: u32,
        seed: u64,
        config: RouterConfig,
        pd: PdConfig,
    ) -> Result<Self> {
        pd.validate()?;
        if decode.is_empty() {
            return Err(SmetricError::NoInstances);
        }
        for (k, name) in decode.iter().enumerate() {
            if prefill.contains(name) || decode[..k].contains(name) {
                return Err(SmetricError::DuplicateInstance { name: name.clone() });
            }
        }
        let mut router = Router::new(prefill, policy, block_size, seed, config)?;
        router.prefill_only = true;
        let mut index = KvIndex::new(IndexLimits {
            local_capacity: pd.decode_capacity_blocks,
            global_capacity: 0,
            local_ttl_ms: None,
        });
        for slot in 0..decode.len() as u32 {
            index.add_slot(slot);
        }
        Ok(Self {
            prefill: router,
            decode: Mutex::new(DecodePool {
                names: decode.iter().map(|n| Arc::from(n.as_str())).collect(),
                load: vec![DecodeLoad::default(); decode.len()],
                index,
                query: IndexQuery::default(),
                candidates: Vec::new(),
                rr: 0,
            }),
            rule: pd.decode_rule.unwrap_or_else(|| DecodeRule::peer_form(policy)),
            // A stream of its own, so the prefill side's draws are those of a co-located run.
            rng: DrawCounter::new(seed ^ 0x5044_5044_5044_5044),
            config: pd,
            requests: Mutex::new(MixMap::default()),
            routed: AtomicU64::new(0),
            transfer_tokens: AtomicU64::new(0),
            unknown_events: AtomicU64::new(0),
            output_tokens: AtomicU64::new(0),
        })
    }

    /// The prefill side's co-located router (its stats, index feed, fleet and load calls).
    pub fn prefill(&self) -> &Router {
        &self.prefill
    }

    /// The decode rule in use.
    pub fn decode_rule(&self) -> DecodeRule {
        self.rule
    }

    /// The PD configuration.
    pub fn pd_config(&self) -> &PdConfig {
        &self.config
    }

    /// Decode instance names in slot order.
    pub fn decode_instances(&self) -> Vec<Arc<str>> {
        self.decode.lock().names.clone()
    }

    fn now_ms(&self, now: Option<f64>) -> Result<u64> {
        self.prefill.now_ms(now)
    }

    /// Routes one request: a prefill instance (the co-located decision) and a decode instance.
    pub fn route(&self, req: &RouteRequest<'_>) -> Result<PdDecision> {
        let now_ms = self.now_ms(req.now)?;
        // The decode index needs the chain; a token prompt is hashed once, here, and both
        // sides use the hashes.
        let owned;
        let n = self.prefill.prompt_tokens(req.prompt);
        let chain: &[BlockHash] = match req.prompt {
            Prompt::Hashes { hashes, .. } => hashes,
            prompt => {
                let mut chain = Vec::new();
                self.prefill.chain_prompt_into(prompt, req.namespace, &mut chain)?;
                owned = chain;
                &owned
            }
        };
        let hashed = RouteRequest {
            prompt: Prompt::Hashes {
                hashes: chain,
                num_tokens: Some(n),
            },
            ..*req
        };
        // Decode instances the caller excludes (a proxy's retry) are skipped; with none left the
        // call fails before the prefill side counts anything.
        let decode_allowed: Vec<bool> = {
            let g = self.decode.lock();
            g.names
                .iter()
                .map(|name| !req.exclude.iter().any(|x| *x == &**name))
                .collect()
        };
        if !decode_allowed.iter().any(|&ok| ok) {
            return Err(SmetricError::NoInstances);
        }
        let prefill = self.prefill.route(&hashed)?;
        let b = u64::from(self.prefill.block_size());
        let context_blocks = n.div_ceil(b);
        let staleness_ms = to_ms(self.config.engine_load_staleness_s);
        let capacity = self.config.decode_capacity_blocks;

        let mut g = self.decode.lock();
        let pool = &mut *g;
        pool.index.query(chain, now_ms, &mut pool.query);
        pool.candidates.clear();
        let mut slots = Vec::with_capacity(pool.load.len());
        for (slot, load) in pool.load.iter().enumerate() {
            if !decode_allowed.get(slot).copied().unwrap_or(true) {
                continue;
            }
            slots.push(slot);
            let fresh = load.stamp_ms.is_some_and(|t| now_ms.saturating_sub(t) <= staleness_ms);
            let reported = if fresh {
                (load.kv_usage * capacity as f64).round() as u64
            } else {
                0
            };
            pool.candidates.push(DecodeCandidate {
                bs: load.bs,
                used_blocks: load.reserved_blocks.max(reported),
                hit_blocks: u64::from(pool.query.local_blocks[slot]).min(context_blocks),
            });
        }
        let k = choose(
            self.rule,
            &DecodeInput {
                candidates: &pool.candidates,
                context_blocks,
                capacity_blocks: capacity,
                max_batch: self.config.decode_max_batch,
                block_size: self.prefill.block_size(),
            },
            &self.rng,
            &mut pool.rr,
        );
        // The last token is always recomputed on the decode instance (vLLM), so a full hit
        // still pulls nothing more than the context minus that hit.
        let hit_tokens = (pool.candidates[k].hit_blocks * b).min(n.saturating_sub(1));
        let k = slots[k];
        let pull_tokens = n - hit_tokens;
        pool.index.touch(Holder::Instance(k as u32), chain, None, now_ms);
        let load = &mut pool.load[k];
        load.bs += 1;
        load.reserved_blocks += context_blocks;
        load.pulling += 1;
        load.pull_tokens += pull_tokens;
        let name = pool.names[k].clone();
        drop(g);

        self.requests.lock().insert(
            prefill.request_id,
            PdInFlight {
                decode: k as u32,
                blocks: context_blocks,
                pull_tokens,
                transferred: false,
            },
        );
        self.routed.fetch_add(1, Ordering::Relaxed);
        self.transfer_tokens.fetch_add(pull_tokens, Ordering::Relaxed);
        Ok(PdDecision {
            prefill,
            decode_instance: InstanceId(k as u32),
            decode_instance_name: name,
            decode_hit_tokens: hit_tokens,
            transfer_tokens: pull_tokens,
            decode_rule: self.rule,
        })
    }

    fn unknown(&self) -> bool {
        self.unknown_events.fetch_add(1, Ordering::Relaxed);
        false
    }

    /// The prefill instance finished computing the prompt; the transfer starts. Returns
    /// whether a counter changed. The prefill router's clock times it.
    pub fn on_prefilled(&self, id: RequestId) -> bool {
        self.on_prefilled_at(id, None).unwrap_or(false)
    }

    /// As [`PdRouter::on_prefilled`], at time `now` (seconds, the clock `route` was given; the
    /// prefill router's own when absent), which times the prefill instance's drain rate.
    pub fn on_prefilled_at(&self, id: RequestId, now: Option<f64>) -> Result<bool> {
        let now_ms = self.prefill.now_ms(now)?;
        if !self.requests.lock().contains_key(&id) {
            return Ok(self.unknown());
        }
        Ok(self.prefill.prefilled_at(id, now_ms))
    }

    /// The decode instance has read the KV: the prefill instance frees (and keeps cached) the
    /// request's blocks. Returns whether a counter changed.
    pub fn on_transferred(&self, id: RequestId) -> bool {
        let mut requests = self.requests.lock();
        let Some(rec) = requests.get_mut(&id) else {
            drop(requests);
            return self.unknown();
        };
        if rec.transferred {
            return false;
        }
        rec.transferred = true;
        let rec = *rec;
        drop(requests);
        self.release_transfer(&rec, id);
        true
    }

    fn release_transfer(&self, rec: &PdInFlight, id: RequestId) {
        self.prefill.on_finished(id, 0);
        let mut g = self.decode.lock();
        if let Some(load) = g.load.get_mut(rec.decode as usize) {
            load.pulling = load.pulling.saturating_sub(1);
            load.pull_tokens = load.pull_tokens.saturating_sub(rec.pull_tokens);
        }
    }

    /// The request finished on its decode instance with `output_tokens` generated. Returns
    /// whether a counter changed.
    pub fn on_finished(&self, id: RequestId, output_tokens: u64) -> bool {
        let done = self.done(id);
        if done {
            self.output_tokens.fetch_add(output_tokens, Ordering::Relaxed);
        }
        done
    }

    /// The request was aborted in either phase. Returns whether a counter changed.
    pub fn on_aborted(&self, id: RequestId) -> bool {
        self.done(id)
    }

    fn done(&self, id: RequestId) -> bool {
        let Some(rec) = self.requests.lock().remove(&id) else {
            return self.unknown();
        };
        if !rec.transferred {
            self.release_transfer(&rec, id);
        }
        let mut g = self.decode.lock();
        if let Some(load) = g.load.get_mut(rec.decode as usize) {
            load.bs = load.bs.saturating_sub(1);
            load.reserved_blocks = load.reserved_blocks.saturating_sub(rec.blocks);
        }
        true
    }

    /// Stores a decode engine's KV usage snapshot (in [0, 1]).
    pub fn update_decode_load(&self, instance: &str, kv_usage: f64, now: Option<f64>) -> Result<()> {
        let now_ms = self.now_ms(now)?;
        if !(kv_usage.is_finite() && (0.0..=1.0).contains(&kv_usage)) {
            return Err(SmetricError::InvalidArgument {
                argument: "kv_usage",
                reason: format!("must be in [0, 1], got {kv_usage}"),
            });
        }
        let mut g = self.decode.lock();
        let slot = g
            .names
            .iter()
            .position(|n| &**n == instance)
            .ok_or_else(|| SmetricError::UnknownInstance {
                name: instance.to_owned(),
            })?;
        g.load[slot].kv_usage = kv_usage;
        g.load[slot].stamp_ms = Some(now_ms);
        Ok(())
    }

    /// The counters of decode instance `instance`.
    pub fn decode_load(&self, instance: &str) -> Result<DecodeLoad> {
        let g = self.decode.lock();
        g.names
            .iter()
            .position(|n| &**n == instance)
            .map(|s| g.load[s])
            .ok_or_else(|| SmetricError::UnknownInstance {
                name: instance.to_owned(),
            })
    }

    /// Counters.
    pub fn stats(&self) -> PdStats {
        let decode = {
            let g = self.decode.lock();
            g.names.iter().cloned().zip(g.load.iter().copied()).collect()
        };
        PdStats {
            routed: self.routed.load(Ordering::Relaxed),
            transfer_tokens: self.transfer_tokens.load(Ordering::Relaxed),
            unknown_request_events: self.unknown_events.load(Ordering::Relaxed),
            in_flight: self.requests.lock().len(),
            output_tokens: self.output_tokens.load(Ordering::Relaxed),
            decode,
        }
    }
}
