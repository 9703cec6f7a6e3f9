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

/// Tokenizer mode's token source.
#[derive(Debug)]
pub struct TokenizerSource {
    encoder: PiecewiseEncoder,
    affixes: Option<Affixes>,
    default: ChatTemplate,
    tool_use: Option<ChatTemplate>,
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
        Ok(Self {
            default: compile("default")?.ok_or(SourceError::NoDefault)?,
            tool_use: compile("tool_use")?,
            encoder,
            affixes,
        })
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
