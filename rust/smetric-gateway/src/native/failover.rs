//! Failover before the client has a byte, native (`smetric.serve.failover`'s rules, which the
//! app keeps for what it still serves), co-located and PD alike (a PD attempt fails at its
//! prefill or its decode instance; the next one is routed without it, each pool keeping one).
//!
//! An attempt that fails before its first byte reached the client — no connection, no answer
//! head within `first_byte_timeout`, a 5xx, an answer body or stream that broke before its first
//! byte — is retried as it was on another instance, `max_attempts` in all; a failed instance is
//! not tried again by the same request. Whose fault it was decides what its health is charged:
//! - **the instance's own** (no answer, a timeout, 502–504): charged at once;
//! - **any other 5xx**: a suspect, charged only once another instance answered the same request
//!   (a body that crashes every engine must not eject the fleet); the same such status from two
//!   instances is the request's answer (in the API's shape), not retried further.
//!
//! Ejection happens here, on the data path, where the failures are seen: `eject_after` charged
//! failures in a row (a success resets the count) eject an instance from this gateway's fleet
//! view at once, so the next request skips it without waiting for the control plane. Each
//! failure, and each ejection, rides the request's [`Record`] to the app, which counts them in
//! its metrics and mirrors the ejection in its own health table; re-admission stays the app's
//! (its `/health` probes), and its next fleet view resets the count of an instance it re-admits.
//!
//! Invariants: the counts are touched only on a failure, a success after a failure, and a fleet
//! view that re-admits; a request's failures and its ejections are each recorded once. Cost: one
//! relaxed atomic load per answered request while no instance has a failure outstanding, else one
//! short mutex; an ejection clones the fleet view (O(instances)).

use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};

use super::protocol::Protocol;
use super::state::{FleetView, Native};
use crate::answers::Body;
use crate::records::{FailedAttempt, Record};
use crate::shared::{LOST_STATE, LOST_STATE_FAILED, LOST_STATE_LEFT};

/// 5xx statuses that are an instance's own whatever the request (a gateway's or an unreachable
/// engine's): `upstream.OWN_STATUSES`.
pub(super) const OWN_STATUSES: [u16; 3] = [502, 503, 504];

/// What one request's attempts went through so far.
#[derive(Default)]
pub(super) struct Tried {
    pub(super) failed: Vec<String>,
    causes: Vec<String>,
    /// 5xx statuses already answered by a suspect.
    statuses: Vec<u16>,
    /// Failures not charged yet (indices into the record's failures).
    suspects: Vec<usize>,
}

/// Why an attempt failed before the client's first byte: the cause (the app's names: a
/// connection error's class, `http_<status>`, `stream_cut`, …) and the engine's 5xx, if any.
pub(super) type Failure = (String, Option<u16>);

/// What to do after a failed attempt.
pub(super) enum AfterFailure {
    /// Try another instance.
    Retry,
    /// Answer this (the request's own failure, or no instance left).
    Answer(Response<Body>),
}

impl Tried {
    /// The instances failed so far, as the fleet's exclusions take them.
    pub(super) fn instances(&self) -> &[String] {
        &self.failed
    }

    /// The last failure's cause.
    pub(super) fn last_cause(&self) -> &str {
        self.causes.last().map_or("", String::as_str)
    }
}

impl Native {
    /// Sends `request` to its engine and waits for the answer's head within
    /// `first_byte_timeout`: a head below 500, or why the attempt failed.
    pub(super) async fn send(&self, request: Request<Full<Bytes>>) -> Result<Response<Incoming>, Failure> {
        match tokio::time::timeout(self.config.first_byte_timeout, self.engines.client.request(request)).await {
            Ok(Ok(answer)) if answer.status().as_u16() < 500 => Ok(answer),
            Ok(Ok(answer)) => {
                let status = answer.status().as_u16();
                Err((format!("http_{status}"), Some(status)))
            }
            Ok(Err(e)) if e.is_connect() => Err(("ClientConnectorError".to_owned(), None)),
            Ok(Err(_)) => Err(("ServerDisconnectedError".to_owned(), None)),
            Err(_) => Err(("TimeoutError".to_owned(), None)),
        }
    }

    /// A whole answer's body within `first_byte_timeout`, or why it broke.
    pub(super) async fn whole_body(&self, body: Incoming) -> Result<Bytes, Failure> {
        match tokio::time::timeout(self.config.first_byte_timeout, body.collect()).await {
            Ok(Ok(whole)) => Ok(whole.to_bytes()),
            Ok(Err(_)) => Err(("ClientPayloadError".to_owned(), None)),
            Err(_) => Err(("TimeoutError".to_owned(), None)),
        }
    }

    /// A stream's first non-empty frame within `idle_timeout`, or why it broke first.
    pub(super) async fn first_frame(&self, body: &mut Incoming) -> Result<Bytes, Failure> {
        loop {
            match tokio::time::timeout(self.config.idle_timeout, body.frame()).await {
                Ok(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data()
                        && !data.is_empty()
                    {
                        return Ok(data);
                    }
                }
                Ok(None) => return Err(("stream_cut".to_owned(), None)),
                Ok(Some(Err(_))) => return Err(("ClientPayloadError".to_owned(), None)),
                Err(_) => return Err(("TimeoutError".to_owned(), None)),
            }
        }
    }

    /// Accounts an attempt at `instance` that failed before its first byte (`status`: the
    /// engine's 5xx, None when it gave no answer) and says what comes next.
    pub(super) fn attempt_failed(
        &self,
        api: &'static dyn Protocol,
        record: &mut Record,
        tried: &mut Tried,
        instance: &str,
        cause: String,
        status: Option<u16>,
    ) -> AfterFailure {
        let own = status.is_none_or(|s| OWN_STATUSES.contains(&s));
        tried.failed.push(instance.to_owned());
        tried.causes.push(cause.clone());
        record.failures.push(FailedAttempt {
            instance: instance.to_owned(),
            cause,
            charged: own,
        });
        if own {
            self.charge(record, instance);
        } else if let Some(status) = status {
            if tried.statuses.contains(&status) {
                return AfterFailure::Answer(repeated_failure(api, status, tried.failed.len()));
            }
            tried.statuses.push(status);
            tried.suspects.push(record.failures.len() - 1);
        }
        if tried.failed.len() >= self.config.max_attempts as usize {
            return AfterFailure::Answer(no_instance(api, &tried.failed));
        }
        AfterFailure::Retry
    }

    /// A request answered with the failure of its attempts, recorded (its session's end
    /// applied as for any answer).
    pub(super) fn failure_answer(
        &self,
        mut record: Record,
        arrived: std::time::Instant,
        ends_session: bool,
        answer: Response<Body>,
    ) -> Response<Body> {
        record.status = answer.status().as_u16();
        record.latency_s = arrived.elapsed().as_secs_f64();
        self.settle(record, ends_session);
        answer
    }

    /// Another instance answered the request: its earlier suspects' 5xx were their own.
    pub(super) fn answered_after(&self, record: &mut Record, tried: &mut Tried) {
        for i in std::mem::take(&mut tried.suspects) {
            let instance = record.failures[i].instance.clone();
            record.failures[i].charged = true;
            self.charge(record, &instance);
        }
    }

    /// `instance` answered a request whole: its count of failures in a row starts again.
    pub(super) fn instance_succeeded(&self, instance: &str) {
        if !self.health.outstanding.load(Ordering::Relaxed) {
            return;
        }
        let mut failures = self.health.failures.lock().unwrap_or_else(PoisonError::into_inner);
        failures.remove(instance);
        self.health.outstanding.store(!failures.is_empty(), Ordering::Relaxed);
    }

    /// A stream cut at `instance` after its first event and not continued: the instance's own
    /// failure, charged.
    pub(super) fn charge_cut(&self, record: &mut Record, instance: &str, cause: &str) {
        record.failures.push(FailedAttempt {
            instance: instance.to_owned(),
            cause: cause.to_owned(),
            charged: true,
        });
        self.charge(record, instance);
    }

    /// Charges a failure to `instance`; ejects it (from this gateway's view at once, and in the
    /// record for the app) when it reaches `eject_after` in a row.
    fn charge(&self, record: &mut Record, instance: &str) {
        let count = {
            let mut failures = self.health.failures.lock().unwrap_or_else(PoisonError::into_inner);
            let count = failures.entry(instance.to_owned()).or_insert(0);
            *count += 1;
            self.health.outstanding.store(true, Ordering::Relaxed);
            *count
        };
        if count < self.config.eject_after {
            return;
        }
        let mut view = self.fleet.write().unwrap_or_else(PoisonError::into_inner);
        if view.ejected.contains(instance) || !view.instances.iter().any(|u| u == instance) {
            return;
        }
        let mut next = FleetView::clone(&view);
        next.ejected.insert(instance.to_owned());
        self.admission.set_live(next.live());
        *view = Arc::new(next);
        record.ejected.push(instance.to_owned());
    }
}

/// The answer to a request that two instances failed with the same `status` (not 502–504):
/// `failover._repeated_failure`.
fn repeated_failure(api: &'static dyn Protocol, status: u16, attempts: usize) -> Response<Body> {
    let kind = if status == 500 {
        "InternalServerError"
    } else {
        "APIError"
    };
    let message = format!(
        "the engines failed this request with HTTP {status} on {attempts} instances; \
         it is not retried further (the request itself is the likely cause)"
    );
    api.proxy_error(status, &message, kind)
}

/// The answer when no instance could serve the request.
pub(super) fn no_instance(api: &'static dyn Protocol, failed: &[String]) -> Response<Body> {
    let listed = if failed.is_empty() {
        "none".to_owned()
    } else {
        failed.join(", ")
    };
    let message = format!(
        "no instance could serve the request ({} attempts; failed: {listed})",
        failed.len()
    );
    api.proxy_error(503, &message, "ServiceUnavailableError")
}

/// The answer to a request pinned to a stored response whose instance is gone: `failed` None,
/// it left the fleet (a 404); else the instance and why it did not answer (a 503). The state it
/// names lived there only (`failover.lost_state`, worded by the shared constants).
pub(super) fn lost_state(failed: Option<(&str, &str)>) -> Response<Body> {
    let (place, status, kind) = match failed {
        None => (
            LOST_STATE_LEFT.to_owned(),
            hyper::StatusCode::NOT_FOUND,
            "NotFoundError",
        ),
        Some((instance, cause)) => (
            LOST_STATE_FAILED
                .replace("{instance}", instance)
                .replace("{cause}", &format!("did not answer ({cause})")),
            hyper::StatusCode::SERVICE_UNAVAILABLE,
            "ServiceUnavailableError",
        ),
    };
    let message = LOST_STATE.replace("{where}", &place);
    let body = serde_json::json!({"error": {
        "message": message, "type": kind, "param": "previous_response_id", "code": status.as_u16(),
    }});
    crate::answers::json_response(status, body.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::native::state::Health;

    fn view(instances: &[&str], ejected: &[&str]) -> FleetView {
        FleetView {
            instances: instances.iter().map(|u| (*u).to_owned()).collect(),
            ejected: ejected.iter().map(|u| (*u).to_owned()).collect(),
            ..FleetView::default()
        }
    }

    fn counts(health: &Health) -> Vec<(String, u32)> {
        let mut out: Vec<_> = health
            .failures
            .lock()
            .unwrap()
            .iter()
            .map(|(u, n)| (u.clone(), *n))
            .collect();
        out.sort();
        out
    }

    #[test]
    fn each_pool_keeps_an_instance_and_ejected_ones_are_its_last_resort() {
        let pools = vec![vec!["p1".to_owned(), "p2".to_owned()], vec!["d1".to_owned()]];
        let excluded = |fleet: &FleetView, failed: &[&str]| {
            let failed: Vec<String> = failed.iter().map(|u| (*u).to_owned()).collect();
            fleet.exclusions(None, &failed, Some(&pools))
        };
        let fleet = view(&["p1", "p2", "d1"], &["p1"]);
        assert_eq!(excluded(&fleet, &[]), Some(vec!["p1".to_owned()]));
        assert_eq!(excluded(&fleet, &["d1"]), None, "the decode pool has nothing left");
        assert_eq!(
            excluded(&fleet, &["p2"]),
            Some(vec!["p2".to_owned()]),
            "ejected p1: a last resort"
        );
        // Every prefill instance ejected: the pool's last resort, while the fleet-wide rule
        // (one pool) would have kept the healthy decode instance alone.
        let fleet = view(&["p1", "p2", "d1"], &["p1", "p2"]);
        assert_eq!(excluded(&fleet, &[]), Some(vec![]));
        assert_eq!(
            fleet.exclusions(None, &[], None),
            Some(vec!["p1".to_owned(), "p2".to_owned()])
        );
    }

    #[test]
    fn a_readmitted_or_removed_instance_starts_its_count_again_and_no_other_does() {
        let health = Health::default();
        health
            .failures
            .lock()
            .unwrap()
            .extend([("a".into(), 3), ("b".into(), 1), ("c".into(), 2)]);
        health.outstanding.store(true, Ordering::Relaxed);
        // a re-admitted (ejected before, not now), b still counting, c removed from the fleet.
        health.readmitted(&view(&["a", "b", "c"], &["a"]), &view(&["a", "b"], &[]));
        assert_eq!(counts(&health), [("b".to_owned(), 1)]);
        assert!(health.outstanding.load(Ordering::Relaxed));
        // Still ejected: the count stays (the app has not re-admitted it).
        health.failures.lock().unwrap().insert("a".into(), 2);
        health.readmitted(&view(&["a", "b"], &["a"]), &view(&["a", "b"], &["a"]));
        assert_eq!(counts(&health), [("a".to_owned(), 2), ("b".to_owned(), 1)]);
        health.readmitted(&view(&["a", "b"], &["a"]), &view(&[], &[]));
        assert!(counts(&health).is_empty() && !health.outstanding.load(Ordering::Relaxed));
    }
}
