//! What every native path reads of a request the same way: its body, whole, within the size and
//! time the proxy allows (`proxy._handle`'s answers when it does not arrive so); its session,
//! parent and end headers as the app's `session` module reads them; and the per-instance cap's
//! exclusions (`admission.skip_full`). Used by `forward.rs` (routed requests) and `unrouted.rs`.
//! O(body) to read, O(headers) to read the headers, O(instances) for the cap.

use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::header::{HeaderMap, HeaderValue};
use hyper::{Response, StatusCode};

use super::protocol::Protocol;
use super::state::Native;
use crate::answers::Body;
use crate::counters::ClientError;
use crate::delegate::ControlPlane;
use crate::shared::{END_HEADERS, PARENT_HEADERS, SESSION_HEADERS};

/// An API the native path serves.
type Api = &'static dyn Protocol;

/// A header's value as the app reads it (aiohttp decodes UTF-8, escaping what is not: a value
/// that is not UTF-8 is the app's, see [`session_headers_utf8`]), or None when absent or empty.
pub(super) fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get(name)
        .and_then(|v| std::str::from_utf8(v.as_bytes()).ok())
        .filter(|v| !v.is_empty())
}

/// The session key a request's headers give (`session.session_hint` of the headers alone, as
/// the decision log reads it).
pub(super) fn header_session(headers: &HeaderMap) -> Option<String> {
    let name = SESSION_HEADERS.iter().find(|name| header(headers, name).is_some())?;
    let value = header(headers, name)?;
    if *name == "x-claude-code-session-id"
        && let Some(agent) = header(headers, "x-claude-code-agent-id")
    {
        return Some(format!("{value}/{agent}"));
    }
    Some(value.to_owned())
}

/// Whether every session and parent header present is UTF-8, as `header_session` and
/// `parent_key` read them: the app decodes other bytes with escapes, whose key (hash, digest)
/// would differ from the bytes'.
pub(super) fn session_headers_utf8(headers: &HeaderMap) -> bool {
    SESSION_HEADERS
        .iter()
        .chain(PARENT_HEADERS.iter())
        .chain(["x-claude-code-agent-id"].iter())
        .flat_map(|name| headers.get_all(*name))
        .all(|v| std::str::from_utf8(v.as_bytes()).is_ok())
}

/// The session key of the request's parent agent (`session.parent_key`), or None: not a
/// sub-agent's request. Claude Code: a sub-agent's request carries the root's session id and
/// its own agent id; its parent is `{session}/{parent agent}` (nested) or the root session (top
/// level). A parent header on a request without an agent id (the root's) is ignored.
pub(super) fn parent_key(headers: &HeaderMap) -> Option<String> {
    if let Some(session) = header(headers, "x-claude-code-session-id") {
        header(headers, "x-claude-code-agent-id")?;
        return Some(match header(headers, "x-claude-code-parent-agent-id") {
            Some(parent) => format!("{session}/{parent}"),
            None => session.to_owned(),
        });
    }
    PARENT_HEADERS
        .iter()
        .filter(|name| **name != "x-claude-code-parent-agent-id")
        .find_map(|name| header(headers, name))
        .map(str::to_owned)
}

/// Whether the request ends its session (`session.session_end`): an end header is `true` or
/// `1` (any case, spaces around); `Err` with the first header, in `END_HEADERS` order, whose
/// value is neither those nor `false` / `0` (the app's 400 names it).
pub(super) fn session_end(headers: &HeaderMap) -> Result<bool, &'static str> {
    let mut ended = false;
    for name in END_HEADERS {
        let Some(value) = headers.get(name) else { continue };
        let word = value.to_str().map_err(|_| name)?.trim().to_ascii_lowercase();
        match word.as_str() {
            "true" | "1" => ended = true,
            "false" | "0" => {}
            _ => return Err(name),
        }
    }
    Ok(ended)
}

#[derive(Clone, Copy)]
pub(super) enum BodyFailure {
    TooLarge,
    Timeout,
    Broken,
}

impl Native {
    /// The body, whole, within the size and time the proxy allows.
    pub(super) async fn read_body(&self, body: Incoming) -> Result<Bytes, BodyFailure> {
        let limit = self.config.max_body_bytes;
        let read = async {
            let mut body = body;
            let mut out = BytesMut::new();
            while let Some(frame) = body.frame().await {
                let frame = frame.map_err(|_| BodyFailure::Broken)?;
                if let Ok(data) = frame.into_data() {
                    if out.len() + data.len() > limit {
                        return Err(BodyFailure::TooLarge);
                    }
                    out.extend_from_slice(&data);
                }
            }
            Ok(out.freeze())
        };
        tokio::time::timeout(self.config.body_timeout, read)
            .await
            .unwrap_or(Err(BodyFailure::Timeout))
    }

    /// The app's answers to a body that did not arrive whole (`proxy._handle`'s).
    pub(super) fn body_failure(&self, plane: &ControlPlane, api: Api, failure: BodyFailure) -> Response<Body> {
        let (status, message, code) = match failure {
            BodyFailure::TooLarge => (
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("the request body exceeds {} bytes", self.config.max_body_bytes),
                Some("request_too_large"),
            ),
            BodyFailure::Timeout => {
                plane.errors().count(ClientError::BodyTimeout);
                let seconds = self.config.body_timeout.as_secs_f64();
                (
                    StatusCode::REQUEST_TIMEOUT,
                    format!("the request body did not arrive within {seconds} s"),
                    Some("timeout"),
                )
            }
            BodyFailure::Broken => {
                plane.errors().count(ClientError::Malformed);
                (StatusCode::BAD_REQUEST, crate::answers::MALFORMED.to_owned(), None)
            }
        };
        let mut answer = api.client_error(status, &message, code, None);
        answer
            .headers_mut()
            .insert(hyper::header::CONNECTION, HeaderValue::from_static("close"));
        answer
    }

    /// `exclude` plus the instances at the per-instance cap once the admission holds an
    /// instance's share (`admission.skip_full`, pool by pool: PD's prefill and decode pools
    /// each keep one below it). O(instances), nothing at all below the share.
    pub(super) fn without_full(&self, instances: &[String], exclude: Vec<String>) -> Vec<String> {
        let cap = self.config.admission.max_in_flight_per_instance;
        if self.admission.admitted() < cap {
            return exclude;
        }
        match self.config.routing.exclusion_pools(instances) {
            None => self.skip_full(instances, exclude, cap),
            Some(pools) => pools
                .iter()
                .fold(exclude, |exclude, pool| self.skip_full(pool, exclude, cap)),
        }
    }

    /// `exclude` plus the instances of `instances` (one pool) at `cap` requests in flight, while
    /// one below it is left.
    fn skip_full(&self, instances: &[String], exclude: Vec<String>, cap: usize) -> Vec<String> {
        let candidates: Vec<&String> = instances.iter().filter(|u| !exclude.contains(u)).collect();
        let full: Vec<String> = candidates
            .iter()
            .filter(|u| self.config.routing.in_flight(u).is_some_and(|bs| bs >= cap as u64))
            .map(|u| (*u).clone())
            .collect();
        if full.is_empty() || full.len() >= candidates.len() {
            return exclude;
        }
        let mut out = exclude;
        out.extend(full);
        out
    }
}

/// Python's `json.loads` refuses an integer of more digits than this (the default of
/// `sys.set_int_max_str_digits`); `serde_json` reads it.
const PYTHON_MAX_INT_DIGITS: usize = 4300;

/// Whether the body has a run of more than [`PYTHON_MAX_INT_DIGITS`] ASCII digits (in a number
/// the app would refuse, or in a string: either way the app's to answer). Such a run covers a
/// multiple of the limit, so only those bytes are probed: O(body / 4300).
pub(super) fn has_long_digit_run(raw: &[u8]) -> bool {
    let digit = |i: usize| raw.get(i).is_some_and(u8::is_ascii_digit);
    (PYTHON_MAX_INT_DIGITS..raw.len())
        .step_by(PYTHON_MAX_INT_DIGITS)
        .any(|probe| {
            if !digit(probe) {
                return false;
            }
            let start = (0..probe).rev().take_while(|&i| digit(i)).last().unwrap_or(probe);
            let end = (probe..raw.len()).take_while(|&i| digit(i)).last().unwrap_or(probe);
            end + 1 - start > PYTHON_MAX_INT_DIGITS
        })
}
