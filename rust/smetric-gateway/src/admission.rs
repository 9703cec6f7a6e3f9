//! Admission control at the door: how many requests of the proxy's APIs are let through at once,
//! and how many may wait, for the requests the gateway serves natively and the ones it delegates
//! alike (the control plane then admits nothing itself). The rule is `smetric serve`'s
//! (`python/smetric/serve/admission.py`, whose module docs it follows):
//!
//! * capacity = `min(max_in_flight, max_in_flight_per_instance × live instances)`, at least one
//!   live instance counted; [`Admission::set_live`] is told when the fleet changes;
//! * a request is admitted at once while nobody waits and fewer than the capacity (or than one
//!   instance's share) hold a slot; else it waits in a FIFO queue of at most `queue_size`, for at
//!   most `queue_timeout`: a full queue refuses at once ([`Refusal::QueueFull`], a 429), a wait
//!   that times out refuses with [`Refusal::QueueTimeout`] (503); once [`Admission::close`]d
//!   (the proxy drains) every waiter and every newcomer gets [`Refusal::Draining`] (503).
//!
//! Invariants: an admitted request is never refused afterwards; a [`Slot`] given back is handed
//! straight to the oldest live waiter (no barging); a waiter that times out or whose client
//! leaves (its future dropped) either leaves the queue or, granted in the same instant, keeps
//! or gives back the slot it was granted — so `admitted` is exactly the live slots. One mutex,
//! held for O(1) work (a departing waiter is found in O(queue)); the queue bounds a burst's
//! memory at `queue_size` waiters.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

/// The admission settings (no defaults here: `smetric serve`'s configuration has them).
#[derive(Clone, Copy, Debug)]
pub struct AdmissionLimits {
    pub max_in_flight: usize,
    pub max_in_flight_per_instance: usize,
    pub queue_size: usize,
    pub queue_timeout: Duration,
    /// The `Retry-After` of a refusal, in seconds.
    pub retry_after_s: u64,
}

pub use crate::shared::WAIT_BUCKETS_S;

/// Why a request was not admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    QueueFull,
    QueueTimeout,
    Draining,
}

impl Refusal {
    /// The metric's label (`admission.Refusal.reason`).
    pub fn reason(self) -> &'static str {
        match self {
            Self::QueueFull => "queue_full",
            Self::QueueTimeout => "queue_timeout",
            Self::Draining => "draining",
        }
    }
}

/// What `/metrics` shows of the admission.
#[derive(Clone, Debug, Default)]
pub struct AdmissionSnapshot {
    pub admitted: usize,
    pub capacity: usize,
    pub queued: usize,
    /// Per bucket of [`WAIT_BUCKETS_S`] and one past the last (not cumulative).
    pub wait_counts: Vec<u64>,
    pub wait_sum_s: f64,
    /// `(reason, count)` for every reason, zeros included.
    pub rejections: Vec<(&'static str, u64)>,
}

struct Waiter {
    id: u64,
    grant: oneshot::Sender<bool>,
}

#[derive(Default)]
struct State {
    admitted: usize,
    waiters: VecDeque<Waiter>,
    next_id: u64,
    closed: bool,
    rejections: [u64; 3],
    wait_counts: [u64; WAIT_BUCKETS_S.len() + 1],
    wait_sum_s: f64,
}

impl State {
    fn observe_wait(&mut self, seconds: f64) {
        let bucket = WAIT_BUCKETS_S.partition_point(|&bound| bound < seconds);
        self.wait_counts[bucket] += 1;
        self.wait_sum_s += seconds;
    }

    fn refuse(&mut self, refusal: Refusal) -> Refusal {
        self.rejections[refusal as usize] += 1;
        refusal
    }
}

/// The in-flight slots and the wait queue of one proxy (see the module docs).
pub struct Admission {
    limits: AdmissionLimits,
    live: AtomicUsize,
    state: Mutex<State>,
}

/// An admitted request's slot, given back when dropped.
pub struct Slot {
    admission: Arc<Admission>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.admission.leave();
    }
}

/// A place in the queue; leaving it (timed out, or the client gone) without a grant removes it,
/// and a grant that came in the same instant is kept (`keep`) or handed on.
struct Place<'a> {
    admission: &'a Arc<Admission>,
    id: u64,
    granted: oneshot::Receiver<bool>,
    settled: bool,
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        let mut state = self.admission.lock();
        if let Some(at) = state.waiters.iter().position(|w| w.id == self.id) {
            state.waiters.remove(at);
            return;
        }
        drop(state);
        // Popped by a grant: a slot was counted for it, which nobody will hold.
        if matches!(self.granted.try_recv(), Ok(true)) {
            self.admission.leave();
        }
    }
}

impl Admission {
    /// An admission with `live` instances in the fleet.
    pub fn new(limits: AdmissionLimits, live: usize) -> Arc<Self> {
        Arc::new(Self {
            limits,
            live: AtomicUsize::new(live),
            state: Mutex::new(State::default()),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state stays consistent at every unlock: a panic elsewhere does not poison it.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Slots the fleet has now.
    pub fn capacity(&self) -> usize {
        let per = self.limits.max_in_flight_per_instance;
        self.limits
            .max_in_flight
            .min(per.saturating_mul(self.live.load(Ordering::Relaxed).max(1)))
    }

    /// The fleet now has `live` instances that are not ejected; slots it gained go to waiters.
    pub fn set_live(self: &Arc<Self>, live: usize) {
        self.live.store(live, Ordering::Relaxed);
        let mut state = self.lock();
        self.grant(&mut state);
    }

    /// Requests holding a slot now.
    pub fn admitted(&self) -> usize {
        self.lock().admitted
    }

    /// A slot, waiting in the queue if need be, or why not.
    pub async fn enter(self: &Arc<Self>) -> Result<Slot, Refusal> {
        let (id, granted) = {
            let mut state = self.lock();
            if state.closed {
                return Err(state.refuse(Refusal::Draining));
            }
            let floor = self.limits.max_in_flight.min(self.limits.max_in_flight_per_instance);
            if state.waiters.is_empty() && (state.admitted < floor || state.admitted < self.capacity()) {
                state.admitted += 1;
                state.observe_wait(0.0);
                return Ok(self.slot());
            }
            if state.waiters.len() >= self.limits.queue_size {
                return Err(state.refuse(Refusal::QueueFull));
            }
            let (grant, granted) = oneshot::channel();
            let id = state.next_id;
            state.next_id += 1;
            state.waiters.push_back(Waiter { id, grant });
            (id, granted)
        };
        let started = Instant::now();
        let mut place = Place {
            admission: self,
            id,
            granted,
            settled: false,
        };
        let answer = tokio::select! {
            answer = &mut place.granted => answer.unwrap_or(false),
            () = tokio::time::sleep(self.limits.queue_timeout) => {
                let mut state = self.lock();
                if let Some(at) = state.waiters.iter().position(|w| w.id == id) {
                    state.waiters.remove(at);
                    place.settled = true;
                    return Err(state.refuse(Refusal::QueueTimeout));
                }
                drop(state);
                // Granted (or refused by the close) in the same instant: the answer is there.
                place.granted.try_recv().unwrap_or(false)
            }
        };
        place.settled = true;
        let mut state = self.lock();
        if answer {
            state.observe_wait(started.elapsed().as_secs_f64());
            drop(state);
            Ok(self.slot())
        } else {
            Err(state.refuse(Refusal::Draining))
        }
    }

    fn slot(self: &Arc<Self>) -> Slot {
        Slot {
            admission: Arc::clone(self),
        }
    }

    fn leave(&self) {
        let mut state = self.lock();
        state.admitted -= 1;
        self.grant(&mut state);
    }

    /// Hands free slots to the oldest waiters still waiting.
    fn grant(&self, state: &mut State) {
        let capacity = self.capacity();
        while state.admitted < capacity {
            let Some(waiter) = state.waiters.pop_front() else { break };
            if waiter.grant.send(true).is_ok() {
                state.admitted += 1;
            }
        }
    }

    /// The proxy drains: waiters and newcomers are refused; admitted requests keep their slots.
    pub fn close(&self) {
        let mut state = self.lock();
        state.closed = true;
        for waiter in state.waiters.drain(..) {
            let _ = waiter.grant.send(false);
        }
    }

    pub fn snapshot(&self) -> AdmissionSnapshot {
        let state = self.lock();
        AdmissionSnapshot {
            admitted: state.admitted,
            capacity: self.capacity(),
            queued: state.waiters.len(),
            wait_counts: state.wait_counts.to_vec(),
            wait_sum_s: state.wait_sum_s,
            rejections: [Refusal::QueueFull, Refusal::QueueTimeout, Refusal::Draining]
                .into_iter()
                .map(|r| (r.reason(), state.rejections[r as usize]))
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max: usize, per: usize, queue: usize, timeout_ms: u64) -> AdmissionLimits {
        AdmissionLimits {
            max_in_flight: max,
            max_in_flight_per_instance: per,
            queue_size: queue,
            queue_timeout: Duration::from_millis(timeout_ms),
            retry_after_s: 1,
        }
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn admits_up_to_capacity_then_queues_then_refuses() {
        runtime().block_on(async {
            let admission = Admission::new(limits(2, 8, 1, 10_000), 1);
            let a = admission.enter().await.unwrap();
            let _b = admission.enter().await.unwrap();
            let waiting = tokio::spawn({
                let admission = Arc::clone(&admission);
                async move { admission.enter().await.map(|_slot| ()) }
            });
            tokio::task::yield_now().await;
            assert_eq!(admission.snapshot().queued, 1);
            assert_eq!(admission.enter().await.err(), Some(Refusal::QueueFull));
            drop(a); // handed straight to the waiter
            assert_eq!(waiting.await.unwrap(), Ok(()));
            let snapshot = admission.snapshot();
            assert_eq!(snapshot.admitted, 1, "the waiter's slot was given back when it ended");
            assert_eq!(snapshot.rejections[0], ("queue_full", 1));
        });
    }

    #[test]
    fn a_wait_times_out_and_a_departed_waiter_leaves_the_queue() {
        runtime().block_on(async {
            let admission = Admission::new(limits(1, 1, 4, 20), 1);
            let held = admission.enter().await.unwrap();
            assert_eq!(admission.enter().await.err(), Some(Refusal::QueueTimeout));
            let gone = tokio::time::timeout(Duration::from_millis(5), admission.enter()).await;
            assert!(gone.is_err(), "still waiting when its client left");
            assert_eq!(admission.snapshot().queued, 0);
            drop(held);
            assert_eq!(admission.snapshot().admitted, 0);
        });
    }

    #[test]
    fn capacity_follows_the_live_instances_and_close_refuses_waiters() {
        runtime().block_on(async {
            let admission = Admission::new(limits(100, 1, 4, 10_000), 1);
            let _a = admission.enter().await.unwrap();
            let waiting = tokio::spawn({
                let admission = Arc::clone(&admission);
                async move { admission.enter().await.map(|_slot| ()) }
            });
            tokio::task::yield_now().await;
            admission.set_live(2); // a second instance: its slot goes to the waiter
            assert_eq!(waiting.await.unwrap(), Ok(()));
            admission.set_live(1);
            let waiting = tokio::spawn({
                let admission = Arc::clone(&admission);
                async move { admission.enter().await.map(|_slot| ()) }
            });
            tokio::task::yield_now().await;
            assert_eq!(admission.snapshot().queued, 1);
            admission.close();
            assert_eq!(waiting.await.unwrap(), Err(Refusal::Draining));
            assert_eq!(admission.enter().await.err(), Some(Refusal::Draining));
        });
    }
}
