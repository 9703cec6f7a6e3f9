//! The load board: per-instance counters that the policies read without taking a lock.
//!
//! Every counter is an atomic; a decision increments, the lifecycle calls decrement, and
//! decrements saturate at zero, so an out-of-order or repeated call can never drive a
//! counter negative. Engine snapshots (`update_load`) are stored beside the router's own
//! counts and fused at read time under a staleness bound (docs §3).
//!
//! Besides tokens, the board keeps the queued prefill *work* (the v2 rule's attention-aware
//! cold-token equivalents, rounded up to whole units at routing), the instance's learned
//! drain rate ([`DrainRate`]) and tier fetch cost ([`FetchCost`]), which the lifecycle feeds,
//! and, for the `preble` policy only, the requests routed to it within a sliding window
//! ([`RecentLoad`]), which decisions feed.
//!
//! Complexity: every operation is O(1); a read of one instance is eight relaxed loads.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::decode_contract::DecodePace;
use crate::drain_rate::DrainRate;
use crate::fetch_cost::FetchCost;
use crate::recent_load::RecentLoad;

/// "No engine snapshot yet".
const NEVER: u64 = u64::MAX;

fn saturating_sub(counter: &AtomicU64, amount: u64) {
    // fetch_update retries only under contention; the closure never fails.
    let _ = counter.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| Some(v.saturating_sub(amount)));
}

/// Counters of one instance.
#[derive(Debug)]
pub struct InstanceLoad {
    /// Decisions committed here ([`InstanceLoad::commit_routed`]): a decision reads it before
    /// the counters and commits only if it has not moved since. First, so that it shares the
    /// counters' cache line.
    version: AtomicU64,
    bs: AtomicU64,
    waiting: AtomicU64,
    queued: AtomicU64,
    queued_work: AtomicU64,
    active: AtomicU64,
    running_e: AtomicU64,
    waiting_e: AtomicU64,
    kv_usage_bits: AtomicU64,
    stamp_ms: AtomicU64,
    /// Peer router replicas' in-flight work here (their own boards' counters, summed), set
    /// whole by [`InstanceLoad::set_peers`] and added at read time by [`InstanceLoad::effective`].
    peer_bs: AtomicU64,
    peer_waiting: AtomicU64,
    peer_queued: AtomicU64,
    peer_queued_work: AtomicU64,
    peer_active: AtomicU64,
    /// The instance's learned prefill drain rate.
    pub drain: DrainRate,
    /// The instance's learned cost of loading from the shared store (`smetric_learn_fetch_cost`).
    pub fetch: FetchCost,
    /// The instance's observed decode pace (`smetric` v2's decode mask only).
    pub decode_pace: DecodePace,
    /// The requests routed here within the last `preble_window_s` (`preble` only).
    pub recent: RecentLoad,
}

impl Default for InstanceLoad {
    fn default() -> Self {
        Self {
            version: AtomicU64::new(0),
            bs: AtomicU64::new(0),
            waiting: AtomicU64::new(0),
            queued: AtomicU64::new(0),
            queued_work: AtomicU64::new(0),
            active: AtomicU64::new(0),
            running_e: AtomicU64::new(0),
            waiting_e: AtomicU64::new(0),
            kv_usage_bits: AtomicU64::new(0f64.to_bits()),
            stamp_ms: AtomicU64::new(NEVER),
            peer_bs: AtomicU64::new(0),
            peer_waiting: AtomicU64::new(0),
            peer_queued: AtomicU64::new(0),
            peer_queued_work: AtomicU64::new(0),
            peer_active: AtomicU64::new(0),
            drain: DrainRate::default(),
            fetch: FetchCost::default(),
            decode_pace: DecodePace::default(),
            recent: RecentLoad::default(),
        }
    }
}

/// A plain copy of an instance's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LoadSnapshot {
    /// Requests routed and not finished (the batch size).
    pub bs: u64,
    /// Requests routed and not yet prefilled.
    pub waiting: u64,
    /// Uncached prompt tokens routed and not yet prefilled.
    pub queued: u64,
    /// Prefill work (cold-token equivalents, `smetric` v2's `q`) routed and not yet prefilled.
    pub queued_work: u64,
    /// Prompt tokens of the requests in flight.
    pub active: u64,
    /// The learned prefill drain rate in work units per second, once enough samples came in.
    pub drain_rate: Option<f64>,
    /// The learned cost of loading a token from the shared store, in work units, once enough
    /// samples came in (only learned with `smetric_learn_fetch_cost`).
    pub fetch_cost: Option<f64>,
    /// Engine-reported running requests (last snapshot).
    pub running_e: u64,
    /// Engine-reported waiting requests (last snapshot).
    pub waiting_e: u64,
    /// Engine-reported KV cache usage in [0, 1] (last snapshot).
    pub kv_usage: f64,
    /// Time of the last engine snapshot in ms, if any.
    pub stamp_ms: Option<u64>,
}

/// Peer router replicas' in-flight work on one instance: the sum of their own boards'
/// counters, as their last snapshots over the replica bus said (`smetric serve --replica-bus`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PeerLoad {
    /// Their requests routed here and not finished.
    pub bs: u64,
    /// Of those, not yet prefilled.
    pub waiting: u64,
    /// Their uncached prompt tokens queued here for prefill.
    pub queued: u64,
    /// Their prefill work queued here.
    pub queued_work: u64,
    /// Prompt tokens of their requests in flight here.
    pub active: u64,
}

/// What the policies see: the router's counts fused with a fresh engine snapshot.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EffectiveLoad {
    /// Batch size: `max(bs, running_e + waiting_e)` when the snapshot is fresh.
    pub bs: u64,
    /// Waiting: `max(waiting, waiting_e)` when the snapshot is fresh.
    pub waiting: u64,
    /// Queued uncached prefill tokens (router's own).
    pub queued: u64,
    /// Queued prefill work (router's own).
    pub queued_work: u64,
    /// Active tokens (router's own).
    pub active: u64,
}

/// One step of a request's life on an instance's load board, in the lifecycle's own terms:
/// what a peer router replica reports so that this router's board counts the peer's requests
/// too (the load effects a decision and its lifecycle calls make, `Router::apply_load_effect`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadEffect {
    /// A request was routed here: as [`InstanceLoad::on_routed`].
    Routed {
        /// Uncached prompt tokens it queued for prefill.
        prefill_tokens: u64,
        /// Its prompt tokens.
        prompt_tokens: u64,
        /// Its prefill work (cold-token equivalents).
        work: u64,
    },
    /// Its prefill finished: as [`InstanceLoad::on_prefilled`].
    Prefilled {
        /// As routed.
        prefill_tokens: u64,
        /// As routed.
        work: u64,
    },
    /// It finished or was aborted: as [`InstanceLoad::on_done`] (after its prefill was applied).
    Done {
        /// As routed.
        prompt_tokens: u64,
    },
}

impl InstanceLoad {
    /// Applies one load effect (see [`LoadEffect`]).
    pub fn apply(&self, effect: LoadEffect) {
        match effect {
            LoadEffect::Routed {
                prefill_tokens,
                prompt_tokens,
                work,
            } => self.on_routed(prefill_tokens, prompt_tokens, work),
            LoadEffect::Prefilled { prefill_tokens, work } => self.on_prefilled(prefill_tokens, work),
            LoadEffect::Done { prompt_tokens } => self.on_done(prompt_tokens),
        }
    }

    /// A decision placed a request here.
    pub fn on_routed(&self, prefill_tokens: u64, prompt_tokens: u64, work: u64) {
        self.bs.fetch_add(1, Ordering::Relaxed);
        self.waiting.fetch_add(1, Ordering::Relaxed);
        self.queued.fetch_add(prefill_tokens, Ordering::Relaxed);
        self.queued_work.fetch_add(work, Ordering::Relaxed);
        self.active.fetch_add(prompt_tokens, Ordering::Relaxed);
    }

    /// The count of decisions committed here, read before a decision reads the counters
    /// (acquire: every commit it counts has its load in the counters read after it).
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    /// Commits a decision that read this instance's load after reading `seen` from
    /// [`InstanceLoad::version`]: adds the request's load ([`InstanceLoad::on_routed`]), then
    /// advances the version from `seen` (release: whoever reads the new version reads the
    /// load). If another decision committed here since `seen` was read, the add is taken back
    /// and `false` returned: the caller decides again on fresh loads. Meanwhile a concurrent
    /// reader may see the add that is taken back — a load too high for an instant, never
    /// one too low.
    pub fn commit_routed(&self, seen: u64, prefill_tokens: u64, prompt_tokens: u64, work: u64) -> bool {
        self.on_routed(prefill_tokens, prompt_tokens, work);
        let committed = self
            .version
            .compare_exchange(seen, seen.wrapping_add(1), Ordering::AcqRel, Ordering::Relaxed)
            .is_ok();
        if !committed {
            // Taken back as a request's lifecycle takes its add back (prefill, then done): the
            // exact inverse, as the add above is still counted (each subtraction elsewhere
            // follows its own request's add), so the saturating subtractions never saturate.
            self.on_prefilled(prefill_tokens, work);
            self.on_done(prompt_tokens);
        }
        committed
    }

    /// A request finished its prefill.
    pub fn on_prefilled(&self, prefill_tokens: u64, work: u64) {
        saturating_sub(&self.waiting, 1);
        saturating_sub(&self.queued, prefill_tokens);
        saturating_sub(&self.queued_work, work);
    }

    /// A request finished or was aborted (after its prefill step was applied).
    pub fn on_done(&self, prompt_tokens: u64) {
        saturating_sub(&self.bs, 1);
        saturating_sub(&self.active, prompt_tokens);
    }

    /// Stores the given fields of an engine snapshot taken at `now_ms`.
    pub fn update_engine(&self, running: Option<u64>, waiting: Option<u64>, kv_usage: Option<f64>, now_ms: u64) {
        if let Some(r) = running {
            self.running_e.store(r, Ordering::Relaxed);
        }
        if let Some(w) = waiting {
            self.waiting_e.store(w, Ordering::Relaxed);
        }
        if let Some(k) = kv_usage {
            self.kv_usage_bits.store(k.to_bits(), Ordering::Relaxed);
        }
        self.stamp_ms.store(now_ms, Ordering::Relaxed);
    }

    /// A copy of every counter.
    pub fn snapshot(&self) -> LoadSnapshot {
        let stamp = self.stamp_ms.load(Ordering::Relaxed);
        LoadSnapshot {
            bs: self.bs.load(Ordering::Relaxed),
            waiting: self.waiting.load(Ordering::Relaxed),
            queued: self.queued.load(Ordering::Relaxed),
            queued_work: self.queued_work.load(Ordering::Relaxed),
            active: self.active.load(Ordering::Relaxed),
            drain_rate: self.drain.learned(),
            fetch_cost: self.fetch.learned(),
            running_e: self.running_e.load(Ordering::Relaxed),
            waiting_e: self.waiting_e.load(Ordering::Relaxed),
            kv_usage: f64::from_bits(self.kv_usage_bits.load(Ordering::Relaxed)),
            stamp_ms: (stamp != NEVER).then_some(stamp),
        }
    }

    /// Replaces the peers' in-flight work here (see [`PeerLoad`]).
    pub fn set_peers(&self, peers: &PeerLoad) {
        self.peer_bs.store(peers.bs, Ordering::Relaxed);
        self.peer_waiting.store(peers.waiting, Ordering::Relaxed);
        self.peer_queued.store(peers.queued, Ordering::Relaxed);
        self.peer_queued_work.store(peers.queued_work, Ordering::Relaxed);
        self.peer_active.store(peers.active, Ordering::Relaxed);
    }

    /// The peers' in-flight work here, as last set.
    pub fn peers(&self) -> PeerLoad {
        PeerLoad {
            bs: self.peer_bs.load(Ordering::Relaxed),
            waiting: self.peer_waiting.load(Ordering::Relaxed),
            queued: self.peer_queued.load(Ordering::Relaxed),
            queued_work: self.peer_queued_work.load(Ordering::Relaxed),
            active: self.peer_active.load(Ordering::Relaxed),
        }
    }

    /// The load the policies score: the router's own counts plus its peers' ([`PeerLoad`]),
    /// fusing an engine snapshot no older than `staleness_ms` (which already counts every
    /// replica's running and waiting requests, so it is compared with the sum).
    pub fn effective(&self, now_ms: u64, staleness_ms: u64) -> EffectiveLoad {
        let s = self.snapshot();
        let p = self.peers();
        let fresh = s.stamp_ms.is_some_and(|t| now_ms.saturating_sub(t) <= staleness_ms);
        let (bs, waiting) = (s.bs + p.bs, s.waiting + p.waiting);
        EffectiveLoad {
            bs: if fresh { bs.max(s.running_e + s.waiting_e) } else { bs },
            waiting: if fresh { waiting.max(s.waiting_e) } else { waiting },
            queued: s.queued + p.queued,
            queued_work: s.queued_work + p.queued_work,
            active: s.active + p.active,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_negative_and_fused() {
        let l = InstanceLoad::default();
        l.on_routed(100, 120, 150);
        l.on_prefilled(100, 150);
        l.on_prefilled(100, 150);
        l.on_done(120);
        l.on_done(120);
        let s = l.snapshot();
        assert_eq!((s.bs, s.waiting, s.queued, s.queued_work, s.active), (0, 0, 0, 0, 0));
        l.update_engine(Some(5), Some(2), Some(0.5), 1000);
        assert_eq!(l.effective(1500, 1000).bs, 7);
        assert_eq!(l.effective(2001, 1000).bs, 0, "a stale snapshot is ignored");
    }

    #[test]
    fn peers_add_to_the_board_and_are_replaced_whole() {
        let l = InstanceLoad::default();
        l.on_routed(100, 120, 150);
        let peers = PeerLoad {
            bs: 3,
            waiting: 2,
            queued: 500,
            queued_work: 700,
            active: 900,
        };
        l.set_peers(&peers);
        let e = l.effective(0, 1000);
        assert_eq!(
            (e.bs, e.waiting, e.queued, e.queued_work, e.active),
            (4, 3, 600, 850, 1020)
        );
        // The engine's counts cover every replica: the larger of the two wins.
        l.update_engine(Some(6), Some(1), None, 0);
        assert_eq!(l.effective(0, 1000).bs, 7);
        l.set_peers(&PeerLoad::default());
        assert_eq!(
            l.effective(5000, 1000).queued,
            100,
            "a new snapshot replaces the old one"
        );
        assert_eq!(
            l.snapshot().queued,
            100,
            "the router's own counters never hold peers' work"
        );
    }
}
