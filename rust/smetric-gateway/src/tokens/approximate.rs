//! Approximate routing ids: a text's UTF-8 bytes in chunks of [`BYTE_CHUNK_BYTES`] (4), each
//! read as a big-endian u32, the last zero-padded — exactly the fake engine's default tokenizer
//! (`smetric.chat.byte_chunk_ids`); in chunks of any other size (`approx_chunk_bytes`), the
//! CRC-32 of each chunk, as the app's. O(text bytes), one pass.

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

/// `bytes` in chunks of `chunk` bytes (`smetric.chat.byte_chunk_ids(text, chunk)`): 4 is
/// [`byte_chunk_ids`]; any other size the CRC-32 (zlib's) of each chunk, the last one short.
#[must_use]
pub fn chunk_ids(bytes: &[u8], chunk: usize) -> Vec<u32> {
    if chunk == BYTE_CHUNK_BYTES {
        return byte_chunk_ids(bytes);
    }
    bytes.chunks(chunk.max(1)).map(crc32fast::hash).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn four_byte_chunks_are_big_endian_and_other_sizes_zlibs_crc32() {
        assert_eq!(chunk_ids(b"abcdefgh", 4), [0x6162_6364, 0x6566_6768]);
        assert_eq!(
            chunk_ids(b"abcde", 4),
            [0x6162_6364, 0x6500_0000],
            "the last one zero-padded"
        );
        // zlib.crc32(b"abcdefg"), zlib.crc32(b"h"): the app's ids for 7-byte chunks.
        assert_eq!(chunk_ids(b"abcdefgh", 7), [0x312a_6aa6, 0x916b_06e7]);
        assert!(chunk_ids(b"", 7).is_empty());
    }
}
