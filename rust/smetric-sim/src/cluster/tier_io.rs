//! The event loop's side of the global tier: loads and write-throughs submitted to the node
//! links (`transfer`), what their ends do, and what a connector adds to a step.
//!
//! * A load's end: an asynchronous one releases its request (`FetchDone`, `α` later); a
//!   synchronous one (LMCache) counts down its step's loads, and the last fixes the step's
//!   end — `load end + compute`, or `max(load end, start + compute)` layer-wise.
//! * A write-through starts when a step completes, for the prompt blocks the step filled and
//!   the store lacks; its end puts them in the store (visible from then on) and logs the
//!   change for the KV-event feed.
//! * A step with the tier on costs the connector's overhead, plus, with LMCache, the
//!   GPU → host copy of the blocks it fills (`wait_for_save`).
//!
//! Complexity: O(loads + batch blocks) per step; O(1) per transfer plus the link's reshare.

use super::{Kind, Sim};
use crate::cache_events::Medium;
use crate::transfer::{Direction, Transfer, Wakeup};

/// What a finished transfer does.
#[derive(Clone, Copy, Debug)]
pub(super) enum Payload {
    /// The tier load of `request`; a synchronous one ends its instance's step.
    Load { request: u32, synchronous: bool },
    /// The write of blocks `start..end` of `request`'s chain.
    Store { request: u32, start: u32, end: u32 },
}

/// A step that waits for synchronous loads before (or, layer-wise, while) it computes.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct StalledStep {
    loads_left: u32,
    compute_s: f64,
    started_s: f64,
}

impl StalledStep {
    /// A step of `compute_s` seconds started at `started_s`, waiting for `loads` loads.
    pub(super) fn new(loads: u32, compute_s: f64, started_s: f64) -> Self {
        Self {
            loads_left: loads,
            compute_s,
            started_s,
        }
    }
}

impl Sim<'_> {
    /// Submits the loads instance `i`'s scheduler just started; returns how many the step
    /// must wait for.
    pub(super) fn start_loads(&mut self, i: usize) -> u32 {
        let loads = std::mem::take(&mut self.instances[i].started_fetches);
        let tier = &self.config.global_tier;
        let rank_bytes_per_block = self.limits.block_tokens as f64 * self.config.profile.kv_bytes_per_token_rank;
        let mut synchronous = 0;
        for load in &loads {
            if load.remote {
                self.pd_submit_pull(i, load.request, load.blocks);
                continue;
            }
            let bytes = load.blocks as f64 * rank_bytes_per_block;
            self.counters.tier_fetches += 1;
            self.counters.tier_fetch_bytes += bytes;
            synchronous += u32::from(load.synchronous);
            let transfer = Transfer {
                instance: i as u32,
                bytes,
                cap: tier.load_rank_bytes_per_s(),
                weight: f64::from(self.config.profile.tp),
                payload: Payload::Load {
                    request: load.request,
                    synchronous: load.synchronous,
                },
            };
            let wakeup = self.transfers.submit(self.now, Direction::In, transfer);
            self.wake_at(wakeup);
        }
        self.instances[i].started_fetches = loads;
        synchronous
    }

    /// What a connector adds to instance `i`'s scheduled step, seconds: its per-step overhead
    /// and, with LMCache, the GPU → host copy of the blocks the step fills.
    pub(super) fn connector_step_cost(&self, i: usize) -> f64 {
        let tier = &self.config.global_tier;
        if !tier.enabled {
            return 0.0;
        }
        let mut cost = tier.connector_step_overhead_s;
        if tier.path.store_copy_in_step() && self.tier(i).enabled() {
            let rank_bytes_per_block = self.limits.block_tokens as f64 * self.config.profile.kv_bytes_per_token_rank;
            cost += self.blocks_filled_by_step(i) as f64 * rank_bytes_per_block / tier.pcie_bytes_per_s;
        }
        cost
    }

    /// Prompt blocks that become full in instance `i`'s scheduled step and that the store
    /// lacks (what LMCache copies to the host at the end of it).
    fn blocks_filled_by_step(&self, i: usize) -> usize {
        let b = self.limits.block_tokens;
        self.instances[i]
            .batch
            .iter()
            .map(|&(r, new)| {
                let req = &self.reqs[r as usize];
                let chain = self.workload.chain(r as usize);
                let full = |tokens: u64| ((tokens / b) as usize).min(chain.len());
                let filled = &chain[full(req.computed)..full(req.computed + new)];
                filled.iter().filter(|&&h| !self.tier(i).contains(h)).count()
            })
            .sum()
    }

    pub(super) fn wake_at(&mut self, wakeup: Option<Wakeup>) {
        if let Some((time, link, version)) = wakeup {
            self.push(time, Kind::Transfer { link, version });
        }
    }

    /// A node link's earliest transfers ended.
    pub(super) fn transfer_done(&mut self, link: u32, version: u64) {
        let mut done = std::mem::take(&mut self.scratch_done);
        let next = self.transfers.wake(self.now, link, version, &mut done);
        self.wake_at(next);
        let latency = self.config.global_tier.fetch_latency_s;
        let mut stored = false;
        for t in done.drain(..) {
            let i = t.instance as usize;
            match t.payload {
                Payload::Load {
                    request,
                    synchronous: false,
                } => self.push(self.now + latency, Kind::FetchDone(request)),
                Payload::Load { synchronous: true, .. } => {
                    let step = &mut self.stalled[i];
                    step.loads_left -= 1;
                    if step.loads_left == 0 {
                        let loaded = self.now + latency;
                        let end = if self.config.global_tier.layerwise {
                            loaded.max(step.started_s + step.compute_s)
                        } else {
                            loaded + step.compute_s
                        };
                        self.push(end, Kind::StepDone(i as u32));
                    }
                }
                Payload::Store { request, start, end } => {
                    self.store_in_tier(t.instance, request, start as usize, end as usize);
                    stored = true;
                }
            }
        }
        self.scratch_done = done;
        // What the writes logged (entries for the writer, evictions for their owners): a busy
        // engine publishes it with its step; an idle one has no step to wait for, and the last
        // writes of a run end after every step.
        if stored && self.publisher.is_some() {
            for j in 0..self.config.instances {
                if !self.instances[j as usize].busy {
                    self.publish(j);
                }
            }
        }
    }

    /// Starts writing the blocks of `request` that tokens `[from, to)` filled, from instance
    /// `i` to the global tier; they become visible when the write ends. Blocks the store holds
    /// already are not sent again (LMCache looks keys up before it stores; vLLM's Mooncake
    /// connector calls `batch_is_exist`), only refreshed when the write ends.
    pub(super) fn write_through(&mut self, i: u32, request: u32, from: u64, to: u64) {
        let b = self.limits.block_tokens;
        let chain = self.workload.chain(request as usize);
        let end = ((to / b) as usize).min(chain.len());
        let start = ((from / b) as usize).min(end);
        let missing = chain[start..end]
            .iter()
            .filter(|&&h| !self.tier(i as usize).contains(h))
            .count();
        if missing == 0 {
            if start < end {
                self.store_in_tier(i, request, start, end);
            }
            return;
        }
        let tier = &self.config.global_tier;
        let transfer = Transfer {
            instance: i,
            bytes: missing as f64 * b as f64 * self.config.profile.kv_bytes_per_token_rank,
            cap: tier.store_rank_bytes_per_s(),
            weight: f64::from(self.config.profile.tp),
            payload: Payload::Store {
                request,
                start: start as u32,
                end: end as u32,
            },
        };
        let wakeup = self.transfers.submit(self.now, Direction::Out, transfer);
        self.wake_at(wakeup);
    }

    /// Puts blocks `start..end` of `request`'s chain, written by instance `i`, in the global
    /// tier, logging what entered and what was dropped (see `cache_events`).
    fn store_in_tier(&mut self, i: u32, request: u32, start: usize, end: usize) {
        let chain = self.workload.chain(request as usize);
        let stored = &chain[start..end];
        let k = self.tier_index(i as usize);
        self.tiers[k].store(stored, i);
        if !self.tiers[k].changes.enabled {
            return;
        }
        let changes = &self.tiers[k].changes;
        for &(hash, owner) in &changes.evicted {
            if let Some(inst) = self.instances.get_mut(owner as usize) {
                inst.pool.log.removed(Medium::Cpu, hash);
            }
        }
        let log = &mut self.instances[i as usize].pool.log;
        let mut k = 0;
        while k < changes.inserted.len() {
            let first = changes.inserted[k];
            let mut last = first;
            while k + 1 < changes.inserted.len() && changes.inserted[k + 1] == last + 1 {
                k += 1;
                last += 1;
            }
            let at = start + first;
            let parent = at.checked_sub(1).map(|p| chain[p]);
            log.stored(Medium::Cpu, parent, &stored[first..=last]);
            k += 1;
        }
    }
}
