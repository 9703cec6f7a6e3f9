//! KV transfers between the engines and the global tier over shared links (perf-model §6.4).
//!
//! Topology: instances are grouped in nodes of `gpus_per_node / tp` instances. Each direction
//! is a separate resource, because PCIe and RoCE links are full duplex: loads flow *in*
//! (store → GPU), stores flow *out* (GPU → store).
//! * **Per rank, one transfer at a time per direction (FIFO).** A rank's loads are serial in
//!   every connector modelled: LMCache retrieves the requests of a step one after another,
//!   vLLM's Mooncake-store connector has one receive thread by default, the offloading
//!   connector copies on one stream. The others wait behind it in arrival order.
//! * **Per node, the active transfers share the node link fairly** (max-min fair share, a
//!   water-fill): a transfer of an instance with `weight` ranks (its TP degree) moves its
//!   per-rank bytes on each rank at `rate`, using `weight · rate` of the link, and no rank
//!   exceeds its `cap` (the connector's per-rank rate, at most PCIe). The link is the NIC for
//!   a remote store and unbounded for host DRAM.
//!
//! Algorithm: a node link keeps its active transfers with their bytes left and current rate.
//! When a transfer starts or ends on a node, every active transfer there is advanced to now
//! (`left -= rate · dt`), the rates are recomputed, the link's `version` is bumped and the
//! earliest finish is returned for the caller to schedule; an event whose version is stale is
//! ignored. Nothing is recomputed between starts and ends, and nothing on other nodes.
//!
//! Invariants: a link's `active` holds at most one transfer per instance; `Σ weight · rate ≤
//! capacity` and `rate ≤ cap`; a queued transfer's instance has an active one.
//! Complexity: O(a log a) per start or end, `a` the active transfers on that node (at most its
//! instances); O(1) to queue behind a busy rank.

use std::collections::VecDeque;

/// Which way a transfer flows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Direction {
    /// Store → GPU: a load.
    In = 0,
    /// GPU → store: a write-through.
    Out = 1,
}

/// A transfer to run: bytes per rank, per-rank cap, ranks, and what to do when it ends.
#[derive(Clone, Debug)]
pub(crate) struct Transfer<P> {
    pub instance: u32,
    pub bytes: f64,
    pub cap: f64,
    pub weight: f64,
    pub payload: P,
}

#[derive(Clone, Debug)]
struct Active<P> {
    transfer: Transfer<P>,
    rate: f64,
}

/// One node's link in one direction.
#[derive(Debug)]
struct NodeLink<P> {
    capacity: f64,
    active: Vec<Active<P>>,
    updated_s: f64,
    version: u64,
}

/// The direction link `link` carries.
pub(crate) fn link_direction(link: u32) -> Direction {
    if link.is_multiple_of(2) {
        Direction::In
    } else {
        Direction::Out
    }
}

/// When the caller must look at a link again: `(time, link, version)`.
pub(crate) type Wakeup = (f64, u32, u64);

/// Every node link and every rank queue of the cluster.
#[derive(Debug)]
pub(crate) struct Transfers<P> {
    instances_per_node: u32,
    /// `node * 2 + direction`.
    links: Vec<NodeLink<P>>,
    /// `instance * 2 + direction`: transfers waiting behind the rank's active one.
    queues: Vec<VecDeque<Transfer<P>>>,
    busy: Vec<bool>,
    scratch: Vec<usize>,
}

impl<P> Transfers<P> {
    /// `instances` instances, `instances_per_node` per node, each node link `node_bytes_per_s`
    /// per direction (`f64::INFINITY`: unbounded).
    pub fn new(instances: u32, instances_per_node: u32, node_bytes_per_s: f64) -> Self {
        let per_node = instances_per_node.max(1);
        let nodes = instances.div_ceil(per_node).max(1);
        Self {
            instances_per_node: per_node,
            links: (0..2 * nodes)
                .map(|_| NodeLink {
                    capacity: node_bytes_per_s,
                    active: Vec::new(),
                    updated_s: 0.0,
                    version: 0,
                })
                .collect(),
            queues: (0..2 * instances).map(|_| VecDeque::new()).collect(),
            busy: vec![false; 2 * instances as usize],
            scratch: Vec::new(),
        }
    }

    /// The link index of `instance`'s node in `direction`.
    fn link_of(&self, instance: u32, direction: Direction) -> u32 {
        (instance / self.instances_per_node) * 2 + direction as u32
    }

    /// Starts `transfer` at `now`, or queues it behind its rank's active one. Returns the wakeup
    /// to schedule when the node's rates changed.
    pub fn submit(&mut self, now: f64, direction: Direction, transfer: Transfer<P>) -> Option<Wakeup> {
        let rank = transfer.instance as usize * 2 + direction as usize;
        if self.busy[rank] {
            self.queues[rank].push_back(transfer);
            return None;
        }
        self.busy[rank] = true;
        let l = self.link_of(transfer.instance, direction);
        let link = &mut self.links[l as usize];
        link.advance(now);
        link.active.push(Active { transfer, rate: 0.0 });
        Some(self.reshare(l))
    }

    /// Handles the wakeup `(link, version)` at `now`: the transfers that are done are appended
    /// to `done`, the next ones of their ranks start. Returns the next wakeup (none if the
    /// version is stale or the link is idle).
    pub fn wake(&mut self, now: f64, l: u32, version: u64, done: &mut Vec<Transfer<P>>) -> Option<Wakeup> {
        let link = &mut self.links[l as usize];
        if link.version != version {
            return None;
        }
        link.advance(now);
        let direction = link_direction(l) as usize;
        let mut k = 0;
        while k < link.active.len() {
            let a = &link.active[k];
            // Within a nanosecond of its end: rounding of `left -= rate · dt`.
            if a.transfer.bytes <= a.rate * 1e-9 {
                let finished = link.active.swap_remove(k).transfer;
                let rank = finished.instance as usize * 2 + direction;
                match self.queues[rank].pop_front() {
                    Some(next) => link.active.push(Active {
                        transfer: next,
                        rate: 0.0,
                    }),
                    None => self.busy[rank] = false,
                }
                done.push(finished);
            } else {
                k += 1;
            }
        }
        if link.active.is_empty() {
            link.version += 1;
            return None;
        }
        Some(self.reshare(l))
    }

    /// Max-min fair rates on link `l` (a water-fill over the per-rank caps), a new version,
    /// and the earliest finish.
    fn reshare(&mut self, l: u32) -> Wakeup {
        let link = &mut self.links[l as usize];
        let order = &mut self.scratch;
        order.clear();
        order.extend(0..link.active.len());
        order.sort_by(|&a, &b| link.active[a].transfer.cap.total_cmp(&link.active[b].transfer.cap));
        let mut left = link.capacity;
        let mut weight: f64 = link.active.iter().map(|a| a.transfer.weight).sum();
        for &k in order.iter() {
            let a = &mut link.active[k];
            let share = if left.is_infinite() {
                f64::INFINITY
            } else {
                left / weight
            };
            a.rate = a.transfer.cap.min(share);
            left = (left - a.rate * a.transfer.weight).max(0.0);
            weight -= a.transfer.weight;
        }
        link.version += 1;
        let next = link
            .active
            .iter()
            .map(|a| link.updated_s + a.transfer.bytes / a.rate)
            .fold(f64::INFINITY, f64::min);
        (next, l, link.version)
    }

    /// Current per-rank rate of `instance`'s active transfer in `direction`, bytes/s.
    #[cfg(test)]
    fn rate_of(&self, instance: u32, direction: Direction) -> Option<f64> {
        let link = &self.links[self.link_of(instance, direction) as usize];
        link.active
            .iter()
            .find(|a| a.transfer.instance == instance)
            .map(|a| a.rate)
    }
}

impl<P> NodeLink<P> {
    fn advance(&mut self, now: f64) {
        let dt = now - self.updated_s;
        if dt > 0.0 {
            for a in &mut self.active {
                a.transfer.bytes = (a.transfer.bytes - a.rate * dt).max(0.0);
            }
        }
        self.updated_s = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn transfer(instance: u32, bytes: f64, cap: f64) -> Transfer<u32> {
        Transfer {
            instance,
            bytes,
            cap,
            weight: 1.0,
            payload: instance,
        }
    }

    /// Drives every wakeup in time order; returns `(finish time, payload)`.
    fn drain(t: &mut Transfers<u32>, mut wakeups: Vec<Wakeup>) -> Vec<(f64, u32)> {
        let mut finished = Vec::new();
        let mut done = Vec::new();
        while let Some(k) = (0..wakeups.len()).min_by(|&a, &b| wakeups[a].0.total_cmp(&wakeups[b].0)) {
            let (time, l, v) = wakeups.swap_remove(k);
            if let Some(next) = t.wake(time, l, v, &mut done) {
                wakeups.push(next);
            }
            finished.extend(done.drain(..).map(|d| (time, d.payload)));
        }
        finished
    }

    #[test]
    fn one_rank_runs_at_its_cap() {
        let mut t = Transfers::new(8, 8, 87e9);
        let w = t.submit(0.0, Direction::In, transfer(3, 54e9, 54e9)).unwrap();
        assert!((w.0 - 1.0).abs() < 1e-12);
        assert_eq!(t.rate_of(3, Direction::In), Some(54e9));
    }

    #[test]
    fn a_node_shares_its_link_fairly_and_nodes_are_independent() {
        let mut t = Transfers::new(16, 8, 80e9);
        let mut wakeups = Vec::new();
        for i in 0..8 {
            wakeups.extend(t.submit(0.0, Direction::In, transfer(i, 10e9, 54e9)));
        }
        // Instance 8 is on the second node: alone there.
        wakeups.extend(t.submit(0.0, Direction::In, transfer(8, 10e9, 54e9)));
        for i in 0..8 {
            assert!((t.rate_of(i, Direction::In).unwrap() - 10e9).abs() < 1.0);
        }
        assert_eq!(t.rate_of(8, Direction::In), Some(54e9));
        // Stores go the other way and do not slow the loads.
        let mut store = transfer(0, 1e9, 8e9);
        store.payload = 100;
        wakeups.extend(t.submit(0.0, Direction::Out, store));
        assert!((t.rate_of(0, Direction::In).unwrap() - 10e9).abs() < 1.0);
        let finished = drain(&mut t, wakeups);
        let at = |p: u32| finished.iter().find(|&&(_, q)| q == p).unwrap().0;
        assert!((at(100) - 0.125).abs() < 1e-9);
        assert!((at(8) - 10.0 / 54.0).abs() < 1e-9);
        for i in 0..8 {
            assert!((at(i) - 1.0).abs() < 1e-9, "{finished:?}");
        }
    }

    #[test]
    fn a_finished_transfer_frees_its_share_and_a_busy_rank_queues() {
        let mut t = Transfers::new(2, 8, 20e9);
        let mut wakeups = Vec::new();
        wakeups.extend(t.submit(0.0, Direction::In, transfer(0, 5e9, 54e9)));
        wakeups.extend(t.submit(0.0, Direction::In, transfer(1, 15e9, 54e9)));
        // Queued behind instance 0's first transfer.
        assert!(t.submit(0.0, Direction::In, transfer(0, 5e9, 54e9)).is_none());
        let finished = drain(&mut t, wakeups);
        // 0.5 s at 10 GB/s each; then instance 0's second and instance 1 (10 GB left) share:
        // instance 0 ends at 1.0 s, instance 1 then runs alone at 20 GB/s for its last 5 GB.
        let times: Vec<f64> = finished.iter().map(|&(time, _)| time).collect();
        assert_eq!(finished.iter().map(|&(_, p)| p).collect::<Vec<_>>(), [0, 0, 1]);
        for (got, want) in times.iter().zip([0.5, 1.0, 1.25]) {
            assert!((got - want).abs() < 1e-9, "{times:?}");
        }
    }

    #[test]
    fn unbounded_links_give_every_rank_its_cap() {
        let mut t = Transfers::new(8, 8, f64::INFINITY);
        for i in 0..8 {
            t.submit(0.0, Direction::In, transfer(i, 1e9, 40e9));
        }
        assert_eq!(t.rate_of(7, Direction::In), Some(40e9));
    }
}
