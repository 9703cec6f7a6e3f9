//! A cut OpenAI stream continued natively (`python/smetric/serve/apis/openai.py`, `chat.py`,
//! `completions.py`: the app's rules), and what every API's continuation shares: [`Continued`]
//! and [`Rejoin`] (Messages' own are in `messages.rs` and `anthropic_events.rs`, Responses' in
//! `responses_splice.rs`).
//!
//! From what the client already received ([`Received`], decoded from the events it was sent):
//! nothing yet → the request again as it was (the new stream's opening dropped); text (and, for
//! chat, a reasoning that text followed) → the API's continuation request: chat appends the text
//! as the final assistant message (its reasoning as `reasoning`) with vLLM's
//! `continue_final_message`, completions appends it to a text prompt; the output budget
//! (`max_tokens`, `max_completion_tokens`) is reduced by the chunks already sent. Never continued
//! (the stream ends with the API's error event): after a `tool_calls` delta, under a grammar
//! (`guided_*`, `structured_outputs`, a JSON or structural-tag `response_format`, chat's forced
//! `tool_choice`), inside a reasoning, with `n` ≠ 1, completions' `echo` or a prompt of ids. A
//! second cut is continued from the original request and everything received, never from a
//! continuation, so nothing is put back twice.
//!
//! A continuation's events reach the client as one stream ([`Rejoined`]): its opening role
//! chunk (chat) dropped, its `"id"` field rewritten to the first attempt's.
//!
//! O(received bytes) to decode and build, once per cut; O(event bytes) per relayed event.

use bytes::{Bytes, BytesMut};
use serde_json::{Map, Value};
use smetric_vllm::{Endpoint, Prompt, parse_openai_body};

use super::sse::{Pending, contains, data_of};

/// What a cut stream is continued with, and how the continuation's events join the client's
/// stream (built from the same decoding of what the client received).
pub(crate) enum Continued {
    /// The request as it was (nothing but the opening reached the client).
    Again(Box<dyn Rejoin>),
    /// The continuation request's body.
    Body(Bytes, Box<dyn Rejoin>),
    /// A body for the engine's chat endpoint, whose chunks the API translates back into its own
    /// events (Messages: vLLM's `/v1/messages` cannot continue a final assistant message).
    OverChat(Bytes, Box<dyn Rejoin>),
    /// Not continued faithfully: the stream ends with the API's error event.
    Not,
}

/// How a continuation's events join the stream the client has: the bytes to relay for each
/// upstream chunk, and what the continuation itself says of its end.
pub(crate) trait Rejoin: Send {
    /// The client's bytes for `chunk` (whole events; a part waits for the rest).
    fn feed(&mut self, chunk: &[u8]) -> Bytes;
    /// Whether the continuation's answer finished (a translated stream's finish reason, which
    /// the client's events say only once the message ends).
    fn finished(&self) -> bool {
        false
    }
    /// What closes the client's message when the upstream ended without its own end, before
    /// the API's end marker.
    fn closing(&mut self) -> Bytes {
        Bytes::new()
    }
}

/// vLLM's request fields that constrain decoding to a grammar.
const STRUCTURED_FIELDS: [&str; 5] = [
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "structured_outputs",
];
/// `response_format` types decoded under a grammar (`text` is free text).
const STRUCTURED_FORMATS: [&str; 3] = ["json_schema", "json_object", "structural_tag"];

/// What the client of a cut stream already has.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Received {
    pub(crate) text: String,
    pub(crate) reasoning: String,
    pub(crate) tool_calls: bool,
    /// Chunks that carried any of it (one generated token each).
    pub(crate) pieces: i64,
}

impl Received {
    /// Decodes the events the client was sent (`OpenAIStream.received`).
    pub(crate) fn of(chat: bool, sent: &[u8]) -> Self {
        let mut got = Self::default();
        let mut pending = Pending::default();
        pending.feed(sent, |event| {
            let Some(data) = event.strip_prefix(b"data:") else {
                return;
            };
            let Ok(Value::Object(obj)) = serde_json::from_slice::<Value>(data) else {
                return;
            };
            let Some(Value::Object(choice)) = obj.get("choices").and_then(Value::as_array).and_then(|c| c.first())
            else {
                return;
            };
            let delta = choice.get("delta").and_then(Value::as_object);
            let piece = if chat {
                delta.and_then(|d| d.get("content"))
            } else {
                choice.get("text")
            };
            let thought = delta.and_then(|d| d.get("reasoning").or_else(|| d.get("reasoning_content")));
            let mut carried = false;
            if let Some(Value::String(piece)) = piece
                && !piece.is_empty()
            {
                got.text.push_str(piece);
                carried = true;
            }
            if let Some(Value::String(thought)) = thought
                && !thought.is_empty()
            {
                got.reasoning.push_str(thought);
                carried = true;
            }
            if delta.and_then(|d| d.get("tool_calls")).is_some_and(truthy) {
                got.tool_calls = true;
                carried = true;
            }
            got.pieces += i64::from(carried);
        });
        got
    }

    fn nothing(&self) -> bool {
        self.pieces == 0 && !self.tool_calls
    }
}

/// Python's truth value of a JSON value.
pub(crate) fn truthy(value: &Value) -> bool {
    match value {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

/// The continuation of a chat (`chat`) or completions stream whose request body was `body` (as
/// it was sent, the usage option included) and whose client received `sent`.
pub(crate) fn continuation(chat: bool, body: &[u8], sent: &[u8]) -> Continued {
    let rejoined = || -> Box<dyn Rejoin> { Box::new(Rejoined::new(chat, first_id(sent))) };
    let Ok(Value::Object(mut obj)) = serde_json::from_slice::<Value>(body) else {
        return Continued::Not;
    };
    if obj.get("n").is_some_and(|n| n.as_f64() != Some(1.0)) {
        return Continued::Not;
    }
    let got = Received::of(chat, sent);
    if got.nothing() {
        return Continued::Again(rejoined());
    }
    if got.tool_calls || structured(&obj) || !continuable(chat, &obj, &got) {
        return Continued::Not;
    }
    for key in ["max_tokens", "max_completion_tokens"] {
        if let Some(budget) = obj.get(key).and_then(Value::as_i64) {
            obj.insert(key.to_owned(), Value::from((budget - got.pieces).max(1)));
        }
    }
    if chat {
        let Some(Value::Array(messages)) = obj.get_mut("messages") else {
            return Continued::Not;
        };
        let mut last = Map::new();
        last.insert("role".to_owned(), Value::from("assistant"));
        last.insert("content".to_owned(), Value::from(got.text));
        if !got.reasoning.is_empty() {
            last.insert("reasoning".to_owned(), Value::from(got.reasoning));
        }
        messages.push(Value::Object(last));
        obj.insert("continue_final_message".to_owned(), Value::Bool(true));
        obj.insert("add_generation_prompt".to_owned(), Value::Bool(false));
    } else {
        // The proxy's own parser says what the prompt is (a text, or ids: not continued).
        let Ok(parsed) = parse_openai_body(body, Endpoint::Completions) else {
            return Continued::Not;
        };
        let Some(Prompt::Text(prompt)) = parsed.prompt else {
            return Continued::Not;
        };
        obj.insert("prompt".to_owned(), Value::from(format!("{prompt}{}", got.text)));
    }
    match serde_json::to_vec(&Value::Object(obj)) {
        Ok(body) => Continued::Body(Bytes::from(body), rejoined()),
        Err(_) => Continued::Not,
    }
}

/// Whether the output is decoded under a grammar.
fn structured(body: &Map<String, Value>) -> bool {
    if STRUCTURED_FIELDS
        .iter()
        .any(|k| body.get(*k).is_some_and(|v| !v.is_null()))
    {
        return true;
    }
    let kind = body
        .get("response_format")
        .and_then(|f| f.get("type"))
        .and_then(Value::as_str);
    kind.is_some_and(|k| STRUCTURED_FORMATS.contains(&k))
}

/// Whether the API can put `got` back faithfully, besides the shared rules.
fn continuable(chat: bool, body: &Map<String, Value>, got: &Received) -> bool {
    if chat {
        // "required" or a named function: vLLM guides the call.
        let forced = match body.get("tool_choice") {
            Some(Value::String(choice)) => choice == "required",
            Some(Value::Object(_)) => true,
            _ => false,
        };
        !forced && !got.text.is_empty() // reasoning alone: cut inside it
    } else {
        !body.get("echo").is_some_and(truthy)
    }
}

/// The `"id": "…"` field of the first data event of `sent` (None: no event yet, or the first
/// has none: then nothing is renamed).
fn first_id(sent: &[u8]) -> Option<Vec<u8>> {
    let mut pending = Pending::default();
    let mut first: Option<Option<Vec<u8>>> = None;
    pending.feed(sent, |event| {
        if first.is_none()
            && let Some(data) = event.strip_prefix(b"data:")
            && data.trim_ascii() != b"[DONE]"
        {
            first = Some(id_field(event).map(<[u8]>::to_vec));
        }
    });
    first.flatten()
}

/// The first `"id"` field of `event`: `"id"`, optional blanks, `:`, optional blanks, then a
/// string without escapes (vLLM writes the chunk's id first, before any tool call's).
fn id_field(event: &[u8]) -> Option<&[u8]> {
    let mut from = 0;
    while let Some(at) = event[from..].windows(4).position(|w| w == b"\"id\"") {
        let start = from + at;
        let mut i = start + 4;
        while event.get(i).is_some_and(u8::is_ascii_whitespace) {
            i += 1;
        }
        if event.get(i) == Some(&b':') {
            i += 1;
            while event.get(i).is_some_and(u8::is_ascii_whitespace) {
                i += 1;
            }
            if event.get(i) == Some(&b'"') {
                let rest = &event[i + 1..];
                if let Some(end) = rest.iter().position(|&b| b == b'"' || b == b'\\')
                    && rest[end] == b'"'
                {
                    return Some(&event[start..i + 2 + end]);
                }
            }
        }
        from = start + 1;
    }
    None
}

/// A continuation's stream as the client gets it, after the first attempt's: chat's opening
/// role chunk dropped, the continuation's `"id"` field rewritten to the first attempt's.
struct Rejoined {
    chat: bool,
    id: Option<Vec<u8>>,
    renamed: Option<Vec<u8>>,
    pending: Pending,
}

impl Rejoined {
    fn new(chat: bool, id: Option<Vec<u8>>) -> Self {
        Self {
            chat,
            id,
            renamed: None,
            pending: Pending::default(),
        }
    }
}

impl Rejoin for Rejoined {
    fn feed(&mut self, chunk: &[u8]) -> Bytes {
        let mut out = BytesMut::new();
        let mut pending = std::mem::take(&mut self.pending);
        pending.feed(chunk, |event| {
            if self.chat && is_opening_chunk(event) {
                return;
            }
            match (&self.id, &self.renamed) {
                (Some(id), None) => {
                    if let Some(own) = id_field(event) {
                        self.renamed = Some(own.to_vec());
                    }
                    push_renamed(&mut out, event, self.renamed.as_deref(), id);
                }
                (Some(id), Some(own)) => push_renamed(&mut out, event, Some(own), id),
                (None, _) => out.extend_from_slice(event),
            }
            out.extend_from_slice(b"\n\n");
        });
        self.pending = pending;
        out.freeze()
    }
}

/// `event` with every `own` replaced by `id`.
fn push_renamed(out: &mut BytesMut, event: &[u8], own: Option<&[u8]>, id: &[u8]) {
    let Some(own) = own.filter(|own| *own != id && !own.is_empty()) else {
        out.extend_from_slice(event);
        return;
    };
    let mut rest = event;
    while let Some(at) = rest.windows(own.len()).position(|w| w == own) {
        out.extend_from_slice(&rest[..at]);
        out.extend_from_slice(id);
        rest = &rest[at + own.len()..];
    }
    out.extend_from_slice(rest);
}

/// Chat's opening chunk: one choice whose delta has a role and no content, not finished.
fn is_opening_chunk(event: &[u8]) -> bool {
    if !event.starts_with(b"data:") || !contains(event, b"\"role\"") {
        return false;
    }
    let Ok(Value::Object(obj)) = serde_json::from_slice::<Value>(data_of(event)) else {
        return false;
    };
    let Some([Value::Object(choice)]) = obj.get("choices").and_then(Value::as_array).map(Vec::as_slice) else {
        return false;
    };
    let delta = choice.get("delta").and_then(Value::as_object);
    let role = delta.is_some_and(|d| d.contains_key("role"));
    let content = delta.and_then(|d| d.get("content")).is_some_and(truthy);
    role && !content && choice.get("finish_reason").is_none_or(Value::is_null)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(id: &str, delta: &str) -> String {
        format!(r#"data: {{"id":"{id}","choices":[{{"index":0,"delta":{delta},"finish_reason":null}}]}}"#) + "\n\n"
    }

    fn body_of(c: Continued) -> Value {
        match c {
            Continued::Body(b, _) => serde_json::from_slice(&b).unwrap(),
            Continued::Again(_) => Value::from("again"),
            Continued::OverChat(..) | Continued::Not => Value::from("not"),
        }
    }

    #[test]
    fn chat_puts_the_text_and_its_reasoning_back_as_the_final_message() {
        let sent = chunk("c1", r#"{"role":"assistant"}"#)
            + &chunk("c1", r#"{"reasoning":"think"}"#)
            + &chunk("c1", r#"{"content":"hello "}"#);
        let body = br#"{"messages":[{"role":"user","content":"x"}],"max_tokens":9,"stream":true}"#;
        let out = body_of(continuation(true, body, sent.as_bytes()));
        assert_eq!(
            out["messages"][1],
            serde_json::json!({"role": "assistant", "content": "hello ", "reasoning": "think"})
        );
        assert_eq!(out["max_tokens"], 7);
        assert_eq!(out["continue_final_message"], true);
        assert_eq!(out["add_generation_prompt"], false);
    }

    #[test]
    fn what_cannot_be_continued_faithfully_is_not() {
        let role = chunk("c1", r#"{"role":"assistant"}"#);
        let text = role.clone() + &chunk("c1", r#"{"content":"a"}"#);
        let msgs = r#""messages":[{"role":"user","content":"x"}]"#;
        let not = |chat: bool, body: &str, sent: &str| {
            matches!(continuation(chat, body.as_bytes(), sent.as_bytes()), Continued::Not)
        };
        assert!(matches!(
            continuation(true, format!("{{{msgs}}}").as_bytes(), role.as_bytes()),
            Continued::Again(_)
        ));
        assert!(not(true, &format!(r#"{{{msgs},"n":2}}"#), &text));
        assert!(not(true, &format!(r#"{{{msgs},"tool_choice":"required"}}"#), &text));
        assert!(not(
            true,
            &format!(r#"{{{msgs},"response_format":{{"type":"json_object"}}}}"#),
            &text
        ));
        assert!(not(true, &format!(r#"{{{msgs},"guided_regex":"a+"}}"#), &text));
        let thinking = role.clone() + &chunk("c1", r#"{"reasoning":"hm"}"#);
        assert!(not(true, &format!("{{{msgs}}}"), &thinking), "cut inside the reasoning");
        let tool = role + &chunk("c1", r#"{"tool_calls":[{"index":0}]}"#);
        assert!(not(true, &format!("{{{msgs}}}"), &tool));
        let text = r#"data: {"id":"c","choices":[{"index":0,"text":"b","finish_reason":null}]}"#.to_owned() + "\n\n";
        assert!(not(false, r#"{"prompt":"a","echo":true}"#, &text));
        assert!(not(false, r#"{"prompt":[1,2]}"#, &text), "a prompt of ids");
        let out = body_of(continuation(
            false,
            br#"{"prompt":"a","max_tokens":1}"#,
            text.as_bytes(),
        ));
        assert_eq!(
            (out["prompt"].as_str(), out["max_tokens"].as_i64()),
            (Some("ab"), Some(1))
        );
    }

    #[test]
    fn a_continuation_drops_its_opening_and_takes_the_first_attempts_id() {
        let first = chunk("c1", r#"{"role":"assistant"}"#) + &chunk("c1", r#"{"content":"a"}"#);
        let id = first_id(first.as_bytes());
        assert_eq!(id.as_deref(), Some(&br#""id":"c1""#[..]));
        let mut rejoined = Rejoined::new(true, id);
        let next = chunk("c2", r#"{"role":"assistant"}"#) + &chunk("c2", r#"{"content":"b"}"#) + "data: [DONE]\n\n";
        let (a, b) = next.as_bytes().split_at(50);
        let mut out = rejoined.feed(a).to_vec();
        out.extend_from_slice(&rejoined.feed(b));
        assert_eq!(
            String::from_utf8(out).unwrap(),
            chunk("c1", r#"{"content":"b"}"#) + "data: [DONE]\n\n"
        );
        assert_eq!(
            id_field(br#"data: {"id" : "x\"y"}"#),
            None,
            "an escaped id is left alone"
        );
    }
}
