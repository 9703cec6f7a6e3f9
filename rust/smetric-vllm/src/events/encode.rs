//! Encoding a [`KvEventBatch`] exactly as vLLM ≥0.24's `ZmqEventPublisher` does.
//!
//! # Format
//! `msgspec.msgpack.encode(KVEventBatch)`: the batch is an array-like struct
//! `[ts: float64, events: [...], data_parallel_rank: int | nil]` (every field written); each
//! event is a tagged map struct with `"type"` first, then its fields in declaration order.
//! Fields without a default (`BlockStored`: `block_hashes`, `parent_block_hash`, `token_ids`,
//! `block_size`, `lora_id`, `medium`, `lora_name`; `BlockRemoved`: `block_hashes`, `medium`)
//! are always written, `nil` for `None`; fields whose default is `None` are omitted when
//! `None` (`omit_defaults=True`). msgspec picks the shortest msgpack form of every int,
//! string, binary, array and map header — except a struct's own map header, sized by the keys
//! the struct can have — and always writes floats as float64.
//!
//! The captured frames of vLLM 0.33.0 (`tests/data/vllm/captured_events.json`) decode and
//! re-encode to the identical bytes (`tests/captured_events.rs`), which pins the layout.
//!
//! Scalars and headers go through `rmp`'s primitive writers, whose shortest-form choice is
//! msgspec's. Two things are written by hand: a `BlockStored`'s map16 header, a width vLLM's
//! bytes demand and rmp would not pick (`write_map_len` writes a fixmap for 8–15 keys); and the
//! token-id loop, the bulk of every payload, which reserves the worst case once instead of
//! growing the buffer per id (the same bytes as `write_uint`; a test pins it).
//!
//! Used by the simulator, whose engines publish their cache changes through this encoder and
//! the ingestor, the same path a live fleet takes. Complexity: O(encoded size), one pass, into
//! a caller-owned buffer.

use rmp::Marker;
use rmp::encode as mp;

use super::{BlockRemoved, BlockStored, EventValue, ExternalBlockHash, KvEvent, KvEventBatch, Medium};

/// Appends the msgpack encoding of `batch` (vLLM's map form) to `out`.
pub fn encode_batch(batch: &KvEventBatch, out: &mut Vec<u8>) {
    array_header(out, 3);
    float(out, batch.ts);
    array_header(out, batch.events.len());
    for event in &batch.events {
        match event {
            KvEvent::BlockStored(stored) => block_stored(out, stored),
            KvEvent::BlockRemoved(removed) => block_removed(out, removed),
            KvEvent::AllBlocksCleared => {
                struct_header(out, 1, 1);
                str(out, "type");
                str(out, "AllBlocksCleared");
            }
        }
    }
    opt_int(out, batch.dp_rank);
}

/// The payload of `batch` as a fresh vector.
pub fn encode_batch_to_vec(batch: &KvEventBatch) -> Vec<u8> {
    let mut out = Vec::new();
    encode_batch(batch, &mut out);
    out
}

fn block_stored(out: &mut Vec<u8>, e: &BlockStored) {
    let optional = usize::from(e.extra_keys.is_some())
        + usize::from(e.group_idx.is_some())
        + usize::from(e.kv_cache_spec_kind.is_some())
        + usize::from(e.kv_cache_spec_sliding_window.is_some())
        + usize::from(e.locality.is_some())
        + usize::from(e.ownership.is_some())
        + usize::from(e.session_id.is_some())
        + usize::from(e.lookahead_token_ids.is_some());
    struct_header(out, 8 + optional, BLOCK_STORED_KEYS);
    str(out, "type");
    str(out, "BlockStored");
    str(out, "block_hashes");
    hashes(out, &e.block_hashes);
    str(out, "parent_block_hash");
    match &e.parent_block_hash {
        Some(h) => hash(out, h),
        None => nil(out),
    }
    str(out, "token_ids");
    tokens(out, &e.token_ids);
    str(out, "block_size");
    uint(out, u64::from(e.block_size));
    str(out, "lora_id");
    opt_int(out, e.lora_id);
    str(out, "medium");
    medium(out, e.medium.as_ref());
    str(out, "lora_name");
    opt_str(out, e.lora_name.as_deref());
    if let Some(keys) = &e.extra_keys {
        str(out, "extra_keys");
        array_header(out, keys.len());
        for block in keys {
            match block {
                Some(values) => {
                    array_header(out, values.len());
                    for v in values {
                        value(out, v);
                    }
                }
                None => nil(out),
            }
        }
    }
    optional_field(out, "group_idx", e.group_idx.map(Field::Int));
    optional_field(
        out,
        "kv_cache_spec_kind",
        e.kv_cache_spec_kind.as_deref().map(Field::Str),
    );
    optional_field(
        out,
        "kv_cache_spec_sliding_window",
        e.kv_cache_spec_sliding_window.map(Field::Int),
    );
    optional_field(out, "locality", e.locality.as_deref().map(Field::Str));
    optional_field(out, "ownership", e.ownership.as_deref().map(Field::Str));
    optional_field(out, "session_id", e.session_id.as_deref().map(Field::Str));
    if let Some(lookahead) = &e.lookahead_token_ids {
        str(out, "lookahead_token_ids");
        array_header(out, lookahead.len());
        for block in lookahead {
            tokens(out, block);
        }
    }
}

fn block_removed(out: &mut Vec<u8>, e: &BlockRemoved) {
    let optional =
        usize::from(e.group_idx.is_some()) + usize::from(e.locality.is_some()) + usize::from(e.ownership.is_some());
    struct_header(out, 3 + optional, BLOCK_REMOVED_KEYS);
    str(out, "type");
    str(out, "BlockRemoved");
    str(out, "block_hashes");
    hashes(out, &e.block_hashes);
    str(out, "medium");
    medium(out, e.medium.as_ref());
    optional_field(out, "group_idx", e.group_idx.map(Field::Int));
    optional_field(out, "locality", e.locality.as_deref().map(Field::Str));
    optional_field(out, "ownership", e.ownership.as_deref().map(Field::Str));
}

enum Field<'a> {
    Int(i64),
    Str(&'a str),
}

fn optional_field(out: &mut Vec<u8>, key: &str, field: Option<Field<'_>>) {
    let Some(field) = field else { return };
    str(out, key);
    match field {
        Field::Int(v) => int(out, v),
        Field::Str(s) => str(out, s),
    }
}

fn medium(out: &mut Vec<u8>, medium: Option<&Medium>) {
    match medium {
        Some(m) => str(out, m.as_str()),
        None => nil(out),
    }
}

fn hashes(out: &mut Vec<u8>, hashes: &[ExternalBlockHash]) {
    array_header(out, hashes.len());
    for h in hashes {
        hash(out, h);
    }
}

fn hash(out: &mut Vec<u8>, h: &ExternalBlockHash) {
    match h {
        ExternalBlockHash::Int(v) => uint(out, *v),
        ExternalBlockHash::Bytes(b) => bin(out, b),
    }
}

/// Token ids take most of a payload's bytes, so they get a tight loop: the worst case (5 bytes
/// each) is reserved once and written by index, then the unused tail is cut; each id takes the
/// shortest msgpack form (the same bytes [`uint`] writes).
#[allow(clippy::cast_possible_truncation)] // each arm's range fits the cast
fn tokens(out: &mut Vec<u8>, tokens: &[u32]) {
    array_header(out, tokens.len());
    let start = out.len();
    out.resize(start + tokens.len() * 5, 0);
    let buf = &mut out[start..];
    let mut at = 0;
    for &t in tokens {
        match t {
            0..=0x7f => {
                buf[at] = t as u8;
                at += 1;
            }
            0x80..=0xff => {
                buf[at..at + 2].copy_from_slice(&[Marker::U8.to_u8(), t as u8]);
                at += 2;
            }
            0x100..=0xffff => {
                let [hi, lo] = (t as u16).to_be_bytes();
                buf[at..at + 3].copy_from_slice(&[Marker::U16.to_u8(), hi, lo]);
                at += 3;
            }
            _ => {
                let [a, b, c, d] = t.to_be_bytes();
                buf[at..at + 5].copy_from_slice(&[Marker::U32.to_u8(), a, b, c, d]);
                at += 5;
            }
        }
    }
    out.truncate(start + at);
}

fn value(out: &mut Vec<u8>, v: &EventValue) {
    match v {
        EventValue::Nil => nil(out),
        EventValue::Bool(b) => {
            let Ok(()) = mp::write_bool(out, *b);
        }
        EventValue::Int(i) => int(out, *i),
        EventValue::UInt(u) => uint(out, *u),
        EventValue::Float(f) => float(out, *f),
        EventValue::Str(s) => str(out, s),
        EventValue::Bytes(b) => bin(out, b),
        EventValue::Array(items) => {
            array_header(out, items.len());
            for item in items {
                value(out, item);
            }
        }
        EventValue::Map(pairs) => {
            map_header(out, pairs.len());
            for (k, v) in pairs {
                value(out, k);
                value(out, v);
            }
        }
    }
}

fn opt_int(out: &mut Vec<u8>, v: Option<i64>) {
    match v {
        Some(v) => int(out, v),
        None => nil(out),
    }
}

fn opt_str(out: &mut Vec<u8>, s: Option<&str>) {
    match s {
        Some(s) => str(out, s),
        None => nil(out),
    }
}

// The writers below cannot fail: without rmp's `std` feature a `Vec<u8>` is written through
// an `Infallible` error type (it grows instead), so each `let Ok(..)` is irrefutable.

fn nil(out: &mut Vec<u8>) {
    let Ok(()) = mp::write_nil(out);
}

/// The shortest form of `v`: positive fixint, uint8/16/32/64 (msgspec's choice too).
fn uint(out: &mut Vec<u8>, v: u64) {
    let Ok(_) = mp::write_uint(out, v);
}

/// The shortest form of `v`; non-negative values take the unsigned forms, as msgspec writes them.
fn int(out: &mut Vec<u8>, v: i64) {
    let Ok(_) = mp::write_sint(out, v);
}

/// Always float64: msgspec never narrows a Python float.
fn float(out: &mut Vec<u8>, v: f64) {
    let Ok(()) = mp::write_f64(out, v);
}

fn str(out: &mut Vec<u8>, s: &str) {
    let Ok(()) = mp::write_str(out, s);
}

fn bin(out: &mut Vec<u8>, b: &[u8]) {
    let Ok(()) = mp::write_bin(out, b);
}

/// msgpack lengths are at most `u32`; longer ones cannot occur in a KV-event payload (the
/// decoder caps them far lower), so they are clamped rather than checked.
fn len32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

fn array_header(out: &mut Vec<u8>, n: usize) {
    let Ok(_) = mp::write_array_len(out, len32(n));
}

fn map_header(out: &mut Vec<u8>, n: usize) {
    let Ok(_) = mp::write_map_len(out, len32(n));
}

/// Keys a `BlockStored` can have in vLLM 0.33: the tag and 15 fields.
const BLOCK_STORED_KEYS: usize = 16;
/// Keys a `BlockRemoved` can have: the tag and 5 fields.
const BLOCK_REMOVED_KEYS: usize = 6;

/// msgspec sizes a map-form struct's header by the keys the struct *can* have (it reserves the
/// header before `omit_defaults` decides), then writes the count it actually wrote: a
/// `BlockStored` (16 possible keys) always gets map16, a `BlockRemoved` a fixmap. rmp has no
/// fixed-width map header writer, so the map16 form is written here.
fn struct_header(out: &mut Vec<u8>, n: usize, possible: usize) {
    if possible < 16 {
        map_header(out, n);
    } else {
        out.push(Marker::Map16.to_u8());
        out.extend_from_slice(&u16::try_from(n).unwrap_or(u16::MAX).to_be_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::decode_batch;

    #[test]
    fn round_trips_through_the_decoder() {
        let batch = KvEventBatch {
            ts: 1.5,
            events: vec![
                KvEvent::BlockStored(Box::new(BlockStored {
                    block_hashes: vec![ExternalBlockHash::Int(u64::MAX), ExternalBlockHash::Int(7)],
                    parent_block_hash: Some(ExternalBlockHash::Bytes(vec![1; 32])),
                    token_ids: (0..32).map(|i| i * 70_001).collect(),
                    block_size: 16,
                    medium: Some(Medium::Cpu),
                    group_idx: Some(-40_000),
                    extra_keys: Some(vec![None, Some(vec![EventValue::Str("a".repeat(40))])]),
                    ..BlockStored::default()
                })),
                KvEvent::BlockRemoved(BlockRemoved {
                    block_hashes: vec![ExternalBlockHash::Int(300)],
                    medium: Some(Medium::Gpu),
                    ..BlockRemoved::default()
                }),
                KvEvent::AllBlocksCleared,
            ],
            dp_rank: Some(3),
            unknown_events: 0,
        };
        let bytes = encode_batch_to_vec(&batch);
        assert_eq!(decode_batch(&bytes).unwrap(), batch);
    }

    #[test]
    fn token_arrays_match_the_generic_int_form() {
        let ids = [0, 1, 127, 128, 255, 256, 65_535, 65_536, 151_935, u32::MAX];
        let mut fast = Vec::new();
        tokens(&mut fast, &ids);
        let mut generic = Vec::new();
        array_header(&mut generic, ids.len());
        for &t in &ids {
            uint(&mut generic, u64::from(t));
        }
        assert_eq!(fast, generic);
    }

    #[test]
    fn headers_take_msgspec_forms() {
        // A BlockStored's header is map16 whatever its key count; a BlockRemoved's a fixmap.
        let mut out = Vec::new();
        struct_header(&mut out, 8, BLOCK_STORED_KEYS);
        struct_header(&mut out, 3, BLOCK_REMOVED_KEYS);
        assert_eq!(out, [0xde, 0x00, 0x08, 0x83]);
        // Every other header takes the shortest form, at each edge between two forms.
        let head = |write: &dyn Fn(&mut Vec<u8>), len: usize| {
            let mut out = Vec::new();
            write(&mut out);
            out[..len].to_vec()
        };
        assert_eq!(head(&|o| str(o, &"a".repeat(31)), 1), [0xbf]);
        assert_eq!(head(&|o| str(o, &"a".repeat(32)), 2), [0xd9, 32]);
        assert_eq!(head(&|o| str(o, &"a".repeat(256)), 3), [0xda, 0x01, 0x00]);
        assert_eq!(head(&|o| bin(o, &[]), 2), [0xc4, 0x00]);
        assert_eq!(head(&|o| bin(o, &[0; 256]), 3), [0xc5, 0x01, 0x00]);
        assert_eq!(head(&|o| array_header(o, 15), 1), [0x9f]);
        assert_eq!(head(&|o| array_header(o, 16), 3), [0xdc, 0x00, 0x10]);
        assert_eq!(head(&|o| array_header(o, 65_536), 5), [0xdd, 0x00, 0x01, 0x00, 0x00]);
        assert_eq!(head(&|o| map_header(o, 16), 3), [0xde, 0x00, 0x10]);
        assert_eq!(head(&|o| float(o, 1.0), 1), [0xcb]);
    }

    #[test]
    fn ints_take_the_shortest_form() {
        let mut out = Vec::new();
        for v in [
            0,
            127,
            128,
            255,
            256,
            65_535,
            65_536,
            -1,
            -32,
            -33,
            -128,
            -129,
            i64::MIN,
        ] {
            int(&mut out, v);
        }
        assert_eq!(
            out,
            [
                0x00, 0x7f, 0xcc, 0x80, 0xcc, 0xff, 0xcd, 0x01, 0x00, 0xcd, 0xff, 0xff, 0xce, 0x00, 0x01, 0x00, 0x00,
                0xff, 0xe0, 0xd0, 0xdf, 0xd0, 0x80, 0xd1, 0xff, 0x7f, 0xd3, 0x80, 0, 0, 0, 0, 0, 0, 0,
            ]
        );
    }
}
