//! The routing tokens of `smetric serve --tokens tokenizer` in the gateway: a chat body rendered
//! with the model's chat template (`template.rs`) and encoded with its `tokenizer.json`
//! (`piecewise.rs`), a text prompt encoded as is — the engine's own ids, so the router's block
//! hashes equal vLLM's. The port of `smetric.serve.tokens.TokenSource` in tokenizer mode; the
//! control plane resolves the configuration (which template, its content format, the named
//! special tokens) and hands it over as a [`TokenizerSettings`].
//!
//! Invariants: a request gets the ids the app would route it on, or an error (the request is
//! then the app's). `add_special_tokens` puts the tokenizer's fixed prefix and suffix around a
//! text (a BOS), or encodes it whole when they are not fixed.
//! Complexity: the render, O(conversation), plus the encoder's work on uncached pieces.

use std::path::PathBuf;

use super::conversation::ContentFormat;
use super::piecewise::{Affixes, PiecewiseEncoder, TokenizerError};
use super::template::{ChatTemplate, RenderError, RenderRequest};

/// What the control plane resolved for tokenizer mode.
#[derive(Debug, Clone)]
pub struct TokenizerSettings {
    /// The `tokenizer.json`.
    pub tokenizer: PathBuf,
    /// Template name (`default`, `tool_use`) → (Jinja text, its content format).
    pub templates: Vec<(String, String, ContentFormat)>,
    /// The named special tokens a template sees (`bos_token`, `eos_token`, …).
    pub special_tokens: Vec<(String, String)>,
    /// The piece cache's bound in bytes (0: no cache).
    pub piece_cache_bytes: usize,
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

/// Tokenizer mode's token source.
#[derive(Debug)]
pub struct TokenizerSource {
    encoder: PiecewiseEncoder,
    affixes: Option<Affixes>,
    default: ChatTemplate,
    tool_use: Option<ChatTemplate>,
    /// [`LeadingSystem`] of `default` and of `tool_use` (or `default` again).
    leading_system: [LeadingSystem; 2],
}

/// The probe of [`LeadingSystem`].
fn probe_leading_system(template: &ChatTemplate) -> LeadingSystem {
    let probe = r#"[{"role": "system", "content": "t"}, {"role": "user", "content": "t"},
        {"role": "system", "content": "t"}, {"role": "user", "content": "t"}]"#;
    let request = RenderRequest {
        messages: probe,
        tools: None,
        add_generation_prompt: false,
        continue_final_message: false,
        chat_template_kwargs: None,
    };
    match template.render(&request) {
        Ok(_) => LeadingSystem::Free,
        Err(e) if e.raised() => LeadingSystem::Required,
        Err(_) => LeadingSystem::Unknown,
    }
}

impl TokenizerSource {
    /// Loads the tokenizer and compiles the templates.
    ///
    /// # Errors
    /// The tokenizer does not load, a template does not compile here, or none is `default`.
    pub fn new(settings: &TokenizerSettings) -> Result<Self, SourceError> {
        let encoder = PiecewiseEncoder::new(&settings.tokenizer, settings.piece_cache_bytes)?;
        let affixes = encoder.special_affixes()?;
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
            affixes,
            default,
            tool_use,
            leading_system,
        })
    }

    /// Whether the template a request with (`tools`) or without tools gets accepts a system
    /// message after the first.
    pub fn requires_leading_system(&self, tools: bool) -> LeadingSystem {
        self.leading_system[usize::from(tools)]
    }

    /// The encoder (its cache's figures).
    pub fn encoder(&self) -> &PiecewiseEncoder {
        &self.encoder
    }

    /// `text`'s ids, with the tokenizer's special tokens around them when `special`.
    ///
    /// # Errors
    /// The library failed to encode the text.
    pub fn text_ids(&self, text: &str, special: bool) -> Result<Vec<u32>, TokenizerError> {
        if !special {
            return self.encoder.encode(text);
        }
        let Some((prefix, suffix)) = &self.affixes else {
            return self.encoder.encode_whole(text, true);
        };
        let body = self.encoder.encode(text)?;
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
        let template = match (&self.tool_use, req.tools) {
            (Some(tool_use), Some(_)) => tool_use,
            _ => &self.default,
        };
        let (text, roles) = template.render(req)?;
        Ok(ChatIds {
            ids: self.text_ids(&text, add_special_tokens)?,
            roles,
        })
    }
}
