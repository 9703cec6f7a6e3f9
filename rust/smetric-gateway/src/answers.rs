//! The answers the door writes itself, in the shapes `smetric serve` answers in: a client's
//! mistake is OpenAI's request error (`{"error": {"message", "type": "invalid_request_error",
//! "param": null, "code": null}}`, as the app's `RequestError`), a failure of the proxy's own
//! is `{"error": {"message", "type": <the SDK's class>, "param": null, "code": <status>}}` (the
//! app's `ProxyError`). Every one carries `server: smetric` and a fixed message: no client
//! byte is ever echoed. The messages are the door's constants (nothing in them needs escaping).

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Body as HttpBody, Frame, SizeHint};
use hyper::header::{CONTENT_TYPE, HeaderValue, SERVER};
use hyper::{Response, StatusCode};

/// A body either way through the door: a relayed one or one the door wrote itself.
pub(crate) type Body = BoxBody<Bytes, hyper::Error>;

/// The `Server` field of every answer (no version banner), as the app's.
pub(crate) const SERVER_NAME: &str = "smetric";

/// A malformed request, the one message the app uses for it.
pub(crate) const MALFORMED: &str = "malformed HTTP request";

/// The JSON of a client's mistake.
pub(crate) fn client_error_body(message: &str) -> String {
    debug_assert!(!message.contains(['"', '\\']), "an unescaped constant");
    format!(r#"{{"error":{{"message":"{message}","type":"invalid_request_error","param":null,"code":null}}}}"#)
}

/// Whose error shape the door answers a refused head in: the path's API's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Shape {
    /// `{"error": {...}}`: every path but Anthropic's, and a head whose path was not read.
    OpenAi,
    /// `{"type": "error", "error": {"type", "message"}}`: `/v1/messages` and below.
    Anthropic,
}

impl Shape {
    /// The shape of a request target (None: no request line was read).
    pub(crate) fn of_path(target: Option<&str>) -> Self {
        let path = target.map_or("", |t| t.split(['?', '#']).next().unwrap_or(""));
        match path.strip_prefix("/v1/messages") {
            Some("") => Self::Anthropic,
            Some(rest) if rest.starts_with('/') => Self::Anthropic,
            _ => Self::OpenAi,
        }
    }
}

/// The JSON of a client's mistake in `shape`, for a 4xx `status` (Anthropic's error type of a
/// 4xx that is neither 404 nor 413 is `invalid_request_error`, as the Messages API's).
pub(crate) fn shaped_client_error_body(shape: Shape, status: StatusCode, message: &str) -> String {
    match shape {
        Shape::OpenAi => client_error_body(message),
        Shape::Anthropic => {
            debug_assert!(!message.contains(['"', '\\']), "an unescaped constant");
            let kind = match status.as_u16() {
                404 => "not_found_error",
                413 => "request_too_large",
                _ => "invalid_request_error",
            };
            format!(r#"{{"type":"error","error":{{"type":"{kind}","message":"{message}"}}}}"#)
        }
    }
}

/// The JSON of the proxy's own failure.
pub(crate) fn proxy_error_body(status: StatusCode, message: &str, kind: &str) -> String {
    debug_assert!(
        !format!("{message}{kind}").contains(['"', '\\']),
        "an unescaped constant"
    );
    format!(
        r#"{{"error":{{"message":"{message}","type":"{kind}","param":null,"code":{}}}}}"#,
        status.as_u16()
    )
}

/// A JSON answer through hyper.
pub(crate) fn json_response(status: StatusCode, body: String) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::from(body)).map_err(|never| match never {}).boxed());
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert(SERVER, HeaderValue::from_static(SERVER_NAME));
    response
}

/// A whole JSON answer as bytes, for a connection hyper does not (or no longer) serve; it asks
/// for the connection to close. `extra` are more header lines, each ending in CRLF.
pub(crate) fn raw_json_answer(status: StatusCode, body: &str, extra: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n{extra}\
         connection: close\r\nserver: {SERVER_NAME}\r\n\r\n{body}",
        status.as_u16(),
        status.canonical_reason().unwrap_or(""),
        body.len()
    )
    .into_bytes()
}

/// An answer's body that keeps `G` alive until it is sent (or dropped): a request in flight on
/// its connection, an admission slot.
pub(crate) struct Held<B, G> {
    inner: B,
    _guard: G,
}

impl<B, G> Held<B, G> {
    pub(crate) fn new(inner: B, guard: G) -> Self {
        Self { inner, _guard: guard }
    }
}

impl<B: HttpBody + Unpin, G: Unpin> HttpBody for Held<B, G> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        Pin::new(&mut self.get_mut().inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
