//! Block hashing: the prompt's token ids cut into full blocks; each block's content hashed on
//! its own, and the contents chained into one hash per prefix.
//!
//! Algorithm: `root = seed` (or `xxh3_64(namespace, seed)` when a namespace such as a LoRA
//! name or cache salt is given); per block `c[i] = xxh3_64(le_bytes(block i))` (the block's
//! *content hash*, seed 0) and `h[i] = chain_step(h[i-1], c[i])` with `h[-1] = root`, where
//! `chain_step(p, c) = m ^ (m >> 32)` for `m = (p ^ c) · CHAIN_MUL mod 2^64`. Each `h[i]`
//! covers the block's whole prefix, so two prompts share a KV prefix of `k` blocks iff their
//! first `k` hashes are equal (up to 64-bit collisions).
//!
//! Why two levels (as Dynamo keeps a local block hash and a sequence hash): the content
//! hashes do not depend on each other, so the CPU runs many xxh3 calls at once; only the
//! chain step, a multiply and two xors, waits for its parent. Seeding each xxh3 with its
//! parent instead (this crate's first definition) made every call wait for the previous one:
//! 9.5 µs for a 32K-token prompt against 5.2 µs now (`cargo bench -p smetric-core --bench
//! core`, `hash/`). `chain_step` is a bijection of `p ^ c` (an odd multiplier, then an
//! xorshift), so two different blocks under the same parent never share a hash.
//!
//! Invariants: only full blocks are hashed (the partial tail never is); the output length
//! is `tokens.len() / block_size`.
//!
//! Complexity: O(n) in the number of tokens, one pass, no allocation besides the output.
//! Blocks of [`FIXED_BLOCK_TOKENS`] tokens (vLLM's default) are hashed by code compiled for
//! that constant length, which drops xxh3's dispatch on the input length, and on a CPU with
//! AVX-512 eight at a time (`xxh3_x8`: the same xxh3, in vector lanes), the rest of a prompt's
//! blocks (fewer than eight) by the scalar xxh3.
//!
//! Ids in memory the router does not own ([`SharedIds`]: a Python buffer read after the GIL
//! is released, which another thread may write meanwhile) are read once, through relaxed
//! atomic 64-bit loads (two ids per load) into a block on the stack, and hashed from there:
//! the same hashes as [`chain_tokens_into`] on the same ids, without the copy of the whole
//! prompt a borrowed `&[u32]` would need (a 32K-token prompt: ≈ 7.0 µs checked and hashed
//! this way against ≈ 9.3 µs copied, checked, then hashed). 64-bit loads, not 32-bit ones:
//! xxh3 reads the block in 8-byte words, and a word written as two 4-byte stores cannot be
//! forwarded to its load (≈ 10.8 µs). The vector path reads whole blocks through an
//! inline-assembly load instead, opaque to the optimiser as the atomic loads are; from Python
//! a 32K-token follow-up routes ≈ 2 µs faster that way (BENCHMARKS.md, "Eight blocks a
//! vector"). A concurrent writer makes the hashes those of some mixture of old and new ids;
//! the router's reads are atomic or opaque, so no torn read is assumed away.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

#[cfg(not(target_endian = "little"))]
use xxhash_rust::xxh3::Xxh3;
use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

use crate::ids::BlockHash;

#[cfg(target_arch = "x86_64")]
mod xxh3_x8;

/// Big-endian targets: largest block size serialised through a stack buffer; bigger blocks
/// stream through a hasher. (Little-endian targets hash the token memory directly.)
pub const STACK_BLOCK_TOKENS: usize = 128;

/// The chain step's multiplier: odd, so that the multiply is a bijection of `u64`. It is
/// MurmurHash3's finaliser constant, not the golden-ratio constant of the index's table
/// hasher, so that the two functions never line up.
pub const CHAIN_MUL: u64 = 0xFF51_AFD7_ED55_8CCD;

/// The chain root for a seed and an optional namespace.
pub fn chain_root(seed: u64, namespace: Option<&str>) -> u64 {
    match namespace {
        None => seed,
        Some(ns) => xxh3_64_with_seed(ns.as_bytes(), seed),
    }
}

/// The hash of one block's content alone: xxh3-64 (seed 0) of its little-endian u32 bytes.
#[inline]
pub fn block_content_hash(block: &[u32]) -> u64 {
    // On little-endian targets the in-memory bytes already are the little-endian encoding.
    #[cfg(target_endian = "little")]
    {
        xxh3_64(bytemuck::cast_slice(block))
    }
    #[cfg(not(target_endian = "little"))]
    {
        if block.len() <= STACK_BLOCK_TOKENS {
            let mut buf = [0u8; STACK_BLOCK_TOKENS * 4];
            for (dst, t) in buf.chunks_exact_mut(4).zip(block) {
                dst.copy_from_slice(&t.to_le_bytes());
            }
            xxh3_64(&buf[..block.len() * 4])
        } else {
            let mut hasher = Xxh3::new();
            for t in block {
                hasher.update(&t.to_le_bytes());
            }
            hasher.digest()
        }
    }
}

/// The hash of a prefix that ends with a block of content hash `content`, given the hash of
/// the prefix before it (`parent`; the chain root for block 0).
#[inline]
pub const fn chain_step(parent: u64, content: u64) -> u64 {
    let m = (parent ^ content).wrapping_mul(CHAIN_MUL);
    m ^ (m >> 32)
}

/// Hashes one block of tokens under its parent hash: `chain_step(parent, content hash)`.
#[inline]
pub fn hash_block(parent: u64, block: &[u32]) -> u64 {
    chain_step(parent, block_content_hash(block))
}

/// Block size whose hashing is compiled for its constant length (vLLM's default block size);
/// other sizes take the generic path. The hashes are the same either way.
pub const FIXED_BLOCK_TOKENS: usize = 16;

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
    chain_tokens_into(tokens, block_size, chain_root(seed, namespace), out);
}

/// Appends the chain of `tokens`' full blocks under `root` to `out`.
pub fn chain_tokens_into(tokens: &[u32], block_size: usize, root: u64, out: &mut Vec<BlockHash>) {
    debug_assert!(block_size > 0);
    if block_size == FIXED_BLOCK_TOKENS {
        chain_from::<FIXED_BLOCK_TOKENS>(tokens, block_size, root, out);
    } else {
        chain_from::<0>(tokens, block_size, root, out);
    }
}

/// Appends the chain of `tokens`' full blocks under `parent` to `out`. With `B != 0` the
/// blocks are `B` tokens long, a constant, so xxh3's dispatch on the input length folds
/// away; `B = 0` uses `block_size`.
fn chain_from<const B: usize>(tokens: &[u32], block_size: usize, mut parent: u64, out: &mut Vec<BlockHash>) {
    let b = if B == 0 { block_size } else { B };
    let start = out.len();
    // Sized up front and written in place: no length bookkeeping per block.
    out.resize(start + tokens.len() / b, BlockHash(0));
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if B == FIXED_BLOCK_TOKENS
        && let Some(vector) = xxh3_x8::chain_owned(tokens, parent, &mut out[start..])
    {
        (parent, done) = vector;
    }
    for (dst, block) in out[start + done..].iter_mut().zip(tokens[done * b..].chunks_exact(b)) {
        // The content hash does not depend on `parent`: consecutive iterations overlap.
        parent = chain_step(parent, block_content_hash(block));
        *dst = BlockHash(parent);
    }
}

/// Token ids read in place from memory another thread may write (see the module doc): the
/// prompt's full blocks as words of two ids each, in memory order, and the ids after them.
#[derive(Debug, Clone, Copy)]
pub struct SharedIds<'a> {
    /// The ids of the prompt's full blocks, two per word (`block_size / 2` words a block).
    pub blocks: &'a [AtomicU64],
    /// The ids after the last full block (fewer than a block).
    pub tail: &'a [AtomicU32],
    /// Whether the ids are `i32`: a negative one is refused, as from a copy.
    pub signed: bool,
}

impl SharedIds<'_> {
    /// The prompt's length in tokens.
    pub fn len(&self) -> usize {
        self.blocks.len() * 2 + self.tail.len()
    }

    /// Whether the prompt is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The first id outside `[0, 2^32)` of a signed prompt (a negative `i32`), given the OR of
    /// every word the hashing read: a second pass, taken only when that OR has a sign bit set. `None` when
    /// the ids changed since (a concurrent writer): the prompt is then hashed as read.
    fn first_negative(&self, blocks_or: u64) -> Option<(usize, i128)> {
        let negative = |(i, v): (usize, u32)| (v >> 31 == 1).then(|| (i, i128::from(v as i32)));
        let from_blocks = (blocks_or & 0x8000_0000_8000_0000 != 0)
            .then(|| {
                self.blocks
                    .iter()
                    .flat_map(|w| ids_of_word(w.load(Ordering::Relaxed)))
                    .enumerate()
                    .find_map(negative)
            })
            .flatten();
        from_blocks.or_else(|| {
            let start = self.blocks.len() * 2;
            self.tail
                .iter()
                .map(|t| t.load(Ordering::Relaxed))
                .enumerate()
                .find_map(|(i, v)| negative((start + i, v)))
        })
    }
}

/// The two ids of a word loaded from memory, in memory order.
fn ids_of_word(word: u64) -> [u32; 2] {
    let bytes = word.to_ne_bytes();
    [
        u32::from_ne_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]),
        u32::from_ne_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]),
    ]
}

/// Whether [`SharedIds`] can be hashed at this block size: blocks of whole words on the
/// stack (an even size up to [`STACK_BLOCK_TOKENS`]), on a little-endian target (the words'
/// bytes are then the ids' little-endian encoding the hash is defined on).
pub const fn shared_ids_supported(block_size: usize) -> bool {
    cfg!(target_endian = "little") && block_size.is_multiple_of(2) && block_size > 0 && block_size <= STACK_BLOCK_TOKENS
}

/// Appends the chain of `ids`' full blocks under `root` to `out`, or returns the first
/// negative id of a signed prompt. The caller checks [`shared_ids_supported`] first (the
/// router refuses other block sizes before calling).
pub fn chain_shared_into(
    ids: SharedIds<'_>,
    block_size: usize,
    root: u64,
    out: &mut Vec<BlockHash>,
) -> Result<(), (usize, i128)> {
    debug_assert!(shared_ids_supported(block_size));
    let words_per_block = block_size / 2;
    let blocks_or = if block_size == FIXED_BLOCK_TOKENS {
        chain_shared_from::<{ FIXED_BLOCK_TOKENS / 2 }>(ids.blocks, FIXED_BLOCK_TOKENS / 2, root, out)
    } else {
        chain_shared_from::<{ STACK_BLOCK_TOKENS / 2 }>(ids.blocks, words_per_block, root, out)
    };
    if !ids.signed {
        return Ok(());
    }
    let tail_or = ids.tail.iter().fold(0, |a, t| a | t.load(Ordering::Relaxed));
    let any_negative = blocks_or & 0x8000_0000_8000_0000 != 0 || tail_or >> 31 == 1;
    match any_negative.then(|| ids.first_negative(blocks_or)).flatten() {
        Some(bad) => Err(bad),
        None => Ok(()),
    }
}

/// [`chain_from`] over words read atomically, `w` words a block staged in a buffer of `CAP`
/// words (for vLLM's block size, exactly one block: its length then is a constant and the
/// buffer costs nothing to set up); returns the OR of every word read (the caller's range
/// check).
#[inline]
fn chain_shared_from<const CAP: usize>(
    words: &[AtomicU64],
    w: usize,
    mut parent: u64,
    out: &mut Vec<BlockHash>,
) -> u64 {
    let start = out.len();
    out.resize(start + words.len() / w, BlockHash(0));
    let mut or = 0;
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if CAP * 2 == FIXED_BLOCK_TOKENS
        && let Some(vector) = xxh3_x8::chain_shared(words, parent, &mut out[start..])
    {
        (parent, or, done) = vector;
    }
    let mut staged = [0u64; CAP];
    let block = &mut staged[..w];
    for (dst, shared) in out[start + done..].iter_mut().zip(words[done * w..].chunks_exact(w)) {
        for (word, src) in block.iter_mut().zip(shared) {
            *word = src.load(Ordering::Relaxed);
            or |= *word;
        }
        parent = chain_step(parent, xxh3_64(bytemuck::cast_slice(block)));
        *dst = BlockHash(parent);
    }
    or
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

    fn le(tokens: &[u32]) -> Vec<u8> {
        tokens.iter().flat_map(|t| t.to_le_bytes()).collect()
    }

    #[test]
    fn matches_the_documented_formula() {
        let tokens: Vec<u32> = vec![1, 2, 3, 4, 5, 6, 7, 8];
        let h = hash_tokens(&tokens, 4, 42, None);
        let step = |p: u64, c: u64| {
            let m = (p ^ c).wrapping_mul(0xFF51_AFD7_ED55_8CCD);
            m ^ (m >> 32)
        };
        let h0 = step(42, xxh3_64(&le(&[1, 2, 3, 4])));
        let h1 = step(h0, xxh3_64(&le(&[5, 6, 7, 8])));
        assert_eq!(h, vec![BlockHash(h0), BlockHash(h1)]);
        // Pinned values: the reference (python/smetric/reference/hashing.py) and the docs
        // (routing-semantics §1) state the same numbers.
        assert_eq!(hash_tokens(&tokens, 4, 0, None)[1], BlockHash(PINNED_1_TO_8_B4));
    }

    /// `hash_tokens(1..=8, block 4, seed 0)[1]`; the Python reference's unit test pins it too.
    const PINNED_1_TO_8_B4: u64 = 0x3F42_2018_C167_40A2;

    #[test]
    fn siblings_never_share_a_hash() {
        // chain_step is a bijection of `parent ^ content`: distinct contents under one parent
        // give distinct hashes, for any parent.
        for parent in [0, 1, u64::MAX, 0x1234_5678_9ABC_DEF0] {
            let mut seen: Vec<u64> = (0..4096u64).map(|c| chain_step(parent, c)).collect();
            seen.sort_unstable();
            seen.dedup();
            assert_eq!(seen.len(), 4096);
        }
    }

    #[test]
    fn namespace_and_large_blocks() {
        let tokens: Vec<u32> = (0..600).collect();
        assert_ne!(
            hash_tokens(&tokens, 16, 0, Some("lora-a")),
            hash_tokens(&tokens, 16, 0, None)
        );
        // The generic path (block of 300 tokens) hashes the same bytes as the formula says.
        let big = hash_tokens(&tokens, 300, 5, None);
        assert_eq!(big[0], BlockHash(chain_step(5, xxh3_64(&le(&tokens[..300])))));
        // The constant-length path and the generic path agree.
        let mut generic = Vec::new();
        chain_from::<0>(&tokens, 16, 7, &mut generic);
        let mut fixed = Vec::new();
        chain_from::<16>(&tokens, 16, 7, &mut fixed);
        assert_eq!(generic, fixed);
    }

    #[test]
    fn the_vector_path_chains_as_the_scalar_one_does() {
        // `chain_from::<0>` never takes the vector path; `::<16>` does (on a CPU with it) for
        // whole groups of eight blocks, then finishes with the scalar one.
        let tokens: Vec<u32> = (0..5_000u32).map(|i| crate::rng::mix64(u64::from(i)) as u32).collect();
        for len in [0, 15, 16, 127, 128, 129, 143, 144, 1_000, 4_096, 5_000] {
            let (mut scalar, mut fixed) = (vec![BlockHash(1)], vec![BlockHash(1)]);
            chain_from::<0>(&tokens[..len], 16, 11, &mut scalar);
            chain_from::<16>(&tokens[..len], 16, 11, &mut fixed);
            assert_eq!(scalar, fixed, "{len} tokens");
            assert_eq!(
                chain_shared(&tokens[..len], 16, false),
                Ok(scalar[1..].to_vec()),
                "{len} tokens"
            );
        }
    }

    /// `ids` as a caller would lay them out in memory: the full blocks' ids packed two per
    /// word in memory order, the rest one per cell.
    fn shared(ids: &[u32], block_size: usize) -> (Vec<AtomicU64>, Vec<AtomicU32>) {
        let full = ids.len() / block_size * block_size;
        let words = ids[..full]
            .chunks_exact(2)
            .map(|pair| {
                let mut word = [0u8; 8];
                word[..4].copy_from_slice(&pair[0].to_ne_bytes());
                word[4..].copy_from_slice(&pair[1].to_ne_bytes());
                AtomicU64::new(u64::from_ne_bytes(word))
            })
            .collect();
        let tail = ids[full..].iter().map(|&t| AtomicU32::new(t)).collect();
        (words, tail)
    }

    fn chain_shared(ids: &[u32], block_size: usize, signed: bool) -> Result<Vec<BlockHash>, (usize, i128)> {
        let (blocks, tail) = shared(ids, block_size);
        let mut out = Vec::new();
        let shared = SharedIds {
            blocks: &blocks,
            tail: &tail,
            signed,
        };
        assert_eq!(shared.len(), ids.len());
        chain_shared_into(shared, block_size, 11, &mut out)?;
        Ok(out)
    }

    #[test]
    fn shared_ids_hash_as_tokens_do() {
        let tokens: Vec<u32> = (0..1000u32).map(|i| i.wrapping_mul(2_654_435_761) >> 1).collect();
        for block_size in [2, 4, 16, 32, 128] {
            for len in [0, 1, block_size - 1, block_size, block_size + 1, 999, 1000] {
                let ids = &tokens[..len];
                let mut want = Vec::new();
                chain_tokens_into(ids, block_size, 11, &mut want);
                assert_eq!(
                    chain_shared(ids, block_size, true),
                    Ok(want.clone()),
                    "block {block_size}, {len} ids"
                );
                assert_eq!(
                    chain_shared(ids, block_size, false),
                    Ok(want),
                    "block {block_size}, {len} ids"
                );
            }
        }
    }

    #[test]
    fn shared_ids_refuse_a_negative_signed_id_where_it_is() {
        let mut ids: Vec<u32> = (0..70).collect();
        // In a full block (odd and even positions of a word), and in the tail.
        for (position, value) in [(0, -1i32), (17, -5), (33, i32::MIN), (66, -7)] {
            let mut bad = ids.clone();
            bad[position] = value as u32;
            assert_eq!(chain_shared(&bad, 16, true), Err((position, i128::from(value))));
            // As uint32 the same bits are an id in range.
            assert!(chain_shared(&bad, 16, false).is_ok());
        }
        ids[69] = u32::MAX;
        assert_eq!(chain_shared(&ids, 16, true), Err((69, -1)));
    }

    #[test]
    fn shared_ids_need_whole_words_on_the_stack() {
        assert!(shared_ids_supported(16) && shared_ids_supported(2) && shared_ids_supported(STACK_BLOCK_TOKENS));
        assert!(!shared_ids_supported(0) && !shared_ids_supported(15) && !shared_ids_supported(STACK_BLOCK_TOKENS + 2));
    }
}
