//! A software prefetch: asks the memory for a cache line the caller will read soon.
//!
//! The one `unsafe` of the core, audited here. The index's write path (a new chain into full
//! holders) is bound by cache misses it can predict several blocks ahead — the block table's
//! slot of the block it will create, the entry it will evict next — and an ordinary load
//! issued early gains nothing there (measured: `BENCHMARKS.md`, "The single-thread budget"),
//! while a prefetch instruction lets the misses overlap.
//!
//! Soundness: `_mm_prefetch` is a hint. It never faults, whatever the address (Intel SDM,
//! PREFETCHh: "does not affect program behaviour"), reads nothing into the program and
//! writes nothing; the only requirement of the intrinsic is the `sse` target feature, which
//! every x86-64 CPU has (it is in the x86-64 baseline, checked at compile time below). The
//! caller passes a reference, so the address is even valid. Elsewhere (no x86-64) it does
//! nothing.
//!
//! Complexity: one instruction.

/// Hints the CPU to bring `value`'s cache line into every cache level (T0).
#[inline(always)]
pub(crate) fn prefetch_read<T>(value: &T) {
    #[cfg(all(target_arch = "x86_64", target_feature = "sse"))]
    #[allow(unsafe_code)]
    // SAFETY: see the module doc: PREFETCHT0 never faults and has no observable effect on
    // memory; `sse` is enabled for this build (the cfg above).
    unsafe {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        _mm_prefetch::<_MM_HINT_T0>(std::ptr::from_ref(value).cast::<i8>());
    }
    #[cfg(not(all(target_arch = "x86_64", target_feature = "sse")))]
    let _ = value;
}
