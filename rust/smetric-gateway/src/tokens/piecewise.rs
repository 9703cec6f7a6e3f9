//! A `tokenizer.json` encoder that re-encodes only what it has not seen: the gateway's port of
//! `smetric.serve.piecewise.PiecewiseEncoder` (its module docs say why it is exact).
//!
//! Algorithm: the text is split at the tokenizer's added tokens (leftmost-longest, as the
//! library's own matcher); each added token is its id, each piece between them the library's
//! ids of that piece alone, taken from an LRU cache of piece → ids when there, else encoded and
//! kept. A tokenizer whose added tokens strip or match whole words or normalised text, or whose
//! `Metaspace` pre-tokenizer marks only the text's first piece, makes pieces depend on their
//! neighbours: then every text is encoded whole (`exact_pieces` is false), and so it is when
//! a probe text's pieces do not concatenate to its whole encoding.
//!
//! An *encode budget* ([`with_encode_budget`]) bounds the library's work a call may do on the
//! calling thread: the gateway plans a body on its runtime's thread when the cache holds nearly
//! all of it (a follow-up), and on the blocking pool only when the budget runs out (a first turn).
//! The budget is checked before the library runs (the uncached bytes of a text, summed), so an
//! over-budget call encodes nothing and leaves the cache and its counters as they were.
//!
//! Invariants: `encode(text)` equals the library's `encode(text, add_special_tokens=false)`;
//! the cache's charged bytes (a piece's UTF-8 bytes + 4 per id + [`ENTRY_OVERHEAD_BYTES`]) stay
//! within its bound; a piece costlier than the whole bound is encoded but not kept.
//! Complexity: O(text) to split and hash the pieces, plus the library's work on uncached pieces;
//! a cache hit or insert is O(log entries) (the LRU order is a `BTreeMap` of stamps).

use std::cell::Cell;
use std::path::Path;
use std::sync::{Arc, Mutex};

use aho_corasick::{AhoCorasick, MatchKind};
use tokenizers::Tokenizer;

use super::text_lru::TextLru;

/// Bytes charged per cached piece besides its text and ids (map slots, the stamp, headers).
pub const ENTRY_OVERHEAD_BYTES: usize = 96;

/// The probe text (the app's `_PROBE`): a ChatML conversation with runs of whitespace.
const PROBE: &str = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n\
Hello  world!\n\n  indented\tcode() {}<|im_end|>\n<|im_start|>assistant\n";

thread_local! {
    /// The calling thread's encode budget in text bytes (`None`: unbounded) and whether a call
    /// went over it ([`with_encode_budget`]).
    static BUDGET: Cell<Option<usize>> = const { Cell::new(None) };
    static OVER_BUDGET: Cell<bool> = const { Cell::new(false) };
}

/// `f`'s work ran past the encode budget: its answer is void (some text was left unencoded).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OverBudget;

/// Runs `f` with at most `bytes` of text handed to the tokenizer library on this thread (cached
/// pieces are free); an encode that would pass it fails, and then so does this call, whatever
/// `f` made of that failure.
///
/// # Errors
/// [`OverBudget`]: `f` wanted to encode more than `bytes`.
pub fn with_encode_budget<T>(bytes: usize, f: impl FnOnce() -> T) -> Result<T, OverBudget> {
    /// Unbounds the thread again on every exit, a panic's included.
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            BUDGET.set(None);
        }
    }
    BUDGET.set(Some(bytes));
    OVER_BUDGET.set(false);
    let reset = Reset;
    let out = f();
    drop(reset);
    if OVER_BUDGET.take() { Err(OverBudget) } else { Ok(out) }
}

/// Takes `bytes` from the thread's budget, or fails (and marks the call over budget).
fn spend(bytes: usize) -> Result<(), TokenizerError> {
    match BUDGET.get() {
        None => Ok(()),
        Some(left) if bytes <= left => {
            BUDGET.set(Some(left - bytes));
            Ok(())
        }
        Some(_) => {
            OVER_BUDGET.set(true);
            Err(TokenizerError {
                path: String::new(),
                reason: "over the calling thread's encode budget".to_owned(),
            })
        }
    }
}

/// Why a tokenizer could not be loaded.
#[derive(Debug, thiserror::Error)]
#[error("tokenizer {path}: {reason}")]
pub struct TokenizerError {
    pub path: String,
    pub reason: String,
}

/// Why a `tokenizer.json` (parsed) cannot be encoded piece by piece; empty if it can.
pub fn piecewise_blockers(config: &serde_json::Value) -> Vec<String> {
    let mut reasons = Vec::new();
    for token in config
        .get("added_tokens")
        .and_then(|t| t.as_array())
        .into_iter()
        .flatten()
    {
        for flag in ["lstrip", "rstrip", "single_word", "normalized"] {
            if token.get(flag).and_then(serde_json::Value::as_bool) == Some(true) {
                let content = token.get("content").and_then(|c| c.as_str()).unwrap_or_default();
                reasons.push(format!("added token {content:?} has {flag}=true"));
            }
        }
    }
    let mut stack = vec![config.get("pre_tokenizer")];
    while let Some(node) = stack.pop() {
        let Some(node) = node.filter(|n| n.is_object()) else {
            continue;
        };
        if node.get("type").and_then(|t| t.as_str()) == Some("Metaspace")
            && node.get("prepend_scheme").and_then(|t| t.as_str()) == Some("first")
        {
            reasons.push("a Metaspace pre-tokenizer with prepend_scheme 'first'".to_owned());
        }
        stack.extend(
            node.get("pretokenizers")
                .and_then(|p| p.as_array())
                .into_iter()
                .flatten()
                .map(Some),
        );
    }
    reasons
}

/// What a cached piece is charged: its UTF-8 bytes, 4 per id and [`ENTRY_OVERHEAD_BYTES`].
fn cost(piece: &str, ids: &[u32]) -> usize {
    piece.len() + 4 * ids.len() + ENTRY_OVERHEAD_BYTES
}

/// The ids a tokenizer puts before and after a text (`add_special_tokens`).
pub type Affixes = (Vec<u32>, Vec<u32>);

/// One piece of a split text: an added token's id, or the text between two.
enum Piece<'a> {
    Added(u32),
    Text(&'a str),
}

/// Encodes texts with a `tokenizer.json`, caching the ids of the pieces between added tokens.
pub struct PiecewiseEncoder {
    tokenizer: Tokenizer,
    added: Vec<u32>,
    split: Option<AhoCorasick>,
    cache_bytes: usize,
    /// The piece cache: piece → ids.
    cache: Mutex<TextLru<Arc<[u32]>>>,
    /// Why pieces are not exact for this tokenizer (empty: they are, if the probe agreed).
    pub blockers: Vec<String>,
    /// Texts are encoded piece by piece (else whole, every time).
    pub exact_pieces: bool,
}

impl std::fmt::Debug for PiecewiseEncoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PiecewiseEncoder")
            .field("exact_pieces", &self.exact_pieces)
            .finish_non_exhaustive()
    }
}

impl PiecewiseEncoder {
    /// Loads `path` with a cache of `cache_bytes` (0: no cache).
    ///
    /// # Errors
    /// The file cannot be read or is not a tokenizer the library loads.
    pub fn new(path: &Path, cache_bytes: usize) -> Result<Self, TokenizerError> {
        let fail = |reason: String| TokenizerError {
            path: path.display().to_string(),
            reason,
        };
        let text = std::fs::read_to_string(path).map_err(|e| fail(e.to_string()))?;
        let config: serde_json::Value = serde_json::from_str(&text).map_err(|e| fail(e.to_string()))?;
        let mut tokenizer: Tokenizer = text.parse().map_err(|e: tokenizers::Error| fail(e.to_string()))?;
        // vLLM's HF tokenizer truncates or pads only when a call asks for it.
        tokenizer.with_truncation(None).map_err(|e| fail(e.to_string()))?;
        tokenizer.with_padding(None);
        let mut patterns = Vec::new();
        let mut added = Vec::new();
        for token in config
            .get("added_tokens")
            .and_then(|t| t.as_array())
            .into_iter()
            .flatten()
        {
            if let (Some(content), Some(id)) = (
                token.get("content").and_then(|c| c.as_str()),
                token.get("id").and_then(serde_json::Value::as_u64),
            ) && !content.is_empty()
            {
                patterns.push(content.to_owned());
                added.push(u32::try_from(id).map_err(|e| fail(e.to_string()))?);
            }
        }
        let split = if patterns.is_empty() {
            None
        } else {
            Some(
                AhoCorasick::builder()
                    .match_kind(MatchKind::LeftmostLongest)
                    .build(&patterns)
                    .map_err(|e| fail(e.to_string()))?,
            )
        };
        let mut encoder = Self {
            tokenizer,
            added,
            split,
            cache_bytes,
            cache: Mutex::new(TextLru::default()),
            blockers: piecewise_blockers(&config),
            exact_pieces: false,
        };
        encoder.exact_pieces = encoder.blockers.is_empty() && encoder.probe_agrees()?;
        Ok(encoder)
    }

    fn probe_agrees(&self) -> Result<bool, TokenizerError> {
        Ok(self.pieces_of(PROBE, false)? == self.encode_whole(PROBE, false)?)
    }

    fn library_error(e: &tokenizers::Error) -> TokenizerError {
        TokenizerError {
            path: String::new(),
            reason: e.to_string(),
        }
    }

    /// The whole text through the library, no cache.
    ///
    /// # Errors
    /// The library failed to encode it.
    pub fn encode_whole(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, TokenizerError> {
        spend(text.len())?;
        self.library(text, add_special_tokens)
    }

    /// The library's ids of `text` (no budget: the caller spent it).
    fn library(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, TokenizerError> {
        self.tokenizer
            .encode_fast(text, add_special_tokens)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| Self::library_error(&e))
    }

    /// The ids of `text` as the library's `encode(text, add_special_tokens=false)` gives them.
    ///
    /// # Errors
    /// The library failed to encode a piece.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        if !self.exact_pieces {
            return self.encode_whole(text, false);
        }
        self.pieces_of(text, true)
    }

    fn split<'a>(&self, text: &'a str) -> Vec<Piece<'a>> {
        let mut out = Vec::new();
        let Some(split) = &self.split else {
            out.push(Piece::Text(text));
            return out;
        };
        let mut at = 0;
        for m in split.find_iter(text) {
            if m.start() > at {
                out.push(Piece::Text(&text[at..m.start()]));
            }
            out.push(Piece::Added(self.added[m.pattern().as_usize()]));
            at = m.end();
        }
        if at < text.len() {
            out.push(Piece::Text(&text[at..]));
        }
        out
    }

    fn pieces_of(&self, text: &str, cached: bool) -> Result<Vec<u32>, TokenizerError> {
        let pieces = self.split(text);
        let mut found: Vec<Option<Arc<[u32]>>> = Vec::with_capacity(pieces.len());
        if cached && self.cache_bytes > 0 {
            let mut cache = self.cache.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let mut misses = 0;
            for piece in &pieces {
                found.push(match piece {
                    Piece::Text(t) => {
                        let hit = cache.get(t);
                        misses += u64::from(hit.is_none());
                        hit
                    }
                    Piece::Added(_) => None,
                });
            }
            let uncached = pieces
                .iter()
                .zip(&found)
                .map(|(piece, hit)| match (piece, hit) {
                    (Piece::Text(t), None) => t.len(),
                    _ => 0,
                })
                .sum();
            // Before the counters: an over-budget call is asked again, and counts then.
            spend(uncached)?;
            cache.misses += misses;
            cache.hits += found.iter().filter(|hit| hit.is_some()).count() as u64;
        } else {
            found.resize(pieces.len(), None);
            spend(text.len())?;
        }
        // The library runs outside the cache's lock.
        let mut out = Vec::with_capacity(text.len() / 3);
        let mut fresh = Vec::new();
        for (piece, hit) in pieces.iter().zip(found) {
            match (piece, hit) {
                (Piece::Added(id), _) => out.push(*id),
                (Piece::Text(_), Some(ids)) => out.extend_from_slice(&ids),
                (Piece::Text(t), None) => {
                    let ids: Arc<[u32]> = self.library(t, false)?.into();
                    out.extend_from_slice(&ids);
                    fresh.push((*t, ids));
                }
            }
        }
        if cached && self.cache_bytes > 0 && !fresh.is_empty() {
            let mut cache = self.cache.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            for (piece, ids) in fresh {
                let charged = cost(piece, &ids);
                cache.keep(piece, ids, charged, self.cache_bytes);
            }
        }
        Ok(out)
    }

    /// The ids `add_special_tokens=true` puts before and after a text (a BOS, say), or `None`
    /// when they are not a fixed prefix and suffix.
    ///
    /// # Errors
    /// The library failed to encode the probe.
    pub fn special_affixes(&self) -> Result<Option<Affixes>, TokenizerError> {
        let with = self.encode_whole(PROBE, true)?;
        let plain = self.encode_whole(PROBE, false)?;
        if with.len() < plain.len() {
            return Ok(None);
        }
        Ok((0..=with.len() - plain.len())
            .find(|&start| with[start..start + plain.len()] == plain[..])
            .map(|start| (with[..start].to_vec(), with[start + plain.len()..].to_vec())))
    }

    /// `(hits, misses, pieces, charged bytes)` of the cache.
    pub fn cache_stats(&self) -> (u64, u64, usize, usize) {
        let cache = self.cache.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        (cache.hits, cache.misses, cache.len(), cache.bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The test tokenizer (`tests/data/serve/tokenizer.json`, built in the repository).
    fn encoder() -> PiecewiseEncoder {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/serve/tokenizer.json");
        PiecewiseEncoder::new(&path, 1 << 20).unwrap()
    }

    const HISTORY: &str = "<|im_start|>user\nThe history of a long session, said once.<|im_end|>\n";

    #[test]
    fn a_cached_text_costs_no_budget_and_an_uncached_one_is_refused_untouched() {
        let e = encoder();
        assert!(e.exact_pieces);
        let whole = e.encode(HISTORY).unwrap();
        let counters = e.cache_stats();
        // Every piece cached: nothing to encode, so a zero budget is enough.
        assert_eq!(with_encode_budget(0, || e.encode(HISTORY).unwrap()), Ok(whole.clone()));
        assert_eq!(e.cache_stats().0, counters.0 + counters.1); // each piece missed once, hit now
        // A new piece over the budget: refused, and the cache and its counters are as they were.
        let fresh = "<|im_start|>user\nA tool result never seen before.<|im_end|>\n";
        let before = e.cache_stats();
        let refused = with_encode_budget(8, || e.encode(fresh));
        assert_eq!(refused.err(), Some(OverBudget));
        assert_eq!(e.cache_stats(), before);
        // Within the budget: the same ids as without one, and the thread is unbounded after.
        let within = with_encode_budget(1024, || e.encode(fresh).unwrap()).unwrap();
        assert_eq!(within, e.encode_whole(fresh, false).unwrap());
        assert_eq!(BUDGET.get(), None);
    }

    #[test]
    fn a_whole_text_encode_spends_its_length() {
        let e = encoder();
        assert_eq!(
            with_encode_budget(HISTORY.len() - 1, || e.encode_whole(HISTORY, false)).err(),
            Some(OverBudget)
        );
        assert!(with_encode_budget(HISTORY.len(), || e.encode_whole(HISTORY, false)).is_ok());
    }
}
