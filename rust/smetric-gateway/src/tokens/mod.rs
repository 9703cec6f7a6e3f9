//! The routing tokens of a chat template (tokenizer mode, or approximate mode with a template):
//! the model's chat template (`template`, over the
//! conversation as vLLM shapes it, `conversation`, with values printed as Python prints them,
//! `pyvalue`), the `tokenizer.json` encoder with its piece cache (`piecewise`), the approximate
//! ids of a text (`approximate`), the byte-bounded LRU both caches use (`text_lru`), and the
//! source that joins them (`source`). Declarations and
//! re-exports only.

mod approximate;
mod conversation;
mod piecewise;
mod pyvalue;
mod source;
mod template;
mod text_lru;

pub use approximate::{byte_chunk_ids, chunk_ids};
pub use conversation::{CachedText, ContentFormat, ConversationError, MessageCache, Messages, normalise};
pub use piecewise::{
    ENTRY_OVERHEAD_BYTES, OverBudget, PiecewiseEncoder, TokenizerError, piecewise_blockers, with_encode_budget,
};
pub use source::{ChatIds, LeadingSystem, SourceError, TokenSettings, TokenSource, TokensError};
pub use template::{ChatTemplate, RenderError, RenderRequest};
