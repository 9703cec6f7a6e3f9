//! The routing tokens of tokenizer mode: the model's chat template (`template`, over the
//! conversation as vLLM shapes it, `conversation`, with values printed as Python prints them,
//! `pyvalue`), the `tokenizer.json` encoder with its piece cache (`piecewise`), and the source
//! that joins them (`source`). Declarations and re-exports only.

mod conversation;
mod piecewise;
mod pyvalue;
mod source;
mod template;

pub use conversation::ContentFormat;
pub use piecewise::{ENTRY_OVERHEAD_BYTES, PiecewiseEncoder, TokenizerError, piecewise_blockers};
pub use source::{ChatIds, LeadingSystem, SourceError, TokenizerSettings, TokenizerSource, TokensError};
pub use template::{ChatTemplate, RenderError, RenderRequest};
