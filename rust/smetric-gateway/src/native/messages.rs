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
//! **Validation** is `to_chat`'s, field by field; a body it would refuse — or one whose text
//! Python would build with its own `str()` of a non-string, which is not reproduced — gives
//! `None`, and the app answers it.
//!
//! **Stream** (`MessagesStream` of `apis/messages.py`): `event: NAME\ndata: {…}` events; each
//! `content_block_delta` but a signature is one output token; a `message_delta` with a
//! `stop_reason` finishes the answer; `message_stop` ends the stream; `cache_read_input_tokens`
//! in `message_start` or `message_delta` is the realized hit.
//!
//! O(body length): one borrowed parse of the body, one of each message, one copy of the text.

use std::borrow::Cow;

use bytes::Bytes;
use serde::Deserialize;
use serde_json::Value;
use serde_json::value::RawValue;

use std::sync::Arc;

use hyper::{Response, StatusCode};

use super::chatml::{Rendered, RenderedBody};
use super::json::{is_object, list, object, string};
use super::protocol::{Plan, Protocol, StreamScan, rendered_plan, stream_scan_by_fields};
use super::response_ids::ResponseIds;
use super::sse::{Pending, contains, data_of};
use super::state::NativeApis;
use crate::answers::{Body as AnswerBody, json_response};
use crate::tokens::TokenizerSource;

use crate::shared::BILLING_HEADER_PREFIX;

/// The end marker written when an upstream stream ends without its own.
pub(crate) const MESSAGE_STOP: &[u8] = b"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";

#[derive(Deserialize)]
struct Body<'a> {
    #[serde(borrow, default)]
    model: Option<&'a RawValue>,
    #[serde(borrow, default)]
    max_tokens: Option<&'a RawValue>,
    #[serde(borrow, default)]
    stream: Option<&'a RawValue>,
    #[serde(borrow, default)]
    messages: Option<&'a RawValue>,
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

#[derive(Deserialize)]
struct Message<'a> {
    #[serde(borrow, default)]
    role: Option<&'a RawValue>,
    #[serde(borrow, default)]
    content: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct Block<'a> {
    #[serde(borrow, default, rename = "type")]
    kind: Option<&'a RawValue>,
    #[serde(borrow, default)]
    text: Option<&'a RawValue>,
    #[serde(borrow, default)]
    thinking: Option<&'a RawValue>,
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

/// The body validated and rendered (see the module docs), or None: the app's to answer.
pub(crate) fn plan(raw: &[u8]) -> Option<RenderedBody> {
    if smetric_vllm::openai_body::nests_deeper_than(raw, smetric_vllm::openai_body::MAX_NESTING) {
        return None;
    }
    let whole: &RawValue = serde_json::from_slice(raw).ok()?;
    let body: Body<'_> = object(whole)?;
    if body.kv_transfer_params.is_some() {
        return None;
    }
    let model = string(body.model?)?.into_owned();
    positive(body.max_tokens?)?;
    // `stream` is the engine's to read; here it must be a boolean (or absent).
    if body.stream.is_some_and(|s| !matches!(s.get(), "true" | "false")) {
        return None;
    }
    let messages = list(body.messages?)?;
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
    let mut out = Converted::default();
    match body.system {
        None => {}
        Some(system) => match string(system) {
            Some(text) if !text.is_empty() => out.push("system", &text),
            Some(_) => {}
            None => {
                let blocks = blocks(system)?;
                if let Some(text) = system_text(&blocks) {
                    out.push("system", &text);
                }
            }
        },
    }
    for message in messages {
        convert(&mut out, message)?;
    }
    let roles = out.roles.iter().map(String::as_str);
    let first_turn = smetric_core::first_turn_from_roles(roles);
    out.text.extend_from_slice(b"<|im_start|>assistant\n");
    Some(RenderedBody {
        rendered: Rendered {
            text: out.text,
            first_turn,
        },
        model: Some(model),
        cache_salt,
    })
}

/// The converted conversation as ChatML, and its roles.
#[derive(Default)]
struct Converted {
    text: Vec<u8>,
    roles: Vec<String>,
}

impl Converted {
    fn push(&mut self, role: &str, content: &str) {
        self.text.extend_from_slice(b"<|im_start|>");
        self.text.extend_from_slice(role.as_bytes());
        self.text.push(b'\n');
        self.text.extend_from_slice(content.as_bytes());
        self.text.extend_from_slice(b"<|im_end|>\n");
        self.roles.push(role.to_owned());
    }
}

/// A content's blocks, each checked as `_check_blocks` checks it.
fn blocks(raw: &RawValue) -> Option<Vec<Block<'_>>> {
    list(raw)?
        .into_iter()
        .map(|b| {
            let block: Block<'_> = object(b)?;
            string(block.kind?)?;
            for field in [block.text, block.thinking].into_iter().flatten() {
                string(field)?;
            }
            if block.kind.and_then(string).as_deref() == Some("tool_use") && block.input.is_some_and(|i| !is_object(i))
            {
                return None;
            }
            Some(block)
        })
        .collect()
}

fn kind<'a>(block: &'a Block<'a>) -> Cow<'a, str> {
    block.kind.and_then(string).unwrap_or_default()
}

/// A non-empty text block's text.
fn block_text<'a>(block: &'a Block<'a>) -> Option<Cow<'a, str>> {
    block.text.and_then(string).filter(|t| !t.is_empty())
}

/// `_system_text` of blocks: the non-empty text blocks not starting with the billing prefix.
fn system_text(blocks: &[Block<'_>]) -> Option<String> {
    let text: String = blocks
        .iter()
        .filter(|b| kind(b) == "text")
        .filter_map(block_text)
        .filter(|t| !t.starts_with(BILLING_HEADER_PREFIX))
        .collect();
    (!text.is_empty()).then_some(text)
}

fn convert(out: &mut Converted, raw: &RawValue) -> Option<()> {
    let message: Message<'_> = object(raw)?;
    let role = string(message.role?)?;
    if !matches!(role.as_ref(), "user" | "assistant" | "system") {
        return None;
    }
    let content = message.content?;
    if let Some(text) = string(content) {
        if role == "system" {
            if !text.is_empty() && !text.starts_with(BILLING_HEADER_PREFIX) {
                out.push("system", &text);
            }
        } else {
            out.push(&role, &text);
        }
        return Some(());
    }
    let blocks = blocks(content)?;
    if role == "system" {
        if let Some(text) = system_text(&blocks) {
            out.push("system", &text);
        }
        return Some(());
    }
    let mut text = String::new();
    let mut parts = 0usize;
    for block in &blocks {
        match kind(block).as_ref() {
            "text" => {
                if let Some(t) = block_text(block) {
                    text.push_str(&t);
                    parts += 1;
                }
            }
            "image" => {
                // `block.get("source")` truthy: an image part (no text in ChatML).
                if let Some(source) = block.source
                    && truthy(source)?
                {
                    parts += 1;
                }
            }
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
                text.push_str("Tool result: ");
                text.push_str(&content);
                parts += 1;
            }
            _ => {}
        }
    }
    if role == "user" && parts == 0 {
        return Some(()); // dropped: no content
    }
    out.push(&role, &text);
    Some(())
}

/// A user's `tool_result`: a `tool` message of its text, then its images and references.
fn tool_result(out: &mut Converted, block: &Block<'_>) -> Option<()> {
    let Some(content) = block.content else {
        out.push("tool", "");
        return Some(());
    };
    if let Some(text) = string(content) {
        out.push("tool", &text);
        return Some(());
    }
    let Some(items) = list(content) else {
        out.push("tool", ""); // neither a string nor a list: no text
        return Some(());
    };
    let mut texts: Vec<Cow<'_, str>> = Vec::new();
    let mut images = false;
    let mut references = false;
    for item in items {
        let Some(item) = object::<Item<'_>>(item) else { continue };
        match item.kind.and_then(string).as_deref() {
            Some("text") => texts.push(match item.text {
                None => Cow::Borrowed(""),
                Some(t) => string(t)?, // Python's str() of a non-string: not reproduced
            }),
            Some("image") => images = true,
            Some("tool_reference") => {
                // `item.get("tool_name") or item.get("name")`: a truthy name.
                let named = match item.tool_name.map(truthy) {
                    Some(Some(true)) => true,
                    Some(None) => return None,
                    _ => item.name.map_or(Some(false), truthy)?,
                };
                references |= named;
            }
            _ => {}
        }
    }
    out.push("tool", &texts.join("\n"));
    if images {
        out.push("user", "");
    }
    if references {
        out.push("tool", "");
    }
    Some(())
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

fn event_name(event: &[u8]) -> &[u8] {
    let Some(rest) = event.strip_prefix(b"event:") else {
        return b"";
    };
    let end = rest.iter().position(|&b| b == b'\n').unwrap_or(rest.len());
    rest[..end].trim_ascii()
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
            b"content_block_delta" if !contains(event, b"\"signature_delta\"") => self.deltas += 1,
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
        if (name == b"message_start" || name == b"message_delta") && contains(event, b"\"cache_read_input_tokens\"") {
            if let Ok(value) = serde_json::from_slice::<Value>(data_of(event)) {
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

    fn plan(&self, raw: &[u8], session: Option<String>, tokenizer: Option<&TokenizerSource>) -> Option<Plan> {
        // Tokenizer mode renders this API's conversion with the model's template: the app's.
        if tokenizer.is_some() {
            return None;
        }
        Some(rendered_plan(plan(raw)?, session))
    }

    fn scanner(&self, _ids: &Arc<ResponseIds>, _hide_usage: bool, _instance: &str) -> Box<dyn StreamScan> {
        Box::new(MessagesStream::default())
    }

    fn usage(&self, answer: &[u8]) -> (Option<u64>, Option<u64>) {
        usage_counts(answer)
    }

    fn client_error(&self, status: StatusCode, message: &str, _code: Option<&str>) -> Response<AnswerBody> {
        self.proxy_error(status.as_u16(), message, "")
    }

    fn proxy_error(&self, status: u16, message: &str, _kind: &str) -> Response<AnswerBody> {
        let status = self::status(status);
        json_response(
            StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            error_body(status, message),
        )
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
