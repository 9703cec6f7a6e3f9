//! The discrete-event loop: N instances, one global tier, one placer.
//!
//! Events, ordered by (time, insertion sequence) so equal-time events run FIFO and every run
//! is deterministic:
//! * `Arrive(r)` — the client issues request `r`. Requests longer than `max_model_len` are
//!   rejected (they finish at once, so a closed-loop session goes on). Otherwise the placer
//!   routes it *now* and it reaches its instance after the frontend time.
//! * `Deliver(r)` — the request joins its instance's waiting queue; an idle instance starts a
//!   step. When the scheduler admits it and the global tier holds the blocks after its GPU
//!   hit, the scheduler allocates them and starts a load, timed on the node's links
//!   (`transfer`: FIFO per rank, the node's NIC shared fairly, each rank capped by its
//!   connector rate and PCIe). With an asynchronous path the request waits (vLLM's
//!   `WAITING_FOR_REMOTE_KVS`) and the instance keeps stepping; with a synchronous one
//!   (LMCache) the request is in the step just scheduled and that step ends only after the
//!   load: at `load end + compute`, or `max(load end, start + compute)` layer-wise.
//! * `Transfer(link)` — a node link's earliest transfer ends (stale versions are ignored): a
//!   load's `FetchDone` follows `α` later, or its step's end is fixed; a store makes its
//!   blocks visible in the tier. (The tier's loads, stores and step costs: `tier_io`.)
//! * `FetchDone(r)` — the loaded blocks become computed KV; the request is schedulable.
//! * `StepDone(i)` — instance `i` finishes a step: tokens advance, the newly full blocks start
//!   their write-through to the tier, first tokens and finishes are reported to the placer
//!   (`on_prefilled`, `on_finished`) at this simulated time, closed-loop successors are
//!   released, and the next step is scheduled at once (a busy engine never idles between
//!   steps). A step costs the iteration model's time, plus the connector's per-step overhead
//!   while the tier is on, plus (LMCache) the GPU → host copy of the blocks it fills.
//! * `Sample` / `LoadReport` — periodic load-imbalance samples and engine load reports.
//! * `KvEvents` — with `index_feed = events`: the oldest published KV-event message reaches
//!   the placer. Each instance publishes its cache log when a step completes (vLLM publishes
//!   the events of a step with its outputs), before it schedules the next; an idle instance
//!   publishes what it logged meanwhile (a store eviction it announces, a finished load)
//!   whenever another instance completes a step or a write to the store ends. Delivery is
//!   `event_delay_s` after publication. With `index_feed = oracle` every change reaches the
//!   placer at the end of the event that made it.
//!
//! Session admission (`SimConfig::session_admission`): a placement may come back *held*; the
//! request then waits in a FIFO queue (its TTFT counts the wait: it arrived when it arrived),
//! and after every step in which a request finished, each held request is placed again, in
//! order, until the queue is empty or every remaining one is held again. A hold that runs out
//! (the placement's `release_at_s`) places its request again at that time, finish or not.
//!
//! Arrivals: open loop at `time_s / time_scale`; closed loop at the root session's Poisson
//! start + `time_s` for roots and `finish(prev) + think_s` otherwise; gated open loop at
//! `max(time_s / time_scale, finish(prev) + think_s)`. A request due after `arrivals_until_s`
//! is never issued, and neither are its successors (the run then drains what is in flight).
//!
//! Complexity: O(log E) per event (binary heap); per step O(batch); per request O(chain).

use std::cmp::Ordering;
use std::collections::{BinaryHeap, VecDeque};

use smetric_core::rng::DrawCounter;

use crate::cache_events::{CacheLog, EventPublisher, Frames, IndexFeed};
use crate::config::SimConfig;
use crate::error::{Result, SimError};
use crate::global_tier::GlobalTier;
use crate::instance::{EngineLimits, Instance, LiveRequest, StepEvent};
use crate::metrics::{RequestRecord, RunCounters, SimReport, coefficient_of_variation, summarize};
use crate::placement::{EngineLoadReport, PlaceRequest, Placer};
use crate::token_gaps::TokenGaps;
use crate::transfer::{Direction, Transfer, Transfers, link_direction};
use crate::workload::{ArrivalKind, Workload};

pub(crate) mod pd;
mod tier_io;

use pd::PdRun;
use tier_io::{Payload, StalledStep};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Arrive(u32),
    Deliver(u32),
    FetchDone(u32),
    StepDone(u32),
    Transfer {
        link: u32,
        version: u64,
    },
    /// A PD pull's link (`pd`).
    PdTransfer {
        link: u32,
        version: u64,
    },
    Sample,
    LoadReport,
    KvEvents,
    /// A held request's hold runs out: place it again.
    Release(u32),
}

impl Kind {
    /// Events that move no request forward: they neither count as pending work (stall
    /// detection) nor extend the makespan. The end of a write-through is one of them.
    fn is_background(self) -> bool {
        match self {
            Self::Sample | Self::LoadReport | Self::KvEvents => true,
            Self::Transfer { link, .. } => link_direction(link) == Direction::Out,
            _ => false,
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Event {
    time: f64,
    seq: u64,
    kind: Kind,
}

impl PartialEq for Event {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Event {}

impl PartialOrd for Event {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Event {
    /// Reversed, so `BinaryHeap` pops the earliest event first.
    fn cmp(&self, other: &Self) -> Ordering {
        other.time.total_cmp(&self.time).then_with(|| other.seq.cmp(&self.seq))
    }
}

/// An exponential gap with the given rate, from the next draw of `draws`.
fn exponential(draws: &DrawCounter, rate: f64) -> f64 {
    -(1.0 - draws.uniform()).ln() / rate
}

struct Sim<'a> {
    config: &'a SimConfig,
    workload: &'a Workload,
    placer: &'a mut dyn Placer,
    limits: EngineLimits,
    model_len: u64,
    instances: Vec<Instance>,
    transfers: Transfers<Payload>,
    stalled: Vec<StalledStep>,
    scratch_done: Vec<Transfer<Payload>>,
    /// The KV stores: one every instance reads, or one per instance ([`TierPath::per_instance`]).
    tiers: Vec<GlobalTier>,
    reqs: Vec<LiveRequest>,
    records: Vec<RequestRecord>,
    /// Every request's running tail of token gaps.
    gaps: TokenGaps,
    child_start: Vec<u32>,
    children: Vec<u32>,
    heap: BinaryHeap<Event>,
    seq: u64,
    now: f64,
    counters: RunCounters,
    /// Requests that arrived and have not finished: the periodic events stop at zero.
    in_flight: u64,
    /// Requests that have not arrived yet.
    not_arrived: u64,
    /// Events in the heap other than the periodic ones.
    queued_work: u64,
    /// Reused per-step buffers.
    scratch_first: Vec<u32>,
    scratch_finished: Vec<u32>,
    scratch_prefilled: Vec<(u32, u64, u64)>,
    /// With `index_feed = events`: the engines' publisher and the messages on their way.
    publisher: Option<EventPublisher>,
    in_transit: VecDeque<(u32, Frames)>,
    /// PD mode's state (`pd`); `None` co-located.
    pd: Option<PdRun>,
    /// Requests session admission holds, in arrival order.
    held: VecDeque<u32>,
}

/// Runs `workload` on the cluster described by `config`, routing with `placer`.
pub fn simulate(config: &SimConfig, workload: &Workload, placer: &mut dyn Placer) -> Result<SimReport> {
    let mut sim = build(config, workload, placer)?;
    sim.init();
    sim.run()?;
    Ok(finish(sim))
}

/// The cluster of `config` with every instance idle and nothing scheduled.
fn build<'a>(config: &'a SimConfig, workload: &'a Workload, placer: &'a mut dyn Placer) -> Result<Sim<'a>> {
    config.validate()?;
    if workload.is_empty() {
        return Err(SimError::EmptyWorkload);
    }
    let block_tokens = u64::from(workload.block_tokens());
    let pool_blocks = u32::try_from(config.kv_tokens() / block_tokens).unwrap_or(u32::MAX);
    let tier_blocks = if config.global_tier.enabled {
        let block_bytes = block_tokens as f64 * config.profile.kv_bytes_per_token;
        (config.global_tier.capacity_bytes as f64 / block_bytes)
            .floor()
            .min(f64::from(u32::MAX)) as u32
    } else {
        0
    };
    let n = workload.len();
    let mut sim = Sim {
        config,
        workload,
        placer,
        limits: EngineLimits {
            block_tokens,
            max_batched_tokens: u64::from(config.max_num_batched_tokens),
            max_num_seqs: config.max_num_seqs as usize,
            synchronous_loads: config.global_tier.enabled && config.global_tier.path.synchronous_load(),
            answer_rerender_share: config.answer_rerender_share,
        },
        model_len: config.model_len(),
        instances: (0..config.instances).map(|_| Instance::new(pool_blocks)).collect(),
        transfers: Transfers::new(
            config.instances,
            config.global_tier.gpus_per_node / config.profile.tp.max(1),
            config.global_tier.node_bytes_per_s(),
        ),
        stalled: vec![StalledStep::default(); config.instances as usize],
        scratch_done: Vec::new(),
        tiers: if config.global_tier.path.per_instance() {
            let each = tier_blocks / config.instances.max(1);
            (0..config.instances).map(|_| GlobalTier::new(each)).collect()
        } else {
            vec![GlobalTier::new(tier_blocks)]
        },
        reqs: vec![LiveRequest::default(); n],
        records: Vec::with_capacity(n),
        gaps: TokenGaps::new(n),
        child_start: Vec::new(),
        children: Vec::new(),
        heap: BinaryHeap::new(),
        seq: 0,
        now: 0.0,
        counters: RunCounters::default(),
        in_flight: 0,
        not_arrived: n as u64,
        queued_work: 0,
        scratch_first: Vec::new(),
        scratch_finished: Vec::new(),
        scratch_prefilled: Vec::new(),
        publisher: (config.index_feed == IndexFeed::Events)
            .then(|| EventPublisher::new(config.instances, workload.block_tokens())),
        in_transit: VecDeque::new(),
        pd: config.pd.as_ref().map(|pd| PdRun::new(config, pd, n)),
        held: VecDeque::new(),
    };
    if config.index_feed.logs_changes() {
        for inst in &mut sim.instances {
            inst.pool.log = CacheLog::new(true);
        }
        for tier in &mut sim.tiers {
            tier.changes.enabled = true;
        }
    }
    Ok(sim)
}

/// The report of a finished run.
fn finish(sim: Sim<'_>) -> SimReport {
    let Sim {
        config,
        workload,
        records,
        mut counters,
        instances,
        tiers,
        placer,
        publisher,
        pd,
        ..
    } = sim;
    if let Some(p) = publisher {
        counters.feed.extend([
            ("published_batches".to_owned(), p.batches),
            ("published_events".to_owned(), p.events),
            ("published_bytes".to_owned(), p.bytes),
        ]);
    }
    counters.feed.extend(placer.feed_counters());
    counters.preemptions = instances.iter().map(|i| i.preemptions).sum();
    counters.gpu_evictions = instances.iter().map(|i| i.pool.evictions()).sum();
    counters.tier_evictions = tiers.iter().map(GlobalTier::evictions).sum();
    let rule = placer.decode_rule();
    let mut report = summarize(config, workload, placer.policy(), records, counters);
    report.pd = pd.map(|pd| {
        let decode_preemptions = instances[pd.prefill as usize..].iter().map(|i| i.preemptions).sum();
        pd.report(rule, decode_preemptions)
    });
    report
}

impl Sim<'_> {
    fn push(&mut self, time: f64, kind: Kind) {
        self.seq += 1;
        self.queued_work += u64::from(!kind.is_background());
        self.heap.push(Event {
            time,
            seq: self.seq,
            kind,
        });
    }

    fn init(&mut self) {
        let specs = self.workload.requests();
        for (i, spec) in specs.iter().enumerate() {
            self.reqs[i].prompt = u64::from(spec.input_tokens);
            self.reqs[i].num_tokens = u64::from(spec.input_tokens);
            self.reqs[i].output = spec.output_tokens;
            self.records.push(RequestRecord {
                index: i as u32,
                input_tokens: spec.input_tokens,
                output_tokens: spec.output_tokens,
                first_turn_truth: spec.first_turn,
                ..RequestRecord::default()
            });
            // The turn that re-sends this request's answer: the first successor in its session.
            if let Some(p) = spec.prev.filter(|&p| specs[p as usize].session == spec.session) {
                self.reqs[p as usize].next_turn.get_or_insert(i as u32);
            }
        }
        let arrival = self.workload.arrival();
        if arrival != ArrivalKind::OpenLoop {
            // Successor lists in CSR form: children of r are children[child_start[r]..child_start[r+1]].
            let mut counts = vec![0_u32; specs.len() + 1];
            for spec in specs {
                if let Some(p) = spec.prev {
                    counts[p as usize + 1] += 1;
                }
            }
            for i in 1..counts.len() {
                counts[i] += counts[i - 1];
            }
            let mut fill = counts.clone();
            self.children = vec![0; counts[specs.len()] as usize];
            for (i, spec) in specs.iter().enumerate() {
                if let Some(p) = spec.prev {
                    self.children[fill[p as usize] as usize] = i as u32;
                    fill[p as usize] += 1;
                }
            }
            self.child_start = counts;
        }
        let session_start = if arrival == ArrivalKind::ClosedLoop {
            // The router's counter-based stream (routing-semantics §5), seeded by the run.
            let draws = DrawCounter::new(self.config.seed);
            let mut t = 0.0;
            (0..self.workload.root_sessions())
                .map(|s| {
                    if s > 0 {
                        t += exponential(&draws, self.config.session_rate_per_s);
                    }
                    t
                })
                .collect()
        } else {
            Vec::new()
        };
        for (i, spec) in specs.iter().enumerate() {
            let at = match arrival {
                ArrivalKind::OpenLoop => Some(spec.time_s / self.config.time_scale),
                ArrivalKind::GatedOpenLoop => spec.prev.is_none().then(|| spec.time_s / self.config.time_scale),
                ArrivalKind::ClosedLoop => spec
                    .prev
                    .is_none()
                    .then(|| session_start[spec.root_session as usize] + spec.time_s),
            };
            if let Some(t) = at {
                self.push(t, Kind::Arrive(i as u32));
            }
        }
        self.push(0.0, Kind::Sample);
        if let Some(period) = self.config.load_report_interval_s {
            self.push(period, Kind::LoadReport);
        }
    }

    fn run(&mut self) -> Result<()> {
        while let Some(ev) = self.heap.pop() {
            self.now = ev.time;
            self.counters.events += 1;
            if self.config.max_events.is_some_and(|max| self.counters.events > max) {
                return Err(SimError::EventBudget {
                    events: self.counters.events - 1,
                    time_s: self.now,
                });
            }
            self.queued_work -= u64::from(!ev.kind.is_background());
            match ev.kind {
                Kind::Arrive(r) => self.arrive(r)?,
                Kind::Deliver(r) => self.enqueue(r),
                Kind::FetchDone(r) => self.fetch_done(r),
                Kind::StepDone(i) => self.step_done(i)?,
                Kind::Transfer { link, version } => self.transfer_done(link, version),
                Kind::PdTransfer { link, version } => self.pd_transfer_done(link, version),
                Kind::Sample => self.sample()?,
                Kind::LoadReport => self.load_report(),
                Kind::KvEvents => self.deliver_kv_events(),
                Kind::Release(r) => {
                    if !self.release(r)? {
                        // Stale: a finish placed it first. Nothing moved (nor the makespan).
                        continue;
                    }
                }
            }
            if self.config.index_feed == IndexFeed::Oracle {
                self.flush_to_oracle();
            }
            if !ev.kind.is_background() {
                self.counters.makespan_s = self.now;
            }
        }
        Ok(())
    }

    fn arrive(&mut self, r: u32) -> Result<()> {
        let now = self.now;
        let workload = self.workload;
        let spec = &workload.requests()[r as usize];
        self.not_arrived -= 1;
        if self.config.arrivals_until_s.is_some_and(|end| now > end) {
            // Cut off: never issued, and neither is anything that would follow it.
            return Ok(());
        }
        self.records[r as usize].arrival_s = Some(now);
        if u64::from(spec.input_tokens) + u64::from(spec.output_tokens) > self.model_len {
            self.records[r as usize].rejected = true;
            self.records[r as usize].finish_s = Some(now);
            self.release_successors(r);
            return Ok(());
        }
        self.in_flight += 1;
        if !self.place(r)? {
            self.held.push_back(r);
        }
        Ok(())
    }

    /// Asks the placer where request `r` goes and, unless it is held, sends it there after the
    /// frontend time. Returns whether it was placed.
    fn place(&mut self, r: u32) -> Result<bool> {
        let now = self.now;
        let workload = self.workload;
        let spec = &workload.requests()[r as usize];
        let chain = workload.chain(r as usize);
        // What a client echoing llm-d's session cookie sends: where its session's previous turn
        // went (none for a subagent's first request, whose `prev` is its parent's turn).
        let previous_instance = spec
            .prev
            .filter(|&p| workload.requests()[p as usize].session == spec.session)
            .and_then(|p| self.records[p as usize].instance);
        let placed = self.placer.place(&PlaceRequest {
            request_id: u64::from(r),
            chain,
            prompt_tokens: spec.input_tokens,
            turn: workload.turn(r as usize),
            now,
            previous_instance,
            session_key: Some(u64::from(spec.session)),
        })?;
        if placed.instance >= self.config.instances {
            return Err(SimError::Router(format!(
                "placer chose instance {} of {}",
                placed.instance, self.config.instances
            )));
        }
        if placed.held {
            if let Some(t) = placed.release_at_s {
                self.push(t.max(now), Kind::Release(r));
            }
            return Ok(false);
        }
        self.pd_placed(r, &placed)?;
        let rec = &mut self.records[r as usize];
        rec.instance = Some(placed.instance);
        rec.first_turn_inferred = placed.first_turn;
        rec.reason = placed.reason;
        rec.predicted_local_hit_tokens = placed.local_hit_tokens;
        rec.predicted_global_hit_tokens = placed.global_hit_tokens;
        let frontend = self.config.profile.frontend_time(u64::from(spec.input_tokens));
        self.push(now + frontend, Kind::Deliver(r));
        Ok(true)
    }

    /// Held request `r`'s hold ran out: it is placed again, unless a finish has placed it
    /// already (returns whether it was still held).
    fn release(&mut self, r: u32) -> Result<bool> {
        let Some(k) = self.held.iter().position(|&h| h == r) else {
            return Ok(false);
        };
        if self.place(r)? {
            self.held.remove(k);
        }
        Ok(true)
    }

    /// A request finished: every held request is placed again, in arrival order.
    fn retry_held(&mut self) -> Result<()> {
        for _ in 0..self.held.len() {
            let Some(r) = self.held.pop_front() else { break };
            if !self.place(r)? {
                self.held.push_back(r);
            }
        }
        Ok(())
    }

    fn fetch_done(&mut self, r: u32) {
        let i = self.serving_instance(r);
        self.instances[i].fetch_done(r, &mut self.reqs, self.workload, self.limits.block_tokens);
        if !self.instances[i].busy {
            self.start_step(i);
        }
    }

    /// Which store instance `i` reads and writes.
    fn tier_index(&self, i: usize) -> usize {
        if self.tiers.len() == 1 { 0 } else { i }
    }

    /// The store instance `i` reads and writes.
    pub(crate) fn tier(&self, i: usize) -> &GlobalTier {
        &self.tiers[self.tier_index(i)]
    }

    fn enqueue(&mut self, r: u32) {
        let i = self.records[r as usize].instance.unwrap_or(0) as usize;
        // Expected prefill for the queued-token load metric: what neither the GPU cache nor
        // the tier holds right now (the scheduler decides for real at admission).
        let chain = self.workload.chain(r as usize);
        let b = self.limits.block_tokens;
        let max_hit = (((self.reqs[r as usize].num_tokens - 1) / b) as usize).min(chain.len());
        let local = self.instances[i].pool.longest_hit(chain, max_hit);
        let external = self.tier(i).run_from(&chain[..max_hit], local);
        let req = &mut self.reqs[r as usize];
        req.expected_prefill = req.num_tokens - (local + external) as u64 * b;
        self.instances[i].waiting.push_back(r);
        if !self.instances[i].busy {
            self.start_step(i);
        }
    }

    fn start_step(&mut self, i: usize) {
        let k = self.tier_index(i);
        let shape = self.instances[i].schedule(&mut self.reqs, self.workload, self.limits, &mut self.tiers[k]);
        let synchronous = self.start_loads(i);
        if shape.is_empty() {
            self.instances[i].busy = false;
            return;
        }
        self.instances[i].busy = true;
        self.counters.iterations += 1;
        let t = self.config.profile.iteration_time(&shape) + self.connector_step_cost(i);
        if synchronous > 0 {
            self.stalled[i] = StalledStep::new(synchronous, t, self.now);
        } else {
            self.push(self.now + t, Kind::StepDone(i as u32));
        }
    }

    fn step_done(&mut self, i: u32) -> Result<()> {
        let now = self.now;
        let mut first_tokens = std::mem::take(&mut self.scratch_first);
        let mut finished = std::mem::take(&mut self.scratch_finished);
        let mut prefilled = std::mem::take(&mut self.scratch_prefilled);
        // A PD prefill instance's one sampled token is dropped by the proxy: no token gap.
        let pd_prefill = self.is_prefill_instance(i);
        let pd_decode = self.pd.is_some() && !pd_prefill;
        let (gaps, specs) = (&mut self.gaps, self.workload.requests());
        self.instances[i as usize].complete(&mut self.reqs, self.workload, self.limits, |ev| match ev {
            StepEvent::Prefilled { request, from, to } => prefilled.push((request, from, to)),
            StepEvent::Sampled { .. } if pd_prefill => {}
            StepEvent::Sampled { request } => gaps.on_token(request, specs[request as usize].output_tokens, now),
            StepEvent::FirstToken { request } => first_tokens.push(request),
            StepEvent::Finished { request } => finished.push(request),
        });
        if self.tier(i as usize).enabled() && !pd_decode {
            for &(request, from, to) in &prefilled {
                self.write_through(i, request, from, to);
            }
        }
        prefilled.clear();
        self.scratch_prefilled = prefilled;
        for &r in &first_tokens {
            if !pd_prefill {
                self.records[r as usize].first_token_s = Some(now);
            }
            if !pd_decode {
                self.placer.on_prefilled(u64::from(r), now);
            }
        }
        if pd_prefill {
            for &r in &finished {
                self.pd_prefill_finished(r);
            }
            finished.clear();
        }
        for &r in &finished {
            let rec = &mut self.records[r as usize];
            rec.finish_s = Some(now);
            rec.tbt_tail_s = self.gaps.finish(r);
            let live = &self.reqs[r as usize];
            rec.local_hit_tokens = live.local_hit_tokens;
            rec.global_hit_tokens = live.global_hit_tokens;
            rec.preemptions = live.preemptions;
            self.in_flight -= 1;
            self.placer.on_finished(u64::from(r), live.output, now);
            self.release_successors(r);
        }
        let any_finished = !finished.is_empty();
        first_tokens.clear();
        finished.clear();
        self.scratch_first = first_tokens;
        self.scratch_finished = finished;
        if self.publisher.is_some() {
            self.publish(i);
            for j in 0..self.config.instances {
                if j != i && !self.instances[j as usize].busy {
                    self.publish(j);
                }
            }
        }
        self.start_step(i as usize);
        if any_finished && !self.held.is_empty() {
            self.retry_held()?;
        }
        Ok(())
    }

    /// Instance `i` publishes its cache log as one KV-event message, delivered after the delay.
    fn publish(&mut self, i: u32) {
        let Some(publisher) = &mut self.publisher else { return };
        let log = &mut self.instances[i as usize].pool.log;
        if let Some(frames) = publisher.publish(i, log, self.now) {
            log.clear();
            self.in_transit.push_back((i, frames));
            self.push(self.now + self.config.event_delay_s, Kind::KvEvents);
        }
    }

    /// The oldest message in transit reaches the placer (one delay for all: FIFO).
    fn deliver_kv_events(&mut self) {
        if let Some((i, frames)) = self.in_transit.pop_front() {
            self.placer.on_kv_event_message(i, &frames, self.now);
        }
    }

    /// Oracle feed: every instance's logged changes reach the placer now.
    fn flush_to_oracle(&mut self) {
        for (i, inst) in self.instances.iter_mut().enumerate() {
            if !inst.pool.log.is_empty() {
                self.placer.on_cache_changes(i as u32, &inst.pool.log, self.now);
                inst.pool.log.clear();
            }
        }
    }

    fn release_successors(&mut self, r: u32) {
        if self.child_start.is_empty() {
            return;
        }
        let finish = self.now;
        let (lo, hi) = (
            self.child_start[r as usize] as usize,
            self.child_start[r as usize + 1] as usize,
        );
        for k in lo..hi {
            let c = self.children[k];
            let spec = &self.workload.requests()[c as usize];
            let think = self
                .config
                .max_think_s
                .map_or(spec.think_s, |cap| spec.think_s.min(cap));
            let at = match self.workload.arrival() {
                ArrivalKind::GatedOpenLoop => (spec.time_s / self.config.time_scale).max(finish + think),
                _ => finish + think,
            };
            self.push(at, Kind::Arrive(c));
        }
    }

    /// Whether anything can still happen: a request in flight, or one still to arrive while
    /// some event could issue it (requests behind a cut-off never arrive).
    fn pending(&self) -> bool {
        self.in_flight > 0 || (self.not_arrived > 0 && self.queued_work > 0)
    }

    fn sample(&mut self) -> Result<()> {
        let reqs = &self.reqs;
        let queued: Vec<f64> = self
            .instances
            .iter()
            .map(|inst| inst.queued_tokens(reqs) as f64)
            .collect();
        if let Some(period) = self.config.series_interval_s {
            let series = &mut self.counters.load_series;
            let due = series.time_s.last().is_none_or(|&t| self.now >= t + period - 1e-9);
            if due {
                series.instances = self.config.instances;
                series.time_s.push(self.now);
                for (inst, &q) in self.instances.iter().zip(&queued) {
                    series.requests.push((inst.running.len() + inst.waiting.len()) as u32);
                    series.queued_tokens.push(q as u64);
                    series.kv_usage.push(inst.pool.usage());
                }
            }
        }
        self.pd_sample();
        if let Some(cv) = coefficient_of_variation(queued.iter().copied()) {
            self.counters.queued_cv.push(cv);
        }
        let counts = self
            .instances
            .iter()
            .map(|inst| (inst.running.len() + inst.waiting.len()) as f64);
        if let Some(cv) = coefficient_of_variation(counts) {
            self.counters.requests_cv.push(cv);
        }
        // Only periodic events left while requests are in flight: nothing can progress.
        let stalled = self.in_flight > 0 && self.queued_work == 0;
        if stalled {
            return Err(SimError::Stalled {
                time_s: self.now,
                in_flight: self.in_flight,
            });
        }
        if self.pending() {
            self.push(self.now + self.config.sample_interval_s, Kind::Sample);
        }
        Ok(())
    }

    fn load_report(&mut self) {
        for (i, inst) in self.instances.iter().enumerate() {
            let snapshot = EngineLoadReport {
                running: inst.running.len() as u32,
                waiting: inst.waiting.len() as u32,
                kv_usage: inst.pool.usage(),
            };
            self.placer.on_load(i as u32, snapshot, self.now);
        }
        let pending = self.pending();
        if let Some(period) = self.config.load_report_interval_s.filter(|_| pending) {
            self.push(self.now + period, Kind::LoadReport);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache_events::IndexFeed;
    use crate::config::GlobalTierConfig;
    use crate::workload::{RequestSpec, SyntheticSessions, WorkloadBuilder, synthetic_sessions};
    use crate::{PolicyKind, core_placer};

    const B: u32 = 16;

    /// 16 closed-loop sessions of 5 turns over a shared 512-token prompt.
    fn workload() -> Workload {
        let shape = SyntheticSessions {
            sessions: 16,
            turns: 5,
            shared_tokens: 512,
            turn_tokens: 1024,
            output_tokens: 30,
            think_s: 0.5,
        };
        synthetic_sessions(B, shape).unwrap()
    }

    #[test]
    fn oracle_index_holds_exactly_what_the_engines_and_the_store_hold() {
        let w = workload();
        let base = SimConfig::default();
        let config = SimConfig {
            instances: 3,
            kv_capacity_tokens: Some(12_288),
            max_model_len: Some(8_192),
            session_rate_per_s: 4.0,
            index_feed: IndexFeed::Oracle,
            global_tier: GlobalTierConfig {
                capacity_bytes: (20_000.0 * base.profile.kv_bytes_per_token) as u64,
                ..GlobalTierConfig::default()
            },
            ..base
        };
        // Smetric reads the index it is fed, so placements depend on it: any feed error shows.
        let mut placer = core_placer(&config, &w, PolicyKind::Smetric).unwrap();
        let (local_truth, held, stored) = {
            let mut sim = build(&config, &w, &mut placer).unwrap();
            sim.init();
            sim.run().unwrap();
            assert!(sim.instances.iter().map(|i| i.pool.evictions()).sum::<u64>() > 0);
            assert!(sim.tier(0).evictions() > 0);
            let local: Vec<Vec<usize>> = (0..w.len())
                .map(|r| {
                    let chain = w.chain(r);
                    sim.instances
                        .iter()
                        .map(|i| i.pool.longest_hit(chain, chain.len()))
                        .collect()
                })
                .collect();
            let held: Vec<usize> = sim.instances.iter().map(|i| i.pool.cached_blocks()).collect();
            (local, held, sim.tier(0).len())
        };
        let stats = placer.router().stats();
        assert_eq!(stats.index.local_blocks, held);
        assert_eq!(stats.index.global_blocks, stored);
        for (r, truth) in local_truth.iter().enumerate() {
            let hits = placer.index_hits(w.chain(r)).unwrap();
            let got: Vec<usize> = hits.local.iter().map(|(_, t)| (t / u64::from(B)) as usize).collect();
            assert_eq!(&got, truth, "request {r}");
        }
    }

    /// `cpu-offload`: every instance writes its own host store (an even share of the
    /// capacity), and the router, fed by the engines' and stores' changes, credits each
    /// instance's offloaded blocks to that instance's host pool only, never to a global tier.
    #[test]
    fn cpu_offload_stores_are_per_instance_and_credited_to_their_instance() {
        let w = workload();
        let base = SimConfig::default();
        for feed in [IndexFeed::Oracle, IndexFeed::Events] {
            let config = SimConfig {
                instances: 3,
                kv_capacity_tokens: Some(12_288),
                max_model_len: Some(8_192),
                session_rate_per_s: 4.0,
                index_feed: feed,
                global_tier: GlobalTierConfig {
                    path: crate::config::TierPath::CpuOffload,
                    capacity_bytes: (60_000.0 * base.profile.kv_bytes_per_token) as u64,
                    ..GlobalTierConfig::default()
                },
                ..base.clone()
            };
            let mut placer = core_placer(&config, &w, PolicyKind::Smetric).unwrap();
            let (stores, pools) = {
                let mut sim = build(&config, &w, &mut placer).unwrap();
                sim.init();
                sim.run().unwrap();
                assert_eq!(sim.tiers.len(), 3, "one store per instance");
                let stores: Vec<usize> = (0..3).map(|i| sim.tier(i).len()).collect();
                // Negative control of the per-instance model: some block is in one store only.
                let only_one = (0..w.len())
                    .flat_map(|r| w.chain(r).iter().copied())
                    .any(|h| (0..3).filter(|&i| sim.tier(i).contains(h)).count() == 1);
                assert!(only_one, "{feed:?}: the stores are not copies of one another");
                (stores, sim.tiers.len())
            };
            assert_eq!(pools, 3);
            let stats = placer.router().stats();
            assert_eq!(stats.index.global_blocks, 0, "{feed:?}: nothing is credited fleet-wide");
            assert_eq!(stats.host_blocks, stores, "{feed:?}");
            assert!(stores.iter().all(|&n| n > 0), "{feed:?}: {stores:?}");
        }
    }

    /// A two-turn session on one instance: the second turn re-sends the first one's answer.
    /// Turn 1 is 64 prompt tokens (4 blocks) and 40 output tokens, so 103 tokens have KV: 6
    /// full blocks. Turn 2's chain extends turn 1's by 4 blocks (answer + tool result).
    fn two_turns() -> Workload {
        let spec = |input, output, prev| RequestSpec {
            trace_id: 0,
            input_tokens: input,
            output_tokens: output,
            time_s: 0.0,
            think_s: 1.0,
            prev,
            session: 0,
            root_session: 0,
            first_turn: Some(prev.is_none()),
        };
        let mut b = WorkloadBuilder::new("two turns", B, ArrivalKind::ClosedLoop);
        b.push(spec(64, 40, None), 1000..1004);
        b.push(spec(134, 2, Some(0)), 1000..1008);
        b.build().unwrap()
    }

    fn second_turn(share: f64, feed: IndexFeed) -> RequestRecord {
        let config = SimConfig {
            instances: 1,
            answer_rerender_share: share,
            index_feed: feed,
            keep_records: true,
            global_tier: GlobalTierConfig {
                enabled: false,
                ..GlobalTierConfig::default()
            },
            ..SimConfig::default()
        };
        let report = crate::run(&config, &two_turns(), PolicyKind::Smetric).unwrap();
        report.records[1].clone()
    }

    #[test]
    fn the_next_turn_hits_the_answer_it_re_sends() {
        // Share 1: the prompt's 4 blocks and the 2 full answer blocks; share 0: the prompt only;
        // a half share: 64 + 20 tokens re-render, 5 full blocks.
        for (share, blocks) in [(1.0, 6), (0.0, 4), (0.5, 5)] {
            let r = second_turn(share, IndexFeed::Approximate);
            assert_eq!(r.local_hit_tokens, blocks * u64::from(B), "share {share}");
        }
        // What the router expects at routing time follows its feed: insert on route knows only
        // the prompt it routed; KV events (vLLM publishes generated-token blocks too) and the
        // oracle know the answer blocks.
        for (feed, share, blocks) in [
            (IndexFeed::Approximate, 1.0, 4),
            (IndexFeed::Events, 1.0, 6),
            (IndexFeed::Oracle, 1.0, 6),
            (IndexFeed::Events, 0.0, 4),
        ] {
            let r = second_turn(share, feed);
            assert_eq!(
                r.predicted_local_hit_tokens,
                blocks * u64::from(B),
                "{feed:?} share {share}"
            );
        }
    }
}
