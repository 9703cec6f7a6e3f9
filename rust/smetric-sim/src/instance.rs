//! One vLLM v1 engine: the scheduler of `vllm/v1/core/sched/scheduler.py`, step by step.
//!
//! Each step (one call to [`Instance::schedule`]):
//! 1. **Running requests first**, in admission order. Each gets `min(remaining, budget)` new
//!    tokens: 1 for a decode, a chunk for an unfinished prefill (chunked prefill). If the
//!    blocks for them cannot be allocated, the *last* running request is preempted (its blocks
//!    freed — they stay cached — its progress reset: recompute) and put at the front of the
//!    waiting queue; this repeats until the allocation fits or the request itself was preempted.
//! 2. **Then waiting requests**, FIFO, only if nothing was preempted this step, while the
//!    token budget lasts and fewer than `max_num_seqs` run. On admission the prefix cache is
//!    looked up (full blocks only, hit capped at `n − 1` tokens so one token is always
//!    computed). If the global tier holds the chain's next blocks, they are allocated and a
//!    load is started. With an asynchronous connector the request stays in the queue,
//!    skipped, until the load is done (vLLM's `WAITING_FOR_REMOTE_KVS`); then its loaded
//!    blocks count as computed. With a synchronous one (LMCache's default) the loaded tokens
//!    count as computed at once and the request runs in this very step: the caller makes the
//!    step wait for the load, so every request of the step waits with it. A request whose
//!    blocks do not fit stops admission (admission never preempts).
//! 3. Blocks that become full in this step are registered in the prefix cache when the step
//!    is scheduled (vLLM caches at `allocate_slots` time).
//!
//! [`Instance::complete`] applies the step when its time has elapsed: computed tokens advance;
//! a request whose tokens are all computed samples one token (the first one ends its TTFT);
//! a request with all its output tokens finishes and frees its blocks (tail first).
//!
//! In a PD cluster (`cluster::pd`) a request's [`PdRole`] changes two steps: on its prefill
//! instance it keeps its blocks when it finishes (its one token sampled), and on its decode
//! instance its admission allocates the whole context and starts a pull instead of a
//! prefill; the pulled blocks then count as computed up to `n − 1` tokens.
//!
//! **Answers re-sent.** Trace chains name prompt blocks only, but vLLM caches the blocks its
//! generated tokens fill too, and the next turn of the session re-sends the answer in its
//! history, so on the same instance it hits them. When a request finishes and the next turn of
//! its session ([`LiveRequest::next_turn`]) has a chain that extends the request's own (its
//! first `p` blocks are the request's whole chain, `p ≥ 1`), the request's blocks after the
//! prompt are registered under the next chain's hashes, up to block
//! ⌊min(input + ⌊share · output⌋, tokens with KV) / block⌋ (share:
//! [`EngineLimits::answer_rerender_share`], the part of an answer that re-renders token for
//! token; tokens with KV: input + output − 1, the last sampled token has none), before the
//! blocks are freed. They are blocks the request already held, so capacity is unchanged; they
//! join the free queue as cached blocks and are evicted first (tail first); the block pool
//! logs them as stored, as vLLM publishes `BlockStored` for generated-token blocks. Where the
//! next chain does not extend the request's, nothing is credited: the trace gives no evidence.
//! The rest of an answer's blocks stay anonymous: they count against capacity but never hit.
//!
//! Invariants: a request is in exactly one of `waiting`, `running` or neither (fetching or
//! done); `blocks.len() == ceil(computed_after_step / block)` for scheduled requests.
//! Complexity per step: O(running + admitted + blocks allocated); nothing is per token.

use std::collections::VecDeque;

use crate::block_pool::BlockPool;
use crate::global_tier::GlobalTier;
use crate::perf_model::BatchShape;
use crate::workload::Workload;

/// Runtime state of one request inside the cluster.
#[derive(Clone, Debug, Default)]
pub(crate) struct LiveRequest {
    /// Prompt tokens.
    pub prompt: u64,
    /// Output tokens to generate.
    pub output: u32,
    /// Tokens that exist: prompt + sampled tokens fed back.
    pub num_tokens: u64,
    /// Tokens whose KV is computed.
    pub computed: u64,
    /// Tokens sampled so far.
    pub generated: u32,
    /// Physical blocks held, in chain order.
    pub blocks: Vec<u32>,
    /// Leading blocks already registered (or known not to need it).
    pub registered: usize,
    /// Expected prefill tokens while waiting (for the queued-token load metric).
    pub expected_prefill: u64,
    /// A global-tier load for it is in flight.
    pub fetching: bool,
    /// Whether the request was admitted at least once.
    pub admitted: bool,
    /// Local prefix-cache hit at first admission, tokens.
    pub local_hit_tokens: u64,
    /// Global-tier tokens loaded at first admission.
    pub global_hit_tokens: u64,
    /// Times this request was preempted.
    pub preemptions: u32,
    /// Its part in a PD cluster, if any.
    pub pd: PdRole,
    /// The next request of its session (the turn that re-sends its answer), if any.
    pub next_turn: Option<u32>,
}

/// What a request is to the instance it is on, in a PD cluster.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum PdRole {
    /// Co-located, or decoding after its pull (an ordinary request).
    #[default]
    Ordinary,
    /// On its prefill instance: keep the blocks when it finishes (the prefill instance holds
    /// them until the decode instance has pulled them; `cluster::pd` frees them).
    Prefill,
    /// Queued on its decode instance: at admission allocate the whole context and pull what
    /// the prefix cache lacks from the prefill instance (vLLM's `WAITING_FOR_REMOTE_KVS`).
    RemoteDecode,
}

/// What happened to a request when a step completed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StepEvent {
    /// Tokens `[from, to)` of the request were computed by a prefill chunk.
    Prefilled { request: u32, from: u64, to: u64 },
    /// The request sampled a token (any of them, the first included; tail token gaps).
    Sampled { request: u32 },
    /// The request sampled its first token.
    FirstToken { request: u32 },
    /// The request sampled its last token and left the engine.
    Finished { request: u32 },
}

/// Engine limits shared by every instance.
#[derive(Clone, Copy, Debug)]
pub(crate) struct EngineLimits {
    pub block_tokens: u64,
    pub max_batched_tokens: u64,
    pub max_num_seqs: usize,
    /// Tier loads run inside the admitting step (LMCache) instead of asynchronously.
    pub synchronous_loads: bool,
    /// Share of an answer's tokens the next turn re-sends token for token (module docs).
    pub answer_rerender_share: f64,
}

/// A global-tier load the last [`Instance::schedule`] started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct StartedLoad {
    pub request: u32,
    pub blocks: usize,
    /// The step just scheduled must wait for it (the request is in that step).
    pub synchronous: bool,
    /// A PD pull from the request's prefill instance, not a tier load.
    pub remote: bool,
}

/// One engine.
#[derive(Debug)]
pub(crate) struct Instance {
    pub pool: BlockPool,
    pub waiting: VecDeque<u32>,
    pub running: Vec<u32>,
    /// `(request, new tokens)` of the step in flight.
    pub batch: Vec<(u32, u64)>,
    /// A step is in flight.
    pub busy: bool,
    /// The global-tier loads the last step started.
    pub started_fetches: Vec<StartedLoad>,
    pub preemptions: u64,
}

impl Instance {
    pub fn new(num_blocks: u32) -> Self {
        Self {
            pool: BlockPool::new(num_blocks),
            waiting: VecDeque::new(),
            running: Vec::new(),
            batch: Vec::new(),
            busy: false,
            started_fetches: Vec::new(),
            preemptions: 0,
        }
    }

    /// Prefill tokens queued here: expected prefill of waiting requests plus the unfinished
    /// prefill of running ones (the router's `queued`, measured on the engine).
    pub fn queued_tokens(&self, reqs: &[LiveRequest]) -> u64 {
        let waiting: u64 = self.waiting.iter().map(|&r| reqs[r as usize].expected_prefill).sum();
        let running: u64 = self
            .running
            .iter()
            .map(|&r| {
                let q = &reqs[r as usize];
                if q.generated == 0 { q.num_tokens - q.computed } else { 0 }
            })
            .sum();
        waiting + running
    }

    /// Builds the next step; returns its shape (empty when there is nothing to run).
    /// Global-tier loads started by the last [`Self::schedule`] call are left in
    /// `started_fetches` for the caller to time on the links.
    pub fn schedule(
        &mut self,
        reqs: &mut [LiveRequest],
        workload: &Workload,
        limits: EngineLimits,
        tier: &mut GlobalTier,
    ) -> BatchShape {
        self.batch.clear();
        self.started_fetches.clear();
        let mut shape = BatchShape::default();
        let mut budget = limits.max_batched_tokens;
        let mut preempted = false;
        let b = limits.block_tokens;

        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let r = self.running[i];
            let req = &reqs[r as usize];
            let new = (req.num_tokens - req.computed).min(budget);
            if new == 0 {
                i += 1;
                continue;
            }
            let need = (req.computed + new).div_ceil(b) as usize - req.blocks.len();
            let mut victim_was_self = false;
            while need as u32 > self.pool.num_free() {
                // Before `r` would preempt itself, take back the blocks of a waiting request
                // whose tier load finished: otherwise a request that does not fit next to them
                // is preempted and re-admitted (chunk by chunk) ahead of them forever.
                if self.running.last() == Some(&r) && self.release_youngest_holder(reqs) {
                    preempted = true;
                    continue;
                }
                let Some(victim) = self.running.pop() else { break };
                self.preempt(victim, reqs);
                preempted = true;
                if victim == r {
                    victim_was_self = true;
                    break;
                }
            }
            if victim_was_self {
                break;
            }
            let req = &mut reqs[r as usize];
            if !self.pool.allocate(need as u32, &mut req.blocks) {
                // Cannot happen: the loop above freed enough or preempted `r` itself.
                break;
            }
            let chain = workload.chain(r as usize);
            register_full(&mut self.pool, req, chain, req.computed + new, b);
            if req.generated > 0 && new == 1 && req.computed + 1 == req.num_tokens {
                shape.add_decode(req.computed);
            } else {
                shape.add_prefill(new, req.computed);
            }
            budget -= new;
            self.batch.push((r, new));
            i += 1;
        }

        // vLLM skips admission in a step that preempted. When that step is empty, vLLM's
        // engine loop would schedule again at once; doing it here keeps the instance from
        // idling with work queued.
        if !preempted || self.batch.is_empty() {
            self.admit(reqs, workload, limits, tier, &mut budget, &mut shape);
            // Requests whose tier load finished hold blocks while they wait. If nothing runs
            // or loads and the queue head still does not fit, they would wait forever:
            // release the youngest such holder (it keeps its blocks cached, like a
            // preemption) and try again.
            while self.batch.is_empty()
                && self.running.is_empty()
                && self.started_fetches.is_empty()
                && !self.waiting.iter().any(|&r| reqs[r as usize].fetching)
                && self.release_youngest_holder(reqs)
            {
                self.admit(reqs, workload, limits, tier, &mut budget, &mut shape);
            }
        }
        shape
    }

    /// Applies the step in flight; reports per-request events through `sink`.
    pub fn complete(
        &mut self,
        reqs: &mut [LiveRequest],
        workload: &Workload,
        limits: EngineLimits,
        mut sink: impl FnMut(StepEvent),
    ) {
        let mut any_finished = false;
        for &(r, new) in &self.batch {
            let req = &mut reqs[r as usize];
            let from = req.computed;
            req.computed += new;
            if req.generated == 0 || from < req.prompt {
                sink(StepEvent::Prefilled {
                    request: r,
                    from,
                    to: req.computed,
                });
            }
            if req.computed < req.num_tokens {
                continue;
            }
            req.generated += 1;
            sink(StepEvent::Sampled { request: r });
            if req.generated == 1 {
                sink(StepEvent::FirstToken { request: r });
            }
            if req.generated >= req.output {
                if req.pd != PdRole::Prefill {
                    keep_answer(&mut self.pool, req, r, workload, limits);
                    self.pool.release(&req.blocks);
                    req.blocks = Vec::new();
                }
                any_finished = true;
                sink(StepEvent::Finished { request: r });
            } else {
                req.num_tokens += 1;
            }
        }
        if any_finished {
            self.running.retain(|&r| {
                let q = &reqs[r as usize];
                q.generated < q.output
            });
        }
        self.batch.clear();
    }

    /// Admission pass over the waiting queue (FIFO; requests loading KV are skipped and keep
    /// their place, as vLLM's `WAITING_FOR_REMOTE_KVS`).
    fn admit(
        &mut self,
        reqs: &mut [LiveRequest],
        workload: &Workload,
        limits: EngineLimits,
        tier: &mut GlobalTier,
        budget: &mut u64,
        shape: &mut BatchShape,
    ) {
        let b = limits.block_tokens;
        let mut j = 0;
        while *budget > 0 && self.running.len() < limits.max_num_seqs && j < self.waiting.len() {
            let r = self.waiting[j];
            let chain = workload.chain(r as usize);
            let req = &mut reqs[r as usize];
            if req.fetching {
                j += 1;
                continue;
            }
            if req.computed > 0 {
                // KV arrived from the global tier: its blocks are held and registered already.
                let new = (req.num_tokens - req.computed).min(*budget);
                let need = (req.computed + new).div_ceil(b) as usize - req.blocks.len();
                if need as u32 > self.pool.num_free() {
                    break;
                }
                self.pool.allocate(need as u32, &mut req.blocks);
                register_full(&mut self.pool, req, chain, req.computed + new, b);
                shape.add_prefill(new, req.computed);
                *budget -= new;
                self.batch.push((r, new));
                self.running.push(r);
                self.waiting.remove(j);
                continue;
            }
            let max_hit = (((req.num_tokens - 1) / b) as usize).min(chain.len());
            let local = self.pool.longest_hit(chain, max_hit);
            if req.pd == PdRole::RemoteDecode {
                // PD decode: allocate the whole context before pulling it; what the prefix
                // cache holds is not pulled (the last block always is: its last token is
                // recomputed here).
                let pull = req.num_tokens.div_ceil(b) as usize - local;
                if !self.pool.can_allocate(&chain[..local], pull as u32) {
                    break;
                }
                self.pool.acquire_hits(&chain[..local], &mut req.blocks);
                self.pool.allocate(pull as u32, &mut req.blocks);
                req.registered = local;
                req.pd = PdRole::Ordinary;
                req.fetching = true;
                self.started_fetches.push(StartedLoad {
                    request: r,
                    blocks: pull,
                    synchronous: false,
                    remote: true,
                });
                j += 1;
                continue;
            }
            let external = if tier.enabled() {
                tier.run_from(&chain[..max_hit], local)
            } else {
                0
            };
            if external > 0 && !limits.synchronous_loads {
                // Allocate the blocks the tier will fill and start the load; the request
                // waits (keeping its queue place) while the engine serves others.
                if !self.pool.can_allocate(&chain[..local], external as u32) {
                    break;
                }
                self.pool.acquire_hits(&chain[..local], &mut req.blocks);
                self.pool.allocate(external as u32, &mut req.blocks);
                req.registered = local;
                tier.touch(&chain[local..local + external]);
                req.fetching = true;
                req.note_first_admission(local, external, b);
                self.started_fetches.push(StartedLoad {
                    request: r,
                    blocks: external,
                    synchronous: false,
                    remote: false,
                });
                j += 1;
                continue;
            }
            // Admitted now. With a synchronous load (LMCache's default: `start_load_kv`
            // retrieves before the forward pass), the loaded blocks count as computed and the
            // request runs in this very step; otherwise `external` is 0.
            let computed = (local + external) as u64 * b;
            let new = (req.num_tokens - computed).min(*budget);
            let fresh = ((computed + new).div_ceil(b) as usize - local) as u32;
            if !self.pool.can_allocate(&chain[..local], fresh) {
                break;
            }
            self.pool.acquire_hits(&chain[..local], &mut req.blocks);
            self.pool.allocate(fresh, &mut req.blocks);
            req.registered = local;
            register_full(&mut self.pool, req, chain, computed + new, b);
            req.note_first_admission(local, external, b);
            if external > 0 {
                tier.touch(&chain[local..local + external]);
                self.started_fetches.push(StartedLoad {
                    request: r,
                    blocks: external,
                    synchronous: true,
                    remote: false,
                });
            }
            req.computed = computed;
            shape.add_prefill(new, computed);
            *budget -= new;
            self.batch.push((r, new));
            self.running.push(r);
            self.waiting.remove(j);
        }
    }

    /// The global-tier load (or PD pull) of `r` completed: its loaded blocks become computed,
    /// cached KV. At most `n − 1` tokens count as computed: a pull brings the whole context,
    /// and the last token is recomputed to sample the first output token (vLLM).
    pub fn fetch_done(&mut self, r: u32, reqs: &mut [LiveRequest], workload: &Workload, block_tokens: u64) {
        let req = &mut reqs[r as usize];
        req.fetching = false;
        req.computed = (req.blocks.len() as u64 * block_tokens).min(req.num_tokens - 1);
        req.expected_prefill = req.num_tokens - req.computed;
        register_full(
            &mut self.pool,
            req,
            workload.chain(r as usize),
            req.computed,
            block_tokens,
        );
    }

    /// Frees the blocks of the last waiting request holding any (a request whose load is
    /// still in flight keeps its blocks); false if none holds one.
    fn release_youngest_holder(&mut self, reqs: &mut [LiveRequest]) -> bool {
        let Some(&r) = self
            .waiting
            .iter()
            .rev()
            .find(|&&r| !reqs[r as usize].blocks.is_empty() && !reqs[r as usize].fetching)
        else {
            return false;
        };
        let req = &mut reqs[r as usize];
        self.pool.release(&req.blocks);
        req.blocks.clear();
        req.computed = 0;
        req.registered = 0;
        req.preemptions += 1;
        req.expected_prefill = req.num_tokens;
        self.preemptions += 1;
        true
    }

    fn preempt(&mut self, r: u32, reqs: &mut [LiveRequest]) {
        let req = &mut reqs[r as usize];
        self.pool.release(&req.blocks);
        req.blocks.clear();
        req.computed = 0;
        req.registered = 0;
        req.preemptions += 1;
        req.expected_prefill = req.num_tokens;
        self.preemptions += 1;
        self.waiting.push_front(r);
    }
}

/// Registers the request's blocks that are full once `tokens` tokens are computed and whose
/// content the trace names.
impl LiveRequest {
    /// Records, at the request's first admission, what it found: `local` blocks in the GPU
    /// cache and `external` blocks loaded from the tier (later re-admissions after a
    /// preemption do not change what the request was served with).
    fn note_first_admission(&mut self, local: usize, external: usize, b: u64) {
        if !self.admitted {
            self.admitted = true;
            self.local_hit_tokens = local as u64 * b;
            self.global_hit_tokens = external as u64 * b;
        }
    }
}

/// Registers the blocks of a finishing request's answer that its next turn re-sends token for
/// token, under the next turn's chain (module docs, "Answers re-sent").
fn keep_answer(pool: &mut BlockPool, req: &LiveRequest, r: u32, workload: &Workload, limits: EngineLimits) {
    let Some(next) = req.next_turn else { return };
    let own = workload.chain(r as usize);
    let next = workload.chain(next as usize);
    let p = own.len();
    if p == 0 || next.len() <= p || next[..p] != *own || req.registered < p {
        return;
    }
    let share = limits.answer_rerender_share;
    let rerendered = req.prompt + (share * f64::from(req.output)).floor() as u64;
    let full = ((rerendered.min(req.computed) / limits.block_tokens) as usize)
        .min(next.len())
        .min(req.blocks.len());
    if full > p {
        pool.register_chain(&req.blocks[p..full], &next[p..full], Some(own[p - 1]));
    }
}

fn register_full(pool: &mut BlockPool, req: &mut LiveRequest, chain: &[u64], tokens: u64, b: u64) {
    let full = ((tokens / b) as usize).min(chain.len());
    if req.registered < full {
        let from = req.registered;
        let parent = from.checked_sub(1).map(|p| chain[p]);
        pool.register_chain(&req.blocks[from..full], &chain[from..full], parent);
    }
    req.registered = req.registered.max(full);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::{ArrivalKind, RequestSpec, WorkloadBuilder};

    fn spec(input: u32, output: u32) -> RequestSpec {
        RequestSpec {
            trace_id: 0,
            input_tokens: input,
            output_tokens: output,
            time_s: 0.0,
            think_s: 0.0,
            prev: None,
            session: 0,
            root_session: 0,
            first_turn: None,
        }
    }

    /// A running request that needs one more block while a waiting request whose tier load
    /// finished holds the rest of the pool gets that request's blocks back, instead of
    /// preempting itself (which, with chunked recomputation, looped forever on long traces).
    #[test]
    fn a_running_request_reclaims_blocks_from_a_loaded_waiting_one() {
        let mut b = WorkloadBuilder::new("t", 16, ArrivalKind::OpenLoop);
        b.push(spec(64, 100), 0..4);
        b.push(spec(96, 1), 100..106);
        let w = b.build().unwrap();
        let limits = EngineLimits {
            block_tokens: 16,
            max_batched_tokens: 8192,
            max_num_seqs: 256,
            synchronous_loads: false,
            answer_rerender_share: 1.0,
        };
        let mut inst = Instance::new(10);
        let mut reqs = vec![LiveRequest::default(); 2];
        // r0 decodes: 80 tokens computed in 5 blocks, the 81st needs a sixth.
        reqs[0] = LiveRequest {
            prompt: 64,
            output: 100,
            num_tokens: 81,
            computed: 80,
            generated: 17,
            admitted: true,
            ..LiveRequest::default()
        };
        assert!(inst.pool.allocate(5, &mut reqs[0].blocks));
        inst.running.push(0);
        // r1 loaded 80 of its 96 tokens from the tier and waits for one more block.
        reqs[1] = LiveRequest {
            prompt: 96,
            output: 1,
            num_tokens: 96,
            computed: 80,
            admitted: true,
            ..LiveRequest::default()
        };
        assert!(inst.pool.allocate(5, &mut reqs[1].blocks));
        inst.waiting.push_back(1);
        assert_eq!(inst.pool.num_free(), 0);

        let mut tier = GlobalTier::new(0);
        let shape = inst.schedule(&mut reqs, &w, limits, &mut tier);
        assert!(!shape.is_empty());
        assert_eq!(inst.batch, vec![(0, 1)], "r0 keeps running");
        assert_eq!(reqs[0].blocks.len(), 6);
        assert!(
            reqs[1].blocks.is_empty() && reqs[1].computed == 0,
            "r1 gave its blocks back"
        );
        assert_eq!((reqs[0].preemptions, reqs[1].preemptions), (0, 1));

        // A request whose load is still in flight keeps its blocks.
        let mut inst = Instance::new(10);
        let mut reqs = vec![LiveRequest::default(); 2];
        reqs[0] = LiveRequest {
            prompt: 64,
            output: 100,
            num_tokens: 81,
            computed: 80,
            generated: 17,
            admitted: true,
            ..LiveRequest::default()
        };
        assert!(inst.pool.allocate(5, &mut reqs[0].blocks));
        inst.running.push(0);
        reqs[1] = LiveRequest {
            prompt: 96,
            output: 1,
            num_tokens: 96,
            fetching: true,
            admitted: true,
            ..LiveRequest::default()
        };
        assert!(inst.pool.allocate(5, &mut reqs[1].blocks));
        inst.waiting.push_back(1);
        inst.schedule(&mut reqs, &w, limits, &mut tier);
        assert_eq!(reqs[1].blocks.len(), 5, "an in-flight load is never released");
        assert_eq!(reqs[0].preemptions, 1, "r0 preempts itself instead");
    }

    /// A request about to sample its last token: 64 prompt tokens (chain `1000..1004`), 40
    /// output tokens, 102 of its 103 KV tokens computed in 7 blocks of a 7-block pool, and a next
    /// turn whose chain is `next`.
    fn finishing(next: &[u64], share: f64) -> (Instance, Vec<LiveRequest>) {
        let mut b = WorkloadBuilder::new("t", 16, ArrivalKind::ClosedLoop);
        b.push(spec(64, 40), 1000..1004);
        b.push(
            RequestSpec {
                prev: Some(0),
                ..spec(134, 1)
            },
            next.iter().copied(),
        );
        let w = b.build().unwrap();
        let limits = EngineLimits {
            block_tokens: 16,
            max_batched_tokens: 8192,
            max_num_seqs: 256,
            synchronous_loads: false,
            answer_rerender_share: share,
        };
        let mut inst = Instance::new(7);
        inst.pool.log = crate::cache_events::CacheLog::new(true);
        let mut reqs = vec![LiveRequest::default(); 2];
        reqs[0] = LiveRequest {
            prompt: 64,
            output: 40,
            num_tokens: 103,
            computed: 102,
            generated: 39,
            admitted: true,
            next_turn: Some(1),
            ..LiveRequest::default()
        };
        assert!(inst.pool.allocate(7, &mut reqs[0].blocks));
        register_full(&mut inst.pool, &mut reqs[0], w.chain(0), 102, 16);
        inst.pool.log.clear();
        inst.running.push(0);
        inst.batch.push((0, 1));
        let mut finished = false;
        inst.complete(&mut reqs, &w, limits, |ev| {
            finished |= ev == StepEvent::Finished { request: 0 }
        });
        assert!(finished);
        (inst, reqs)
    }

    /// The answer's full blocks stay cached under the next turn's hashes, in the blocks the
    /// request held (capacity unchanged), are logged as one stored run after the prompt, and
    /// are evicted before the prompt.
    #[test]
    fn a_finished_answer_stays_cached_under_the_next_turn_chain() {
        let next: Vec<u64> = (1000..1008).collect();
        let (mut inst, reqs) = finishing(&next, 1.0);
        assert!(reqs[0].blocks.is_empty());
        assert_eq!(inst.pool.num_free(), 7, "every block is free again");
        assert_eq!(inst.pool.cached_blocks(), 6, "4 prompt + 2 answer blocks");
        assert_eq!(inst.pool.longest_hit(&next, 8), 6);
        let log = &inst.pool.log;
        assert_eq!(log.changes().len(), 1);
        let change = &log.changes()[0];
        assert!(change.stored && change.parent == Some(1003));
        assert_eq!(log.blocks(change), &[1004, 1005]);
        // Freed tail first: the partial block, then the answer, then the prompt.
        let mut got = Vec::new();
        assert!(inst.pool.allocate(2, &mut got));
        assert_eq!(inst.pool.longest_hit(&next, 8), 5);
        assert!(inst.pool.allocate(2, &mut got));
        assert_eq!(inst.pool.longest_hit(&next, 8), 3);

        let (inst, _) = finishing(&next, 0.0);
        assert_eq!(inst.pool.cached_blocks(), 4, "share 0: the prompt only");
        assert!(inst.pool.log.is_empty());
    }

    /// Where the next chain does not extend the request's (a compacted history), nothing is
    /// credited beyond the prompt.
    #[test]
    fn an_answer_is_credited_only_where_the_next_chain_extends_the_request() {
        let (inst, _) = finishing(&[1000, 1001, 1002, 2003, 2004, 2005, 2006, 2007], 1.0);
        assert_eq!(inst.pool.cached_blocks(), 4);
        assert!(inst.pool.log.is_empty());
    }
}
