//! One request on the native path, from admission to its last byte (the steps of the module
//! docs of [`crate::native`]): [`serve`].

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use http_body_util::channel::{Channel, Sender};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{HeaderMap, HeaderValue};
use hyper::http::request::Parts;
use hyper::{Request, Response, StatusCode};
use smetric_core::{Decision, Prompt, RequestId, RouteRequest, TurnHint};
use smetric_vllm::cache_namespace;
use smetric_vllm::lone_surrogate::escapes_lone_surrogate;

use super::apis;
use super::attempt::{
    GatedSession, Lifecycle, REQUEST_ID, affinity_instance, affinity_set_cookie, client_head, is_event_stream,
    request_id,
};
use super::continuation::{Continued, Rejoin};
use super::failover::{AfterFailure, Tried, lost_state, no_instance};
use super::intake::{has_long_digit_run, header, header_session, parent_key, session_end, session_headers_utf8};
use super::openai::CHAT;
use super::pd::PrefillLeg;
use super::protocol::{Ids, Plan, Protocol, StreamScan, Unplanned};
use super::response_ids::ResponseIds;
use super::responses::{self, RESPONSES};
use super::routes::{self, Resolved};
use super::secret::same_bytes;
use super::session_end::{EndRequest, ended_session, invalid_session_id};
use super::state::{FleetView, Native, Routing};
use super::unrouted::{Unrouted, not_issued};
use crate::admission::{Refusal, Slot};
use crate::answers::{Body, Held};
use crate::counters::ClientError;
use crate::delegate::ControlPlane;
use crate::handoff::{ADMITTED_HEADER, REFUSED_HEADER, TURN_HEADER};
use crate::records::Record;
use crate::session_gate::{GateRefusal, SessionGate};
use crate::tokens::{TokenSource, with_encode_budget};

/// The paths whose requests the app serves without admission: its own fixed routes.
const UNADMITTED_PATHS: [&str; 4] = ["/health", "/metrics", "/v1/models", "/admin/instances"];

/// Whether the app serves `path` without admission: its fixed routes, and the session-end
/// endpoints (`POST /v1/sessions/{id}/end`, vllm-router's `POST /finish_session`): releasing a
/// session's state is cheap, and must not wait for, or be refused by, a full fleet.
fn unadmitted(path: &str) -> bool {
    UNADMITTED_PATHS.contains(&path) || path.starts_with("/v1/sessions/") || path == "/finish_session"
}

// The session, parent and end headers (a request carrying an end header is the app's: it
// releases the session's state), the cut stream's message and the usage splice: `crate::shared`.
use crate::shared::{
    BAD_END_HEADER, CUT_MESSAGE, ECHOED_CHARS, END_WITHOUT_SESSION, IDS_ONLY, PARENT_HEADERS, REFUSED_AT_CAPACITY,
    REFUSED_DRAINING, REFUSED_QUEUE_TIMEOUT, USAGE_OPTION,
};

/// Text the tokenizer may encode on the runtime's thread while a body is planned there, bytes:
/// ≈ 700 tokens, ≈ 0.5 ms of the library's work (32K tokens took ≈ 30 ms); a body with more
/// to encode is planned on the blocking pool (`Native::plan`).
const INLINE_ENCODE_BYTES: usize = 2 * 1024;

/// The largest body planned on the runtime's thread: its render alone is O(body) (≈ 0.1 ms for
/// a 100 KB, 32K-token conversation), so a far longer one goes to the blocking pool.
const INLINE_PLAN_MAX_BODY_BYTES: usize = 512 * 1024;

/// An API the native path serves (`protocol.rs`; the registry is `apis.rs`).
type Api = &'static dyn Protocol;

/// Serves one request at the door: admitted (or refused through the app), then natively or
/// delegated; the slot is held until the answer's last byte.
pub(crate) async fn serve(
    native: Arc<Native>,
    plane: Arc<ControlPlane>,
    request: Request<Incoming>,
    peer: SocketAddr,
) -> Response<Body> {
    let arrived = Instant::now();
    let route = routes::resolve_request(request.method(), request.uri().path(), request.headers());
    // A wrong method is answered before admission, as the app's router answers it (no slot, no
    // record); a request whose key the app would refuse first is left to it.
    if let Some(Resolved::WrongMethod(allow)) = &route
        && key_valid(&native.config.client_keys, request.headers())
    {
        plane.errors().count(ClientError::WrongMethod);
        return routes::wrong_method(request.uri().path(), allow);
    }
    if let Some(end) = ended_session(request.method(), request.uri())
        && key_valid(&native.config.client_keys, request.headers())
    {
        return match end {
            EndRequest::End(id) => native.end_endpoint(&id, request.headers()),
            EndRequest::Invalid(problem) => {
                plane.errors().count(ClientError::SessionId);
                invalid_session_id(&problem)
            }
        };
    }
    if unadmitted(request.uri().path()) {
        return plane.delegate(request, peer, &[]).await;
    }
    let slot = match native.admission.enter().await {
        Ok(slot) => slot,
        Err(refusal) => {
            // A path the native path serves is refused here, in its API's shape: a burst past
            // the queue costs no round trip through the app (each refusal handed over held a
            // connection and the app's memory for it). Other paths: the app renders the refusal.
            if let Some(api) = apis::served(native.config.apis, request.method(), request.uri().path()) {
                return door_refusal(&native, api, request.headers(), refusal, arrived);
            }
            return plane
                .delegate(request, peer, &[(REFUSED_HEADER, refusal.reason())])
                .await;
        }
    };
    let answer = match apis::served(native.config.apis, request.method(), request.uri().path()) {
        Some(api) if head_servable(&native, request.headers()) => {
            let (parts, body) = request.into_parts();
            let deadline = tokio::time::Instant::from_std(arrived + native.config.client_timeout);
            let served = Native::serve(&native, &plane, api, parts, body, peer, arrived, deadline);
            match tokio::time::timeout_at(deadline, served).await {
                Ok(answer) => answer,
                Err(_) => api.proxy_error(504, TIMED_OUT, "TimeoutError"),
            }
        }
        _ => match Unrouted::of(request.method(), request.uri().path(), native.config.apis) {
            Some(target) if head_servable(&native, request.headers()) => {
                let (parts, body) = request.into_parts();
                let deadline = tokio::time::Instant::from_std(arrived + native.config.client_timeout);
                let shape = target.shape();
                let served = native.serve_unrouted(&plane, target, parts, body, peer, arrived);
                match tokio::time::timeout_at(deadline, served).await {
                    Ok(answer) => answer,
                    Err(_) => shape.proxy_error(504, TIMED_OUT, "TimeoutError"),
                }
            }
            // A path no route serves: the pass-through API's 404, once its body is read.
            _ if route == Some(Resolved::NoRoute)
                && head_servable(&native, request.headers())
                && session_end(request.headers()).is_ok()
                && session_headers_utf8(request.headers()) =>
            {
                let (parts, body) = request.into_parts();
                let deadline = tokio::time::Instant::from_std(arrived + native.config.client_timeout);
                match tokio::time::timeout_at(deadline, native.no_route(&plane, parts, body, arrived)).await {
                    Ok(answer) => answer,
                    Err(_) => CHAT.proxy_error(504, TIMED_OUT, "TimeoutError"),
                }
            }
            _ => plane.delegate(request, peer, &[(ADMITTED_HEADER, "1")]).await,
        },
    };
    held(answer, slot)
}

/// The door's refusal of a request of `api`, as the app answers one (`admission.refusal_error`:
/// a full queue 429 `RateLimitError`, a wait past the queue's timeout or a draining proxy 503),
/// with `Retry-After`, recorded for the app's telemetry and decision log.
fn door_refusal(native: &Native, api: Api, headers: &HeaderMap, refusal: Refusal, arrived: Instant) -> Response<Body> {
    let limits = &native.config.admission;
    let (status, message, kind) = match refusal {
        Refusal::QueueFull => {
            let door = native.admission.snapshot();
            let message = REFUSED_AT_CAPACITY
                .replace("{admitted}", &door.admitted.to_string())
                .replace("{queued}", &door.queued.to_string());
            (429, message, "RateLimitError")
        }
        Refusal::QueueTimeout => {
            let seconds = limits.queue_timeout.as_secs_f64().to_string();
            (
                503,
                REFUSED_QUEUE_TIMEOUT.replace("{seconds}", &seconds),
                "ServiceUnavailableError",
            )
        }
        Refusal::Draining => (503, REFUSED_DRAINING.to_owned(), "ServiceUnavailableError"),
    };
    let mut answer = api.proxy_error(status, &message, kind);
    answer
        .headers_mut()
        .insert(hyper::header::RETRY_AFTER, HeaderValue::from(limits.retry_after_s));
    native.records.push(Record {
        request_id: request_id(headers),
        api: api.name(),
        session: header_session(headers),
        status: answer.status().as_u16(),
        refused: Some(refusal.reason()),
        latency_s: arrived.elapsed().as_secs_f64(),
        ..Record::default()
    });
    answer
}

/// Ids mode's refusal of a request without token ids (`TokenSource.routing_tokens`): it names
/// the prompt of completions and the messages of the conversation APIs (their chat form).
fn ids_only_refusal(api: Api) -> Unplanned {
    let param = if api.name() == "completions" {
        "prompt"
    } else {
        "messages"
    };
    Unplanned::refused(IDS_ONLY, Some(param))
}

/// A Responses body's `previous_response_id` when this key did not issue it.
fn unissued_previous(native: &Native, api: Api, raw: &[u8]) -> Option<String> {
    if api.name() != RESPONSES.name() {
        return None;
    }
    let body: serde_json::Value = serde_json::from_slice(raw).ok()?;
    let id = body.get("previous_response_id")?.as_str()?;
    native.response_ids.open(id).is_none().then(|| id.to_owned())
}

/// The answer, holding the slot until its body is sent or dropped.
fn held(answer: Response<Body>, slot: Slot) -> Response<Body> {
    answer.map(|body| Held::new(body, slot).boxed())
}

/// Whether the request's head is one the native path serves: an identity body of a size it
/// accepts, and a valid client key when keys are on (the app answers the rest).
fn head_servable(native: &Native, headers: &HeaderMap) -> bool {
    let identity = headers.get(hyper::header::CONTENT_ENCODING).is_none_or(|v| {
        v.to_str()
            .is_ok_and(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "" | "identity"))
    });
    let sized = headers
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<usize>().ok())
        .is_none_or(|n| n <= native.config.max_body_bytes);
    identity && sized && key_valid(&native.config.client_keys, headers)
}

/// The key a request presents (`Authorization: Bearer`, else `x-api-key`) is a configured one;
/// no keys configured: every request is valid. Compared in time independent of where a key
/// differs.
fn key_valid(keys: &[String], headers: &HeaderMap) -> bool {
    if keys.is_empty() {
        return true;
    }
    let bearer = headers
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            let (scheme, token) = v.trim().split_once(' ')?;
            (scheme.eq_ignore_ascii_case("bearer") && !token.trim().is_empty()).then(|| token.trim())
        });
    let presented = bearer.or_else(|| {
        headers
            .get("x-api-key")
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|k| !k.is_empty())
    });
    let Some(presented) = presented else { return false };
    keys.iter().fold(false, |found, key| {
        found | same_bytes(key.as_bytes(), presented.as_bytes())
    })
}

impl Native {
    #[allow(clippy::too_many_arguments)] // one request's parts, all needed on every path
    async fn serve(
        self: &Arc<Self>,
        plane: &Arc<ControlPlane>,
        api: Api,
        parts: Parts,
        body: Incoming,
        peer: SocketAddr,
        arrived: Instant,
        deadline: tokio::time::Instant,
    ) -> Response<Body> {
        let raw = match self.read_body(body).await {
            Ok(raw) => raw,
            Err(failure) => return self.body_failure(plane, api, failure),
        };
        let fleet = self.fleet();
        let mut plan = match self.plan(&fleet, api, &parts.headers, &raw).await {
            Ok(plan) => plan,
            // The adapter opens a stored response's id once its field checks pass, before it
            // converts the input: an id it never issued is that 404 (unless the app refuses the
            // request before it parses: an end header it cannot read, digits CPython will not).
            Err(Unplanned::App)
                if let Some(id) = unissued_previous(self, api, &raw)
                    && responses::fields_parse(&raw)
                    && session_end(&parts.headers).is_ok()
                    && !has_long_digit_run(&raw) =>
            {
                return self.refused(api.name(), &parts.headers, None, not_issued(&id), arrived);
            }
            Err(Unplanned::App) => return plane.delegate_bytes(parts, raw, peer, &[(ADMITTED_HEADER, "1")]).await,
            // The Responses adapter opens a stored response's id while parsing, before the
            // model is checked: an id it never issued is that 404.
            Err(Unplanned::UnknownModel(_)) if let Some(id) = unissued_previous(self, api, &raw) => {
                return self.refused(api.name(), &parts.headers, None, not_issued(&id), arrived);
            }
            Err(Unplanned::UnknownModel(model)) => return self.unknown_model(api, &parts.headers, &model, arrived),
            Err(Unplanned::Refused { message, param, code }) => {
                let answer = api.client_error(StatusCode::BAD_REQUEST, &message, code, param);
                return self.refused(api.name(), &parts.headers, None, answer, arrived);
            }
            Err(Unplanned::BadEndHeader(name)) => {
                plane.errors().count(ClientError::SessionEndHeader);
                let message = BAD_END_HEADER.replace("{name}", name);
                let answer = api.client_error(StatusCode::BAD_REQUEST, &message, Some("invalid_session_end"), None);
                return self.refused(api.name(), &parts.headers, None, answer, arrived);
            }
            Err(Unplanned::Unrenderable { message, .. }) => {
                // Refused before it was prepared: the app's record names no model.
                let answer = api.client_error(StatusCode::BAD_REQUEST, message, None, Some("messages"));
                return self.refused(api.name(), &parts.headers, None, answer, arrived);
            }
        };
        let id = request_id(&parts.headers);
        let mut record = Record {
            request_id: id.clone(),
            api: api.name(),
            session: plan.session.clone(),
            parent: PARENT_HEADERS
                .iter()
                .find_map(|h| header(&parts.headers, h))
                .map(str::to_owned),
            model: plan.model.clone(),
            prompt_tokens: Some(plan.ids.len() as u64),
            tokens_source: Some(plan.source),
            // The session the request ends: its header's, else its body's hint (completions).
            end_key: plan
                .ends_session
                .then(|| plan.session.clone().or_else(|| plan.turn_key.clone()))
                .flatten(),
            ..Record::default()
        };
        // A follow-up of a stored response: only the instance that stored it can serve it,
        // ejected or not (`failover`'s pin); an instance that left the fleet, the lost-state 404
        // once the turn is counted (as the app's failover answers it). PD mode is the app's.
        let mut left_fleet = false;
        let pinned = match plan.previous_response.as_deref() {
            None => None,
            // The id is opened once (a mac check): an id this key never issued is the adapter's
            // 404 while parsing the body, before any turn or decision counts.
            Some(id) => match self.response_ids.open(id) {
                None => return self.refused(api.name(), &parts.headers, None, not_issued(id), arrived),
                Some((engine_id, tag)) => {
                    let instance = fleet.instances.iter().find(|u| ResponseIds::tag(u) == tag);
                    match (instance, &self.config.routing) {
                        (Some(instance), Routing::Colocated(_)) => Some((instance.clone(), engine_id.to_owned())),
                        (None, Routing::Colocated(_)) => {
                            left_fleet = true;
                            None
                        }
                        _ => return plane.delegate_bytes(parts, raw, peer, &[(ADMITTED_HEADER, "1")]).await,
                    }
                }
            },
        };
        // llm-d's session cookie names the session's instance (the previous one to the policy).
        let cookie_policy = self.config.routing.session_cookie();
        let previous = if cookie_policy {
            match affinity_instance(&parts.headers) {
                Ok(previous) => previous,
                Err(()) => return plane.delegate_bytes(parts, raw, peer, &[(ADMITTED_HEADER, "1")]).await,
            }
        } else {
            None
        };
        // A hinted request without messages: its turn is the session table's count (counted
        // once: what is handed to the app from here on carries it).
        if let Some(key) = plan.turn_key.as_deref() {
            let turn = self.config.sessions.next_turn(key.as_bytes(), None);
            plan.turn = TurnHint::Turn(turn);
            record.turn = Some(turn);
        }
        if left_fleet {
            let answer = lost_state(None);
            return self.failure_answer(record, arrived, plan.ends_session, answer);
        }
        // vllm-router's hash policies hash the header session hint (as the app's
        // `session_hint`, through `RequestId::from_name` as its binding does), else the prompt.
        let session_key = (self.config.routing.hashes_session())
            .then(|| plan.session.as_deref().map(|key| RequestId::from_name(key).0))
            .flatten();
        let prompt_tokens = plan.ids.len() as u64;
        // A stream asks for its usage (the realized hit), unless the body did.
        let body = match &pinned {
            // The engine knows the stored response by its own id.
            Some((_, engine_id)) => match api.pinned_body(&raw, engine_id) {
                Some(body) => body,
                None => return self.delegate_counted(plane, parts, raw, peer, record.turn, &[]).await,
            },
            None if plan.hide_usage => with_usage_request(&raw),
            None => raw.clone(),
        };
        // Attempts (`failover.rs`): each failure before the client's first byte is retried on
        // another instance until one answers or the request's failure is its answer.
        let mut tried = Tried::default();
        let mut fleet = fleet;
        loop {
            let first_attempt = tried.instances().is_empty();
            if !first_attempt {
                fleet = self.fleet(); // an ejection may have followed the failure
            }
            // Route.
            let exclude = match &pinned {
                // Only its instance can serve it, ejected or not: once it failed, the state is lost.
                Some((instance, _)) if !first_attempt => {
                    let answer = lost_state(Some((instance, tried.last_cause())));
                    return self.failure_answer(record, arrived, plan.ends_session, answer);
                }
                Some((instance, _)) => Some(fleet.instances.iter().filter(|u| *u != instance).cloned().collect()),
                None => {
                    let pools = self.config.routing.exclusion_pools(&fleet.instances);
                    fleet.exclusions(plan.model.as_deref(), tried.instances(), pools.as_deref())
                }
            };
            let Some(mut exclude) = exclude else {
                if first_attempt {
                    return plane.delegate_bytes(parts, raw, peer, &[(ADMITTED_HEADER, "1")]).await;
                }
                let answer = no_instance(api, tried.instances());
                return self.failure_answer(record, arrived, plan.ends_session, answer);
            };
            if pinned.is_none() {
                exclude = self.without_full(&fleet.instances, exclude);
                if first_attempt {
                    let grouping;
                    (exclude, grouping) = self.grouped(&fleet, &parts.headers, plan.session.as_deref(), exclude);
                    record.grouping = grouping;
                }
            }
            let excluded: Vec<&str> = exclude.iter().map(String::as_str).collect();
            let request = RouteRequest {
                prompt: Prompt::Tokens(&plan.ids),
                namespace: plan.namespace.as_deref(),
                turn: plan.turn,
                request_id: None,
                now: None,
                exclude: &excluded,
                previous_instance: previous.as_deref(),
                session_key,
                output_tokens: None,
            };
            let decided = Instant::now();
            let attempt_no = tried.instances().len() + 1;
            let (instance, mut lifecycle, decision_header, cookie, attempt_body) = match &self.config.routing {
                Routing::Colocated(router) => {
                    // A pinned follow-up has one place to go: session admission does not move
                    // it; a retry goes wherever the router finds room (as the app's failover).
                    let gated = (self.gate.as_ref().filter(|_| pinned.is_none() && first_attempt))
                        .zip(plan.session.as_deref().map(SessionGate::session_key));
                    let routed = match gated {
                        Some((gate, key)) => match gate.route(router, &request, key, prompt_tokens, deadline).await {
                            Ok(routed) => routed,
                            Err(refusal) => {
                                let answer = gate_refusal(api, gate, refusal);
                                record.status = answer.status().as_u16();
                                record.refused = Some(refusal.reason());
                                record.latency_s = arrived.elapsed().as_secs_f64();
                                self.settle(record, plan.ends_session);
                                return answer;
                            }
                        },
                        None => router.route(&request),
                    };
                    let Ok(decision) = routed else {
                        if first_attempt {
                            return self.delegate_counted(plane, parts, raw, peer, record.turn, &[]).await;
                        }
                        let answer = no_instance(api, tried.instances());
                        return self.failure_answer(record, arrived, plan.ends_session, answer);
                    };
                    record.decision_s = Some(decided.elapsed().as_secs_f64());
                    self.note_decision(&mut record, &decision);
                    let mut lifecycle = Lifecycle::new(&self.config.routing, decision.request_id);
                    lifecycle.gate = gated.map(|(gate, session)| GatedSession {
                        gate: Arc::clone(gate),
                        session,
                        instance: Arc::clone(&decision.instance_name),
                        prompt_tokens,
                    });
                    let header = self.decision_header(&decision, plan.source, attempt_no);
                    let cookie = cookie_policy
                        .then(|| affinity_set_cookie(previous.as_deref(), &decision.instance_name, plan.ends_session))
                        .flatten();
                    (
                        decision.instance_name.to_string(),
                        lifecycle,
                        header,
                        cookie,
                        body.clone(),
                    )
                }
                Routing::Pd(pd) => {
                    let Ok(decision) = pd.route(&request) else {
                        if first_attempt {
                            return self.delegate_counted(plane, parts, raw, peer, record.turn, &[]).await;
                        }
                        let answer = no_instance(api, tried.instances());
                        return self.failure_answer(record, arrived, plan.ends_session, answer);
                    };
                    record.decision_s = Some(decided.elapsed().as_secs_f64());
                    match self
                        .prefill_leg(
                            pd,
                            api,
                            &decision,
                            &plan,
                            &parts.headers,
                            &body,
                            previous.as_deref(),
                            &mut record,
                            attempt_no,
                        )
                        .await
                    {
                        PrefillLeg::Decode(leg) => (leg.instance, leg.lifecycle, leg.header, leg.cookie, leg.body),
                        PrefillLeg::Answered(answer) => {
                            record.latency_s = arrived.elapsed().as_secs_f64();
                            self.settle(record, plan.ends_session);
                            return answer;
                        }
                        PrefillLeg::Failed { instance, failure } => {
                            let (cause, status) = failure;
                            match self.attempt_failed(api, &mut record, &mut tried, &instance, cause, status) {
                                AfterFailure::Retry => continue,
                                AfterFailure::Answer(answer) => {
                                    return self.failure_answer(record, arrived, plan.ends_session, answer);
                                }
                            }
                        }
                    }
                }
            };
            // Forward. A failure before the client's first byte leaves this block with its
            // cause and status; every other path answers.
            let (cause, status) = 'attempt: {
                let upstream = self.upstream_request(api, &instance, &parts.headers, &id, attempt_body);
                let sent = Instant::now();
                let answer = match self.send(upstream).await {
                    Ok(answer) => answer,
                    Err(failure) => break 'attempt failure,
                };
                // Another instance took the request: the earlier 5xx were their own after all.
                self.answered_after(&mut record, &mut tried);
                let (mut head, upstream_body) = answer.into_parts();
                client_head(&mut head.headers, decision_header, cookie, &id);
                let streamed = is_event_stream(&head.headers);
                if !streamed {
                    let whole = match self.whole_body(upstream_body).await {
                        Ok(whole) => whole,
                        Err(failure) => break 'attempt failure,
                    };
                    lifecycle.prefilled();
                    record.first_byte_s = Some(sent.elapsed().as_secs_f64());
                    let ok = head.status == StatusCode::OK;
                    let (output, cached) = if ok { api.usage(&whole) } else { (None, None) };
                    lifecycle.finished(output.unwrap_or(0));
                    record.cached_tokens = cached;
                    record.status = head.status.as_u16();
                    record.succeeded = true;
                    record.latency_s = arrived.elapsed().as_secs_f64();
                    self.instance_succeeded(&instance);
                    self.settle(record, plan.ends_session);
                    let whole = api.relay_whole(&self.response_ids, whole, &instance);
                    return Response::from_parts(head, Full::new(whole).map_err(|never| match never {}).boxed());
                }
                // A stream: the client's headers go out with its first event, as the app's relay does.
                let scan = api.scanner(&self.response_ids, plan.hide_usage, &instance);
                let mut upstream_body = upstream_body;
                let first = match self.first_frame(&mut upstream_body).await {
                    Ok(first) => first,
                    Err(failure) => break 'attempt failure,
                };
                lifecycle.prefilled();
                record.first_byte_s = Some(sent.elapsed().as_secs_f64());
                let prefilled = Instant::now();
                record.ttft_s = Some(arrived.elapsed().as_secs_f64());
                record.status = head.status.as_u16();
                let kept = self.config.resume_streams.then(BytesMut::new);
                let (tx, client_body) = Channel::<Bytes, hyper::Error>::new(8);
                let mut relay = Relay {
                    native: Arc::clone(self),
                    api,
                    lifecycle,
                    instance,
                    scan,
                    kept,
                    record,
                    ends_session: plan.ends_session,
                    arrived,
                    deadline,
                    prefilled,
                    parts,
                    body: body.clone(),
                    tried: std::mem::take(&mut tried),
                    rejoined: None,
                };
                let out = relay.scan_first(first);
                tokio::spawn(relay.run(tx, out, upstream_body));
                return Response::from_parts(head, client_body.boxed());
            };
            drop(lifecycle);
            match self.attempt_failed(api, &mut record, &mut tried, &instance, cause, status) {
                AfterFailure::Retry => {}
                AfterFailure::Answer(answer) => return self.failure_answer(record, arrived, plan.ends_session, answer),
            }
        }
    }

    /// The routing plan of a body the native path serves exactly as the app would, else why not:
    /// a model the fleet does not serve (vLLM's 404, answered here), or the app's to answer —
    /// what it must refuse or read as other text: an end header that is not true/false or names
    /// no session, session headers that are not UTF-8.
    /// With a chat template the body's plan runs on this thread when the tokenizer's piece cache
    /// holds all but [`INLINE_ENCODE_BYTES`] of it (a follow-up: ≈ 0.2 ms for 32K tokens), else
    /// on tokio's blocking pool: a first turn's whole history is encoded there (32K tokens: ≈ 30
    /// ms with the test tokenizer), which on the runtime's one thread would hold every other
    /// request up. The pool's hop costs the gateway ≈ 0.12 ms of CPU a request (BENCHMARKS.md,
    /// "Tokenizer mode plans follow-ups inline"); a first turn pays for its render twice instead
    /// (≈ 0.1 ms on this thread, beside its encode's ≈ 30 ms on the pool).
    async fn plan(&self, fleet: &FleetView, api: Api, headers: &HeaderMap, raw: &Bytes) -> Result<Plan, Unplanned> {
        // Header values the app reads as other text than these bytes: its to read.
        if !session_headers_utf8(headers) {
            return Err(Unplanned::App);
        }
        // An end header that is neither true nor false: the app's 400, before it reads the body.
        let ends_session = session_end(headers).map_err(Unplanned::BadEndHeader)?;
        let session = header_session(headers);
        let chunk = self.config.approx_chunk_bytes;
        let planned = match &self.config.tokens {
            None => body_plan(api, raw, session, Ids { template: None, chunk }),
            Some(tokens) => {
                let inline = (raw.len() <= INLINE_PLAN_MAX_BODY_BYTES)
                    .then(|| {
                        let ids = Ids {
                            template: Some(tokens),
                            chunk,
                        };
                        // The session is cloned for this try: a first turn needs it again below.
                        let session = session.clone();
                        with_encode_budget(INLINE_ENCODE_BYTES, || body_plan(api, raw, session, ids)).ok()
                    })
                    .flatten();
                if let Some(planned) = inline {
                    planned
                } else {
                    let (tokens, raw) = (Arc::clone(tokens), raw.clone());
                    tokio::task::spawn_blocking(move || {
                        let ids = Ids {
                            template: Some(&tokens),
                            chunk,
                        };
                        body_plan(api, &raw, session, ids)
                    })
                    .await
                    .map_err(|_| Unplanned::App)?
                }
            }
        };
        // The app checks the model first (`proxy._handle`), then how the body is routed (its
        // rendering's 400 comes after the model's 404).
        let unknown = |model: Option<&str>| {
            model
                .filter(|m| !fleet.models.is_empty() && !fleet.models.contains_key(*m))
                .map(|m| Unplanned::UnknownModel(m.to_owned()))
        };
        let mut plan = match planned {
            Ok(plan) => plan,
            // In ids mode the app renders nothing: its refusal of a conversation is the ids one.
            Err(Unplanned::Unrenderable { model, .. }) if self.config.ids_only => {
                return Err(unknown(model.as_deref()).unwrap_or_else(|| ids_only_refusal(api)));
            }
            Err(Unplanned::Unrenderable { message, model }) => {
                return Err(unknown(model.as_deref()).unwrap_or(Unplanned::Unrenderable { message, model }));
            }
            Err(other) => return Err(other),
        };
        if let Some(refusal) = unknown(plan.model.as_deref()) {
            return Err(refusal);
        }
        if self.config.ids_only && plan.source != "ids" {
            return Err(ids_only_refusal(api)); // this proxy routes on token ids only
        }
        if ends_session && plan.session.is_none() && plan.turn_key.is_none() {
            return Err(Unplanned::Refused {
                message: END_WITHOUT_SESSION.to_owned(),
                param: None,
                code: Some("session_end_without_session"),
            });
        }
        if let Some(model) = plan.model.as_deref()
            && fleet.adapters.contains(model)
        {
            // A LoRA adapter's blocks are cached apart (`Fleet.namespace`: an empty salt is none).
            let salt = plan.namespace.as_deref().filter(|s| !s.is_empty());
            plan.namespace = cache_namespace(Some(model), salt).map_err(|_| Unplanned::App)?;
        }
        plan.ends_session = ends_session;
        Ok(plan)
    }

    /// vLLM's 404 for a model the fleet does not serve (`RequestError.unknown_model`: the name
    /// cut at `ECHOED_CHARS` characters), in the API's shape; recorded as a refused request
    /// (no decision, no turn counted, the session not ended).
    fn unknown_model(&self, api: Api, headers: &HeaderMap, model: &str, arrived: Instant) -> Response<Body> {
        let shown: String = if model.chars().count() <= ECHOED_CHARS {
            model.to_owned()
        } else {
            model.chars().take(ECHOED_CHARS).chain(std::iter::once('…')).collect()
        };
        let message = format!("The model `{shown}` does not exist.");
        let answer = api.client_error(StatusCode::NOT_FOUND, &message, Some("model_not_found"), Some("model"));
        self.refused(api.name(), headers, Some(model), answer, arrived)
    }

    /// A request refused before any decision (`answer`: the client's mistake in the API's
    /// shape), with its request id as every answer has it, recorded as the app counts it: its
    /// status, no turn counted, the session not ended.
    pub(super) fn refused(
        &self,
        api: &'static str,
        headers: &HeaderMap,
        model: Option<&str>,
        mut answer: Response<Body>,
        arrived: Instant,
    ) -> Response<Body> {
        let id = request_id(headers);
        if let Ok(value) = HeaderValue::from_str(&id) {
            answer.headers_mut().insert(REQUEST_ID.clone(), value);
        }
        let record = Record {
            request_id: id,
            api,
            model: model.map(str::to_owned),
            ..Record::default()
        };
        self.failure_answer(record, arrived, false, answer)
    }

    /// The parent rule (`failover._grouped` after `proxy._parent_home`; `docs/serve.md`,
    /// "Session life"): a sub-agent's request whose own session has no home yet is routed among
    /// its parent's home alone when the home is a candidate with at most the margin more
    /// requests in flight than the least busy candidate; else `exclude` as it was. `own`: the
    /// request's header session key (the plan's). Returns the exclusions and what the rule did
    /// (None: it does not apply). O(instances).
    fn grouped(
        &self,
        fleet: &FleetView,
        headers: &HeaderMap,
        own: Option<&str>,
        exclude: Vec<String>,
    ) -> (Vec<String>, Option<&'static str>) {
        let (Some(margin), Routing::Colocated(_)) = (self.config.parent_affinity_margin, &self.config.routing) else {
            return (exclude, None);
        };
        let Some(parent) = parent_key(headers) else {
            return (exclude, None);
        };
        let sessions = &self.config.sessions;
        if own.is_some_and(|own| sessions.home(own.as_bytes(), None).is_some()) {
            return (exclude, None); // a later request of the sub-agent: its own history leads
        }
        let Some(home) = sessions.home(parent.as_bytes(), None) else {
            return (exclude, Some("parent_unknown"));
        };
        let candidates: Vec<&String> = fleet.instances.iter().filter(|u| !exclude.contains(u)).collect();
        if !candidates.iter().any(|u| u.as_str() == &*home) {
            return (exclude, Some("parent_unavailable"));
        }
        let load = |u: &str| self.config.routing.in_flight(u).unwrap_or(0);
        let least = candidates.iter().map(|u| load(u)).min().unwrap_or(0);
        if load(&home) > least + margin {
            return (exclude, Some("overloaded"));
        }
        let others: Vec<String> = candidates
            .into_iter()
            .filter(|u| u.as_str() != &*home)
            .cloned()
            .collect();
        let mut exclude = exclude;
        exclude.extend(others);
        (exclude, Some("parent"))
    }

    /// A native request's last record, with what it does to its session first: an ended
    /// session's entry released (whatever the answer, as the app does), else a 200's instance
    /// made the session's home (co-located mode). The app's records of the same requests do
    /// not place again.
    pub(super) fn settle(&self, mut record: Record, ends_session: bool) {
        if ends_session {
            if let Some(key) = record.end_key.as_deref() {
                record.session_end_held = Some(self.end_session(key));
            }
        } else if let Some(key) = record.session.as_deref()
            && record.status == 200
            && record.prefill_instance.is_none()
            && let Some(instance) = record.instance.as_deref()
        {
            self.config.sessions.place(key.as_bytes(), instance, None);
        }
        self.records.push(record);
    }

    /// Releases session `key`'s state: its table entry, and its residency at the session
    /// gate (when session admission is on); whether the table held an entry.
    pub(super) fn end_session(&self, key: &str) -> bool {
        if let Some(gate) = &self.gate {
            gate.end(SessionGate::session_key(key));
        }
        self.config.sessions.end(key.as_bytes())
    }

    /// The `x-smetric-decision` value (`colocated.decision_header`).
    fn decision_header(&self, d: &Decision, source: &str, attempt: usize) -> HeaderValue {
        let reason = d.reason.name();
        let label = self.config.labels.get(reason).map_or(reason, String::as_str);
        let value = format!(
            "instance={}; reason={label}; first_turn={}; local_hit_tokens={}; global_hit_tokens={}; \
             policy={}; detail=\"{reason}\"; attempt={attempt}; tokens={source}",
            d.instance_name,
            u8::from(d.first_turn),
            d.local_hit_tokens,
            d.global_hit_tokens,
            self.config.routing.policy_name(),
        );
        HeaderValue::from_str(&value).unwrap_or_else(|_| HeaderValue::from_static("unrenderable"))
    }

    /// Delegates an admitted request to the app with `extra` fields and the turn the session
    /// table already counted for it, if any (so the app does not count it again).
    async fn delegate_counted(
        &self,
        plane: &ControlPlane,
        parts: Parts,
        raw: Bytes,
        peer: SocketAddr,
        turn: Option<u32>,
        extra: &[(&'static str, &str)],
    ) -> Response<Body> {
        let turn = turn.map(|t| t.to_string());
        let mut headers = vec![(ADMITTED_HEADER, "1")];
        headers.extend_from_slice(extra);
        if let Some(turn) = turn.as_deref() {
            headers.push((TURN_HEADER, turn));
        }
        plane.delegate_bytes(parts, raw, peer, &headers).await
    }
}

/// What a body is routed on, from the body alone (the fleet's checks aside), or None.
fn body_plan(api: Api, raw: &[u8], session: Option<String>, ids: Ids<'_>) -> Result<Plan, Unplanned> {
    if escapes_lone_surrogate(raw) || has_long_digit_run(raw) {
        return Err(Unplanned::App);
    }
    api.plan(raw, session, ids)
}

/// The routing ids and the turn verdict (None: the index's) the native path would route a body
/// posted to `path` on, or None when it would hand the body to the app — so a test can hold the
/// native path's rendering against the app's. `tokens`: a chat template's source (None: plain
/// ChatML's approximate ids in chunks of `approx_chunk_bytes`).
pub fn routing_ids(
    path: &str,
    raw: &[u8],
    tokens: Option<&TokenSource>,
    approx_chunk_bytes: usize,
) -> Option<(Vec<u32>, Option<bool>)> {
    let ids = Ids {
        template: tokens,
        chunk: approx_chunk_bytes,
    };
    let plan = body_plan(apis::by_path(path)?, raw, None, ids).ok()?;
    let first_turn = match plan.turn {
        TurnHint::Messages { first_turn } => Some(first_turn),
        _ => None,
    };
    Some((plan.ids, first_turn))
}

/// A request the session gate refused, in the API's error shape with `Retry-After`.
fn gate_refusal(api: Api, gate: &SessionGate, refusal: GateRefusal) -> Response<Body> {
    let config = gate.config();
    let (message, kind) = match refusal {
        GateRefusal::HeldFull => (
            format!(
                "session admission: {} requests already wait for KV room on their instances",
                config.max_held
            ),
            "RateLimitError",
        ),
        GateRefusal::HoldTimeout => (
            format!(
                "session admission: no instance had KV room for this session within {} s",
                config.hold_timeout.as_secs_f64()
            ),
            "ServiceUnavailableError",
        ),
    };
    let mut answer = api.proxy_error(refusal.status(), &message, kind);
    answer
        .headers_mut()
        .insert(hyper::header::RETRY_AFTER, HeaderValue::from(config.retry_after_s));
    answer
}

/// `proxy._handle`'s answer to a request over `client_timeout`.
const TIMED_OUT: &str = "the request timed out in the proxy";

/// A stream's body with `stream_options.include_usage` spliced in after its opening brace.
fn with_usage_request(raw: &Bytes) -> Bytes {
    let Some(start) = raw.iter().position(|&b| b == b'{') else {
        return raw.clone();
    };
    let mut out = BytesMut::with_capacity(raw.len() + USAGE_OPTION.len());
    out.extend_from_slice(&raw[..start]);
    out.extend_from_slice(USAGE_OPTION);
    out.extend_from_slice(&raw[start + 1..]);
    out.freeze()
}

/// A stream being relayed, from its second frame on, in a task of its own.
struct Relay {
    native: Arc<Native>,
    api: Api,
    lifecycle: Lifecycle,
    instance: String,
    scan: Box<dyn StreamScan>,
    kept: Option<BytesMut>,
    record: Record,
    /// The request ends its session (released when the client's answer is done).
    ends_session: bool,
    arrived: Instant,
    deadline: tokio::time::Instant,
    prefilled: Instant,
    parts: Parts,
    /// The body the first attempt sent (the usage option spliced in): what a continuation is
    /// built from.
    body: Bytes,
    /// The attempts that failed so far (the cut ones included).
    tried: Tried,
    /// A continuation's events rejoined to the first attempt's stream (None: the first's).
    rejoined: Option<Box<dyn Rejoin>>,
}

/// How a relayed stream ended.
enum End {
    Complete,
    ClientGone,
    Cut(&'static str),
    /// Over the client timeout: ended with an error event, the instance not charged.
    TimedOut,
}

impl Relay {
    fn scan_first(&mut self, first: Bytes) -> Bytes {
        if let Some(kept) = self.kept.as_mut() {
            kept.extend_from_slice(&first);
        }
        self.scan.feed(first)
    }

    /// Relays the stream to its end, continuing it natively after a cut where the API allows
    /// (`continuation.rs`).
    async fn run(mut self, mut tx: Sender<Bytes, hyper::Error>, first: Bytes, upstream: Incoming) {
        let mut next = Some((first, upstream));
        while let Some((first, upstream)) = next.take() {
            let end = self.relay(&mut tx, first, upstream).await;
            next = self.ended(end, &mut tx).await;
        }
    }

    /// Relays one attempt's stream (`first`: the client's bytes for its first frame) until it
    /// ends; the upstream is dropped on the way out (the engine aborts a request whose
    /// connection closes).
    async fn relay(&mut self, tx: &mut Sender<Bytes, hyper::Error>, first: Bytes, mut upstream: Incoming) -> End {
        if !first.is_empty() && tx.send_data(first).await.is_err() {
            return End::ClientGone;
        }
        loop {
            let idle = tokio::time::Instant::now() + self.native.config.idle_timeout;
            if self.deadline <= idle && tokio::time::Instant::now() >= self.deadline {
                return End::TimedOut;
            }
            let next = tokio::time::timeout_at(idle.min(self.deadline), upstream.frame()).await;
            if next.is_err() && tokio::time::Instant::now() >= self.deadline {
                return End::TimedOut;
            }
            return match next {
                Ok(Some(Ok(frame))) => {
                    let Ok(data) = frame.into_data() else { continue };
                    let out = self.take_in(data);
                    if out.is_empty() || tx.send_data(out).await.is_ok() {
                        continue;
                    }
                    End::ClientGone
                }
                Ok(None) if self.scan.done() || self.finished() => End::Complete,
                Ok(None) => End::Cut("stream_cut"),
                // The answer was complete; only the end marker was lost.
                Ok(Some(Err(_))) | Err(_) if self.finished() => End::Complete,
                Ok(Some(Err(_))) => End::Cut("ClientPayloadError"),
                Err(_) => End::Cut("TimeoutError"),
            };
        }
    }

    /// Whether the answer finished: the client's events say so, or the continuation being
    /// translated for it does.
    fn finished(&self) -> bool {
        self.scan.finished() || self.rejoined.as_ref().is_some_and(|r| r.finished())
    }

    /// An upstream frame in, the client's bytes out: a continuation's events rejoined to the
    /// first attempt's stream, kept for a later continuation, scanned.
    fn take_in(&mut self, data: Bytes) -> Bytes {
        let data = match self.rejoined.as_mut() {
            Some(rejoined) => rejoined.feed(&data),
            None => data,
        };
        if let Some(kept) = self.kept.as_mut() {
            kept.extend_from_slice(&data);
        }
        self.scan.feed(data)
    }

    /// What follows the end of an attempt's stream: the next attempt's first bytes and stream
    /// when a cut is continued natively, else nothing (the outcome is recorded).
    async fn ended(&mut self, end: End, tx: &mut Sender<Bytes, hyper::Error>) -> Option<(Bytes, Incoming)> {
        let tokens = self.scan.tokens();
        self.record.output_tokens = Some(tokens);
        self.record.cached_tokens = self.scan.cached_tokens();
        match end {
            End::Complete => {
                if !self.scan.done() {
                    let mut end = BytesMut::new();
                    if let Some(rejoined) = self.rejoined.as_mut() {
                        end.extend_from_slice(&rejoined.closing());
                    }
                    end.extend_from_slice(self.api.end_marker());
                    let _ = tx.send_data(end.freeze()).await;
                }
                self.lifecycle.finished(tokens);
                if tokens >= 2 {
                    let span = self.prefilled.elapsed().as_secs_f64();
                    self.record.itl_s = Some(span / (tokens - 1) as f64);
                }
                self.finish(true);
                None
            }
            End::ClientGone => {
                self.finish(true);
                None
            }
            End::TimedOut => {
                let _ = tx.send_data(self.api.stream_failure(TIMED_OUT)).await;
                self.finish(false);
                None
            }
            End::Cut(cause) => {
                self.lifecycle.aborted();
                self.cut(cause, tx).await
            }
        }
    }

    /// Records the outcome; the attempt is aborted unless it finished (the lifecycle's drop).
    fn finish(&mut self, succeeded: bool) {
        let mut record = std::mem::take(&mut self.record);
        record.succeeded = succeeded;
        if succeeded {
            self.native.instance_succeeded(&self.instance);
        }
        record.latency_s = self.arrived.elapsed().as_secs_f64();
        self.native.settle(record, self.ends_session);
    }

    /// Ends the client's stream with the API's error event: the cut was not continued.
    async fn unresumed(&mut self, tx: &mut Sender<Bytes, hyper::Error>) {
        let _ = tx.send_data(self.api.stream_failure(CUT_MESSAGE)).await;
        self.record.unresumed = true;
        self.finish(false);
    }

    /// A stream cut after the client had its first event: continued when the proxy continues
    /// streams (every API builds its continuation; PD routes both legs again), or ended with the
    /// API's error event.
    async fn cut(&mut self, cause: &'static str, tx: &mut Sender<Bytes, hyper::Error>) -> Option<(Bytes, Incoming)> {
        let Some(kept) = self.kept.as_ref() else {
            self.native.charge_cut(&mut self.record, &self.instance, cause);
            self.unresumed(tx).await;
            return None;
        };
        let continued = self.api.continuation(&self.body, kept, self.record.resumed > 0);
        // The cut is the instance's own failure (`failover.rs`), and counts as an attempt.
        self.native.charge_cut(&mut self.record, &self.instance, cause);
        self.tried.failed.push(self.instance.clone());
        let (body, via, rejoined) = match continued {
            Continued::Again(rejoined) => (self.body.clone(), self.api, rejoined),
            Continued::Body(body, rejoined) => (body, self.api, rejoined),
            Continued::OverChat(body, rejoined) => (body, &CHAT as Api, rejoined),
            Continued::Not => {
                self.unresumed(tx).await;
                return None;
            }
        };
        let native = Arc::clone(&self.native);
        let Some((instance, lifecycle, first, upstream)) = native.continue_stream(self, via, &body).await else {
            self.unresumed(tx).await;
            return None;
        };
        self.record.resumed += 1;
        self.instance = instance;
        self.lifecycle = lifecycle;
        self.rejoined = Some(rejoined);
        let first = self.take_in(first);
        Some((first, upstream))
    }
}

impl Native {
    /// Routes and opens the continuation `body` of `relay`'s cut stream, posted to `via`'s
    /// path (the failed instances excluded, `max_attempts` in all), retrying what fails before
    /// its first byte: the instance, its lifecycle, its first frame and its stream; None when no
    /// attempt is left.
    async fn continue_stream(
        &self,
        relay: &mut Relay,
        via: Api,
        body: &Bytes,
    ) -> Option<(String, Lifecycle, Bytes, Incoming)> {
        let fleet = self.fleet();
        let plan = self.plan(&fleet, via, &relay.parts.headers, body).await.ok()?;
        loop {
            if relay.tried.instances().len() >= self.config.max_attempts as usize {
                return None;
            }
            let fleet = self.fleet();
            let pools = self.config.routing.exclusion_pools(&fleet.instances);
            let exclude = fleet.exclusions(plan.model.as_deref(), relay.tried.instances(), pools.as_deref())?;
            let exclude = self.without_full(&fleet.instances, exclude);
            let excluded: Vec<&str> = exclude.iter().map(String::as_str).collect();
            // The continuation's turn: its messages' (chat) or the index's; its session's turn
            // was counted with the request.
            let turn = match plan.turn {
                TurnHint::Turn(_) => TurnHint::Unknown,
                turn => turn,
            };
            let request = RouteRequest {
                prompt: Prompt::Tokens(&plan.ids),
                namespace: plan.namespace.as_deref(),
                turn,
                request_id: None,
                now: None,
                exclude: &excluded,
                previous_instance: None,
                session_key: None,
                output_tokens: None,
            };
            let decided = Instant::now();
            let attempt_no = relay.tried.instances().len() + 1;
            let (instance, mut lifecycle, attempt_body) = match &self.config.routing {
                Routing::Colocated(router) => {
                    let decision = router.route(&request).ok()?;
                    relay.record.decision_s = Some(decided.elapsed().as_secs_f64());
                    self.note_decision(&mut relay.record, &decision);
                    let lifecycle = Lifecycle::new(&self.config.routing, decision.request_id);
                    (decision.instance_name.to_string(), lifecycle, body.clone())
                }
                // Both legs again, as a first attempt's: the prefill leg, then the decode
                // instance with its KV transfer parameters.
                Routing::Pd(pd) => {
                    let decision = pd.route(&request).ok()?;
                    relay.record.decision_s = Some(decided.elapsed().as_secs_f64());
                    let headers = &relay.parts.headers;
                    let leg = self
                        .prefill_leg(
                            pd,
                            via,
                            &decision,
                            &plan,
                            headers,
                            body,
                            None,
                            &mut relay.record,
                            attempt_no,
                        )
                        .await;
                    match leg {
                        PrefillLeg::Decode(leg) => (leg.instance, leg.lifecycle, leg.body),
                        // The client's mistake: nothing to continue its stream with.
                        PrefillLeg::Answered(_) => return None,
                        PrefillLeg::Failed { instance, failure } => {
                            let (cause, status) = failure;
                            let after = self.attempt_failed(
                                relay.api,
                                &mut relay.record,
                                &mut relay.tried,
                                &instance,
                                cause,
                                status,
                            );
                            match after {
                                AfterFailure::Retry => continue,
                                AfterFailure::Answer(_) => return None,
                            }
                        }
                    }
                }
            };
            let id = relay.record.request_id.clone();
            let upstream = self.upstream_request(via, &instance, &relay.parts.headers, &id, attempt_body);
            let (cause, status) = 'attempt: {
                let answer = match self.send(upstream).await {
                    Ok(answer) => answer,
                    Err(failure) => break 'attempt failure,
                };
                self.answered_after(&mut relay.record, &mut relay.tried);
                let streamed = is_event_stream(answer.headers());
                if answer.status() != StatusCode::OK || !streamed {
                    // Refused (a 4xx) or not a stream: nothing to continue the client's with.
                    return None;
                }
                let mut upstream = answer.into_body();
                match self.first_frame(&mut upstream).await {
                    Ok(first) => {
                        lifecycle.prefilled();
                        return Some((instance, lifecycle, first, upstream));
                    }
                    Err(failure) => break 'attempt failure,
                }
            };
            drop(lifecycle);
            match self.attempt_failed(relay.api, &mut relay.record, &mut relay.tried, &instance, cause, status) {
                AfterFailure::Retry => {}
                AfterFailure::Answer(_) => return None, // the client's stream ends with the error event
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_digit_run_longer_than_pythons_limit_is_found_wherever_it_lies() {
        for (lead, run) in [(0, 4301), (1, 4301), (4299, 4301), (17, 9000)] {
            let body = format!("{}{}x", "a".repeat(lead), "9".repeat(run));
            assert!(has_long_digit_run(body.as_bytes()), "{lead} {run}");
        }
        for (lead, run) in [(0, 4300), (5, 4300), (4299, 4300)] {
            let body = format!("{}{}x{}", "a".repeat(lead), "9".repeat(run), "7".repeat(4000));
            assert!(!has_long_digit_run(body.as_bytes()), "{lead} {run}");
        }
    }

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut out = HeaderMap::new();
        for (name, value) in pairs {
            out.insert(*name, HeaderValue::from_static(value));
        }
        out
    }

    #[test]
    fn a_sub_agent_is_known_by_its_parent_header_or_its_claude_agent_id() {
        for parent in [
            "x-codex-parent-thread-id",
            "x-parent-session-id",
            "x-dynamo-parent-session-id",
        ] {
            let key = parent_key(&headers(&[("x-session-id", "s"), (parent, "p")]));
            assert_eq!(key.as_deref(), Some("p"), "{parent}");
        }
        let child = [("x-claude-code-session-id", "root"), ("x-claude-code-agent-id", "a1")];
        assert_eq!(
            parent_key(&headers(&child)).as_deref(),
            Some("root"),
            "a top-level sub-agent"
        );
        let nested = [
            ("x-claude-code-session-id", "root"),
            ("x-claude-code-agent-id", "a2"),
            ("x-claude-code-parent-agent-id", "a1"),
        ];
        assert_eq!(
            parent_key(&headers(&nested)).as_deref(),
            Some("root/a1"),
            "its parent's own key"
        );
        // The root's own requests: a stray parent-agent header is ignored (session.parent_key).
        let root = [
            ("x-claude-code-session-id", "root"),
            ("x-claude-code-parent-agent-id", "a0"),
        ];
        assert_eq!(parent_key(&headers(&root)), None);
        assert_eq!(parent_key(&headers(&[("x-session-id", "s")])), None, "no parent named");
        assert_eq!(
            parent_key(&headers(&[("x-codex-parent-thread-id", "")])),
            None,
            "an empty value names none"
        );
    }

    #[test]
    fn end_headers_read_as_the_app_reads_them() {
        assert_eq!(session_end(&headers(&[("x-session-end", " TRUE ")])), Ok(true));
        assert_eq!(session_end(&headers(&[("x-dynamo-session-final", "1")])), Ok(true));
        assert_eq!(session_end(&headers(&[("x-session-end", "false")])), Ok(false));
        assert_eq!(session_end(&headers(&[])), Ok(false));
        assert_eq!(session_end(&headers(&[("x-session-end", "yes")])), Err("x-session-end"));
        let both = [("x-session-end", "0"), ("x-dynamo-session-final", "maybe")];
        assert_eq!(
            session_end(&headers(&both)),
            Err("x-dynamo-session-final"),
            "each header is checked"
        );
    }

    #[test]
    fn the_session_end_endpoints_skip_admission_and_nothing_else_new_does() {
        for path in ["/v1/sessions/abc/end", "/finish_session", "/health", "/metrics"] {
            assert!(unadmitted(path), "{path}");
        }
        for path in [
            "/v1/chat/completions",
            "/v1/sessions",
            "/finish_sessions",
            "/v1/messages",
        ] {
            assert!(!unadmitted(path), "{path}");
        }
    }
}
