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
//! Used by the simulator, whose engines publish their cache changes through this encoder and
//! the ingestor, the same path a live fleet takes. Complexity: O(encoded size), one pass, into
//! a caller-owned buffer.

use super::{BlockRemoved, BlockStored, EventValue, ExternalBlockHash, KvEvent, KvEventBatch, Medium};

/// Appends the msgpack encoding of `batch` (vLLM's map form) to `out`.
pub fn encode_batch(batch: &KvEventBatch, out: &mut Vec<u8>) {
    array_header(out, 3);
    out.push(0xcb);
    out.extend_from_slice(&batch.ts.to_be_bytes());
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
    match batch.dp_rank {
        Some(rank) => int(out, rank),
        None => out.push(0xc0),
    }
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
        None => out.push(0xc0),
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
                None => out.push(0xc0),
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
        None => out.push(0xc0),
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
                buf[at..at + 2].copy_from_slice(&[0xcc, t as u8]);
                at += 2;
            }
            0x100..=0xffff => {
                let [hi, lo] = (t as u16).to_be_bytes();
                buf[at..at + 3].copy_from_slice(&[0xcd, hi, lo]);
                at += 3;
            }
            _ => {
                let [a, b, c, d] = t.to_be_bytes();
                buf[at..at + 5].copy_from_slice(&[0xce, a, b, c, d]);
                at += 5;
            }
        }
    }
    out.truncate(start + at);
}

fn value(out: &mut Vec<u8>, v: &EventValue) {
    match v {
        EventValue::Nil => out.push(0xc0),
        EventValue::Bool(b) => out.push(if *b { 0xc3 } else { 0xc2 }),
        EventValue::Int(i) => int(out, *i),
        EventValue::UInt(u) => uint(out, *u),
        EventValue::Float(f) => {
            out.push(0xcb);
            out.extend_from_slice(&f.to_be_bytes());
        }
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
        None => out.push(0xc0),
    }
}

fn opt_str(out: &mut Vec<u8>, s: Option<&str>) {
    match s {
        Some(s) => str(out, s),
        None => out.push(0xc0),
    }
}

fn uint(out: &mut Vec<u8>, v: u64) {
    if let Some(fix) = u8::try_from(v).ok().filter(|&b| b < 0x80) {
        out.push(fix);
    } else if let Ok(b) = u8::try_from(v) {
        out.extend_from_slice(&[0xcc, b]);
    } else if let Ok(w) = u16::try_from(v) {
        out.push(0xcd);
        out.extend_from_slice(&w.to_be_bytes());
    } else if let Ok(w) = u32::try_from(v) {
        out.push(0xce);
        out.extend_from_slice(&w.to_be_bytes());
    } else {
        out.push(0xcf);
        out.extend_from_slice(&v.to_be_bytes());
    }
}

fn int(out: &mut Vec<u8>, v: i64) {
    if let Ok(u) = u64::try_from(v) {
        uint(out, u);
    } else if let Some(fix) = i8::try_from(v).ok().filter(|&b| b >= -32) {
        out.extend_from_slice(&fix.to_be_bytes());
    } else if let Ok(b) = i8::try_from(v) {
        out.push(0xd0);
        out.extend_from_slice(&b.to_be_bytes());
    } else if let Ok(w) = i16::try_from(v) {
        out.push(0xd1);
        out.extend_from_slice(&w.to_be_bytes());
    } else if let Ok(w) = i32::try_from(v) {
        out.push(0xd2);
        out.extend_from_slice(&w.to_be_bytes());
    } else {
        out.push(0xd3);
        out.extend_from_slice(&v.to_be_bytes());
    }
}

/// A header: `fix | n` when `n < fix_limit`, else the 8-, 16- or 32-bit length form (`None`
/// markers are forms the type does not have). Lengths above `u32::MAX` cannot occur in a
/// KV-event payload (the decoder caps them far lower); they are clamped.
fn header(out: &mut Vec<u8>, n: usize, fix: u8, fix_limit: usize, m8: Option<u8>, m16: u8, m32: u8) {
    if n < fix_limit {
        out.push(fix | u8::try_from(n).unwrap_or(0));
    } else if let (Some(m), Ok(b)) = (m8, u8::try_from(n)) {
        out.extend_from_slice(&[m, b]);
    } else if let Ok(w) = u16::try_from(n) {
        out.push(m16);
        out.extend_from_slice(&w.to_be_bytes());
    } else {
        out.push(m32);
        out.extend_from_slice(&u32::try_from(n).unwrap_or(u32::MAX).to_be_bytes());
    }
}

fn str(out: &mut Vec<u8>, s: &str) {
    header(out, s.len(), 0xa0, 32, Some(0xd9), 0xda, 0xdb);
    out.extend_from_slice(s.as_bytes());
}

fn bin(out: &mut Vec<u8>, b: &[u8]) {
    // bin has no fix form: a zero limit never takes it.
    header(out, b.len(), 0, 0, Some(0xc4), 0xc5, 0xc6);
    out.extend_from_slice(b);
}

fn array_header(out: &mut Vec<u8>, n: usize) {
    header(out, n, 0x90, 16, None, 0xdc, 0xdd);
}

/// Keys a `BlockStored` can have in vLLM 0.33: the tag and 15 fields.
const BLOCK_STORED_KEYS: usize = 16;
/// Keys a `BlockRemoved` can have: the tag and 5 fields.
const BLOCK_REMOVED_KEYS: usize = 6;

/// msgspec sizes a map-form struct's header by the keys the struct *can* have (it reserves the
/// header before `omit_defaults` decides), then writes the count it actually wrote: a
/// `BlockStored` (16 possible keys) always gets map16, a `BlockRemoved` a fixmap.
fn struct_header(out: &mut Vec<u8>, n: usize, possible: usize) {
    if possible < 16 {
        header(out, n, 0x80, 16, None, 0xde, 0xdf);
    } else {
        out.push(0xde);
        out.extend_from_slice(&u16::try_from(n).unwrap_or(u16::MAX).to_be_bytes());
    }
}

fn map_header(out: &mut Vec<u8>, n: usize) {
    header(out, n, 0x80, 16, None, 0xde, 0xdf);
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
