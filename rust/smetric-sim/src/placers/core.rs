//! [`CorePlacer`]: the real `smetric_core::Router` behind the simulator's [`Placer`] seam.
//!
//! Every decision goes through `Router::route` with the request's chain as a pre-hashed
//! prompt (`Prompt::Hashes`), the simulated time, and the turn as [`TurnFeed`] says: by
//! default the turn the request carries (`TurnHint::Turn(k)`, what a real request's re-sent
//! history shows a stateless router), or `TurnHint::Unknown` (the router infers first turns
//! from its index alone). Requests of sessionless traces carry no turn: always `Unknown`. Lifecycle calls are forwarded at the
//! simulated times the engine produces them. The index is fed as `IndexFeed` says:
//!
//! * approximate — the router's own insert-on-route index, sized like the simulated pools, so
//!   its view can drift from the engines' exactly as a real deployment's would;
//! * events — an exact index written only by the production `smetric_vllm::Ingestor` from the
//!   engines' encoded KV-event messages. The ingestor names blocks by smetric's hash of their
//!   tokens, so routing uses the same names: each trace chain is translated into the chain of
//!   `hash_block` over `cache_events::block_tokens` (memoised per trace block);
//! * oracle — an exact index written with the engines' own changes the instant they happen.
//!
//! With session admission on (`with_admission`), the core's `session_admission` stage reads
//! each decision: admitted requests are served where the policy sent them; a request placed
//! elsewhere or held has its decision released (`on_aborted`) — a held one is answered
//! `held` and re-decided at its policy's instance when the cluster asks again — and is then
//! routed once more with every other instance excluded, so the router's board counts it where
//! it runs. (Insert on route has already written its prefix at the first instance; the
//! approximate index keeps that guess, as it keeps any other.)
//!
//! Complexity: one `route` per request (the core's cost) plus O(chain) to copy — or, with
//! events, translate — the chain; a translation costs one hash of a block's tokens the first
//! time a (block, parent) pair is seen and one map lookup after.

use hashbrown::HashMap;
use smetric_core::hash::{chain_root, hash_block};
use smetric_core::session_admission::{
    self, Admission, AdmissionConfig, AdmissionMode, AdmitRequest, SessionAdmission,
};
use smetric_core::{
    BlockHash, Decision, Hits, IndexMode, IndexOp, PolicyKind, Prompt, RequestId, RouteRequest, Router, RouterConfig,
    Tier,
};
use smetric_vllm::{IngestConfig, Ingestor, Offload, RouterAt, SourceId};

use crate::cache_events::{CacheLog, IndexFeed, Medium, block_tokens};
use crate::config::TurnFeed;
use crate::error::{Result, SimError};
use crate::placement::{EngineLoadReport, PlaceRequest, Placement, Placer};

/// Most memoised trace blocks before the translation memo starts over (≈ 400 MB).
const MAX_MEMO_BLOCKS: usize = 16 << 20;

/// The routing core as a placer.
#[derive(Debug)]
pub struct CorePlacer {
    router: Router,
    names: Vec<String>,
    chain: Vec<BlockHash>,
    feed: IndexFeed,
    events: Option<EventFeed>,
    turns: TurnFeed,
    /// The simulated stores are the instances' own (host tiers on, no global tier): their
    /// blocks go to each instance's host pool, not the global tier.
    host_local: bool,
    /// Each request's recorded output length, by request id, told to the router with the
    /// request: only for `smetric`'s decode mask in its oracle form (a deployment's router
    /// does not know it; the honest form learns from the lifecycle calls instead).
    recorded_outputs: Option<Vec<u32>>,
    /// Session admission after the policy (`None`: off).
    admission: Option<AdmissionRun>,
}

/// The session-admission stage and what it needs to remember per request.
#[derive(Debug)]
struct AdmissionRun {
    stage: SessionAdmission,
    /// Held requests → the instance their policy chose and when they were first held.
    held: HashMap<u64, (u32, f64)>,
    /// Admitted requests in flight → (session, instance, prompt tokens).
    running: HashMap<u64, (u64, u32, u64)>,
}

/// The router side of the event feed.
#[derive(Debug)]
struct EventFeed {
    ingestor: Ingestor,
    sources: Vec<SourceId>,
    block_tokens: u32,
    root: u64,
    /// trace block → (its parent trace block, its smetric hash).
    memo: HashMap<u64, (u64, u64)>,
    tokens: Vec<u32>,
    /// Messages the ingestor could not take (a source it did not know).
    refused: u64,
    /// Messages the ingestor dropped as undecodable.
    decode_errors: u64,
}

impl EventFeed {
    /// smetric's chain for a trace chain: `hash_block` over the tokens of each trace block.
    fn translate(&mut self, trace: &[u64], out: &mut Vec<BlockHash>) {
        if self.memo.len() > MAX_MEMO_BLOCKS {
            self.memo.clear();
        }
        let mut prev_trace = u64::MAX;
        let mut prev = self.root;
        for (k, &id) in trace.iter().enumerate() {
            let parent = if k == 0 { u64::MAX } else { prev_trace };
            prev = match self.memo.get(&id) {
                Some(&(p, h)) if p == parent => h,
                _ => {
                    self.tokens.clear();
                    block_tokens(id, self.block_tokens, &mut self.tokens);
                    let h = hash_block(prev, &self.tokens);
                    self.memo.insert(id, (parent, h));
                    h
                }
            };
            prev_trace = id;
            out.push(BlockHash(prev));
        }
    }
}

impl CorePlacer {
    /// A router over instances `i0 … i{n-1}` with `block_tokens`-token blocks, its index in
    /// insert-on-route mode (or as `config.index_mode` says).
    pub fn new(instances: u32, policy: PolicyKind, block_tokens: u32, seed: u64, config: RouterConfig) -> Result<Self> {
        let feed = match config.index_mode {
            IndexMode::Approximate => IndexFeed::Approximate,
            IndexMode::Exact => IndexFeed::Oracle,
        };
        Self::with_feed(instances, policy, block_tokens, seed, config, feed, 0)
    }

    /// A router fed by `feed`; `max_mapped_blocks` bounds the blocks the event ingestor maps
    /// per instance (the pool plus what it may announce in the tier).
    pub fn with_feed(
        instances: u32,
        policy: PolicyKind,
        block_tokens: u32,
        seed: u64,
        mut config: RouterConfig,
        feed: IndexFeed,
        max_mapped_blocks: usize,
    ) -> Result<Self> {
        config.index_mode = match feed {
            IndexFeed::Approximate => IndexMode::Approximate,
            IndexFeed::Events | IndexFeed::Oracle => IndexMode::Exact,
        };
        // The simulated engine keeps the blocks its generated tokens fill anonymous (only
        // prompt blocks have trace hashes, instance.rs), so no follow-up ever hits an answer
        // there: crediting answers (docs/routing-semantics.md §2.7 "The answer") would only
        // over-predict. A real vLLM caches them; this models the engine the simulator has.
        config.exact_answer_credit = false;
        let names: Vec<String> = (0..instances).map(|i| format!("i{i}")).collect();
        let host_local = config.host_capacity_blocks > 0 && config.global_capacity_blocks == 0;
        let router =
            Router::new(&names, policy, block_tokens, seed, config).map_err(|e| SimError::Router(e.to_string()))?;
        let events = (feed == IndexFeed::Events).then(|| {
            let mut ingestor = Ingestor::new(IngestConfig {
                max_mapped_blocks: max_mapped_blocks.max(1024),
                ..IngestConfig::default()
            });
            // The simulated links lose nothing, so no replay endpoint is needed. With host tiers
            // and no global one, the simulated stores are the instances' own (`cpu-offload`).
            let offload = if host_local {
                Offload::HostLocal
            } else {
                Offload::Shared
            };
            let sources = names
                .iter()
                .map(|n| ingestor.add_source_with(n, false, offload))
                .collect();
            EventFeed {
                ingestor,
                sources,
                block_tokens,
                root: chain_root(router.config().hash_seed, None),
                memo: HashMap::new(),
                tokens: Vec::new(),
                refused: 0,
                decode_errors: 0,
            }
        });
        Ok(Self {
            router,
            names,
            chain: Vec::new(),
            feed,
            events,
            turns: TurnFeed::default(),
            host_local,
            recorded_outputs: None,
            admission: None,
        })
    }

    /// The same placer with session admission in `mode` over instances of `capacity_tokens`
    /// KV tokens each, holding a request at most `max_hold_s` (`None`: the mode's default;
    /// `smetric_core::session_admission`; `Off` adds no stage).
    #[must_use]
    pub fn with_admission(mut self, mode: AdmissionMode, capacity_tokens: u64, max_hold_s: Option<f64>) -> Self {
        let mut config = AdmissionConfig::new(mode, capacity_tokens);
        config.max_hold_s = max_hold_s.unwrap_or(config.max_hold_s);
        self.admission = (mode != AdmissionMode::Off).then(|| AdmissionRun {
            stage: SessionAdmission::new(self.names.len() as u32, config),
            held: HashMap::new(),
            running: HashMap::new(),
        });
        self
    }

    /// Routes `route` on `instance` only (every other instance excluded).
    fn route_on(&self, route: &RouteRequest<'_>, instance: u32) -> Result<Decision> {
        let others: Vec<&str> = self
            .names
            .iter()
            .enumerate()
            .filter(|&(k, _)| k != instance as usize)
            .map(|(_, n)| n.as_str())
            .collect();
        let pinned = RouteRequest {
            exclude: &others,
            ..*route
        };
        self.router.route(&pinned).map_err(|e| SimError::Router(e.to_string()))
    }

    /// The admission stage's verdict on a request the policy sent to `chosen`: each instance's
    /// cost for the prefix is the tokens it would prefill, from the index's hits (GPU, host
    /// pool, store), when asked.
    fn admit(
        admission: &mut Option<AdmissionRun>,
        router: &Router,
        chain: &[BlockHash],
        request: &PlaceRequest<'_>,
        chosen: u32,
    ) -> Admission {
        let Some(run) = admission else {
            return Admission::Admit {
                instance: chosen,
                paused: 0,
            };
        };
        let prompt = u64::from(request.prompt_tokens);
        let held_since = run.held.get(&request.request_id).map(|&(_, t)| t);
        run.stage.decide(
            &AdmitRequest {
                session: request.session_key,
                chosen,
                prompt_tokens: prompt,
                held_since,
            },
            request.now,
            || {
                let hits = router.query(
                    Prompt::Hashes {
                        hashes: chain,
                        num_tokens: Some(prompt),
                    },
                    None,
                    Some(request.now),
                );
                let Ok(hits) = hits else { return Vec::new() };
                session_admission::tokens_to_prefill(&hits, prompt)
                    .map(|(_, tokens)| tokens as f64)
                    .collect()
            },
        )
    }

    /// The same placer, telling the router each request's turn as `turns` says.
    #[must_use]
    pub fn with_turns(mut self, turns: TurnFeed) -> Self {
        self.turns = turns;
        self
    }

    /// The same placer, telling the router each request's recorded output length (`outputs`,
    /// indexed by request id): the decode mask's oracle form.
    #[must_use]
    pub fn with_recorded_outputs(mut self, outputs: Vec<u32>) -> Self {
        self.recorded_outputs = Some(outputs);
        self
    }

    /// The recorded output lengths the router is told (the oracle decode mask's), if any.
    pub fn recorded_outputs(&self) -> Option<&[u32]> {
        self.recorded_outputs.as_deref()
    }

    /// The wrapped router (for its stats).
    pub fn router(&self) -> &Router {
        &self.router
    }

    /// The router's name of trace chain `trace` (the hashes its index holds for it).
    fn router_chain(&mut self, trace: &[u64]) -> Vec<BlockHash> {
        let mut out = Vec::with_capacity(trace.len());
        match &mut self.events {
            Some(events) => events.translate(trace, &mut out),
            None => out.extend(trace.iter().map(|&h| BlockHash(h))),
        }
        out
    }

    /// What the router's index holds of trace chain `trace` now: every instance's local hit and
    /// the global hit, uncapped (inspection and tests; touches nothing).
    pub fn index_hits(&mut self, trace: &[u64]) -> Result<Hits> {
        let chain = self.router_chain(trace);
        let tokens = chain.len() as u64 * u64::from(self.router.block_size()) + 1;
        self.router
            .query(
                Prompt::Hashes {
                    hashes: &chain,
                    num_tokens: Some(tokens),
                },
                None,
                None,
            )
            .map_err(|e| SimError::Router(e.to_string()))
    }
}

impl Placer for CorePlacer {
    fn policy(&self) -> String {
        self.router.policy().name().to_owned()
    }

    fn place(&mut self, request: &PlaceRequest<'_>) -> Result<Placement> {
        self.chain.clear();
        match &mut self.events {
            Some(events) => events.translate(request.chain, &mut self.chain),
            None => self.chain.extend(request.chain.iter().map(|&h| BlockHash(h))),
        }
        let chain = std::mem::take(&mut self.chain);
        let mut route = request.route_request(&chain, self.turns, &self.names);
        route.output_tokens = self
            .recorded_outputs
            .as_ref()
            .and_then(|o| o.get(usize::try_from(request.request_id).ok()?))
            .map(|&t| u64::from(t));
        let id = request.request_id;
        // A held request is re-decided at its policy's instance; any other one is routed now.
        let retried = self.admission.as_ref().and_then(|a| a.held.get(&id).map(|&(c, _)| c));
        let decision = match retried {
            Some(_) => None,
            None => Some(self.router.route(&route).map_err(|e| SimError::Router(e.to_string()))?),
        };
        let chosen = retried.or(decision.as_ref().map(|d| d.instance.0)).unwrap_or(0);
        let verdict = Self::admit(&mut self.admission, &self.router, &chain, request, chosen);
        let (decision, reason) = match (verdict, decision) {
            (Admission::Admit { .. }, Some(d)) => {
                let reason = d.reason.name();
                (d, reason)
            }
            (Admission::Admit { instance, .. } | Admission::Elsewhere { instance, .. }, first) => {
                if first.is_some() {
                    self.router.on_aborted(RequestId(id));
                }
                let d = self.route_on(&route, instance)?;
                let reason = if instance == chosen {
                    "session admission: resumed"
                } else {
                    "session admission: placed elsewhere"
                };
                (d, reason)
            }
            (Admission::Hold, first) => {
                if first.is_some() {
                    self.router.on_aborted(RequestId(id));
                }
                let mut release_at_s = None;
                if let Some(run) = &mut self.admission
                    && !run.held.contains_key(&id)
                {
                    run.held.insert(id, (chosen, request.now));
                    release_at_s = run.stage.release_at(request.now);
                }
                return Ok(Placement {
                    instance: chosen,
                    first_turn: None,
                    local_hit_tokens: 0,
                    global_hit_tokens: 0,
                    prefill_tokens: u64::from(request.prompt_tokens),
                    reason: "session admission: held",
                    decode_instance: None,
                    held: true,
                    release_at_s,
                });
            }
        };
        if let (Some(run), Some(session)) = (&mut self.admission, request.session_key) {
            run.held.remove(&id);
            run.running
                .insert(id, (session, decision.instance.0, u64::from(request.prompt_tokens)));
        }
        Ok(Placement {
            instance: decision.instance.0,
            first_turn: Some(decision.first_turn),
            local_hit_tokens: decision.local_hit_tokens,
            global_hit_tokens: decision.global_hit_tokens,
            prefill_tokens: decision.prefill_tokens,
            reason,
            decode_instance: None,
            held: false,
            release_at_s: None,
        })
    }

    fn on_prefilled(&mut self, request_id: u64, now: f64) {
        // The simulated clock is finite and >= 0, so the call cannot fail; the router's
        // answer (whether a counter changed) carries nothing the simulation needs.
        let _ = self.router.on_prefilled_at(RequestId(request_id), Some(now));
    }

    fn on_finished(&mut self, request_id: u64, output_tokens: u32, now: f64) {
        if let Some(run) = &mut self.admission
            && let Some((session, instance, prompt)) = run.running.remove(&request_id)
        {
            run.stage
                .on_finished(session, instance, prompt + u64::from(output_tokens), now);
        }
        // As `on_prefilled`: the simulated clock cannot make the call fail.
        let _ = self
            .router
            .on_finished_at(RequestId(request_id), u64::from(output_tokens), Some(now));
    }

    fn on_load(&mut self, instance: u32, snapshot: EngineLoadReport, now: f64) {
        if let Some(name) = self.names.get(instance as usize) {
            // The name always exists (the router was built from these names), so the
            // result carries no information worth propagating.
            let _ = self.router.update_load(
                name,
                Some(u64::from(snapshot.running)),
                Some(u64::from(snapshot.waiting)),
                Some(snapshot.kv_usage),
                Some(now),
            );
        }
    }

    fn on_cache_changes(&mut self, instance: u32, log: &CacheLog, now: f64) {
        if self.feed != IndexFeed::Oracle {
            return;
        }
        let Some(name) = self.names.get(instance as usize) else {
            return;
        };
        self.chain.clear();
        let mut ranges = Vec::with_capacity(log.changes().len());
        for change in log.changes() {
            let start = self.chain.len();
            self.chain.extend(log.blocks(change).iter().map(|&h| BlockHash(h)));
            ranges.push(start..self.chain.len());
        }
        let ops: Vec<IndexOp<'_>> = log
            .changes()
            .iter()
            .zip(ranges)
            .map(|(change, range)| {
                let tier = match change.medium {
                    Medium::Gpu => Tier::Local,
                    Medium::Cpu if self.host_local => Tier::Host,
                    Medium::Cpu => Tier::Global,
                };
                let hashes = &self.chain[range];
                if change.stored {
                    IndexOp::Store {
                        tier,
                        hashes,
                        parent: change.parent.map(BlockHash),
                    }
                } else {
                    IndexOp::Remove { tier, hashes }
                }
            })
            .collect();
        // Every instance exists and every op is well formed, so the router cannot refuse.
        let _ = self.router.apply_blocks(Some(name), &ops, Some(now));
    }

    fn on_kv_event_message(&mut self, instance: u32, frames: &[Vec<u8>], now: f64) {
        let Some(events) = &mut self.events else { return };
        let Some(&source) = events.sources.get(instance as usize) else {
            return;
        };
        // The production sink stamps writes with the wall clock; here they must age against the
        // simulated times routing uses.
        let sink = RouterAt {
            router: &self.router,
            now: Some(now),
        };
        match events.ingestor.on_message(&sink, source, frames) {
            Ok(step) if step.error.is_some() => events.decode_errors += 1,
            Ok(_) => {}
            Err(_) => events.refused += 1,
        }
    }

    fn feed_counters(&self) -> Vec<(String, u64)> {
        let mut counters = Vec::new();
        if let Some(run) = &self.admission {
            let c = run.stage.counters();
            counters.extend([
                ("admission_admitted".to_owned(), c.admitted),
                ("admission_moved".to_owned(), c.moved),
                ("admission_held".to_owned(), c.held),
                ("admission_released".to_owned(), c.released),
                ("admission_paused".to_owned(), c.paused),
            ]);
        }
        if self.router.config().smetric_learn_fetch_cost {
            // The tier fetch's learned cost (`fetch_cost.rs`): how many instances learned one
            // and their median, in thousandths of a work unit a token.
            let mut learned: Vec<f64> = self
                .names
                .iter()
                .filter_map(|name| self.router.load(name).ok().and_then(|l| l.fetch_cost))
                .collect();
            learned.sort_by(f64::total_cmp);
            let median_milli = learned
                .get(learned.len() / 2)
                .map_or(0, |c| (c * 1000.0).round() as u64);
            counters.extend([
                ("fetch_cost_learned_instances".to_owned(), learned.len() as u64),
                ("fetch_cost_median_milli".to_owned(), median_milli),
            ]);
        }
        let Some(events) = &self.events else { return counters };
        counters.extend(
            events
                .ingestor
                .stats()
                .counters()
                .into_iter()
                .map(|(name, value)| (format!("ingest_{name}"), value)),
        );
        counters.push(("ingest_refused_messages".into(), events.refused));
        counters.push(("ingest_dropped_messages".into(), events.decode_errors));
        counters.push(("translated_blocks_memo".into(), events.memo.len() as u64));
        counters
    }
}
