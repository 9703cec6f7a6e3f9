//! The compiled data plane's native path: OpenAI chat and completions, Anthropic Messages and
//! OpenAI Responses served in Rust (stages 2–6 of `docs/proxy-data-plane.md`), on the same
//! `smetric_core::Router` (or `PdRouter`) the Python control plane holds; vLLM's unrouted
//! surface (`unrouted.rs`) and the session-end endpoints (`session_end.rs`) beside them.
//!
//! A request of the proxy's APIs first takes an admission `Slot` (`crate::admission`; a
//! refusal of a path the native path serves is answered here in the API's shape, as the app
//! words it, and recorded for the app; any other refusal is delegated to the app with its
//! reason, which answers it in the API's shape). The
//! native path then takes a `POST` to an API's path when the control plane armed that API
//! ([`NativeConfig`]) and the request is one it serves exactly as the app would:
//!
//! 1. identity body encoding; a client key, when keys are on, among the configured ones;
//! 2. the body read whole within `max_body_bytes` (else 413) and `body_timeout` (else 408);
//! 3. parsed by the proxy's own parser (`smetric_vllm::parse_openai_body`), no lone surrogate,
//!    a model the fleet serves (a LoRA adapter routed in its own namespace), no
//!    `kv_transfer_params`;
//! 4. routing ids: a completions prompt's token ids, or the plain ChatML of a chat body cut
//!    into byte chunks ([`chatml`], `--tokens approximate` without a chat template), a text
//!    prompt's bytes likewise; the turn from the chat roles;
//! 5. routed with the fleet's exclusions (ejected instances, instances without the model, and
//!    full instances once the admission holds one instance's share) and forwarded with the
//!    request id, the upstream key, and for a stream a request for its usage;
//! 6. a whole answer read whole, a stream relayed from its first event on, scanned
//!    (`stream`); the router hears `on_prefilled` at the first byte and `on_finished` (the
//!    output tokens) or `on_aborted`.
//!
//! In PD mode (`Routing::Pd`) step 5 names a prefill and a decode instance (`PdRouter`), and
//! the prefill leg runs first (`pd.rs`: vLLM's disaggregated-prefill protocol); step 6 is the
//! decode leg's answer, the router hearing `on_transferred` at its first byte.
//!
//! An attempt that failed before any byte reached the client is retried on another instance
//! (`failover.rs`: the app's rules, ejection included; PD too). Anything else is handed to the
//! app as it came (its body, when read, resent): a request the native path does not serve and a
//! body the app must refuse (the app's error says why). A stream cut after its first event is
//! continued natively (`continuation.rs`; Messages over the engine's chat endpoint, its chunks
//! translated back by `anthropic_events.rs`; Responses spliced by `responses_splice.rs`; PD
//! through both legs again). Each native request leaves a
//! `Record` for the control plane's metrics and decision log.
//!
//! Invariants: the app trusts the gateway's headers only with the per-process secret, and a
//! client's own `x-smetric-gateway*` fields are dropped before anything is delegated; every
//! routed attempt ends in exactly one `on_finished` or `on_aborted`; a slot is held until the
//! answer's last byte (or the client's departure). Cost per request: one parse of the body,
//! one render, one route, the bytes moved, and a scan of the stream.

mod anthropic_events;
mod apis;
mod attempt;
pub mod chatml;
mod continuation;
pub(crate) mod engines;
mod failover;
mod forward;
mod intake;
mod json;
mod messages;
mod openai;
mod pd;
mod protocol;
mod response_ids;
mod responses;
mod responses_splice;
mod routes;
mod secret;
mod session_end;
mod sse;
mod state;
mod stream;
mod unrouted;

pub use forward::routing_ids;
pub(crate) use forward::serve;
pub(crate) use state::Native;
pub use state::{FleetView, NativeApis, NativeConfig, NativeHandles, Routing};
