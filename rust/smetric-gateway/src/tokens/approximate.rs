//! Approximate routing ids: a text's UTF-8 bytes in chunks of [`BYTE_CHUNK_BYTES`] (4), each
//! read as a big-endian u32, the last zero-padded — exactly the fake engine's default tokenizer
//! (`smetric.chat.byte_chunk_ids`). O(text bytes), one pass.

use crate::shared::BYTE_CHUNK_BYTES;

/// `bytes` in chunks of [`BYTE_CHUNK_BYTES`], each read as a big-endian u32, the last one
/// padded with zero bytes.
#[must_use]
pub fn byte_chunk_ids(bytes: &[u8]) -> Vec<u32> {
    let chunks = bytes.chunks_exact(BYTE_CHUNK_BYTES);
    let tail = chunks.remainder();
    let mut ids: Vec<u32> = chunks.map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]])).collect();
    if !tail.is_empty() {
        let mut last = [0u8; BYTE_CHUNK_BYTES];
        last[..tail.len()].copy_from_slice(tail);
        ids.push(u32::from_be_bytes(last));
    }
    ids
}
