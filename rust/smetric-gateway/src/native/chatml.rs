//! The plain ChatML rendering of a chat body and its byte-chunk ids, straight from the body's
//! bytes: the approximate routing tokens of `smetric serve --tokens approximate` (no tokenizer,
//! no chat template), for the probe's chat rows.
//!
//! Per message `<|im_start|>{role}\n{content}<|im_end|>\n`, then `<|im_start|>assistant\n`
//! when `add_generation_prompt` (with `continue_final_message`, the last message's
//! `<|im_end|>\n` is left off instead). A content is its string, or the `text` of its parts
//! whose `type` is absent or `"text"`, joined with nothing between them. The text is cut into
//! big-endian u32s of 4 bytes, the last zero-padded: `smetric.chat.byte_chunk_ids(
//! smetric.chat.render_chat(...))`. A body Python would render otherwise or reject gives `None`
//! (the gateway then hands the request to the app, whose error or rendering it is). The roles
//! also give the router its turn (`first_turn_from_roles`). O(body length): one pass over
//! `messages` (strings borrowed unless they escape a character), one copy, one pass to cut.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;

use super::json::{object, string};

use smetric_core::first_turn_from_roles;
use smetric_vllm::{Endpoint, OpenAiBody, parse_openai_body};

pub use crate::shared::BYTE_CHUNK_BYTES;
pub use crate::tokens::byte_chunk_ids;

#[derive(Deserialize)]
struct Message<'a> {
    #[serde(borrow)]
    role: Cow<'a, str>,
    #[serde(borrow, default)]
    content: Option<&'a RawValue>,
}

/// A content part. A field given as `null` is `Some` (its raw `null`), unlike an absent one:
/// Python tells them apart (`part.get("type", "text")`).
#[derive(Deserialize)]
struct Part<'a> {
    #[serde(borrow, default, rename = "type", deserialize_with = "present")]
    kind: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    text: Option<&'a RawValue>,
}

/// A field that is there, `null` included (a plain `Option` reads `null` as absent).
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(d).map(Some)
}

/// Appends a message's content to `out`; `None` where Python's `content_text` raises.
pub(crate) fn push_content(out: &mut Vec<u8>, content: Option<&RawValue>) -> Option<()> {
    let Some(raw) = content else { return Some(()) };
    match raw.get().as_bytes().first() {
        Some(b'n') => Some(()), // `null` (`Option<&RawValue>` keeps a null it was given)
        Some(b'"') => {
            out.extend_from_slice(string(raw)?.as_bytes());
            Some(())
        }
        Some(b'[') => {
            for part in serde_json::from_str::<Vec<&RawValue>>(raw.get()).ok()? {
                let part: Part<'_> = object(part)?;
                // `part.get("text", "")` must be a string, whether or not the part is text.
                let text = match part.text {
                    None => Cow::Borrowed(""),
                    Some(t) => string(t)?,
                };
                let is_text = part.kind.is_none_or(|k| string(k).is_some_and(|k| k == "text"));
                if is_text {
                    out.extend_from_slice(text.as_bytes());
                }
            }
            Some(())
        }
        _ => None,
    }
}

/// A chat body rendered for routing: its ChatML text and whether it is a session's first turn.
pub struct Rendered {
    pub text: Vec<u8>,
    pub first_turn: bool,
}

/// Another API's body rendered as the chat request it converts to, with what routing reads.
pub(crate) struct RenderedBody {
    pub(crate) rendered: Rendered,
    pub(crate) model: Option<String>,
    pub(crate) cache_salt: Option<String>,
}

/// The plain ChatML text of a parsed chat body's `messages` (see the module docs); `None` for
/// a body Python would render differently or reject.
#[must_use]
pub fn render(body: &OpenAiBody<'_>) -> Option<Rendered> {
    if body.add_generation_prompt && body.continue_final_message {
        return None;
    }
    let messages: Vec<&RawValue> = serde_json::from_str(body.messages?).ok()?;
    if messages.is_empty() {
        return None;
    }
    let mut out = Vec::with_capacity(body.messages.map_or(0, str::len) + 64);
    let mut roles = Vec::with_capacity(messages.len());
    let mut last_end = None;
    for m in messages {
        let m: Message<'_> = object(m)?;
        out.extend_from_slice(b"<|im_start|>");
        out.extend_from_slice(m.role.as_bytes());
        out.push(b'\n');
        push_content(&mut out, m.content)?;
        last_end = Some(out.len());
        out.extend_from_slice(b"<|im_end|>\n");
        roles.push(m.role);
    }
    if body.continue_final_message
        && let Some(end) = last_end
    {
        out.truncate(end);
    }
    if body.add_generation_prompt {
        out.extend_from_slice(b"<|im_start|>assistant\n");
    }
    let first_turn = first_turn_from_roles(roles.iter().map(AsRef::as_ref));
    Some(Rendered { text: out, first_turn })
}

/// Why the app's plain ChatML rendering (`smetric.chat.render_chat`, a 400 naming `messages`)
/// refuses a chat body whose shape its parser accepted, or None when it does not refuse it: both
/// `add_generation_prompt` and `continue_final_message`, else a content part that is not an
/// object or whose `text` is there and not a string. O(messages).
pub(crate) fn render_refusal(body: &OpenAiBody<'_>) -> Option<&'static str> {
    if body.add_generation_prompt && body.continue_final_message {
        return Some("continue_final_message and add_generation_prompt cannot both be true");
    }
    let messages: Vec<serde_json::Value> = serde_json::from_str(body.messages?).ok()?;
    let bad_part = |part: &serde_json::Value| {
        part.as_object()
            .is_none_or(|p| p.get("text").is_some_and(|text| !text.is_string()))
    };
    messages
        .iter()
        .filter_map(|m| m.get("content")?.as_array())
        .any(|parts| parts.iter().any(bad_part))
        .then_some("content parts must be objects with a string 'text'")
}

/// [`render`] of a chat body's bytes: its ChatML text.
#[must_use]
pub fn render_chatml(raw: &[u8]) -> Option<Vec<u8>> {
    render(&parse_openai_body(raw, Endpoint::Chat).ok()?).map(|r| r.text)
}

/// The approximate routing ids of a chat body: [`byte_chunk_ids`] of [`render_chatml`].
#[must_use]
pub fn chatml_ids(raw: &[u8]) -> Option<Vec<u32>> {
    render_chatml(raw).map(|text| byte_chunk_ids(&text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_render_refusals_are_the_apps() {
        let refusal = |raw: &[u8]| render_refusal(&parse_openai_body(raw, Endpoint::Chat).expect("parses"));
        let parts = Some("content parts must be objects with a string 'text'");
        assert_eq!(
            refusal(br#"{"messages": [{"role": "u", "content": [{"text": 3}]}]}"#),
            parts
        );
        assert_eq!(refusal(br#"{"messages": [{"role": "u", "content": ["x"]}]}"#), parts);
        assert_eq!(
            refusal(br#"{"messages": [{"role": "u", "content": [{"type": "image"}]}]}"#),
            None
        );
        assert_eq!(refusal(br#"{"messages": [{"role": "u", "content": "x"}]}"#), None);
        assert_eq!(
            refusal(br#"{"messages": [{"role": "u", "content": [3]}], "continue_final_message": true}"#),
            Some("continue_final_message and add_generation_prompt cannot both be true"),
            "checked first"
        );
    }

    fn text(raw: &str) -> Option<String> {
        render_chatml(raw.as_bytes()).map(|b| String::from_utf8(b).unwrap())
    }

    #[test]
    fn renders_roles_contents_and_the_generation_prompt() {
        let body = r#"{"model":"m","messages":[{"role":"system","content":"be brief"},
            {"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{}},{"text":"b"}]},
            {"role":"assistant","content":null,"tool_calls":[]},{"role":"tool"}]}"#;
        assert_eq!(
            text(body).unwrap(),
            "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nab<|im_end|>\n\
             <|im_start|>assistant\n<|im_end|>\n<|im_start|>tool\n<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn continue_final_message_leaves_the_last_message_open() {
        let body = r#"{"messages":[{"role":"user","content":"q"},{"role":"assistant","content":"par"}],
            "continue_final_message":true,"add_generation_prompt":false}"#;
        assert_eq!(
            text(body).unwrap(),
            "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\npar"
        );
        let both = r#"{"messages":[{"role":"user","content":"q"}],"continue_final_message":true}"#;
        assert_eq!(text(both), None, "both flags: Python raises");
    }

    #[test]
    fn escapes_are_decoded() {
        let body = r#"{"messages":[{"role":"user","content":"caf\u00e9 \ud83d\ude00 \"q\"\n"}]}"#;
        assert_eq!(
            text(body).unwrap(),
            "<|im_start|>user\ncafé 😀 \"q\"\n<|im_end|>\n<|im_start|>assistant\n"
        );
    }
}
