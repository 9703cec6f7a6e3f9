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
use crate::shared::{AFFINITY_ATTRIBUTES, AFFINITY_COOKIE};

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

/// Whether an answer's headers say it is an event stream (relayed event by event).
pub(super) fn is_event_stream(headers: &HeaderMap) -> bool {
    headers
        .get(hyper::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"))
}

/// An engine's answer headers as the client gets them: end-to-end fields only, the decision,
/// the session cookie (llm-d's policy) and the request id added (the length is the relay's to
/// set).
pub(super) fn client_head(
    headers: &mut HeaderMap,
    decision_header: HeaderValue,
    cookie: Option<HeaderValue>,
    id: &str,
) {
    strip_hop_by_hop(headers);
    headers.remove(hyper::header::CONTENT_LENGTH);
    headers.remove(hyper::header::HOST);
    headers.insert(DECISION.clone(), decision_header);
    if let Some(cookie) = cookie {
        headers.insert(hyper::header::SET_COOKIE, cookie);
    }
    if let Ok(value) = HeaderValue::from_str(id) {
        headers.insert(REQUEST_ID.clone(), value);
    }
    headers.insert(SERVER, HeaderValue::from_static(SERVER_NAME));
}

/// The instance a request's `llm-d-session` cookie names, as the app's
/// `session.affinity_instance` reads it: the first `Cookie` header's first pair of that name,
/// its value base64 (standard alphabet, Python's `b64decode(validate=True)` padding rules) of
/// UTF-8 text; `Ok(None)` for none or a value that is not. `Err` when the header is not
/// visible ASCII (the app decodes other text: the request is its to route).
pub(super) fn affinity_instance(headers: &HeaderMap) -> Result<Option<String>, ()> {
    let Some(cookie) = headers.get(hyper::header::COOKIE) else {
        return Ok(None);
    };
    let cookie = cookie.to_str().map_err(|_| ())?;
    for pair in cookie.split(';') {
        let Some((name, value)) = pair.trim_matches([' ', '\t']).split_once('=') else {
            continue;
        };
        if name == AFFINITY_COOKIE {
            return Ok(base64_decode(value).and_then(|bytes| String::from_utf8(bytes).ok()));
        }
    }
    Ok(None)
}

/// The `Set-Cookie` value an answer from `chosen` carries when the request's cookie named
/// `previous` (the app's `session.affinity_set_cookie`): none when it already named `chosen`;
/// the cookie's deletion when the request `ended` its session.
pub(super) fn affinity_set_cookie(previous: Option<&str>, chosen: &str, ended: bool) -> Option<HeaderValue> {
    if ended {
        return affinity_cleared_cookie();
    }
    if previous == Some(chosen) {
        return None;
    }
    let value = format!(
        "{AFFINITY_COOKIE}={}; {AFFINITY_ATTRIBUTES}",
        base64_encode(chosen.as_bytes())
    );
    HeaderValue::from_str(&value).ok()
}

/// The `Set-Cookie` that deletes llm-d's session cookie (an ended session's answer).
pub(super) fn affinity_cleared_cookie() -> Option<HeaderValue> {
    HeaderValue::from_str(&format!("{AFFINITY_COOKIE}=; Max-Age=0; {AFFINITY_ATTRIBUTES}")).ok()
}

const BASE64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

fn base64_encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &b)| n | u32::from(b) << (16 - 8 * i));
        for k in 0..4 {
            if k <= chunk.len() {
                out.push(char::from(BASE64[(n >> (18 - 6 * k) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Python's `base64.b64decode(text, validate=True)`: only the standard alphabet then at most two
/// `=`; a complete last group takes any padding, a group of 2 (3) data characters exactly two
/// (one); 1 more than a multiple of 4 is refused; a last character's unused bits are dropped.
fn base64_decode(text: &str) -> Option<Vec<u8>> {
    let data = text.trim_end_matches('=');
    let padding = text.len() - data.len();
    let value = |c: u8| BASE64.iter().position(|&a| a == c).map(|v| v as u32);
    let digits: Vec<u32> = data.bytes().map(value).collect::<Option<_>>()?;
    let valid = padding <= 2
        && match digits.len() % 4 {
            0 => true,
            2 => padding == 2,
            3 => padding == 1,
            _ => false,
        };
    if !valid {
        return None;
    }
    let mut out = Vec::with_capacity(digits.len() * 3 / 4);
    for group in digits.chunks(4) {
        let n = group.iter().enumerate().fold(0u32, |n, (i, &d)| n | d << (18 - 6 * i));
        for k in 0..group.len() - 1 {
            out.push((n >> (16 - 8 * k)) as u8);
        }
    }
    Some(out)
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
        record.attempts += 1;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_round_trips_and_refuses_what_python_refuses() {
        for text in ["", "a", "ab", "abc", "http://127.0.0.1:8000", "é"] {
            assert_eq!(
                base64_decode(&base64_encode(text.as_bytes())).as_deref(),
                Some(text.as_bytes())
            );
        }
        // Python 3.11's b64decode(validate=True), case by case.
        assert_eq!(base64_decode("QUJD=").as_deref(), Some(&b"ABC"[..]));
        assert_eq!(base64_decode("QUJD==").as_deref(), Some(&b"ABC"[..]));
        assert_eq!(base64_decode("QR==").as_deref(), Some(&b"A"[..]));
        for refused in [
            "QUJDR",
            "QUJDR=",
            "QUJDRE",
            "QUJDRE=",
            "QUJDREx",
            "QUJDREx==",
            "QU JD",
            "QUJD===",
            "QU=JD",
        ] {
            assert_eq!(base64_decode(refused), None, "{refused}");
        }
    }

    #[test]
    fn the_affinity_cookie_is_read_and_set_as_the_app_does() {
        let mut headers = HeaderMap::new();
        assert_eq!(affinity_instance(&headers), Ok(None));
        let token = base64_encode(b"http://a:1");
        headers.insert(
            hyper::header::COOKIE,
            HeaderValue::from_str(&format!("x=1; llm-d-session={token}; llm-d-session=eg==")).unwrap(),
        );
        assert_eq!(affinity_instance(&headers), Ok(Some("http://a:1".to_owned())));
        headers.insert(hyper::header::COOKIE, HeaderValue::from_static("llm-d-session=!!"));
        assert_eq!(affinity_instance(&headers), Ok(None));
        headers.insert(
            hyper::header::COOKIE,
            HeaderValue::from_bytes(b"llm-d-session=\xe9").unwrap(),
        );
        assert_eq!(affinity_instance(&headers), Err(()));
        assert_eq!(affinity_set_cookie(Some("http://a:1"), "http://a:1", false), None);
        assert_eq!(
            affinity_set_cookie(None, "http://a:1", false).unwrap(),
            format!("llm-d-session={token}; Path=/; HttpOnly; SameSite=Lax").as_str()
        );
        let cleared = affinity_set_cookie(Some("http://a:1"), "http://a:1", true).unwrap();
        assert_eq!(
            cleared, "llm-d-session=; Max-Age=0; Path=/; HttpOnly; SameSite=Lax",
            "an ended session's"
        );
    }
}
