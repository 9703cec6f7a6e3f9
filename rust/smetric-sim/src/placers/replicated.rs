//! [`ReplicatedPlacer`]: R router replicas behind a load balancer, each a whole
//! `smetric_core::Router` of its own (a [`CorePlacer`]), with or without a bus that shares
//! their in-flight work.
//!
//! A fleet runs several router processes for fault tolerance and rate. Each builds its own
//! prefix index the same way (every replica subscribes to every engine's KV events, or inserts
//! its own routes) and scrapes every engine's metrics, but its load board counts only the
//! requests it routed itself: the queued prefill its peers just sent is invisible to it. This
//! placer models that, and `smetric serve --replica-bus`'s remedy:
//!
//! * **Balancing**: the load balancer in front sends request `k` of the run to replica
//!   `k mod R` (round robin, blind to sessions, like a plain HTTP balancer); the request's
//!   lifecycle calls go to the replica that placed it.
//! * **What every replica hears**: engine load reports, oracle cache changes and KV-event
//!   messages reach every replica (each replica subscribes to every engine).
//! * **Sync** (`ReplicaSync::Bus`): each load effect a replica makes — a decision's
//!   `Routed { prefill tokens, prompt tokens, work }` on its instance, then `Prefilled`, then
//!   `Done` — reaches every other replica's board `replica_sync_delay_s` later
//!   (`Router::apply_load_effect`, the lifecycle's own terms). The bus is a FIFO with one delay,
//!   so the effects of one request arrive in order; they are applied at the first placer call at
//!   or after their due time (the simulator calls the placer at every arrival, first token and
//!   finish, so the lateness past the delay is at most the gap between events).
//!
//! Invariants: with `R = 1` no wrapper is built (the run is the single router's, byte for
//! byte); each request's effects are published exactly once each and in lifecycle order, so a
//! peer's counters return to zero when its requests are done; replica `r`'s router draws its
//! tie-breaks from seed `seed + r` (independent processes do not share a random stream).
//!
//! Complexity: a decision costs one router's decision plus, with sync, O(R) effects queued; each
//! lifecycle call O(R) with sync, O(1) without; one map entry per request in flight.

use std::collections::VecDeque;

use hashbrown::HashMap;
use smetric_core::policy::prefill_work;
use smetric_core::{InstanceId, LoadEffect};

use super::core::CorePlacer;
use crate::cache_events::CacheLog;
use crate::config::ReplicaSync;
use crate::error::Result;
use crate::placement::{EngineLoadReport, PlaceRequest, Placement, Placer};

/// A request in flight: the replica that placed it and what its effects carry.
#[derive(Clone, Copy, Debug)]
struct Placed {
    replica: u32,
    instance: u32,
    prefill_tokens: u64,
    prompt_tokens: u64,
    work: u64,
}

/// An effect on its way over the bus.
#[derive(Clone, Copy, Debug)]
struct InTransit {
    due: f64,
    from: u32,
    instance: u32,
    effect: LoadEffect,
}

/// R routers behind a round-robin balancer (see the module docs).
#[derive(Debug)]
pub struct ReplicatedPlacer {
    replicas: Vec<CorePlacer>,
    sync: ReplicaSync,
    delay_s: f64,
    l_eq_tokens: f64,
    next: u32,
    placed: HashMap<u64, Placed>,
    bus: VecDeque<InTransit>,
    /// Effects delivered to peers (one count per effect and receiving replica).
    delivered: u64,
}

impl ReplicatedPlacer {
    /// Replicas `replicas` (at least two), their effects shared as `sync` says, `delay_s` late.
    pub fn new(replicas: Vec<CorePlacer>, sync: ReplicaSync, delay_s: f64) -> Self {
        let l_eq_tokens = replicas.first().map_or(smetric_core::L_EQ_QWEN3_CODER_30B_A3B, |p| {
            p.router().config().smetric_l_eq_tokens
        });
        Self {
            replicas,
            sync,
            delay_s,
            l_eq_tokens,
            next: 0,
            placed: HashMap::new(),
            bus: VecDeque::new(),
            delivered: 0,
        }
    }

    /// The replicas (for their routers' stats).
    pub fn replicas(&self) -> &[CorePlacer] {
        &self.replicas
    }

    /// Delivers every effect due by `now` to every replica but its sender.
    fn deliver(&mut self, now: f64) {
        while self.bus.front().is_some_and(|m| m.due <= now) {
            let Some(m) = self.bus.pop_front() else { break };
            for (r, replica) in self.replicas.iter().enumerate() {
                if r as u32 != m.from && replica.router().apply_load_effect(InstanceId(m.instance), m.effect) {
                    self.delivered += 1;
                }
            }
        }
    }

    /// Publishes `effect` of a request `from` placed on `instance`.
    fn publish(&mut self, now: f64, from: u32, instance: u32, effect: LoadEffect) {
        if self.sync == ReplicaSync::Bus {
            self.bus.push_back(InTransit {
                due: now + self.delay_s,
                from,
                instance,
                effect,
            });
        }
    }
}

impl Placer for ReplicatedPlacer {
    fn policy(&self) -> String {
        self.replicas.first().map(Placer::policy).unwrap_or_default()
    }

    fn place(&mut self, request: &PlaceRequest<'_>) -> Result<Placement> {
        self.deliver(request.now);
        let r = self.next;
        self.next = (self.next + 1) % self.replicas.len() as u32;
        let placement = self.replicas[r as usize].place(request)?;
        let prompt_tokens = u64::from(request.prompt_tokens);
        let placed = Placed {
            replica: r,
            instance: placement.instance,
            prefill_tokens: placement.prefill_tokens,
            prompt_tokens,
            // What the deciding router charged its own board (`Router::route`).
            work: prefill_work(placement.prefill_tokens, prompt_tokens, self.l_eq_tokens),
        };
        self.placed.insert(request.request_id, placed);
        self.publish(
            request.now,
            r,
            placed.instance,
            LoadEffect::Routed {
                prefill_tokens: placed.prefill_tokens,
                prompt_tokens,
                work: placed.work,
            },
        );
        Ok(placement)
    }

    fn on_prefilled(&mut self, request_id: u64, now: f64) {
        self.deliver(now);
        if let Some(p) = self.placed.get(&request_id).copied() {
            self.replicas[p.replica as usize].on_prefilled(request_id, now);
            self.publish(
                now,
                p.replica,
                p.instance,
                LoadEffect::Prefilled {
                    prefill_tokens: p.prefill_tokens,
                    work: p.work,
                },
            );
        }
    }

    fn on_finished(&mut self, request_id: u64, output_tokens: u32, now: f64) {
        self.deliver(now);
        if let Some(p) = self.placed.remove(&request_id) {
            self.replicas[p.replica as usize].on_finished(request_id, output_tokens, now);
            self.publish(
                now,
                p.replica,
                p.instance,
                LoadEffect::Done {
                    prompt_tokens: p.prompt_tokens,
                },
            );
        }
    }

    fn on_load(&mut self, instance: u32, snapshot: EngineLoadReport, now: f64) {
        self.deliver(now);
        for replica in &mut self.replicas {
            replica.on_load(instance, snapshot, now);
        }
    }

    fn on_cache_changes(&mut self, instance: u32, log: &CacheLog, now: f64) {
        for replica in &mut self.replicas {
            replica.on_cache_changes(instance, log, now);
        }
    }

    fn on_kv_event_message(&mut self, instance: u32, frames: &[Vec<u8>], now: f64) {
        for replica in &mut self.replicas {
            replica.on_kv_event_message(instance, frames, now);
        }
    }

    fn feed_counters(&self) -> Vec<(String, u64)> {
        // Every replica is fed the same messages: the first one's counters stand for all.
        let mut out = self.replicas.first().map(Placer::feed_counters).unwrap_or_default();
        out.push(("replicas".to_owned(), self.replicas.len() as u64));
        out.push(("replica_effects_delivered".to_owned(), self.delivered));
        out
    }
}

#[cfg(test)]
mod tests {
    use smetric_core::{PolicyKind, RouterConfig};

    use super::*;

    fn replicas(n: u32) -> Vec<CorePlacer> {
        (0..n)
            .map(|r| CorePlacer::new(4, PolicyKind::LeastLoad, 16, u64::from(r), RouterConfig::default()).unwrap())
            .collect()
    }

    fn request(id: u64, chain: &[u64], now: f64) -> PlaceRequest<'_> {
        PlaceRequest {
            request_id: id,
            chain,
            prompt_tokens: 16 * chain.len() as u32 + 1,
            turn: Some(1),
            now,
            previous_instance: None,
            session_key: None,
        }
    }

    fn queued(p: &ReplicatedPlacer, replica: usize) -> Vec<u64> {
        let router = p.replicas()[replica].router();
        router
            .instances()
            .iter()
            .map(|name| router.load(name).unwrap().queued)
            .collect()
    }

    #[test]
    fn a_peer_sees_the_requests_routed_elsewhere_only_with_the_bus_and_only_after_the_delay() {
        for sync in [ReplicaSync::Off, ReplicaSync::Bus] {
            let mut p = ReplicatedPlacer::new(replicas(2), sync, 0.01);
            let chain: Vec<u64> = (1..=8).collect();
            // Request 0 goes to replica 0 (round robin).
            let placed = p.place(&request(0, &chain, 0.0)).unwrap();
            let prefill = placed.prefill_tokens;
            assert!(prefill > 0);
            assert_eq!(queued(&p, 0)[placed.instance as usize], prefill);
            assert_eq!(queued(&p, 1).iter().sum::<u64>(), 0, "not before the delay");
            // A load report 20 ms later delivers what is due.
            p.on_load(
                3,
                EngineLoadReport {
                    running: 0,
                    waiting: 0,
                    kv_usage: 0.0,
                },
                0.02,
            );
            let seen = queued(&p, 1)[placed.instance as usize];
            assert_eq!(seen, if sync == ReplicaSync::Bus { prefill } else { 0 }, "{sync:?}");
            // Its first token and its end, then the peer's board is empty again.
            p.on_prefilled(0, 0.5);
            p.on_finished(0, 10, 1.0);
            p.on_load(
                3,
                EngineLoadReport {
                    running: 0,
                    waiting: 0,
                    kv_usage: 0.0,
                },
                2.0,
            );
            for r in 0..2 {
                let router = p.replicas()[r].router();
                for name in router.instances() {
                    let l = router.load(&name).unwrap();
                    assert_eq!(
                        (l.bs, l.queued, l.queued_work, l.active),
                        (0, 0, 0, 0),
                        "replica {r}, {sync:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_blind_peer_piles_onto_the_instance_its_peer_just_loaded_and_the_bus_spreads_them() {
        // least_load on replica 1 sees replica 0's request only with the bus: blind, it picks the
        // same idle instance (slot order breaks no tie here: every instance scores alike, so the
        // tie is random; over many pairs a blind peer collides at chance, a synced one never).
        let chain: Vec<u64> = (1..=8).collect();
        for sync in [ReplicaSync::Off, ReplicaSync::Bus] {
            let mut collisions = 0;
            for k in 0..40u64 {
                let mut p = ReplicatedPlacer::new(
                    (0..2)
                        .map(|r| {
                            CorePlacer::new(4, PolicyKind::LeastLoad, 16, k * 2 + r, RouterConfig::default()).unwrap()
                        })
                        .collect(),
                    sync,
                    0.0,
                );
                let a = p.place(&request(0, &chain, 0.0)).unwrap().instance;
                let b = p.place(&request(1, &chain, 0.001)).unwrap().instance;
                collisions += u32::from(a == b);
            }
            match sync {
                ReplicaSync::Off => assert!(collisions >= 3, "blind peers collide at chance (1/4): {collisions}"),
                ReplicaSync::Bus => assert_eq!(collisions, 0, "a synced peer sees the load"),
            }
        }
    }
}
