//! What the gateway did with each request it served natively or refused, for the control plane:
//! one [`Record`] per request, queued here and taken in batches by the Python app
//! ([`Records::take`]), which turns them into its metrics, its fleet's health and its decision
//! log exactly as it does for the requests it serves itself (`decision_log.Outcome`).
//!
//! Invariants: the queue holds at most `capacity` records — when the control plane falls that
//! far behind, the oldest are dropped and counted ([`Records::dropped`]), so a stalled control
//! plane costs bounded memory; pushing is O(1) under a mutex held for the push alone.
//!
//! The bell: the control plane does not poll. A push into a queue the control plane has not been
//! told about writes one byte to a socket pair ([`Records::bell_fd`], which the app's event loop
//! watches); [`Records::take`] clears the bell before it drains the queue, so a record pushed
//! after the take rings it again and none waits unseen (a record pushed between the two is
//! taken now and rings once more: a spurious wake, harmless). An idle gateway wakes the app
//! never; a busy one once per take at most (the app paces its takes).

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

/// One request's outcome: the fields of `decision_log.Outcome`, the routing decision's
/// details `ProxyTelemetry.record_decision` counts, and the timings the app's histograms take.
#[derive(Clone, Debug, Default)]
pub struct Record {
    pub request_id: String,
    pub api: &'static str,
    pub session: Option<String>,
    pub parent: Option<String>,
    pub model: Option<String>,
    pub instance: Option<String>,
    /// PD: the prefill instance that answered its leg (its health is the app's to note).
    pub prefill_instance: Option<String>,
    /// The core's reason (`Decision.reason`), when a decision was made.
    pub reason: Option<&'static str>,
    pub policy: Option<&'static str>,
    pub first_turn: Option<bool>,
    /// The turn counted in the session table (a hinted request without messages).
    pub turn: Option<u32>,
    pub predicted_local_hit: Option<u64>,
    pub predicted_global_hit: Option<u64>,
    pub prompt_tokens: Option<u64>,
    /// Where the routing ids came from: `ids` or `approximate`.
    pub tokens_source: Option<&'static str>,
    pub decision_s: Option<f64>,
    pub cached_tokens: Option<u64>,
    pub output_tokens: Option<u64>,
    /// Seconds from the request's arrival to the engine's answer head.
    pub first_byte_s: Option<f64>,
    pub ttft_s: Option<f64>,
    pub itl_s: Option<f64>,
    pub attempts: u32,
    pub status: u16,
    /// The admission refusal's reason, when refused.
    pub refused: Option<&'static str>,
    pub latency_s: f64,
    /// The instance the answer came from gets its health back (the app's `Fleet.succeeded`).
    pub succeeded: bool,
    /// Attempts that failed before the client had a byte, in order (the gateway's failover),
    /// or a stream cut and not continued.
    pub failures: Vec<FailedAttempt>,
    /// Instances this request's failures ejected from the gateway's fleet view (the app
    /// mirrors the ejection and probes them for re-admission).
    pub ejected: Vec<String>,
    /// A cut stream ended with the API's error event (not continued).
    pub unresumed: bool,
    /// Cut streams the gateway continued on another instance (`native::continuation`).
    pub resumed: u32,
    /// A sub-agent's request: what the parent rule did (`parent`, `overloaded`,
    /// `parent_unavailable`, `parent_unknown`), when it applied.
    pub grouping: Option<&'static str>,
    /// The request ended its session: whether the table held state for it (the gateway
    /// released it when the answer was done).
    pub session_end_held: Option<bool>,
    /// The session the request ends (its header's key, else its body's hint), if it ends one.
    pub end_key: Option<String>,
}

/// One attempt that failed (`native::failover`).
#[derive(Clone, Debug, Default)]
pub struct FailedAttempt {
    pub instance: String,
    /// A connection error's class name (the app's names), `http_<status>`, or a protocol failure.
    pub cause: String,
    /// Charged to the instance's health: its own failure, or a 5xx another instance then
    /// answered past (else counted as a retry only).
    pub charged: bool,
}

/// The queue of records waiting for the control plane.
pub struct Records {
    capacity: usize,
    queue: Mutex<VecDeque<Record>>,
    dropped: AtomicU64,
    /// The bell's two ends (module doc), both non-blocking: rung here, watched by the app.
    ringer: UnixStream,
    bell: UnixStream,
    /// Whether the bell has rung since the last take.
    rung: AtomicBool,
}

impl Records {
    /// A queue of at most `capacity` records.
    ///
    /// # Errors
    /// The bell's socket pair could not be made (the process is out of descriptors).
    pub fn new(capacity: usize) -> std::io::Result<Self> {
        let (ringer, bell) = UnixStream::pair()?;
        ringer.set_nonblocking(true)?;
        bell.set_nonblocking(true)?;
        Ok(Self {
            capacity,
            queue: Mutex::new(VecDeque::new()),
            dropped: AtomicU64::new(0),
            ringer,
            bell,
            rung: AtomicBool::new(false),
        })
    }

    pub fn push(&self, record: Record) {
        {
            let mut queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
            if queue.len() >= self.capacity {
                queue.pop_front();
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
            queue.push_back(record);
        }
        if !self.rung.swap(true, Ordering::AcqRel) {
            // One byte in an empty socket's buffer: it cannot be full. A failure would only
            // delay the record to the app's next take (at `/metrics` or the next ring).
            let _ = (&self.ringer).write(&[1]);
        }
    }

    /// Every queued record, oldest first; clears the bell first (module doc).
    pub fn take(&self) -> Vec<Record> {
        self.rung.store(false, Ordering::Release);
        let mut rung = [0u8; 64];
        while matches!((&self.bell).read(&mut rung), Ok(n) if n > 0) {}
        let mut queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        queue.drain(..).collect()
    }

    /// The descriptor that turns readable when records wait (module doc); owned here.
    pub fn bell_fd(&self) -> RawFd {
        self.bell.as_raw_fd()
    }

    /// Records dropped because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether a byte waits on the bell (read: the next check starts afresh).
    fn rung(records: &Records) -> bool {
        let mut byte = [0u8; 1];
        (&records.bell).read(&mut byte).is_ok_and(|n| n == 1)
    }

    #[test]
    fn the_bell_rings_once_per_take_and_never_while_idle() {
        let records = Records::new(8).unwrap();
        assert!(!rung(&records), "an empty queue is silent");
        records.push(Record::default());
        records.push(Record::default());
        assert!(rung(&records));
        assert_eq!(records.take().len(), 2);
        assert!(!rung(&records), "the take clears the bell");
        assert!(records.take().is_empty() && !rung(&records));
        records.push(Record::default());
        assert!(rung(&records), "a push after the take rings again");
        assert_eq!(records.take().len(), 1);
    }

    #[test]
    fn a_full_queue_drops_its_oldest_and_counts_them() {
        let records = Records::new(2).unwrap();
        for status in [200, 201, 202] {
            records.push(Record {
                status,
                ..Record::default()
            });
        }
        let taken: Vec<u16> = records.take().iter().map(|r| r.status).collect();
        assert_eq!(taken, [201, 202]);
        assert_eq!(records.dropped(), 1);
        assert!(records.take().is_empty());
    }
}
