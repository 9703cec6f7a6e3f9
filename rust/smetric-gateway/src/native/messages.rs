//! Anthropic's Messages API on the native path: a `POST /v1/messages` body validated and
//! rendered as `smetric serve --tokens approximate` renders it, its event stream scanned, and
//! its error shape.
//!
//! **Rendering.** vLLM answers a Messages request by converting it into a chat request
//! (`python/smetric/anthropic.py`, `to_chat`, whose module docs say how) and rendering that with
//! the chat template; without a template the app renders plain ChatML, in which a converted
//! message shows only its role and the text of its content. So only the conversion's text is
//! built here, message by message: the leading system message (`system` as a string, or its
//! text blocks joined, Claude Code's billing block skipped); inline system messages where they
//! stand; a string content as is; of blocks, the non-empty `text` blocks joined, a user's
//! `tool_result` as a `tool` message *before* its user message (text items joined with `\n`;
//! its images a user message of their own, its tool references a `tool` message — both
//! without text), an assistant's `tool_result` as the text `Tool result: …`; a user message
//! left without content is dropped. The roles give the turn, as for chat.
//!
//! **Tokenizer mode** renders the same conversion with the model's chat template, each message
//! through the message cache (`tokens/conversation.rs`): an Anthropic message converts from its
//! own text alone, so a session's next turn, which re-sends its history byte for byte, reads,
//! converts and normalises only its new messages (`tokenized_plan`); a body with an inline system
//! message is converted whole (`whole_tokenized_plan`), since its text may join the leading one.
//!
//! **Validation** is `to_chat`'s, field by field; a body it would refuse — or one whose text
//! Python would build with its own `str()` of a non-string, which is not reproduced — does not
//! plan: `to_chat`'s errors are answered here (`to_chat_refusal`), anything else by the app.
//!
//! **Stream** (`MessagesStream` of `apis/messages.py`): `event: NAME\ndata: {…}` events; each
//! `content_block_delta` but a signature is one output token; a `message_delta` with a
//! `stop_reason` finishes the answer; `message_stop` ends the stream; `cache_read_input_tokens`
//! in `message_start` or `message_delta` is the realized hit.
//!
//! **A cut stream** (`MessagesApi.continuation`) is continued over the engine's chat endpoint:
//! [`continuation_body`] builds the chat request from this file's conversion with the text so
//! far as the final assistant message; `anthropic_events.rs` decodes what the client has and
//! translates the chat chunks back.
//!
//! O(body length): one borrowed parse of the body, one of each message, one copy of the text;
//! in tokenizer mode a kept message costs a hash and a comparison of its text instead.

use std::borrow::Cow;
use std::fmt::Write;

use bytes::Bytes;
use minijinja::value::Serde;
use serde::ser::{SerializeMap, Serializer};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use std::sync::Arc;

use hyper::{Response, StatusCode};

use super::anthropic_events::{ChatTranslation, MESSAGE_STOP, Received, Resent, counts_a_token, event_name};
use super::chatml::{Rendered, RenderedBody};
use super::continuation::{Continued, truthy as value_truthy};
use super::json::{
    self, Entries, Obj, RawJson, TextOrList, is_object, json_str, list, object, ordered_entries, string,
};
use super::protocol::{
    ChatRequest, Ids, Plan, Protocol, StreamScan, Unplanned, malformed, rendered_plan, stream_scan_by_fields,
    template_plan,
};
use super::response_ids::ResponseIds;
use super::sse::{Pending, contains, data_of};
use super::state::NativeApis;
use crate::answers::{Body as AnswerBody, json_response};
use crate::tokens::{CachedText, ContentFormat, LeadingSystem, MessageCache, TokenSource, normalise};

use crate::shared::BILLING_HEADER_PREFIX;

#[derive(Deserialize)]
#[serde(bound(deserialize = "M: Deserialize<'de>"))]
struct Body<'a, M> {
    #[serde(borrow, default)]
    model: Option<&'a RawValue>,
    #[serde(borrow, default)]
    max_tokens: Option<&'a RawValue>,
    #[serde(borrow, default)]
    stream: Option<&'a RawValue>,
    #[serde(default)]
    messages: Option<Vec<M>>,
    #[serde(borrow, default)]
    system: Option<&'a RawValue>,
    #[serde(borrow, default)]
    tools: Option<&'a RawValue>,
    #[serde(borrow, default)]
    tool_choice: Option<&'a RawValue>,
    #[serde(borrow, default)]
    thinking: Option<&'a RawValue>,
    #[serde(borrow, default)]
    output_config: Option<&'a RawValue>,
    #[serde(borrow, default)]
    chat_template_kwargs: Option<&'a RawValue>,
    #[serde(borrow, default)]
    cache_salt: Option<&'a RawValue>,
    #[serde(borrow, default)]
    kv_transfer_params: Option<&'a RawValue>,
}

/// A message, read in the body's one pass: its strings decoded where they stand (a value of
/// another type than the rule allows fails the parse, so the body goes to the app, as the
/// conversion's `None` would send it).
#[derive(Deserialize)]
struct Message<'a> {
    #[serde(borrow, default)]
    role: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    content: Option<MessageContent<'a>>,
}

/// A message's content: a string, or a list of blocks (anything else is not a message the
/// conversion takes).
type MessageContent<'a> = TextOrList<'a, Obj<Block<'a>>>;

/// How the body's pass reads `messages`' elements: typed in that pass (`Obj<Message>`, kept as
/// the message), or as their JSON texts (tokenizer mode looks each up in the message cache by its
/// text, and reads only the ones it lacks).
trait MessageRead<'a>: Deserialize<'a> {
    type Kept;
    fn kept(self) -> Self::Kept;
}

impl<'a> MessageRead<'a> for Obj<Message<'a>> {
    type Kept = Message<'a>;
    fn kept(self) -> Message<'a> {
        self.0
    }
}

impl<'a> MessageRead<'a> for &'a RawValue {
    type Kept = &'a RawValue;
    fn kept(self) -> &'a RawValue {
        self
    }
}

/// A content block; `type`, `text` and `thinking` must be strings where present (`blocks_valid`
/// checks the rest of `_check_blocks`).
#[derive(Deserialize)]
struct Block<'a> {
    #[serde(borrow, default, rename = "type")]
    kind: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    name: Option<&'a RawValue>,
    #[serde(borrow, default)]
    tool_use_id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    text: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    thinking: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    input: Option<&'a RawValue>,
    #[serde(borrow, default)]
    content: Option<&'a RawValue>,
    #[serde(borrow, default)]
    source: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct Item<'a> {
    #[serde(borrow, default, rename = "type")]
    kind: Option<&'a RawValue>,
    #[serde(borrow, default)]
    text: Option<&'a RawValue>,
    #[serde(borrow, default)]
    tool_name: Option<&'a RawValue>,
    #[serde(borrow, default)]
    name: Option<&'a RawValue>,
    #[serde(borrow, default)]
    source: Option<&'a RawValue>,
}

/// Python's truthiness of a JSON value that is not a string (`None` for a string).
fn falsy_non_string(raw: &RawValue) -> Option<bool> {
    match raw.get() {
        "null" | "false" | "0" | "[]" | "{}" => Some(true),
        s if s.starts_with('"') => None,
        // A number Python reads as zero in another spelling (`0.0`, `-0`): not worth telling apart.
        s if s.bytes().all(|b| b"-+0.eE".contains(&b)) => None,
        s if s.starts_with(['[', '{']) => Some(s[1..s.len() - 1].trim().is_empty()),
        _ => Some(false),
    }
}

/// Python's truthiness of any JSON value (`None`: not told apart here).
fn truthy(raw: &RawValue) -> Option<bool> {
    match string(raw) {
        Some(s) => Some(!s.is_empty()),
        None => falsy_non_string(raw).map(|falsy| !falsy),
    }
}

/// A positive integer (Python's `int`, not `bool`), or None.
fn positive(raw: &RawValue) -> Option<u64> {
    raw.get().parse::<u64>().ok().filter(|&n| n >= 1)
}

/// A body validated as `to_chat` validates it (see the module docs); its messages typed, or
/// (tokenizer mode's cached path) their JSON texts, each read as a [`Message`] where it is.
struct Checked<'a, M = Message<'a>> {
    model: String,
    cache_salt: Option<String>,
    system: Option<&'a RawValue>,
    messages: Vec<M>,
    tools: Option<&'a RawValue>,
    thinking: Option<&'a RawValue>,
    output_config: Option<&'a RawValue>,
    chat_template_kwargs: Option<&'a RawValue>,
}

/// The body checked, or None: the app's to answer. `count_tokens`: a `count_tokens` body (no
/// `max_tokens`, as `to_chat(count_tokens=True)`).
/// O(body): one pass reads the fields and decodes the messages' strings.
fn check<'a, M: MessageRead<'a>>(raw: &'a [u8], count_tokens: bool) -> Option<Checked<'a, M::Kept>> {
    let body: Body<'a, M> = json::body_object(raw)?;
    if body.kv_transfer_params.is_some() {
        return None;
    }
    let model = string(body.model?)?.into_owned();
    if !count_tokens {
        positive(body.max_tokens?)?;
    }
    // `stream` is the engine's to read; here it must be a boolean (or absent).
    if body.stream.is_some_and(|s| !matches!(s.get(), "true" | "false")) {
        return None;
    }
    let messages: Vec<M::Kept> = body.messages?.into_iter().map(M::kept).collect();
    if messages.is_empty() {
        return None;
    }
    check_tools(body.tools)?;
    check_tool_choice(body.tool_choice)?;
    check_thinking(body.thinking, body.output_config)?;
    if body.chat_template_kwargs.is_some_and(|k| !is_object(k)) {
        return None;
    }
    let cache_salt = match body.cache_salt {
        None => None,
        Some(salt) => Some(string(salt).filter(|s| !s.is_empty())?.into_owned()),
    };
    Some(Checked {
        model,
        cache_salt,
        system: body.system,
        messages,
        tools: body.tools,
        thinking: body.thinking,
        output_config: body.output_config,
        chat_template_kwargs: body.chat_template_kwargs,
    })
}

/// [`check`] with the messages typed in the body's pass.
fn check_typed(raw: &[u8], count_tokens: bool) -> Option<Checked<'_>> {
    check::<Obj<Message<'_>>>(raw, count_tokens)
}

/// The body validated and rendered (see the module docs), or None: the app's to answer.
pub(crate) fn plan(raw: &[u8]) -> Option<RenderedBody> {
    let body = check_typed(raw, false)?;
    let chat = convert_body(&body, false)?;
    let mut text = Vec::new();
    for message in &chat {
        message.push_chatml(&mut text);
    }
    text.extend_from_slice(b"<|im_start|>assistant\n");
    Some(RenderedBody {
        rendered: Rendered {
            text,
            first_turn: first_turn(&chat),
        },
        model: Some(body.model),
        cache_salt: body.cache_salt,
    })
}

/// A `count_tokens` body validated and converted as the app's `to_chat(count_tokens=True)`
/// does (nothing rendered: the engine counts with its own): its model, or None (the app's).
pub(crate) fn count_tokens_model(raw: &[u8]) -> Option<String> {
    let body = check_typed(raw, true)?;
    convert_body(&body, false)?;
    Some(body.model)
}

/// `to_chat`'s 400 for a body that does not validate (`smetric.anthropic.to_chat`, its checks
/// in its order, so the error is the app's first: the body an object; `model`; `max_tokens`
/// unless `count_tokens`; `stream`; `messages` a non-empty list, each message an object with a
/// known role and a string or valid blocks; `system`; `tools`; `tool_choice`; `thinking` and
/// `output_config`; `chat_template_kwargs`; `cache_salt`), or None: it validates, or it is not
/// told apart here (a malformed body: `protocol::malformed`; a number Python reads as another
/// type: the app's). O(body) on a body that did not plan.
fn to_chat_refusal(raw: &[u8], count_tokens: bool) -> Option<Unplanned> {
    let whole = json::body(raw)?;
    let Ok(Value::Object(body)) = serde_json::from_str::<Value>(whole.get()) else {
        return Some(Unplanned::refused("the request body must be a JSON object", None));
    };
    if !body.get("model").is_some_and(Value::is_string) {
        return Some(Unplanned::refused("model: a string is required", Some("model")));
    }
    if !count_tokens && !json::python_int_at_least(body.get("max_tokens"), 1)? {
        return Some(Unplanned::refused(
            "max_tokens: an integer of at least 1 is required",
            Some("max_tokens"),
        ));
    }
    if !matches!(body.get("stream"), None | Some(Value::Null | Value::Bool(_))) {
        return Some(Unplanned::refused("stream must be a boolean", Some("stream")));
    }
    let Some(Value::Array(messages)) = body
        .get("messages")
        .filter(|m| m.as_array().is_some_and(|m| !m.is_empty()))
    else {
        return Some(Unplanned::refused(
            "messages: a non-empty list is required",
            Some("messages"),
        ));
    };
    for (i, message) in messages.iter().enumerate() {
        let where_ = format!("messages.{i}");
        let Value::Object(message) = message else {
            return Some(Unplanned::refused(
                format!("{where_}: a message must be an object"),
                Some("messages"),
            ));
        };
        let role = message.get("role").and_then(Value::as_str);
        if !matches!(role, Some("user" | "assistant" | "system")) {
            return Some(Unplanned::refused(
                format!("{where_}.role must be one of user, assistant, system"),
                Some("messages"),
            ));
        }
        let content = message.get("content");
        if !content.is_some_and(Value::is_string)
            && let Some(refused) = blocks_refusal(content, &format!("{where_}.content"))
        {
            return Some(refused);
        }
    }
    let system = body.get("system");
    if !matches!(system, None | Some(Value::Null | Value::String(_)))
        && let Some(refused) = blocks_refusal(system, "system")
    {
        return Some(refused);
    }
    match body.get("tools") {
        None | Some(Value::Null) => {}
        Some(Value::Array(tools)) => {
            for (i, tool) in tools.iter().enumerate() {
                if !tool.get("name").is_some_and(Value::is_string) || !tool.is_object() {
                    return Some(Unplanned::refused(
                        format!("tools.{i}: a tool needs a string name"),
                        Some("tools"),
                    ));
                }
                if !tool.get("input_schema").is_some_and(Value::is_object) {
                    return Some(Unplanned::refused(
                        format!("tools.{i}.input_schema must be an object"),
                        Some("tools"),
                    ));
                }
            }
        }
        Some(_) => return Some(Unplanned::refused("tools must be a list", Some("tools"))),
    }
    match body.get("tool_choice") {
        None | Some(Value::Null) => {}
        Some(choice) => {
            let kind = choice
                .get("type")
                .and_then(Value::as_str)
                .filter(|_| choice.is_object());
            if !matches!(kind, Some("auto" | "any" | "tool" | "none")) {
                return Some(Unplanned::refused(
                    "tool_choice.type must be one of auto, any, tool, none",
                    Some("tool_choice"),
                ));
            }
            if kind == Some("tool") && !choice.get("name").is_some_and(Value::is_string) {
                return Some(Unplanned::refused(
                    "tool_choice of type tool needs a name",
                    Some("tool_choice"),
                ));
            }
        }
    }
    match body.get("thinking") {
        None | Some(Value::Null) => {}
        Some(thinking) => {
            let kind = thinking
                .get("type")
                .and_then(Value::as_str)
                .filter(|_| thinking.is_object());
            if !matches!(kind, Some("enabled" | "disabled" | "adaptive")) {
                return Some(Unplanned::refused(
                    "thinking.type must be enabled, disabled or adaptive",
                    Some("thinking"),
                ));
            }
            if kind == Some("enabled") && !json::python_int_at_least(thinking.get("budget_tokens"), 1024)? {
                return Some(Unplanned::refused(
                    "thinking.budget_tokens: an integer of at least 1024 is required",
                    Some("thinking"),
                ));
            }
        }
    }
    match body.get("output_config") {
        None | Some(Value::Null) => {}
        Some(Value::Object(config)) => {
            if !matches!(config.get("effort"), None | Some(Value::Null | Value::String(_))) {
                return Some(Unplanned::refused(
                    "output_config.effort must be a string",
                    Some("output_config"),
                ));
            }
        }
        Some(_) => {
            return Some(Unplanned::refused(
                "output_config must be an object",
                Some("output_config"),
            ));
        }
    }
    if !matches!(
        body.get("chat_template_kwargs"),
        None | Some(Value::Null | Value::Object(_))
    ) {
        return Some(Unplanned::refused(
            "chat_template_kwargs must be an object",
            Some("chat_template_kwargs"),
        ));
    }
    match body.get("cache_salt") {
        None | Some(Value::Null) => None,
        Some(Value::String(salt)) if !salt.is_empty() => None,
        Some(_) => Some(Unplanned::refused(
            "cache_salt must be a non-empty string",
            Some("cache_salt"),
        )),
    }
}

/// The app's 400 for a `count_tokens` body that does not validate or is not JSON, or None.
pub(crate) fn count_tokens_refusal(raw: &[u8]) -> Option<Unplanned> {
    to_chat_refusal(raw, true).or_else(|| malformed(raw))
}

/// `_check_blocks`: `blocks` a list of objects with a string `type`, their `text` and
/// `thinking` strings when given, a `tool_use` block's `input` an object when given.
fn blocks_refusal(blocks: Option<&Value>, where_: &str) -> Option<Unplanned> {
    let Some(Value::Array(blocks)) = blocks else {
        return Some(Unplanned::refused(
            format!("{where_}: a string or a list of content blocks is required"),
            None,
        ));
    };
    for (j, block) in blocks.iter().enumerate() {
        let Some(kind) = block.get("type").and_then(Value::as_str).filter(|_| block.is_object()) else {
            return Some(Unplanned::refused(
                format!("{where_}.{j}: a content block needs a string type"),
                None,
            ));
        };
        for key in ["text", "thinking"] {
            if !matches!(block.get(key), None | Some(Value::Null | Value::String(_))) {
                return Some(Unplanned::refused(format!("{where_}.{j}.{key} must be a string"), None));
            }
        }
        if kind == "tool_use" && !matches!(block.get("input"), None | Some(Value::Null | Value::Object(_))) {
            return Some(Unplanned::refused(
                format!("{where_}.{j}.input must be an object"),
                None,
            ));
        }
    }
    None
}

/// The turn the converted roles say (as for chat).
fn first_turn(chat: &[ChatMessage<'_>]) -> bool {
    smetric_core::first_turn_from_roles(chat.iter().map(|m| m.role))
}

/// Tokenizer mode's plan: the conversion as the chat request vLLM renders with the model's
/// template, encoded. None: the app's.
///
/// The messages go through the message cache (`tokens/conversation.rs`): an Anthropic message
/// converts into chat messages from its own text alone, so its normalised chat messages are kept
/// by that text (and the `system` field's by its text), and a session's next turn, which re-sends
/// its history byte for byte, reads, converts and normalises only its new messages. A body with
/// an inline system message, whose text may join the leading one, is converted whole
/// ([`whole_tokenized_plan`]).
fn tokenized_plan(raw: &[u8], session: Option<String>, tokens: &TokenSource) -> Option<Plan> {
    let body = check::<&RawValue>(raw, false)?;
    let tools = match body.tools {
        None => None,
        Some(tools) => Some(chat_tools(tools)?),
    };
    if matches!(tokens.requires_leading_system(tools.is_some()), LeadingSystem::Unknown) {
        return None;
    }
    let format = tokens.content_format(tools.is_some());
    let Cached::Conversation(messages) = cached_conversation(&body, format, tokens.message_cache())? else {
        return whole_tokenized_plan(raw, session, tokens);
    };
    let request = ChatRequest {
        first_turn: None,
        messages,
        normalised: true,
        tools,
        chat_template_kwargs: template_kwargs(&body)?,
        model: Some(body.model),
        cache_salt: body.cache_salt,
    };
    template_plan(&request, session, tokens)
}

/// What [`cached_conversation`] made of a body.
enum Cached {
    /// The conversation as the template sees it.
    Conversation(Vec<minijinja::Value>),
    /// The body has an inline system message: the caller converts it whole.
    InlineSystem,
}

/// The body's conversation normalised for `format` through `cache`, or None: the app's.
fn cached_conversation(body: &Checked<'_, &RawValue>, format: ContentFormat, cache: &MessageCache) -> Option<Cached> {
    let mut out = Vec::with_capacity(body.messages.len() + 1);
    if let Some(system) = body.system {
        let kept = cache
            .find(&[system.get()], CachedText::AnthropicSystem, format)
            .pop()
            .flatten();
        let leading = if let Some(kept) = kept {
            kept
        } else {
            let chat: Vec<ChatMessage<'_>> = leading_system(system_field_text(Some(system))?).into_iter().collect();
            let fresh = normalised(&chat, format)?;
            cache.keep(&[(system.get(), fresh.clone())], CachedText::AnthropicSystem, format);
            fresh
        };
        out.extend(leading.iter().cloned());
    }
    let texts: Vec<&str> = body.messages.iter().map(|m| m.get()).collect();
    let found = cache.find(&texts, CachedText::AnthropicMessage, format);
    let mut fresh = Vec::new();
    for (raw, kept) in body.messages.iter().zip(found) {
        let converted = if let Some(kept) = kept {
            kept
        } else {
            let message: Message<'_> = object(raw)?;
            if message.role.as_deref() == Some("system") {
                return Some(Cached::InlineSystem);
            }
            let mut chat = Vec::new();
            convert(&mut chat, &message, false)?;
            let converted = normalised(&chat, format)?;
            fresh.push((raw.get(), converted.clone()));
            converted
        };
        out.extend(converted.iter().cloned());
    }
    cache.keep(&fresh, CachedText::AnthropicMessage, format);
    Some(Cached::Conversation(out))
}

/// Chat messages as the template sees them (for `format`), or None: the app's (the template's
/// conversation refuses them).
fn normalised(chat: &[ChatMessage<'_>], format: ContentFormat) -> Option<Arc<[minijinja::Value]>> {
    let values: Vec<minijinja::Value> = chat.iter().map(|m| minijinja::Value::from(Serde(m))).collect();
    Some(normalise(&values, format).ok()?.into())
}

/// [`tokenized_plan`] of a body converted whole, without the message cache (`MessagesApi.
/// routing_tokens`: inline system messages merged into the leading one when the template
/// refuses a system message after the first).
fn whole_tokenized_plan(raw: &[u8], session: Option<String>, tokens: &TokenSource) -> Option<Plan> {
    let body = check_typed(raw, false)?;
    let chat = convert_body(&body, false)?;
    let first_turn = first_turn(&chat);
    let tools = match body.tools {
        None => None,
        Some(tools) => Some(chat_tools(tools)?),
    };
    let merge = match tokens.requires_leading_system(tools.is_some()) {
        LeadingSystem::Unknown => return None,
        LeadingSystem::Required => body.messages.iter().any(|m| m.role.as_deref() == Some("system")),
        LeadingSystem::Free => false,
    };
    let chat = if merge { convert_body(&body, true)? } else { chat };
    let request = ChatRequest {
        messages: chat.iter().map(|m| minijinja::Value::from(Serde(m))).collect(),
        normalised: false,
        tools,
        chat_template_kwargs: template_kwargs(&body)?,
        // Read before the inline system messages merged (the app's verdict: `to_chat`'s roles).
        first_turn: Some(first_turn),
        model: Some(body.model),
        cache_salt: body.cache_salt,
    };
    template_plan(&request, session, tokens)
}

/// One message of the chat conversion (`to_chat`'s): what ChatML prints of it (its role and
/// text) and what a chat template sees.
struct ChatMessage<'a> {
    role: &'static str,
    content: Content<'a>,
    reasoning: Option<String>,
    tool_calls: Vec<ToolCall<'a>>,
    /// A `tool` message's `tool_call_id` (`block.get("tool_use_id") or ""`), as JSON.
    tool_call_id: Option<Cow<'a, str>>,
}

enum Content<'a> {
    /// No `content` key (an assistant message of tool calls only, say).
    Absent,
    Text(Cow<'a, str>),
    Parts(Vec<Part<'a>>),
}

enum Part<'a> {
    Text(Cow<'a, str>),
    /// An image's URL (`_image_url`).
    Image(String),
    /// A tool reference's name, as JSON.
    Reference(&'a RawValue),
}

/// `{"id": …, "type": "function", "function": {"name": …, "arguments": json.dumps(input)}}`,
/// its fields as JSON.
struct ToolCall<'a> {
    id: Cow<'a, str>,
    name: Cow<'a, str>,
    /// The input object's JSON (`{}` for none): the template sees it decoded.
    input: &'a str,
}

impl<'a> ChatMessage<'a> {
    fn new(role: &'static str, content: Content<'a>) -> Self {
        Self {
            role,
            content,
            reasoning: None,
            tool_calls: Vec::new(),
            tool_call_id: None,
        }
    }

    /// `<|im_start|>{role}\n{text}<|im_end|>\n`, the text of the content's text parts.
    fn push_chatml(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(b"<|im_start|>");
        out.extend_from_slice(self.role.as_bytes());
        out.push(b'\n');
        match &self.content {
            Content::Absent => {}
            Content::Text(t) => out.extend_from_slice(t.as_bytes()),
            Content::Parts(parts) => {
                for part in parts {
                    if let Part::Text(t) = part {
                        out.extend_from_slice(t.as_bytes());
                    }
                }
            }
        }
        out.extend_from_slice(b"<|im_end|>\n");
    }
}

/// The message as the chat request has it: serialized as its JSON (the continuation's body) or
/// straight into the values a chat template sees (`minijinja::Value::from_serialize`, no JSON
/// text in between), keys in the conversion's order.
impl Serialize for ChatMessage<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut m = serializer.serialize_map(None)?;
        m.serialize_entry("role", self.role)?;
        match &self.content {
            Content::Absent => {}
            Content::Text(t) => m.serialize_entry("content", t)?,
            Content::Parts(parts) => m.serialize_entry("content", parts)?,
        }
        if let Some(reasoning) = &self.reasoning {
            m.serialize_entry("reasoning", reasoning)?;
        }
        if !self.tool_calls.is_empty() {
            m.serialize_entry("tool_calls", &self.tool_calls)?;
        }
        if let Some(id) = &self.tool_call_id {
            m.serialize_entry("tool_call_id", &RawJson(id))?;
        }
        m.end()
    }
}

impl Serialize for Part<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut m = serializer.serialize_map(Some(2))?;
        match self {
            Part::Text(t) => {
                m.serialize_entry("type", "text")?;
                m.serialize_entry("text", t)?;
            }
            Part::Image(url) => {
                m.serialize_entry("type", "image_url")?;
                let mut url_map = std::collections::BTreeMap::new();
                url_map.insert("url", url.as_str());
                m.serialize_entry("image_url", &url_map)?;
            }
            Part::Reference(name) => {
                m.serialize_entry("type", "tool_reference")?;
                m.serialize_entry("name", &RawJson(name.get()))?;
            }
        }
        m.end()
    }
}

impl Serialize for ToolCall<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        /// `{"name": …, "arguments": …}`.
        struct Function<'a>(&'a ToolCall<'a>);
        impl Serialize for Function<'_> {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                let mut m = serializer.serialize_map(Some(2))?;
                m.serialize_entry("name", &RawJson(&self.0.name))?;
                m.serialize_entry("arguments", self.0.input)?;
                m.end()
            }
        }
        let mut m = serializer.serialize_map(Some(3))?;
        m.serialize_entry("id", &RawJson(&self.id))?;
        m.serialize_entry("type", "function")?;
        m.serialize_entry("function", &Function(self))?;
        m.end()
    }
}

/// `value or ""` as JSON: a truthy value as given, a falsy one as `""` (`None`: not told apart).
fn or_empty(value: Option<&RawValue>) -> Option<Cow<'_, str>> {
    match value {
        None => Some(Cow::Borrowed("\"\"")),
        Some(v) => Some(if truthy(v)? {
            Cow::Borrowed(v.get())
        } else {
            Cow::Borrowed("\"\"")
        }),
    }
}

/// `_system_messages` and `_convert_messages`: the whole conversion (with `merge`, inline
/// system messages join the leading one).
fn convert_body<'a>(body: &'a Checked<'a>, merge: bool) -> Option<Vec<ChatMessage<'a>>> {
    let mut system = system_field_text(body.system)?;
    if merge {
        for message in &body.messages {
            if message.role.as_deref()? == "system"
                && let Some(text) = inline_system_text(message.content.as_ref()?)?
            {
                system.push_str(&text);
            }
        }
    }
    let mut out: Vec<ChatMessage<'a>> = leading_system(system).into_iter().collect();
    for message in &body.messages {
        convert(&mut out, message, merge)?;
    }
    Some(out)
}

/// The `system` field's text (`_system_messages`' own part): empty when it has none; None: the
/// app's.
fn system_field_text(system: Option<&RawValue>) -> Option<String> {
    let mut text = String::new();
    match system {
        None => {}
        Some(raw) => match string(raw) {
            Some(given) => text.push_str(&given),
            None => {
                if let Some(given) = system_text(&blocks(raw)?) {
                    text.push_str(&given);
                }
            }
        },
    }
    Some(text)
}

/// The leading system message of its text, none when the text is empty.
fn leading_system<'a>(text: String) -> Option<ChatMessage<'a>> {
    (!text.is_empty()).then(|| ChatMessage::new("system", Content::Text(Cow::Owned(text))))
}

/// `_system_text` of an inline system message's content (a string's billing header dropped):
/// `Some(None)` when it has no text, `None` for a content the app must answer.
#[allow(clippy::option_option)]
fn inline_system_text(content: &MessageContent<'_>) -> Option<Option<String>> {
    Some(match content {
        TextOrList::Text(text) => {
            (!text.is_empty() && !text.starts_with(BILLING_HEADER_PREFIX)).then(|| text.to_string())
        }
        TextOrList::List(blocks) => system_text(valid_blocks(blocks)?),
    })
}

/// A content's blocks (the `system` field's, read apart from the messages), checked.
fn blocks(raw: &RawValue) -> Option<Vec<Obj<Block<'_>>>> {
    let blocks: Vec<Obj<Block<'_>>> = serde_json::from_str(raw.get()).ok()?;
    valid_blocks(&blocks)?;
    Some(blocks)
}

/// The blocks, when each passes `_check_blocks` (a string `type`; a `tool_use`'s `input`, if
/// any, an object; `text` and `thinking` strings, which the parse already saw to).
fn valid_blocks<'b, 'a>(blocks: &'b [Obj<Block<'a>>]) -> Option<&'b [Obj<Block<'a>>]> {
    blocks
        .iter()
        .map(|b| &b.0)
        .all(|b| b.kind.is_some() && !(kind(b) == "tool_use" && b.input.is_some_and(|i| !is_object(i))))
        .then_some(blocks)
}

fn kind<'b>(block: &'b Block<'_>) -> &'b str {
    block.kind.as_deref().unwrap_or_default()
}

/// A non-empty text block's text.
fn block_text<'b>(block: &'b Block<'_>) -> Option<Cow<'b, str>> {
    block.text.as_deref().filter(|t| !t.is_empty()).map(Cow::Borrowed)
}

/// `_system_text` of blocks: the non-empty text blocks not starting with the billing prefix.
fn system_text(blocks: &[Obj<Block<'_>>]) -> Option<String> {
    let text: String = blocks
        .iter()
        .map(|b| &b.0)
        .filter(|b| kind(b) == "text")
        .filter_map(block_text)
        .filter(|t| !t.starts_with(BILLING_HEADER_PREFIX))
        .collect();
    (!text.is_empty()).then_some(text)
}

/// `_image_url` of a block's `source` (absent or not an object: `{}`); None where Python would
/// `str()` a non-string.
fn image_url(source: Option<&RawValue>) -> Option<String> {
    #[derive(Deserialize, Default)]
    struct Source<'a> {
        #[serde(borrow, default, rename = "type")]
        kind: Option<&'a RawValue>,
        #[serde(borrow, default)]
        url: Option<&'a RawValue>,
        #[serde(borrow, default)]
        media_type: Option<&'a RawValue>,
        #[serde(borrow, default)]
        data: Option<&'a RawValue>,
    }
    let source: Source<'_> = source.and_then(object).unwrap_or_default();
    let text = |v: Option<&RawValue>, default: &str| match v {
        None => Some(default.to_owned()),
        Some(v) => string(v).map(Cow::into_owned),
    };
    if source.kind.and_then(string).as_deref() == Some("url") {
        return text(source.url, "");
    }
    Some(format!(
        "data:{};base64,{}",
        text(source.media_type, "image/jpeg")?,
        text(source.data, "")?
    ))
}

fn role_name(role: &str) -> Option<&'static str> {
    Some(match role {
        "user" => "user",
        "assistant" => "assistant",
        "system" => "system",
        _ => return None,
    })
}

fn convert<'a>(out: &mut Vec<ChatMessage<'a>>, message: &'a Message<'a>, merge: bool) -> Option<()> {
    let role = role_name(message.role.as_deref()?)?;
    let content = message.content.as_ref()?;
    if role == "system" {
        if !merge && let Some(text) = inline_system_text(content)? {
            out.push(ChatMessage::new("system", Content::Text(Cow::Owned(text))));
        }
        return Some(());
    }
    let blocks = match content {
        TextOrList::Text(text) => {
            out.push(ChatMessage::new(role, Content::Text(Cow::Borrowed(text))));
            return Some(());
        }
        TextOrList::List(blocks) => valid_blocks(blocks)?,
    };
    let mut parts = Vec::new();
    let mut calls = Vec::new();
    let mut reasoning: Option<String> = None;
    for Obj(block) in blocks {
        match kind(block) {
            "text" => {
                if let Some(t) = block_text(block) {
                    parts.push(Part::Text(t));
                }
            }
            "image" => {
                // `block.get("source")` truthy: an image part.
                if let Some(source) = block.source
                    && truthy(source)?
                {
                    parts.push(Part::Image(image_url(Some(source))?));
                }
            }
            "thinking" => {
                if let Some(thinking) = &block.thinking {
                    reasoning.get_or_insert_with(String::new).push_str(thinking);
                }
            }
            "tool_use" => calls.push(ToolCall {
                id: or_empty(block.id)?,
                name: or_empty(block.name)?,
                input: block.input.map_or("{}", RawValue::get),
            }),
            "tool_result" if role == "user" => tool_result(out, block)?,
            "tool_result" => {
                // `block.get('content') or ''`: a falsy value is ''; Python's str() of any
                // other non-string is not reproduced.
                let content = match block.content {
                    None => Cow::Borrowed(""),
                    Some(c) => match string(c) {
                        Some(s) => s,
                        None if falsy_non_string(c)? => Cow::Borrowed(""),
                        None => return None,
                    },
                };
                parts.push(Part::Text(Cow::Owned(format!("Tool result: {content}"))));
            }
            _ => {}
        }
    }
    if role == "user" && parts.is_empty() {
        return Some(()); // dropped: no content
    }
    let content = match parts.len() {
        0 => Content::Absent,
        1 if matches!(parts[0], Part::Text(_)) => match parts.pop() {
            Some(Part::Text(t)) => Content::Text(t),
            _ => return None,
        },
        _ => Content::Parts(parts),
    };
    let mut converted = ChatMessage::new(role, content);
    converted.reasoning = reasoning;
    converted.tool_calls = calls;
    out.push(converted);
    Some(())
}

/// A user's `tool_result`: a `tool` message of its text, then its images and references.
fn tool_result<'a>(out: &mut Vec<ChatMessage<'a>>, block: &'a Block<'a>) -> Option<()> {
    let id = or_empty(block.tool_use_id)?;
    let tool = |content: Content<'a>| {
        let mut m = ChatMessage::new("tool", content);
        m.tool_call_id = Some(id.clone());
        m
    };
    let Some(content) = block.content else {
        out.push(tool(Content::Text(Cow::Borrowed(""))));
        return Some(());
    };
    if let Some(text) = string(content) {
        out.push(tool(Content::Text(text)));
        return Some(());
    }
    let Some(items) = list(content) else {
        out.push(tool(Content::Text(Cow::Borrowed("")))); // neither a string nor a list: no text
        return Some(());
    };
    let mut texts: Vec<Cow<'_, str>> = Vec::new();
    let mut images = Vec::new();
    let mut references = Vec::new();
    for item in items {
        let Some(item) = object::<Item<'_>>(item) else { continue };
        match item.kind.and_then(string).as_deref() {
            Some("text") => texts.push(match item.text {
                None => Cow::Borrowed(""),
                Some(t) => string(t)?, // Python's str() of a non-string: not reproduced
            }),
            Some("image") => images.push(Part::Image(image_url(item.source)?)),
            Some("tool_reference") => {
                // `item.get("tool_name") or item.get("name")`: a truthy name.
                let name = match item.tool_name.map(truthy) {
                    Some(Some(true)) => item.tool_name,
                    Some(None) => return None,
                    _ => match item.name.map(truthy) {
                        Some(Some(true)) => item.name,
                        Some(None) => return None,
                        _ => None,
                    },
                };
                if let Some(name) = name {
                    references.push(Part::Reference(name));
                }
            }
            _ => {}
        }
    }
    out.push(tool(Content::Text(Cow::Owned(texts.join("\n")))));
    if !images.is_empty() {
        out.push(ChatMessage::new("user", Content::Parts(images)));
    }
    if !references.is_empty() {
        out.push(tool(Content::Parts(references)));
    }
    Some(())
}

/// `_tools`: each tool as OpenAI's function tool (`input_schema` as `parameters`, with
/// `"type": "object"` added at its end when it has none; `strict` and `defer_loading` only
/// when set), as JSON.
fn chat_tools(raw: &RawValue) -> Option<String> {
    #[derive(Deserialize)]
    struct Tool<'a> {
        #[serde(borrow, default)]
        name: Option<&'a RawValue>,
        #[serde(borrow, default)]
        description: Option<&'a RawValue>,
        #[serde(borrow, default)]
        input_schema: Option<&'a RawValue>,
        #[serde(borrow, default)]
        strict: Option<&'a RawValue>,
        #[serde(borrow, default)]
        defer_loading: Option<&'a RawValue>,
    }
    let mut out = String::from("[");
    for (k, tool) in list(raw)?.into_iter().enumerate() {
        let tool: Tool<'_> = object(tool)?;
        // `{**schema, "type": "object"}` when it has no type.
        let mut parameters = Entries::of(tool.input_schema?)?;
        if parameters.get("type").is_none() {
            parameters.set("type", "\"object\"");
        }
        if k > 0 {
            out.push_str(", ");
        }
        out.push_str("{\"type\": \"function\", \"function\": {\"name\": ");
        out.push_str(tool.name?.get());
        out.push_str(", \"description\": ");
        out.push_str(tool.description.map_or("null", RawValue::get));
        out.push_str(", \"parameters\": ");
        parameters.push_json(&mut out);
        for (key, value) in [("strict", tool.strict), ("defer_loading", tool.defer_loading)] {
            if let Some(value) = value {
                let _ = write!(out, ", \"{key}\": {}", value.get());
            }
        }
        out.push_str("}}");
    }
    out.push(']');
    Some(out)
}

/// The chat request's `chat_template_kwargs`: the request's own, with vLLM's `reasoning_effort`
/// (from `thinking`, then `output_config.effort`) and `enable_thinking` where the request is
/// silent; without `add_generation_prompt` and `continue_final_message`, which this endpoint
/// sets itself. As JSON (`Some(None)`: there are none; `None`: the app's to answer).
#[allow(clippy::option_option)]
fn template_kwargs<M>(body: &Checked<'_, M>) -> Option<Option<String>> {
    let mut effort: Option<String> = None;
    if let Some(thinking) = body.thinking {
        let value: Value = object(thinking)?;
        if value.get("type").and_then(Value::as_str) == Some("disabled") {
            effort = Some("none".to_owned());
        }
    }
    if let Some(config) = body.output_config {
        let value: Value = object(config)?;
        if let Some(given) = value.get("effort").and_then(Value::as_str) {
            effort = Some(given.to_owned());
        }
    }
    let given: Vec<(String, &RawValue)> = match body.chat_template_kwargs {
        None => Vec::new(),
        Some(raw) => ordered_entries(raw)?,
    };
    let mut pairs: Vec<(String, String)> = Vec::new();
    if let Some(effort) = &effort {
        pairs.push(("enable_thinking".to_owned(), (effort != "none").to_string()));
    }
    for (key, value) in given {
        if matches!(key.as_str(), "add_generation_prompt" | "continue_final_message") {
            continue;
        }
        match pairs.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => value.get().clone_into(&mut slot.1),
            None => pairs.push((key, value.get().to_owned())),
        }
    }
    if let Some(effort) = &effort {
        let effort = json_str(effort);
        match pairs.iter_mut().find(|(k, _)| k == "reasoning_effort") {
            Some(slot) => slot.1 = effort,
            None => pairs.push(("reasoning_effort".to_owned(), effort)),
        }
    }
    if pairs.is_empty() {
        return Some(None);
    }
    let body: Vec<String> = pairs.iter().map(|(k, v)| format!("{}: {v}", json_str(k))).collect();
    Some(Some(format!("{{{}}}", body.join(", "))))
}

fn check_tools(tools: Option<&RawValue>) -> Option<()> {
    let Some(tools) = tools else { return Some(()) };
    for tool in list(tools)? {
        #[derive(Deserialize)]
        struct Tool<'a> {
            #[serde(borrow, default)]
            name: Option<&'a RawValue>,
            #[serde(borrow, default)]
            input_schema: Option<&'a RawValue>,
        }
        let tool: Tool<'_> = object(tool)?;
        string(tool.name?)?;
        if !is_object(tool.input_schema?) {
            return None;
        }
    }
    Some(())
}

fn check_tool_choice(choice: Option<&RawValue>) -> Option<()> {
    let Some(choice) = choice else { return Some(()) };
    let value: Value = object(choice)?;
    match value.get("type").and_then(Value::as_str)? {
        "auto" | "any" | "none" => Some(()),
        "tool" => value.get("name").and_then(Value::as_str).map(|_| ()),
        _ => None,
    }
}

fn check_thinking(thinking: Option<&RawValue>, output_config: Option<&RawValue>) -> Option<()> {
    if let Some(thinking) = thinking {
        let value: Value = object(thinking)?;
        match value.get("type").and_then(Value::as_str)? {
            "enabled" => {
                value
                    .get("budget_tokens")
                    .and_then(Value::as_u64)
                    .filter(|&b| b >= 1024)?;
            }
            "disabled" | "adaptive" => {}
            _ => return None,
        }
    }
    if let Some(config) = output_config {
        let value: Value = object(config)?;
        if let Some(effort) = value.get("effort")
            && !effort.is_null()
            && !effort.is_string()
        {
            return None;
        }
    }
    Some(())
}

/// The chat request that continues a cut Messages stream after the assistant's `text` (and
/// `reasoning`) so far (`apis/messages.py`'s `_chat_body`): vLLM's conversion of the request
/// (`raw`) with that text as the final assistant message, `continue_final_message`, the rest of
/// the request as vLLM's conversion sets it (sampling, stop sequences, tools and their choice,
/// thinking's budget and effort), the output budget reduced by the `sent` deltas. None: the
/// body does not convert (never after a first attempt the native path planned).
fn continuation_body(raw: &[u8], text: &str, reasoning: &str, sent: u64) -> Option<Bytes> {
    let checked = check_typed(raw, false)?;
    let chat = convert_body(&checked, false)?;
    let Value::Array(mut messages) = serde_json::to_value(&chat).ok()? else {
        return None;
    };
    let mut assistant = Map::new();
    assistant.insert("role".to_owned(), Value::from("assistant"));
    assistant.insert("content".to_owned(), Value::from(text));
    if !reasoning.is_empty() {
        assistant.insert("reasoning".to_owned(), Value::from(reasoning));
    }
    messages.push(Value::Object(assistant));
    let Value::Object(body) = serde_json::from_slice::<Value>(raw).ok()? else {
        return None;
    };
    let given = |key: &str| body.get(key).filter(|v| !v.is_null());
    let budget = given("max_tokens").and_then(Value::as_u64).unwrap_or(1);
    let mut out = Map::new();
    out.insert("model".to_owned(), Value::from(checked.model.as_str()));
    out.insert("messages".to_owned(), Value::Array(messages));
    out.insert("max_tokens".to_owned(), Value::from(budget.saturating_sub(sent).max(1)));
    out.insert("stream".to_owned(), Value::Bool(true));
    out.insert("stream_options".to_owned(), serde_json::json!({"include_usage": true}));
    out.insert("add_generation_prompt".to_owned(), Value::Bool(false));
    out.insert("continue_final_message".to_owned(), Value::Bool(true));
    for key in [
        "temperature",
        "top_p",
        "top_k",
        "cache_salt",
        "vllm_xargs",
        "chat_template_kwargs",
    ] {
        if let Some(value) = given(key) {
            out.insert(key.to_owned(), value.clone());
        }
    }
    if let Some(stop) = given("stop_sequences") {
        out.insert("stop".to_owned(), stop.clone());
    }
    if let Some(kwargs) = template_kwargs(&checked)?
        && let Ok(Value::Object(kwargs)) = serde_json::from_str::<Value>(&kwargs)
        && let Some(effort) = kwargs.get("reasoning_effort")
    {
        out.insert("reasoning_effort".to_owned(), effort.clone());
    }
    if let Some(thinking) = given("thinking")
        && thinking.get("type").and_then(Value::as_str) == Some("enabled")
    {
        let budget = thinking.get("budget_tokens").cloned().unwrap_or(Value::Null);
        out.insert("thinking_token_budget".to_owned(), budget);
    }
    let tools = match checked.tools {
        None => None,
        Some(tools) => Some(serde_json::from_str::<Value>(&chat_tools(tools)?).ok()?),
    };
    let has_tools = tools.is_some();
    if let Some(tools) = tools {
        out.insert("tools".to_owned(), tools);
    }
    match given("tool_choice") {
        Some(Value::Object(choice)) => {
            let kind = choice.get("type").and_then(Value::as_str).unwrap_or_default();
            let mapped = match kind {
                "tool" => serde_json::json!({"type": "function", "function": {"name": choice.get("name")}}),
                "any" => Value::from("required"),
                "none" => Value::from("none"),
                _ => Value::from("auto"),
            };
            out.insert("tool_choice".to_owned(), mapped);
            if let Some(parallel) = choice.get("disable_parallel_tool_use").filter(|v| !v.is_null()) {
                out.insert("parallel_tool_calls".to_owned(), Value::Bool(!value_truthy(parallel)));
            }
        }
        _ if has_tools => {
            out.insert("tool_choice".to_owned(), Value::from("auto"));
        }
        _ => {}
    }
    serde_json::to_vec(&Value::Object(out)).ok().map(Bytes::from)
}

/// A whole answer's `(output_tokens, cache_read_input_tokens)`.
pub(crate) fn usage_counts(answer: &[u8]) -> (Option<u64>, Option<u64>) {
    let Ok(value) = serde_json::from_slice::<Value>(answer) else {
        return (None, None);
    };
    let usage = value.get("usage");
    let count = |key: &str| usage.and_then(|u| u.get(key)).and_then(Value::as_u64);
    (count("output_tokens"), count("cache_read_input_tokens"))
}

/// Anthropic's status for one of the proxy's (its "overloaded" is 529).
pub(crate) fn status(status: u16) -> u16 {
    if status == 503 { 529 } else { status }
}

/// Anthropic's error type of a status (`anthropic.error_type`).
pub(crate) fn error_type(status: u16) -> &'static str {
    match status {
        400 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        500 => "api_error",
        504 => "timeout_error",
        529 => "overloaded_error",
        s if s >= 500 => "api_error",
        _ => "invalid_request_error",
    }
}

/// Anthropic's error body for one of the proxy's statuses (already mapped by [`status`]).
pub(crate) fn error_body(status: u16, message: &str) -> String {
    serde_json::json!({"type": "error", "error": {"type": error_type(status), "message": message}}).to_string()
}

/// One relayed Messages stream (see the module docs).
#[derive(Default)]
pub(crate) struct MessagesStream {
    pending: Pending,
    deltas: u64,
    pub(crate) cached_tokens: Option<u64>,
    pub(crate) finished: bool,
    pub(crate) done: bool,
}

impl MessagesStream {
    pub(crate) fn tokens(&self) -> u64 {
        self.deltas
    }

    /// Scans `chunk`; the client receives it as it came.
    pub(crate) fn feed(&mut self, chunk: Bytes) -> Bytes {
        let mut pending = std::mem::take(&mut self.pending);
        pending.feed(&chunk, |event| self.scan(event));
        self.pending = pending;
        chunk
    }

    fn scan(&mut self, event: &[u8]) {
        let name = event_name(event);
        match name {
            _ if counts_a_token(event) => self.deltas += 1,
            b"message_delta"
                if contains(event, b"\"stop_reason\"")
                    && !contains(event, b"\"stop_reason\":null")
                    && !contains(event, b"\"stop_reason\": null") =>
            {
                self.finished = true;
            }
            b"message_stop" => self.done = true,
            _ => {}
        }
        if (name == b"message_start" || name == b"message_delta")
            && contains(event, b"\"cache_read_input_tokens\"")
            && let Ok(value) = serde_json::from_slice::<Value>(data_of(event))
        {
            let usage = value
                .get("usage")
                .or_else(|| value.get("message").and_then(|m| m.get("usage")));
            if let Some(n) = usage
                .and_then(|u| u.get("cache_read_input_tokens"))
                .and_then(Value::as_u64)
            {
                self.cached_tokens = Some(n);
            }
        }
    }
}

/// Anthropic's Messages API (`POST /v1/messages`) on the native path.
pub(crate) struct Messages;

/// The Messages API.
pub(crate) const MESSAGES: Messages = Messages;

impl Protocol for Messages {
    fn name(&self) -> &'static str {
        "messages"
    }

    fn path(&self) -> &'static str {
        "/v1/messages"
    }

    fn armed(&self, apis: NativeApis) -> bool {
        apis.messages
    }

    fn plan(&self, raw: &[u8], session: Option<String>, ids: Ids<'_>) -> Result<Plan, Unplanned> {
        let plan = match ids.template {
            Some(tokens) => tokenized_plan(raw, session, tokens),
            None => plan(raw).map(|body| rendered_plan(body, session, ids)),
        };
        // A body that does not plan: the app's 400 for its first fields, else the app's to say.
        plan.ok_or_else(|| {
            to_chat_refusal(raw, false)
                .or_else(|| malformed(raw))
                .unwrap_or(Unplanned::App)
        })
    }

    fn scanner(&self, _ids: &Arc<ResponseIds>, _hide_usage: bool, _instance: &str) -> Box<dyn StreamScan> {
        Box::new(MessagesStream::default())
    }

    fn usage(&self, answer: &[u8]) -> (Option<u64>, Option<u64>) {
        usage_counts(answer)
    }

    fn client_error(
        &self,
        status: StatusCode,
        message: &str,
        _code: Option<&str>,
        _param: Option<&str>,
    ) -> Response<AnswerBody> {
        self.proxy_error(status.as_u16(), message, "")
    }

    fn proxy_error(&self, status: u16, message: &str, _kind: &str) -> Response<AnswerBody> {
        let status = self::status(status);
        json_response(
            StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            error_body(status, message),
        )
    }

    fn continuation(&self, body: &[u8], sent: &[u8], _resumed: bool) -> Continued {
        let received = Received::of(sent);
        if received.blocks.is_empty() {
            return Continued::Again(Box::new(Resent::default()));
        }
        let Some((text, reasoning)) = received.continuable_text() else {
            return Continued::Not;
        };
        match continuation_body(body, &text, &reasoning, received.deltas) {
            Some(chat) => Continued::OverChat(chat, Box::new(ChatTranslation::after(&received))),
            None => Continued::Not,
        }
    }

    fn stream_failure(&self, message: &str) -> Bytes {
        let error = error_body(self::status(503), message);
        Bytes::from(format!("event: error\ndata: {error}\n\n"))
    }

    fn end_marker(&self) -> &'static [u8] {
        MESSAGE_STOP
    }
}

stream_scan_by_fields!(MessagesStream);

#[cfg(test)]
mod tests {
    use super::*;

    fn text(body: &str) -> Option<String> {
        plan(body.as_bytes()).map(|p| String::from_utf8(p.rendered.text).unwrap())
    }

    #[test]
    fn a_claude_code_turn_renders_as_its_chat_conversion() {
        let body = r#"{"model":"m","max_tokens":9,"system":[{"type":"text","text":"x-anthropic-billing-header: 1"},
            {"type":"text","text":"be brief"}],"messages":[{"role":"user","content":"list"},
            {"role":"assistant","content":[{"type":"thinking","thinking":"hm"},{"type":"text","text":"ok"},
             {"type":"tool_use","id":"t1","name":"ls","input":{}}]},
            {"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":[{"type":"text","text":"a"},
             {"type":"text","text":"b"}]},{"type":"text","text":"next"}]}],
            "tools":[{"name":"ls","input_schema":{}}],"tool_choice":{"type":"auto"}}"#;
        assert_eq!(
            text(body).unwrap(),
            "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nlist<|im_end|>\n\
             <|im_start|>assistant\nok<|im_end|>\n<|im_start|>tool\na\nb<|im_end|>\n\
             <|im_start|>user\nnext<|im_end|>\n<|im_start|>assistant\n"
        );
        let p = plan(body.as_bytes()).unwrap();
        assert!(!p.rendered.first_turn);
    }

    #[test]
    fn what_the_app_refuses_or_renders_with_its_own_str_is_left_to_it() {
        for body in [
            r#"{"model":"m","messages":[{"role":"user","content":"x"}]}"#, // no max_tokens
            r#"{"model":"m","max_tokens":0,"messages":[{"role":"user","content":"x"}]}"#,
            r#"{"model":"m","max_tokens":1,"messages":[]}"#,
            r#"{"model":"m","max_tokens":1,"messages":[{"role":"tool","content":"x"}]}"#,
            r#"{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[{"text":"x"}]}]}"#,
            r#"{"model":"m","max_tokens":1,"stream":1,"messages":[{"role":"user","content":"x"}]}"#,
            r#"{"model":"m","max_tokens":1,"thinking":{"type":"enabled","budget_tokens":10},"messages":[{"role":"user","content":"x"}]}"#,
            r#"{"model":"m","max_tokens":1,"messages":[{"role":"assistant","content":[{"type":"tool_result","content":[1]}]}]}"#,
            r#"[{"model":"m"}]"#,
        ] {
            assert!(plan(body.as_bytes()).is_none(), "{body}");
        }
    }

    #[test]
    fn the_conversion_as_the_chat_request_json() {
        let body = r#"{"model":"m","max_tokens":9,"system":"sys","messages":[
            {"role":"assistant","content":[{"type":"thinking","thinking":"hm"},
             {"type":"tool_use","id":"t1","name":"ls","input":{"z":1,"a":"é"}}]},
            {"role":"system","content":"inline"},
            {"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"out"},
             {"type":"image","source":{"type":"base64","media_type":"image/png","data":"AA"}}]}],
            "tools":[{"name":"ls","input_schema":{"properties":{}},"strict":true}],
            "thinking":{"type":"disabled"},"chat_template_kwargs":{"x":[1],"add_generation_prompt":false}}"#;
        let checked = check_typed(body.as_bytes(), false).unwrap();
        let json = |merge| {
            let mut out = String::new();
            for m in convert_body(&checked, merge).unwrap() {
                out.push_str(&serde_json::to_string(&m).unwrap());
                out.push('\n');
            }
            out
        };
        assert_eq!(
            json(false),
            concat!(
                "{\"role\":\"system\",\"content\":\"sys\"}\n",
                "{\"role\":\"assistant\",\"reasoning\":\"hm\",\"tool_calls\":[{\"id\":\"t1\",\"type\":\"function\",",
                "\"function\":{\"name\":\"ls\",\"arguments\":\"{\\\"z\\\":1,\\\"a\\\":\\\"é\\\"}\"}}]}\n",
                "{\"role\":\"system\",\"content\":\"inline\"}\n",
                "{\"role\":\"tool\",\"content\":\"out\",\"tool_call_id\":\"t1\"}\n",
                "{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":{\"url\":\"data:image/png;base64,AA\"}}]}\n",
            )
        );
        assert!(json(true).starts_with("{\"role\":\"system\",\"content\":\"sysinline\"}\n{\"role\":\"assistant\""));
        assert_eq!(
            chat_tools(checked.tools.unwrap()).unwrap(),
            r#"[{"type": "function", "function": {"name": "ls", "description": null, "parameters": {"properties": {}, "type": "object"}, "strict": true}}]"#
        );
        assert_eq!(
            template_kwargs(&checked).unwrap().unwrap(),
            r#"{"enable_thinking": false, "x": [1], "reasoning_effort": "none"}"#
        );
    }

    #[test]
    fn images_and_tool_references_are_messages_without_text() {
        let body = r#"{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[
            {"type":"image","source":{"type":"url","url":"u"}},{"type":"image","source":{}}]},
            {"role":"assistant","content":[{"type":"tool_result","content":""}]},
            {"role":"user","content":[{"type":"tool_result","content":[{"type":"image","source":{}},
             {"type":"tool_reference","tool_name":"","name":"n"}]}]}]}"#;
        assert_eq!(
            text(body).unwrap(),
            "<|im_start|>user\n<|im_end|>\n<|im_start|>assistant\nTool result: <|im_end|>\n\
             <|im_start|>tool\n<|im_end|>\n<|im_start|>user\n<|im_end|>\n<|im_start|>tool\n<|im_end|>\n\
             <|im_start|>assistant\n"
        );
    }

    #[test]
    fn the_stream_scan_counts_deltas_and_reads_the_cached_tokens() {
        let events = concat!(
            "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":9,\"cache_read_input_tokens\":8}}}\n\n",
            "event: content_block_delta\ndata: {\"delta\":{\"type\":\"text_delta\",\"text\":\"a\"}}\n\n",
            "event: content_block_delta\ndata: {\"delta\":{\"type\":\"signature_delta\",\"signature\":\"s\"}}\n\n",
            "event: message_delta\ndata: {\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":1}}\n\n",
            "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
        );
        let mut scan = MessagesStream::default();
        let (a, b) = events.as_bytes().split_at(50);
        scan.feed(Bytes::copy_from_slice(a));
        scan.feed(Bytes::copy_from_slice(b));
        assert_eq!(
            (scan.tokens(), scan.cached_tokens, scan.finished, scan.done),
            (1, Some(8), true, true)
        );
    }
}

#[cfg(test)]
mod cache_tests {
    use super::*;
    use crate::tokens::RenderRequest;

    /// `TokenSource::PRINT_ALL` raising on a system message after the first (the leading system
    /// merged).
    const LEADING_SYSTEM: &str = "{% for m in messages %}{% if m.role == 'system' and not loop.first %}\
        {{ raise_exception('system after the first') }}{% endif %}{{ m | tojson }}\n{% endfor %}";

    fn body(system: &str, messages: &[&str], tools: bool) -> String {
        let tools = if tools {
            r#","tools":[{"name":"ls","input_schema":{}}]"#
        } else {
            ""
        };
        format!(
            r#"{{"model":"m","max_tokens":9{system},"messages":[{}]{tools}}}"#,
            messages.join(",")
        )
    }

    /// A session's turns planned through the message cache give the ids and turn verdict of the
    /// whole conversion without it, for both content formats (with and without tools) sharing one
    /// cache, with a `system` field as text and as blocks, and with an inline system message
    /// (converted whole: under a template that needs a leading system message, merged into it).
    #[test]
    fn the_cached_conversion_plans_what_the_whole_one_does() {
        let history = [
            r#"{"role":"user","content":"list the files"}"#,
            r#"{"role":"assistant","content":[{"type":"thinking","thinking":"hm"},{"type":"text","text":"ok"},
               {"type":"tool_use","id":"t1","name":"ls","input":{"path":"."}}]}"#,
            r#"{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":[{"type":"text","text":"a"},
               {"type":"text","text":"b"}]},{"type":"text","text":"next"},{"type":"image","source":{"type":"url","url":"u"}}]}"#,
            r#"{"role":"assistant","content":"done\n"}"#,
            r#"{"role":"system","content":"inline rule"}"#,
            r#"{"role":"user","content":"and now?"}"#,
        ];
        for template in [TokenSource::PRINT_ALL, LEADING_SYSTEM] {
            let cached = TokenSource::for_tests(template);
            for system in [
                r#","system":"be brief""#,
                r#","system":[{"type":"text","text":"be "},{"type":"text","text":"brief"}]"#,
                "",
            ] {
                for tools in [false, true] {
                    for turn in 1..=history.len() {
                        let raw = body(system, &history[..turn], tools);
                        let got = tokenized_plan(raw.as_bytes(), None, &cached).map(|p| (p.ids, p.turn));
                        let want = whole_tokenized_plan(raw.as_bytes(), None, &TokenSource::for_tests(template))
                            .map(|p| (p.ids, p.turn));
                        assert!(want.is_some(), "{raw}");
                        assert_eq!(got, want, "{raw}");
                    }
                }
            }
            // The history's messages were found again turn after turn (not converted anew).
            let (hits, _, kept, _) = cached.message_cache().stats();
            assert!(hits >= 40 && kept > 0, "{hits} {kept}");
        }
    }

    /// A text kept as a chat message is not an Anthropic message's: the same JSON object
    /// normalises differently as each (a thinking block is a reasoning text in a Messages body, a
    /// text part in a chat body), and the cache tells them apart.
    #[test]
    fn a_chat_messages_entry_is_not_an_anthropic_messages() {
        let message =
            r#"{"role":"assistant","content":[{"type":"thinking","thinking":"r"},{"type":"text","text":"a"}]}"#;
        let user = r#"{"role":"user","content":"q"}"#;
        let cached = TokenSource::for_tests(TokenSource::PRINT_ALL);
        let chat = format!("[{user},{message}]");
        let request = RenderRequest {
            messages: crate::tokens::Messages::Json(&chat),
            tools: None,
            add_generation_prompt: true,
            continue_final_message: false,
            chat_template_kwargs: None,
        };
        cached.chat_ids(&request, false).unwrap();
        assert_eq!(cached.message_cache().stats().2, 2);
        let raw = body("", &[user, message, user], false);
        let got = tokenized_plan(raw.as_bytes(), None, &cached).map(|p| p.ids);
        let want =
            whole_tokenized_plan(raw.as_bytes(), None, &TokenSource::for_tests(TokenSource::PRINT_ALL)).map(|p| p.ids);
        assert_eq!(got, want);
    }
}
