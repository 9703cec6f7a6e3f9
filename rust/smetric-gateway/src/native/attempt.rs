//! One routed attempt's parts that every leg shares: its lifecycle with the router
//! ([`Lifecycle`]: `on_prefilled` at most once, then exactly one `on_finished` or
//! `on_aborted`), the engine's request ([`Native::upstream_request`]), the request id, and the
//! answer's head as the client gets it ([`client_head`]). Used by `forward.rs` (co-located and
//! the decode leg) and `pd.rs` (the prefill leg).
//!
//! Invariants: a `Lifecycle` dropped before its end tells the router `on_aborted`, so every
//! routed attempt ends exactly once whatever path leaves it. O(headers) per request.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{HeaderMap, HeaderName, HeaderValue, SERVER};
use hyper::{Method, Request};
use smetric_core::{Decision, RequestId};

use super::protocol::Protocol;
use super::state::{Native, Routing};
use crate::answers::SERVER_NAME;
use crate::delegate::strip_hop_by_hop;
use crate::records::Record;
use crate::session_gate::SessionGate;

/// `smetric serve`'s request id header.
pub(super) static REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
pub(super) static DECISION: HeaderName = HeaderName::from_static("x-smetric-decision");

/// Request ids minted so far: mixed into each new one.
static MINTED: AtomicU64 = AtomicU64::new(0);

/// The request's id: the client's when it is safe (1–128 of `[A-Za-z0-9._:-]`), else a new one.
pub(super) fn request_id(headers: &HeaderMap) -> String {
    let given = headers.get(&REQUEST_ID).and_then(|v| v.to_str().ok());
    if let Some(id) = given
        && (1..=128).contains(&id.len())
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || b"._:-".contains(&b))
    {
        return id.to_owned();
    }
    let n = MINTED.fetch_add(1, Ordering::Relaxed);
    let state = RandomState::new();
    format!("{:016x}{:016x}", state.hash_one(n), state.hash_one(!n))
}

/// An engine's answer headers as the client gets them: end-to-end fields only, the decision and
/// the request id added (the length is the relay's to set).
pub(super) fn client_head(headers: &mut HeaderMap, decision_header: HeaderValue, id: &str) {
    strip_hop_by_hop(headers);
    headers.remove(hyper::header::CONTENT_LENGTH);
    headers.remove(hyper::header::HOST);
    headers.insert(DECISION.clone(), decision_header);
    if let Ok(value) = HeaderValue::from_str(id) {
        headers.insert(REQUEST_ID.clone(), value);
    }
    headers.insert(SERVER, HeaderValue::from_static(SERVER_NAME));
}

/// A routed attempt's lifecycle: `on_prefilled` at most once, then exactly one `on_finished`
/// or — on every other path, a dropped future included — `on_aborted`; the session gate, when
/// it admitted the attempt, hears the same end once.
pub(super) struct Lifecycle {
    routing: Routing,
    id: RequestId,
    prefilled: bool,
    done: bool,
    /// The session gate's slot, when it admitted the attempt.
    pub(super) gate: Option<GatedSession>,
}

/// What the session gate is told when a gated attempt ends.
pub(super) struct GatedSession {
    pub(super) gate: Arc<SessionGate>,
    pub(super) session: u64,
    pub(super) instance: Arc<str>,
    pub(super) prompt_tokens: u64,
}

impl GatedSession {
    fn ended(&self, output_tokens: u64) {
        self.gate
            .finished(self.session, &self.instance, self.prompt_tokens + output_tokens);
    }
}

impl Lifecycle {
    /// A routed attempt's lifecycle, without a session gate.
    pub(super) fn new(routing: &Routing, id: RequestId) -> Self {
        Self {
            routing: routing.clone(),
            id,
            prefilled: false,
            done: false,
            gate: None,
        }
    }

    /// The answer's first byte: co-located, the prompt is prefilled; PD, the decode instance
    /// has read the KV (the prefill leg's own end was told when its answer came).
    pub(super) fn prefilled(&mut self) {
        if !self.prefilled && !self.done {
            self.prefilled = true;
            match &self.routing {
                Routing::Colocated(router) => {
                    router.on_prefilled(self.id);
                }
                Routing::Pd(pd) => {
                    pd.on_transferred(self.id);
                }
            }
        }
    }

    pub(super) fn aborted(&mut self) {
        if !self.done {
            self.done = true;
            match &self.routing {
                Routing::Colocated(router) => router.on_aborted(self.id),
                Routing::Pd(pd) => pd.on_aborted(self.id),
            };
            if let Some(gated) = &self.gate {
                gated.ended(0);
            }
        }
    }

    pub(super) fn finished(&mut self, output_tokens: u64) {
        if !self.done {
            self.done = true;
            match &self.routing {
                Routing::Colocated(router) => router.on_finished(self.id, output_tokens),
                Routing::Pd(pd) => pd.on_finished(self.id, output_tokens),
            };
            if let Some(gated) = &self.gate {
                gated.ended(output_tokens);
            }
        }
    }
}

impl Drop for Lifecycle {
    fn drop(&mut self) {
        self.aborted();
    }
}

impl Native {
    /// The record of a decision: its instance, reason, policy, turn verdict and predicted hits.
    pub(super) fn note_decision(&self, record: &mut Record, d: &Decision) {
        record.attempts = 1;
        record.instance = Some(d.instance_name.to_string());
        record.reason = Some(d.reason.name());
        record.policy = Some(self.config.routing.policy_name());
        record.first_turn = Some(d.first_turn);
        record.predicted_local_hit = Some(d.local_hit_tokens);
        record.predicted_global_hit = Some(d.global_hit_tokens);
    }

    /// The engine's request: the client's end-to-end headers, the request id, and the keys.
    pub(super) fn upstream_request(
        &self,
        api: &'static dyn Protocol,
        instance: &str,
        headers: &HeaderMap,
        id: &str,
        body: Bytes,
    ) -> Request<Full<Bytes>> {
        let mut out = headers.clone();
        strip_hop_by_hop(&mut out);
        for name in [hyper::header::HOST, hyper::header::CONTENT_LENGTH] {
            out.remove(name);
        }
        if let Ok(value) = HeaderValue::from_str(id) {
            out.insert(REQUEST_ID.clone(), value);
        }
        if !self.config.client_keys.is_empty() || self.config.upstream_key.is_some() {
            out.remove(hyper::header::AUTHORIZATION);
            out.remove("x-api-key");
        }
        if let Some(key) = &self.config.upstream_key
            && let Ok(value) = HeaderValue::from_str(&format!("Bearer {key}"))
        {
            out.insert(hyper::header::AUTHORIZATION, value);
        }
        let mut request = Request::new(Full::new(body));
        *request.method_mut() = Method::POST;
        *request.uri_mut() = format!("{instance}{}", api.path()).parse().unwrap_or_default();
        *request.headers_mut() = out;
        request
    }
}
