//! A cut Responses stream continued natively (`python/smetric/serve/apis/responses.py`:
//! `ResponsesApi.continuation`, `received`, `_Item`, `Splice`).
//!
//! **The request**: the client's input, then every output item it received as input (done
//! items `completed`, a message or reasoning it was cut inside last and `in_progress`, which
//! vLLM continues), `stream: true`, `store: false`, `max_output_tokens` less the deltas sent.
//! Never continued (the stream ends with `response.failed`): before `response.created` reached
//! the client, cut inside a function call's arguments, structured output (`text.format` a JSON
//! schema or object) once a message started, a follow-up of a stored response (its history
//! lived on the failed instance), or a second cut.
//!
//! **The splice** ([`Splice`]): the continuation's `response.created` / `.in_progress` dropped,
//! and the continued item's `output_item.added` / `content_part.added`; output indices shifted
//! after the client's items; the continued item under its first id, its text so far put in
//! front of every `done` form; sequence numbers following the client's; the terminal event's
//! response the client's (its id, created time) with every output item and the output tokens of
//! both attempts.
//!
//! O(received bytes) to decode and build, once per cut; O(event bytes) per spliced event (each
//! is decoded: a continuation only).

use bytes::{Bytes, BytesMut};
use serde_json::{Map, Value};

use super::continuation::{Continued, Rejoin};
use super::sse::{Pending, data_of};

/// The event types that end a Responses stream.
pub(crate) const TERMINAL_EVENTS: [&[u8]; 3] = [b"response.completed", b"response.failed", b"response.incomplete"];

/// The delta events and what they stream.
const DELTAS: [&str; 3] = [
    "response.output_text.delta",
    "response.reasoning_text.delta",
    "response.function_call_arguments.delta",
];
/// The `done` events that carry a text whole.
const TEXT_DONE: [&str; 2] = ["response.output_text.done", "response.reasoning_text.done"];

/// Whether an event counts as an output token (its head names a `delta`, as the scanner counts).
pub(crate) fn is_delta(event: &[u8]) -> bool {
    let head = &event[..event.len().min(64)];
    head.windows(5).any(|w| w == b"delta")
}

/// One output item as the client received it.
#[derive(Clone, Debug)]
struct Output {
    /// Its `output_item.added` item, then its `output_item.done` item.
    item: Map<String, Value>,
    /// Its streamed text (a message's, a reasoning's) or arguments (a function call's).
    text: String,
    done: bool,
}

impl Output {
    fn kind(&self) -> &str {
        self.item.get("type").and_then(Value::as_str).unwrap_or_default()
    }

    /// The item as the next request's input (vLLM continues an `in_progress` last one).
    fn as_input(&self, status: &str) -> Value {
        match self.kind() {
            "function_call" => {
                let mut out = Map::new();
                for key in ["type", "call_id", "name", "arguments"] {
                    out.insert(key.to_owned(), self.item.get(key).cloned().unwrap_or(Value::Null));
                }
                Value::Object(out)
            }
            "reasoning" => serde_json::json!({
                "type": "reasoning",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": self.text}],
            }),
            _ => serde_json::json!({
                "type": "message",
                "role": "assistant",
                "status": status,
                "content": [{"type": "output_text", "text": self.text, "annotations": []}],
            }),
        }
    }
}

/// What the client of a cut stream has: the `response.created` response, the output items by
/// index, the last sequence number and the deltas.
#[derive(Debug, Default)]
struct Received {
    response: Option<Map<String, Value>>,
    items: Vec<Output>,
    sequence: i64,
    deltas: u64,
}

impl Received {
    fn of(sent: &[u8]) -> Self {
        let mut response = None;
        let mut items: std::collections::BTreeMap<i64, Output> = std::collections::BTreeMap::new();
        let mut sequence = -1;
        let mut deltas = 0;
        let mut pending = Pending::default();
        pending.feed(sent, |event| {
            deltas += u64::from(is_delta(event));
            let Ok(Value::Object(data)) = serde_json::from_slice::<Value>(data_of(event)) else {
                return;
            };
            if let Some(n) = data.get("sequence_number").and_then(Value::as_i64) {
                sequence = sequence.max(n);
            }
            let kind = data.get("type").and_then(Value::as_str).unwrap_or_default();
            let index = data.get("output_index").and_then(Value::as_i64);
            let item = || match data.get("item") {
                Some(Value::Object(item)) => item.clone(),
                _ => Map::new(),
            };
            match (kind, index) {
                ("response.created", _) => {
                    if let Some(Value::Object(r)) = data.get("response") {
                        response = Some(r.clone());
                    }
                }
                ("response.output_item.added", Some(i)) => {
                    let added = Output {
                        item: item(),
                        text: String::new(),
                        done: false,
                    };
                    items.insert(i, added);
                }
                (kind, Some(i)) if DELTAS.contains(&kind) => {
                    if let Some(it) = items.get_mut(&i) {
                        match data.get("delta") {
                            Some(Value::String(d)) => it.text.push_str(d),
                            Some(Value::Null) | None => {}
                            Some(other) => it.text.push_str(&other.to_string()),
                        }
                    }
                }
                ("response.output_item.done", Some(i)) => {
                    if let Some(it) = items.get_mut(&i) {
                        it.item = item();
                        it.done = true;
                    }
                }
                _ => {}
            }
        });
        Self {
            response,
            items: items.into_values().collect(),
            sequence,
            deltas,
        }
    }

    /// The item the client was cut inside (the last, not done), if any.
    fn open_item(&self) -> Option<&Output> {
        self.items.last().filter(|i| !i.done)
    }
}

/// The continuation of a Responses stream whose request was `body` and whose client received
/// `sent` (see the module docs); `resumed`: the stream was continued before.
pub(crate) fn continuation(body: &[u8], sent: &[u8], resumed: bool) -> Continued {
    let Ok(Value::Object(mut body)) = serde_json::from_slice::<Value>(body) else {
        return Continued::Not;
    };
    if resumed || body.get("previous_response_id").is_some_and(|p| !p.is_null()) {
        return Continued::Not;
    }
    let got = Received::of(sent);
    if got.response.is_none() {
        return Continued::Not;
    }
    let format = body
        .get("text")
        .and_then(|t| t.get("format"))
        .and_then(|f| f.get("type"));
    let structured = format
        .and_then(Value::as_str)
        .is_some_and(|f| f == "json_schema" || f == "json_object");
    if structured && got.items.iter().any(|i| i.kind() == "message") {
        return Continued::Not;
    }
    let open = got.open_item();
    if open.is_some_and(|i| i.kind() != "message" && i.kind() != "reasoning") {
        return Continued::Not;
    }
    let mut input = match body.remove("input") {
        Some(Value::Array(items)) => items,
        Some(text) => vec![serde_json::json!({"role": "user", "content": text})],
        None => vec![serde_json::json!({"role": "user", "content": null})],
    };
    input.extend(got.items.iter().filter(|i| i.done).map(|i| i.as_input("completed")));
    input.extend(open.map(|i| i.as_input("in_progress")));
    body.insert("input".to_owned(), Value::Array(input));
    body.insert("stream".to_owned(), Value::Bool(true));
    body.insert("store".to_owned(), Value::Bool(false));
    if let Some(budget) = body.get("max_output_tokens").and_then(Value::as_i64) {
        let left = (budget - i64::try_from(got.deltas).unwrap_or(i64::MAX)).max(1);
        body.insert("max_output_tokens".to_owned(), Value::from(left));
    }
    match serde_json::to_vec(&Value::Object(body)) {
        Ok(out) => Continued::Body(Bytes::from(out), Box::new(Splice::of(got))),
        Err(_) => Continued::Not,
    }
}

/// A continuation's events as the rest of the client's stream (see the module docs).
pub(crate) struct Splice {
    /// The client's `response.created` response.
    response: Map<String, Value>,
    /// The client's items; the last is the continued one when `open`.
    before: Vec<Output>,
    open: bool,
    sequence: i64,
    /// The output tokens the client had (its deltas).
    output_tokens: u64,
    pending: Pending,
}

impl Splice {
    /// After what the client received.
    fn of(got: Received) -> Self {
        let open = got.open_item().is_some();
        Self {
            response: got.response.unwrap_or_default(),
            before: got.items,
            open,
            sequence: got.sequence,
            output_tokens: got.deltas,
            pending: Pending::default(),
        }
    }

    /// The client's items before the continuation's first (the continued one not counted).
    fn base(&self) -> usize {
        self.before.len() - usize::from(self.open)
    }

    fn continued(&self) -> Option<&Output> {
        if self.open { self.before.last() } else { None }
    }

    /// One continuation event as the client gets it, or None when it is dropped.
    fn event(&mut self, event: &[u8]) -> Option<Vec<u8>> {
        let Ok(Value::Object(mut data)) = serde_json::from_slice::<Value>(data_of(event)) else {
            return None;
        };
        let kind = data.get("type").and_then(Value::as_str).map(str::to_owned);
        let kind = kind.as_deref();
        if matches!(kind, Some("response.created" | "response.in_progress")) {
            return None;
        }
        let at_continued = data.get("output_index").and_then(Value::as_i64) == Some(0);
        if let Some(first) = self.continued().filter(|_| at_continued) {
            if matches!(kind, Some("response.output_item.added" | "response.content_part.added")) {
                return None;
            }
            let first_id = first.item.get("id").cloned().unwrap_or(Value::Null);
            data.insert("item_id".to_owned(), first_id);
            match kind {
                Some(k) if TEXT_DONE.contains(&k) => {
                    let text = format!("{}{}", first.text, text_of(data.get("text")));
                    data.insert("text".to_owned(), Value::from(text));
                }
                Some("response.content_part.done") => {
                    if let Some(Value::Object(part)) = data.get_mut("part") {
                        let text = format!("{}{}", first.text, text_of(part.get("text")));
                        part.insert("text".to_owned(), Value::from(text));
                    }
                }
                Some("response.output_item.done") => {
                    let item = continued_item(first, data.get("item"));
                    data.insert("item".to_owned(), item);
                    data.remove("item_id");
                }
                _ => {}
            }
        }
        if let Some(index) = data.get("output_index") {
            let shifted = self.base() as i64 + index.as_i64().unwrap_or(0);
            data.insert("output_index".to_owned(), Value::from(shifted));
        }
        let terminal = kind.is_some_and(|k| TERMINAL_EVENTS.contains(&k.as_bytes()));
        if terminal && let Some(Value::Object(answer)) = data.remove("response") {
            data.insert("response".to_owned(), Value::Object(self.last_response(answer)));
        }
        self.sequence += 1;
        data.insert("sequence_number".to_owned(), Value::from(self.sequence));
        let mut out = format!("event: {}\ndata: ", kind.unwrap_or("None")).into_bytes();
        out.extend_from_slice(Value::Object(data).to_string().as_bytes());
        Some(out)
    }

    /// The terminal event's response: the client's, with every output item and both attempts'
    /// output tokens.
    fn last_response(&self, mut answer: Map<String, Value>) -> Map<String, Value> {
        let mut output: Vec<Value> = self.before[..self.base()]
            .iter()
            .map(|i| Value::Object(i.item.clone()))
            .collect();
        let mut rest = match answer.remove("output") {
            Some(Value::Array(rest)) => rest,
            _ => Vec::new(),
        };
        if let Some(first) = self.continued()
            && let Some(head) = rest.first_mut()
        {
            *head = continued_item(first, Some(head));
        }
        output.extend(rest);
        if let Some(Value::Object(usage)) = answer.get_mut("usage") {
            for key in ["output_tokens", "total_tokens"] {
                let Some(n) = usage.get(key).and_then(Value::as_u64) else {
                    if key == "output_tokens" {
                        break; // no count to add to: the total is left as it is
                    }
                    continue;
                };
                usage.insert(key.to_owned(), Value::from(n + self.output_tokens));
            }
        }
        let mut out = self.response.clone();
        for (key, value) in answer {
            if !matches!(key.as_str(), "id" | "created_at" | "output" | "previous_response_id") {
                out.insert(key, value);
            }
        }
        out.insert("output".to_owned(), Value::Array(output));
        out
    }
}

/// A JSON text's string (Python's `str(x or "")`).
fn text_of(value: Option<&Value>) -> String {
    match value {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    }
}

/// The continued item's `done` form: the first attempt's id, and its text so far in front.
fn continued_item(first: &Output, item: Option<&Value>) -> Value {
    let mut out = match item {
        Some(Value::Object(item)) => item.clone(),
        _ => Map::new(),
    };
    out.insert("id".to_owned(), first.item.get("id").cloned().unwrap_or(Value::Null));
    if let Some(Value::Array(content)) = out.get_mut("content")
        && let Some(Value::Object(part)) = content.first_mut()
    {
        let text = format!("{}{}", first.text, text_of(part.get("text")));
        part.insert("text".to_owned(), Value::from(text));
    }
    Value::Object(out)
}

impl Rejoin for Splice {
    fn feed(&mut self, chunk: &[u8]) -> Bytes {
        let mut out = BytesMut::new();
        let mut pending = std::mem::take(&mut self.pending);
        pending.feed(chunk, |event| {
            if let Some(spliced) = self.event(event) {
                out.extend_from_slice(&spliced);
                out.extend_from_slice(b"\n\n");
            }
        });
        self.pending = pending;
        out.freeze()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(data: &Value) -> String {
        format!("event: {}\ndata: {data}\n\n", data["type"].as_str().unwrap_or_default())
    }

    fn events(bytes: &[u8]) -> Vec<Value> {
        let mut out = Vec::new();
        Pending::default().feed(bytes, |e| {
            out.push(serde_json::from_slice(data_of(e)).unwrap_or(Value::Null));
        });
        out
    }

    /// A client that has `response.created` and a message cut after "hel".
    fn cut_inside_a_message() -> String {
        let created = serde_json::json!({"type": "response.created", "sequence_number": 0,
            "response": {"id": "resp_a", "created_at": 1, "status": "in_progress", "output": []}});
        let added = serde_json::json!({"type": "response.output_item.added", "sequence_number": 1, "output_index": 0,
            "item": {"id": "msg_a", "type": "message", "role": "assistant", "content": []}});
        let delta = serde_json::json!({"type": "response.output_text.delta", "sequence_number": 2, "output_index": 0,
            "item_id": "msg_a", "content_index": 0, "delta": "hel"});
        event(&created) + &event(&added) + &event(&delta)
    }

    #[test]
    fn the_request_puts_back_every_item_and_continues_the_open_one() {
        let sent = cut_inside_a_message();
        let body = br#"{"model":"m","input":"hi","max_output_tokens":5,"stream":true}"#;
        let Continued::Body(out, _) = continuation(body, sent.as_bytes(), false) else {
            panic!("continued");
        };
        let out: Value = serde_json::from_slice(&out).unwrap_or_default();
        assert_eq!(out["input"][0], serde_json::json!({"role": "user", "content": "hi"}));
        assert_eq!(out["input"][1]["status"], "in_progress");
        assert_eq!(out["input"][1]["content"][0]["text"], "hel");
        assert_eq!(
            (out["store"].as_bool(), out["max_output_tokens"].as_i64()),
            (Some(false), Some(4))
        );
        let not = |body: &[u8], sent: &str, resumed: bool| {
            matches!(continuation(body, sent.as_bytes(), resumed), Continued::Not)
        };
        assert!(not(body, &sent, true), "a second cut");
        assert!(
            not(br#"{"input":"hi","previous_response_id":"resp_x"}"#, &sent, false),
            "a stored follow-up"
        );
        assert!(not(body, "", false), "nothing received, not even response.created");
        assert!(not(
            br#"{"input":"hi","text":{"format":{"type":"json_object"}}}"#,
            &sent,
            false
        ));
        let call = sent.replace("\"message\"", "\"function_call\"");
        assert!(not(body, &call, false), "inside a function call's arguments");
    }

    #[test]
    fn the_splice_continues_the_item_under_its_id_and_ends_with_the_clients_response() {
        let mut splice = Splice::of(Received::of(cut_inside_a_message().as_bytes()));
        let continuation = [
            serde_json::json!({"type": "response.created", "sequence_number": 0, "response": {"id": "resp_b"}}),
            serde_json::json!({"type": "response.output_item.added", "sequence_number": 1, "output_index": 0, "item": {"id": "msg_b"}}),
            serde_json::json!({"type": "response.output_text.delta", "sequence_number": 2, "output_index": 0, "item_id": "msg_b", "delta": "lo"}),
            serde_json::json!({"type": "response.output_text.done", "sequence_number": 3, "output_index": 0, "item_id": "msg_b", "text": "lo"}),
            serde_json::json!({"type": "response.output_item.done", "sequence_number": 4, "output_index": 0,
                "item": {"id": "msg_b", "type": "message", "content": [{"type": "output_text", "text": "lo"}]}}),
            serde_json::json!({"type": "response.completed", "sequence_number": 5, "response": {"id": "resp_b", "created_at": 9,
                "status": "completed", "output": [{"id": "msg_b", "type": "message", "content": [{"type": "output_text", "text": "lo"}]}],
                "usage": {"output_tokens": 1, "total_tokens": 10}}}),
        ];
        let stream: String = continuation.iter().map(event).collect();
        let (a, b) = stream.as_bytes().split_at(100);
        let mut out = splice.feed(a).to_vec();
        out.extend_from_slice(&splice.feed(b));
        let got = events(&out);
        let kinds: Vec<&str> = got.iter().map(|e| e["type"].as_str().unwrap_or_default()).collect();
        assert_eq!(
            kinds,
            [
                "response.output_text.delta",
                "response.output_text.done",
                "response.output_item.done",
                "response.completed"
            ]
        );
        let sequences: Vec<i64> = got.iter().filter_map(|e| e["sequence_number"].as_i64()).collect();
        assert_eq!(sequences, [3, 4, 5, 6], "following the client's");
        assert_eq!(
            (got[0]["item_id"].as_str(), got[0]["output_index"].as_i64()),
            (Some("msg_a"), Some(0))
        );
        assert_eq!(got[1]["text"], "hello");
        assert_eq!(got[2]["item"]["id"], "msg_a");
        assert!(got[2].get("item_id").is_none());
        assert_eq!(got[2]["item"]["content"][0]["text"], "hello");
        let last = &got[3]["response"];
        assert_eq!(
            (last["id"].as_str(), last["created_at"].as_i64()),
            (Some("resp_a"), Some(1))
        );
        assert_eq!(last["status"], "completed");
        assert_eq!(last["output"][0]["content"][0]["text"], "hello");
        assert_eq!(
            (
                last["usage"]["output_tokens"].as_i64(),
                last["usage"]["total_tokens"].as_i64()
            ),
            (Some(2), Some(11))
        );
    }
}
