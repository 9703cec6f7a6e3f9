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
//! `messages` that decodes each role and content as it meets them (strings borrowed unless they
//! escape a character; it replaced a split into raw messages, a parse of each and a decode of
//! each content: three passes) — on the gateway's path ([`parse_and_render`]) inside the body's
//! own parse, so the messages are not first captured as text by another scan — one copy, one
//! pass to cut.

use std::borrow::Cow;
use std::marker::PhantomData;

use serde::Deserialize;
use serde::de::{Error as _, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

use super::json::string;

use smetric_core::first_turn_from_roles;
use smetric_vllm::{OpenAiBody, parse_chat_body_with};

pub use crate::shared::BYTE_CHUNK_BYTES;
pub use crate::tokens::byte_chunk_ids;

/// One message as the render reads it, parsed in the same pass as the list that holds it: an
/// object (never an array read positionally, as serde's derive would) with a string `role` and a
/// [`Content`]; other keys skipped. A key given twice fails it, as the derive it replaces did.
struct Message<'a> {
    role: Cow<'a, str>,
    content: Content<'a>,
}

/// A message's content as Python's `content_text` reads it: absent or `null` (no text), a string,
/// or a list of parts whose texts are kept when the part's `type` is absent or `"text"` (every
/// part must be an object whose `text`, when there, is a string). Anything else fails the parse.
#[derive(Default)]
enum Content<'a> {
    #[default]
    Nothing,
    Text(Cow<'a, str>),
    Parts(Vec<Cow<'a, str>>),
}

/// One content part (see [`Content`]): its text when it counts as text, else None.
struct Part<'a>(Option<Cow<'a, str>>);

/// A map's keys given twice fail the parse (serde's derive refused them too).
fn once<T, E: serde::de::Error>(slot: &mut Option<T>, value: T, key: &'static str) -> Result<(), E> {
    if slot.replace(value).is_some() {
        return Err(E::duplicate_field(key));
    }
    Ok(())
}

impl<'de> Deserialize<'de> for Message<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> Visitor<'de> for Visit {
            type Value = Message<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a message object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Message<'de>, A::Error> {
                let (mut role, mut content) = (None, None);
                while let Some(key) = map.next_key::<Cow<'de, str>>()? {
                    match key.as_ref() {
                        "role" => once(&mut role, map.next_value::<Cow<'de, str>>()?, "role")?,
                        "content" => once(&mut content, map.next_value::<Content<'de>>()?, "content")?,
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(Message {
                    role: role.ok_or_else(|| A::Error::missing_field("role"))?,
                    content: content.unwrap_or_default(),
                })
            }
        }
        d.deserialize_map(Visit)
    }
}

impl<'de> Deserialize<'de> for Content<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> Visitor<'de> for Visit {
            type Value = Content<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string, null or a list of content parts")
            }
            fn visit_unit<E>(self) -> Result<Content<'de>, E> {
                Ok(Content::Nothing)
            }
            fn visit_borrowed_str<E>(self, text: &'de str) -> Result<Content<'de>, E> {
                Ok(Content::Text(Cow::Borrowed(text)))
            }
            fn visit_str<E>(self, text: &str) -> Result<Content<'de>, E> {
                Ok(Content::Text(Cow::Owned(text.to_owned())))
            }
            fn visit_string<E>(self, text: String) -> Result<Content<'de>, E> {
                Ok(Content::Text(Cow::Owned(text)))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Content<'de>, A::Error> {
                let mut texts = Vec::new();
                while let Some(Part(text)) = seq.next_element::<Part<'de>>()? {
                    texts.extend(text);
                }
                Ok(Content::Parts(texts))
            }
        }
        d.deserialize_any(Visit)
    }
}

impl<'de> Deserialize<'de> for Part<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> Visitor<'de> for Visit {
            type Value = Part<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a content part object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Part<'de>, A::Error> {
                // `part.get("type", "text") == "text"`, and `part.get("text", "")` a string
                // whatever the type (a `null` for either is there, not absent).
                let (mut kind, mut text) = (None::<&'de RawValue>, None::<Cow<'de, str>>);
                while let Some(key) = map.next_key::<Cow<'de, str>>()? {
                    match key.as_ref() {
                        "type" => once(&mut kind, map.next_value()?, "type")?,
                        "text" => once(&mut text, map.next_value()?, "text")?,
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                let is_text = kind.is_none_or(|k| string(k).is_some_and(|k| k == "text"));
                Ok(Part(is_text.then(|| text.unwrap_or(Cow::Borrowed("")))))
            }
        }
        d.deserialize_map(Visit)
    }
}

impl Content<'_> {
    fn push_to(&self, out: &mut Vec<u8>) {
        match self {
            Content::Nothing => {}
            Content::Text(text) => out.extend_from_slice(text.as_bytes()),
            Content::Parts(texts) => texts.iter().for_each(|t| out.extend_from_slice(t.as_bytes())),
        }
    }
}

/// Appends a message's content to `out`; `None` where Python's `content_text` raises.
pub(crate) fn push_content(out: &mut Vec<u8>, content: Option<&RawValue>) -> Option<()> {
    let Some(raw) = content else { return Some(()) };
    serde_json::from_str::<Content<'_>>(raw.get()).ok()?.push_to(out);
    Some(())
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
    let text = body.messages?;
    // One pass over `messages`: each message's role and content decoded as they are met.
    let messages: Vec<Message<'_>> = serde_json::from_str(text).ok()?;
    render_messages(body, messages, text.len())
}

/// A chat body's bytes parsed and rendered with its messages decoded in the body's own pass
/// (`smetric_vllm::parse_chat_body_with`): the messages are scanned once, where a parse and then
/// [`render`] scan them twice. `None` exactly where that parse and [`render`] give `None`.
#[must_use]
pub fn parse_and_render(raw: &[u8]) -> Option<(OpenAiBody<'_>, Rendered)> {
    let (body, messages) = parse_chat_body_with(raw, PhantomData::<Vec<Message<'_>>>)?;
    let rendered = render_messages(&body, messages, raw.len())?;
    Some((body, rendered))
}

/// [`render`] of messages already decoded; `capacity` is the text's expected length.
fn render_messages(body: &OpenAiBody<'_>, messages: Vec<Message<'_>>, capacity: usize) -> Option<Rendered> {
    if (body.add_generation_prompt && body.continue_final_message) || messages.is_empty() {
        return None;
    }
    let mut out = Vec::with_capacity(capacity + 64);
    let mut roles = Vec::with_capacity(messages.len());
    let mut last_end = None;
    for m in messages {
        out.extend_from_slice(b"<|im_start|>");
        out.extend_from_slice(m.role.as_bytes());
        out.push(b'\n');
        m.content.push_to(&mut out);
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

/// [`render`] of a chat body's bytes: its ChatML text ([`parse_and_render`], the one pass).
#[must_use]
pub fn render_chatml(raw: &[u8]) -> Option<Vec<u8>> {
    parse_and_render(raw).map(|(_, r)| r.text)
}

/// The approximate routing ids of a chat body: [`byte_chunk_ids`] of [`render_chatml`].
#[must_use]
pub fn chatml_ids(raw: &[u8]) -> Option<Vec<u32>> {
    render_chatml(raw).map(|text| byte_chunk_ids(&text))
}

#[cfg(test)]
mod tests {
    use smetric_vllm::{Endpoint, parse_openai_body};

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

    /// The one pass ([`parse_and_render`]) gives what a parse and then [`render`] give, body by
    /// body: the text, the turn, the body's other fields, and `None` at the same bodies.
    #[test]
    fn the_one_pass_renders_what_a_parse_and_a_render_do() {
        let bodies = [
            r#"{"model":"m","stream":true,"max_tokens":5,"messages":[{"role":"system","content":"a\nb\u00e9"},{"role":"user","content":[{"text":"c"},{"type":"image"}]}]}"#,
            r#"{"messages":[{"role":"user","content":"q"}],"messages":[{"role":"assistant","content":"r"},{"role":"user","content":"s"}]}"#,
            r#"{"messages":[{"role":"user","content":"q"},{"role":"assistant","content":"p"}],"continue_final_message":true,"add_generation_prompt":false}"#,
            r#"{"messages":[{"role":"user","content":"q"}],"continue_final_message":true}"#,
            r#"{"messages":[]}"#,
            r#"{"messages":null}"#,
            r#"{"model":"m"}"#,
            r#"{"messages":{"role":"user"}}"#,
            r#"{"messages":[{"content":"no role"}]}"#,
            r#"{"messages":[{"role":"user","content":3}]}"#,
            r#"{"messages":[{"role":"user","content":"q"}],"max_tokens":0}"#,
            r#"{"messages":[{"role":"user","content":"q","role":"again"}]}"#,
            r#"{"messages":[{"role":"user","content":"q"}],"cache_salt":"s","user":"u","tools":[{"type":"function"}]}"#,
            r#"{"messages":[{"role":"user","content":"\ud800"}]}"#,
            r"[1]",
            r#"{"messages":[{"role":"user","content":"q"}]"#,
        ];
        for raw in bodies {
            let two = parse_openai_body(raw.as_bytes(), Endpoint::Chat).ok().and_then(|body| {
                Some((
                    format!(
                        "{:?}",
                        OpenAiBody {
                            messages: None,
                            ..body.clone()
                        }
                    ),
                    render(&body)?,
                ))
            });
            let one = parse_and_render(raw.as_bytes()).map(|(body, r)| (format!("{body:?}"), r));
            assert_eq!(
                one.as_ref().map(|(b, r)| (b, &r.text, r.first_turn)),
                two.as_ref().map(|(b, r)| (b, &r.text, r.first_turn)),
                "{raw}"
            );
        }
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
    fn the_one_pass_reads_messages_and_parts_as_python_does() {
        let open = |content: &str| text(&format!(r#"{{"messages":[{{"role":"u","content":{content}}}]}}"#));
        let inner = |content: &str| {
            let t = open(content)?;
            let t = t
                .strip_prefix("<|im_start|>u\n")?
                .strip_suffix("<|im_end|>\n<|im_start|>assistant\n")?;
            Some(t.to_owned())
        };
        assert_eq!(inner("null").as_deref(), Some(""));
        assert_eq!(inner("[]").as_deref(), Some(""));
        // Text parts joined; a part of another type skipped, its `text` still a string; a
        // `null` or non-string type is not "text".
        let parts = r#"[{"text":"a"},{"type":"text","text":"b"},{"type":"image","text":"x"},{"type":null,"text":"y"},{"type":7}]"#;
        assert_eq!(inner(parts).as_deref(), Some("ab"));
        assert_eq!(
            inner(r#"[{"type":"text","text":"c"}]"#).as_deref(),
            Some("c"),
            "escaped type"
        );
        for refused in [
            "5",
            "{}",
            "true",
            r#"[{"type":"image","text":5}]"#,
            r#"[{"text":null}]"#,
            r#"["a"]"#,
            r#"[["text","a"]]"#,
            r#"[{"text":"a","text":"b"}]"#,
        ] {
            assert_eq!(open(refused), None, "{refused}");
        }
        // A message must be an object with one string role (an array is not read positionally).
        assert_eq!(text(r#"{"messages":[["u","hi"]]}"#), None);
        assert_eq!(text(r#"{"messages":[{"role":"u","role":"v","content":"x"}]}"#), None);
        assert_eq!(text(r#"{"messages":[{"content":"x"}]}"#), None);
        assert_eq!(text(r#"{"messages":[{"role":1,"content":"x"}]}"#), None);
        assert_eq!(
            text(r#"{"messages":[{"name":"n","role":"u","extra":{"a":[1]},"content":"x"}]}"#).as_deref(),
            Some("<|im_start|>u\nx<|im_end|>\n<|im_start|>assistant\n"),
            "other keys skipped"
        );
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
