//! The decoder behind [`DecodeOptions::decode_batch`]: one streaming pass over the msgpack
//! payload straight into the typed events (no intermediate value tree).
//!
//! # Algorithm
//! A batch is `[ts, events, rank?]` (a map with the same keys is accepted too). Each event is
//! decoded by kind: the tag is the first element of an array-form event, or the `"type"` key
//! of a map-form event (looked up by a separate scan in the rare case it is not the first
//! key). Fields are matched positionally (array form, declaration order) or by key (map form)
//! against one table per kind, so both forms share every field reader.
//!
//! # Invariants
//! Every length is checked against the remaining input and the configured limits before any
//! allocation; unknown keys and surplus positional fields are skipped without interpretation.
//!
//! # Complexity
//! O(payload size).

use super::{
    BlockExtraKeys, BlockRemoved, BlockStored, DecodeError, DecodeOptions, ExternalBlockHash, KvEvent, KvEventBatch,
    Medium,
};
use crate::msgpack::Reader;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Stored,
    Removed,
    Cleared,
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

/// `BlockStored` fields in declaration order (the ≤0.23 array layout) with their map keys.
const STORED_FIELDS: [(Field, &str); 15] = [
    (Field::BlockHashes, "block_hashes"),
    (Field::Parent, "parent_block_hash"),
    (Field::TokenIds, "token_ids"),
    (Field::BlockSize, "block_size"),
    (Field::LoraId, "lora_id"),
    (Field::Medium, "medium"),
    (Field::LoraName, "lora_name"),
    (Field::ExtraKeys, "extra_keys"),
    (Field::GroupIdx, "group_idx"),
    (Field::SpecKind, "kv_cache_spec_kind"),
    (Field::SlidingWindow, "kv_cache_spec_sliding_window"),
    (Field::Locality, "locality"),
    (Field::Ownership, "ownership"),
    (Field::SessionId, "session_id"),
    (Field::Lookahead, "lookahead_token_ids"),
];

const REMOVED_FIELDS: [(Field, &str); 5] = [
    (Field::BlockHashes, "block_hashes"),
    (Field::Medium, "medium"),
    (Field::GroupIdx, "group_idx"),
    (Field::Locality, "locality"),
    (Field::Ownership, "ownership"),
];

impl Kind {
    fn from_tag(tag: &str) -> Option<Self> {
        match tag {
            "BlockStored" => Some(Self::Stored),
            "BlockRemoved" => Some(Self::Removed),
            "AllBlocksCleared" => Some(Self::Cleared),
            _ => None,
        }
    }

    fn fields(self) -> &'static [(Field, &'static str)] {
        match self {
            Self::Stored => &STORED_FIELDS,
            Self::Removed => &REMOVED_FIELDS,
            Self::Cleared => &[],
        }
    }
}

/// Fields seen so far; `None` = absent.
#[derive(Default)]
struct Fields {
    stored: BlockStored,
    has_block_hashes: bool,
    has_token_ids: bool,
    has_block_size: bool,
}

impl DecodeOptions {
    /// Decodes one `KVEventBatch` payload (the last frame of a PUB message).
    pub fn decode_batch(&self, payload: &[u8]) -> Result<KvEventBatch, DecodeError> {
        let mut r = Reader::new(payload);
        let batch = self.batch(&mut r)?;
        if r.remaining() > 0 {
            return Err(DecodeError::TrailingBytes { extra: r.remaining() });
        }
        Ok(batch)
    }

    fn batch(&self, r: &mut Reader<'_>) -> Result<KvEventBatch, DecodeError> {
        let mut batch = KvEventBatch::default();
        if matches!(r.peek()?, 0x80..=0x8f | 0xde | 0xdf) {
            // Not what vLLM sends, but a map-encoded batch is unambiguous, so accept it.
            let (mut has_ts, mut has_events) = (false, false);
            for _ in 0..r.map_len()? {
                match r.str()? {
                    "ts" => (batch.ts, has_ts) = (r.float()?, true),
                    "events" => {
                        self.events(r, &mut batch)?;
                        has_events = true;
                    }
                    "data_parallel_rank" => {
                        batch.dp_rank = opt(r, |r| r.int_as("data_parallel_rank"))?;
                    }
                    _ => r.skip()?,
                }
            }
            require(has_ts, "KVEventBatch", "ts")?;
            require(has_events, "KVEventBatch", "events")?;
            return Ok(batch);
        }
        let n = r.array_len()?;
        require(n >= 1, "KVEventBatch", "ts")?;
        require(n >= 2, "KVEventBatch", "events")?;
        batch.ts = r.float()?;
        self.events(r, &mut batch)?;
        if n >= 3 {
            batch.dp_rank = opt(r, |r| r.int_as("data_parallel_rank"))?;
        }
        for _ in 3..n {
            r.skip()?;
        }
        Ok(batch)
    }

    fn events(&self, r: &mut Reader<'_>, batch: &mut KvEventBatch) -> Result<(), DecodeError> {
        let n = bounded_array(r, "events", self.max_events)?;
        batch.events.reserve(n);
        for _ in 0..n {
            match self.event(r)? {
                Some(event) => batch.events.push(event),
                None => batch.unknown_events += 1,
            }
        }
        Ok(())
    }

    /// Decodes one event; `Ok(None)` for a skipped unknown type.
    fn event(&self, r: &mut Reader<'_>) -> Result<Option<KvEvent>, DecodeError> {
        let mut fields = Fields::default();
        let kind;
        if matches!(r.peek()?, 0x80..=0x8f | 0xde | 0xdf) {
            let n = r.map_len()?;
            let start = r.pos();
            let tag = if n > 0 && r.str()? == "type" {
                r.str()?
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
                return Ok(None);
            };
            kind = k;
            // The loop re-reads the "type" pair when it was not first; it is skipped below.
            let pairs = if r.pos() == start { n } else { n - 1 };
            for _ in 0..pairs {
                let key = r.str()?;
                match kind.fields().iter().find(|(_, name)| *name == key) {
                    Some(&(field, _)) => self.field(r, field, &mut fields)?,
                    None => r.skip()?,
                }
            }
        } else {
            let n = r.array_len()?;
            require(n >= 1, "event", "type")?;
            let tag = r.str()?;
            let Some(k) = self.known_kind(tag)? else {
                for _ in 1..n {
                    r.skip()?;
                }
                return Ok(None);
            };
            kind = k;
            for i in 0..n - 1 {
                match kind.fields().get(i) {
                    Some(&(field, _)) => self.field(r, field, &mut fields)?,
                    None => r.skip()?,
                }
            }
        }
        build(kind, fields).map(Some)
    }

    fn known_kind(&self, tag: &str) -> Result<Option<Kind>, DecodeError> {
        match Kind::from_tag(tag) {
            Some(kind) => Ok(Some(kind)),
            None if self.reject_unknown_events => Err(DecodeError::UnknownEventType(tag.to_owned())),
            None => Ok(None),
        }
    }

    fn field(&self, r: &mut Reader<'_>, field: Field, f: &mut Fields) -> Result<(), DecodeError> {
        let s = &mut f.stored;
        match field {
            Field::BlockHashes => {
                let n = bounded_array(r, "block_hashes", self.max_block_hashes)?;
                s.block_hashes = (0..n).map(|_| block_hash(r)).collect::<Result<_, _>>()?;
                f.has_block_hashes = true;
            }
            Field::Parent => s.parent_block_hash = opt(r, block_hash)?,
            Field::TokenIds => {
                s.token_ids = self.token_ids(r)?;
                f.has_token_ids = true;
            }
            Field::BlockSize => {
                s.block_size = r.int_as("block_size")?;
                f.has_block_size = true;
            }
            Field::LoraId => s.lora_id = opt(r, |r| r.int_as("lora_id"))?,
            Field::Medium => s.medium = opt(r, |r| r.str().map(Medium::parse))?,
            Field::LoraName => s.lora_name = opt_string(r)?,
            Field::ExtraKeys => s.extra_keys = opt(r, |r| self.extra_keys(r))?,
            Field::GroupIdx => s.group_idx = opt(r, |r| r.int_as("group_idx"))?,
            Field::SpecKind => s.kv_cache_spec_kind = opt_string(r)?,
            Field::SlidingWindow => {
                s.kv_cache_spec_sliding_window = opt(r, |r| r.int_as("kv_cache_spec_sliding_window"))?;
            }
            Field::Locality => s.locality = opt_string(r)?,
            Field::Ownership => s.ownership = opt_string(r)?,
            Field::SessionId => s.session_id = opt_string(r)?,
            Field::Lookahead => {
                s.lookahead_token_ids = opt(r, |r| {
                    let n = bounded_array(r, "lookahead_token_ids", self.max_block_hashes)?;
                    (0..n).map(|_| self.token_ids(r)).collect()
                })?;
            }
        }
        Ok(())
    }

    fn token_ids(&self, r: &mut Reader<'_>) -> Result<Vec<u32>, DecodeError> {
        let n = bounded_array(r, "token_ids", self.max_token_ids)?;
        (0..n).map(|_| r.int_as("token id")).collect()
    }

    fn extra_keys(&self, r: &mut Reader<'_>) -> Result<Vec<BlockExtraKeys>, DecodeError> {
        let n = bounded_array(r, "extra_keys", self.max_block_hashes)?;
        (0..n)
            .map(|_| {
                opt(r, |r| {
                    let len = bounded_array(r, "extra_keys entry", self.max_block_hashes)?;
                    (0..len).map(|_| r.value(self.max_depth)).collect()
                })
            })
            .collect()
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
fn find_type<'a>(r: &mut Reader<'a>, n: usize) -> Result<&'a str, DecodeError> {
    let mut tag = None;
    for _ in 0..n {
        if r.str()? == "type" {
            tag = Some(r.str()?);
        } else {
            r.skip()?;
        }
    }
    tag.ok_or(DecodeError::MissingField {
        event: "event",
        field: "type",
    })
}

fn build(kind: Kind, f: Fields) -> Result<KvEvent, DecodeError> {
    match kind {
        Kind::Stored => {
            require(f.has_block_hashes, "BlockStored", "block_hashes")?;
            require(f.has_token_ids, "BlockStored", "token_ids")?;
            require(f.has_block_size, "BlockStored", "block_size")?;
            Ok(KvEvent::BlockStored(Box::new(f.stored)))
        }
        Kind::Removed => {
            require(f.has_block_hashes, "BlockRemoved", "block_hashes")?;
            let s = f.stored;
            Ok(KvEvent::BlockRemoved(BlockRemoved {
                block_hashes: s.block_hashes,
                medium: s.medium,
                group_idx: s.group_idx,
                locality: s.locality,
                ownership: s.ownership,
            }))
        }
        Kind::Cleared => Ok(KvEvent::AllBlocksCleared),
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

fn opt_string(r: &mut Reader<'_>) -> Result<Option<String>, DecodeError> {
    opt(r, |r| r.str().map(str::to_owned))
}

fn block_hash(r: &mut Reader<'_>) -> Result<ExternalBlockHash, DecodeError> {
    if let Some(bytes) = r.bin_opt()? {
        return Ok(ExternalBlockHash::Bytes(bytes.to_vec()));
    }
    let at = r.pos();
    match r.int() {
        // Keep the low 64 bits: identity for u64, two's complement for negative i64.
        Ok(v) => Ok(ExternalBlockHash::Int(v as u64)),
        Err(DecodeError::WrongType { marker, .. }) => Err(DecodeError::WrongType {
            expected: "block hash (int or bytes)",
            marker,
            offset: at,
        }),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::decode_batch;

    /// A tiny msgpack writer for hand-made inputs.
    #[derive(Default)]
    struct Mp(Vec<u8>);

    impl Mp {
        fn arr(mut self, n: u8) -> Self {
            assert!(n < 16);
            self.0.push(0x90 | n);
            self
        }
        fn map(mut self, n: u8) -> Self {
            assert!(n < 16);
            self.0.push(0x80 | n);
            self
        }
        fn s(mut self, s: &str) -> Self {
            self.0.push(0xd9);
            self.0.push(u8::try_from(s.len()).unwrap());
            self.0.extend_from_slice(s.as_bytes());
            self
        }
        fn u(mut self, v: u64) -> Self {
            self.0.push(0xcf);
            self.0.extend_from_slice(&v.to_be_bytes());
            self
        }
        fn i(mut self, v: i64) -> Self {
            self.0.push(0xd3);
            self.0.extend_from_slice(&v.to_be_bytes());
            self
        }
        fn nil(mut self) -> Self {
            self.0.push(0xc0);
            self
        }
        fn f(mut self, v: f64) -> Self {
            self.0.push(0xcb);
            self.0.extend_from_slice(&v.to_be_bytes());
            self
        }
        fn bin(mut self, b: &[u8]) -> Self {
            self.0.push(0xc4);
            self.0.push(u8::try_from(b.len()).unwrap());
            self.0.extend_from_slice(b);
            self
        }
        fn raw(mut self, b: &[u8]) -> Self {
            self.0.extend_from_slice(b);
            self
        }
    }

    /// `[ts, [<events>], dp]` header for `n` events; append the events after it.
    fn batch(n: u8) -> Mp {
        Mp::default().arr(3).f(2.5).arr(n)
    }

    fn stored_map(medium: &str) -> Mp {
        batch(1)
            .map(5)
            .s("block_size")
            .u(2)
            .s("type")
            .s("BlockStored")
            .s("block_hashes")
            .arr(2)
            .u(u64::MAX)
            .i(-2)
            .s("token_ids")
            .arr(4)
            .u(1)
            .u(2)
            .u(3)
            .u(u64::from(u32::MAX))
            .s("medium")
            .s(medium)
    }

    #[test]
    fn map_event_with_type_not_first() {
        let b = decode_batch(&stored_map("gPu").u(3).0).unwrap();
        assert_eq!((b.ts, b.dp_rank, b.unknown_events), (2.5, Some(3), 0));
        let KvEvent::BlockStored(s) = &b.events[0] else {
            panic!("{b:?}");
        };
        assert_eq!(
            s.block_hashes,
            [ExternalBlockHash::Int(u64::MAX), ExternalBlockHash::Int(u64::MAX - 1)]
        );
        assert_eq!(s.token_ids, [1, 2, 3, u32::MAX]);
        assert_eq!(s.block_size, 2);
        assert_eq!(s.medium, Some(Medium::Gpu));
        assert_eq!(s.parent_block_hash, None);
    }

    #[test]
    fn array_form_with_trailing_extras_and_two_element_batch() {
        let input = Mp::default()
            .arr(2)
            .f(1.0)
            .arr(2)
            .arr(11)
            .s("BlockStored")
            .arr(1)
            .bin(&[9; 32])
            .bin(&[8; 32])
            .arr(0)
            .u(0)
            .nil()
            .s("STORAGE")
            .nil()
            .arr(1)
            .nil()
            .u(1)
            .s("future-field")
            .arr(1)
            .s("AllBlocksCleared");
        let b = decode_batch(&input.0).unwrap();
        assert_eq!(b.dp_rank, None);
        let KvEvent::BlockStored(s) = &b.events[0] else {
            panic!("{b:?}");
        };
        assert_eq!(s.block_hashes, [ExternalBlockHash::Bytes(vec![9; 32])]);
        assert_eq!(s.parent_block_hash, Some(ExternalBlockHash::Bytes(vec![8; 32])));
        assert_eq!(s.medium, Some(Medium::Storage));
        assert_eq!(s.extra_keys, Some(vec![None]));
        assert_eq!(s.group_idx, Some(1));
        assert_eq!(b.events[1], KvEvent::AllBlocksCleared);
    }

    #[test]
    fn unknown_event_types_are_counted_or_rejected() {
        let input = batch(3)
            .map(2)
            .s("type")
            .s("BlockPinned")
            .s("block_hashes")
            .arr(1)
            .u(1)
            .arr(2)
            .s("BlockTouched")
            .map(0)
            .map(1)
            .s("type")
            .s("AllBlocksCleared")
            .nil();
        let b = decode_batch(&input.0).unwrap();
        assert_eq!((b.unknown_events, b.events.len()), (2, 1));
        let strict = DecodeOptions {
            reject_unknown_events: true,
            ..DecodeOptions::default()
        };
        assert_eq!(
            strict.decode_batch(&input.0),
            Err(DecodeError::UnknownEventType("BlockPinned".into()))
        );
    }

    #[test]
    fn map_batch_and_unknown_keys() {
        let input = Mp::default()
            .map(4)
            .s("events")
            .arr(1)
            .map(3)
            .s("type")
            .s("BlockRemoved")
            .s("new_field")
            .map(1)
            .s("k")
            .arr(0)
            .s("block_hashes")
            .arr(1)
            .u(7)
            .s("ts")
            .f(3.0)
            .s("data_parallel_rank")
            .u(2)
            .s("extra")
            .nil();
        let b = decode_batch(&input.0).unwrap();
        assert_eq!((b.ts, b.dp_rank), (3.0, Some(2)));
        assert_eq!(
            b.events,
            [KvEvent::BlockRemoved(BlockRemoved {
                block_hashes: vec![ExternalBlockHash::Int(7)],
                ..BlockRemoved::default()
            })]
        );
    }

    #[test]
    fn typed_errors() {
        let err = |m: Mp| decode_batch(&m.0).unwrap_err();
        assert_eq!(decode_batch(&[]), Err(DecodeError::Truncated { offset: 0 }));
        assert!(matches!(
            err(batch(1)
                .map(2)
                .s("type")
                .s("BlockRemoved")
                .s("block_hashes")
                .arr(1)
                .s("x")
                .nil()),
            DecodeError::WrongType {
                expected: "block hash (int or bytes)",
                ..
            }
        ));
        let stored = || batch(1).map(4).s("type").s("BlockStored").s("block_hashes").arr(0);
        assert!(matches!(
            err(stored().s("block_size").u(16).s("token_ids").arr(1).i(-1).nil()),
            DecodeError::OutOfRange {
                what: "token id",
                value: -1,
                ..
            }
        ));
        assert!(matches!(
            err(stored().s("block_size").u(16).s("token_ids").arr(1).u(1 << 32).nil()),
            DecodeError::OutOfRange { what: "token id", .. }
        ));
        assert_eq!(
            err(stored().s("block_size").u(16).s("medium").nil().nil()),
            DecodeError::MissingField {
                event: "BlockStored",
                field: "token_ids"
            }
        );
        assert_eq!(
            err(batch(1).map(1).s("block_hashes").arr(0).nil()),
            DecodeError::MissingField {
                event: "event",
                field: "type"
            }
        );
        assert!(matches!(
            err(Mp::default().arr(3).s("ts")),
            DecodeError::WrongType { expected: "float", .. }
        ));
        assert_eq!(
            err(Mp::default().arr(1).f(1.0)),
            DecodeError::MissingField {
                event: "KVEventBatch",
                field: "events"
            }
        );
        assert!(matches!(
            err(batch(1).u(5).nil()),
            DecodeError::WrongType { expected: "array", .. }
        ));
        assert_eq!(err(batch(0).nil().nil()), DecodeError::TrailingBytes { extra: 1 });
    }

    #[test]
    fn hostile_lengths_and_limits() {
        // events: array32 claiming 4 billion entries.
        let huge = batch(0).raw(&[]);
        let mut bytes = huge.0[..huge.0.len() - 1].to_vec();
        bytes.extend_from_slice(&[0xdd, 0xff, 0xff, 0xff, 0xff, 0xc0]);
        assert!(matches!(decode_batch(&bytes), Err(DecodeError::Truncated { .. })));

        let small = DecodeOptions {
            max_events: 1,
            max_token_ids: 2,
            max_depth: 2,
            ..DecodeOptions::default()
        };
        let two_events = batch(2).arr(1).s("AllBlocksCleared").arr(1).s("AllBlocksCleared").nil();
        assert_eq!(
            small.decode_batch(&two_events.0),
            Err(DecodeError::TooLarge {
                what: "events",
                len: 2,
                limit: 1
            })
        );
        let stored = |tokens: u8| {
            let mut m = batch(1).arr(5).s("BlockStored").arr(0).nil().arr(tokens);
            for t in 0..tokens {
                m = m.u(u64::from(t));
            }
            m.u(1).nil()
        };
        assert!(small.decode_batch(&stored(2).0).is_ok());
        assert!(matches!(
            small.decode_batch(&stored(3).0),
            Err(DecodeError::TooLarge { what: "token_ids", .. })
        ));
        // extra_keys entry nested three arrays deep.
        let deep = batch(1)
            .map(5)
            .s("type")
            .s("BlockStored")
            .s("block_hashes")
            .arr(0)
            .s("token_ids")
            .arr(0)
            .s("block_size")
            .u(1)
            .s("extra_keys")
            .arr(1)
            .arr(1)
            .arr(1)
            .arr(1)
            .arr(0)
            .nil();
        assert!(matches!(small.decode_batch(&deep.0), Err(DecodeError::TooDeep { .. })));
        assert!(decode_batch(&deep.0).is_ok());
    }
}
