//! The query walk of the KV$ index: for a request's chain, the longest prefix every instance and
//! the global tier hold, in one pass (see the module docs of `index` for the algorithm).
//!
//! Invariants: a query changes no holder's blocks (only `last_child` links along the chain).
//! Complexity: O(matched blocks · ⌈instances/64⌉), one cache line per step on a slab chain.

#[allow(clippy::wildcard_imports)]
use super::*;

impl KvIndex {
    /// Longest prefix hits of `chain` for every instance and the global tier (docs §2.4).
    /// Purges expired blocks first; changes no holder's blocks (only the `last_child` links
    /// along the chain, to where the walk found the entries).
    pub fn query(&mut self, chain: &[BlockHash], now_ms: u64, out: &mut IndexQuery) {
        self.purge_all_expired(now_ms);
        self.walk(chain.len(), 0, |i, _| chain[i], out);
    }

    /// [`KvIndex::query`] of a token prompt, hashed on the way: appends the chained hashes of
    /// every full block of `tokens` under `root` to `chain`, exactly as
    /// [`crate::hash::hash_tokens_into`] does, and answers the query for that chain.
    ///
    /// Where the chain follows blocks the index holds, the hash of block `i` is computed with
    /// the hash stored in the entry matched at `i − 1` as its seed, instead of the hash just
    /// computed; the two are equal whenever the entry matched, and a mismatch is caught by
    /// the comparison with the next entry. The hashes along a held chain thus no longer wait
    /// for each other (each xxh3 of a block depends on its parent's), which roughly halves
    /// the hashing time of a prompt the index knows. Blocks past the last entry found are
    /// hashed one after the other.
    pub fn query_tokens(
        &mut self,
        tokens: &[u32],
        block_size: usize,
        root: u64,
        now_ms: u64,
        chain: &mut Vec<BlockHash>,
        out: &mut IndexQuery,
    ) {
        debug_assert!(block_size > 0);
        self.purge_all_expired(now_ms);
        if block_size == FIXED_BLOCK_TOKENS {
            self.walk_tokens::<FIXED_BLOCK_TOKENS>(tokens, block_size, root, chain, out);
        } else {
            self.walk_tokens::<0>(tokens, block_size, root, chain, out);
        }
    }

    /// [`KvIndex::query_tokens`] after the purge (`B`: see [`crate::hash::block_len`]).
    fn walk_tokens<const B: usize>(
        &mut self,
        tokens: &[u32],
        block_size: usize,
        root: u64,
        chain: &mut Vec<BlockHash>,
        out: &mut IndexQuery,
    ) {
        let b = block_len::<B>(block_size);
        let (start, n) = (chain.len(), tokens.len() / b);
        // Sized up front and written in place: no length bookkeeping per block.
        chain.resize(start + n, BlockHash(0));
        let out_hashes = &mut chain[start..];
        self.walk(
            n,
            root,
            #[inline(always)]
            |i, parent| {
                // `block_len` again inside the closure: `walk` is not inlined, and a captured
                // length would not be the constant that lets xxh3 drop its length dispatch.
                let b = block_len::<B>(block_size);
                let h = BlockHash(hash_block(parent, &tokens[i * b..(i + 1) * b]));
                out_hashes[i] = h;
                h
            },
            out,
        );
        // The walk hashed every block it found an entry for, and the first one it did not.
        let hashed = (self.walked.len() + 1).min(n);
        // Past the last entry found: one hash after the other.
        chain.truncate(start + hashed);
        let parent = if hashed == 0 { root } else { chain[start + hashed - 1].0 };
        chain_from::<B>(&tokens[hashed * b..], block_size, parent, chain);
    }

    /// TTL purge of every live instance, in slot order (docs §2.4 step 1).
    fn purge_all_expired(&mut self, now_ms: u64) {
        if self.limits.local_ttl_ms.is_some() {
            for s in 0..self.instances.len() as u32 {
                if self.instances[s as usize].live {
                    self.purge_expired(s, now_ms);
                }
            }
        }
    }

    /// The query walk over a chain of `n` blocks, block `i`'s hash being `block(i, parent)`
    /// given its parent's hash (`root` for block 0). Fills `out`, and `self.walked` with the
    /// entry ids found, in chain order.
    ///
    /// [`KvIndex::follow`] finds the entries and, with at most 64 instance slots, reads the
    /// holders off each entry as it goes; with more, [`KvIndex::tally`] does so in a second
    /// pass.
    #[inline(never)]
    fn walk(&mut self, n: usize, root: u64, block: impl FnMut(usize, u64) -> BlockHash, out: &mut IndexQuery) {
        let mut walked = std::mem::take(&mut self.walked);
        walked.clear();
        out.local_blocks.clear();
        out.local_blocks.resize(self.instances.len(), 0);
        out.global_blocks = 0;
        if self.words == 1 {
            let tally = self.follow::<true>(n, root, block, &mut walked, &mut out.local_blocks);
            tally.finish(&self.entries, &walked, out);
        } else {
            self.follow::<false>(n, root, block, &mut walked, &mut out.local_blocks);
            self.tally(&walked, out);
        }
        self.walked = walked;
        self.walk_fresh = true;
    }

    /// Appends to `walked` the entry ids of the chain's blocks up to the first block without
    /// an entry (no holder can match past it). Each step tries the slab slot after the
    /// previous entry's, then that entry's `last_child`, then the hash table.
    ///
    /// With `TALLY`, the returned [`Tally`] holds the query's answer for slots 0–63 and the
    /// global tier (the hits of instances that stopped matching already in `local_blocks`).
    #[inline]
    fn follow<const TALLY: bool>(
        &mut self,
        n: usize,
        root: u64,
        mut block: impl FnMut(usize, u64) -> BlockHash,
        walked: &mut Vec<u32>,
        local_blocks: &mut [u32],
    ) -> Tally {
        let mut tally = Tally::new(self.live_mask[0], self.global_enabled());
        let Self { entries, by_hash, .. } = self;
        let entries = entries.as_mut_slice();
        // Sized up front and written in place, cut to the blocks found at the end.
        walked.resize(n, 0);
        let mut found = 0;
        let mut parent = root;
        let mut prev = NOT_HELD;
        for (i, id) in walked.iter_mut().enumerate() {
            let h = block(i, parent);
            let names = |e: u32, entries: &[Entry]| entries.get(e as usize).is_some_and(|x| x.hash == h && x.live());
            // A chain's entries are often consecutive slab slots (created together, or reusing
            // slots freed tail first): trying the next slot first needs no load to find it, so
            // consecutive steps overlap instead of waiting for each other's `last_child`.
            let next = prev.wrapping_add(1);
            let e = if names(next, entries) {
                next
            } else {
                let child = entries.get(prev as usize).map_or(NOT_HELD, |p| p.last_child);
                if names(child, entries) {
                    child
                } else if let Some(e) = lookup(by_hash, entries, h) {
                    e
                } else {
                    break;
                }
            };
            // The walk keeps `last_child` pointing along the chains it follows (for the next
            // walk).
            if let Some(p) = entries.get_mut(prev as usize) {
                set_child(p, e);
            }
            *id = e;
            found = i + 1;
            let entry = &entries[e as usize];
            if TALLY {
                tally.step(entry, local_blocks);
            }
            // The next block's seed is read from the entry, not taken from `h` (equal, as the
            // entry matched): the next hash then waits for the slab walk, not for this hash.
            parent = entry.hash.0;
            prev = e;
        }
        walked.truncate(found);
        tally
    }

    /// The query's answer (docs §2.4 steps 2–3) from the entry ids of the chain's prefix.
    fn tally(&self, walked: &[u32], out: &mut IndexQuery) {
        // Slots 0–63 stay in a register; higher slots (rare) take the general loop.
        let mut first = self.live_mask[0];
        let more = &self.live_mask[1..];
        let mut global_active = self.global_enabled();
        let mut depth = 0;
        if more.iter().all(|&w| w == 0) {
            for &e in walked {
                let entry = &self.entries[e as usize];
                let keep = first & entry.held;
                if !(keep != 0 || global_active && entry.global_seq != NOT_HELD) {
                    break;
                }
                record_hits(&mut out.local_blocks, 0, first & !keep, depth);
                first = keep;
                if global_active && entry.global_seq == NOT_HELD {
                    global_active = false;
                    out.global_blocks = depth;
                }
                depth += 1;
            }
        } else {
            let extra = more.len();
            let mut active = more.to_vec();
            for &e in walked {
                let entry = &self.entries[e as usize];
                let bits = &self.more_bits[e as usize * extra..(e as usize + 1) * extra];
                let keep = first & entry.held;
                let any = keep != 0 || active.iter().zip(bits).any(|(&a, &b)| a & b != 0);
                if !(any || global_active && entry.global_seq != NOT_HELD) {
                    break;
                }
                record_hits(&mut out.local_blocks, 0, first & !keep, depth);
                first = keep;
                for (w, (a, &held)) in active.iter_mut().zip(bits).enumerate() {
                    record_hits(&mut out.local_blocks, w + 1, *a & !held, depth);
                    *a &= held;
                }
                if global_active && entry.global_seq == NOT_HELD {
                    global_active = false;
                    out.global_blocks = depth;
                }
                depth += 1;
            }
            for (w, &a) in active.iter().enumerate() {
                record_hits(&mut out.local_blocks, w + 1, a, depth);
            }
        }
        // Holders still matching after the last block walked matched `depth` blocks: the
        // deepest match.
        record_hits(&mut out.local_blocks, 0, first, depth);
        if global_active {
            out.global_blocks = depth;
        }
        out.deepest_blocks = depth;
        out.branches = match depth {
            0 => 0,
            d => u32::from(self.entries[walked[d as usize - 1] as usize].children),
        };
    }
}

/// The query's answer (docs §2.4 steps 2–3) as a walk goes down a chain, for instance slots
/// 0–63 and the global tier.
struct Tally {
    /// Instances still matching.
    first: u64,
    global_active: bool,
    /// Some holder matched every block so far.
    matching: bool,
    /// Blocks matched so far (by some holder).
    depth: u32,
    global_blocks: u32,
}

impl Tally {
    fn new(live: u64, global_enabled: bool) -> Self {
        Self {
            first: live,
            global_active: global_enabled,
            matching: live != 0 || global_enabled,
            depth: 0,
            global_blocks: 0,
        }
    }

    /// The next block's entry; the instances that stop matching get their hit.
    #[inline]
    fn step(&mut self, entry: &Entry, local_blocks: &mut [u32]) {
        if !self.matching {
            return;
        }
        let keep = self.first & entry.held;
        let global = self.global_active && entry.global_seq != NOT_HELD;
        if keep == 0 && !global {
            self.matching = false;
            return;
        }
        if keep != self.first {
            record_hits(local_blocks, 0, self.first & !keep, self.depth);
        }
        if self.global_active && !global {
            self.global_active = false;
            self.global_blocks = self.depth;
        }
        self.first = keep;
        self.depth += 1;
    }

    /// Holders still matching matched `depth` blocks, the deepest match.
    fn finish(self, entries: &[Entry], walked: &[u32], out: &mut IndexQuery) {
        record_hits(&mut out.local_blocks, 0, self.first, self.depth);
        out.global_blocks = if self.global_active {
            self.depth
        } else {
            self.global_blocks
        };
        out.deepest_blocks = self.depth;
        out.branches = match self.depth {
            0 => 0,
            d => u32::from(entries[walked[d as usize - 1] as usize].children),
        };
    }
}

/// Sets `local_blocks[slot] = depth` for every slot whose bit is set in `mask`, bitset word `word`.
#[inline]
fn record_hits(local_blocks: &mut [u32], word: usize, mut mask: u64, depth: u32) {
    while mask != 0 {
        local_blocks[word * 64 + mask.trailing_zeros() as usize] = depth;
        mask &= mask - 1;
    }
}
