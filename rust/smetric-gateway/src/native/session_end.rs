//! The session-end endpoints (`POST /v1/sessions/{id}/end`, vllm-router's `POST
//! /finish_session?session_id=…`; `docs/serve.md`, "Session life"), answered natively for an id
//! the app would accept as it is: the session's entry in the shared table and its residency at
//! the session gate released at once, `{"object": "session.end", "id", "ended": true, "held"}`
//! answered (`held`: the table had state for it), llm-d's cookie cleared when that policy
//! routes, and a record for the app's `proxy_session_ends_total{via="endpoint"}`.
//!
//! An id written with `%` escapes is decoded as the app's router and query parser decode it
//! (`percent_decoded`: checked against yarl on random escapes). Left to the app (its 400s, its
//! decoding): an id that is empty, over [`MAX_SESSION_ID_BYTES`] or holding a control character,
//! a `%` that begins no escape or escapes that are not UTF-8, a query with `+` or `;`, a key the
//! proxy does not accept (its 401), and a method other than `POST`. Idempotent; O(id length).

use hyper::header::{HeaderMap, SET_COOKIE};
use hyper::{Method, Response, StatusCode, Uri};

use super::attempt::affinity_cleared_cookie;
use super::state::Native;
use crate::answers::{Body, json_response};
use crate::handoff::SESSION_END_RECORD;
use crate::records::Record;
use crate::shared::MAX_SESSION_ID_BYTES;

/// The session id an end endpoint names, when the native path answers it (see the module docs).
pub(super) fn ended_session(method: &Method, uri: &Uri) -> Option<String> {
    if *method != Method::POST {
        return None;
    }
    let path = uri.path();
    let id = if let Some(rest) = path.strip_prefix("/v1/sessions/") {
        percent_decoded(rest.strip_suffix("/end")?)?
    } else if path == "/finish_session" {
        // The first `session_id` pair, keys and values decoded as the app's query parser does
        // (`+` and `;` it reads otherwise: its to read).
        let query = uri.query()?;
        if query.contains(['+', ';']) {
            return None;
        }
        let mut found = None;
        for pair in query.split('&') {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            if percent_decoded(key)? == "session_id" {
                found = Some(percent_decoded(value)?);
                break;
            }
        }
        found?
    } else {
        return None;
    };
    let plain = !id.is_empty() && id.len() <= MAX_SESSION_ID_BYTES && id.chars().all(|c| c >= ' ' && c != '\u{7f}');
    plain.then_some(id)
}

/// `text` with its `%XX` escapes decoded, when every `%` begins one and the bytes are UTF-8:
/// then the app's router (yarl's `path_safe`, then aiohttp's unquoting of `%2F` and `%25`) and its
/// query parser read the same text. Else None (the app reads it its own way). O(length).
fn percent_decoded(text: &str) -> Option<String> {
    if !text.contains('%') {
        return Some(text.to_owned());
    }
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            if !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                return None;
            }
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

impl Native {
    /// Ends session `id` and answers as the app's end endpoint does.
    pub(super) fn end_endpoint(&self, id: &str, headers: &HeaderMap) -> Response<Body> {
        let held = self.end_session(id);
        let quoted = serde_json::Value::from(id).to_string();
        let body = format!(r#"{{"object": "session.end", "id": {quoted}, "ended": true, "held": {held}}}"#);
        let mut answer = json_response(StatusCode::OK, body);
        if self.config.routing.session_cookie()
            && let Some(cookie) = affinity_cleared_cookie()
        {
            answer.headers_mut().insert(SET_COOKIE, cookie);
        }
        self.records.push(Record {
            request_id: super::attempt::request_id(headers),
            api: SESSION_END_RECORD,
            session: Some(id.to_owned()),
            status: 200,
            session_end_held: Some(held),
            ..Record::default()
        });
        answer
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ended(method: &Method, uri: &str) -> Option<String> {
        ended_session(method, &uri.parse().unwrap())
    }

    #[test]
    fn only_ids_the_app_takes_as_written_are_native() {
        assert_eq!(ended(&Method::POST, "/v1/sessions/s-1/end").as_deref(), Some("s-1"));
        assert_eq!(
            ended(&Method::POST, "/v1/sessions/root/agent-1/end").as_deref(),
            Some("root/agent-1")
        );
        assert_eq!(
            ended(&Method::POST, "/finish_session?x=1&session_id=b").as_deref(),
            Some("b")
        );
        assert_eq!(ended(&Method::GET, "/v1/sessions/s/end"), None);
        assert_eq!(ended(&Method::POST, "/v1/sessions//end"), None, "empty: the app's 400");
        assert_eq!(
            ended(&Method::POST, "/v1/sessions/a%0Ab/end"),
            None,
            "a control character once decoded: the app's 400"
        );
        let decoded = |uri: &str| ended(&Method::POST, uri);
        assert_eq!(decoded("/v1/sessions/a%2Fb%20c/end").as_deref(), Some("a/b c"));
        assert_eq!(decoded("/v1/sessions/%C3%A9%25/end").as_deref(), Some("é%"));
        assert_eq!(decoded("/v1/sessions/%C3/end"), None, "not UTF-8: the app's");
        assert_eq!(decoded("/v1/sessions/a%zz/end"), None, "not an escape: the app's");
        assert_eq!(decoded("/v1/sessions/a%2/end"), None);
        assert_eq!(decoded("/finish_session?session%5Fid=%E2%82%AC").as_deref(), Some("€"));
        assert_eq!(decoded("/finish_session?a=%FF&session_id=b"), Some("b".to_owned()));
        assert_eq!(decoded("/finish_session?session_id=%FF&session_id=b"), None);
        assert_eq!(ended(&Method::POST, "/finish_session"), None);
        assert_eq!(ended(&Method::POST, "/finish_session?session_id="), None);
        assert_eq!(ended(&Method::POST, "/finish_session?session_id=a+b"), None);
        let long = format!("/v1/sessions/{}/end", "s".repeat(MAX_SESSION_ID_BYTES + 1));
        assert_eq!(ended(&Method::POST, &long), None);
        let longest = format!("/v1/sessions/{}/end", "s".repeat(MAX_SESSION_ID_BYTES));
        assert!(ended(&Method::POST, &longest).is_some());
    }
}
