//! The routing tokens of a chat template in the gateway: a chat body rendered with the model's
//! chat template (`template.rs`), then, in tokenizer mode (`smetric serve --tokens tokenizer`),
//! encoded with its `tokenizer.json` (`piecewise.rs`) — the engine's own ids, so the router's
//! block hashes equal vLLM's — or, in approximate mode with a chat template, cut into 4-byte
//! chunks (`approximate.rs`); a text prompt likewise. The port of `smetric.serve.tokens.TokenSource`
//! in those modes; the control plane resolves the configuration (which template, its content
//! format, the named special tokens) and hands it over as a [`TokenSettings`].
//!
//! Invariants: a request gets the ids the app would route it on, or an error (the request is
//! then the app's). With a tokenizer, `add_special_tokens` puts its fixed prefix and suffix around
//! a text (a BOS), or encodes it whole when they are not fixed; approximate ids ignore it.
//! Complexity: the render, O(conversation), plus the encoder's work on uncached pieces.

use std::path::PathBuf;

use super::approximate::chunk_ids;
use super::conversation::{ContentFormat, MessageCache, Messages};
use super::piecewise::{Affixes, PiecewiseEncoder, TokenizerError};
use super::template::{ChatTemplate, RenderError, RenderRequest};

/// What the control plane resolved.
#[derive(Debug, Clone)]
pub struct TokenSettings {
    /// The `tokenizer.json` (tokenizer mode), or none (approximate ids of the rendered text).
    pub tokenizer: Option<PathBuf>,
    /// Template name (`default`, `tool_use`) → (Jinja text, its content format).
    pub templates: Vec<(String, String, ContentFormat)>,
    /// The named special tokens a template sees (`bos_token`, `eos_token`, …).
    pub special_tokens: Vec<(String, String)>,
    /// The piece cache's bound in bytes (0: no cache); the message cache has the same bound.
    pub piece_cache_bytes: usize,
    /// Without a tokenizer: the bytes per approximate id ([`chunk_ids`]).
    pub approx_chunk_bytes: usize,
}

/// Why tokenizer mode could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error("chat template {name:?}: {reason}")]
    Template { name: String, reason: String },
    #[error("no chat template named \"default\"")]
    NoDefault,
}

/// Why one request has no ids here.
#[derive(Debug, thiserror::Error)]
pub enum TokensError {
    #[error(transparent)]
    Render(#[from] RenderError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
}

/// A chat body's routing ids and its messages' roles.
pub struct ChatIds {
    pub ids: Vec<u32>,
    pub roles: Vec<String>,
}

/// Whether a template accepts a system message after the first (vLLM's Messages endpoint merges
/// inline system messages into the leading one when it does not), probed as vLLM probes it:
/// rendering system, user, system, user.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeadingSystem {
    /// The probe rendered.
    Free,
    /// The template raised on the probe.
    Required,
    /// The probe failed in a step this port does not cover: the requests are the app's.
    Unknown,
}

/// The token source of tokenizer mode, or of approximate mode with a chat template.
#[derive(Debug)]
pub struct TokenSource {
    /// The encoder and the ids `add_special_tokens` adds (tokenizer mode).
    encoder: Option<(PiecewiseEncoder, Option<Affixes>)>,
    default: ChatTemplate,
    tool_use: Option<ChatTemplate>,
    /// [`LeadingSystem`] of `default` and of `tool_use` (or `default` again).
    leading_system: [LeadingSystem; 2],
    /// Without a tokenizer: the bytes per approximate id.
    approx_chunk_bytes: usize,
    /// Chat bodies' messages as the templates see them, by their JSON text (`conversation.rs`),
    /// within the piece cache's bound.
    messages: MessageCache,
}

/// The probe of [`LeadingSystem`].
fn probe_leading_system(template: &ChatTemplate) -> LeadingSystem {
    let probe = r#"[{"role": "system", "content": "t"}, {"role": "user", "content": "t"},
        {"role": "system", "content": "t"}, {"role": "user", "content": "t"}]"#;
    let request = RenderRequest {
        messages: Messages::Json(probe),
        tools: None,
        add_generation_prompt: false,
        continue_final_message: false,
        chat_template_kwargs: None,
    };
    match template.render(&request, None) {
        Ok(_) => LeadingSystem::Free,
        Err(e) if e.raised() => LeadingSystem::Required,
        Err(_) => LeadingSystem::Unknown,
    }
}

impl TokenSource {
    /// Loads the tokenizer (if any) and compiles the templates.
    ///
    /// # Errors
    /// The tokenizer does not load, a template does not compile here, or none is `default`.
    pub fn new(settings: &TokenSettings) -> Result<Self, SourceError> {
        let encoder = match &settings.tokenizer {
            None => None,
            Some(path) => {
                let encoder = PiecewiseEncoder::new(path, settings.piece_cache_bytes)?;
                let affixes = encoder.special_affixes()?;
                Some((encoder, affixes))
            }
        };
        let compile = |name: &str| -> Result<Option<ChatTemplate>, SourceError> {
            settings
                .templates
                .iter()
                .find(|(n, _, _)| n == name)
                .map(|(_, source, format)| {
                    ChatTemplate::new(source, *format, settings.special_tokens.clone()).map_err(|e| {
                        SourceError::Template {
                            name: name.to_owned(),
                            reason: e.0,
                        }
                    })
                })
                .transpose()
        };
        let default = compile("default")?.ok_or(SourceError::NoDefault)?;
        let tool_use = compile("tool_use")?;
        let leading_system = [
            probe_leading_system(&default),
            probe_leading_system(tool_use.as_ref().unwrap_or(&default)),
        ];
        Ok(Self {
            encoder,
            default,
            tool_use,
            leading_system,
            approx_chunk_bytes: settings.approx_chunk_bytes,
            messages: MessageCache::new(settings.piece_cache_bytes),
        })
    }

    /// Whether the template a request with (`tools`) or without tools gets accepts a system
    /// message after the first.
    pub fn requires_leading_system(&self, tools: bool) -> LeadingSystem {
        self.leading_system[usize::from(tools)]
    }

    /// The template a request with (`tools`, even empty) or without tools is rendered with:
    /// `tool_use` for one with tools when there is one (vLLM's pick).
    fn template(&self, tools: bool) -> &ChatTemplate {
        match (&self.tool_use, tools) {
            (Some(tool_use), true) => tool_use,
            _ => &self.default,
        }
    }

    /// The content format of the template a request with (`tools`) or without tools is rendered
    /// with: what its messages are normalised for ([`Messages::Normalised`]).
    pub fn content_format(&self, tools: bool) -> ContentFormat {
        self.template(tools).format()
    }

    /// The message cache (its figures, and the converted APIs' messages).
    pub fn message_cache(&self) -> &MessageCache {
        &self.messages
    }

    /// The encoder (its cache's figures), in tokenizer mode.
    pub fn encoder(&self) -> Option<&PiecewiseEncoder> {
        self.encoder.as_ref().map(|(encoder, _)| encoder)
    }

    /// What the ids are (the decision log's `tokens_source`): `tokenizer` or `approximate`.
    pub fn kind(&self) -> &'static str {
        if self.encoder.is_some() {
            "tokenizer"
        } else {
            "approximate"
        }
    }

    /// `text`'s ids: the tokenizer's, with its special tokens around them when `special`; or
    /// the text's approximate ids.
    ///
    /// # Errors
    /// The library failed to encode the text.
    pub fn text_ids(&self, text: &str, special: bool) -> Result<Vec<u32>, TokenizerError> {
        let Some((encoder, affixes)) = &self.encoder else {
            return Ok(chunk_ids(text.as_bytes(), self.approx_chunk_bytes));
        };
        if !special {
            return encoder.encode(text);
        }
        let Some((prefix, suffix)) = affixes else {
            return encoder.encode_whole(text, true);
        };
        let body = encoder.encode(text)?;
        let mut out = Vec::with_capacity(prefix.len() + body.len() + suffix.len());
        out.extend_from_slice(prefix);
        out.extend_from_slice(&body);
        out.extend_from_slice(suffix);
        Ok(out)
    }

    /// A chat request's routing ids: the template vLLM would pick (`tool_use` for a request
    /// with `tools`, even empty, when there is one), rendered and encoded with the request's
    /// `add_special_tokens`.
    ///
    /// # Errors
    /// The template refused the conversation or this port does not cover it, or encoding failed.
    pub fn chat_ids(&self, req: &RenderRequest<'_>, add_special_tokens: bool) -> Result<ChatIds, TokensError> {
        let (text, roles) = self.template(req.tools.is_some()).render(req, Some(&self.messages))?;
        Ok(ChatIds {
            ids: self.text_ids(&text, add_special_tokens)?,
            roles,
        })
    }
}

#[cfg(test)]
impl TokenSource {
    /// A template that prints every message it sees whole, and the tools: two conversations
    /// that differ in any key of any message render differently.
    pub(crate) const PRINT_ALL: &str = "{% for m in messages %}{{ m | tojson }}\n{% endfor %}{{ tools | tojson }}";

    /// A source without a tokenizer (an approximate id per byte) whose `default` template (the
    /// string content format) and `tool_use` template (the OpenAI format) are both `template`.
    pub(crate) fn for_tests(template: &str) -> Self {
        Self::new(&TokenSettings {
            tokenizer: None,
            templates: vec![
                ("default".to_owned(), template.to_owned(), ContentFormat::String),
                ("tool_use".to_owned(), template.to_owned(), ContentFormat::OpenAi),
            ],
            special_tokens: Vec::new(),
            piece_cache_bytes: 1 << 20,
            approx_chunk_bytes: 1,
        })
        .unwrap_or_else(|e| panic!("the test template does not compile: {e}"))
    }
}
