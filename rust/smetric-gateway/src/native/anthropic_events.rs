//! Anthropic's Messages event stream as a cut stream's continuation sees it
//! (`python/smetric/serve/apis/messages.py`: `_blocks`, `_ChatTranslation`, the module docs'
//! "A cut stream"): the content blocks the client already received ([`Received`]), and a
//! continuation's chat-completion chunks turned into the events that extend the client's message
//! ([`ChatTranslation`]), or a re-sent request's second `message_start` dropped ([`Resent`]).
//!
//! Invariants: the client gets one message — one `message_start`, every block it had kept as
//! it was, an open text block going on at its index, each new part at the next index, one
//! `message_delta` with vLLM's stop reason and one `message_stop`. Output tokens in the final
//! usage are the deltas the client had plus the continuation's `completion_tokens`.
//!
//! O(received bytes) to decode, once per cut; O(event bytes) per translated event.

use std::collections::BTreeMap;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;

use bytes::{Bytes, BytesMut};
use serde_json::Value;

use super::continuation::Rejoin;
use super::sse::{Pending, contains, data_of};

/// The end marker of a Messages stream.
pub(crate) const MESSAGE_STOP: &[u8] = b"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";

/// An event's name (`event: NAME` on its first line), empty when it has none.
pub(crate) fn event_name(event: &[u8]) -> &[u8] {
    let Some(rest) = event.strip_prefix(b"event:") else {
        return b"";
    };
    let end = rest.iter().position(|&b| b == b'\n').unwrap_or(rest.len());
    rest[..end].trim_ascii()
}

/// Whether an event is a content delta that counts as an output token (a signature does not).
pub(crate) fn counts_a_token(event: &[u8]) -> bool {
    event_name(event) == b"content_block_delta" && !contains(event, b"\"signature_delta\"")
}

/// One content block the client received: its type, index, text so far, whether stopped.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Block {
    pub(crate) kind: String,
    pub(crate) index: i64,
    pub(crate) text: String,
    pub(crate) thinking: String,
    pub(crate) stopped: bool,
}

/// What the client of a cut Messages stream has.
#[derive(Debug, Default)]
pub(crate) struct Received {
    /// Its content blocks, by index.
    pub(crate) blocks: Vec<Block>,
    /// The content deltas it received (its output tokens so far).
    pub(crate) deltas: u64,
}

impl Received {
    /// Decodes the events the client was sent (`MessagesStream.client_view` and `_blocks`).
    pub(crate) fn of(sent: &[u8]) -> Self {
        let mut blocks: BTreeMap<i64, Block> = BTreeMap::new();
        let mut deltas = 0;
        let mut pending = Pending::default();
        pending.feed(sent, |event| {
            deltas += u64::from(counts_a_token(event));
            let name = event_name(event);
            let Ok(Value::Object(doc)) = serde_json::from_slice::<Value>(data_of(event)) else {
                return;
            };
            let Some(index) = doc.get("index").and_then(Value::as_i64) else {
                return;
            };
            match name {
                b"content_block_start" => {
                    let kind = doc
                        .get("content_block")
                        .and_then(|b| b.get("type"))
                        .and_then(Value::as_str)
                        .unwrap_or_default();
                    let block = Block {
                        kind: kind.to_owned(),
                        index,
                        text: String::new(),
                        thinking: String::new(),
                        stopped: false,
                    };
                    blocks.insert(index, block);
                }
                b"content_block_delta" => {
                    if let Some(block) = blocks.get_mut(&index) {
                        let delta = doc.get("delta");
                        if let Some(text) = delta.and_then(|d| d.get("text")).and_then(Value::as_str) {
                            block.text.push_str(text);
                        }
                        if let Some(thought) = delta.and_then(|d| d.get("thinking")).and_then(Value::as_str) {
                            block.thinking.push_str(thought);
                        }
                    }
                }
                b"content_block_stop" => {
                    if let Some(block) = blocks.get_mut(&index) {
                        block.stopped = true;
                    }
                }
                _ => {}
            }
        });
        Self {
            blocks: blocks.into_values().collect(),
            deltas,
        }
    }

    /// The assistant's text and reasoning to continue over chat, or None when the stream cannot
    /// be continued faithfully: it was cut inside or after a thinking block with no text after
    /// it, or once a `tool_use` block started (a tool parser starts a call from its beginning).
    pub(crate) fn continuable_text(&self) -> Option<(String, String)> {
        let last = self.blocks.last()?;
        if last.kind != "text" || self.blocks.iter().any(|b| b.kind != "text" && b.kind != "thinking") {
            return None;
        }
        let text = self.blocks.iter().filter(|b| b.kind == "text").map(|b| b.text.as_str());
        let reasoning = self
            .blocks
            .iter()
            .filter(|b| b.kind == "thinking")
            .map(|b| b.thinking.as_str());
        Some((text.collect(), reasoning.collect()))
    }
}

/// A request sent again as it was (nothing but `message_start` had reached the client): the
/// new stream's `message_start` is dropped, the rest relayed as it comes.
#[derive(Default)]
pub(crate) struct Resent {
    dropped: bool,
    pending: Pending,
}

impl Rejoin for Resent {
    fn feed(&mut self, chunk: &[u8]) -> Bytes {
        let mut out = BytesMut::new();
        let mut pending = std::mem::take(&mut self.pending);
        pending.feed(chunk, |event| {
            if !self.dropped && event_name(event) == b"message_start" {
                self.dropped = true;
                return;
            }
            out.extend_from_slice(event);
            out.extend_from_slice(b"\n\n");
        });
        self.pending = pending;
        out.freeze()
    }
}

/// An OpenAI finish reason as Anthropic's `(stop_reason, stop_sequence)`, as vLLM maps it.
fn stop_reason(finish: &str, stop: &Value, tool_used: bool) -> (&'static str, Value) {
    if finish == "length" {
        return ("max_tokens", Value::Null);
    }
    if let Value::String(sequence) = stop {
        return ("stop_sequence", Value::from(sequence.as_str()));
    }
    if finish == "tool_calls" || tool_used {
        return ("tool_use", Value::Null);
    }
    ("end_turn", Value::Null)
}

/// One Anthropic event with its separator.
fn push_event(out: &mut BytesMut, name: &str, data: &Value) {
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b"\ndata: ");
    out.extend_from_slice(data.to_string().as_bytes());
    out.extend_from_slice(b"\n\n");
}

/// A signature for a thinking block this proxy closes (vLLM signs each as it closes it).
fn signature() -> String {
    let state = RandomState::new();
    format!("{:016x}{:016x}", state.hash_one(1_u8), state.hash_one(2_u8))
}

/// A continuation's chat-completion chunks as the Anthropic events that extend the client's
/// message (see the module docs).
pub(crate) struct ChatTranslation {
    /// The block still open (the client's open text block, then each new part), and its type.
    open: Option<(i64, &'static str)>,
    next_index: i64,
    /// The deltas the client had before this continuation.
    output_before: u64,
    finish: Option<String>,
    stop: Value,
    tool_used: bool,
    usage_sent: bool,
    pending: Pending,
}

impl ChatTranslation {
    /// After `received`: its last block goes on when it is an open text block.
    pub(crate) fn after(received: &Received) -> Self {
        let last = received.blocks.last();
        Self {
            open: last
                .filter(|b| !b.stopped && b.kind == "text")
                .map(|b| (b.index, "text")),
            next_index: last.map_or(0, |b| b.index + 1),
            output_before: received.deltas,
            finish: None,
            stop: Value::Null,
            tool_used: false,
            usage_sent: false,
            pending: Pending::default(),
        }
    }

    fn close(&mut self, out: &mut BytesMut) {
        let Some((index, kind)) = self.open.take() else {
            return;
        };
        if kind == "thinking" {
            let delta = serde_json::json!({"type": "signature_delta", "signature": signature()});
            let data = serde_json::json!({"type": "content_block_delta", "index": index, "delta": delta});
            push_event(out, "content_block_delta", &data);
        }
        let data = serde_json::json!({"type": "content_block_stop", "index": index});
        push_event(out, "content_block_stop", &data);
    }

    fn open(&mut self, out: &mut BytesMut, kind: &'static str, block: &Value) {
        self.close(out);
        let index = self.next_index;
        self.open = Some((index, kind));
        self.next_index += 1;
        let data = serde_json::json!({"type": "content_block_start", "index": index, "content_block": block});
        push_event(out, "content_block_start", &data);
    }

    fn delta(&self, out: &mut BytesMut, delta: &Value) {
        let index = self.open.map_or(0, |(i, _)| i);
        let data = serde_json::json!({"type": "content_block_delta", "index": index, "delta": delta});
        push_event(out, "content_block_delta", &data);
    }

    /// What closes the message (the open block, `message_delta`) before `message_stop`.
    fn ending(&mut self, out: &mut BytesMut, output_tokens: Option<u64>) {
        self.close(out);
        if self.usage_sent {
            return;
        }
        self.usage_sent = true;
        let (reason, sequence) = stop_reason(self.finish.as_deref().unwrap_or("stop"), &self.stop, self.tool_used);
        let data = serde_json::json!({
            "type": "message_delta",
            "delta": {"stop_reason": reason, "stop_sequence": sequence},
            "usage": {"output_tokens": self.output_before + output_tokens.unwrap_or(0)},
        });
        push_event(out, "message_delta", &data);
    }

    /// The Anthropic events of one chat event.
    fn translate(&mut self, out: &mut BytesMut, event: &[u8]) {
        let Some(payload) = event.strip_prefix(b"data:") else {
            return;
        };
        let payload = payload.trim_ascii();
        if payload == b"[DONE]" {
            self.ending(out, None);
            out.extend_from_slice(MESSAGE_STOP);
            return;
        }
        let Ok(Value::Object(chunk)) = serde_json::from_slice::<Value>(payload) else {
            return;
        };
        let choice = chunk
            .get("choices")
            .and_then(Value::as_array)
            .and_then(|c| c.first())
            .and_then(Value::as_object);
        let Some(choice) = choice else {
            // The usage chunk: the message's end.
            let completion = chunk
                .get("usage")
                .and_then(|u| u.get("completion_tokens"))
                .and_then(Value::as_u64);
            self.ending(out, completion);
            return;
        };
        if let Some(finish) = choice.get("finish_reason").filter(|f| !f.is_null()) {
            self.finish = Some(finish.as_str().unwrap_or("stop").to_owned());
            self.stop = choice.get("stop_reason").cloned().unwrap_or(Value::Null);
        }
        let Some(delta) = choice.get("delta").and_then(Value::as_object) else {
            return;
        };
        if let Some(reasoning) = delta.get("reasoning").and_then(Value::as_str).filter(|r| !r.is_empty()) {
            if !matches!(self.open, Some((_, "thinking"))) {
                self.open(
                    out,
                    "thinking",
                    &serde_json::json!({"type": "thinking", "thinking": ""}),
                );
            }
            self.delta(
                out,
                &serde_json::json!({"type": "thinking_delta", "thinking": reasoning}),
            );
        }
        if let Some(content) = delta.get("content").and_then(Value::as_str).filter(|c| !c.is_empty()) {
            if !matches!(self.open, Some((_, "text"))) {
                self.open(out, "text", &serde_json::json!({"type": "text", "text": ""}));
            }
            self.delta(out, &serde_json::json!({"type": "text_delta", "text": content}));
        }
        for call in delta.get("tool_calls").and_then(Value::as_array).into_iter().flatten() {
            let function = call.get("function");
            let name = function
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .filter(|n| !n.is_empty());
            let id = call.get("id").and_then(Value::as_str).filter(|i| !i.is_empty());
            if let (Some(id), Some(name)) = (id, name) {
                self.tool_used = true;
                let block = serde_json::json!({"type": "tool_use", "id": id, "name": name, "input": {}});
                self.open(out, "tool_use", &block);
            }
            let arguments = function
                .and_then(|f| f.get("arguments"))
                .and_then(Value::as_str)
                .filter(|a| !a.is_empty());
            if let Some(arguments) = arguments
                && matches!(self.open, Some((_, "tool_use")))
            {
                self.delta(
                    out,
                    &serde_json::json!({"type": "input_json_delta", "partial_json": arguments}),
                );
            }
        }
    }
}

impl Rejoin for ChatTranslation {
    fn feed(&mut self, chunk: &[u8]) -> Bytes {
        let mut out = BytesMut::new();
        let mut pending = std::mem::take(&mut self.pending);
        pending.feed(chunk, |event| self.translate(&mut out, event));
        self.pending = pending;
        out.freeze()
    }

    fn finished(&self) -> bool {
        self.finish.is_some()
    }

    fn closing(&mut self) -> Bytes {
        let mut out = BytesMut::new();
        self.ending(&mut out, None);
        out.freeze()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(name: &str, data: &Value) -> String {
        format!("event: {name}\ndata: {data}\n\n")
    }

    fn start(index: i64, kind: &str) -> String {
        let data = serde_json::json!({"type": "content_block_start", "index": index, "content_block": {"type": kind}});
        event("content_block_start", &data)
    }

    fn text_delta(index: i64, text: &str) -> String {
        let data = serde_json::json!({"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": text}});
        event("content_block_delta", &data)
    }

    fn events(bytes: &[u8]) -> Vec<(String, Value)> {
        let mut out = Vec::new();
        Pending::default().feed(bytes, |e| {
            let name = String::from_utf8_lossy(event_name(e)).into_owned();
            out.push((name, serde_json::from_slice(data_of(e)).unwrap_or(Value::Null)));
        });
        out
    }

    #[test]
    fn the_clients_blocks_and_deltas_are_decoded() {
        let thinking = serde_json::json!({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "hm"}});
        let signature = serde_json::json!({"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": "s"}});
        let sent = start(0, "thinking")
            + &event("content_block_delta", &thinking)
            + &event("content_block_delta", &signature)
            + &event(
                "content_block_stop",
                &serde_json::json!({"type": "content_block_stop", "index": 0}),
            )
            + &start(1, "text")
            + &text_delta(1, "hel");
        let got = Received::of(sent.as_bytes());
        assert_eq!(got.deltas, 2, "the signature is no token");
        assert_eq!(got.continuable_text(), Some(("hel".to_owned(), "hm".to_owned())));
        assert!(got.blocks[0].stopped && !got.blocks[1].stopped);
        let tool = Received::of((start(0, "tool_use") + &start(1, "text")).as_bytes());
        assert_eq!(tool.continuable_text(), None, "a tool call is never continued");
        let thought = Received::of((start(0, "thinking")).as_bytes());
        assert_eq!(thought.continuable_text(), None, "cut inside the thinking");
    }

    #[test]
    fn an_open_text_block_goes_on_and_the_message_ends_once() {
        let received = Received::of((start(0, "text") + &text_delta(0, "hel")).as_bytes());
        let mut translation = ChatTranslation::after(&received);
        let chunks = concat!(
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo\"},\"finish_reason\":\"stop\"}]}\n\n",
            "data: {\"choices\":[],\"usage\":{\"completion_tokens\":1}}\n\n",
            "data: [DONE]\n\n"
        );
        let (a, b) = chunks.as_bytes().split_at(40);
        let mut out = translation.feed(a).to_vec();
        out.extend_from_slice(&translation.feed(b));
        let got = events(&out);
        let names: Vec<&str> = got.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop"
            ]
        );
        assert_eq!(got[0].1["index"], 0);
        assert_eq!(got[0].1["delta"]["text"], "lo");
        assert_eq!(got[2].1["delta"]["stop_reason"], "end_turn");
        assert_eq!(got[2].1["usage"]["output_tokens"], 2, "one before, one after");
        assert!(translation.finished());
        assert!(translation.closing().is_empty(), "the usage was sent once");
    }

    #[test]
    fn new_parts_open_the_next_index_and_a_thinking_block_is_signed_when_closed() {
        let mut stopped = start(0, "text") + &text_delta(0, "a");
        stopped += &event(
            "content_block_stop",
            &serde_json::json!({"type": "content_block_stop", "index": 0}),
        );
        let mut translation = ChatTranslation::after(&Received::of(stopped.as_bytes()));
        let chunks = concat!(
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"reasoning\":\"r\"}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"id\":\"t1\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]},\"finish_reason\":\"tool_calls\"}]}\n\n",
        );
        let mut out = translation.feed(chunks.as_bytes()).to_vec();
        assert!(translation.finished());
        out.extend_from_slice(&translation.closing());
        let got = events(&out);
        let names: Vec<&str> = got.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
                "message_delta"
            ]
        );
        assert_eq!(
            (got[0].1["index"].as_i64(), got[4].1["index"].as_i64()),
            (Some(1), Some(2))
        );
        assert_eq!(got[2].1["delta"]["type"], "signature_delta");
        assert_eq!(got[4].1["content_block"]["name"], "f");
        assert_eq!(got[7].1["delta"]["stop_reason"], "tool_use");
        assert_eq!(
            got[7].1["usage"]["output_tokens"], 1,
            "no usage chunk came: the deltas before only (as the app counts)"
        );
    }

    #[test]
    fn a_resent_streams_second_opening_is_dropped() {
        let opening = event("message_start", &serde_json::json!({"type": "message_start"}));
        let mut resent = Resent::default();
        let stream = opening.clone() + &start(0, "text") + &opening;
        let got = events(&resent.feed(stream.as_bytes()));
        let names: Vec<&str> = got.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            ["content_block_start", "message_start"],
            "only the first is dropped"
        );
    }
}
