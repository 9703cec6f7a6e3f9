//! What the gateway did with each request it served natively or refused, for the control plane:
//! one [`Record`] per request, queued here and taken in batches by the Python app
//! ([`Records::take`]), which turns them into its metrics, its fleet's health and its decision
//! log exactly as it does for the requests it serves itself (`decision_log.Outcome`).
//!
//! Invariants: the queue holds at most `capacity` records — when the control plane falls that
//! far behind, the oldest are dropped and counted ([`Records::dropped`]), so a stalled control
//! plane costs bounded memory; pushing is O(1) under a mutex held for the push alone.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
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
}

impl Records {
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity,
            queue: Mutex::new(VecDeque::new()),
            dropped: AtomicU64::new(0),
        }
    }

    pub fn push(&self, record: Record) {
        let mut queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        if queue.len() >= self.capacity {
            queue.pop_front();
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
        queue.push_back(record);
    }

    /// Every queued record, oldest first.
    pub fn take(&self) -> Vec<Record> {
        let mut queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        queue.drain(..).collect()
    }

    /// Records dropped because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_queue_drops_its_oldest_and_counts_them() {
        let records = Records::new(2);
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
