//! Host tiers: the KV$ an instance keeps in its own host memory (vLLM's `OffloadingConnector`,
//! LMCache's local CPU backend), or in a store a set of instances shares (a node-local store),
//! as opposed to the cluster-wide global tier every instance reads (Mooncake, a shared LMCache
//! server) — docs/routing-semantics.md §2.8.
//!
//! Algorithm: a *pool* is one holder of a second, inner [`KvIndex`] (pool ids are its slots;
//! no global tier, no TTL, no sent blocks). Every instance slot belongs to exactly one pool:
//! its own (made when the slot is added, the default) or a named one shared with the other
//! instances named into it. A host-tier write from an instance goes to its pool; a query
//! walks the inner index only when some pool holds a block, and reports, per instance slot,
//! the prefix its pool holds. So a block offloaded by one instance is credited to that
//! instance (and the instances sharing its pool), never to the rest of the fleet.
//!
//! Invariants: every live instance slot maps to a live pool; a pool is live iff some live
//! instance maps to it (the last member leaving drops the pool's blocks); a pool holds at
//! most `host_capacity` blocks (the inner index's per-holder capacity), so the tier's memory
//! is bounded by `pools · host_capacity` entries and pools ≤ instances. Pool ids are reused
//! through a free list, so the inner bitsets stay as wide as the live pools.
//!
//! Complexity: a query costs nothing while no pool holds a block, else the inner walk
//! (O(matched blocks · ⌈pools/64⌉)) plus O(instances) to map pools to slots; a write as the
//! inner index's (`touch` O(run) amortised, removal O(1) per block); adding or moving an
//! instance O(1) (O(blocks held) when it empties a pool).

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;

use super::{Holder, IndexLimits, IndexQuery, KvIndex, Walk};
use crate::ids::BlockHash;

/// `pool_of` of a slot that is not live.
const NO_POOL: u32 = u32::MAX;

/// Which host pool an instance's non-GPU KV$ lives in.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum HostPool {
    /// The instance's own host memory: credited to it alone (the default).
    Own,
    /// A store shared by every instance named into the same pool (e.g. one node's).
    Shared(Arc<str>),
}

/// The pools and their inner index (see the module docs).
#[derive(Debug)]
pub(super) struct HostTiers {
    index: KvIndex,
    /// Per instance slot, its pool id ([`NO_POOL`] when the slot is not live).
    pool_of: Vec<u32>,
    /// Per pool id, the instances in it (0: the id is free).
    members: Vec<u32>,
    /// Named pools' ids.
    named: HashMap<Arc<str>, u32>,
    free: Vec<u32>,
}

thread_local! {
    /// The calling thread's inner query buffers: the host walk runs inside a decision's walk.
    static SCRATCH: RefCell<(IndexQuery, Walk)> = RefCell::new(Default::default());
}

impl HostTiers {
    pub(super) fn new(capacity: u64) -> Self {
        Self {
            index: KvIndex::new(IndexLimits {
                local_capacity: capacity,
                global_capacity: 0,
                local_ttl_ms: None,
            }),
            pool_of: Vec::new(),
            members: Vec::new(),
            named: HashMap::new(),
            free: Vec::new(),
        }
    }

    fn new_pool(&mut self) -> u32 {
        let id = self.free.pop().unwrap_or(self.members.len() as u32);
        if self.members.len() <= id as usize {
            self.members.resize(id as usize + 1, 0);
        }
        self.index.add_slot(id);
        id
    }

    /// Takes `slot` out of its pool; the pool goes (with its blocks) when it was the last member.
    fn leave(&mut self, slot: u32) {
        let Some(&pool) = self.pool_of.get(slot as usize) else {
            return;
        };
        if pool == NO_POOL {
            return;
        }
        self.pool_of[slot as usize] = NO_POOL;
        self.members[pool as usize] -= 1;
        if self.members[pool as usize] == 0 {
            self.index.remove_slot(pool);
            self.named.retain(|_, id| *id != pool);
            self.free.push(pool);
        }
    }

    /// Puts `slot` into `pool` (leaving its current one).
    pub(super) fn join(&mut self, slot: u32, pool: &HostPool) {
        if let HostPool::Shared(name) = pool
            && self
                .named
                .get(name)
                .is_some_and(|&id| self.pool_of.get(slot as usize) == Some(&id))
        {
            return;
        }
        self.leave(slot);
        let id = match pool {
            HostPool::Own => self.new_pool(),
            HostPool::Shared(name) => {
                if let Some(&id) = self.named.get(name) {
                    id
                } else {
                    let id = self.new_pool();
                    self.named.insert(name.clone(), id);
                    id
                }
            }
        };
        if self.pool_of.len() <= slot as usize {
            self.pool_of.resize(slot as usize + 1, NO_POOL);
        }
        self.pool_of[slot as usize] = id;
        self.members[id as usize] += 1;
    }

    /// A new instance slot: its own pool.
    pub(super) fn add_slot(&mut self, slot: u32) {
        self.join(slot, &HostPool::Own);
    }

    pub(super) fn remove_slot(&mut self, slot: u32) {
        self.leave(slot);
    }

    fn pool(&self, slot: u32) -> Option<u32> {
        self.pool_of.get(slot as usize).copied().filter(|&p| p != NO_POOL)
    }

    /// The pool `slot` belongs to: `Own`, or the shared pool's name.
    pub(super) fn pool_name(&self, slot: u32) -> Option<HostPool> {
        let id = self.pool(slot)?;
        Some(
            self.named
                .iter()
                .find(|(_, p)| **p == id)
                .map_or(HostPool::Own, |(name, _)| HostPool::Shared(name.clone())),
        )
    }

    pub(super) fn touch(&mut self, slot: u32, run: &[BlockHash], parent: Option<BlockHash>, now_ms: u64) {
        if let Some(pool) = self.pool(slot) {
            self.index.touch(Holder::Instance(pool), run, parent, now_ms);
        }
    }

    pub(super) fn remove(&mut self, slot: u32, hashes: &[BlockHash]) {
        if let Some(pool) = self.pool(slot) {
            self.index.remove(Holder::Instance(pool), hashes);
        }
    }

    pub(super) fn clear(&mut self, slot: u32) {
        if let Some(pool) = self.pool(slot) {
            self.index.clear_instance(pool);
        }
    }

    /// Touches `chain` in `slot`'s pool in place when the pool already holds all of it
    /// ([`KvIndex::refront_walked`]), from the walk this thread's last [`HostTiers::query`]
    /// made — the query of the same decision, under the same shared lock. False (nothing
    /// changed) otherwise: the caller then writes it under the exclusive lock.
    pub(super) fn refront(&self, slot: u32, chain: &[BlockHash], now_ms: u64) -> bool {
        let Some(pool) = self.pool(slot) else {
            return false;
        };
        SCRATCH.with(|cell| {
            cell.try_borrow()
                .is_ok_and(|pair| self.index.refront_walked(pool, chain, now_ms, &pair.1, &pair.0, || {}))
        })
    }

    /// Blocks held by `slot`'s pool.
    pub(super) fn held(&self, slot: u32) -> usize {
        self.pool(slot).map_or(0, |p| {
            self.index.stats().local_blocks.get(p as usize).copied().unwrap_or(0)
        })
    }

    pub(super) fn holds(&self, slot: u32, hash: BlockHash) -> bool {
        self.pool(slot)
            .is_some_and(|p| self.index.holds(Holder::Instance(p), hash))
    }

    pub(super) fn evictions(&self) -> u64 {
        self.index.evictions
    }

    pub(super) fn memory_bytes(&self) -> usize {
        self.index.memory_bytes() + self.pool_of.capacity() * 4 + self.members.capacity() * 4
    }

    /// Fills `out.host_blocks` (per instance slot, the prefix of `chain` its pool holds) and
    /// deepens `out.deepest_blocks` / `out.branches` when a pool matched deeper than the
    /// other holders. Reads only.
    pub(super) fn query(&self, chain: &[BlockHash], now_ms: u64, out: &mut IndexQuery) {
        out.host_blocks.clear();
        if self.index.by_hash.is_empty() {
            // No walk: the thread's last one (of another chain) must not be renewed from.
            SCRATCH.with(|cell| {
                if let Ok(mut pair) = cell.try_borrow_mut() {
                    pair.1.ids.clear();
                }
            });
            return;
        }
        let fill = |q: &mut IndexQuery, walk: &mut Walk, out: &mut IndexQuery| {
            self.index.query_shared(chain, now_ms, q, walk);
            out.host_blocks.extend(
                self.pool_of
                    .iter()
                    .map(|&p| if p == NO_POOL { 0 } else { q.local_blocks[p as usize] }),
            );
            if q.deepest_blocks > out.deepest_blocks {
                out.deepest_blocks = q.deepest_blocks;
                out.branches = q.branches;
            }
        };
        SCRATCH.with(|cell| {
            if let Ok(mut pair) = cell.try_borrow_mut() {
                let (q, walk) = &mut *pair;
                fill(q, walk, out);
            } else {
                // A re-entrant call (none today) uses buffers of its own rather than panicking.
                fill(&mut IndexQuery::default(), &mut Walk::default(), out);
            }
        });
    }
}
