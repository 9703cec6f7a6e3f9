//! OpenAI's chat and completions APIs on the native path: a body parsed by the proxy's own
//! parser (`smetric_vllm::parse_openai_body`); chat rendered as plain ChatML into approximate
//! ids (`chatml.rs`), completions routed on its token ids or its text's approximate ids; a
//! stream asked for its usage (the realized hit) and that usage cut from the relay when the
//! client did not ask for it. A body the parser refuses, or whose `messages` / `tools` fail the
//! app's shape checks after it, is refused here with the app's 400 (`shape_refusal`, looked at
//! only when the body does not plan). O(body length) to plan; O(event bytes) to scan.

use std::marker::PhantomData;
use std::sync::Arc;

use bytes::Bytes;
use serde_json::Value;
use serde_json::value::RawValue;
use smetric_core::{TurnHint, first_turn_from_roles};
use smetric_vllm::{Endpoint, OpenAiBody, parse_chat_body_with, parse_openai_body};

use super::chatml::{Rendered, parse_and_render, render, render_refusal};
use super::continuation::{Continued, continuation};
use super::protocol::{Ids, Plan, Protocol, StreamScan, Unplanned, openai_error_json, stream_scan_by_fields};
use super::response_ids::ResponseIds;
use super::state::NativeApis;
use super::stream::{OpenAiStream, usage_counts};
use crate::tokens::{Messages, RenderRequest};

/// Chat (`chat`) or completions.
pub(crate) struct OpenAi {
    chat: bool,
}

/// `POST /v1/chat/completions`.
pub(crate) const CHAT: OpenAi = OpenAi { chat: true };
/// `POST /v1/completions`.
pub(crate) const COMPLETIONS: OpenAi = OpenAi { chat: false };

impl Protocol for OpenAi {
    fn name(&self) -> &'static str {
        if self.chat { "chat" } else { "completions" }
    }

    fn path(&self) -> &'static str {
        if self.chat {
            "/v1/chat/completions"
        } else {
            "/v1/completions"
        }
    }

    fn armed(&self, apis: NativeApis) -> bool {
        if self.chat { apis.chat } else { apis.completions }
    }

    fn plan(&self, raw: &[u8], session: Option<String>, ids: Ids<'_>) -> Result<Plan, Unplanned> {
        let endpoint = if self.chat {
            Endpoint::Chat
        } else {
            Endpoint::Completions
        };
        // The hot path: a chat body whose messages are read in the body's own pass.
        if self.chat
            && let Some(plan) = one_pass_chat_plan(raw, session.as_deref(), ids)
        {
            return Ok(plan);
        }
        // Every other body, and every body that does not plan: the app parses with the same
        // parser (`request.parse_request`), so its error is the 400.
        let body = parse_openai_body(raw, endpoint).map_err(|e| Unplanned::refused(e.message, e.param))?;
        let (messages, tools) = (body.messages, body.tools);
        // Only a body that does not plan is looked at again, for the app's own 400: its shape
        // checks, then (plain ChatML: no template) its rendering's.
        let plain_chatml = self.chat && ids.template.is_none();
        plan(self.chat, body, session, ids, ReadMessages::AsText).ok_or_else(|| {
            shape_refusal(messages, tools)
                .or_else(|| plain_chatml.then(|| unrenderable(raw, endpoint)).flatten())
                .unwrap_or(Unplanned::App)
        })
    }

    fn scanner(&self, _ids: &Arc<ResponseIds>, hide_usage: bool, _instance: &str) -> Box<dyn StreamScan> {
        // Chat's stream opens with a role chunk that carries no token.
        Box::new(OpenAiStream::new(u64::from(self.chat), hide_usage))
    }

    fn usage(&self, answer: &[u8]) -> (Option<u64>, Option<u64>) {
        usage_counts(answer)
    }

    fn continuation(&self, body: &[u8], sent: &[u8], _resumed: bool) -> Continued {
        continuation(self.chat, body, sent)
    }

    fn stream_failure(&self, message: &str) -> Bytes {
        let error = openai_error_json(503, message, "ServiceUnavailableError");
        Bytes::from(format!("data: {error}\n\ndata: [DONE]\n\n"))
    }

    fn end_marker(&self) -> &'static [u8] {
        b"data: [DONE]\n\n"
    }
}

stream_scan_by_fields!(OpenAiStream);

/// The app's 400 for a parsed body whose `messages` or `tools` have the wrong shape
/// (`request._messages` and `parse_request`'s tools check, in that order), or None: not one of
/// those (the app answers whatever else it is). O(messages) on a body that did not plan.
fn shape_refusal(messages: Option<&str>, tools: Option<&str>) -> Option<Unplanned> {
    let refused = |message: String, param: &'static str| Unplanned::refused(message, Some(param));
    if let Some(messages) = messages {
        let Ok(Value::Array(messages)) = serde_json::from_str::<Value>(messages) else {
            return None;
        };
        if messages.is_empty() {
            return Some(refused("messages must be a non-empty list".to_owned(), "messages"));
        }
        for (i, m) in messages.iter().enumerate() {
            let problem = match m {
                Value::Object(m) => match (m.get("role"), m.get("content")) {
                    (Some(Value::String(_)), None | Some(Value::Null | Value::String(_))) => None,
                    (Some(Value::String(_)), Some(Value::Array(parts))) => {
                        (!parts.iter().all(|p| p.is_object() || p.is_string()))
                            .then_some("content parts must be objects")
                    }
                    (Some(Value::String(_)), Some(_)) => Some("content must be a string, a list of parts or null"),
                    _ => Some("role must be a string"),
                },
                _ => {
                    return Some(refused(format!("messages[{i}] must be an object"), "messages"));
                }
            };
            if let Some(problem) = problem {
                return Some(refused(format!("messages[{i}].{problem}"), "messages"));
            }
        }
    }
    if let Some(tools) = tools
        && let Ok(Value::Array(tools)) = serde_json::from_str::<Value>(tools)
        && !tools.iter().all(Value::is_object)
    {
        return Some(refused("tools must be a list of objects".to_owned(), "tools"));
    }
    None
}

/// The app's rendering refusal of a chat body that did not plan (parsed again: this is the
/// refused path, not the hot one), or None.
fn unrenderable(raw: &[u8], endpoint: Endpoint) -> Option<Unplanned> {
    let body = parse_openai_body(raw, endpoint).ok()?;
    let message = render_refusal(&body)?;
    Some(Unplanned::Unrenderable {
        message,
        model: body.model,
    })
}

/// A chat body's messages as [`plan`] gets them.
enum ReadMessages<'a> {
    /// As the body's JSON text ([`OpenAiBody::messages`]), read by the plan.
    AsText,
    /// Rendered as plain ChatML in the body's own pass (approximate ids).
    Rendered(Rendered),
    /// Each message's JSON text, split in the body's own pass (the template's message cache
    /// looks each up by its text).
    Split(Vec<&'a RawValue>),
}

/// The plan of a chat body whose messages were read in the body's own pass
/// (`smetric_vllm::parse_chat_body_with`): rendered as ChatML without a template, split into
/// each message's text with one — the messages, most of the body, scanned once rather than
/// twice. `None` for every body that does not plan this way: the two-pass path then plans it
/// or words its refusal, exactly as before (the one pass refuses nothing itself).
fn one_pass_chat_plan(raw: &[u8], session: Option<&str>, ids: Ids<'_>) -> Option<Plan> {
    let (body, messages) = match ids.template {
        None => parse_and_render(raw).map(|(body, rendered)| (body, ReadMessages::Rendered(rendered)))?,
        Some(_) => parse_chat_body_with(raw, PhantomData::<Vec<&RawValue>>)
            .map(|(body, split)| (body, ReadMessages::Split(split)))?,
    };
    plan(true, body, session.map(str::to_owned), ids, messages)
}

/// The plan of a chat (`chat`) or completions body.
fn plan(
    chat: bool,
    body: OpenAiBody<'_>,
    session: Option<String>,
    ids: Ids<'_>,
    read: ReadMessages<'_>,
) -> Option<Plan> {
    let tokens = ids.template;
    if body.kv_transfer_params {
        return None;
    }
    if let Some(tools) = body.tools {
        let tools: Vec<&serde_json::value::RawValue> = serde_json::from_str(tools).ok()?;
        if !tools.iter().all(|t| t.get().starts_with('{')) {
            return None;
        }
    }
    // Without messages a session hint's turns are counted in the session table (`session_hint`:
    // the headers', else the body's `prompt_cache_key`, else its `user`); the caller counts.
    let turn_key = if chat {
        None
    } else {
        session.clone().or_else(|| {
            [&body.prompt_cache_key, &body.user]
                .into_iter()
                .find_map(|v| v.as_deref().filter(|v| !v.is_empty()).map(str::to_owned))
        })
    };
    let (ids, turn, source) = if let (true, Some(tokens)) = (chat, tokens) {
        let split;
        let request = RenderRequest {
            messages: match read {
                ReadMessages::Split(raws) => {
                    split = raws;
                    Messages::Split(&split)
                }
                _ => Messages::Json(body.messages?),
            },
            tools: body.tools,
            add_generation_prompt: body.add_generation_prompt,
            continue_final_message: body.continue_final_message,
            chat_template_kwargs: body.chat_template_kwargs,
        };
        let chat_ids = tokens.chat_ids(&request, body.add_special_tokens).ok()?;
        let first_turn = first_turn_from_roles(chat_ids.roles.iter().map(String::as_str));
        (chat_ids.ids, TurnHint::Messages { first_turn }, tokens.kind())
    } else if chat {
        let rendered = match read {
            ReadMessages::Rendered(rendered) => rendered,
            _ => render(&body)?,
        };
        let first_turn = rendered.first_turn;
        (
            ids.approximate(&rendered.text),
            TurnHint::Messages { first_turn },
            "approximate",
        )
    } else {
        match body.prompt.as_ref()? {
            smetric_vllm::Prompt::Ids(ids) => (ids.clone(), TurnHint::Unknown, "ids"),
            smetric_vllm::Prompt::Text(text) => match tokens {
                Some(tokens) => (
                    tokens.text_ids(text, body.add_special_tokens).ok()?,
                    TurnHint::Unknown,
                    tokens.kind(),
                ),
                None => (ids.approximate(text.as_bytes()), TurnHint::Unknown, "approximate"),
            },
        }
    };
    // A stream asks the engine for its usage (the realized hit); a body whose own
    // `stream_options` lack it is re-encoded by the app.
    let hide_usage = match (body.stream, body.stream_options) {
        (false, _) => false,
        (true, None) => true,
        (true, Some(options)) => {
            let value: serde_json::Value = serde_json::from_str(options).ok()?;
            if value.get("include_usage") != Some(&serde_json::Value::Bool(true)) {
                return None;
            }
            false
        }
    };
    Some(Plan {
        ids,
        turn,
        source,
        model: body.model,
        namespace: body.cache_salt,
        hide_usage,
        session,
        turn_key,
        previous_response: None,
        ends_session: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokens::TokenSource;

    /// A chat body planned in one pass is planned as the two-pass path plans it — ids, turn,
    /// source and the body's fields — with plain ChatML and through a template's message cache;
    /// and every body here that plans at all plans in the one pass (it is the hot path).
    #[test]
    fn the_one_pass_plans_what_the_two_passes_do() {
        let bodies = [
            r#"{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"a\nb"}]}"#,
            r#"{"model":"m","stream":true,"cache_salt":"s","messages":[{"role":"user","content":[{"type":"text","text":"x"}]},{"role":"assistant","content":"y"},{"role":"user","content":"z"}]}"#,
            r#"{"messages":[{"role":"user","content":"q"}],"messages":[{"role":"user","content":"last wins"}]}"#,
            r#"{"messages":[{"role":"user","content":"q"}],"stream":true,"stream_options":{"include_usage":true}}"#,
            r#"{"messages":[{"role":"user","content":"q"}],"stream":true,"stream_options":{}}"#,
            r#"{"messages":[{"role":"user","content":"q"}],"kv_transfer_params":{}}"#,
            r#"{"messages":[{"role":"user","content":"q"}],"tools":[3]}"#,
            r#"{"messages":[]}"#,
            r#"{"messages":[{"role":"user","content":3}]}"#,
            r#"{"messages":"text"}"#,
        ];
        let source = TokenSource::for_tests(TokenSource::PRINT_ALL);
        let templated = Ids {
            template: Some(&source),
            chunk: 1,
        };
        for ids in [Ids::CHATML, templated] {
            let mut planned = 0;
            for raw in bodies {
                let view = |p: Plan| {
                    (
                        p.ids,
                        format!("{:?}", p.turn),
                        p.source,
                        p.model,
                        p.namespace,
                        p.hide_usage,
                    )
                };
                let two = parse_openai_body(raw.as_bytes(), Endpoint::Chat)
                    .ok()
                    .and_then(|body| plan(true, body, None, ids, ReadMessages::AsText))
                    .map(view);
                let one = one_pass_chat_plan(raw.as_bytes(), None, ids).map(view);
                assert_eq!(one, two, "{raw}");
                planned += usize::from(one.is_some());
            }
            assert_eq!(planned, 4, "the first four bodies plan");
        }
    }
}
