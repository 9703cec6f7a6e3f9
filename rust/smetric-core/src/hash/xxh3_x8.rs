//! xxh3-64 of eight 64-byte blocks at once (AVX-512): the content hashes of vLLM's 16-token
//! blocks, bit for bit those of `xxhash_rust::xxh3::xxh3_64`, eight to a vector.
//!
//! Algorithm: xxh3 hashes a 64-byte input (seed 0) as `avalanche(64·P1 + Σ fold(x_{2k} ^ s,
//! x_{2k+1} ^ s'))` over four 16-byte pairs of words, where `fold(a, b)` is the 128-bit product
//! `a·b` with its halves xored and `s, s'` are fixed words of the default secret. Word `j` of
//! the block meets secret word `KEY[j]` (the pairs sit at input offsets 0, 16, 32, 48 and take
//! the secret at 0, 32, 48, 16), so one xor with [`KEY`] keys a whole block. Two blocks'
//! even words and odd words are interleaved with one unpack each, so a vector of eight lanes
//! holds eight pairs, four of each block; AVX-512 has no 64 × 64 → 128 multiply, so `fold` is
//! built from four 32 × 32 → 64 ones. Three rounds of 128-bit-lane shuffles and adds then sum
//! each block's four folds into lane `i` for block `i`, and the avalanche runs on all eight.
//!
//! Why: the scalar xxh3 of a 64-byte block is ≈ 56 instructions, most of them its four
//! 128-bit multiplies; here eight blocks take ≈ 100 vector instructions, and the chain step
//! that follows (`super::chain_step`, a multiply and two xors waiting on its parent) runs
//! while the next eight are hashed. Measured (BENCHMARKS.md, "Eight blocks a vector"): level
//! with the scalar xxh3 on a borrowed `&[u32]`, ≈ 2 µs faster on a 32K-token prompt read in
//! place from Python, where the scalar path stages every block through the stack.
//!
//! Invariants: equal to `xxh3_64` on every 64-byte input (the differential tests below, on
//! random blocks and on blocks of extreme words). The two entry points, [`chain_owned`] and
//! [`chain_shared`], are safe: they check the CPU's features and the input's length
//! themselves and return `None` where the vector path does not run (the caller then hashes
//! every block with the scalar xxh3). Ids read from memory another thread may
//! write ([`Load::Shared`]) are loaded by an inline-assembly load, which the language treats as
//! an opaque access, not as a plain read the optimiser may assume unchanged (the scalar path
//! uses relaxed atomic loads for the same reason).
//!
//! Complexity: O(1) a group of eight blocks, no memory besides the eight loads and one store.

// The second of the core's audited `unsafe` files (docs/architecture.md lists them): vector
// intrinsics need `unsafe` for their CPU features and raw loads; every block's SAFETY line
// says which precondition the safe entry points checked.
#![allow(unsafe_code)]

use std::arch::x86_64::{
    __m512i, _mm512_add_epi64, _mm512_and_si512, _mm512_loadu_si512, _mm512_mullo_epi64, _mm512_or_si512,
    _mm512_reduce_or_epi64, _mm512_set1_epi64, _mm512_setzero_si512, _mm512_shuffle_i64x2, _mm512_slli_epi64,
    _mm512_srli_epi64, _mm512_storeu_si512, _mm512_unpackhi_epi64, _mm512_unpacklo_epi64, _mm512_xor_si512,
};
use std::sync::atomic::AtomicU64;

use super::chain_step;
use crate::ids::BlockHash;

/// The first 64 bytes of xxh3's default secret as little-endian words.
const SECRET: [u64; 8] = [
    0xbe4b_a423_396c_feb8,
    0x1cad_21f7_2c81_017c,
    0xdb97_9083_e96d_d4de,
    0x1f67_b3b7_a4a4_4072,
    0x78e5_c0cc_4ee6_79cb,
    0x2172_ffcc_7dd0_5a82,
    0x8e24_43f7_7446_08b8,
    0x4c26_3a81_e690_35e0,
];

/// The secret word each of a 64-byte block's eight words is xored with: the pairs at input
/// offsets 0, 16, 32 and 48 take the secret's pairs at 0, 32, 48 and 16.
const KEY: [u64; 8] = [
    SECRET[0], SECRET[1], SECRET[4], SECRET[5], SECRET[6], SECRET[7], SECRET[2], SECRET[3],
];

/// xxh64's first prime; xxh3 starts a 17–128-byte input's accumulator at `len · P1`.
const PRIME64_1: u64 = 0x9E37_79B1_85EB_CA87;

/// xxh3's avalanche multiplier.
const AVALANCHE_MUL: u64 = 0x1656_6791_9E37_79F9;

/// Bytes a block this module hashes: 16 ids of 4 bytes.
pub const BLOCK_BYTES: usize = 64;

/// Whether this CPU runs the vector path (AVX-512 F and DQ; `is_x86_feature_detected!`
/// caches its answer, so a call is a load and a test).
#[inline]
fn available() -> bool {
    is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512dq")
}

/// Chains `tokens`' 16-token blocks under `parent` into `out` (`out.len()` blocks, rounded
/// down to a multiple of eight; `tokens` must hold at least `out.len()` blocks). Returns the
/// last hash written and how many blocks were done, or `None` on a CPU without the vector path.
#[inline]
pub fn chain_owned(tokens: &[u32], parent: u64, out: &mut [BlockHash]) -> Option<(u64, usize)> {
    if !available() {
        return None;
    }
    let n = out.len().min(tokens.len() / 16);
    // SAFETY: `tokens` holds `n` blocks of 64 bytes; the CPU features were just checked.
    let (last, _, done) = unsafe { chain(tokens.as_ptr().cast(), Load::Owned, parent, &mut out[..n]) };
    Some((last, done))
}

/// [`chain_owned`] over words another thread may write (two ids a word, eight words a
/// block), read through opaque loads; also returns the OR of every word read.
#[inline]
pub fn chain_shared(words: &[AtomicU64], parent: u64, out: &mut [BlockHash]) -> Option<(u64, u64, usize)> {
    if !available() {
        return None;
    }
    let n = out.len().min(words.len() / 8);
    // SAFETY: `words` holds `n` blocks of 64 bytes (an `AtomicU64` is laid out as a `u64`);
    // they are read by the opaque loads of `Load::Shared` only. The features were checked.
    Some(unsafe { chain(words.as_ptr().cast(), Load::Shared, parent, &mut out[..n]) })
}

/// How a block's 64 bytes are read.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Load {
    /// Memory the caller borrows (`&[u32]`): a plain vector load.
    Owned,
    /// Memory another thread may write (a Python buffer): an inline-assembly load.
    Shared,
}

/// Loads 64 bytes at `p`.
///
/// # Safety
/// `p` is valid for 64 bytes of reads; the CPU has AVX-512 F.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn load(p: *const u8, how: Load) -> __m512i {
    match how {
        Load::Owned => unsafe { _mm512_loadu_si512(p.cast()) },
        Load::Shared => {
            let v: __m512i;
            // SAFETY: the caller guarantees 64 readable bytes; the asm only reads them.
            unsafe {
                std::arch::asm!(
                    "vmovdqu64 {v}, [{p}]",
                    p = in(reg) p,
                    v = out(zmm_reg) v,
                    options(pure, readonly, nostack, preserves_flags),
                );
            }
            v
        }
    }
}

/// `vpmuludq`: each lane's low 32 bits times the other's, a 64-bit product. Written in
/// assembly because LLVM recognises the four products of [`mul128_fold`] as a 128-bit
/// multiply and scalarises it (sixteen `mul`s, lanes extracted and re-inserted: measured
/// ×2.3 slower than the scalar xxh3); an opaque instruction keeps the lanes in vectors.
#[inline]
#[target_feature(enable = "avx512f")]
fn mul32(a: __m512i, b: __m512i) -> __m512i {
    let product: __m512i;
    // SAFETY: a register-only instruction of AVX-512 F, enabled for this function.
    unsafe {
        std::arch::asm!(
            "vpmuludq {p}, {a}, {b}",
            a = in(zmm_reg) a,
            b = in(zmm_reg) b,
            p = lateout(zmm_reg) product,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    product
}

/// `fold(a, b)` lane by lane: the 128-bit product's low half xor its high half.
#[inline]
#[target_feature(enable = "avx512f")]
fn mul128_fold(a: __m512i, b: __m512i) -> __m512i {
    let a_hi = _mm512_srli_epi64::<32>(a);
    let b_hi = _mm512_srli_epi64::<32>(b);
    let (ll, hl, lh, hh) = (mul32(a, b), mul32(a_hi, b), mul32(a, b_hi), mul32(a_hi, b_hi));
    let low32 = _mm512_set1_epi64(0xFFFF_FFFF);
    // (ll >> 32) + low32(hl) + lh < 2^64: no carry is lost.
    let cross = _mm512_add_epi64(
        _mm512_add_epi64(_mm512_srli_epi64::<32>(ll), _mm512_and_si512(hl, low32)),
        lh,
    );
    let hi = _mm512_add_epi64(
        _mm512_add_epi64(hh, _mm512_srli_epi64::<32>(hl)),
        _mm512_srli_epi64::<32>(cross),
    );
    let lo = _mm512_or_si512(_mm512_slli_epi64::<32>(cross), _mm512_and_si512(ll, low32));
    _mm512_xor_si512(lo, hi)
}

/// Two keyed blocks' four pairs each, folded: lane k holds pair k of `a`, then of `b`.
#[inline]
#[target_feature(enable = "avx512f")]
fn fold_pairs(a: __m512i, b: __m512i) -> __m512i {
    mul128_fold(_mm512_unpacklo_epi64(a, b), _mm512_unpackhi_epi64(a, b))
}

/// The xxh3-64 hashes of the eight 64-byte blocks at `p` (512 bytes), in order, into `out`;
/// returns the OR of every word read (the caller's range check on signed ids).
///
/// # Safety
/// `p` is valid for 512 bytes of reads; the CPU has AVX-512 F and DQ ([`available`]).
#[inline]
#[target_feature(enable = "avx512f,avx512dq")]
unsafe fn hash8(p: *const u8, how: Load, out: &mut [u64; 8]) -> __m512i {
    // Plain statements, not closures: a closure does not inherit this function's target
    // features, and its intrinsics would become calls.
    // SAFETY: the caller guarantees 512 readable bytes: block `i` is at `p + 64 i`.
    let (x0, x1, x2, x3, x4, x5, x6, x7) = unsafe {
        (
            load(p, how),
            load(p.add(BLOCK_BYTES), how),
            load(p.add(2 * BLOCK_BYTES), how),
            load(p.add(3 * BLOCK_BYTES), how),
            load(p.add(4 * BLOCK_BYTES), how),
            load(p.add(5 * BLOCK_BYTES), how),
            load(p.add(6 * BLOCK_BYTES), how),
            load(p.add(7 * BLOCK_BYTES), how),
        )
    };
    let or = _mm512_or_si512(
        _mm512_or_si512(_mm512_or_si512(x0, x1), _mm512_or_si512(x2, x3)),
        _mm512_or_si512(_mm512_or_si512(x4, x5), _mm512_or_si512(x6, x7)),
    );
    // SAFETY: KEY is 64 readable bytes.
    let key = unsafe { _mm512_loadu_si512(KEY.as_ptr().cast()) };
    // Blocks 2i and 2i+1: lane k of `f{2i}{2i+1}` is pair k's fold of block 2i, then of 2i+1.
    let f01 = fold_pairs(_mm512_xor_si512(x0, key), _mm512_xor_si512(x1, key));
    let f23 = fold_pairs(_mm512_xor_si512(x2, key), _mm512_xor_si512(x3, key));
    let f45 = fold_pairs(_mm512_xor_si512(x4, key), _mm512_xor_si512(x5, key));
    let f67 = fold_pairs(_mm512_xor_si512(x6, key), _mm512_xor_si512(x7, key));
    // Lane k of a vector is its words 2k, 2k+1. Sum lanes 0+2 and 1+3 of two block pairs...
    let t0 = _mm512_add_epi64(
        _mm512_shuffle_i64x2::<0x44>(f01, f23),
        _mm512_shuffle_i64x2::<0xEE>(f01, f23),
    );
    let t1 = _mm512_add_epi64(
        _mm512_shuffle_i64x2::<0x44>(f45, f67),
        _mm512_shuffle_i64x2::<0xEE>(f45, f67),
    );
    // ...then the two halves: lane i / 2, word i % 2 is block i's sum.
    let sums = _mm512_add_epi64(
        _mm512_shuffle_i64x2::<0x88>(t0, t1),
        _mm512_shuffle_i64x2::<0xDD>(t0, t1),
    );
    let mut h = _mm512_add_epi64(
        sums,
        _mm512_set1_epi64((BLOCK_BYTES as u64).wrapping_mul(PRIME64_1) as i64),
    );
    h = _mm512_xor_si512(h, _mm512_srli_epi64::<37>(h));
    h = _mm512_mullo_epi64(h, _mm512_set1_epi64(AVALANCHE_MUL as i64));
    h = _mm512_xor_si512(h, _mm512_srli_epi64::<32>(h));
    // SAFETY: `out` is 64 writable bytes.
    unsafe { _mm512_storeu_si512(out.as_mut_ptr().cast(), h) };
    or
}

/// The OR of a vector's eight words.
///
/// # Safety
/// The CPU has AVX-512 F.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn or_words(v: __m512i) -> u64 {
    _mm512_reduce_or_epi64(v) as u64
}

/// Chains the 64-byte blocks at `p` under `parent` into `out` (one block an entry), eight
/// blocks a group, while whole groups remain; returns the last hash written (or `parent`), the
/// OR of every word read, and how many blocks were done (`out.len()` rounded down to 8: the
/// caller hashes the rest).
///
/// # Safety
/// `p` is valid for `64 · out.len()` bytes of reads; the CPU has AVX-512 F and DQ
/// (`available`).
#[target_feature(enable = "avx512f,avx512dq")]
unsafe fn chain(p: *const u8, how: Load, mut parent: u64, out: &mut [BlockHash]) -> (u64, u64, usize) {
    let mut or = _mm512_setzero_si512();
    let mut contents = [0u64; 8];
    let done = out.len() / 8 * 8;
    for (g, dst) in out[..done].chunks_exact_mut(8).enumerate() {
        // SAFETY: group `g` is within the `64 · out.len()` readable bytes.
        or = _mm512_or_si512(or, unsafe { hash8(p.add(g * 8 * BLOCK_BYTES), how, &mut contents) });
        // The chain waits on its parent; the next group's hashes do not, and overlap it.
        for (d, &c) in dst.iter_mut().zip(&contents) {
            parent = chain_step(parent, c);
            *d = BlockHash(parent);
        }
    }
    // SAFETY: the features were checked by the caller.
    (parent, unsafe { or_words(or) }, done)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::mix64;
    use xxhash_rust::xxh3::xxh3_64;

    fn scalar(blocks: &[u8]) -> Vec<u64> {
        blocks.chunks_exact(BLOCK_BYTES).map(xxh3_64).collect()
    }

    fn vector(blocks: &[u8], how: Load) -> (Vec<u64>, u64) {
        let mut out = [0u64; 8];
        // SAFETY: 512 bytes; the test runs only where `available()`.
        let or = unsafe { or_words(hash8(blocks.as_ptr(), how, &mut out)) };
        (out.to_vec(), or)
    }

    #[test]
    fn eight_blocks_hash_as_xxh3_does() {
        if !available() {
            eprintln!("no AVX-512 F + DQ on this CPU: the vector path is not taken here");
            return;
        }
        let mut state = 0u64;
        let mut next = || {
            state += 1;
            mix64(state)
        };
        for round in 0..5_000 {
            let mut bytes = [0u8; 8 * BLOCK_BYTES];
            for chunk in bytes.chunks_exact_mut(8) {
                // Every third round: extreme words, where the 128-bit product's carries are.
                let word = match (round % 3, next() % 4) {
                    (0, 0) => 0,
                    (0, 1) => u64::MAX,
                    (0, 2) => u64::MAX ^ KEY[0],
                    _ => next(),
                };
                chunk.copy_from_slice(&word.to_le_bytes());
            }
            let want = scalar(&bytes);
            let want_or = bytes
                .chunks_exact(8)
                .fold(0, |a, w| a | u64::from_le_bytes(w.try_into().unwrap()));
            for how in [Load::Owned, Load::Shared] {
                assert_eq!(vector(&bytes, how), (want.clone(), want_or), "round {round}");
            }
        }
    }

    #[test]
    fn a_changed_byte_moves_its_own_block_alone() {
        // The lanes are not crossed: one bit flipped in block 3 changes lane 3 and no other.
        if !available() {
            return;
        }
        let mut bytes: Vec<u8> = (0..8 * BLOCK_BYTES).map(|i| (i * 37 % 251) as u8).collect();
        let (before, _) = vector(&bytes, Load::Owned);
        bytes[3 * BLOCK_BYTES + 40] ^= 1;
        let (after, _) = vector(&bytes, Load::Owned);
        let changed: Vec<usize> = (0..8).filter(|&i| before[i] != after[i]).collect();
        assert_eq!(changed, vec![3]);
        assert_eq!(after, scalar(&bytes));
    }
}
