//! Typed decoding of vLLM's `KVEventBatch` msgpack payloads (both event encodings).
//!
//! # Format
//! A payload is `msgspec.msgpack` of `KVEventBatch`, an array-like struct
//! `[ts: float, events: [...], data_parallel_rank: int | nil]`. msgspec writes every field of
//! an array-like struct, so the rank is present (the publisher fills it in); a 2-element batch
//! is accepted anyway.
//! Events are tagged structs in one of two encodings:
//! * vLLM ≥0.24: a map `{"type": "BlockStored", "block_hashes": [...], ...}`; fields whose
//!   default is `None` are omitted;
//! * vLLM ≤0.23: an array `["BlockStored", block_hashes, parent_block_hash, token_ids,
//!   block_size, lora_id, medium, lora_name, extra_keys, group_idx, ...]`, positional in
//!   declaration order with every field written (`nil` for `None`); older releases simply
//!   have fewer fields, so missing trailing fields read as absent.
//!
//! Both are accepted, even mixed in one batch. A block hash is a msgpack int (vLLM's default
//! 64-bit form, see [`crate::event_hash`]) or `bin` (the full digest, with
//! `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0`).
//!
//! # Invariants
//! * Decoding never panics: malformed input yields a [`DecodeError`] that says what and where.
//! * Allocations are bounded by the input size (a declared length must fit in the remaining
//!   bytes) and by [`DecodeOptions`] limits.
//! * Forward compatible: unknown map keys and extra trailing array fields are skipped; unknown
//!   event types are skipped and counted in [`KvEventBatch::unknown_events`] unless
//!   [`DecodeOptions::reject_unknown_events`] is set.
//!
//! # Complexity
//! One pass, O(payload size), into flat reusable buffers (the `decode` submodule; the ingestor
//! applies them directly); the owned [`KvEventBatch`] is built from them. A map-form event whose
//! `"type"` key is not first (msgspec always writes it first) costs one extra pass over that
//! event.

use crate::hash::{BlockDigest, event_hash};
use crate::msgpack::ReadError;

mod decode;
mod encode;
mod value;

pub use encode::{encode_batch, encode_batch_to_vec};

pub(crate) use decode::{Kind as EventKind, RawBatch, RawEvent, RawMedium, plain_prefix, reuse};

/// Errors from decoding a KV-event payload or its ZMQ frames.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The input ended inside a value (or declared more elements than bytes remain).
    #[error("input truncated: a value needs bytes past the end ({offset} bytes)")]
    Truncated {
        /// Length of the input.
        offset: usize,
    },
    /// A value had a different msgpack type than the field requires.
    #[error("expected {expected} at byte {offset}, found msgpack marker 0x{marker:02x}")]
    WrongType {
        /// What was expected.
        expected: &'static str,
        /// The msgpack marker byte found.
        marker: u8,
        /// Byte offset of the value.
        offset: usize,
    },
    /// A string was not valid UTF-8.
    #[error("invalid UTF-8 in the string at byte {offset}")]
    InvalidUtf8 {
        /// Byte offset of the string.
        offset: usize,
    },
    /// An integer did not fit its field (e.g. a negative token id).
    #[error("{what} = {value} at byte {offset} is out of range")]
    OutOfRange {
        /// The field.
        what: &'static str,
        /// The decoded value.
        value: i128,
        /// Byte offset of the value.
        offset: usize,
    },
    /// An array was longer than the configured limit.
    #[error("{what} has {len} elements, more than the limit of {limit}")]
    TooLarge {
        /// The field.
        what: &'static str,
        /// Declared length.
        len: usize,
        /// Configured limit.
        limit: usize,
    },
    /// Extra keys were nested deeper than [`DecodeOptions::max_depth`].
    #[error("values nested too deeply at byte {offset}")]
    TooDeep {
        /// Byte offset of the container that exceeded the limit.
        offset: usize,
    },
    /// An event type this decoder does not know (only with `reject_unknown_events`).
    #[error("unknown KV event type {0:?}")]
    UnknownEventType(String),
    /// A required field was absent.
    #[error("{event} lacks required field {field}")]
    MissingField {
        /// The struct.
        event: &'static str,
        /// The field.
        field: &'static str,
    },
    /// Bytes followed the batch.
    #[error("{extra} unexpected bytes after the batch")]
    TrailingBytes {
        /// Number of extra bytes.
        extra: usize,
    },
    /// A ZMQ message had an unexpected number of frames.
    #[error("expected {expected} frames, got {got}")]
    FrameCount {
        /// Accepted frame counts.
        expected: &'static str,
        /// Frames received.
        got: usize,
    },
    /// The sequence-number frame was not 8 bytes.
    #[error("sequence frame has {len} bytes, expected 8")]
    BadSeqFrame {
        /// Its length.
        len: usize,
    },
    /// A replay reply did not start with the empty delimiter frame.
    #[error("replay reply does not start with an empty delimiter frame")]
    BadDelimiter,
    /// The topic frame was not UTF-8.
    #[error("topic frame is not UTF-8")]
    InvalidTopic,
}

impl DecodeError {
    /// A short stable name of the variant, for metrics labels and counters.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Truncated { .. } => "truncated",
            Self::WrongType { .. } => "wrong_type",
            Self::InvalidUtf8 { .. } => "invalid_utf8",
            Self::OutOfRange { .. } => "out_of_range",
            Self::TooLarge { .. } => "too_large",
            Self::TooDeep { .. } => "too_deep",
            Self::UnknownEventType(_) => "unknown_event_type",
            Self::MissingField { .. } => "missing_field",
            Self::TrailingBytes { .. } => "trailing_bytes",
            Self::FrameCount { .. } => "frame_count",
            Self::BadSeqFrame { .. } => "bad_seq_frame",
            Self::BadDelimiter => "bad_delimiter",
            Self::InvalidTopic => "invalid_topic",
        }
    }
}

impl From<ReadError> for DecodeError {
    #[inline]
    fn from(e: ReadError) -> Self {
        match e {
            ReadError::Truncated { offset } => Self::Truncated { offset },
            ReadError::WrongType {
                expected,
                marker,
                offset,
            } => Self::WrongType {
                expected,
                marker,
                offset,
            },
            ReadError::InvalidUtf8 { offset } => Self::InvalidUtf8 { offset },
            ReadError::OutOfRange { what, value, offset } => Self::OutOfRange { what, value, offset },
        }
    }
}

/// A block hash as published in KV events (vLLM's `ExternalBlockHash = bytes | int`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ExternalBlockHash {
    /// The 64-bit form (vLLM's default): the digest's last 8 bytes, big-endian. vLLM emits
    /// non-negative ints; a negative msgpack int (other producers) keeps its two's-complement
    /// bits.
    Int(u64),
    /// The full digest (`VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0`), or another producer's bytes.
    Bytes(Vec<u8>),
}

impl ExternalBlockHash {
    /// The 64-bit key: the int itself, or [`event_hash`] of the bytes. Both event forms of
    /// one vLLM block map to the same key.
    pub fn to_u64(&self) -> u64 {
        match self {
            Self::Int(v) => *v,
            Self::Bytes(b) => event_hash(b),
        }
    }

    /// Whether this event hash denotes `digest` (full comparison for the bytes form).
    pub fn matches(&self, digest: &BlockDigest) -> bool {
        match self {
            Self::Int(v) => *v == digest.event_hash(),
            Self::Bytes(b) => b.as_slice() == digest.as_bytes(),
        }
    }
}

impl From<&BlockDigest> for ExternalBlockHash {
    /// The int form vLLM publishes by default.
    fn from(digest: &BlockDigest) -> Self {
        Self::Int(digest.event_hash())
    }
}

/// Where a block lives, from the event's `medium` string (matched case-insensitively).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Medium {
    /// `"GPU"`: vLLM's own prefix cache.
    Gpu,
    /// `"CPU"`: host memory (offloading connector, Mooncake store, LMCache).
    Cpu,
    /// `"STORAGE"`: disk or remote storage tiers.
    Storage,
    /// Anything else, verbatim (e.g. LMCache's torch device strings).
    Other(String),
}

impl Medium {
    /// Classifies a `medium` string, ignoring ASCII case.
    pub fn parse(s: &str) -> Self {
        if s.eq_ignore_ascii_case("gpu") {
            Self::Gpu
        } else if s.eq_ignore_ascii_case("cpu") {
            Self::Cpu
        } else if s.eq_ignore_ascii_case("storage") {
            Self::Storage
        } else {
            Self::Other(s.to_owned())
        }
    }

    /// The canonical (upper-case) name, or the verbatim string for [`Medium::Other`].
    pub fn as_str(&self) -> &str {
        match self {
            Self::Gpu => "GPU",
            Self::Cpu => "CPU",
            Self::Storage => "STORAGE",
            Self::Other(s) => s,
        }
    }
}

/// A generic msgpack value, used for the free-form `extra_keys` of `BlockStored`.
#[derive(Debug, Clone, PartialEq)]
pub enum EventValue {
    /// `nil` (Python `None`).
    Nil,
    /// A boolean.
    Bool(bool),
    /// An integer that fits `i64`.
    Int(i64),
    /// An integer above `i64::MAX`.
    UInt(u64),
    /// A float.
    Float(f64),
    /// A string.
    Str(String),
    /// Binary data (Python `bytes`).
    Bytes(Vec<u8>),
    /// An array (Python list or tuple).
    Array(Vec<EventValue>),
    /// A map, in wire order.
    Map(Vec<(EventValue, EventValue)>),
}

/// The untagged extra keys of one block (`None` when the block has none).
pub type BlockExtraKeys = Option<Vec<EventValue>>;

/// vLLM's `BlockStored`: blocks entered a cache tier.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct BlockStored {
    /// One hash per stored block, in chain order.
    pub block_hashes: Vec<ExternalBlockHash>,
    /// Hash of the block before the first one; `None` when the chain starts at block 0.
    pub parent_block_hash: Option<ExternalBlockHash>,
    /// The tokens of all listed blocks (empty in offloading placeholder events).
    pub token_ids: Vec<u32>,
    /// Tokens per block (0 in offloading placeholder events).
    pub block_size: u32,
    /// Deprecated LoRA int id.
    pub lora_id: Option<i64>,
    /// Cache tier.
    pub medium: Option<Medium>,
    /// LoRA adapter name.
    pub lora_name: Option<String>,
    /// Untagged extra keys, one entry per block.
    pub extra_keys: Option<Vec<BlockExtraKeys>>,
    /// KV cache group (hybrid models).
    pub group_idx: Option<i64>,
    /// KV cache spec kind of the group.
    pub kv_cache_spec_kind: Option<String>,
    /// Sliding window of the group's spec.
    pub kv_cache_spec_sliding_window: Option<i64>,
    /// `"LOCAL"` or `"REMOTE"` relative to the publisher.
    pub locality: Option<String>,
    /// Secondary offloading tier identifier.
    pub ownership: Option<String>,
    /// Session that triggered the store.
    pub session_id: Option<String>,
    /// Speculative-decoding lookahead tokens, one list per block.
    pub lookahead_token_ids: Option<Vec<Vec<u32>>>,
}

/// vLLM's `BlockRemoved`: blocks left a cache tier (the GPU pool sends one hash per event).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BlockRemoved {
    /// The removed blocks.
    pub block_hashes: Vec<ExternalBlockHash>,
    /// Cache tier.
    pub medium: Option<Medium>,
    /// KV cache group.
    pub group_idx: Option<i64>,
    /// `"LOCAL"` or `"REMOTE"`.
    pub locality: Option<String>,
    /// Secondary offloading tier identifier.
    pub ownership: Option<String>,
}

/// One KV cache event.
#[derive(Debug, Clone, PartialEq)]
pub enum KvEvent {
    /// Blocks were stored (boxed: it is much larger than the other variants).
    BlockStored(Box<BlockStored>),
    /// Blocks were removed.
    BlockRemoved(BlockRemoved),
    /// The whole prefix cache was reset: drop everything known about this engine.
    AllBlocksCleared,
}

/// One decoded `KVEventBatch`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct KvEventBatch {
    /// Publisher timestamp (seconds since the epoch).
    pub ts: f64,
    /// The known events, in order.
    pub events: Vec<KvEvent>,
    /// The publishing engine's data-parallel rank.
    pub dp_rank: Option<i64>,
    /// Events of unknown type that were skipped.
    pub unknown_events: usize,
}

/// Limits and policy for decoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeOptions {
    /// Most events in one batch.
    pub max_events: usize,
    /// Most block hashes (and extra-key entries) in one event.
    pub max_block_hashes: usize,
    /// Most token ids in one event (and in one lookahead list).
    pub max_token_ids: usize,
    /// Deepest nesting of containers inside one block's extra keys.
    pub max_depth: usize,
    /// Fail on unknown event types instead of skipping and counting them.
    pub reject_unknown_events: bool,
}

impl DecodeOptions {
    /// The defaults, as a constant (what [`Default`] returns).
    pub const DEFAULT: Self = Self {
        max_events: 1 << 20,
        max_block_hashes: 1 << 20,
        max_token_ids: 1 << 24,
        max_depth: 8,
        reject_unknown_events: false,
    };
}

impl Default for DecodeOptions {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// Decodes one `KVEventBatch` payload with [`DecodeOptions::default`].
pub fn decode_batch(payload: &[u8]) -> Result<KvEventBatch, DecodeError> {
    DecodeOptions::default().decode_batch(payload)
}

/// The reusable decoding buffers of the ingestor (see [`decode_reusing`]).
#[doc(hidden)]
#[derive(Debug, Default)]
pub struct DecodeBuffers(RawBatch);

/// Decodes `payload` as the ingestor does — into reusable buffers, without building the owned
/// [`KvEventBatch`] — and returns the number of known events. Accepts and rejects exactly
/// what [`DecodeOptions::decode_batch`] does. For benchmarks; not a stable API.
#[doc(hidden)]
pub fn decode_reusing(
    options: &DecodeOptions,
    payload: &[u8],
    buffers: &mut DecodeBuffers,
) -> Result<usize, DecodeError> {
    options.decode_raw(payload, &mut buffers.0)?;
    Ok(buffers.0.events.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medium_is_case_insensitive() {
        assert_eq!(Medium::parse("cpu"), Medium::Cpu);
        assert_eq!(Medium::parse("Storage"), Medium::Storage);
        assert_eq!(Medium::parse("cuda:0"), Medium::Other("cuda:0".into()));
        assert_eq!(Medium::parse("cuda:0").as_str(), "cuda:0");
        assert_eq!(Medium::Gpu.as_str(), "GPU");
    }

    #[test]
    fn external_hash_forms_agree() {
        let digest = BlockDigest::from_bytes(&[0xab; 32]).unwrap();
        let int = ExternalBlockHash::from(&digest);
        let bytes = ExternalBlockHash::Bytes(vec![0xab; 32]);
        assert!(int.matches(&digest) && bytes.matches(&digest));
        assert_eq!(int.to_u64(), bytes.to_u64());
        assert!(!ExternalBlockHash::Bytes(vec![0xab; 16]).matches(&digest));
    }

    #[test]
    fn error_kinds_are_stable_labels() {
        assert_eq!(DecodeError::Truncated { offset: 0 }.kind(), "truncated");
        assert_eq!(DecodeError::BadDelimiter.kind(), "bad_delimiter");
        assert_eq!(
            DecodeError::UnknownEventType(String::new()).kind(),
            "unknown_event_type"
        );
    }
}
