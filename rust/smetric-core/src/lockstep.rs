//! Test only: a barrier for threads run in lockstep that a panicking thread breaks.
//!
//! `std::sync::Barrier` waits forever for a thread that panicked before reaching it: one
//! failed assertion inside a lockstep test turns into a hung test binary (and a CI run that
//! only ends at its time limit). Here every thread holds a [`Member`] for its whole body; when
//! a thread unwinds, its member breaks the barrier, and every thread waiting on it (or
//! arriving later) panics too, so the scope joins and the first panic is reported.
//!
//! Invariants: a generation completes when `parties` threads arrived; a broken barrier stays
//! broken. Complexity: O(1) per wait, plus the wake-up of the waiters.

use parking_lot::{Condvar, Mutex};

#[derive(Debug, Default)]
struct State {
    arrived: usize,
    generation: u64,
    broken: bool,
}

/// A reusable barrier for `parties` threads that fails loudly once any member panicked.
#[derive(Debug)]
pub(crate) struct Lockstep {
    parties: usize,
    state: Mutex<State>,
    changed: Condvar,
}

impl Lockstep {
    pub(crate) fn new(parties: usize) -> Self {
        assert!(parties > 0);
        Self {
            parties,
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
        }
    }

    /// Blocks until `parties` threads called `wait` in this generation; panics if the barrier
    /// is (or becomes) broken.
    pub(crate) fn wait(&self) {
        let mut s = self.state.lock();
        assert!(!s.broken, "another thread in lockstep panicked");
        s.arrived += 1;
        if s.arrived == self.parties {
            s.arrived = 0;
            s.generation += 1;
            self.changed.notify_all();
            return;
        }
        let generation = s.generation;
        while s.generation == generation && !s.broken {
            self.changed.wait(&mut s);
        }
        assert!(!s.broken, "another thread in lockstep panicked");
    }

    fn break_all(&self) {
        self.state.lock().broken = true;
        self.changed.notify_all();
    }
}

/// Held by one thread for its whole body: breaks `barriers` if the thread unwinds.
pub(crate) struct Member<'a>(pub(crate) &'a [&'a Lockstep]);

impl Drop for Member<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for barrier in self.0 {
                barrier.break_all();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::thread;

    use super::*;

    #[test]
    fn threads_meet_generation_after_generation() {
        let barrier = Lockstep::new(3);
        let counter = AtomicUsize::new(0);
        thread::scope(|s| {
            for _ in 0..3 {
                s.spawn(|| {
                    let _member = Member(&[&barrier]);
                    for round in 1..=50 {
                        counter.fetch_add(1, Ordering::SeqCst);
                        barrier.wait();
                        // Every thread counted this round before any passed the barrier.
                        assert!(counter.load(Ordering::SeqCst) >= 3 * round);
                        barrier.wait();
                    }
                });
            }
        });
        assert_eq!(counter.into_inner(), 150);
    }

    /// The hang this type exists for: one thread panics before the barrier; the others must
    /// not wait for it forever, and the scope reports the panic.
    #[test]
    fn a_panicking_member_releases_the_others() {
        let barrier = Lockstep::new(3);
        let joined = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            thread::scope(|s| {
                for t in 0..3 {
                    let barrier = &barrier;
                    s.spawn(move || {
                        let _member = Member(&[barrier]);
                        for round in 0..10 {
                            assert!(!(t == 1 && round == 4), "thread 1 fails in round 4");
                            barrier.wait();
                        }
                    });
                }
            });
        }));
        assert!(joined.is_err(), "the scope reports the panic instead of hanging");
    }
}
