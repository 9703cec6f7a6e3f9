//! How decisions take the index's lock: spin briefly instead of sleeping, and hand a write over
//! instead of waiting for the exclusive lock.
//!
//! Algorithm.
//! * **Spinning** ([`Router::spin_read`], [`Router::spin_write`]): a thread that finds the lock
//!   taken tries again, first busy-waiting ([`SPIN_TRIES`] tries, each a short pause), then
//!   yielding its core between tries, for at most [`SPIN_BUDGET`]; only then does it sleep in
//!   the lock's queue. An index write lasts microseconds (a 32K-token chain re-fronted: ≈ 7 µs;
//!   a new chain in both tiers: ≈ 0.2–0.4 ms), while putting a thread to sleep and waking it
//!   costs tens of microseconds on this machine's virtual cores: with the lock slept on, two
//!   routing threads convoyed and routed fewer requests per second than one.
//! * **Handing writes over** ([`Router::write_or_defer`]): a decision whose insert on route (or
//!   record of sent blocks) changes some holder's blocks *tries* the exclusive lock. When
//!   another thread holds the index (walking under the shared lock, or writing), it queues its
//!   write — the slot and its generation, the chain, the time, its walk (so the write still
//!   skips the lookups) — and returns. Every taker of the exclusive lock applies the queued
//!   writes first, in queue order ([`Router::write_index`]); a walk that finds writes queued and
//!   the index free applies them before it walks ([`Router::read_index_fresh`]), and so does a
//!   decision once its own write is done ([`Router::try_drain_deferred`]). A thread has at most
//!   one write waiting: a decision whose thread's previous queued write has not been applied
//!   yet waits for the lock instead of queueing (and then applies the queue, its own first
//!   write included), so whoever drains the queue applies at most one write of each other
//!   routing thread besides its own — a call's tail is bounded by the number of threads, not by
//!   [`MAX_DEFERRED`] (with 4 threads on 2 cores a write-heavy call had applied up to 64 queued
//!   0.2 ms writes). Without contention (one thread) the try never fails, so nothing is ever
//!   queued: every decision is exactly the sequential one.
//!
//! Invariants: writes are applied one at a time, queued ones in queue order and before the write
//! of whoever applies them, so the index after any interleaving equals the writes applied one by
//! one in the order they were applied (the concurrent replay test); a queued write is applied
//! before any other exclusive-lock write (a KV event, a fleet change, a TTL purge) and before the
//! next walk that finds the index free; at most one write per routing thread and at most
//! [`MAX_DEFERRED`] writes wait (a decision that finds the queue full waits for the lock as
//! before), so the queue's memory is bounded by `min(threads, MAX_DEFERRED)` chains. Staleness:
//! a walk may miss at most that many queued writes, each of a decision that already returned;
//! `stats()` and the tests' index reads apply them first.
//!
//! Complexity: queueing copies the chain and the walk's ids, O(prompt blocks); applying is the
//! write itself; a contended lock costs its waiter at most `SPIN_BUDGET` of spinning.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use parking_lot::{RwLockReadGuard, RwLockWriteGuard};

use super::Router;
use crate::config::IndexMode;
use crate::ids::{BlockHash, RequestId};
use crate::index::{KvIndex, Walk};

/// Writes that may wait at once (each holds one prompt's chain).
pub(crate) const MAX_DEFERRED: usize = 64;

/// Tries spent busy-waiting before a waiter starts yielding its core.
const SPIN_TRIES: u32 = 64;

/// Pauses (`spin_loop` hints) between two busy-waiting tries.
const SPIN_PAUSES: u32 = 32;

/// The longest a waiter spins and yields before it sleeps in the lock's queue: longer than a
/// re-fronting write, shorter than a whole new chain's (whose waiter may as well sleep).
const SPIN_BUDGET: Duration = Duration::from_micros(200);

thread_local! {
    /// The router and queue count of the calling thread's last queued write (module docs:
    /// one write per thread waits at a time).
    static LAST_QUEUED: std::cell::Cell<(usize, u64)> = const { std::cell::Cell::new((0, 0)) };
}

/// One decision's index write, as it would have been applied.
#[derive(Debug)]
pub(crate) struct RouteWrite {
    /// The chosen instance's slot and its generation at the decision.
    pub(crate) slot: u32,
    pub(crate) generation: u32,
    /// The prompt's chain (empty until the write is queued: the caller's buffer serves).
    pub(crate) chain: Vec<BlockHash>,
    pub(crate) now_ms: u64,
    /// The decision's walk (default until queued: the caller's buffer serves).
    pub(crate) walk: Walk,
    /// Whether the GPU and global-tier part of an approximate route's write is already done
    /// (in place), leaving only the host pool's.
    pub(crate) gpu_done: bool,
    /// Whether the prompt also goes to the instance's host pool.
    pub(crate) host_write: bool,
    /// The decision's id (read by the tests' record of the order writes were applied in).
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) request_id: RequestId,
}

/// Tries `take` until it succeeds or the spin budget is spent (module docs).
fn spin<G>(mut take: impl FnMut() -> Option<G>) -> Option<G> {
    // The first try before the clock: an uncontended lock (every lock of one thread) reads none.
    if let Some(guard) = take() {
        return Some(guard);
    }
    let start = Instant::now();
    let mut tries = 1u32;
    loop {
        if let Some(guard) = take() {
            return Some(guard);
        }
        tries += 1;
        if tries < SPIN_TRIES {
            for _ in 0..SPIN_PAUSES {
                std::hint::spin_loop();
            }
        } else if start.elapsed() < SPIN_BUDGET {
            std::thread::yield_now();
        } else {
            return None;
        }
    }
}

impl Router {
    /// The shared lock, spun for before sleeping (module docs).
    pub(crate) fn spin_read(&self) -> RwLockReadGuard<'_, KvIndex> {
        spin(|| self.index.try_read()).unwrap_or_else(|| self.index.read())
    }

    /// The exclusive lock, spun for before sleeping (module docs).
    pub(crate) fn spin_write(&self) -> RwLockWriteGuard<'_, KvIndex> {
        spin(|| self.index.try_write()).unwrap_or_else(|| self.index.write())
    }

    /// The index under the exclusive lock, every queued write applied.
    pub(crate) fn write_index(&self) -> RwLockWriteGuard<'_, KvIndex> {
        let mut index = self.spin_write();
        self.drain_deferred(&mut index);
        index
    }

    /// The index under the shared lock for a walk, the queued writes applied first when the
    /// index is free.
    pub(crate) fn read_index_fresh(&self) -> RwLockReadGuard<'_, KvIndex> {
        if self.deferred_count.load(Ordering::Acquire) > 0
            && let Some(mut index) = self.index.try_write()
        {
            self.drain_deferred(&mut index);
            return RwLockWriteGuard::downgrade(index);
        }
        self.spin_read()
    }

    /// Applies the queued writes now if the index is free; otherwise the next taker does.
    pub(crate) fn try_drain_deferred(&self) {
        if self.deferred_count.load(Ordering::Acquire) == 0 {
            return;
        }
        if let Some(mut index) = self.index.try_write() {
            self.drain_deferred(&mut index);
        }
    }

    /// Applies the queued writes, oldest first (the exclusive lock held).
    pub(crate) fn drain_deferred(&self, index: &mut KvIndex) {
        if self.deferred_count.load(Ordering::Acquire) == 0 {
            return;
        }
        let writes = {
            let mut queue = self.deferred.lock();
            self.deferred_count.store(0, Ordering::Release);
            std::mem::take(&mut *queue)
        };
        let applied = writes.len() as u64;
        for mut w in writes {
            let chain = std::mem::take(&mut w.chain);
            let mut walk = std::mem::take(&mut w.walk);
            self.apply_route_write(index, &w, &chain, &mut walk);
        }
        self.deferred_applied.fetch_add(applied, Ordering::Release);
    }

    /// The route's write: applied at once when the index is free, else queued (module docs);
    /// with the queue full, applied once the lock is taken.
    pub(crate) fn write_or_defer(&self, write: &RouteWrite, chain: &[BlockHash], walk: &mut Walk) {
        let mut index = if let Some(index) = self.index.try_write() {
            index
        } else {
            let mut queue = self.deferred.lock();
            if queue.len() < MAX_DEFERRED && !self.own_write_waits() {
                queue.push(RouteWrite {
                    chain: chain.to_vec(),
                    walk: walk.clone(),
                    ..*write
                });
                self.deferred_count.store(queue.len(), Ordering::Release);
                let ticket = self.deferred_queued.fetch_add(1, Ordering::Relaxed) + 1;
                LAST_QUEUED.with(|last| last.set((self.identity(), ticket)));
                #[cfg(test)]
                self.deferred_total.fetch_add(1, Ordering::Relaxed);
                return;
            }
            drop(queue);
            self.spin_write()
        };
        self.drain_deferred(&mut index);
        self.apply_route_write(&mut index, write, chain, walk);
    }

    /// Whether the calling thread's last write queued on this router still waits in the queue.
    fn own_write_waits(&self) -> bool {
        #[cfg(test)]
        if !self.one_queued_per_thread {
            return false;
        }
        let (router, ticket) = LAST_QUEUED.with(std::cell::Cell::get);
        router == self.identity() && self.deferred_applied.load(Ordering::Acquire) < ticket
    }

    /// This router's address, naming it in [`LAST_QUEUED`] (a router dropped and another built at
    /// the same address can at worst make one write wait for the lock instead of queueing).
    fn identity(&self) -> usize {
        std::ptr::from_ref(self) as usize
    }

    /// Applies one decision's write: the chain on the chosen instance (and its host pool), or
    /// recorded as sent there; nothing when the instance left since the walk (its slot cleared
    /// or reused: what was sent there left with it).
    fn apply_route_write(&self, index: &mut KvIndex, write: &RouteWrite, chain: &[BlockHash], walk: &mut Walk) {
        let (slot, now_ms) = (write.slot, write.now_ms);
        if self
            .fleet
            .load()
            .member(slot)
            .is_some_and(|m| m.generation == write.generation)
        {
            match self.config.index_mode {
                IndexMode::Approximate => {
                    if !write.gpu_done {
                        index.touch_walked(slot, chain, now_ms, walk);
                    }
                    if write.host_write {
                        index.touch_host(slot, chain, None, now_ms);
                    }
                }
                IndexMode::Exact => index.send_walked(slot, chain, now_ms, walk),
            }
        }
        #[cfg(test)]
        self.write_order.lock().push((write.request_id, false));
    }
}
