//! Block hashing: the prompt's token ids cut into full blocks, each hashed with its parent.
//!
//! Algorithm: `root = seed` (or `xxh3_64(namespace, seed)` when a namespace such as a LoRA
//! name or cache salt is given); `h[i] = xxh3_64_with_seed(le_bytes(block i), h[i-1])`.
//! Using the parent as the seed makes each hash cover the block's whole prefix, so two
//! prompts share a KV prefix of `k` blocks iff their first `k` hashes are equal.
//!
//! Invariants: only full blocks are hashed (the partial tail never is); the output length
//! is `tokens.len() / block_size`.
//!
//! Complexity: O(n) in the number of tokens, one pass, no allocation besides the output.
//! Blocks of [`FIXED_BLOCK_TOKENS`] tokens (vLLM's default) are hashed by code compiled for
//! that constant length, which drops xxh3's dispatch on the input length; the chain's hashes
//! depend on each other, so a long prompt is hashed at about one block per xxh3 latency.
//! (The index hashes a prompt it holds faster: [`crate::KvIndex::query_tokens`].)

#[cfg(not(target_endian = "little"))]
use xxhash_rust::xxh3::Xxh3;
use xxhash_rust::xxh3::xxh3_64_with_seed;

use crate::ids::BlockHash;

/// Big-endian targets: largest block size serialised through a stack buffer; bigger blocks
/// stream through a hasher. (Little-endian targets hash the token memory directly.)
pub const STACK_BLOCK_TOKENS: usize = 128;

/// The chain root for a seed and an optional namespace.
pub fn chain_root(seed: u64, namespace: Option<&str>) -> u64 {
    match namespace {
        None => seed,
        Some(ns) => xxh3_64_with_seed(ns.as_bytes(), seed),
    }
}

/// Hashes one block of tokens under its parent hash.
#[inline]
pub fn hash_block(parent: u64, block: &[u32]) -> u64 {
    // On little-endian targets the in-memory bytes already are the little-endian encoding.
    #[cfg(target_endian = "little")]
    {
        xxh3_64_with_seed(bytemuck::cast_slice(block), parent)
    }
    #[cfg(not(target_endian = "little"))]
    {
        if block.len() <= STACK_BLOCK_TOKENS {
            let mut buf = [0u8; STACK_BLOCK_TOKENS * 4];
            for (dst, t) in buf.chunks_exact_mut(4).zip(block) {
                dst.copy_from_slice(&t.to_le_bytes());
            }
            xxh3_64_with_seed(&buf[..block.len() * 4], parent)
        } else {
            let mut hasher = Xxh3::with_seed(parent);
            for t in block {
                hasher.update(&t.to_le_bytes());
            }
            hasher.digest()
        }
    }
}

/// Block size whose hashing is compiled for its constant length (vLLM's default block size);
/// other sizes take the generic path. The hashes are the same either way.
pub const FIXED_BLOCK_TOKENS: usize = 16;

/// `block_size`, or the constant `B` when it is not 0: a caller monomorphised for
/// `B = FIXED_BLOCK_TOKENS` slices constant-length blocks, so xxh3's dispatch on the input
/// length folds away.
#[inline]
pub(crate) const fn block_len<const B: usize>(block_size: usize) -> usize {
    if B == 0 { block_size } else { B }
}

/// Appends the chained hashes of every full block of `tokens` to `out`.
///
/// `block_size` must be at least 1 (the router validates it once at construction).
pub fn hash_tokens_into(
    tokens: &[u32],
    block_size: usize,
    seed: u64,
    namespace: Option<&str>,
    out: &mut Vec<BlockHash>,
) {
    debug_assert!(block_size > 0);
    let root = chain_root(seed, namespace);
    if block_size == FIXED_BLOCK_TOKENS {
        chain_from::<FIXED_BLOCK_TOKENS>(tokens, block_size, root, out);
    } else {
        chain_from::<0>(tokens, block_size, root, out);
    }
}

/// Appends the chain of `tokens`' full blocks under `parent` to `out` (`B`: see [`block_len`]).
pub(crate) fn chain_from<const B: usize>(tokens: &[u32], block_size: usize, mut parent: u64, out: &mut Vec<BlockHash>) {
    let b = block_len::<B>(block_size);
    out.reserve(tokens.len() / b);
    for block in tokens.chunks_exact(b) {
        parent = hash_block(parent, block);
        out.push(BlockHash(parent));
    }
}

/// The chained hashes of every full block of `tokens`.
pub fn hash_tokens(tokens: &[u32], block_size: usize, seed: u64, namespace: Option<&str>) -> Vec<BlockHash> {
    let mut out = Vec::new();
    hash_tokens_into(tokens, block_size, seed, namespace, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partial_tail_is_not_hashed() {
        let tokens: Vec<u32> = (0..35).collect();
        assert_eq!(hash_tokens(&tokens, 16, 0, None).len(), 2);
        assert!(hash_tokens(&tokens[..15], 16, 0, None).is_empty());
    }

    #[test]
    fn each_hash_covers_its_prefix() {
        let a: Vec<u32> = (0..48).collect();
        let mut b = a.clone();
        b[0] = 999; // differs in the first block only
        let (ha, hb) = (hash_tokens(&a, 16, 0, None), hash_tokens(&b, 16, 0, None));
        assert!(
            ha.iter().zip(&hb).all(|(x, y)| x != y),
            "a change in block 0 must change every later hash"
        );
        let mut c = a.clone();
        c[40] = 7; // differs in the last block only
        let hc = hash_tokens(&c, 16, 0, None);
        assert_eq!(ha[..2], hc[..2]);
        assert_ne!(ha[2], hc[2]);
    }

    #[test]
    fn matches_the_documented_formula() {
        let tokens: Vec<u32> = vec![1, 2, 3, 4, 5, 6, 7, 8];
        let h = hash_tokens(&tokens, 4, 42, None);
        let b0: Vec<u8> = [1u32, 2, 3, 4].iter().flat_map(|t| t.to_le_bytes()).collect();
        let b1: Vec<u8> = [5u32, 6, 7, 8].iter().flat_map(|t| t.to_le_bytes()).collect();
        let h0 = xxh3_64_with_seed(&b0, 42);
        assert_eq!(h, vec![BlockHash(h0), BlockHash(xxh3_64_with_seed(&b1, h0))]);
    }

    #[test]
    fn namespace_and_large_blocks() {
        let tokens: Vec<u32> = (0..600).collect();
        assert_ne!(
            hash_tokens(&tokens, 16, 0, Some("lora-a")),
            hash_tokens(&tokens, 16, 0, None)
        );
        // The streaming path (block > STACK_BLOCK_TOKENS) hashes the same bytes as the stack path.
        let big = hash_tokens(&tokens, 300, 5, None);
        let bytes: Vec<u8> = tokens[..300].iter().flat_map(|t| t.to_le_bytes()).collect();
        assert_eq!(big[0], BlockHash(xxh3_64_with_seed(&bytes, 5)));
    }
}
