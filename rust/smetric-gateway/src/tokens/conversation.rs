//! A chat request's conversation as vLLM hands it to the chat template, then as transformers
//! normalises it: the gateway's port of `smetric.serve.chat_template.vllm_conversation`,
//! `_template_message` and `_tool_dump` (their module docs give vLLM's and transformers'
//! sources). Values are built as template values whose maps keep their keys' order, because a
//! template's `tojson` of a tool or of a call's arguments prints them in that order.
//!
//! Invariants: the keys of each message come in Python's insertion order (`role`, `content`,
//! then the role's own, `name`, `task`, `tools`; `thinking` first when a reasoning text is
//! there); keys whose value is null are dropped. A conversation Python would refuse, or that
//! this port does not cover (a content that is neither text, null nor a list), is an error:
//! the caller then hands the request to the app, whose answer it is.
//! Complexity: O(conversation size).
//!
//! **The message cache** ([`MessageCache`]): each message of a chat body is normalised from its
//! own JSON text alone (and the template's content format), so the normalised message is kept by
//! that text, and a session's next turn, which re-sends its whole history byte for byte, parses
//! and normalises only its new messages. In the gateway's profile of a 32K-token follow-up in
//! tokenizer mode, the parse into template values and the normalisation were ≈ 20 % of its CPU
//! (`BENCHMARKS.md`, "The message cache"). A hit is the very text (compared, not only hashed),
//! under the same content format; only messages that normalised without an error are kept.
//! Anthropic Messages bodies use the same cache ([`MessageCache::find`], [`MessageCache::keep`]):
//! an Anthropic message converts into chat messages from its own text alone, so its normalised
//! chat messages are kept by its text, tagged as what the text was ([`CachedText`]): the same
//! JSON object normalises differently as a chat message and as an Anthropic one. Responses bodies
//! too: there the unit is the run of `input` items that converts into one message (a reasoning
//! item and the function calls merged after it), kept by the run's text.

use std::sync::{Arc, Mutex};

use indexmap::IndexMap;
use minijinja::value::{Value, ValueKind};
use serde_json::value::RawValue;

use super::text_lru::TextLru;

/// What a cached message is charged beyond twice its JSON text's bytes (the text as the key, and
/// about as much again in the values parsed from it): its maps and the entry.
const MESSAGE_OVERHEAD_BYTES: usize = 512;

/// vLLM's content format for a template (`--chat-template-content-format`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ContentFormat {
    /// A message's texts joined with `"\n"`.
    String,
    /// A message's parts kept as `{"type": "text", "text": ...}` objects.
    OpenAi,
}

/// Why a conversation is not rendered here (the app's answer: a 400, or its own rendering).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConversationError(pub String);

type Result<T> = std::result::Result<T, ConversationError>;

fn refuse<T>(why: impl Into<String>) -> Result<T> {
    Err(ConversationError(why.into()))
}

/// An ordered map of template values.
pub(crate) type Map = IndexMap<Value, Value>;

/// `obj.get(key)`: `None` when the key is absent (a present null is `Some(none)`).
pub(crate) fn get(obj: &Value, key: &str) -> Option<Value> {
    if obj.kind() != ValueKind::Map {
        return None;
    }
    obj.get_item(&Value::from(key)).ok().filter(|v| !v.is_undefined())
}

/// `obj.get(key)` with a null read as absent.
fn get_set(obj: &Value, key: &str) -> Option<Value> {
    get(obj, key).filter(|v| !v.is_none())
}

/// A map value's entries in order.
pub(crate) fn entries(obj: &Value) -> Map {
    let mut out = Map::new();
    if let Ok(keys) = obj.try_iter() {
        for key in keys {
            let item = obj.get_item(&key).unwrap_or_default();
            out.insert(key, item);
        }
    }
    out
}

pub(crate) fn map_value(map: Map) -> Value {
    Value::from_object(map)
}

fn text_part(text: Value) -> Value {
    let mut part = Map::new();
    part.insert(Value::from("type"), Value::from("text"));
    part.insert(Value::from("text"), text);
    map_value(part)
}

/// The field holding a text part's text, per part type (`_TEXT_KEYS`).
fn text_key(kind: &str) -> Option<&'static str> {
    Some(match kind {
        "text" | "input_text" | "output_text" => "text",
        "refusal" => "refusal",
        "thinking" => "thinking",
        _ => return None,
    })
}

/// The media a part type stands for (`_MEDIA`), in the table's order.
const MEDIA: [(&str, &str); 8] = [
    ("image_url", "image"),
    ("input_image", "image"),
    ("image_pil", "image"),
    ("image_embeds", "image"),
    ("audio_url", "audio"),
    ("input_audio", "audio"),
    ("audio_embeds", "audio"),
    ("video_url", "video"),
];

/// One content part (`_part`): a text, a media marker (the "openai" format), or nothing.
fn part(part: &Value, format: ContentFormat) -> Result<Option<Value>> {
    if part.kind() == ValueKind::String {
        // The string itself, shared (a long history's turn is one such part): not a copy.
        return Ok(Some(match format {
            ContentFormat::OpenAi => text_part(part.clone()),
            ContentFormat::String => part.clone(),
        }));
    }
    if part.kind() != ValueKind::Map {
        return refuse("content parts must be strings or objects");
    }
    let kind = get(part, "type");
    if let Some(key) = kind.as_ref().and_then(Value::as_str).and_then(text_key) {
        return Ok(get_set(part, key).map(|text| match format {
            ContentFormat::OpenAi => text_part(text),
            ContentFormat::String => text,
        }));
    }
    let media = match kind.as_ref().filter(|k| k.kind() == ValueKind::String) {
        Some(k) => MEDIA
            .iter()
            .find(|(name, _)| Some(*name) == k.as_str())
            .map(|(_, m)| *m),
        // A part without a string type is read by the first media key it has (Python's walk).
        None if kind.as_ref().is_some_and(|k| !k.is_none()) => None,
        None => MEDIA
            .iter()
            .find(|(name, _)| get(part, name).is_some())
            .map(|(_, m)| *m),
    };
    let Some(media) = media else {
        return refuse("unsupported chat content part type");
    };
    Ok(match format {
        ContentFormat::OpenAi => {
            let mut marker = Map::new();
            marker.insert(Value::from("type"), Value::from(media));
            Some(map_value(marker))
        }
        ContentFormat::String => None,
    })
}

/// Texts joined with `"\n"`; a part that is not a string makes Python's `join` raise.
fn join_texts(items: &[Value]) -> Result<Value> {
    // One text is itself: the value is shared, not copied (a long history's turn is one).
    if let [item] = items
        && item.kind() == ValueKind::String
    {
        return Ok(item.clone());
    }
    let mut out = String::new();
    for (k, item) in items.iter().enumerate() {
        let Some(text) = item.as_str() else {
            return refuse("a text part is not a string");
        };
        if k > 0 {
            out.push('\n');
        }
        out.push_str(text);
    }
    Ok(Value::from(out))
}

/// A tool call with `function.arguments` decoded (`_decoded_call`).
fn decoded_call(call: &Value) -> Value {
    let Some(function) = get(call, "function").filter(|f| f.kind() == ValueKind::Map) else {
        return call.clone();
    };
    let mut function = entries(&function);
    let arguments = function.get(&Value::from("arguments")).cloned();
    let decoded = match arguments {
        Some(a) if a.kind() == ValueKind::String => {
            serde_json::from_str::<Value>(a.as_str().unwrap_or_default()).unwrap_or_else(|_| map_value(Map::new()))
        }
        Some(a) if matches!(a.kind(), ValueKind::Map | ValueKind::Seq) => a,
        _ => map_value(Map::new()),
    };
    function.insert(Value::from("arguments"), decoded);
    let mut out = entries(call);
    out.insert(Value::from("function"), map_value(function));
    map_value(out)
}

/// Step 1 and step 2 of one message: vLLM's parse, then transformers' null-dropping and
/// reasoning aliases.
fn message(message: &Value, format: ContentFormat) -> Result<Value> {
    if message.kind() != ValueKind::Map {
        return refuse("a message is not an object");
    }
    // The app's request parse: a string role (vLLM's request model).
    let Some(role) = get(message, "role").filter(|r| r.kind() == ValueKind::String) else {
        return refuse("a message's role is not a string");
    };
    let role_name = role.as_str().unwrap_or_default().to_owned();
    let parts: Vec<Value> = match get(message, "content") {
        None => Vec::new(),
        Some(c) if c.is_none() => Vec::new(),
        Some(c) if c.kind() == ValueKind::String => vec![c],
        Some(c) if c.kind() == ValueKind::Seq => c.try_iter().into_iter().flatten().collect(),
        Some(_) => return refuse("a content that is neither text nor a list"),
    };
    let mut items = Vec::with_capacity(parts.len());
    for p in &parts {
        if let Some(item) = part(p, format)? {
            items.push(item);
        }
    }
    let mut out = Map::new();
    out.insert(Value::from("role"), role);
    out.insert(
        Value::from("content"),
        match format {
            ContentFormat::OpenAi => Value::from(items.clone()),
            ContentFormat::String => join_texts(&items)?,
        },
    );
    if role_name == "assistant" {
        if let Some(calls) = get_set(message, "tool_calls") {
            if calls.kind() != ValueKind::Seq {
                return refuse("tool_calls is not a list");
            }
            let decoded: Vec<Value> = calls
                .try_iter()
                .into_iter()
                .flatten()
                .map(|c| decoded_call(&c))
                .collect();
            if !decoded.is_empty() {
                out.insert(Value::from("tool_calls"), Value::from(decoded));
            }
        }
        if let Some(reasoning) = get_set(message, "reasoning") {
            out.insert(Value::from("reasoning"), reasoning.clone());
            out.insert(Value::from("reasoning_content"), reasoning);
        }
    } else if role_name == "tool" {
        if let Some(id) = get(message, "tool_call_id") {
            out.insert(Value::from("tool_call_id"), id);
        }
        if format == ContentFormat::OpenAi
            && items
                .iter()
                .all(|i| get(i, "type").is_some_and(|t| t.as_str() == Some("text")))
        {
            let texts: Vec<Value> = items
                .iter()
                .map(|i| get(i, "text").unwrap_or_else(|| Value::from("")))
                .collect();
            out.insert(Value::from("content"), join_texts(&texts)?);
        }
    }
    for key in ["name", "task"] {
        if let Some(v) = get(message, key).filter(|v| v.kind() == ValueKind::String) {
            out.insert(Value::from(key), v);
        }
    }
    if role_name == "developer" {
        out.insert(Value::from("tools"), get(message, "tools").unwrap_or(Value::from(())));
    }
    // transformers: null keys dropped; a reasoning text also as `thinking` (first) and
    // `reasoning_content`.
    out.retain(|_, v| !v.is_none());
    let reasoning = ["reasoning_content", "thinking", "reasoning"]
        .iter()
        .find_map(|k| out.get(&Value::from(*k)).cloned());
    if let Some(reasoning) = reasoning {
        let mut aliased = Map::new();
        aliased.insert(Value::from("thinking"), reasoning.clone());
        for (k, v) in out {
            if k.as_str() != Some("thinking") {
                aliased.insert(k, v);
            }
        }
        aliased.insert(Value::from("reasoning_content"), reasoning);
        out = aliased;
    }
    Ok(map_value(out))
}

/// A request's messages as the gateway has them: the JSON text of a chat body's `messages`, or
/// a converted API's messages already built as template values (no JSON text in between).
#[derive(Clone, Copy, Debug)]
pub enum Messages<'a> {
    Json(&'a str),
    /// Each message's JSON text, the list already split (in the body's own parse).
    Split(&'a [&'a RawValue]),
    Values(&'a [Value]),
    /// Messages already normalised for the template's content format ([`normalise`], through
    /// the cache).
    Normalised(&'a [Value]),
}

/// Each message's JSON text of a `messages` list's.
fn split(text: &str) -> Result<Vec<&RawValue>> {
    serde_json::from_str(text).map_err(|e| ConversationError(e.to_string()))
}

/// Messages as the template sees them (steps 1 and 2 of each, `message`), for `format`.
///
/// # Errors
/// A message Python would refuse, or one this port does not cover.
pub fn normalise(messages: &[Value], format: ContentFormat) -> Result<Vec<Value>> {
    messages.iter().map(|m| message(m, format)).collect()
}

/// The conversation the template sees, and its messages' roles (for the turn verdict).
///
/// With `cache`, a chat body's messages (JSON text) are looked up there by their text first, and
/// the ones normalised anew are kept there.
pub fn conversation(
    messages: Messages<'_>,
    format: ContentFormat,
    cache: Option<&MessageCache>,
) -> Result<(Vec<Value>, Vec<String>)> {
    let parsed: Vec<Value>;
    let messages = match (messages, cache) {
        (Messages::Json(text), Some(cache)) => return cache.conversation(&split(text)?, format),
        (Messages::Split(raws), Some(cache)) => return cache.conversation(raws, format),
        (Messages::Json(text), None) => {
            parsed = serde_json::from_str(text).map_err(|e| ConversationError(e.to_string()))?;
            &parsed[..]
        }
        (Messages::Split(raws), None) => {
            parsed = raws
                .iter()
                .map(|raw| serde_json::from_str(raw.get()))
                .collect::<serde_json::Result<_>>()
                .map_err(|e| ConversationError(e.to_string()))?;
            &parsed[..]
        }
        (Messages::Values(values), _) => values,
        (Messages::Normalised(values), _) => {
            return Ok((values.to_vec(), values.iter().map(role_of).collect()));
        }
    };
    let out = normalise(messages, format)?;
    let roles = out.iter().map(role_of).collect();
    Ok((out, roles))
}

/// A normalised message's role (empty when it has none: the template sees the same).
fn role_of(normalised: &Value) -> String {
    get(normalised, "role")
        .and_then(|r| r.as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// What a cached text is: the same JSON text normalises differently as each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CachedText {
    /// A chat body's message.
    ChatMessage,
    /// An Anthropic Messages body's message (converted into chat messages first).
    AnthropicMessage,
    /// An Anthropic Messages body's `system` field (the leading system message).
    AnthropicSystem,
    /// A Responses body's `instructions` (the leading system message).
    ResponsesInstructions,
    /// The text of a run of a Responses body's `input` items that converts into one message.
    ResponsesItems,
}

/// A kept text's normalised messages, and what the text was and for which content format.
#[derive(Clone)]
struct Kept {
    what: CachedText,
    format: ContentFormat,
    messages: Arc<[Value]>,
}

/// Normalised messages by their JSON text (module docs), within a bound in charged bytes.
pub struct MessageCache {
    lru: Mutex<TextLru<Kept>>,
    bound: usize,
}

impl std::fmt::Debug for MessageCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MessageCache")
            .field("bound", &self.bound)
            .finish_non_exhaustive()
    }
}

impl MessageCache {
    /// An empty cache of at most `bound` charged bytes (0: nothing is kept).
    pub fn new(bound: usize) -> Self {
        Self {
            lru: Mutex::new(TextLru::default()),
            bound,
        }
    }

    /// The cache's `hits`, `misses`, texts kept and charged bytes.
    pub fn stats(&self) -> (u64, u64, usize, usize) {
        let lru = self.lru.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        (lru.hits, lru.misses, lru.len(), lru.bytes())
    }

    /// The normalised messages kept for each text as `what` under `format` (None: not kept so),
    /// looked up under one lock.
    pub fn find(&self, texts: &[&str], what: CachedText, format: ContentFormat) -> Vec<Option<Arc<[Value]>>> {
        let mut lru = self.lru.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let found: Vec<Option<Arc<[Value]>>> = texts
            .iter()
            .map(|text| {
                lru.get(text)
                    .filter(|kept| kept.what == what && kept.format == format)
                    .map(|kept| kept.messages)
            })
            .collect();
        let hits = found.iter().filter(|v| v.is_some()).count();
        lru.hits += hits as u64;
        lru.misses += (found.len() - hits) as u64;
        found
    }

    /// Keeps each text's normalised messages (as `what`, for `format`) under one lock; a text
    /// kept already stays as it is.
    pub fn keep(&self, fresh: &[(&str, Arc<[Value]>)], what: CachedText, format: ContentFormat) {
        if self.bound == 0 || fresh.is_empty() {
            return;
        }
        let mut lru = self.lru.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        for (text, messages) in fresh {
            let charged = 2 * text.len() + MESSAGE_OVERHEAD_BYTES * messages.len().max(1);
            let kept = Kept {
                what,
                format,
                messages: messages.clone(),
            };
            lru.keep(text, kept, charged, self.bound);
        }
    }

    /// [`conversation`] of a chat body's messages (each one's JSON text) through the cache.
    fn conversation(&self, raws: &[&RawValue], format: ContentFormat) -> Result<(Vec<Value>, Vec<String>)> {
        let texts: Vec<&str> = raws.iter().map(|raw| raw.get()).collect();
        // Looked up under one lock, normalised outside it, kept under one more.
        let found = self.find(&texts, CachedText::ChatMessage, format);
        let mut out = Vec::with_capacity(raws.len());
        let mut fresh = Vec::new();
        for (text, hit) in texts.iter().zip(found) {
            if let Some(kept) = hit {
                out.extend(kept.iter().cloned());
                continue;
            }
            let parsed: Value = serde_json::from_str(text).map_err(|e| ConversationError(e.to_string()))?;
            let normalised = message(&parsed, format)?;
            fresh.push((*text, Arc::from([normalised.clone()])));
            out.push(normalised);
        }
        self.keep(&fresh, CachedText::ChatMessage, format);
        let roles = out.iter().map(role_of).collect();
        Ok((out, roles))
    }
}

/// A tool as vLLM's `ChatCompletionToolsParam.model_dump()` gives it (`_tool_dump`).
pub fn tool_dump(tool: &Value) -> Value {
    let Some(function) = get(tool, "function").filter(|f| f.kind() == ValueKind::Map) else {
        return tool.clone();
    };
    let mut declared = Map::new();
    for key in ["name", "description", "parameters"] {
        declared.insert(Value::from(key), get(&function, key).unwrap_or(Value::from(())));
    }
    for (k, v) in entries(&function) {
        if !declared.contains_key(&k) {
            declared.insert(k, v);
        }
    }
    let mut out = Map::new();
    out.insert(
        Value::from("type"),
        get(tool, "type").unwrap_or(Value::from("function")),
    );
    out.insert(Value::from("function"), map_value(declared));
    for (k, v) in entries(tool) {
        if !matches!(k.as_str(), Some("type" | "function")) {
            out.insert(k, v);
        }
    }
    map_value(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokens::pyvalue::{JsonStyle, py_json};

    fn json(v: &Value) -> String {
        py_json(v, &JsonStyle::new(None, None, false)).unwrap()
    }

    #[test]
    fn messages_take_vllms_shape_and_transformers_aliases() {
        let (chat, roles) = conversation(
            Messages::Json(r#"[{"role": "user", "content": [{"type": "text", "text": "a"}, "b", {"type": "image_url", "image_url": {}}]},
                {"role": "assistant", "content": null, "reasoning": "r",
                 "tool_calls": [{"id": "1", "function": {"name": "f", "arguments": "{\"z\": 1, \"a\": 2}"}, "type": "function"}]},
                {"role": "tool", "tool_call_id": "1", "content": [{"type": "text", "text": "x"}, {"type": "text", "text": "y"}]}]"#),
            ContentFormat::String,
            None,
        )
        .unwrap();
        assert_eq!(roles, ["user", "assistant", "tool"]);
        assert_eq!(json(&chat[0]), r#"{"role": "user", "content": "a\nb"}"#);
        assert_eq!(
            json(&chat[1]),
            r#"{"thinking": "r", "role": "assistant", "content": "", "tool_calls": [{"id": "1", "function": {"name": "f", "arguments": {"z": 1, "a": 2}}, "type": "function"}], "reasoning": "r", "reasoning_content": "r"}"#
        );
        assert_eq!(
            json(&chat[2]),
            r#"{"role": "tool", "content": "x\ny", "tool_call_id": "1"}"#
        );
        let (open, _) = conversation(
            Messages::Json(r#"[{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url"}]}]"#),
            ContentFormat::OpenAi,
            None,
        )
        .unwrap();
        assert_eq!(
            json(&open[0]),
            r#"{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image"}]}"#
        );
    }

    #[test]
    fn parts_python_refuses_are_refused() {
        for body in [
            r#"[{"role": "user", "content": [{"type": "video_frames"}]}]"#,
            r#"[{"role": "user", "content": [3]}]"#,
            r#"[{"role": "user", "content": [{"type": "text", "text": 3}]}]"#,
        ] {
            assert!(
                conversation(Messages::Json(body), ContentFormat::String, None).is_err(),
                "{body}"
            );
        }
    }

    #[test]
    fn tools_dump_with_their_declared_fields_first() {
        let tool: Value =
            serde_json::from_str(r#"{"function": {"parameters": {"b": 1}, "name": "f", "strict": true}, "x": 1}"#)
                .unwrap();
        assert_eq!(
            json(&tool_dump(&tool)),
            r#"{"type": "function", "function": {"name": "f", "description": null, "parameters": {"b": 1}, "strict": true}, "x": 1}"#
        );
    }
}
