//! Disaggregated prefill (PD) on the native path: vLLM's disaggregated-prefill protocol, as the
//! app's PD backend speaks it (`python/smetric/serve/backends/pd.py`, docs/pd-and-tier.md §A.1).
//!
//! Algorithm, one attempt after `PdRouter::route` named a prefill and a decode instance:
//! 1. **prefill leg**: the body with `kv_transfer_params` = [`REMOTE_DECODE_PARAMS`],
//!    `stream: false`, `max_tokens: 1` (and `max_completion_tokens: 1` when present), the API's
//!    own overrides (`Protocol::prefill_overrides`: Responses stores nothing and generates one
//!    token), without `stream_options`, `min_tokens` and `min_completion_tokens`; posted with a
//!    fresh request id and read whole. Then `on_prefilled`.
//! 2. **decode leg**: the body (with its usage request, as co-located) plus the
//!    `kv_transfer_params` the prefill instance answered; its answer is the client's, relayed
//!    as a co-located answer is (`forward.rs`): `on_transferred` at its first byte, then
//!    `on_finished` or `on_aborted` (`Lifecycle`).
//!
//! A 4xx from the prefill instance is the client's answer. Any other failure of the prefill
//! leg — an error, a timeout, a 5xx, an answer without `kv_transfer_params` (an engine without
//! a KV connector) — aborts the attempt, and the app's failover carries the request on without
//! that instance (a retry routes both sides again: the prefill's KV lease was for the decode
//! instance it named), as after a failed decode leg.
//!
//! Invariants: the rewritten bodies keep the client's keys in order (a set key keeps its place,
//! a new one goes last: what the app's `dict` operations do); every routed attempt ends in one
//! `on_finished` or `on_aborted` (the `Lifecycle` is made before the prefill leg). Cost: one
//! pass over the body's top-level entries per leg, and one parse of the prefill's answer.

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::Response;
use hyper::header::{HeaderMap, HeaderValue};
use serde_json::value::RawValue;
use smetric_core::{PdDecision, PdRouter};

use super::attempt::{Lifecycle, affinity_set_cookie, client_head, request_id};
use super::failover::Failure;
use super::json::{Entries, body as json_body};
use super::protocol::{Plan, Protocol};
use super::state::Native;
use crate::answers::Body;
use crate::records::Record;

/// What the prefill request carries (vLLM's NIXL proxy), as JSON.
const REMOTE_DECODE_PARAMS: &str = r#"{"do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": null, "remote_block_ids": null, "remote_host": null, "remote_port": null}"#;

/// The fields a prefill leg drops: it streams nothing and generates one token.
const PREFILL_DROPS: [&str; 3] = ["stream_options", "min_tokens", "min_completion_tokens"];

/// The prefill instance's copy of a request body (the app's `pd.prefill_body`); `None` when
/// the body is not a JSON object.
#[cfg(test)] // the legs parse a body once for both (`prefill_of`, `decode_of`)
fn prefill_body(raw: &[u8], overrides: &[(&'static str, &'static str)]) -> Option<Bytes> {
    Some(prefill_of(Entries::of(json_body(raw)?)?, overrides))
}

/// [`prefill_body`] of a body's entries (parsed once for both legs).
fn prefill_of(mut entries: Entries<'_>, overrides: &[(&'static str, &'static str)]) -> Bytes {
    for &(key, json) in overrides {
        entries.set(key, json);
    }
    entries.set("kv_transfer_params", REMOTE_DECODE_PARAMS);
    entries.set("stream", "false");
    entries.set("max_tokens", "1");
    if entries.get("max_completion_tokens").is_some() {
        entries.set("max_completion_tokens", "1");
    }
    for key in PREFILL_DROPS {
        entries.remove(key);
    }
    json_bytes(&entries)
}

/// The decode instance's body: the original with the prefill's `kv_transfer_params` (the
/// app's `pd.decode_body`).
#[cfg(test)]
fn decode_body(raw: &[u8], kv_transfer_params: &str) -> Option<Bytes> {
    Some(decode_of(Entries::of(json_body(raw)?)?, kv_transfer_params))
}

/// [`decode_body`] of a body's entries.
fn decode_of<'a>(mut entries: Entries<'a>, kv_transfer_params: &'a str) -> Bytes {
    entries.set("kv_transfer_params", kv_transfer_params);
    json_bytes(&entries)
}

fn json_bytes(entries: &Entries<'_>) -> Bytes {
    let mut out = String::new();
    entries.push_json(&mut out);
    Bytes::from(out)
}

/// The `kv_transfer_params` object of a prefill answer, as JSON text, or `None` (not JSON, not
/// an object, or no such object: an engine without a KV connector).
pub(super) fn kv_params_of(answer: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Answer<'a> {
        #[serde(borrow)]
        kv_transfer_params: Option<&'a RawValue>,
    }
    let params = serde_json::from_slice::<Answer<'_>>(answer).ok()?.kv_transfer_params?;
    params.get().starts_with('{').then(|| params.get().to_owned())
}

/// The decode leg a successful prefill leg leaves.
pub(super) struct DecodeLeg {
    pub(super) instance: String,
    pub(super) lifecycle: Lifecycle,
    pub(super) header: HeaderValue,
    /// llm-d's session cookie for the answer (it names the prefill instance), if any.
    pub(super) cookie: Option<HeaderValue>,
    pub(super) body: Bytes,
}

/// How a prefill leg ended.
pub(super) enum PrefillLeg {
    /// The KV is ready: the decode leg follows.
    Decode(DecodeLeg),
    /// The prefill instance refused the request as the client's mistake (4xx): its answer.
    Answered(Response<Body>),
    /// The attempt failed at `instance` before the client had a byte (`failover.rs` retries it).
    Failed { instance: String, failure: Failure },
}

impl Native {
    /// The prefill leg of a PD `decision` (see the module docs); `body` is what the decode leg
    /// would send (the client's body, with its usage request); `previous` the instance the
    /// request's session cookie named (llm-d's policy).
    #[allow(clippy::too_many_arguments)] // one attempt's parts
    pub(super) async fn prefill_leg(
        &self,
        pd: &PdRouter,
        api: &'static dyn Protocol,
        decision: &PdDecision,
        plan: &Plan,
        headers: &HeaderMap,
        body: &Bytes,
        previous: Option<&str>,
        record: &mut Record,
        attempt: usize,
    ) -> PrefillLeg {
        let prefill = decision.prefill.instance_name.to_string();
        let decode = decision.decode_instance_name.to_string();
        self.note_decision(record, &decision.prefill);
        record.instance = Some(decode.clone()); // the instance that answers the client
        let lifecycle = Lifecycle::new(&self.config.routing, decision.prefill.request_id);
        let header = self.pd_decision_header(decision, plan.source, attempt);
        // The cookie names the prefill instance: the core's session affinity is to one.
        let cookie = (self.config.routing.session_cookie())
            .then(|| affinity_set_cookie(previous, &prefill, plan.ends_session))
            .flatten();
        let failed = |(cause, status): Failure| PrefillLeg::Failed {
            instance: prefill.clone(),
            failure: (cause, status),
        };
        // The body's entries, parsed once for both legs.
        let Some(entries) = json_body(body).and_then(Entries::of) else {
            return failed(("unrenderable_body".to_owned(), None));
        };
        let prefill_body = prefill_of(entries.clone(), api.prefill_overrides());
        // A fresh id: the prefill leg is a request of its own to the engine.
        let upstream = self.upstream_request(api, &prefill, headers, &request_id(&HeaderMap::new()), prefill_body);
        let answer = match self.send(upstream).await {
            Ok(answer) => answer,
            Err(failure) => return failed(failure),
        };
        let status = answer.status();
        let (mut head, answer_body) = answer.into_parts();
        let whole = match self.whole_body(answer_body).await {
            Ok(whole) => whole,
            Err(failure) => return failed(failure),
        };
        if status.is_client_error() {
            // The client's mistake: the prefill instance's answer is the client's.
            let mut lifecycle = lifecycle;
            lifecycle.finished(0);
            record.prefill_instance = Some(prefill);
            record.status = status.as_u16();
            let id = record.request_id.clone();
            client_head(&mut head.headers, header, cookie, &id);
            let body = http_body_util::Full::new(whole).map_err(|never| match never {}).boxed();
            return PrefillLeg::Answered(Response::from_parts(head, body));
        }
        let Some(params) = kv_params_of(&whole) else {
            return failed(("no_kv_transfer_params".to_owned(), None));
        };
        record.prefill_instance = Some(prefill.clone());
        pd.on_prefilled(decision.prefill.request_id);
        let decode_body = decode_of(entries, &params);
        PrefillLeg::Decode(DecodeLeg {
            instance: decode,
            lifecycle,
            header,
            cookie,
            body: decode_body,
        })
    }

    /// The `x-smetric-decision` value of a PD decision (`pd.pd_decision_header`): the decode
    /// instance as `instance`, plus `prefill`.
    fn pd_decision_header(&self, d: &PdDecision, source: &str, attempt: usize) -> HeaderValue {
        let reason = d.prefill.reason.name();
        let label = self.config.labels.get(reason).map_or(reason, String::as_str);
        let value = format!(
            "instance={}; prefill={}; reason={label}; first_turn={}; local_hit_tokens={}; \
             global_hit_tokens={}; transfer_tokens={}; policy={}; decode_rule={}; detail=\"{reason}\"; \
             attempt={attempt}; tokens={source}",
            d.decode_instance_name,
            d.prefill.instance_name,
            u8::from(d.prefill.first_turn),
            d.prefill.local_hit_tokens,
            d.prefill.global_hit_tokens,
            d.transfer_tokens,
            self.config.routing.policy_name(),
            d.decode_rule.name(),
        );
        HeaderValue::from_str(&value).unwrap_or_else(|_| HeaderValue::from_static("unrenderable"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(bytes: &Bytes) -> serde_json::Value {
        serde_json::from_slice(bytes).unwrap()
    }

    #[test]
    fn the_prefill_body_generates_one_token_streams_nothing_and_keeps_the_key_order() {
        let raw = br#"{"model": "m", "stream": true, "stream_options": {"include_usage": true}, "max_completion_tokens": 50, "messages": [{"role": "user", "content": "hi"}], "min_tokens": 3}"#;
        let out = prefill_body(raw, &[]).unwrap();
        let text = std::str::from_utf8(&out).unwrap();
        assert_eq!(
            text,
            r#"{"model": "m", "stream": false, "max_completion_tokens": 1, "messages": [{"role": "user", "content": "hi"}], "kv_transfer_params": {"do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": null, "remote_block_ids": null, "remote_host": null, "remote_port": null}, "max_tokens": 1}"#
        );
    }

    #[test]
    fn an_apis_overrides_are_applied_before_the_protocol_fields() {
        let raw = br#"{"input": "x", "store": true, "max_output_tokens": 99}"#;
        let out = parsed(&prefill_body(raw, &[("max_output_tokens", "1"), ("store", "false")]).unwrap());
        assert_eq!(out["store"], serde_json::json!(false));
        assert_eq!(out["max_output_tokens"], serde_json::json!(1));
        assert_eq!(out["kv_transfer_params"]["do_remote_decode"], serde_json::json!(true));
    }

    #[test]
    fn the_decode_body_is_the_original_plus_the_prefills_params() {
        let raw = br#"{"model": "m", "stream": true, "max_tokens": 64}"#;
        let params = r#"{"remote_engine_id": "e1", "remote_block_ids": [1, 2]}"#;
        let out = decode_body(raw, params).unwrap();
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            r#"{"model": "m", "stream": true, "max_tokens": 64, "kv_transfer_params": {"remote_engine_id": "e1", "remote_block_ids": [1, 2]}}"#
        );
    }

    #[test]
    fn kv_params_are_an_object_of_a_json_answer_or_nothing() {
        assert_eq!(
            kv_params_of(br#"{"id": "x", "kv_transfer_params": {"a": 1}}"#).as_deref(),
            Some(r#"{"a": 1}"#)
        );
        assert_eq!(kv_params_of(br#"{"id": "x"}"#), None);
        assert_eq!(kv_params_of(br#"{"kv_transfer_params": null}"#), None);
        assert_eq!(kv_params_of(br#"{"kv_transfer_params": [1]}"#), None);
        assert_eq!(kv_params_of(b"not json"), None);
        assert_eq!(prefill_body(b"[1, 2]", &[]), None);
    }
}
