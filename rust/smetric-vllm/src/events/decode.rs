//! The decoder behind [`DecodeOptions::decode_batch`]: one streaming pass over the msgpack
//! payload into a [`RawBatch`], then (for the public, owned API) into a [`KvEventBatch`].
//!
//! A [`RawBatch`] keeps every event's block hashes and token ids in flat buffers shared by the
//! batch, and its strings, extra keys and unusual hash forms as byte ranges of the payload.
//! Its buffers are reused from batch to batch (up to 1 MiB each), so the ingestor, which applies
//! the raw form directly, decodes a batch without allocating once they have grown.
//!
//! # Algorithm
//! A batch is `[ts, events, rank?]` (a map with the same keys is accepted too). Each event is
//! decoded by kind: the tag is the first element of an array-form event, or the `"type"` key
//! of a map-form event (looked up by a separate scan in the rare case it is not the first
//! key). Fields are matched positionally (array form, declaration order) or by key (map form)
//! against one table per kind, so both forms share every field reader. Keys and tags are
//! compared as bytes; only a string that matches no known (ASCII) name is validated as UTF-8,
//! so the errors are those of validating every string.
//!
//! # Invariants
//! Every length is checked against the remaining input and the configured limits before any
//! allocation; unknown keys and surplus positional fields are skipped without interpretation.
//! Everything a [`RawBatch`] refers to was validated while decoding: converting it to the
//! owned form re-reads only validated bytes.
//!
//! # Complexity
//! O(payload size).

use std::ops::Range;

use super::value::{check_value, read_value};
use super::{
    BlockExtraKeys, BlockRemoved, BlockStored, DecodeError, DecodeOptions, ExternalBlockHash, KvEvent, KvEventBatch,
    Medium,
};
use crate::hash::event_hash;
use crate::msgpack::{ReadError, Reader, check_utf8};

/// A byte range of the payload a [`RawBatch`] was decoded from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Span {
    start: usize,
    end: usize,
}

impl Span {
    /// The bytes of the range (empty if `payload` is not the decoded one).
    pub(crate) fn bytes(self, payload: &[u8]) -> &[u8] {
        payload.get(self.start..self.end).unwrap_or_default()
    }

    /// The string of the range (validated while decoding).
    pub(crate) fn str(self, payload: &[u8]) -> &str {
        std::str::from_utf8(self.bytes(payload)).unwrap_or_default()
    }

    fn string(self, payload: &[u8]) -> String {
        String::from_utf8_lossy(self.bytes(payload)).into_owned()
    }
}

/// A block hash: its 64-bit key ([`ExternalBlockHash::to_u64`]) and, for the bytes form, where
/// the bytes are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RawHash {
    pub(crate) key: u64,
    bytes: Option<Span>,
}

impl RawHash {
    fn external(self, payload: &[u8]) -> ExternalBlockHash {
        match self.bytes {
            None => ExternalBlockHash::Int(self.key),
            Some(span) => ExternalBlockHash::Bytes(span.bytes(payload).to_vec()),
        }
    }
}

/// [`Medium`] with the verbatim string of `Other` left in the payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RawMedium {
    Gpu,
    Cpu,
    Storage,
    Other(Span),
}

impl RawMedium {
    fn owned(self, payload: &[u8]) -> Medium {
        match self {
            Self::Gpu => Medium::Gpu,
            Self::Cpu => Medium::Cpu,
            Self::Storage => Medium::Storage,
            Self::Other(span) => Medium::Other(span.string(payload)),
        }
    }
}

/// The event types the decoder knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Kind {
    Stored,
    Removed,
    #[default]
    Cleared,
}

/// One event of a [`RawBatch`]: [`BlockStored`] (every field) or [`BlockRemoved`] (its
/// fields), ranges pointing into the batch's buffers or the payload.
#[derive(Debug, Clone, Default)]
pub(crate) struct RawEvent {
    pub(crate) kind: Kind,
    /// Into [`RawBatch::hashes`].
    hashes: Range<usize>,
    pub(crate) parent: Option<RawHash>,
    /// Into [`RawBatch::tokens`].
    tokens: Range<usize>,
    pub(crate) block_size: u32,
    lora_id: Option<i64>,
    pub(crate) medium: Option<RawMedium>,
    pub(crate) lora_name: Option<Span>,
    /// The (validated) msgpack array of per-block extra keys.
    pub(crate) extra_keys: Option<Span>,
    pub(crate) group_idx: Option<i64>,
    spec_kind: Option<Span>,
    sliding_window: Option<i64>,
    locality: Option<Span>,
    ownership: Option<Span>,
    session_id: Option<Span>,
    /// Into [`RawBatch::lists`].
    lookahead: Option<Range<usize>>,
}

/// A decoded `KVEventBatch` in reusable flat buffers; see the module documentation.
#[derive(Debug, Clone, Default)]
pub(crate) struct RawBatch {
    pub(crate) ts: f64,
    pub(crate) dp_rank: Option<i64>,
    pub(crate) unknown_events: usize,
    pub(crate) events: Vec<RawEvent>,
    data: Arena,
}

/// The variable-length parts of a [`RawBatch`]'s events.
#[derive(Debug, Clone, Default)]
struct Arena {
    hashes: Vec<RawHash>,
    tokens: Vec<u32>,
    /// Lookahead token lists, as ranges of `tokens`.
    lists: Vec<Range<usize>>,
}

/// Buffers above this many bytes are freed rather than kept for the next batch, so one huge
/// batch does not pin its memory.
const KEEP_BYTES: usize = 1 << 20;

/// Empties `v`, keeping its allocation unless it is above [`KEEP_BYTES`].
pub(crate) fn reuse<T>(v: &mut Vec<T>) {
    if v.capacity() * size_of::<T>() > KEEP_BYTES {
        *v = Vec::new();
    } else {
        v.clear();
    }
}

impl RawBatch {
    fn clear(&mut self) {
        self.ts = 0.0;
        self.dp_rank = None;
        self.unknown_events = 0;
        reuse(&mut self.events);
        reuse(&mut self.data.hashes);
        reuse(&mut self.data.tokens);
        reuse(&mut self.data.lists);
    }

    /// The block hashes of `event`.
    pub(crate) fn hashes(&self, event: &RawEvent) -> &[RawHash] {
        self.data.hashes.get(event.hashes.clone()).unwrap_or_default()
    }

    /// The token ids of `event`.
    pub(crate) fn tokens(&self, event: &RawEvent) -> &[u32] {
        self.data.tokens.get(event.tokens.clone()).unwrap_or_default()
    }

    /// The owned form, for the `payload` this batch was decoded from.
    fn to_batch(&self, payload: &[u8], options: &DecodeOptions) -> Result<KvEventBatch, DecodeError> {
        let mut events = Vec::with_capacity(self.events.len());
        for e in &self.events {
            events.push(self.to_event(e, payload, options)?);
        }
        Ok(KvEventBatch {
            ts: self.ts,
            events,
            dp_rank: self.dp_rank,
            unknown_events: self.unknown_events,
        })
    }

    fn to_event(&self, e: &RawEvent, payload: &[u8], options: &DecodeOptions) -> Result<KvEvent, DecodeError> {
        let hashes = || self.hashes(e).iter().map(|h| h.external(payload)).collect();
        let string = |s: Option<Span>| s.map(|s| s.string(payload));
        let medium = e.medium.map(|m| m.owned(payload));
        Ok(match e.kind {
            Kind::Cleared => KvEvent::AllBlocksCleared,
            Kind::Removed => KvEvent::BlockRemoved(BlockRemoved {
                block_hashes: hashes(),
                medium,
                group_idx: e.group_idx,
                locality: string(e.locality),
                ownership: string(e.ownership),
            }),
            Kind::Stored => {
                let extra_keys = match e.extra_keys {
                    None => None,
                    Some(span) => {
                        // Validated while decoding, so this re-read cannot fail.
                        let mut r = Reader::new(payload);
                        r.set_pos(span.start);
                        Some(options.extra_keys(&mut r)?)
                    }
                };
                let lists = |r: &Range<usize>| self.data.lists.get(r.clone()).unwrap_or_default();
                let list = |l: &Range<usize>| self.data.tokens.get(l.clone()).unwrap_or_default().to_vec();
                KvEvent::BlockStored(Box::new(BlockStored {
                    block_hashes: hashes(),
                    parent_block_hash: e.parent.map(|h| h.external(payload)),
                    token_ids: self.tokens(e).to_vec(),
                    block_size: e.block_size,
                    lora_id: e.lora_id,
                    medium,
                    lora_name: string(e.lora_name),
                    extra_keys,
                    group_idx: e.group_idx,
                    kv_cache_spec_kind: string(e.spec_kind),
                    kv_cache_spec_sliding_window: e.sliding_window,
                    locality: string(e.locality),
                    ownership: string(e.ownership),
                    session_id: string(e.session_id),
                    lookahead_token_ids: e.lookahead.as_ref().map(|r| lists(r).iter().map(list).collect()),
                }))
            }
        })
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Field {
    BlockHashes,
    Parent,
    TokenIds,
    BlockSize,
    LoraId,
    Medium,
    LoraName,
    ExtraKeys,
    GroupIdx,
    SpecKind,
    SlidingWindow,
    Locality,
    Ownership,
    SessionId,
    Lookahead,
}

/// `BlockStored` fields in declaration order (the ≤0.23 array layout).
const STORED_FIELDS: [Field; 15] = [
    Field::BlockHashes,
    Field::Parent,
    Field::TokenIds,
    Field::BlockSize,
    Field::LoraId,
    Field::Medium,
    Field::LoraName,
    Field::ExtraKeys,
    Field::GroupIdx,
    Field::SpecKind,
    Field::SlidingWindow,
    Field::Locality,
    Field::Ownership,
    Field::SessionId,
    Field::Lookahead,
];

/// `BlockRemoved` fields in declaration order.
const REMOVED_FIELDS: [Field; 5] = [
    Field::BlockHashes,
    Field::Medium,
    Field::GroupIdx,
    Field::Locality,
    Field::Ownership,
];

impl Field {
    /// The field of a map key (`BlockStored`'s field names; `BlockRemoved` has a subset).
    /// Dispatches on the length, so a key costs about one fixed-size comparison.
    fn from_key(key: &[u8]) -> Option<Self> {
        Some(match key.len() {
            6 if key == b"medium" => Self::Medium,
            7 if key == b"lora_id" => Self::LoraId,
            8 if key == b"locality" => Self::Locality,
            9 if key == b"token_ids" => Self::TokenIds,
            9 if key == b"group_idx" => Self::GroupIdx,
            9 if key == b"lora_name" => Self::LoraName,
            9 if key == b"ownership" => Self::Ownership,
            10 if key == b"block_size" => Self::BlockSize,
            10 if key == b"extra_keys" => Self::ExtraKeys,
            10 if key == b"session_id" => Self::SessionId,
            12 if key == b"block_hashes" => Self::BlockHashes,
            17 if key == b"parent_block_hash" => Self::Parent,
            18 if key == b"kv_cache_spec_kind" => Self::SpecKind,
            19 if key == b"lookahead_token_ids" => Self::Lookahead,
            28 if key == b"kv_cache_spec_sliding_window" => Self::SlidingWindow,
            _ => return None,
        })
    }

    /// Bit of the field in [`Kind::mask`].
    const fn bit(self) -> u16 {
        1 << self as u16
    }
}

impl Kind {
    fn from_tag(tag: &[u8]) -> Option<Self> {
        match tag.len() {
            11 if tag == b"BlockStored" => Some(Self::Stored),
            12 if tag == b"BlockRemoved" => Some(Self::Removed),
            16 if tag == b"AllBlocksCleared" => Some(Self::Cleared),
            _ => None,
        }
    }

    /// The fields of the kind, as [`Field::bit`]s.
    fn mask(self) -> u16 {
        const fn mask(fields: &[Field]) -> u16 {
            let (mut mask, mut i) = (0, 0);
            while i < fields.len() {
                mask |= fields[i].bit();
                i += 1;
            }
            mask
        }
        const STORED: u16 = mask(&STORED_FIELDS);
        const REMOVED: u16 = mask(&REMOVED_FIELDS);
        match self {
            Self::Stored => STORED,
            Self::Removed => REMOVED,
            Self::Cleared => 0,
        }
    }

    fn fields(self) -> &'static [Field] {
        match self {
            Self::Stored => &STORED_FIELDS,
            Self::Removed => &REMOVED_FIELDS,
            Self::Cleared => &[],
        }
    }
}

/// Required fields seen so far.
#[derive(Default)]
struct Seen {
    block_hashes: bool,
    token_ids: bool,
    block_size: bool,
}

/// A string read by [`Reader::str_bytes`], not validated yet.
type RawStr<'a> = (usize, &'a [u8]);

impl DecodeOptions {
    /// Decodes one `KVEventBatch` payload (the last frame of a PUB message).
    pub fn decode_batch(&self, payload: &[u8]) -> Result<KvEventBatch, DecodeError> {
        let mut raw = RawBatch::default();
        self.decode_raw(payload, &mut raw)?;
        raw.to_batch(payload, self)
    }

    /// Decodes one payload into `out`, reusing its buffers. On error `out` holds garbage.
    pub(crate) fn decode_raw(&self, payload: &[u8], out: &mut RawBatch) -> Result<(), DecodeError> {
        out.clear();
        let mut r = Reader::new(payload);
        self.batch(&mut r, out)?;
        if r.remaining() > 0 {
            return Err(DecodeError::TrailingBytes { extra: r.remaining() });
        }
        Ok(())
    }

    fn batch(&self, r: &mut Reader<'_>, out: &mut RawBatch) -> Result<(), DecodeError> {
        if matches!(r.peek()?, 0x80..=0x8f | 0xde | 0xdf) {
            // Not what vLLM sends, but a map-encoded batch is unambiguous, so accept it.
            let (mut has_ts, mut has_events) = (false, false);
            for _ in 0..r.map_len()? {
                match r.str()? {
                    "ts" => (out.ts, has_ts) = (r.float()?, true),
                    "events" => {
                        self.events(r, out)?;
                        has_events = true;
                    }
                    "data_parallel_rank" => {
                        out.dp_rank = opt(r, |r| Ok(r.int_as("data_parallel_rank")?))?;
                    }
                    _ => r.skip()?,
                }
            }
            require(has_ts, "KVEventBatch", "ts")?;
            require(has_events, "KVEventBatch", "events")?;
            return Ok(());
        }
        let n = r.array_len()?;
        require(n >= 1, "KVEventBatch", "ts")?;
        require(n >= 2, "KVEventBatch", "events")?;
        out.ts = r.float()?;
        self.events(r, out)?;
        if n >= 3 {
            out.dp_rank = opt(r, |r| Ok(r.int_as("data_parallel_rank")?))?;
        }
        for _ in 3..n {
            r.skip()?;
        }
        Ok(())
    }

    fn events(&self, r: &mut Reader<'_>, out: &mut RawBatch) -> Result<(), DecodeError> {
        let n = bounded_array(r, "events", self.max_events)?;
        out.events.reserve(n);
        for _ in 0..n {
            // Decoded in place; an unknown event type takes its slot back.
            out.events.push(RawEvent::default());
            let RawBatch { events, data, .. } = &mut *out;
            let known = match events.last_mut() {
                Some(event) => self.event(r, event, data)?,
                None => false,
            };
            if !known {
                out.events.pop();
                out.unknown_events += 1;
            }
        }
        Ok(())
    }

    /// Decodes one event into `e`; `Ok(false)` for a skipped unknown type.
    fn event(&self, r: &mut Reader<'_>, e: &mut RawEvent, data: &mut Arena) -> Result<bool, DecodeError> {
        let mut seen = Seen::default();
        let kind;
        if matches!(r.peek()?, 0x80..=0x8f | 0xde | 0xdf) {
            let n = r.map_len()?;
            let start = r.pos();
            let mut first = None;
            if n > 0 {
                let (at, key) = r.str_bytes()?;
                if key == b"type" {
                    first = Some(r.str_bytes()?);
                } else {
                    check_utf8(at, key)?;
                }
            }
            let tag = if let Some(tag) = first {
                tag
            } else {
                r.set_pos(start);
                let tag = find_type(r, n)?;
                r.set_pos(start);
                tag
            };
            let Some(k) = self.known_kind(tag)? else {
                r.set_pos(start);
                for _ in 0..2 * n {
                    r.skip()?;
                }
                return Ok(false);
            };
            kind = k;
            let mask = kind.mask();
            // The loop re-reads the "type" pair when it was not first; it is skipped below.
            let pairs = if r.pos() == start { n } else { n - 1 };
            for _ in 0..pairs {
                let (at, key) = r.str_bytes()?;
                if let Some(field) = Field::from_key(key).filter(|f| mask & f.bit() != 0) {
                    self.field(r, field, e, &mut seen, data)?;
                } else {
                    check_utf8(at, key)?;
                    r.skip()?;
                }
            }
        } else {
            let n = r.array_len()?;
            require(n >= 1, "event", "type")?;
            let tag = r.str_bytes()?;
            let Some(k) = self.known_kind(tag)? else {
                for _ in 1..n {
                    r.skip()?;
                }
                return Ok(false);
            };
            kind = k;
            for i in 0..n - 1 {
                match kind.fields().get(i) {
                    Some(&field) => self.field(r, field, e, &mut seen, data)?,
                    None => r.skip()?,
                }
            }
        }
        e.kind = kind;
        require_fields(kind, &seen)?;
        Ok(true)
    }

    fn known_kind(&self, (at, tag): RawStr<'_>) -> Result<Option<Kind>, DecodeError> {
        if let Some(kind) = Kind::from_tag(tag) {
            return Ok(Some(kind));
        }
        check_utf8(at, tag)?;
        if self.reject_unknown_events {
            return Err(DecodeError::UnknownEventType(String::from_utf8_lossy(tag).into_owned()));
        }
        Ok(None)
    }

    #[allow(
        clippy::inline_always,
        reason = "one call per key otherwise (-3% instructions per event, measured)"
    )]
    #[inline(always)]
    fn field(
        &self,
        r: &mut Reader<'_>,
        field: Field,
        e: &mut RawEvent,
        seen: &mut Seen,
        out: &mut Arena,
    ) -> Result<(), DecodeError> {
        match field {
            Field::BlockHashes => {
                let n = bounded_array(r, "block_hashes", self.max_block_hashes)?;
                let start = out.hashes.len();
                out.hashes.reserve(n);
                for _ in 0..n {
                    out.hashes.push(block_hash(r)?);
                }
                e.hashes = start..out.hashes.len();
                seen.block_hashes = true;
            }
            Field::Parent => e.parent = opt(r, block_hash)?,
            Field::TokenIds => {
                e.tokens = self.token_ids(r, &mut out.tokens)?;
                seen.token_ids = true;
            }
            Field::BlockSize => {
                e.block_size = r.int_as("block_size")?;
                seen.block_size = true;
            }
            Field::LoraId => e.lora_id = opt(r, |r| Ok(r.int_as("lora_id")?))?,
            Field::Medium => e.medium = opt(r, medium)?,
            Field::LoraName => e.lora_name = opt(r, string)?,
            Field::ExtraKeys => {
                e.extra_keys = opt(r, |r| {
                    let start = r.pos();
                    self.check_extra_keys(r)?;
                    Ok(Span { start, end: r.pos() })
                })?;
            }
            Field::GroupIdx => e.group_idx = opt(r, |r| Ok(r.int_as("group_idx")?))?,
            Field::SpecKind => e.spec_kind = opt(r, string)?,
            Field::SlidingWindow => e.sliding_window = opt(r, |r| Ok(r.int_as("kv_cache_spec_sliding_window")?))?,
            Field::Locality => e.locality = opt(r, string)?,
            Field::Ownership => e.ownership = opt(r, string)?,
            Field::SessionId => e.session_id = opt(r, string)?,
            Field::Lookahead => {
                e.lookahead = opt(r, |r| {
                    let n = bounded_array(r, "lookahead_token_ids", self.max_block_hashes)?;
                    let start = out.lists.len();
                    for _ in 0..n {
                        let list = self.token_ids(r, &mut out.tokens)?;
                        out.lists.push(list);
                    }
                    Ok(start..out.lists.len())
                })?;
            }
        }
        Ok(())
    }

    /// Appends a token id array to `tokens`; returns its range there.
    fn token_ids(&self, r: &mut Reader<'_>, tokens: &mut Vec<u32>) -> Result<Range<usize>, DecodeError> {
        let n = bounded_array(r, "token_ids", self.max_token_ids)?;
        let start = tokens.len();
        r.u32s_into(n, tokens, "token id")?;
        Ok(start..tokens.len())
    }

    /// Checks `extra_keys` exactly as [`DecodeOptions::extra_keys`] reads it.
    fn check_extra_keys(&self, r: &mut Reader<'_>) -> Result<(), DecodeError> {
        let n = bounded_array(r, "extra_keys", self.max_block_hashes)?;
        for _ in 0..n {
            opt(r, |r| {
                let len = bounded_array(r, "extra_keys entry", self.max_block_hashes)?;
                (0..len).try_for_each(|_| check_value(r, self.max_depth))
            })?;
        }
        Ok(())
    }

    fn extra_keys(&self, r: &mut Reader<'_>) -> Result<Vec<BlockExtraKeys>, DecodeError> {
        let n = bounded_array(r, "extra_keys", self.max_block_hashes)?;
        (0..n)
            .map(|_| {
                opt(r, |r| {
                    let len = bounded_array(r, "extra_keys entry", self.max_block_hashes)?;
                    (0..len).map(|_| read_value(r, self.max_depth)).collect()
                })
            })
            .collect()
    }
}

/// Whether block `i` of an event is plain: its extra keys (`extra`, the raw `extra_keys`
/// array) are absent, empty, or only the LoRA name — nothing smetric's token chain lacks.
/// Returns the number of leading plain blocks among the first `blocks`.
pub(crate) fn plain_prefix(extra: &[u8], lora_name: Option<&[u8]>, blocks: usize) -> usize {
    let mut r = Reader::new(extra);
    // The array was validated while decoding; a failed re-read ends the plain prefix.
    let Ok(n) = r.array_len() else { return 0 };
    for i in 0..blocks.min(n) {
        if !plain_entry(&mut r, lora_name).unwrap_or(false) {
            return i;
        }
    }
    blocks
}

/// Reads one entry of `extra_keys`: `nil`, or an array that is empty or holds only the LoRA name.
fn plain_entry(r: &mut Reader<'_>, lora_name: Option<&[u8]>) -> Result<bool, DecodeError> {
    if r.nil()? {
        return Ok(true);
    }
    match r.array_len()? {
        0 => Ok(true),
        1 if matches!(r.peek()?, 0xa0..=0xbf | 0xd9..=0xdb) => {
            let (_, s) = r.str_bytes()?;
            Ok(lora_name == Some(s))
        }
        len => {
            for _ in 0..len {
                r.skip()?;
            }
            Ok(false)
        }
    }
}

/// Reads an array header, enforcing `limit`.
fn bounded_array(r: &mut Reader<'_>, what: &'static str, limit: usize) -> Result<usize, DecodeError> {
    let len = r.array_len()?;
    if len > limit {
        return Err(DecodeError::TooLarge { what, len, limit });
    }
    Ok(len)
}

/// Scans a map's `n` pairs for the `"type"` tag without interpreting other values.
fn find_type<'a>(r: &mut Reader<'a>, n: usize) -> Result<RawStr<'a>, DecodeError> {
    let mut tag = None;
    for _ in 0..n {
        let (at, key) = r.str_bytes()?;
        check_utf8(at, key)?;
        if key == b"type" {
            let (at, value) = r.str_bytes()?;
            check_utf8(at, value)?;
            tag = Some((at, value));
        } else {
            r.skip()?;
        }
    }
    tag.ok_or(DecodeError::MissingField {
        event: "event",
        field: "type",
    })
}

fn require_fields(kind: Kind, seen: &Seen) -> Result<(), DecodeError> {
    match kind {
        Kind::Stored => {
            require(seen.block_hashes, "BlockStored", "block_hashes")?;
            require(seen.token_ids, "BlockStored", "token_ids")?;
            require(seen.block_size, "BlockStored", "block_size")
        }
        Kind::Removed => require(seen.block_hashes, "BlockRemoved", "block_hashes"),
        Kind::Cleared => Ok(()),
    }
}

fn require(present: bool, event: &'static str, field: &'static str) -> Result<(), DecodeError> {
    if present {
        Ok(())
    } else {
        Err(DecodeError::MissingField { event, field })
    }
}

/// `nil` → `None`, else `read`.
fn opt<'a, T>(
    r: &mut Reader<'a>,
    read: impl FnOnce(&mut Reader<'a>) -> Result<T, DecodeError>,
) -> Result<Option<T>, DecodeError> {
    if r.nil()? { Ok(None) } else { read(r).map(Some) }
}

/// A validated string, as its range.
fn string(r: &mut Reader<'_>) -> Result<Span, DecodeError> {
    let (at, bytes) = r.str_bytes()?;
    check_utf8(at, bytes)?;
    Ok(Span {
        start: r.pos() - bytes.len(),
        end: r.pos(),
    })
}

/// A `medium` string, classified as [`Medium::parse`] does.
fn medium(r: &mut Reader<'_>) -> Result<RawMedium, DecodeError> {
    let (at, bytes) = r.str_bytes()?;
    Ok(if bytes.eq_ignore_ascii_case(b"gpu") {
        RawMedium::Gpu
    } else if bytes.eq_ignore_ascii_case(b"cpu") {
        RawMedium::Cpu
    } else if bytes.eq_ignore_ascii_case(b"storage") {
        RawMedium::Storage
    } else {
        check_utf8(at, bytes)?;
        RawMedium::Other(Span {
            start: r.pos() - bytes.len(),
            end: r.pos(),
        })
    })
}

fn block_hash(r: &mut Reader<'_>) -> Result<RawHash, DecodeError> {
    let at = r.pos();
    // vLLM's 64-bit hashes are uint64 (0xcf) but for one in 2^32.
    if let Some(key) = r.uint64()? {
        return Ok(RawHash { key, bytes: None });
    }
    if let Some(bytes) = r.bin_opt()? {
        return Ok(RawHash {
            key: event_hash(bytes),
            bytes: Some(Span {
                start: r.pos() - bytes.len(),
                end: r.pos(),
            }),
        });
    }
    match r.int() {
        // Keep the low 64 bits: identity for u64, two's complement for negative i64.
        Ok(v) => Ok(RawHash {
            key: v as u64,
            bytes: None,
        }),
        Err(ReadError::WrongType { marker, .. }) => Err(DecodeError::WrongType {
            expected: "block hash (int or bytes)",
            marker,
            offset: at,
        }),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests;
