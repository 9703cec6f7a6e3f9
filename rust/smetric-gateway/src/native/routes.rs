//! Which of the proxy's routes a request's method and path name ([`resolve`]), so that a wrong
//! method and a path no route serves are answered at the door, as the app answers them (its 405
//! with `Allow`, its pass-through 404), instead of being handed to it.
//!
//! The table is `crate::shared::ROUTES` (aiohttp's pattern syntax, the app's own routes). A
//! path is matched as aiohttp matches it only when aiohttp would see the same characters: a
//! path with a `%` escape (aiohttp decodes it first), a `.` or `..` segment (yarl normalises
//! them away) or a byte outside printable ASCII is left to the app ([`Resolved`] is None).
//!
//! Invariants: `Allow` lists the methods of every pattern matching the path, sorted and joined
//! by `,` as aiohttp writes it. O(routes × path length) per request, on paths no API serves.

use hyper::header::{ALLOW, HOST, HeaderMap, HeaderValue};
use hyper::{Method, Response, StatusCode};

use crate::answers::{Body, Shape, json_response, shaped_client_error_body};
use crate::shared::{ROUTES, WRONG_METHOD};

/// What the route table says of a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Resolved {
    /// A route serves this method on this path.
    Served,
    /// Routes match the path, none with this method: the 405's `Allow` value.
    WrongMethod(String),
    /// No route matches the path.
    NoRoute,
}

/// The route table's answer for a request, or None when the app must answer it itself: a
/// method other than the six the APIs use (the app's HTTP parser refuses methods it does not
/// know with a 400, and treats `CONNECT` and `OPTIONS` apart), and a request without `Host` (the
/// app's 400, as RFC 9112 asks of an HTTP/1.1 server), besides what [`resolve`] leaves to it.
pub(crate) fn resolve_request(method: &Method, path: &str, headers: &HeaderMap) -> Option<Resolved> {
    let plain = matches!(
        *method,
        Method::GET | Method::HEAD | Method::POST | Method::PUT | Method::DELETE | Method::PATCH
    );
    if !plain || !headers.contains_key(HOST) {
        return None;
    }
    resolve(method, path)
}

/// The route table's answer for `method` on `path`, or None when the app must match it itself
/// (see the module docs).
fn resolve(method: &Method, path: &str) -> Option<Resolved> {
    let plain = path.starts_with('/')
        && path.bytes().all(|b| b.is_ascii_graphic() && b != b'%')
        && !path.split('/').any(|s| s == "." || s == "..");
    if !plain {
        return None;
    }
    let mut allowed: Vec<&str> = Vec::new();
    for (m, pattern) in ROUTES {
        if matches(pattern, path) {
            if m == method.as_str() {
                return Some(Resolved::Served);
            }
            allowed.push(m);
        }
    }
    if allowed.is_empty() {
        return Some(Resolved::NoRoute);
    }
    allowed.sort_unstable();
    allowed.dedup();
    Some(Resolved::WrongMethod(allowed.join(",")))
}

/// The app's 405 for a path served with other methods: the path's API shape (Anthropic's under
/// `/v1/messages`), the fixed message, `Allow` naming the methods.
pub(crate) fn wrong_method(path: &str, allow: &str) -> Response<Body> {
    let status = StatusCode::METHOD_NOT_ALLOWED;
    let mut answer = json_response(
        status,
        shaped_client_error_body(Shape::of_path(Some(path)), status, WRONG_METHOD),
    );
    if let Ok(value) = HeaderValue::from_str(allow) {
        answer.headers_mut().insert(ALLOW, value);
    }
    answer
}

/// Whether `path` matches `pattern`: literal text, `{name}` (one or more characters other than
/// `/`, `{`, `}`) and `{name:[\s\S]+}` (one or more of any character).
fn matches(pattern: &str, path: &str) -> bool {
    let Some(open) = pattern.find('{') else {
        return pattern == path;
    };
    let Some(rest) = path.strip_prefix(&pattern[..open]) else {
        return false;
    };
    let Some(close) = pattern[open..].find('}') else {
        return false;
    };
    let variable = &pattern[open + 1..open + close];
    let after = &pattern[open + close + 1..];
    let any = variable.ends_with(r":[\s\S]+");
    // Each non-empty prefix of `rest` the variable may take, longest first (as the regex's
    // greedy quantifier backtracks).
    let taken = |n: usize| rest.is_char_boundary(n) && (any || !rest[..n].contains(['/', '{', '}']));
    (1..=rest.len())
        .rev()
        .filter(|&n| taken(n))
        .any(|n| matches(after, &rest[n..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(method: &Method, path: &str) -> Option<Resolved> {
        resolve(method, path)
    }

    #[test]
    fn a_served_route_is_served() {
        assert_eq!(of(&Method::POST, "/v1/chat/completions"), Some(Resolved::Served));
        assert_eq!(of(&Method::GET, "/v1/responses/resp_1"), Some(Resolved::Served));
        assert_eq!(of(&Method::POST, "/v1/responses/resp_1/cancel"), Some(Resolved::Served));
        assert_eq!(of(&Method::POST, "/v1/sessions/a/b/end"), Some(Resolved::Served));
        assert_eq!(of(&Method::HEAD, "/health"), Some(Resolved::Served));
    }

    #[test]
    fn a_wrong_method_names_every_method_of_the_path_sorted() {
        let wrong = |allow: &str| Some(Resolved::WrongMethod(allow.to_owned()));
        assert_eq!(of(&Method::GET, "/v1/chat/completions"), wrong("POST"));
        assert_eq!(of(&Method::PUT, "/v1/responses/resp_1"), wrong("DELETE,GET"));
        assert_eq!(of(&Method::POST, "/v1/models"), wrong("GET,HEAD"));
        assert_eq!(of(&Method::GET, "/v1/sessions/s/end"), wrong("POST"));
        assert_eq!(of(&Method::DELETE, "/v1/messages/count_tokens"), wrong("POST"));
    }

    #[test]
    fn a_path_no_route_serves_is_no_route() {
        assert_eq!(of(&Method::GET, "/v1/nothing"), Some(Resolved::NoRoute));
        assert_eq!(
            of(&Method::GET, "/v1/models/a/b"),
            Some(Resolved::NoRoute),
            "one segment"
        );
        assert_eq!(of(&Method::GET, "/v1/models/"), Some(Resolved::NoRoute), "not empty");
        assert_eq!(of(&Method::GET, "/v1/models/a{b"), Some(Resolved::NoRoute), "no braces");
        assert_eq!(of(&Method::POST, "/v1/sessions//end"), Some(Resolved::NoRoute));
        assert_eq!(of(&Method::POST, "/v1/chat/completions/"), Some(Resolved::NoRoute));
    }

    #[test]
    fn a_request_without_host_or_with_another_method_is_the_apps() {
        let mut headers = HeaderMap::new();
        let path = "/v1/nothing";
        assert_eq!(resolve_request(&Method::GET, path, &headers), None, "no Host");
        headers.insert(HOST, HeaderValue::from_static("x"));
        assert_eq!(resolve_request(&Method::GET, path, &headers), Some(Resolved::NoRoute));
        let unknown = Method::from_bytes(b"ZZMARKER").unwrap_or_default();
        assert_eq!(resolve_request(&unknown, path, &headers), None);
        assert_eq!(resolve_request(&Method::OPTIONS, path, &headers), None);
    }

    #[test]
    fn a_path_aiohttp_would_decode_or_normalise_is_the_apps() {
        assert_eq!(of(&Method::GET, "/v1/chat%2Fcompletions"), None);
        assert_eq!(of(&Method::GET, "/v1/./chat/completions"), None);
        assert_eq!(of(&Method::GET, "/v1/../health"), None);
        assert_eq!(of(&Method::GET, "/v1/caf\u{e9}"), None);
        assert_eq!(of(&Method::GET, "*"), None);
    }
}
