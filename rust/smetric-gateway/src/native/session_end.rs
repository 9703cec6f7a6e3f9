//! The session-end endpoints (`POST /v1/sessions/{id}/end`, vllm-router's `POST
//! /finish_session?session_id=…`; `docs/serve.md`, "Session life"), answered natively for an id
//! the app would accept as it is: the session's entry in the shared table and its residency at
//! the session gate released at once, `{"object": "session.end", "id", "ended": true, "held"}`
//! answered (`held`: the table had state for it), llm-d's cookie cleared when that policy
//! routes, and a record for the app's `proxy_session_ends_total{via="endpoint"}`.
//!
//! An id written with `%` escapes is decoded as the app's router and query parser decode it
//! (`percent_decoded`: checked against yarl on random escapes). An id no client session can have
//! (empty, over [`MAX_SESSION_ID_BYTES`] or holding a control character, `session_id_problem`)
//! is the app's 400 in its words (`invalid_session_id`), answered here too. Left to the app (its
//! decoding): a `%` that begins no escape or escapes that are not UTF-8, a query with `+` or `;`,
//! an empty path segment (`/v1/sessions//end`, no end route to the app's router), a key the
//! proxy does not accept (its 401), and a method other than `POST`. Idempotent; O(id length).

use hyper::header::{HeaderMap, SET_COOKIE};
use hyper::{Method, Response, StatusCode, Uri};

use super::attempt::affinity_cleared_cookie;
use super::state::Native;
use crate::answers::{Body, json_response};
use crate::handoff::SESSION_END_RECORD;
use crate::records::Record;
use crate::shared::{MAX_SESSION_ID_BYTES, SESSION_ID_CONTROL, SESSION_ID_EMPTY, SESSION_ID_TOO_LONG};

/// What an end endpoint's request asks, when the native path answers it (see the module docs).
#[derive(Debug, PartialEq, Eq)]
pub(super) enum EndRequest {
    /// End this session.
    End(String),
    /// An id no client session can have: the app's 400 with these words.
    Invalid(String),
}

/// What an end endpoint's request asks, or None when it is the app's to read (module docs).
pub(super) fn ended_session(method: &Method, uri: &Uri) -> Option<EndRequest> {
    if *method != Method::POST {
        return None;
    }
    let path = uri.path();
    let id = if let Some(rest) = path.strip_prefix("/v1/sessions/") {
        let written = rest.strip_suffix("/end")?;
        if written.is_empty() {
            return None; // no end route to the app's router: its catch-all answers
        }
        percent_decoded(written)?
    } else if path == "/finish_session" {
        // The first `session_id` pair, keys and values decoded as the app's query parser does
        // (`+` and `;` it reads otherwise: its to read); none is the empty id.
        let query = uri.query().unwrap_or("");
        if query.contains(['+', ';']) {
            return None;
        }
        let mut found = String::new();
        for pair in query.split('&').filter(|pair| !pair.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            if percent_decoded(key)? == "session_id" {
                found = percent_decoded(value)?;
                break;
            }
        }
        found
    } else {
        return None;
    };
    Some(match session_id_problem(&id) {
        None => EndRequest::End(id),
        Some(problem) => EndRequest::Invalid(problem),
    })
}

/// What is wrong with an end endpoint's session id, in the app's words (`session_id_problem`),
/// or None: empty, over [`MAX_SESSION_ID_BYTES`] UTF-8 bytes, or holding a control character
/// (no header value could carry it, so no session has it), checked in that order.
fn session_id_problem(id: &str) -> Option<String> {
    if id.is_empty() {
        return Some(SESSION_ID_EMPTY.to_owned());
    }
    if id.len() > MAX_SESSION_ID_BYTES {
        let text = SESSION_ID_TOO_LONG.replace("{size}", &id.len().to_string());
        return Some(text.replace("{max}", &MAX_SESSION_ID_BYTES.to_string()));
    }
    id.chars()
        .any(|c| c < ' ' || c == '\u{7f}')
        .then(|| SESSION_ID_CONTROL.to_owned())
}

/// The app's 400 for an end endpoint's impossible session id (OpenAI's shape).
pub(super) fn invalid_session_id(problem: &str) -> Response<Body> {
    let body = serde_json::json!({"error": {
        "message": problem, "type": "invalid_request_error", "param": "session_id", "code": "invalid_session_id",
    }});
    json_response(StatusCode::BAD_REQUEST, body.to_string())
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
        match ended_session(method, &uri.parse().unwrap())? {
            EndRequest::End(id) => Some(id),
            EndRequest::Invalid(_) => None,
        }
    }

    fn invalid(uri: &str) -> Option<String> {
        match ended_session(&Method::POST, &uri.parse().unwrap())? {
            EndRequest::Invalid(problem) => Some(problem),
            EndRequest::End(_) => None,
        }
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
        assert_eq!(
            ended_session(&Method::POST, &"/v1/sessions//end".parse().unwrap()),
            None,
            "no end route"
        );
        assert_eq!(
            invalid("/v1/sessions/a%0Ab/end").as_deref(),
            Some(SESSION_ID_CONTROL),
            "decoded first"
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
        assert_eq!(invalid("/finish_session").as_deref(), Some(SESSION_ID_EMPTY));
        assert_eq!(
            invalid("/finish_session?session_id=").as_deref(),
            Some(SESSION_ID_EMPTY)
        );
        assert_eq!(invalid("/finish_session?other=1").as_deref(), Some(SESSION_ID_EMPTY));
        assert_eq!(ended(&Method::POST, "/finish_session?session_id=a+b"), None);
        let long = format!("/v1/sessions/{}/end", "s".repeat(MAX_SESSION_ID_BYTES + 1));
        assert_eq!(
            invalid(&long).as_deref(),
            Some("the session id is 257 bytes; at most 256 are accepted")
        );
        let long_control = format!("/v1/sessions/{}%0A/end", "é".repeat(MAX_SESSION_ID_BYTES));
        assert!(
            invalid(&long_control).unwrap().contains("513 bytes"),
            "the size first, in UTF-8 bytes"
        );
        let longest = format!("/v1/sessions/{}/end", "s".repeat(MAX_SESSION_ID_BYTES));
        assert!(ended(&Method::POST, &longest).is_some());
    }
}
