//! The scan of an OpenAI completion stream as the gateway relays it: `smetric serve`'s
//! `OpenAIStream` on the relay path (`python/smetric/serve/apis/openai.py`). Events are the
//! bytes between `\n\n` separators; a `data: [DONE]` event ends the stream; an event with a
//! `"finish_reason"` key is a choice chunk (one token, or chat's opening role chunk), and one
//! whose finish reason is not `null` completes the answer; the event with `"completion_tokens"`
//! is the usage chunk, the only one decoded (its output tokens and
//! `prompt_tokens_details.cached_tokens`, the realized hit). When the proxy asked the engine
//! for a usage the client did not ask for, that event is kept from the client.
//!
//! O(chunk bytes) per chunk: byte searches, one JSON decode of the usage event; a chunk is
//! passed on as it came unless usage is hidden (then event by event).

use bytes::{Bytes, BytesMut};
use serde_json::Value;

use super::sse::{Pending, contains};

/// The answer's usage as the engine reported it, read, never trusted: a count is a
/// non-negative integer or nothing.
pub(crate) fn usage_counts(answer: &[u8]) -> (Option<u64>, Option<u64>) {
    let Ok(value) = serde_json::from_slice::<Value>(answer) else {
        return (None, None);
    };
    let usage = value.get("usage");
    let output = usage.and_then(|u| u.get("completion_tokens")).and_then(Value::as_u64);
    let cached = usage
        .and_then(|u| u.get("prompt_tokens_details"))
        .and_then(|d| d.get("cached_tokens"))
        .and_then(Value::as_u64);
    (output, cached)
}

/// One relayed OpenAI stream (see the module docs).
#[derive(Default)]
pub(crate) struct OpenAiStream {
    pending: Pending,
    choice_chunks: u64,
    opening_chunks: u64,
    usage_output: Option<u64>,
    pub(crate) cached_tokens: Option<u64>,
    pub(crate) finished: bool,
    pub(crate) done: bool,
    hide_usage: bool,
}

impl OpenAiStream {
    /// A scanner; `opening_chunks`: choice chunks that open the stream without a token (chat: 1).
    pub(crate) fn new(opening_chunks: u64, hide_usage: bool) -> Self {
        Self {
            opening_chunks,
            hide_usage,
            ..Self::default()
        }
    }

    /// Output tokens so far: the usage figure when sent, else the choice chunks less the opening.
    pub(crate) fn tokens(&self) -> u64 {
        self.usage_output
            .unwrap_or_else(|| self.choice_chunks.saturating_sub(self.opening_chunks))
    }

    /// Scans `chunk`; what the client receives for it.
    pub(crate) fn feed(&mut self, chunk: Bytes) -> Bytes {
        let mut shown = self.hide_usage.then(BytesMut::new);
        let mut pending = std::mem::take(&mut self.pending);
        pending.feed(&chunk, |event| {
            self.scan(event);
            if let Some(out) = shown.as_mut()
                && !is_usage_event(event)
            {
                out.extend_from_slice(event);
                out.extend_from_slice(b"\n\n");
            }
        });
        self.pending = pending;
        match shown {
            Some(out) => out.freeze(),
            None => chunk,
        }
    }

    fn scan(&mut self, event: &[u8]) {
        let Some(data) = event.strip_prefix(b"data:") else {
            return;
        };
        if data.trim_ascii() == b"[DONE]" {
            self.done = true;
            return;
        }
        if contains(event, b"\"finish_reason\"") {
            self.choice_chunks += 1;
            if !contains(event, b"\"finish_reason\":null") && !contains(event, b"\"finish_reason\": null") {
                self.finished = true;
            }
        }
        if contains(event, b"\"completion_tokens\"") {
            let (output, cached) = usage_counts(data);
            if output.is_some() {
                self.usage_output = output;
            }
            self.cached_tokens = cached;
        }
    }
}

/// The usage chunk: `choices: []` with the token counts.
fn is_usage_event(event: &[u8]) -> bool {
    contains(event, b"\"completion_tokens\"")
        && (contains(event, b"\"choices\":[]") || contains(event, b"\"choices\": []"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROLE: &str = r#"data: {"id":"c","choices":[{"index":0,"delta":{"role":"assistant"},"finish_reason":null}]}"#;
    const TOKEN: &str = r#"data: {"id":"c","choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}"#;
    const LAST: &str = r#"data: {"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#;
    const USAGE: &str = r#"data: {"id":"c","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":8}}}"#;

    fn stream() -> String {
        format!("{ROLE}\n\n{TOKEN}\n\n{LAST}\n\n{USAGE}\n\ndata: [DONE]\n\n")
    }

    #[test]
    fn counts_tokens_reads_the_usage_and_sees_the_end_across_chunk_boundaries() {
        let whole = stream();
        for cut in [1, 7, 40, whole.len() / 2, whole.len() - 3] {
            let mut scan = OpenAiStream::new(1, false);
            let (a, b) = whole.as_bytes().split_at(cut);
            let mut out = scan.feed(Bytes::copy_from_slice(a)).to_vec();
            out.extend_from_slice(&scan.feed(Bytes::copy_from_slice(b)));
            assert_eq!(out, whole.as_bytes(), "passed on unchanged");
            assert!(scan.finished && scan.done);
            assert_eq!((scan.tokens(), scan.cached_tokens), (2, Some(8)));
        }
    }

    #[test]
    fn a_hidden_usage_event_is_kept_from_the_client_and_chunks_are_counted_without_it() {
        let mut scan = OpenAiStream::new(1, true);
        let out = scan.feed(Bytes::from(stream()));
        assert_eq!(
            out,
            format!("{ROLE}\n\n{TOKEN}\n\n{LAST}\n\ndata: [DONE]\n\n").as_bytes()
        );
        assert_eq!(scan.cached_tokens, Some(8));
        let mut bare = OpenAiStream::new(1, false);
        bare.feed(Bytes::from(format!("{ROLE}\n\n{TOKEN}\n\n{TOKEN}\n\n")));
        assert_eq!(bare.tokens(), 2, "the opening role chunk carries no token");
        assert!(!bare.finished);
    }

    #[test]
    fn usage_counts_are_read_not_trusted() {
        assert_eq!(
            usage_counts(br#"{"usage":{"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":-1}}}"#),
            (Some(3), None)
        );
        assert_eq!(usage_counts(b"not json"), (None, None));
    }
}
