//! Requests the native path serves without a routing decision (`open_unrouted` and
//! `apis/passthrough.py` of the app, whose rules these are): vLLM's surface that leaves no KV
//! state a later request could reuse (`POST /v1/embeddings`, `/tokenize`, `/detokenize`,
//! `/v1/rerank`, `/v1/score`, `/pooling`, `GET /v1/models/{id}`), forwarded byte for byte to the
//! least-loaded eligible instance, Anthropic's `POST /v1/messages/count_tokens` (validated as the
//! app validates it, then likewise), and a stored response's own routes (`GET` and `DELETE
//! /v1/responses/{id}`, `POST /v1/responses/{id}/cancel`), sent to the instance that stored it
//! with the engine's own id, the answer's ids rewritten to the proxy's.
//!
//! Each attempt: the fleet's exclusions (the model's instances, ejected ones a last resort, the
//! failed ones, full ones once admission holds an instance's share), the least in flight among
//! the rest (the fleet's order breaks ties), no lifecycle on the load board; a failure before the
//! client's first byte goes through `failover.rs` as a routed attempt's does. The decision
//! header says `reason=pass-through`. A stream is relayed as it comes (a stored response's
//! scanned for its ids); its record is left at its head.
//!
//! An id the proxy did not issue is answered here with the Responses adapter's 404, an id whose
//! instance left the fleet with the failover's lost-state 404, and a path
//! no route serves with the pass-through 404 ([`Native::no_route`]). Left to the app: an end
//! header, session headers that are not UTF-8, a body that escapes a lone surrogate, a model the
//! fleet does not serve (its 404), and PD mode.
//! O(instances) per attempt.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http_body_util::channel::Channel;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::HeaderValue;
use hyper::http::request::Parts;
use hyper::{Method, Response, StatusCode};
use smetric_vllm::lone_surrogate::escapes_lone_surrogate;

use super::attempt::{client_head, is_event_stream, request_id};
use super::failover::{AfterFailure, Tried, lost_state, no_instance};
use super::intake::has_long_digit_run;
use super::messages::{MESSAGES, count_tokens_model, count_tokens_refusal};
use super::openai::CHAT;
use super::protocol::{Protocol, Unplanned};
use super::response_ids::ResponseIds;
use super::responses::RESPONSES;
use super::state::{Native, NativeApis, Routing};
use crate::answers::{Body, json_response};
use crate::delegate::ControlPlane;
use crate::handoff::ADMITTED_HEADER;
use crate::records::Record;
use crate::shared::NO_ROUTE;

/// vLLM's `POST` routes forwarded unrouted (`passthrough.FORWARDED`).
const FORWARDED_POSTS: [&str; 6] = [
    "/v1/embeddings",
    "/tokenize",
    "/detokenize",
    "/v1/rerank",
    "/v1/score",
    "/pooling",
];

/// Anthropic's token count: validated, not routed (the engine counts with its own rendering).
const COUNT_TOKENS_PATH: &str = "/v1/messages/count_tokens";

/// What an unrouted request is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Unrouted {
    /// vLLM's surface, forwarded as it is.
    PassThrough,
    /// `POST /v1/messages/count_tokens`: validated as the app validates it, counted by an engine.
    CountTokens,
    /// A stored response's route: the proxy's id, and the engine path's suffix after it
    /// (`""`, or `/cancel`).
    Stored { id: String, suffix: &'static str },
}

impl Unrouted {
    /// The unrouted request `method` `path` is, or None (not one the native path serves).
    /// `responses`: the Responses API is served natively.
    pub(crate) fn of(method: &Method, path: &str, apis: NativeApis) -> Option<Self> {
        if *method == Method::POST && FORWARDED_POSTS.contains(&path) {
            return Some(Self::PassThrough);
        }
        if *method == Method::POST && path == COUNT_TOKENS_PATH && apis.messages {
            return Some(Self::CountTokens);
        }
        if *method == Method::GET
            && let Some(id) = path.strip_prefix("/v1/models/")
            && segment(id)
        {
            return Some(Self::PassThrough);
        }
        let rest = path.strip_prefix("/v1/responses/").filter(|_| apis.responses)?;
        let stored = |id: &str, suffix| {
            segment(id).then(|| Self::Stored {
                id: id.to_owned(),
                suffix,
            })
        };
        match (method, rest.strip_suffix("/cancel")) {
            (&Method::POST, Some(id)) => stored(id, "/cancel"),
            (&Method::GET | &Method::DELETE, None) => stored(rest, ""),
            _ => None,
        }
    }

    /// The API whose error shape it is answered in (OpenAI's either way).
    pub(crate) fn shape(&self) -> &'static dyn Protocol {
        self.api().1
    }

    /// The API its record and error shape are the app's of.
    fn api(&self) -> (&'static str, &'static dyn Protocol) {
        match self {
            Self::PassThrough => ("passthrough", &CHAT),
            Self::CountTokens => ("messages", &MESSAGES),
            Self::Stored { .. } => ("responses", &RESPONSES),
        }
    }
}

/// The Responses adapter's answer to an id the proxy did not issue (`responses._not_found`:
/// vLLM's words for an id its store does not hold).
pub(super) fn not_issued(id: &str) -> Response<Body> {
    RESPONSES.client_error(
        StatusCode::NOT_FOUND,
        &format!("Response with id '{id}' not found."),
        None,
        Some("response_id"),
    )
}

/// One URL path segment as the app's routes match `{name}`: not empty, no `/`.
fn segment(text: &str) -> bool {
    !text.is_empty() && !text.contains('/')
}

/// The body's `model` when it is a JSON object naming one (`passthrough._model_of`).
fn model_of(raw: &[u8]) -> Option<String> {
    if !raw.trim_ascii_start().starts_with(b"{") {
        return None;
    }
    let value: serde_json::Value = serde_json::from_slice(raw).ok()?;
    value.get("model")?.as_str().map(str::to_owned)
}

impl Native {
    /// Serves an unrouted request (see the module docs).
    #[allow(clippy::too_many_arguments)] // one request's parts, all needed on every path
    pub(super) async fn serve_unrouted(
        self: &Arc<Self>,
        plane: &Arc<ControlPlane>,
        target: Unrouted,
        parts: Parts,
        body: Incoming,
        peer: SocketAddr,
        arrived: Instant,
    ) -> Response<Body> {
        let (name, api) = target.api();
        let raw = match self.read_body(body).await {
            Ok(raw) => raw,
            Err(failure) => return self.body_failure(plane, api, failure),
        };
        let fleet = self.fleet();
        let delegate = !matches!(self.config.routing, Routing::Colocated(_))
            || !super::intake::session_headers_utf8(&parts.headers)
            || super::intake::session_end(&parts.headers) != Ok(false)
            || escapes_lone_surrogate(&raw);
        let model = match target {
            Unrouted::PassThrough => model_of(&raw),
            // A body the app must refuse (its 400 names the field) is its to answer.
            Unrouted::CountTokens if has_long_digit_run(&raw) => None,
            Unrouted::CountTokens => match count_tokens_model(&raw) {
                Some(model) => Some(model),
                None => match count_tokens_refusal(&raw) {
                    // Its validation's 400, answered as the app words it.
                    Some(Unplanned::Refused { message, param, .. }) if !delegate => {
                        let answer = MESSAGES.client_error(StatusCode::BAD_REQUEST, &message, None, param);
                        return self.refused(MESSAGES.name(), &parts.headers, None, answer, arrived);
                    }
                    _ => return plane.delegate_bytes(parts, raw, peer, &[(ADMITTED_HEADER, "1")]).await,
                },
            },
            Unrouted::Stored { .. } => None,
        };
        if target == Unrouted::CountTokens && model.is_none() {
            return plane.delegate_bytes(parts, raw, peer, &[(ADMITTED_HEADER, "1")]).await;
        }
        let unknown = model
            .as_deref()
            .is_some_and(|m| !fleet.models.is_empty() && !fleet.models.contains_key(m));
        // A stored response's instance, and the engine's path.
        let (pinned, path) = match &target {
            Unrouted::PassThrough | Unrouted::CountTokens => {
                (None, parts.uri.path_and_query().map_or("/", |p| p.as_str()).to_owned())
            }
            Unrouted::Stored { id, suffix } => {
                // The id opened once (a mac check), then its instance looked up.
                let opened = self.response_ids.open(id).map(|(engine_id, tag)| {
                    let instance = fleet.instances.iter().find(|u| ResponseIds::tag(u) == tag);
                    (instance.cloned(), engine_id.to_owned())
                });
                let Some((Some(instance), engine_id)) = opened else {
                    if delegate || id.contains('%') {
                        return plane.delegate_bytes(parts, raw, peer, &[(ADMITTED_HEADER, "1")]).await;
                    }
                    // An id this key never issued: the Responses adapter's 404 at parse time,
                    // before anything else of the request counts; one whose instance left the
                    // fleet: the failover's lost-state 404.
                    let answer = if opened.is_none() {
                        not_issued(id)
                    } else {
                        lost_state(None)
                    };
                    return self.refused(RESPONSES.name(), &parts.headers, None, answer, arrived);
                };
                let query = match (&parts.method, parts.uri.query()) {
                    (&Method::GET, Some(query)) => format!("?{query}"),
                    _ => String::new(),
                };
                (Some(instance), format!("/v1/responses/{engine_id}{suffix}{query}"))
            }
        };
        if delegate || unknown {
            return plane.delegate_bytes(parts, raw, peer, &[(ADMITTED_HEADER, "1")]).await;
        }
        let id = request_id(&parts.headers);
        let mut record = Record {
            request_id: id.clone(),
            api: name,
            session: super::intake::header_session(&parts.headers),
            model,
            ..Record::default()
        };
        let mut tried = Tried::default();
        loop {
            let fleet = self.fleet();
            let first_attempt = tried.instances().is_empty();
            let exclude = match &pinned {
                Some(instance) if !first_attempt => {
                    let answer = lost_state(Some((instance, tried.last_cause())));
                    return self.failure_answer(record, arrived, false, answer);
                }
                Some(instance) => Some(fleet.instances.iter().filter(|u| *u != instance).cloned().collect()),
                None => fleet.exclusions(record.model.as_deref(), tried.instances(), None),
            };
            let Some(mut exclude) = exclude else {
                return self.failure_answer(record, arrived, false, no_instance(api, tried.instances()));
            };
            if pinned.is_none() {
                exclude = self.without_full(&fleet.instances, exclude);
            }
            let least = fleet
                .instances
                .iter()
                .filter(|u| !exclude.contains(u))
                .min_by_key(|u| self.config.routing.in_flight(u).unwrap_or(0));
            let Some(instance) = least.cloned() else {
                return self.failure_answer(record, arrived, false, no_instance(api, tried.instances()));
            };
            record.instance = Some(instance.clone());
            record.attempts += 1;
            let header = format!("instance={instance}; reason=pass-through; attempt={}", record.attempts);
            let header = HeaderValue::from_str(&header).unwrap_or_else(|_| HeaderValue::from_static("unrenderable"));
            let mut upstream = self.upstream_request(api, &instance, &parts.headers, &id, raw.clone());
            *upstream.method_mut() = parts.method.clone();
            *upstream.uri_mut() = format!("{instance}{path}").parse().unwrap_or_default();
            let sent = Instant::now();
            let (cause, status) = 'attempt: {
                let answer = match self.send(upstream).await {
                    Ok(answer) => answer,
                    Err(failure) => break 'attempt failure,
                };
                self.answered_after(&mut record, &mut tried);
                let (mut head, upstream_body) = answer.into_parts();
                client_head(&mut head.headers, header, None, &id);
                let streamed = is_event_stream(&head.headers);
                record.status = head.status.as_u16();
                record.first_byte_s = Some(sent.elapsed().as_secs_f64());
                if streamed {
                    // Relayed as it comes; the record is left at the head.
                    record.succeeded = true;
                    record.latency_s = arrived.elapsed().as_secs_f64();
                    self.instance_succeeded(&instance);
                    self.settle(record, false);
                    let body = match &target {
                        Unrouted::Stored { .. } => self.rewritten_stream(api, &instance, upstream_body),
                        _ => upstream_body.boxed(),
                    };
                    return Response::from_parts(head, body);
                }
                let whole = match self.whole_body(upstream_body).await {
                    Ok(whole) => whole,
                    Err(failure) => break 'attempt failure,
                };
                record.succeeded = true;
                record.latency_s = arrived.elapsed().as_secs_f64();
                self.instance_succeeded(&instance);
                self.settle(record, false);
                let whole = match &target {
                    Unrouted::Stored { .. } => api.relay_whole(&self.response_ids, whole, &instance),
                    _ => whole,
                };
                return Response::from_parts(head, Full::new(whole).map_err(|never| match never {}).boxed());
            };
            match self.attempt_failed(api, &mut record, &mut tried, &instance, cause, status) {
                AfterFailure::Retry => {}
                AfterFailure::Answer(answer) => return self.failure_answer(record, arrived, false, answer),
            }
        }
    }

    /// A path no route serves, as the app answers it (`passthrough.parse_route` of its catch-all
    /// route): the body read as every request's (413 and 408 as the app's), then the 404 naming
    /// the path, recorded as a pass-through request without a decision.
    pub(super) async fn no_route(
        self: &Arc<Self>,
        plane: &Arc<ControlPlane>,
        parts: Parts,
        body: Incoming,
        arrived: Instant,
    ) -> Response<Body> {
        if let Err(failure) = self.read_body(body).await {
            return self.body_failure(plane, &CHAT, failure);
        }
        let message = NO_ROUTE.replace("{path}", parts.uri.path());
        let answer = json_response(
            StatusCode::NOT_FOUND,
            serde_json::json!({"error": {"message": message, "type": "NotFoundError", "param": null, "code": "not_found"}})
                .to_string(),
        );
        self.refused("passthrough", &parts.headers, None, answer, arrived)
    }

    /// A stored response's event stream with the engine's ids rewritten to the proxy's.
    fn rewritten_stream(&self, api: &'static dyn Protocol, instance: &str, upstream: Incoming) -> Body {
        let mut scan = api.scanner(&self.response_ids, false, instance);
        let (mut tx, body) = Channel::<Bytes, hyper::Error>::new(8);
        tokio::spawn(async move {
            let mut upstream = upstream;
            while let Some(Ok(frame)) = upstream.frame().await {
                if let Ok(data) = frame.into_data() {
                    let out = scan.feed(data);
                    if !out.is_empty() && tx.send_data(out).await.is_err() {
                        return; // the client left: dropping the upstream closes it
                    }
                }
            }
        });
        body.boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_unrouted_routes_are_the_apps() {
        let all = NativeApis {
            chat: true,
            completions: true,
            messages: true,
            responses: true,
        };
        let of = |method: Method, path: &str| Unrouted::of(&method, path, all);
        assert_eq!(of(Method::POST, "/v1/embeddings"), Some(Unrouted::PassThrough));
        assert_eq!(of(Method::GET, "/v1/models/m"), Some(Unrouted::PassThrough));
        assert_eq!(of(Method::GET, "/v1/models/"), None);
        assert_eq!(of(Method::GET, "/v1/models/a/b"), None);
        assert_eq!(
            of(Method::GET, "/v1/embeddings"),
            None,
            "a wrong method is the app's 405"
        );
        let stored = |suffix| {
            Some(Unrouted::Stored {
                id: "r".to_owned(),
                suffix,
            })
        };
        assert_eq!(of(Method::GET, "/v1/responses/r"), stored(""));
        assert_eq!(of(Method::DELETE, "/v1/responses/r"), stored(""));
        assert_eq!(of(Method::POST, "/v1/responses/r/cancel"), stored("/cancel"));
        assert_eq!(of(Method::POST, "/v1/responses/r"), None);
        assert_eq!(of(Method::GET, "/v1/responses/r/cancel"), None);
        assert_eq!(
            of(Method::POST, "/v1/messages/count_tokens"),
            Some(Unrouted::CountTokens)
        );
        let none = NativeApis::default();
        assert_eq!(
            Unrouted::of(&Method::GET, "/v1/responses/r", none),
            None,
            "Responses not armed"
        );
        assert_eq!(Unrouted::of(&Method::POST, "/v1/messages/count_tokens", none), None);
    }

    #[test]
    fn the_model_is_read_only_from_a_json_object() {
        assert_eq!(model_of(br#" {"model": "m", "input": "x"}"#).as_deref(), Some("m"));
        assert_eq!(model_of(br#"{"model": 3}"#), None);
        assert_eq!(model_of(br#"["model"]"#), None);
        assert_eq!(model_of(b"{not json"), None);
    }
}
