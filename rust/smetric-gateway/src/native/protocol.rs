//! One trait per API the native path serves: what the forwarder needs of an API — its path,
//! the routing plan of a body (validation and rendering), the scanner of its event stream, the
//! usage of a whole answer (output tokens and the realized hit), its error shapes and the end of
//! its stream — so that `forward.rs` knows no API by name and adding an API is one file (its
//! `impl Protocol`) plus a line in `apis.rs`.
//!
//! Invariants: a `plan` that fails says why ([`Unplanned`]): the app's to answer (which serves
//! everything), or a refusal the native path answers in the API's shape as the app would; every
//! method is pure but `scanner`, whose state is one stream's. Complexity: each method is linear
//! in the bytes it is given.

use std::sync::Arc;

use bytes::Bytes;
use hyper::{Response, StatusCode};
use smetric_core::TurnHint;

use super::chatml::RenderedBody;
use super::continuation::Continued;
use super::response_ids::ResponseIds;
use super::state::NativeApis;
use crate::answers::{Body, json_response};
use crate::tokens::chunk_ids;
use crate::tokens::{Messages, RenderRequest, TokenSource};

/// What the native path routes a body on.
pub(crate) struct Plan {
    /// The routing ids (the approximate ChatML ids, the tokenizer's, or the prompt's own ids).
    pub(crate) ids: Vec<u32>,
    pub(crate) turn: TurnHint,
    /// `approximate`, `tokenizer` or `ids` (the decision log's `tokens_source`).
    pub(crate) source: &'static str,
    pub(crate) model: Option<String>,
    /// The cache namespace (vLLM's `cache_salt`).
    pub(crate) namespace: Option<String>,
    /// The stream's usage was asked for by the proxy, not the client: it is cut from the relay.
    pub(crate) hide_usage: bool,
    pub(crate) session: Option<String>,
    /// The session hint whose turns the session table counts (a completions body without
    /// messages): the router's turn is the table's count, taken just before the route.
    pub(crate) turn_key: Option<String>,
    /// Responses: the stored response a follow-up continues (`previous_response_id`, the
    /// proxy's id); only the instance that stored it can serve it.
    pub(crate) previous_response: Option<String>,
    /// The request ends its session (an end header is `true`): the table's entry goes once it
    /// is answered, and llm-d's cookie is cleared.
    pub(crate) ends_session: bool,
}

/// A relayed event stream's scanner: the bytes to relay for each chunk, and what the stream
/// said (output tokens, the realized hit, whether it finished and ended).
pub(crate) trait StreamScan: Send {
    /// The bytes to relay for `chunk` (whole events; a part waits for the rest).
    fn feed(&mut self, chunk: Bytes) -> Bytes;
    /// Output tokens seen so far.
    fn tokens(&self) -> u64;
    /// The prompt tokens the engine served from its cache, once its usage was seen.
    fn cached_tokens(&self) -> Option<u64>;
    /// Whether the answer finished (a finish reason, a terminal event).
    fn finished(&self) -> bool;
    /// Whether the stream's own end marker was seen.
    fn done(&self) -> bool;
}

/// One API of the native path.
pub(crate) trait Protocol: Sync {
    /// The metric's and the record's name (`chat`, `completions`, `messages`, `responses`).
    fn name(&self) -> &'static str;
    /// The path it is posted to (and forwarded to).
    fn path(&self) -> &'static str;
    /// Whether the control plane armed it.
    fn armed(&self, apis: NativeApis) -> bool;
    /// The routing plan of a body the native path serves exactly as the app would, or why not
    /// (the checks every API shares — lone surrogates, long digit runs — are the caller's).
    /// `ids`: a chat template's source, else plain ChatML's approximate ids in its chunk size.
    fn plan(&self, raw: &[u8], session: Option<String>, ids: Ids<'_>) -> Result<Plan, Unplanned>;
    /// The scanner of a stream from `instance`.
    fn scanner(&self, ids: &Arc<ResponseIds>, hide_usage: bool, instance: &str) -> Box<dyn StreamScan>;
    /// A whole answer's `(output tokens, cached prompt tokens)`.
    fn usage(&self, answer: &[u8]) -> (Option<u64>, Option<u64>);
    /// Fields a PD prefill leg sets besides the protocol's own (`native/pd.rs`), as JSON.
    fn prefill_overrides(&self) -> &'static [(&'static str, &'static str)] {
        &[]
    }
    /// The body of a follow-up pinned to a stored response ([`Plan::previous_response`]) as
    /// the engine that stored it takes it (the proxy's id replaced by `engine_id`); None: the
    /// API has no stored responses, or the body is not an object.
    fn pinned_body(&self, _raw: &[u8], _engine_id: &str) -> Option<Bytes> {
        None
    }
    /// A whole answer as the client gets it (ids rewritten where the API has them).
    fn relay_whole(&self, _ids: &ResponseIds, whole: Bytes, _instance: &str) -> Bytes {
        whole
    }
    /// A client's mistake in the API's shape (`Api.reject` of a `RequestError`): `param` the
    /// field it names.
    fn client_error(
        &self,
        status: StatusCode,
        message: &str,
        code: Option<&str>,
        param: Option<&str>,
    ) -> Response<Body> {
        let body = serde_json::json!({"error": {"message": message, "type": "invalid_request_error", "param": param, "code": code}});
        json_response(status, body.to_string())
    }
    /// The proxy's own failure in the API's shape (`Api.fail` of a `ProxyError`).
    fn proxy_error(&self, status: u16, message: &str, kind: &str) -> Response<Body> {
        json_response(
            StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            openai_error_json(status, message, kind),
        )
    }
    /// What a stream cut after the client had `sent` (the events it was sent) is continued with,
    /// built from `body` (the request as the first attempt sent it), and how the continuation's
    /// events join the client's stream — both from one decoding of `sent`. `resumed`: the stream
    /// was continued before (a second cut).
    fn continuation(&self, body: &[u8], sent: &[u8], resumed: bool) -> Continued;
    /// What ends a started stream with the proxy's error (`Api.stream_failure` of a 503).
    fn stream_failure(&self, message: &str) -> Bytes;
    /// What ends a stream whose upstream ended without its own end marker.
    fn end_marker(&self) -> &'static [u8];
}

/// The proxy's own error as OpenAI's body (`errors.ProxyError.body`).
pub(crate) fn openai_error_json(status: u16, message: &str, kind: &str) -> String {
    serde_json::json!({"error": {"message": message, "type": kind, "param": null, "code": status}}).to_string()
}

/// Why a body has no native plan.
#[derive(Debug)]
pub(crate) enum Unplanned {
    /// The app answers it (its refusal says why).
    App,
    /// A model the fleet does not serve (vLLM's 404, answered by the native path).
    UnknownModel(String),
    /// A body the app refuses with this 400 (the parser's message, the field it names): the
    /// native path answers it in the API's shape.
    Refused {
        message: String,
        param: Option<&'static str>,
        /// The error's `code` (None: JSON null).
        code: Option<&'static str>,
    },
    /// An end header (named) that is neither true nor false: the app's 400 (`invalid_session_end`),
    /// which comes before it reads the body, and a client error of its kind.
    BadEndHeader(&'static str),
    /// A body the app's rendering refuses with this 400 (`param: messages`) — after its model
    /// check, so a model the fleet does not serve is the answer first (`model`: the body's).
    Unrenderable {
        message: &'static str,
        model: Option<String>,
    },
}

impl Unplanned {
    /// A body the app refuses with a 400 saying `message` (naming `param`).
    pub(crate) fn refused(message: impl Into<String>, param: Option<&'static str>) -> Self {
        Self::Refused {
            message: message.into(),
            param,
            code: None,
        }
    }
}

/// The app's 400 for a Messages or Responses body that is not JSON (its decoder's first check
/// after the nesting limit; `smetric_vllm::json_syntax_error`, which the app words it with), or
/// None when the app might read it. O(body), on a body that did not plan.
pub(crate) fn malformed(raw: &[u8]) -> Option<Unplanned> {
    smetric_vllm::json_syntax_error(raw).map(|message| Unplanned::refused(message, None))
}

/// How a body's text becomes routing ids: a chat template's source (tokenizer mode, or
/// approximate ids of the template's text), else approximate ids of plain ChatML in chunks of
/// `chunk` bytes (`--approx-chunk-bytes`, the app's `approx_chunk_bytes`).
#[derive(Clone, Copy)]
pub(crate) struct Ids<'a> {
    pub(crate) template: Option<&'a TokenSource>,
    pub(crate) chunk: usize,
}

impl Ids<'static> {
    /// Plain ChatML's approximate ids in 4-byte chunks (the default).
    #[cfg(test)]
    pub(crate) const CHATML: Self = Self {
        template: None,
        chunk: crate::shared::BYTE_CHUNK_BYTES,
    };
}

impl Ids<'_> {
    /// The approximate ids of `text`.
    pub(crate) fn approximate(self, text: &[u8]) -> Vec<u32> {
        chunk_ids(text, self.chunk)
    }
}

/// The plan of a body rendered to ChatML (Messages, Responses): its approximate ids and the
/// turn its messages say.
pub(crate) fn rendered_plan(body: RenderedBody, session: Option<String>, ids: Ids<'_>) -> Plan {
    Plan {
        ids: ids.approximate(&body.rendered.text),
        turn: TurnHint::Messages {
            first_turn: body.rendered.first_turn,
        },
        source: "approximate",
        model: body.model,
        namespace: body.cache_salt,
        hide_usage: false,
        session,
        turn_key: None,
        previous_response: None,
        ends_session: false,
    }
}

/// A body converted into the chat request vLLM renders (Messages, Responses), as JSON: what a
/// chat template is rendered on.
pub(crate) struct ChatRequest {
    /// The converted messages as the template sees them.
    pub(crate) messages: Vec<minijinja::Value>,
    /// Whether `messages` are normalised already, for the content format of the template
    /// `tools` picks (`TokenSource::content_format`): taken from the message cache.
    pub(crate) normalised: bool,
    pub(crate) tools: Option<String>,
    pub(crate) chat_template_kwargs: Option<String>,
    /// The converted roles' turn verdict; None: the verdict of the roles the template renders
    /// (the same roles, unless the conversion merged messages after it read them).
    pub(crate) first_turn: Option<bool>,
    pub(crate) model: Option<String>,
    pub(crate) cache_salt: Option<String>,
}

/// The plan of a converted body with a chat template: rendered as vLLM renders the converted
/// request (its own `add_generation_prompt`, no `continue_final_message`, no special tokens)
/// and turned into ids by `tokens`. None: the template refused it, or this port does not
/// cover it — the app's.
pub(crate) fn template_plan(request: &ChatRequest, session: Option<String>, tokens: &TokenSource) -> Option<Plan> {
    let render = RenderRequest {
        messages: if request.normalised {
            Messages::Normalised(&request.messages)
        } else {
            Messages::Values(&request.messages)
        },
        tools: request.tools.as_deref(),
        add_generation_prompt: true,
        continue_final_message: false,
        chat_template_kwargs: request.chat_template_kwargs.as_deref(),
    };
    let chat = tokens.chat_ids(&render, false).ok()?;
    let first_turn = request
        .first_turn
        .unwrap_or_else(|| smetric_core::first_turn_from_roles(chat.roles.iter().map(String::as_str)));
    Some(Plan {
        ids: chat.ids,
        turn: TurnHint::Messages { first_turn },
        source: tokens.kind(),
        model: request.model.clone(),
        namespace: request.cache_salt.clone(),
        hide_usage: false,
        session,
        turn_key: None,
        previous_response: None,
        ends_session: false,
    })
}

/// `StreamScan` for a scanner with its own `feed(Bytes)` and `tokens()` and the fields
/// `cached_tokens`, `finished` and `done` (the OpenAI and Messages streams).
macro_rules! stream_scan_by_fields {
    ($scanner:ty) => {
        impl $crate::native::protocol::StreamScan for $scanner {
            fn feed(&mut self, chunk: ::bytes::Bytes) -> ::bytes::Bytes {
                <$scanner>::feed(self, chunk)
            }

            fn tokens(&self) -> u64 {
                <$scanner>::tokens(self)
            }

            fn cached_tokens(&self) -> Option<u64> {
                self.cached_tokens
            }

            fn finished(&self) -> bool {
                self.finished
            }

            fn done(&self) -> bool {
                self.done
            }
        }
    };
}
pub(crate) use stream_scan_by_fields;
