//! OpenAI's Responses API on the native path: a `POST /v1/responses` that names no stored
//! response (Codex's `store: false` with its whole history, or a first turn) validated and
//! rendered as `smetric serve --tokens approximate` renders it, the ids of its answer issued as
//! the proxy's, its event stream scanned.
//!
//! **Rendering** (`python/smetric/serve/apis/responses.py`, `chat_messages`): `instructions` a
//! system message; a string `input` a user message; a `function_call` an assistant's tool call
//! (merged into the last assistant message), a `reasoning` its reasoning (merged likewise), an
//! assistant message its first text (merged likewise), a `function_call_output` a `tool`
//! message of its `output`, any other item with a string role kept as it is; then plain ChatML
//! of the roles and the contents' text (`chatml::push_content`, Python's `content_text`).
//! Validation is the app's; a body it would refuse, or one naming `previous_response_id` (the
//! app pins those to their instance), gives `None`.
//!
//! **Ids** (`python/smetric/serve/pinning.py`): the client never sees an engine's response id;
//! every `"id"` / `"previous_response_id"` naming a response (`resp_…`) is rewritten to
//! `{engine id}-{instance tag}-{mac}` — the tag the first 12 hex digits of the SHA-256 of the
//! instance URL, the mac the first 32 of an HMAC-SHA256 over `{engine id}\0{tag}` with the
//! key the app uses — so the app opens them for the follow-ups it pins. Ids already the
//! proxy's (they verify) and items' ids are kept.
//!
//! **Stream**: events relayed whole, each with its ids rewritten; an event whose head names a
//! `delta` is one output token; `response.completed` / `.failed` / `.incomplete` end it, with
//! the usage (`input_tokens_details.cached_tokens`, the realized hit).
//!
//! **A cut stream** is continued by `responses_splice.rs` (the app's rules): the input plus every
//! item the client received, the events spliced into its stream.
//!
//! O(body length) to plan; O(event bytes) per event to relay; one HMAC per response id.

use std::borrow::Cow;

use bytes::{Bytes, BytesMut};
use minijinja::value::Serde;
use serde::Deserialize;
use serde_json::Value;
use serde_json::value::RawValue;

use std::sync::Arc;

use super::chatml::{Rendered, RenderedBody, push_content};
use super::continuation::Continued;
use super::protocol::{
    ChatRequest, Ids, Plan, Protocol, StreamScan, Unplanned, malformed, rendered_plan, template_plan,
};
use super::response_ids::ResponseIds;
use super::responses_splice::{TERMINAL_EVENTS, continuation, is_delta};
use super::state::NativeApis;
use crate::tokens::{CachedText, ContentFormat, MessageCache, TokenSource, normalise};
use smetric_core::TurnHint;

use super::json::{self, Entries, Obj, TextOrList, is_string, json_str, list, object, string};
use super::sse::{Pending, data_of};

#[derive(Deserialize)]
#[serde(bound(deserialize = "I: Deserialize<'de>"))]
struct Body<'a, I> {
    #[serde(borrow, default)]
    model: Option<&'a RawValue>,
    #[serde(borrow, default)]
    instructions: Option<&'a RawValue>,
    #[serde(borrow, default)]
    previous_response_id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    prompt_cache_key: Option<&'a RawValue>,
    #[serde(borrow, default)]
    user: Option<&'a RawValue>,
    #[serde(borrow, default)]
    cache_salt: Option<&'a RawValue>,
    #[serde(borrow, default)]
    stream: Option<&'a RawValue>,
    #[serde(borrow, default)]
    store: Option<&'a RawValue>,
    #[serde(borrow, default)]
    background: Option<&'a RawValue>,
    #[serde(borrow, default)]
    max_output_tokens: Option<&'a RawValue>,
    #[serde(borrow, default)]
    input: Option<TextOrList<'a, I>>,
    #[serde(borrow, default)]
    tools: Option<&'a RawValue>,
    #[serde(borrow, default)]
    kv_transfer_params: Option<&'a RawValue>,
}

/// An `input` item as the body's pass reads it (`input` itself is a string decoded where it
/// stands or a list of these; anything else fails the parse: the app's to answer): typed in that
/// pass (plain ChatML reads the fields alone), or kept as its raw JSON, typed from it after, for
/// the chat template's copy of the whole item (tokenizer mode).
trait InputItem<'a> {
    /// Whether the item's JSON is kept: the conversion then builds the messages' JSON.
    const KEPT: bool;
    /// The item's fields, and its raw JSON when it was kept.
    fn split(self) -> Option<(Item<'a>, Option<&'a RawValue>)>;
}

impl<'a> InputItem<'a> for &'a RawValue {
    const KEPT: bool = true;
    fn split(self) -> Option<(Item<'a>, Option<&'a RawValue>)> {
        Some((object(self)?, Some(self)))
    }
}

impl<'a> InputItem<'a> for Obj<Item<'a>> {
    const KEPT: bool = false;
    fn split(self) -> Option<(Item<'a>, Option<&'a RawValue>)> {
        Some((self.0, None))
    }
}

#[derive(Deserialize)]
struct Item<'a> {
    #[serde(borrow, default, rename = "type")]
    kind: Option<&'a RawValue>,
    #[serde(borrow, default)]
    role: Option<&'a RawValue>,
    #[serde(borrow, default)]
    content: Option<&'a RawValue>,
    #[serde(borrow, default)]
    encrypted_content: Option<&'a RawValue>,
    #[serde(borrow, default)]
    call_id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    name: Option<&'a RawValue>,
    #[serde(borrow, default)]
    arguments: Option<&'a RawValue>,
    #[serde(borrow, default)]
    output: Option<&'a RawValue>,
    #[serde(borrow, default)]
    reasoning: Option<&'a RawValue>,
    #[serde(borrow, default)]
    tool_calls: Option<&'a RawValue>,
    #[serde(borrow, default)]
    summary: Option<&'a RawValue>,
}

/// Whether a field is absent, null or a string (the app's check of its string fields).
/// Read from the first byte: every JSON string in a planned body decodes (`body_plan` hands
/// bodies with lone surrogate escapes to the app first), so none is decoded only to be checked.
fn string_or_absent(raw: Option<&RawValue>) -> bool {
    raw.is_none_or(is_string)
}

/// `responses._first_text`: a string, or the first element's string `text` of a non-empty
/// list whose first element is an object — as its JSON string, not decoded: the template's JSON
/// takes it as it is, plain ChatML decodes it where it prints it (`push_content`), and finding a
/// message's run of items needs neither (decoding every assistant text there was 18 % of a
/// tokenizer-mode Responses plan). Every JSON string in a planned body decodes (`body_plan` hands
/// bodies with lone surrogate escapes to the app first), so a string here is a text.
fn first_text(content: Option<&RawValue>) -> Option<&RawValue> {
    #[derive(Deserialize)]
    struct Part<'a> {
        #[serde(borrow, default)]
        text: Option<&'a RawValue>,
    }
    let content = content?;
    if is_string(content) {
        return Some(content);
    }
    let first = *list(content)?.first()?;
    let part: Part<'_> = object(first)?;
    part.text.filter(|t| is_string(t))
}

/// Whether a JSON string is the empty text.
fn is_empty_text(raw: &RawValue) -> bool {
    raw.get() == "\"\""
}

/// A converted message: its role and what its content renders from (plain ChatML), and the
/// whole message as the chat request's JSON (what a chat template sees).
struct Converted<'a> {
    role: Cow<'a, str>,
    content: Content<'a>,
    /// `message.get("reasoning") is not None`.
    reasoning: bool,
    tool_calls: ToolCalls,
    json: Entries<'a>,
}

impl<'a> Converted<'a> {
    /// A message the conversion builds: `{"role": role, key: value}`, the value JSON text.
    fn built(role: &'a str, content: Content<'a>, key: &'a str, json: impl Into<Cow<'a, str>>) -> Self {
        let mut entries = Entries::default();
        entries.set_text("role", role);
        entries.set(key, json);
        Self::of_entries(role, content, key, entries)
    }

    /// A message the conversion builds: `{"role": role, key: text}`, a string.
    fn built_text(role: &'a str, content: Content<'a>, key: &'a str, text: impl Into<Cow<'a, str>>) -> Self {
        let mut entries = Entries::default();
        entries.set_text("role", role);
        entries.set_text(key, text);
        Self::of_entries(role, content, key, entries)
    }

    /// The leading system message of the non-empty `instructions` (a JSON string): its JSON
    /// takes the string as it is, plain ChatML decodes it where it prints it.
    fn instructions(text: &'a RawValue) -> Self {
        Self::built("system", Content::Raw(Some(text)), "content", text.get())
    }

    fn of_entries(role: &'a str, content: Content<'a>, key: &'a str, entries: Entries<'a>) -> Self {
        Self {
            role: Cow::Borrowed(role),
            content,
            reasoning: key == "reasoning",
            tool_calls: if key == "tool_calls" {
                ToolCalls::List
            } else {
                ToolCalls::None
            },
            json: entries,
        }
    }
}

/// A JSON array's text with `item` appended (`list.append`).
fn appended(array: &str, item: &str) -> String {
    let inner = array.trim();
    let inner = inner
        .strip_prefix('[')
        .and_then(|a| a.strip_suffix(']'))
        .unwrap_or("")
        .trim();
    if inner.is_empty() {
        format!("[{item}]")
    } else {
        format!("[{inner}, {item}]")
    }
}

enum Content<'a> {
    /// A raw JSON content (`content_text` of it).
    Raw(Option<&'a RawValue>),
    Text(Cow<'a, str>),
}

#[derive(PartialEq, Eq)]
enum ToolCalls {
    None,
    List,
    Other,
}

impl Converted<'_> {
    fn has_content(&self) -> bool {
        match &self.content {
            Content::Raw(raw) => raw.is_some(),
            Content::Text(_) => true,
        }
    }
}

/// A body validated and converted: its messages, model, cache salt and tools.
struct Conversion<'a> {
    messages: Vec<Converted<'a>>,
    model: Option<String>,
    cache_salt: Option<String>,
    tools: Option<&'a RawValue>,
    follow_up: Option<FollowUp>,
}

/// A follow-up of a stored response: the id it continues, and the body's session hint
/// (`prompt_cache_key`, else `user`; the headers' comes first).
pub(crate) struct FollowUp {
    previous: String,
    hint: Option<String>,
}

impl FollowUp {
    /// `plan` as a follow-up: pinned to the stored response, and since it carries only the new
    /// input its turn is the session table's count under its hint, else 2 (`prepare`'s rule).
    fn apply(self, mut plan: Plan) -> Plan {
        plan.previous_response = Some(self.previous);
        plan.turn_key = plan.session.clone().or(self.hint);
        if plan.turn_key.is_none() {
            plan.turn = TurnHint::Turn(2);
        }
        plan
    }
}

/// `raw` with its `previous_response_id` replaced by the engine's own id (`parse`'s
/// `{**body, "previous_response_id": engine_id}`), or None: not a JSON object.
fn with_engine_previous(raw: &[u8], engine_id: &str) -> Option<Bytes> {
    let mut entries = Entries::of(json::body(raw)?)?;
    entries.set("previous_response_id", json_str(engine_id));
    let mut out = String::with_capacity(raw.len());
    entries.push_json(&mut out);
    Some(Bytes::from(out))
}

/// The body validated and rendered (see the module docs), or None: the app's to answer.
pub(crate) fn plan(raw: &[u8]) -> Option<(RenderedBody, Option<FollowUp>)> {
    let Conversion {
        messages,
        model,
        cache_salt,
        follow_up,
        ..
    } = conversion(raw, false)?;
    let mut text = Vec::with_capacity(raw.len());
    for m in &messages {
        text.extend_from_slice(b"<|im_start|>");
        text.extend_from_slice(m.role.as_bytes());
        text.push(b'\n');
        match &m.content {
            Content::Raw(raw) => push_content(&mut text, *raw)?,
            Content::Text(t) => text.extend_from_slice(t.as_bytes()),
        }
        text.extend_from_slice(b"<|im_end|>\n");
    }
    text.extend_from_slice(b"<|im_start|>assistant\n");
    let first_turn = smetric_core::first_turn_from_roles(messages.iter().map(|m| m.role.as_ref()));
    let body = RenderedBody {
        rendered: Rendered { text, first_turn },
        model,
        cache_salt,
    };
    Some((body, follow_up))
}

/// The Responses adapter's 400 for a body it refuses while parsing (`ResponsesApi.parse`, then
/// `chat_messages`, in that order): the body an object; `model`, `instructions`,
/// `previous_response_id`, `prompt_cache_key`, `user`, `cache_salt` strings; `stream`, `store`,
/// `background` booleans; `max_output_tokens` an integer of at least 1; `input` a string or a list
/// of objects; `tools` a list of objects; then each input item as the conversion reads it (a
/// `function_call`'s string fields, no encrypted reasoning, a known type or a string role). The
/// conversion's refusals come after the adapter opens `previous_response_id` (its 404), so they
/// are answered here only without one. None: the body parses, or its refusal is not told apart
/// here (a type name Python would print as a value). O(body) on a body that did not plan.
pub(crate) fn parse_refusal(raw: &[u8]) -> Option<Unplanned> {
    let whole = json::body(raw)?;
    let Ok(Value::Object(body)) = serde_json::from_str::<Value>(whole.get()) else {
        return Some(Unplanned::refused(
            "the request body must be a JSON object".to_owned(),
            None,
        ));
    };
    if let Err(refusal) = field_checks(&body) {
        return refusal;
    }
    if body.get("previous_response_id").is_some_and(|v| !v.is_null()) {
        return None; // its 404, if the id is not one the proxy issued, comes first: the caller's
    }
    let items = body.get("input").and_then(Value::as_array);
    for (i, item) in items.into_iter().flatten().enumerate() {
        let kind = item.get("type");
        let role = item.get("role").and_then(Value::as_str);
        match kind.and_then(Value::as_str) {
            Some("function_call") => {
                if let Some(name) = ["call_id", "name", "arguments"]
                    .into_iter()
                    .find(|name| !item.get(*name).is_some_and(Value::is_string))
                {
                    return Some(Unplanned::refused(
                        format!("input[{i}]: a function_call needs a string {name}"),
                        Some("input"),
                    ));
                }
            }
            Some("reasoning") if item.get("encrypted_content").is_some_and(truthy_value) => {
                return Some(Unplanned::refused(
                    "Encrypted content is not supported.".to_owned(),
                    Some("input"),
                ));
            }
            Some("reasoning" | "function_call_output" | "custom_tool_call_output") => {}
            _ if role.is_some() => {}
            Some(kind) => {
                return Some(Unplanned::refused(
                    format!("Unsupported input item type: {kind}"),
                    Some("input"),
                ));
            }
            None if kind.is_none_or(Value::is_null) => {
                return Some(Unplanned::refused(
                    "Unsupported input item type: None".to_owned(),
                    Some("input"),
                ));
            }
            None => return None, // a type Python prints as a value: the app's words
        }
    }
    None
}

/// Whether the adapter's field checks (before it opens `previous_response_id`) pass for `raw`
/// with certainty: then an id it did not issue is its 404.
pub(crate) fn fields_parse(raw: &[u8]) -> bool {
    let Some(whole) = json::body(raw) else { return false };
    matches!(serde_json::from_str::<Value>(whole.get()), Ok(Value::Object(body)) if field_checks(&body).is_ok())
}

/// The adapter's checks of the body's fields, in its order: Err(Some) its 400, Err(None) a value
/// not told apart here (a number Python might read as another type).
fn field_checks(body: &serde_json::Map<String, Value>) -> Result<(), Option<Unplanned>> {
    let given = |name: &str| body.get(name).filter(|v| !v.is_null());
    for name in [
        "model",
        "instructions",
        "previous_response_id",
        "prompt_cache_key",
        "user",
        "cache_salt",
    ] {
        if given(name).is_some_and(|v| !v.is_string()) {
            return Err(Some(Unplanned::refused(format!("{name} must be a string"), Some(name))));
        }
    }
    for name in ["stream", "store", "background"] {
        if given(name).is_some_and(|v| !v.is_boolean()) {
            return Err(Some(Unplanned::refused(
                format!("{name} must be a boolean"),
                Some(name),
            )));
        }
    }
    if let Some(limit) = given("max_output_tokens")
        && !json::python_int_at_least(Some(limit), 1).ok_or(None)?
    {
        let message = "max_output_tokens must be an integer of at least 1".to_owned();
        return Err(Some(Unplanned::refused(message, Some("max_output_tokens"))));
    }
    let input_ok = match body.get("input") {
        Some(Value::String(_)) => true,
        Some(Value::Array(items)) => items.iter().all(Value::is_object),
        _ => false,
    };
    if !input_ok {
        let message = "input must be a string or a list of items (objects)".to_owned();
        return Err(Some(Unplanned::refused(message, Some("input"))));
    }
    if given("tools").is_some_and(|t| !t.as_array().is_some_and(|t| t.iter().all(Value::is_object))) {
        return Err(Some(Unplanned::refused(
            "tools must be a list of objects".to_owned(),
            Some("tools"),
        )));
    }
    Ok(())
}

/// Python's truth value of a decoded JSON value.
fn truthy_value(value: &Value) -> bool {
    match value {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|n| n != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

/// Tokenizer mode's plan: the conversion as the chat request vLLM renders with the model's
/// template (`chat_messages`, `chat_tools`), encoded. None: the app's.
///
/// A list `input` goes through the message cache (`tokens/conversation.rs`): its items are
/// converted without their JSON first (as plain ChatML converts them: cheap), which tells which
/// run of items makes each message; a message is a function of its run's items alone (the run's
/// first item opens it whatever came before, the rest merge into it), so its normalised form is
/// kept by the run's text, and a session's next turn, which re-sends its items byte for byte,
/// builds and normalises only its new messages. A string `input` or an empty list is converted
/// whole ([`whole_tokenized_plan`]).
fn tokenized_plan(raw: &[u8], session: Option<String>, tokens: &TokenSource) -> Option<Plan> {
    let body = json::body_object::<Body<'_, &RawValue>>(raw)?;
    let fields = checked_fields(&body)?;
    let items = match &body.input {
        Some(TextOrList::List(items)) if !items.is_empty() => items,
        _ => return whole_tokenized_plan(raw, session, tokens),
    };
    let tools = match body.tools {
        None => None,
        Some(tools) => Some(chat_tools(tools)?),
    };
    let format = tokens.content_format(tools.is_some());
    let cache = tokens.message_cache();
    let mut messages = Vec::with_capacity(items.len() + 1);
    if let Some(instructions) = fields.instructions {
        let key = instructions.get();
        let kept = cache
            .find(&[key], CachedText::ResponsesInstructions, format)
            .pop()
            .flatten();
        let leading = if let Some(kept) = kept {
            kept
        } else {
            let fresh = normalised(&Converted::instructions(instructions), format)?;
            cache.keep(&[(key, fresh.clone())], CachedText::ResponsesInstructions, format);
            fresh
        };
        messages.extend(leading.iter().cloned());
    }
    messages.extend(cached_items(raw, items, format, cache)?);
    let request = ChatRequest {
        first_turn: None,
        messages,
        normalised: true,
        tools,
        chat_template_kwargs: None,
        model: fields.model,
        cache_salt: fields.cache_salt,
    };
    let plan = template_plan(&request, session, tokens)?;
    Some(match fields.follow_up {
        Some(follow_up) => follow_up.apply(plan),
        None => plan,
    })
}

/// A non-empty list of `input` items (the JSON texts of `raw`'s) as normalised messages, through
/// `cache` (see [`tokenized_plan`]), or None: the app's.
fn cached_items(
    raw: &[u8],
    items: &[&RawValue],
    format: ContentFormat,
    cache: &MessageCache,
) -> Option<Vec<minijinja::Value>> {
    let typed: Vec<Item<'_>> = items.iter().map(|item| object(item)).collect::<Option<_>>()?;
    // The runs: where each message starts, from the conversion without JSON.
    let mut shape: Vec<Converted<'_>> = Vec::with_capacity(items.len());
    let mut starts: Vec<usize> = Vec::with_capacity(items.len());
    for (i, item) in typed.iter().enumerate() {
        let before = shape.len();
        convert(&mut shape, item, None)?;
        if shape.len() > before {
            starts.push(i);
        }
    }
    let runs: Vec<(usize, usize)> = starts
        .iter()
        .zip(starts.iter().skip(1).chain(std::iter::once(&items.len())))
        .map(|(&start, &end)| (start, end))
        .collect();
    let texts: Vec<&str> = runs
        .iter()
        .map(|&(start, end)| run_text(raw, items[start], items[end - 1]))
        .collect::<Option<_>>()?;
    let found = cache.find(&texts, CachedText::ResponsesItems, format);
    let mut out = Vec::with_capacity(runs.len());
    let mut fresh = Vec::new();
    for ((&(start, end), text), kept) in runs.iter().zip(texts).zip(found) {
        let message = if let Some(kept) = kept {
            kept
        } else {
            let mut one = Vec::with_capacity(1);
            for k in start..end {
                convert(&mut one, &typed[k], Some(items[k]))?;
            }
            let [message] = &one[..] else { return None };
            let message = normalised(message, format)?;
            fresh.push((text, message.clone()));
            message
        };
        out.extend(message.iter().cloned());
    }
    cache.keep(&fresh, CachedText::ResponsesItems, format);
    Some(out)
}

/// The text of `raw` from `first`'s first byte to `last`'s last (both `raw`'s own JSON texts):
/// the run of items between them as the client sent it.
fn run_text<'a>(raw: &'a [u8], first: &RawValue, last: &RawValue) -> Option<&'a str> {
    let base = raw.as_ptr() as usize;
    let start = (first.get().as_ptr() as usize).checked_sub(base)?;
    let end = (last.get().as_ptr() as usize + last.get().len()).checked_sub(base)?;
    std::str::from_utf8(raw.get(start..end)?).ok()
}

/// A converted message as the template sees it (for `format`), or None: the template's
/// conversation refuses it.
fn normalised(message: &Converted<'_>, format: ContentFormat) -> Option<Arc<[minijinja::Value]>> {
    Some(
        normalise(&[minijinja::Value::from(Serde(&message.json))], format)
            .ok()?
            .into(),
    )
}

/// [`tokenized_plan`] of a body converted whole, without the message cache.
fn whole_tokenized_plan(raw: &[u8], session: Option<String>, tokens: &TokenSource) -> Option<Plan> {
    let conversion = conversion(raw, true)?;
    let request = ChatRequest {
        messages: conversion
            .messages
            .iter()
            .map(|m| minijinja::Value::from(Serde(&m.json)))
            .collect(),
        normalised: false,
        tools: match conversion.tools {
            None => None,
            Some(tools) => Some(chat_tools(tools)?),
        },
        chat_template_kwargs: None,
        first_turn: None,
        model: conversion.model,
        cache_salt: conversion.cache_salt,
    };
    let plan = template_plan(&request, session, tokens)?;
    Some(match conversion.follow_up {
        Some(follow_up) => follow_up.apply(plan),
        None => plan,
    })
}

/// `chat_tools`: the function tools in chat's form, `{"type": "function", "function": {every
/// field but "type"}}`, as JSON.
fn chat_tools(raw: &RawValue) -> Option<String> {
    let mut out = String::from("[");
    let mut n = 0;
    for tool in list(raw)? {
        let mut entries = Entries::of(tool)?;
        if entries.get("type").as_deref() != Some("\"function\"") {
            continue;
        }
        entries.remove("type");
        if n > 0 {
            out.push_str(", ");
        }
        n += 1;
        out.push_str("{\"type\": \"function\", \"function\": ");
        entries.push_json(&mut out);
        out.push('}');
    }
    out.push(']');
    Some(out)
}

/// The body validated and converted (see the module docs), or None: the app's to answer. The
/// messages' JSON (what a chat template sees) only `with_json`: plain ChatML renders from
/// their roles and contents alone. One pass over the body reads its fields and `input`'s items'
/// fields (tokenizer mode keeps each item's JSON for the template and reads its fields from it).
fn conversion(raw: &[u8], with_json: bool) -> Option<Conversion<'_>> {
    if with_json {
        converted(json::body_object::<Body<'_, &RawValue>>(raw)?)
    } else {
        converted(json::body_object::<Body<'_, Obj<Item<'_>>>>(raw)?)
    }
}

/// [`conversion`] of the body read: the messages' JSON built when its items were kept.
fn converted<'a, I: InputItem<'a>>(body: Body<'a, I>) -> Option<Conversion<'a>> {
    let with_json = I::KEPT;
    let fields = checked_fields(&body)?;
    let input = body.input?;
    let mut messages: Vec<Converted<'_>> = Vec::new();
    if let Some(instructions) = fields.instructions {
        messages.push(Converted::instructions(instructions));
    }
    match input {
        TextOrList::Text(text) => {
            let kept = text_if(with_json, &text);
            messages.push(Converted::built_text("user", Content::Text(text), "content", kept));
        }
        TextOrList::List(items) => {
            for item in items {
                let (item, raw) = item.split()?;
                convert(&mut messages, &item, raw)?;
            }
        }
    }
    if messages.is_empty() {
        messages.push(Converted::built(
            "user",
            Content::Text(Cow::Borrowed("")),
            "content",
            "\"\"",
        ));
    }
    Some(Conversion {
        messages,
        model: fields.model,
        cache_salt: fields.cache_salt,
        tools: body.tools,
        follow_up: fields.follow_up,
    })
}

/// A body's fields but `input`, checked (`parse`'s order) and read.
struct Fields<'a> {
    follow_up: Option<FollowUp>,
    model: Option<String>,
    /// The non-empty `instructions`, as their JSON string.
    instructions: Option<&'a RawValue>,
    cache_salt: Option<String>,
}

/// The body's fields but `input`, checked as the adapter checks them, or None: the app's.
fn checked_fields<'a, I>(body: &Body<'a, I>) -> Option<Fields<'a>> {
    if body.kv_transfer_params.is_some() {
        return None;
    }
    let strings = [
        body.model,
        body.instructions,
        body.previous_response_id,
        body.prompt_cache_key,
        body.user,
        body.cache_salt,
    ];
    if !strings.into_iter().all(string_or_absent) {
        return None;
    }
    let follow_up = body.previous_response_id.and_then(string).map(|previous| FollowUp {
        previous: previous.into_owned(),
        hint: [body.prompt_cache_key, body.user]
            .into_iter()
            .flatten()
            .filter_map(string)
            .find(|v| !v.is_empty())
            .map(Cow::into_owned),
    });
    for flag in [body.stream, body.store, body.background].into_iter().flatten() {
        if !matches!(flag.get(), "true" | "false") {
            return None;
        }
    }
    if let Some(limit) = body.max_output_tokens
        && limit.get().parse::<u64>().ok().is_none_or(|n| n < 1)
    {
        return None;
    }
    if let Some(tools) = body.tools
        && !list(tools)?.iter().all(|t| t.get().starts_with('{'))
    {
        return None;
    }
    Some(Fields {
        follow_up,
        model: body.model.and_then(string).map(Cow::into_owned),
        instructions: body.instructions.filter(|t| !is_empty_text(t)),
        cache_salt: body.cache_salt.and_then(string).map(Cow::into_owned),
    })
}

/// `text` when the conversion builds the messages' JSON, else nothing (plain ChatML never reads
/// it: a borrowed text costs nothing either way, an owned one is copied only when needed).
fn text_if<'a>(with_json: bool, text: &Cow<'a, str>) -> Cow<'a, str> {
    if with_json { text.clone() } else { Cow::Borrowed("") }
}

fn is_assistant(messages: &[Converted<'_>]) -> bool {
    messages.last().is_some_and(|m| m.role == "assistant")
}

/// One item converted onto `messages`; `raw`, the item's JSON, when the conversion builds the
/// messages' JSON (tokenizer mode).
fn convert<'a>(messages: &mut Vec<Converted<'a>>, item: &Item<'a>, raw: Option<&'a RawValue>) -> Option<()> {
    let kind = item.kind.and_then(string);
    match kind.as_deref() {
        Some("function_call") => {
            for field in [item.call_id, item.name, item.arguments] {
                string(field?)?;
            }
            let call = format!(
                "{{\"id\": {}, \"function\": {{\"name\": {}, \"arguments\": {}}}, \"type\": \"function\"}}",
                item.call_id?.get(),
                item.name?.get(),
                item.arguments?.get()
            );
            if is_assistant(messages)
                && let Some(last) = messages.last_mut()
            {
                match last.tool_calls {
                    ToolCalls::None => {
                        last.tool_calls = ToolCalls::List;
                        last.json.set("tool_calls", format!("[{call}]"));
                        return Some(());
                    }
                    ToolCalls::List => {
                        let calls = appended(last.json.get("tool_calls").as_deref().unwrap_or("[]"), &call);
                        last.json.set("tool_calls", calls);
                        return Some(());
                    }
                    ToolCalls::Other => {}
                }
            }
            messages.push(Converted::built(
                "assistant",
                Content::Raw(None),
                "tool_calls",
                format!("[{call}]"),
            ));
        }
        Some("reasoning") => {
            if item.encrypted_content.is_some_and(truthy) {
                return None;
            }
            // `_first_text(content) or _first_text(summary) or ""`, as JSON.
            let text = first_text(item.content)
                .filter(|t| !is_empty_text(t))
                .or_else(|| first_text(item.summary).filter(|t| !is_empty_text(t)))
                .map_or("\"\"", RawValue::get);
            if is_assistant(messages)
                && let Some(last) = messages.last_mut()
                && !last.reasoning
            {
                last.reasoning = true;
                last.json.set("reasoning", text);
            } else {
                messages.push(Converted::built("assistant", Content::Raw(None), "reasoning", text));
            }
        }
        Some("function_call_output" | "custom_tool_call_output") => {
            let mut json = Entries::default();
            json.set("role", "\"tool\"");
            json.set("content", item.output.map_or("null", RawValue::get));
            json.set("tool_call_id", item.call_id.map_or("null", RawValue::get));
            messages.push(Converted {
                role: Cow::Borrowed("tool"),
                content: Content::Raw(item.output),
                reasoning: false,
                tool_calls: ToolCalls::None,
                json,
            });
        }
        _ => {
            let role = item.role.and_then(string);
            let said = (role.as_deref() == Some("assistant"))
                .then(|| first_text(item.content))
                .flatten();
            if let Some(said) = said {
                if is_assistant(messages)
                    && let Some(last) = messages.last_mut()
                    && !last.has_content()
                {
                    last.content = Content::Raw(Some(said));
                    last.json.set("content", said.get());
                } else {
                    messages.push(Converted::built(
                        "assistant",
                        Content::Raw(Some(said)),
                        "content",
                        said.get(),
                    ));
                }
            } else if let Some(role) = role {
                let tool_calls = match item.tool_calls {
                    None => ToolCalls::None,
                    Some(calls) if calls.get().starts_with('[') => ToolCalls::List,
                    Some(_) => ToolCalls::Other,
                };
                messages.push(Converted {
                    role,
                    content: Content::Raw(item.content),
                    reasoning: item.reasoning.is_some(),
                    tool_calls,
                    // The item itself, every key in its order (an object: checked above).
                    json: match raw {
                        Some(raw) => Entries::of(raw)?,
                        None => Entries::default(),
                    },
                });
            } else {
                return None;
            }
        }
    }
    Some(())
}

/// Python's truthiness of a JSON value (a number spelled as zero another way counts as true:
/// a value the app refuses then goes to the app anyway, where it is refused).
fn truthy(raw: &RawValue) -> bool {
    !matches!(raw.get(), "null" | "false" | "0" | "\"\"" | "[]" | "{}")
}

/// A whole answer's `(output_tokens, input_tokens_details.cached_tokens)`.
pub(crate) fn usage_counts(answer: &[u8]) -> (Option<u64>, Option<u64>) {
    let Ok(value) = serde_json::from_slice::<Value>(answer) else {
        return (None, None);
    };
    usage_of(value.get("usage"))
}

fn usage_of(usage: Option<&Value>) -> (Option<u64>, Option<u64>) {
    let output = usage.and_then(|u| u.get("output_tokens")).and_then(|v| {
        // `int(usage["output_tokens"])`
        v.as_u64()
            .or_else(|| v.as_f64().filter(|f| *f >= 0.0).map(|f| f.trunc() as u64))
    });
    let cached = usage
        .and_then(|u| u.get("input_tokens_details"))
        .and_then(|d| d.get("cached_tokens"))
        .and_then(Value::as_u64);
    (output, cached)
}

/// How vLLM's "Response with id '…' not found." begins.
const NOT_FOUND_OPEN: &str = "Response with id '";

/// A whole answer as the client receives it: its ids the proxy's, and vLLM's "not found" naming
/// the proxy's id (`ResponsesApi.relay_body`).
pub(crate) fn relay_body(ids: &ResponseIds, answer: &[u8], tag: &str) -> Vec<u8> {
    let out = ids.rewrite(answer, tag);
    let head = &out[..out.len().min(512)];
    if !head.windows(9).any(|w| w == b"not found") {
        return out;
    }
    let text = String::from_utf8_lossy(&out).into_owned();
    let mut rewritten = String::with_capacity(text.len());
    let mut rest = text.as_str();
    while let Some(at) = rest.find(NOT_FOUND_OPEN) {
        let after = &rest[at + NOT_FOUND_OPEN.len()..];
        match after.find('\'') {
            Some(end) if end > 0 && after[end..].starts_with("' not found") => {
                rewritten.push_str(&rest[..at + NOT_FOUND_OPEN.len()]);
                rewritten.push_str(&ids.issue(&after[..end], tag));
                rest = &after[end..];
            }
            _ => {
                rewritten.push_str(&rest[..at + NOT_FOUND_OPEN.len()]);
                rest = after;
            }
        }
    }
    rewritten.push_str(rest);
    rewritten.into_bytes()
}

/// One relayed Responses stream (see the module docs).
pub(crate) struct ResponsesStream {
    pending: Pending,
    deltas: u64,
    output_tokens: Option<u64>,
    pub(crate) cached_tokens: Option<u64>,
    pub(crate) done: bool,
    tag: String,
    ids: std::sync::Arc<ResponseIds>,
}

impl ResponsesStream {
    pub(crate) fn new(ids: std::sync::Arc<ResponseIds>, instance: &str) -> Self {
        Self {
            pending: Pending::default(),
            deltas: 0,
            output_tokens: None,
            cached_tokens: None,
            done: false,
            tag: ResponseIds::tag(instance),
            ids,
        }
    }

    pub(crate) fn tokens(&self) -> u64 {
        self.output_tokens.unwrap_or(self.deltas)
    }

    /// The complete events of what is pending and `chunk`, each scanned and with its ids
    /// rewritten: what the client receives for it.
    pub(crate) fn feed(&mut self, chunk: &[u8]) -> Bytes {
        let mut out = BytesMut::new();
        let mut pending = std::mem::take(&mut self.pending);
        pending.feed(chunk, |event| {
            self.scan(event);
            out.extend_from_slice(&self.ids.rewrite(event, &self.tag));
            out.extend_from_slice(b"\n\n");
        });
        self.pending = pending;
        out.freeze()
    }

    fn scan(&mut self, event: &[u8]) {
        let head = &event[..event.len().min(64)];
        let has = |needle: &[u8]| head.windows(needle.len()).any(|w| w == needle);
        if is_delta(event) {
            self.deltas += 1;
        } else if TERMINAL_EVENTS.iter().any(|kind| has(kind)) {
            self.done = true;
            if let Ok(value) = serde_json::from_slice::<Value>(data_of(event)) {
                let (output, cached) = usage_of(value.get("response").and_then(|r| r.get("usage")));
                self.cached_tokens = cached;
                if output.is_some() {
                    self.output_tokens = output;
                }
            }
        }
    }
}

/// Responses' own terminal event for a stream the proxy must end (`stream_failure`).
pub(crate) fn stream_failure(message: &str) -> Bytes {
    let event = serde_json::json!({
        "type": "response.failed",
        "sequence_number": -1,
        "response": {"object": "response", "status": "failed", "error": {"code": "server_error", "message": message}},
    });
    Bytes::from(format!("event: response.failed\ndata: {event}\n\n"))
}

/// OpenAI's Responses API (`POST /v1/responses`) on the native path.
pub(crate) struct Responses;

/// The Responses API.
pub(crate) const RESPONSES: Responses = Responses;

impl Protocol for Responses {
    fn name(&self) -> &'static str {
        "responses"
    }

    fn path(&self) -> &'static str {
        "/v1/responses"
    }

    fn armed(&self, apis: NativeApis) -> bool {
        apis.responses
    }

    fn plan(&self, raw: &[u8], session: Option<String>, ids: Ids<'_>) -> Result<Plan, Unplanned> {
        // A body the app refuses: its 400 says why (a body that is not JSON, here too).
        let refusal = || malformed(raw).or_else(|| parse_refusal(raw)).unwrap_or(Unplanned::App);
        if let Some(tokens) = ids.template {
            return tokenized_plan(raw, session, tokens).ok_or_else(refusal);
        }
        let (body, follow_up) = plan(raw).ok_or_else(refusal)?;
        let plan = rendered_plan(body, session, ids);
        Ok(match follow_up {
            Some(follow_up) => follow_up.apply(plan),
            None => plan,
        })
    }

    fn scanner(&self, ids: &Arc<ResponseIds>, _hide_usage: bool, instance: &str) -> Box<dyn StreamScan> {
        Box::new(ResponsesStream::new(Arc::clone(ids), instance))
    }

    /// A prefill leg generates one token and stores nothing (vLLM's store never evicts: a
    /// stored prefill-only response would stay on the prefill instance for good) — the app's
    /// `responses.PREFILL_OVERRIDES`.
    fn prefill_overrides(&self) -> &'static [(&'static str, &'static str)] {
        &[("max_output_tokens", "1"), ("store", "false")]
    }

    fn pinned_body(&self, raw: &[u8], engine_id: &str) -> Option<Bytes> {
        with_engine_previous(raw, engine_id)
    }

    fn usage(&self, answer: &[u8]) -> (Option<u64>, Option<u64>) {
        usage_counts(answer)
    }

    fn relay_whole(&self, ids: &ResponseIds, whole: Bytes, instance: &str) -> Bytes {
        Bytes::from(relay_body(ids, &whole, &ResponseIds::tag(instance)))
    }

    fn continuation(&self, body: &[u8], sent: &[u8], resumed: bool) -> Continued {
        continuation(body, sent, resumed)
    }

    fn stream_failure(&self, message: &str) -> Bytes {
        stream_failure(message)
    }

    fn end_marker(&self) -> &'static [u8] {
        b""
    }
}

impl StreamScan for ResponsesStream {
    fn feed(&mut self, chunk: Bytes) -> Bytes {
        ResponsesStream::feed(self, &chunk)
    }

    fn tokens(&self) -> u64 {
        ResponsesStream::tokens(self)
    }

    fn cached_tokens(&self) -> Option<u64> {
        self.cached_tokens
    }

    fn finished(&self) -> bool {
        self.done
    }

    fn done(&self) -> bool {
        self.done
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_reasoning_and_text_merge_into_the_last_assistant_message_in_pythons_key_order() {
        let body = r#"{"model":"m","input":[
            {"role":"assistant","content":[{"x":1}],"tool_calls":[],"extra":true},
            {"type":"function_call","call_id":"c","name":"f","arguments":"{}"},
            {"type":"reasoning","summary":[{"text":"why"}],"content":[{"text":""}]},
            {"type":"function_call_output","call_id":"c"}],
            "tools":[{"type":"function","name":"f","parameters":{}},{"type":"web_search"}]}"#;
        let conversion = conversion(body.as_bytes(), true).unwrap();
        let mut out = String::new();
        for m in &conversion.messages {
            m.json.push_json(&mut out);
            out.push('\n');
        }
        assert_eq!(
            out,
            concat!(
                "{\"role\": \"assistant\", \"content\": [{\"x\":1}], \"tool_calls\": [{\"id\": \"c\", \"function\": ",
                "{\"name\": \"f\", \"arguments\": \"{}\"}, \"type\": \"function\"}], \"extra\": true, \"reasoning\": \"why\"}\n",
                "{\"role\": \"tool\", \"content\": null, \"tool_call_id\": \"c\"}\n",
            )
        );
        assert_eq!(
            chat_tools(conversion.tools.unwrap()).unwrap(),
            r#"[{"type": "function", "function": {"name": "f", "parameters": {}}}]"#
        );
        assert_eq!(appended("[ ]", "1"), "[1]");
        assert_eq!(appended("[1]", "2"), "[1, 2]");
    }

    #[test]
    fn ids_are_issued_opened_and_rewritten_as_the_app_does() {
        let ids = ResponseIds::new("k");
        let tag = ResponseIds::tag("http://127.0.0.1:8000/");
        assert_eq!(tag, ResponseIds::tag("http://127.0.0.1:8000"));
        let issued = ids.issue("resp_1", &tag);
        assert!(ids.verifies(&issued) && !ids.verifies("resp_1") && !ResponseIds::new("j").verifies(&issued));
        let data = br#"{"id": "resp_1","item":{"id":"msg_1"},"previous_response_id":"resp_0","x":"\"id\":\"resp_2\""}"#;
        let out = String::from_utf8(ids.rewrite(data, &tag)).unwrap();
        assert_eq!(
            out,
            format!(
                r#"{{"id":"{issued}","item":{{"id":"msg_1"}},"previous_response_id":"{}","x":"\"id\":\"resp_2\""}}"#,
                ids.issue("resp_0", &tag)
            )
        );
        assert_eq!(ids.rewrite(out.as_bytes(), &tag), out.as_bytes(), "already the proxy's");
    }

    #[test]
    fn codex_history_renders_as_vllms_chat_messages() {
        let body = r#"{"model":"m","instructions":"be brief","store":false,"stream":true,"input":[
            {"type":"message","role":"user","content":[{"type":"input_text","text":"ls"}]},
            {"type":"reasoning","summary":[{"type":"summary_text","text":"s"}]},
            {"type":"function_call","call_id":"c","name":"ls","arguments":"{}"},
            {"type":"function_call_output","call_id":"c","output":"a b"},
            {"type":"message","role":"assistant","content":[{"type":"output_text","text":"done"}]},
            {"role":"user","content":"next"}]}"#;
        let (p, follow_up) = plan(body.as_bytes()).unwrap();
        assert!(follow_up.is_none());
        assert_eq!(
            String::from_utf8(p.rendered.text).unwrap(),
            "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\n<|im_end|>\n\
             <|im_start|>assistant\n<|im_end|>\n<|im_start|>tool\na b<|im_end|>\n\
             <|im_start|>assistant\ndone<|im_end|>\n<|im_start|>user\nnext<|im_end|>\n<|im_start|>assistant\n"
        );
        assert!(!p.rendered.first_turn);
        for refused in [
            r#"{"input":[{"type":"reasoning","encrypted_content":"x"}]}"#,
            r#"{"input":[{"type":"function_call","name":"ls"}]}"#,
            r#"{"input":[{"type":"nothing"}]}"#,
            r#"{"input":"x","previous_response_id":1}"#,
            r#"{"input":"x","max_output_tokens":0}"#,
            r#"{"input":[1]}"#,
        ] {
            assert!(plan(refused.as_bytes()).is_none(), "{refused}");
        }
    }

    #[test]
    fn a_follow_up_is_pinned_and_takes_its_turn_from_its_hint_else_two() {
        let body = br#"{"input":"next","previous_response_id":"resp_1-t-m","user":"","prompt_cache_key":"k"}"#;
        let plan = Responses.plan(body, None, Ids::CHATML).unwrap();
        assert_eq!(plan.previous_response.as_deref(), Some("resp_1-t-m"));
        assert_eq!(plan.turn_key.as_deref(), Some("k"), "the first non-empty body hint");
        let plan = Responses.plan(body, Some("h".to_owned()), Ids::CHATML).unwrap();
        assert_eq!(plan.turn_key.as_deref(), Some("h"), "the headers' hint first");
        let bare = br#"{"input":"next","previous_response_id":"resp_1-t-m"}"#;
        let plan = Responses.plan(bare, None, Ids::CHATML).unwrap();
        assert!(plan.turn_key.is_none() && plan.turn == TurnHint::Turn(2));
        let fresh = Responses.plan(br#"{"input":"first"}"#, None, Ids::CHATML).unwrap();
        assert!(fresh.previous_response.is_none() && fresh.turn_key.is_none());
        let sent = with_engine_previous(bare, "resp_1").unwrap();
        let sent: Value = serde_json::from_slice(&sent).unwrap();
        assert_eq!(
            sent,
            serde_json::json!({"input": "next", "previous_response_id": "resp_1"})
        );
    }

    #[test]
    fn a_stream_is_relayed_event_by_event_with_the_proxys_ids() {
        let ids = std::sync::Arc::new(ResponseIds::new("k"));
        let mut scan = ResponsesStream::new(std::sync::Arc::clone(&ids), "http://e");
        let tag = ResponseIds::tag("http://e");
        let first = scan.feed(b"event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_9\"}}\n\nevent: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\"");
        assert_eq!(
            first,
            format!(
                "event: response.created\ndata: {{\"type\":\"response.created\",\"response\":{{\"id\":\"{}\"}}}}\n\n",
                ids.issue("resp_9", &tag)
            )
            .as_bytes()
        );
        scan.feed(b",\"delta\":\"a\"}\n\nevent: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"output_tokens\":3,\"input_tokens_details\":{\"cached_tokens\":7}}}}\n\n");
        assert!(scan.done);
        assert_eq!((scan.tokens(), scan.cached_tokens), (3, Some(7)));
    }
}

#[cfg(test)]
mod cache_tests {
    use super::*;

    fn body(instructions: &str, items: &[&str], tools: bool) -> String {
        let tools = if tools {
            r#","tools":[{"type":"function","name":"shell","parameters":{}}]"#
        } else {
            ""
        };
        format!(
            r#"{{"model":"m","store":false{instructions},"input":[{}]{tools}}}"#,
            items.join(", ")
        )
    }

    /// A Codex-shaped session's turns planned through the message cache give the ids and turn
    /// verdict of the whole conversion without it, for both content formats sharing one cache,
    /// with and without instructions — including turns that end inside a run of merged items (a
    /// reasoning item whose function call arrives in the next turn: the run's message then grows,
    /// and a key that named only the run's first item would hand back the shorter one).
    #[test]
    fn the_cached_conversion_plans_what_the_whole_one_does() {
        let history = [
            r#"{"type":"message","role":"user","content":[{"type":"input_text","text":"fix the test"}]}"#,
            r#"{"type":"reasoning","summary":[{"type":"summary_text","text":"look first"}]}"#,
            r#"{"type":"function_call","call_id":"c1","name":"shell","arguments":"{\"cmd\":\"ls\"}"}"#,
            r#"{"type":"function_call","call_id":"c2","name":"shell","arguments":"{\"cmd\":\"cat a\"}"}"#,
            r#"{"type":"function_call_output","call_id":"c1","output":"a\nb"}"#,
            r#"{"type":"function_call_output","call_id":"c2","output":"x"}"#,
            r#"{"type":"message","role":"assistant","content":[{"type":"output_text","text":"done\n"}]}"#,
            r#"{"type":"reasoning","content":[{"type":"reasoning_text","text":"again"}]}"#,
            r#"{"type":"message","role":"assistant","content":[{"type":"output_text","text":"said"}]}"#,
            r#"{"type":"message","role":"developer","content":"be terse"}"#,
            r#"{"type":"message","role":"user","content":"thanks"}"#,
        ];
        let cached = TokenSource::for_tests(TokenSource::PRINT_ALL);
        for instructions in [r#","instructions":"You are Codex.\n""#, ""] {
            for tools in [false, true] {
                for turn in 1..=history.len() {
                    let raw = body(instructions, &history[..turn], tools);
                    let got = tokenized_plan(raw.as_bytes(), None, &cached).map(|p| (p.ids, p.turn));
                    let whole = TokenSource::for_tests(TokenSource::PRINT_ALL);
                    let want = whole_tokenized_plan(raw.as_bytes(), None, &whole).map(|p| (p.ids, p.turn));
                    assert!(want.is_some(), "{raw}");
                    assert_eq!(got, want, "{raw}");
                }
            }
        }
        // The history's runs were found again turn after turn (not converted anew).
        let (hits, _, kept, _) = cached.message_cache().stats();
        assert!(hits >= 60 && kept > 0, "{hits} {kept}");
        // What the app must answer stays the app's.
        let refused = body("", &[history[0], r#"{"type":"function_call","call_id":"c1"}"#], false);
        assert!(tokenized_plan(refused.as_bytes(), None, &cached).is_none());
    }
}
