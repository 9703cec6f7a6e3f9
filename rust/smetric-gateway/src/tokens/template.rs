//! A chat template rendered as vLLM renders it, in the gateway: minijinja configured as
//! transformers configures Jinja (`trim_blocks`, `lstrip_blocks`, loop controls, a
//! `{% generation %}` block rendered as its body, a `tojson` that does not escape HTML, the
//! globals `raise_exception`, `strftime_now` and `namespace`, Python's string and dict methods),
//! with values printed as Python prints them (`pyvalue`). The port of
//! `smetric.serve.chat_template.ChatTemplate.render`; `tests/serve/test_native_tokenizer.py`
//! holds the two renderers equal on the generated corpora, and the real-vLLM tests hold the ids
//! equal to the engine's `/tokenize`.
//!
//! Invariants: a render either gives the text the app's renderer gives or fails (a template
//! error, a value this port does not print as Python would); a failure hands the request to
//! the app. Complexity: O(conversation length) per render plus the template's own work, bounded
//! by minijinja's fuel.

use std::fmt::Write;

use minijinja::value::{Kwargs, Rest, Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind, State};

use super::conversation::{
    ContentFormat, ConversationError, Map, MessageCache, Messages, conversation, get, map_value, tool_dump,
};
use super::pyvalue::{JsonStyle, py_json, py_str};

/// transformers' marker for `continue_final_message`, appended to the final message's text.
const CONTINUE_TAG: &str = "CONTINUE_FINAL_MESSAGE_TAG ";
/// The template's name inside its environment (no extension: no auto-escaping).
const NAME: &str = "chat";
/// Instructions one render may run at most: a template looping without end fails instead of
/// holding a gateway thread (a 32K-token agent conversation takes well under a million).
const FUEL: u64 = 50_000_000;

/// Why a conversation was not rendered (the request is then the app's).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct RenderError(pub String);

impl RenderError {
    /// Whether the template itself refused the conversation (`raise_exception`), rather than a
    /// step this port does not cover failing.
    pub fn raised(&self) -> bool {
        self.0.contains(RAISED)
    }
}

/// What a template's own `raise_exception` error says first.
const RAISED: &str = "raise_exception: ";

impl From<ConversationError> for RenderError {
    fn from(e: ConversationError) -> Self {
        Self(e.0)
    }
}

impl From<Error> for RenderError {
    fn from(e: Error) -> Self {
        Self(format!("the chat template rejected the conversation: {e:#}"))
    }
}

/// What one render takes from the request.
pub struct RenderRequest<'a> {
    /// The request's `messages`.
    pub messages: Messages<'a>,
    /// The JSON text of `tools` (present, even empty, or absent).
    pub tools: Option<&'a str>,
    pub add_generation_prompt: bool,
    pub continue_final_message: bool,
    /// The JSON text of `chat_template_kwargs`.
    pub chat_template_kwargs: Option<&'a str>,
}

/// One compiled chat template and the special tokens it is rendered with.
pub struct ChatTemplate {
    env: Environment<'static>,
    format: ContentFormat,
    special_tokens: Vec<(String, String)>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("format", &self.format)
            .finish_non_exhaustive()
    }
}

/// `{% generation %}` / `{% endgeneration %}` (transformers' assistant-mask block) rewritten to
/// an always-true `if`, keeping each tag's whitespace-control dashes: minijinja has no custom
/// tags, and the block renders as its body either way.
fn without_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        out.push_str(&rest[..start]);
        let tag = &rest[start..];
        let Some(end) = tag.find("%}") else {
            out.push_str(tag);
            return out;
        };
        let inner = &tag[2..end];
        let (open, body) = inner.strip_prefix(['-', '+']).map_or(("", inner), |b| (&inner[..1], b));
        let (body, close) = body
            .strip_suffix(['-', '+'])
            .map_or((body, ""), |b| (b, &body[b.len()..]));
        match body.trim() {
            "generation" => {
                let _ = write!(out, "{{%{open} if true {close}%}}");
            }
            "endgeneration" => {
                let _ = write!(out, "{{%{open} endif {close}%}}");
            }
            _ => out.push_str(&tag[..end + 2]),
        }
        rest = &tag[end + 2..];
    }
    out.push_str(rest);
    out
}

fn raise_exception(message: &str) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, format!("{RAISED}{message}")))
}

/// transformers' `tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`
/// (minijinja hands a filter its arguments by value).
#[allow(clippy::needless_pass_by_value)]
fn tojson(value: &Value, args: Rest<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let mut positional = args.iter();
    let ensure_ascii = positional
        .next()
        .cloned()
        .or(kwargs.get::<Option<Value>>("ensure_ascii")?);
    let indent = positional.next().cloned().or(kwargs.get::<Option<Value>>("indent")?);
    let separators = positional
        .next()
        .cloned()
        .or(kwargs.get::<Option<Value>>("separators")?);
    let sort_keys = positional.next().cloned().or(kwargs.get::<Option<Value>>("sort_keys")?);
    kwargs.assert_all_used()?;
    if ensure_ascii.is_some_and(|v| v.is_true()) {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            "tojson with ensure_ascii is not ported",
        ));
    }
    let indent = match indent.filter(|v| !v.is_none()) {
        None => None,
        Some(v) if v.is_integer() => Some(" ".repeat(usize::try_from(v.as_i64().unwrap_or(0)).unwrap_or(0))),
        Some(v) if v.kind() == ValueKind::String => Some(v.as_str().unwrap_or_default().to_owned()),
        Some(_) => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "tojson: indent is not a number or text",
            ));
        }
    };
    let separators = match separators.filter(|v| !v.is_none()) {
        None => None,
        Some(v) => {
            let pair: Vec<Value> = v.try_iter()?.collect();
            match (
                pair.first().and_then(Value::as_str),
                pair.get(1).and_then(Value::as_str),
                pair.len(),
            ) {
                (Some(a), Some(b), 2) => Some((a.to_owned(), b.to_owned())),
                _ => {
                    return Err(Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson: separators is not two texts",
                    ));
                }
            }
        }
    };
    let style = JsonStyle::new(indent, separators, sort_keys.is_some_and(|v| v.is_true()));
    py_json(value, &style)
        .map(Value::from_safe_string)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, e.0))
}

/// `strftime_now(format)`: the UTC wall clock in Python's `strftime` codes (the ones chat
/// templates use; another code is an error).
fn strftime_now(format: &str) -> Result<Value, Error> {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    Ok(Value::from(strftime(format, secs)?))
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const DAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// `format` at `secs` after the epoch (UTC), for Python's codes `%d %m %Y %y %B %b %A %a %H %M
/// %S %I %p %j %%`.
fn strftime(format: &str, secs: u64) -> Result<String, Error> {
    let days = secs / 86_400;
    let (h, m, s) = ((secs / 3600) % 24, (secs / 60) % 60, secs % 60);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    let before = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334][(month - 1) as usize];
    let yday = before + day + i64::from(leap && month > 2);
    let weekday = ((days as i64 + 3) % 7) as usize; // 1970-01-01 was a Thursday
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let _ = match chars.next() {
            Some('d') => write!(out, "{day:02}"),
            Some('m') => write!(out, "{month:02}"),
            Some('Y') => write!(out, "{year}"),
            Some('y') => write!(out, "{:02}", year % 100),
            Some('B') => write!(out, "{}", MONTHS[(month - 1) as usize]),
            Some('b') => write!(out, "{}", &MONTHS[(month - 1) as usize][..3]),
            Some('A') => write!(out, "{}", DAYS[weekday]),
            Some('a') => write!(out, "{}", &DAYS[weekday][..3]),
            Some('H') => write!(out, "{h:02}"),
            Some('M') => write!(out, "{m:02}"),
            Some('S') => write!(out, "{s:02}"),
            Some('I') => write!(out, "{:02}", if h % 12 == 0 { 12 } else { h % 12 }),
            Some('p') => write!(out, "{}", if h < 12 { "AM" } else { "PM" }),
            Some('j') => write!(out, "{yday:03}"),
            Some('%') => write!(out, "%"),
            other => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("strftime_now: the code %{} is not ported", other.unwrap_or(' ')),
                ));
            }
        };
    }
    Ok(out)
}

/// `{{ value }}` as Python's `str()` writes it.
fn python_formatter(out: &mut minijinja::Output, _state: &mut State, value: &Value) -> Result<(), Error> {
    // A string prints as itself (`py_str`'s case), written without a copy: a message's text is
    // most of a conversation's bytes.
    let written = if let Some(text) = value.as_str().filter(|_| value.kind() == ValueKind::String) {
        out.write_str(text)
    } else {
        let mut text = String::new();
        py_str(value, &mut text);
        out.write_str(&text)
    };
    written.map_err(|_| Error::new(ErrorKind::WriteFailure, "write failed"))
}

impl ChatTemplate {
    /// Compiles `source` (Jinja text) for vLLM's content `format`, with the tokenizer's named
    /// special tokens (`bos_token`, `eos_token`, …).
    ///
    /// # Errors
    /// The template does not compile here.
    pub fn new(
        source: &str,
        format: ContentFormat,
        special_tokens: Vec<(String, String)>,
    ) -> Result<Self, RenderError> {
        let mut env = Environment::new();
        env.set_syntax(
            minijinja::syntax::SyntaxConfig::builder()
                .trim_blocks(true)
                .lstrip_blocks(true)
                .build()
                .map_err(RenderError::from)?,
        );
        env.set_fuel(Some(FUEL));
        env.set_formatter(python_formatter);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", tojson);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_template_owned(NAME, without_generation_tags(source))?;
        Ok(Self {
            env,
            format,
            special_tokens,
        })
    }

    /// The template's content format.
    pub fn format(&self) -> ContentFormat {
        self.format
    }

    /// The prompt text vLLM renders for this request, and its messages' roles; a chat body's
    /// messages through `cache` when there is one.
    ///
    /// # Errors
    /// The template raised or failed, or the conversation is one the app must answer.
    pub fn render(
        &self,
        req: &RenderRequest<'_>,
        cache: Option<&MessageCache>,
    ) -> Result<(String, Vec<String>), RenderError> {
        let (mut chat, roles) = conversation(req.messages, self.format, cache)?;
        if chat.is_empty() {
            // The app's request parse refuses it before any template sees it.
            return Err(RenderError("messages must be a non-empty list".to_owned()));
        }
        let kwargs: Map = match req.chat_template_kwargs {
            None => Map::new(),
            Some(text) => {
                let value: Value = serde_json::from_str(text).map_err(|e| RenderError(e.to_string()))?;
                if value.kind() != ValueKind::Map {
                    return Err(RenderError("chat_template_kwargs is not an object".to_owned()));
                }
                super::conversation::entries(&value)
            }
        };
        let tools: Value = match req.tools {
            None => Value::from(()),
            Some(text) => {
                let tools: Vec<Value> = serde_json::from_str(text).map_err(|e| RenderError(e.to_string()))?;
                Value::from(tools.iter().map(tool_dump).collect::<Vec<_>>())
            }
        };
        // vLLM merges the request's `chat_template_kwargs` over these two, so they win there.
        let mut kwargs = kwargs;
        let add_generation_prompt = kwargs
            .shift_remove(&Value::from("add_generation_prompt"))
            .map_or(req.add_generation_prompt, |v| v.is_true());
        let continue_final_message = kwargs
            .shift_remove(&Value::from("continue_final_message"))
            .map_or(req.continue_final_message, |v| v.is_true());
        let mut final_text = None;
        if continue_final_message {
            let Some(last) = chat.pop() else {
                return Err(RenderError("continue_final_message without a final message".to_owned()));
            };
            let (tagged, text) = tag_final_message(&last)?;
            chat.push(tagged);
            final_text = Some(text);
        }
        let mut variables = Map::new();
        for (name, token) in &self.special_tokens {
            variables.insert(Value::from(name.as_str()), Value::from(token.as_str()));
        }
        for (k, v) in kwargs {
            variables.insert(k, v);
        }
        variables.insert(Value::from("messages"), Value::from(chat));
        variables.insert(Value::from("tools"), tools);
        variables.insert(Value::from("documents"), Value::from(()));
        variables.insert(
            Value::from("add_generation_prompt"),
            Value::from(add_generation_prompt && !continue_final_message),
        );
        let template = self.env.get_template(NAME)?;
        let mut text = template.render(map_value(variables))?;
        if final_text.is_some() {
            let Some(marker) = text.rfind(CONTINUE_TAG.trim_end()) else {
                return Err(RenderError(
                    "continue_final_message: the final message is not in the rendered text".to_owned(),
                ));
            };
            if text[marker..].starts_with(CONTINUE_TAG) {
                text.truncate(marker);
            } else {
                text.truncate(marker);
                let kept = text.trim_end().len();
                text.truncate(kept);
            }
        }
        Ok((text, roles))
    }
}

/// The final message with the continuation marker after its text (`_tag_final_message`).
fn tag_final_message(message: &Value) -> Result<(Value, String), RenderError> {
    let missing = || RenderError("continue_final_message is set but the final message has no content".to_owned());
    let content = get(message, "content").ok_or_else(missing)?;
    let mut out = super::conversation::entries(message);
    if let Some(text) = content.as_str() {
        let text = text.to_owned();
        out.insert(Value::from("content"), Value::from(format!("{text}{CONTINUE_TAG}")));
        return Ok((map_value(out), text));
    }
    let mut parts: Vec<Value> = content.try_iter().map_err(RenderError::from)?.collect();
    for part in parts.iter_mut().rev() {
        if part.kind() == ValueKind::Map
            && let Some(text) = get(part, "text")
        {
            let mut text_str = String::new();
            py_str(&text, &mut text_str);
            let mut tagged = super::conversation::entries(part);
            tagged.insert(Value::from("text"), Value::from(format!("{text_str}{CONTINUE_TAG}")));
            *part = map_value(tagged);
            out.insert(Value::from("content"), Value::from(parts));
            return Ok((map_value(out), text_str));
        }
    }
    Err(RenderError(
        "continue_final_message is set but the final message has no text".to_owned(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(source: &str, messages: &str, agp: bool) -> Result<String, RenderError> {
        let t = ChatTemplate::new(source, ContentFormat::String, vec![("eos_token".into(), "</s>".into())])?;
        t.render(&request(messages, agp), None).map(|(text, _)| text)
    }

    fn request(messages: &str, add_generation_prompt: bool) -> RenderRequest<'_> {
        RenderRequest {
            messages: Messages::Json(messages),
            tools: None,
            add_generation_prompt,
            continue_final_message: false,
            chat_template_kwargs: None,
        }
    }

    /// A conversation rendered through the message cache is the one rendered without it, turn
    /// after turn, for two templates of different content formats sharing the cache (the same
    /// message normalises differently in each: a cache that ignored the format would give one
    /// template the other's messages, and `tojson` would show it).
    #[test]
    fn the_message_cache_renders_what_a_render_without_it_does() {
        let source = "{% for m in messages %}<{{ m.role }}>{{ m.content | tojson }}\n{% endfor %}";
        let string = ChatTemplate::new(source, ContentFormat::String, Vec::new()).unwrap();
        let openai = ChatTemplate::new(source, ContentFormat::OpenAi, Vec::new()).unwrap();
        let cache = MessageCache::new(1 << 20);
        let turn1 = r#"[{"role": "system", "content": "s"}, {"role": "user", "content": [{"type": "text", "text": "a"}, "b"]}]"#;
        let turn2 = r#"[{"role": "system", "content": "s"}, {"role": "user", "content": [{"type": "text", "text": "a"}, "b"]},
            {"role": "assistant", "content": "c"}, {"role": "user", "content": "d"}]"#;
        for messages in [turn1, turn2, turn2] {
            for t in [&string, &openai] {
                let req = request(messages, true);
                assert_eq!(t.render(&req, Some(&cache)).unwrap(), t.render(&req, None).unwrap());
            }
        }
        // The string template's turns: 2 new, then 2 kept and 2 new, then 4 kept; the other
        // template's lookups all find the string format's entries, which are not its own.
        let (hits, misses, kept, _) = cache.stats();
        assert_eq!((hits, misses, kept), (6, 14, 4));
        // A message that does not normalise is refused each time and never kept.
        let bad = r#"[{"role": 1, "content": "x"}]"#;
        for _ in 0..2 {
            assert!(string.render(&request(bad, true), Some(&cache)).is_err());
        }
        assert_eq!(cache.stats().2, 4);
    }

    #[test]
    fn transformers_environment() {
        let source = "{% for m in messages %}\n  {%- generation %}{{ m.role }}:{{ m.content.strip() }}{% endgeneration -%}\n{% endfor %}{{ eos_token }}{{ none }}{{ true }}{{ 1.0 }}{{ {'a': [1]} | tojson }}";
        assert_eq!(
            render(source, r#"[{"role": "user", "content": " hi "}]"#, true).unwrap(),
            "user:hi</s>NoneTrue1.0{\"a\": [1]}"
        );
        let one = r#"[{"role": "user", "content": "x"}]"#;
        let err = render("{{ raise_exception('no') }}", one, true).unwrap_err();
        assert!(err.0.contains("no") && err.raised(), "{err}");
        assert!(!render("{{ 1 + 'a' }}", one, true).unwrap_err().raised());
        assert!(render("{% for x in range(10) %}{% break %}{% endfor %}ok", one, true).unwrap() == "ok");
        assert!(
            render("ok", "[]", true).is_err(),
            "the app refuses an empty conversation"
        );
    }

    #[test]
    fn continue_final_message_cuts_at_the_marker() {
        let t = ChatTemplate::new(
            "{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>\n{% endfor %}",
            ContentFormat::String,
            Vec::new(),
        )
        .unwrap();
        let (text, _) = t
            .render(
                &RenderRequest {
                    messages: Messages::Json(
                        r#"[{"role": "user", "content": "q"}, {"role": "assistant", "content": "par"}]"#,
                    ),
                    tools: None,
                    add_generation_prompt: true,
                    continue_final_message: true,
                    chat_template_kwargs: None,
                },
                None,
            )
            .unwrap();
        assert_eq!(text, "<user>q</user>\n<assistant>par");
    }

    #[test]
    fn strftime_codes() {
        // 2026-12-04 10:16:10 UTC, a Friday.
        assert_eq!(
            strftime("%d %b %Y %A %H:%M:%S %j %I%p %%", 1_796_379_370).unwrap(),
            "04 Dec 2026 Friday 10:16:10 338 10AM %"
        );
        assert!(strftime("%Q", 0).is_err());
    }
}
