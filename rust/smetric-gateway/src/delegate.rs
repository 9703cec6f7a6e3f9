//! Delegation: a request passed to the control plane as it came, and its answer passed back.
//!
//! The request keeps its method, path and query, headers and body; only the authority changes
//! (the control plane's, never one taken from the request). Both ways drop the hop-by-hop
//! fields of RFC 9110 §7.6.1 and every field a `Connection` header names, since they describe
//! one connection and not the message; hyper frames each side itself. `X-Forwarded-For` gains
//! the client's address, so the control plane still knows who called. Bodies are streamed
//! frame by frame in both directions. A control plane that cannot be reached, or that fails
//! before its answer's head, is a 502 in the shape of the proxy's own failures; a client whose
//! body breaks its framing, a 400 in the shape of a client's mistake ([`crate::answers`]).
//!
//! Complexity: one pass over each side's headers; the bodies cost only the bytes moved.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{CONNECTION, HeaderMap, HeaderName, HeaderValue};
use hyper::http::request::Parts;
use hyper::http::uri::PathAndQuery;
use hyper::{Request, Response, StatusCode, Uri, Version};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use crate::answers::{Body, MALFORMED, client_error_body, json_response, proxy_error_body};
use crate::counters::{ClientError, ClientErrors};
use crate::handoff::GATEWAY_HEADER;
use crate::shared::HOP_BY_HOP;

static FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// Removes the hop-by-hop fields and the fields `Connection` names.
pub(crate) fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(CONNECTION)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
}

/// The control plane behind the door: its address and the kept-alive connections to it.
pub(crate) struct ControlPlane {
    authority: String,
    client: Client<HttpConnector, Body>,
    errors: Arc<ClientErrors>,
    /// The gateway's secret, when the native path is armed: on every delegated request, and
    /// the fields that vouch for a request (`x-smetric-gateway*`) only from the gateway.
    secret: Option<HeaderValue>,
}

impl ControlPlane {
    pub(crate) fn new(address: SocketAddr, errors: Arc<ClientErrors>, secret: Option<HeaderValue>) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        Self {
            authority: address.to_string(),
            client: Client::builder(TokioExecutor::new()).build(connector),
            errors,
            secret,
        }
    }

    pub(crate) fn errors(&self) -> &ClientErrors {
        &self.errors
    }

    /// Passes `request` (from `peer`) to the control plane, with the `extra` fields, and returns
    /// its answer, streamed.
    pub(crate) async fn delegate(
        &self,
        request: Request<Incoming>,
        peer: SocketAddr,
        extra: &[(&'static str, &str)],
    ) -> Response<Body> {
        let (parts, body) = request.into_parts();
        // A failure of the client's own body (a bad chunk, a connection cut mid-body) surfaces
        // as the delegation's failure: the flag tells the two apart.
        let client_body_failed = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&client_body_failed);
        let body = body
            .map_err(move |e| {
                flag.store(true, Ordering::Relaxed);
                e
            })
            .boxed();
        self.send(parts, body, peer, extra, &client_body_failed).await
    }

    /// Passes a request whose body the gateway has read (`raw`) to the control plane.
    pub(crate) async fn delegate_bytes(
        &self,
        parts: Parts,
        raw: Bytes,
        peer: SocketAddr,
        extra: &[(&'static str, &str)],
    ) -> Response<Body> {
        let mut parts = parts;
        parts.headers.remove(hyper::header::CONTENT_LENGTH); // hyper frames the bytes it is given
        let body = Full::new(raw).map_err(|never| match never {}).boxed();
        self.send(parts, body, peer, extra, &AtomicBool::new(false)).await
    }

    async fn send(
        &self,
        mut parts: Parts,
        body: Body,
        peer: SocketAddr,
        extra: &[(&'static str, &str)],
        client_body_failed: &AtomicBool,
    ) -> Response<Body> {
        let path = parts.uri.path_and_query().map_or("/", PathAndQuery::as_str);
        let Ok(uri) = Uri::builder()
            .scheme("http")
            .authority(self.authority.as_str())
            .path_and_query(path)
            .build()
        else {
            return json_response(StatusCode::BAD_REQUEST, client_error_body(MALFORMED));
        };
        parts.uri = uri;
        parts.version = Version::HTTP_11;
        strip_hop_by_hop(&mut parts.headers);
        let client = peer.ip().to_string();
        let forwarded = match parts.headers.get(&FORWARDED_FOR).and_then(|v| v.to_str().ok()) {
            Some(earlier) => format!("{earlier}, {client}"),
            None => client,
        };
        if let Ok(value) = HeaderValue::from_str(&forwarded) {
            parts.headers.insert(FORWARDED_FOR.clone(), value);
        }
        if let Some(secret) = &self.secret {
            let vouching: Vec<HeaderName> = parts
                .headers
                .keys()
                .filter(|name| name.as_str().starts_with(GATEWAY_HEADER))
                .cloned()
                .collect();
            for name in vouching {
                parts.headers.remove(name);
            }
            parts.headers.insert(GATEWAY_HEADER, secret.clone());
            for (name, value) in extra {
                if let Ok(value) = HeaderValue::from_str(value) {
                    parts.headers.append(*name, value);
                }
            }
        }
        match self.client.request(Request::from_parts(parts, body)).await {
            Ok(answer) => {
                let (mut parts, body) = answer.into_parts();
                strip_hop_by_hop(&mut parts.headers);
                Response::from_parts(parts, body.boxed())
            }
            Err(_) if client_body_failed.load(Ordering::Relaxed) => {
                self.errors.count(ClientError::Malformed);
                let mut answer = json_response(StatusCode::BAD_REQUEST, client_error_body(MALFORMED));
                answer
                    .headers_mut()
                    .insert(CONNECTION, HeaderValue::from_static("close"));
                answer
            }
            Err(_) => {
                let status = StatusCode::BAD_GATEWAY;
                let message = "the proxy's control plane could not be reached";
                json_response(status, proxy_error_body(status, message, "BadGatewayError"))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_fields_and_the_ones_connection_names_are_dropped() {
        let mut headers = HeaderMap::new();
        for (name, value) in [
            ("connection", "keep-alive, X-Secret"),
            ("x-secret", "1"),
            ("te", "trailers"),
            ("transfer-encoding", "chunked"),
            ("keep-alive", "timeout=5"),
            ("content-type", "application/json"),
            ("authorization", "Bearer k"),
        ] {
            headers.append(name, HeaderValue::from_static(value));
        }
        strip_hop_by_hop(&mut headers);
        let mut left: Vec<&str> = headers.keys().map(HeaderName::as_str).collect();
        left.sort_unstable();
        assert_eq!(left, ["authorization", "content-type"]);
    }
}
