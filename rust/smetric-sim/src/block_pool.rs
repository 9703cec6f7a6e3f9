//! GPU KV block pool of one instance with vLLM v1 prefix-caching semantics.
//!
//! Model (vLLM v1 `BlockPool` / `KVCacheManager`):
//! * A fixed number of physical blocks of `block_tokens` tokens each.
//! * A full block whose content is known (a trace hash id) is *registered* under its chained
//!   hash; a lookup finds the longest prefix of a request's hash chain whose blocks are all
//!   registered. Only full blocks are ever registered, so partial tails never hit.
//! * A block's `ref_cnt` counts the running requests using it. A block with `ref_cnt == 0`
//!   sits in the *free queue*, an LRU list: allocation pops the head; a freed block is pushed
//!   to the tail. A request frees its blocks tail first, so a chain's tail is evicted before
//!   its head. A popped block that still carries a hash loses it (that is the eviction).
//! * Hitting a free cached block takes it out of the free queue (it is in use again).
//!
//! Invariants: a block is in the free queue iff `ref_cnt == 0`; `cached` maps a hash to
//! exactly one block carrying that hash (a second block computing the same content stays
//! anonymous, as in vLLM where a duplicate is never served); `free_len` is the queue length.
//!
//! Complexity: every operation is O(1) per block touched (hash-map lookups are expected
//! O(1)); nothing is ever per token.

use hashbrown::HashMap;

use crate::cache_events::{CacheLog, Medium};

/// End-of-list marker of the intrusive free queue.
const NIL: u32 = u32::MAX;

#[derive(Clone, Copy, Debug)]
struct Block {
    /// Chained hash of the block's content, meaningful only when `hashed`.
    hash: u64,
    hashed: bool,
    ref_cnt: u32,
    prev: u32,
    next: u32,
}

/// The block pool of one instance.
#[derive(Clone, Debug)]
pub struct BlockPool {
    blocks: Vec<Block>,
    free_head: u32,
    free_tail: u32,
    free_len: u32,
    cached: HashMap<u64, u32>,
    evictions: u64,
    /// What vLLM's block pool would publish: blocks newly cached, blocks evicted (disabled
    /// unless the router is fed by events or the oracle).
    pub log: CacheLog,
}

impl BlockPool {
    /// A pool of `num_blocks` empty blocks, all in the free queue in index order.
    pub fn new(num_blocks: u32) -> Self {
        let blocks = (0..num_blocks)
            .map(|i| Block {
                hash: 0,
                hashed: false,
                ref_cnt: 0,
                prev: if i == 0 { NIL } else { i - 1 },
                next: if i + 1 == num_blocks { NIL } else { i + 1 },
            })
            .collect();
        Self {
            blocks,
            free_head: if num_blocks == 0 { NIL } else { 0 },
            free_tail: if num_blocks == 0 { NIL } else { num_blocks - 1 },
            free_len: num_blocks,
            cached: HashMap::with_capacity(num_blocks as usize),
            evictions: 0,
            log: CacheLog::default(),
        }
    }

    /// Physical blocks in the pool.
    pub fn capacity(&self) -> u32 {
        self.blocks.len() as u32
    }

    /// Blocks in the free queue (empty or cached with no user): what allocation can take.
    pub fn num_free(&self) -> u32 {
        self.free_len
    }

    /// Share of blocks in use by running requests (vLLM's `kv_cache_usage`).
    pub fn usage(&self) -> f64 {
        if self.blocks.is_empty() {
            return 0.0;
        }
        1.0 - f64::from(self.free_len) / self.blocks.len() as f64
    }

    /// Blocks registered under a hash now (what a prefix lookup can hit).
    pub fn cached_blocks(&self) -> usize {
        self.cached.len()
    }

    /// Cached blocks that were evicted (re-used for other content) so far.
    pub fn evictions(&self) -> u64 {
        self.evictions
    }

    /// Length of the longest prefix of `chain` that is registered, at most `max_blocks`.
    pub fn longest_hit(&self, chain: &[u64], max_blocks: usize) -> usize {
        chain
            .iter()
            .take(max_blocks)
            .take_while(|h| self.cached.contains_key(*h))
            .count()
    }

    /// True when `chain` (a prefix that [`Self::longest_hit`] reported) can be acquired and
    /// `new_blocks` more allocated. Cached hits that sit in the free queue stop being free
    /// once acquired, so they are subtracted first (vLLM's `num_evictable_computed_blocks`).
    pub fn can_allocate(&self, hit_chain: &[u64], new_blocks: u32) -> bool {
        let evictable_hits = hit_chain
            .iter()
            .filter(|h| {
                self.cached
                    .get(*h)
                    .is_some_and(|&b| self.blocks[b as usize].ref_cnt == 0)
            })
            .count() as u32;
        new_blocks <= self.free_len - evictable_hits.min(self.free_len)
    }

    /// Takes a reference on the registered blocks of `hit_chain`, appending them to `out`.
    /// Hashes that are not registered are skipped (callers pass a prefix they just looked up).
    pub fn acquire_hits(&mut self, hit_chain: &[u64], out: &mut Vec<u32>) {
        for h in hit_chain {
            let Some(&b) = self.cached.get(h) else { break };
            if self.blocks[b as usize].ref_cnt == 0 {
                self.unlink(b);
            }
            self.blocks[b as usize].ref_cnt += 1;
            out.push(b);
        }
    }

    /// Pops `n` blocks from the head of the free queue into `out`, evicting any hash they
    /// carry. Returns false (and takes nothing) when fewer than `n` are free.
    pub fn allocate(&mut self, n: u32, out: &mut Vec<u32>) -> bool {
        if n > self.free_len {
            return false;
        }
        for _ in 0..n {
            let b = self.free_head;
            self.unlink(b);
            let block = &mut self.blocks[b as usize];
            if block.hashed {
                block.hashed = false;
                self.cached.remove(&block.hash);
                self.evictions += 1;
                self.log.removed(Medium::Gpu, block.hash);
            }
            block.ref_cnt = 1;
            out.push(b);
        }
        true
    }

    /// Registers `block` (full, in use) under `hash` so later lookups hit it; true if it was.
    /// A hash already registered on another block, or a block already carrying a hash, is
    /// left alone. Not logged: [`Self::register_chain`] logs what it registers.
    pub fn register(&mut self, block: u32, hash: u64) -> bool {
        let entry = &mut self.blocks[block as usize];
        if entry.hashed {
            return false;
        }
        if let hashbrown::hash_map::Entry::Vacant(slot) = self.cached.entry(hash) {
            slot.insert(block);
            entry.hashed = true;
            entry.hash = hash;
            return true;
        }
        false
    }

    /// Registers `blocks[k]` under `chain[k]`, where `parent` is the chain block before
    /// `chain[0]`, and logs each run of newly registered blocks as one store (vLLM's
    /// `BlockStored` from `cache_full_blocks`), its parent the chain block before the run.
    pub fn register_chain(&mut self, blocks: &[u32], chain: &[u64], parent: Option<u64>) {
        let mut run_start = None;
        for (k, (&block, &hash)) in blocks.iter().zip(chain).enumerate() {
            if self.register(block, hash) {
                run_start.get_or_insert(k);
            } else if let Some(start) = run_start.take() {
                self.log_run(chain, start, k, parent);
            }
        }
        if let Some(start) = run_start {
            self.log_run(chain, start, blocks.len().min(chain.len()), parent);
        }
    }

    fn log_run(&mut self, chain: &[u64], start: usize, end: usize, parent: Option<u64>) {
        let run_parent = if start == 0 { parent } else { Some(chain[start - 1]) };
        self.log.stored(Medium::Gpu, run_parent, &chain[start..end]);
    }

    /// Drops one reference on each of `blocks`, walking them tail first so that the free
    /// queue evicts a chain's tail before its head. Blocks reaching zero join the queue tail.
    pub fn release(&mut self, blocks: &[u32]) {
        for &b in blocks.iter().rev() {
            let block = &mut self.blocks[b as usize];
            debug_assert!(block.ref_cnt > 0, "releasing a free block");
            block.ref_cnt = block.ref_cnt.saturating_sub(1);
            if block.ref_cnt == 0 {
                self.push_tail(b);
            }
        }
    }

    fn unlink(&mut self, b: u32) {
        let Block { prev, next, .. } = self.blocks[b as usize];
        if prev == NIL {
            self.free_head = next;
        } else {
            self.blocks[prev as usize].next = next;
        }
        if next == NIL {
            self.free_tail = prev;
        } else {
            self.blocks[next as usize].prev = prev;
        }
        self.blocks[b as usize].prev = NIL;
        self.blocks[b as usize].next = NIL;
        self.free_len -= 1;
    }

    fn push_tail(&mut self, b: u32) {
        self.blocks[b as usize].prev = self.free_tail;
        self.blocks[b as usize].next = NIL;
        if self.free_tail == NIL {
            self.free_head = b;
        } else {
            self.blocks[self.free_tail as usize].next = b;
        }
        self.free_tail = b;
        self.free_len += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fill(pool: &mut BlockPool, chain: &[u64]) -> Vec<u32> {
        let mut got = Vec::new();
        assert!(pool.allocate(chain.len() as u32, &mut got));
        for (&b, &h) in got.iter().zip(chain) {
            pool.register(b, h);
        }
        got
    }

    #[test]
    fn freed_blocks_stay_cached_until_reused() {
        let mut pool = BlockPool::new(4);
        let blocks = fill(&mut pool, &[10, 11, 12]);
        assert_eq!(pool.num_free(), 1);
        pool.release(&blocks);
        assert_eq!(pool.num_free(), 4);
        assert_eq!(pool.longest_hit(&[10, 11, 12, 13], 10), 3);
        assert_eq!(pool.longest_hit(&[10, 11, 12, 13], 2), 2);
        assert_eq!(pool.longest_hit(&[99, 10], 10), 0);
    }

    #[test]
    fn eviction_takes_lru_and_chain_tail_first() {
        let mut pool = BlockPool::new(3);
        let a = fill(&mut pool, &[1, 2, 3]);
        pool.release(&a);
        // Free queue is now 3, 2, 1 (tail first), so one new block evicts hash 3.
        let mut got = Vec::new();
        assert!(pool.allocate(1, &mut got));
        assert_eq!(pool.longest_hit(&[1, 2, 3], 10), 2);
        assert_eq!(pool.evictions(), 1);
        assert!(!pool.allocate(3, &mut got), "only two blocks are free");
    }

    #[test]
    fn acquiring_a_free_hit_removes_it_from_the_queue() {
        let mut pool = BlockPool::new(3);
        let a = fill(&mut pool, &[1, 2]);
        pool.release(&a);
        assert!(pool.can_allocate(&[1, 2], 1));
        assert!(!pool.can_allocate(&[1, 2], 2));
        let mut got = Vec::new();
        pool.acquire_hits(&[1, 2], &mut got);
        assert_eq!(pool.num_free(), 1);
        assert!(pool.allocate(1, &mut got));
        assert_eq!(pool.num_free(), 0);
        assert!((pool.usage() - 1.0).abs() < 1e-12);
        pool.release(&got);
        assert_eq!(pool.num_free(), 3);
    }

    #[test]
    fn shared_blocks_are_freed_by_the_last_user() {
        let mut pool = BlockPool::new(2);
        let a = fill(&mut pool, &[7]);
        let mut b = Vec::new();
        pool.acquire_hits(&[7], &mut b);
        pool.release(&a);
        assert_eq!(pool.num_free(), 1);
        pool.release(&b);
        assert_eq!(pool.num_free(), 2);
    }

    #[test]
    fn duplicate_content_stays_anonymous() {
        let mut pool = BlockPool::new(2);
        let a = fill(&mut pool, &[5]);
        let b = fill(&mut pool, &[5]);
        pool.release(&b);
        // The duplicate carried no hash, so reusing it evicts nothing.
        let mut got = Vec::new();
        assert!(pool.allocate(1, &mut got));
        assert_eq!(pool.evictions(), 0);
        assert_eq!(pool.longest_hit(&[5], 1), 1);
        pool.release(&a);
    }
}
