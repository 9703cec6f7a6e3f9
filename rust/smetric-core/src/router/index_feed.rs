//! Explicit index writes: what an instance's GPU cache, its host pool or the global tier stored
//! or dropped, as KV events (`smetric-vllm`'s ingestor) or a caller report them, and which host
//! pool each instance's non-GPU KV$ lives in (docs §2.8).
//!
//! Invariants: each call (and each batch of [`Router::apply_blocks`]) is applied under one
//! exclusive index lock, so a decision's walk sees all of it or none of it (its own index
//! write may come after a batch its walk did not see, see the `router` module); an op
//! addressed to an unknown instance changes nothing.
//!
//! Complexity: the index's cost per op (`touch` O(run), removal O(1) per block) plus one
//! lock acquisition per call.

use super::Router;
use crate::error::{Result, SmetricError};
use crate::ids::BlockHash;
use crate::index::{Holder, HostPool, KvIndex};
use crate::router::request::{IndexOp, Tier};

/// Where an index write lands: a holder of the index, or an instance's host pool.
#[derive(Clone, Copy)]
enum Target {
    Holder(Holder),
    Host(u32),
}

impl KvIndex {
    fn store_at(&mut self, target: Target, hashes: &[BlockHash], parent: Option<BlockHash>, now_ms: u64) {
        match target {
            Target::Holder(holder) => self.touch(holder, hashes, parent, now_ms),
            Target::Host(slot) => self.touch_host(slot, hashes, parent, now_ms),
        }
    }

    fn remove_at(&mut self, target: Target, hashes: &[BlockHash]) {
        match target {
            Target::Holder(holder) => self.remove(holder, hashes),
            Target::Host(slot) => self.remove_host(slot, hashes),
        }
    }
}

impl Router {
    fn target(&self, instance: Option<&str>, tier: Tier) -> Result<Target> {
        let slot = |name: &str| Ok(self.fleet.load().by_name(name)?.0);
        match (tier, instance) {
            (Tier::Global, _) => Ok(Target::Holder(Holder::Global)),
            (Tier::Local, Some(name)) => Ok(Target::Holder(Holder::Instance(slot(name)?))),
            (Tier::Host, Some(name)) => Ok(Target::Host(slot(name)?)),
            (Tier::Local | Tier::Host, None) => Err(SmetricError::InvalidArgument {
                argument: "instance",
                reason: format!("tier=\"{}\" needs an instance name", tier.name()),
            }),
        }
    }

    /// Puts `instance`'s non-GPU KV$ into `pool`: its own host memory (the default, credited
    /// to it alone) or a store shared with every instance named into the same pool (docs
    /// §2.8). What its old pool held stays with that pool.
    pub fn set_host_pool(&self, instance: &str, pool: &HostPool) -> Result<()> {
        let mut index = self.write_index();
        let slot = self.fleet.load().by_name(instance)?.0;
        index.set_host_pool(slot, pool);
        Ok(())
    }

    /// `instance`'s host pool; None when host tiers are off (`host_capacity_blocks = 0`).
    pub fn host_pool(&self, instance: &str) -> Result<Option<HostPool>> {
        let index = self.index.read();
        let slot = self.fleet.load().by_name(instance)?.0;
        Ok(index.host_pool(slot))
    }

    /// Records that `instance` (or the global tier) now holds `hashes`, a run continuing `parent`.
    pub fn store_blocks(
        &self,
        instance: Option<&str>,
        tier: Tier,
        hashes: &[BlockHash],
        parent: Option<BlockHash>,
        now: Option<f64>,
    ) -> Result<()> {
        let now_ms = self.now_ms(now)?;
        let mut index = self.write_index();
        let target = self.target(instance, tier)?;
        index.store_at(target, hashes, parent, now_ms);
        Ok(())
    }

    /// Records that `instance` (or the global tier) dropped `hashes`.
    pub fn remove_blocks(&self, instance: Option<&str>, tier: Tier, hashes: &[BlockHash]) -> Result<()> {
        let mut index = self.write_index();
        let target = self.target(instance, tier)?;
        index.remove_at(target, hashes);
        Ok(())
    }

    /// Applies `ops` in order under one index lock and one clock reading: the same as calling
    /// [`Router::store_blocks`] / [`Router::remove_blocks`] with `instance` for each op, but
    /// `instance` is resolved once. An op that fails (its tier is `Local` or `Host` and
    /// `instance` is absent or unknown) is skipped and the others still apply; the first error is returned.
    ///
    /// Complexity: the sum of the ops' costs, plus one lock acquisition and one name lookup.
    pub fn apply_blocks(&self, instance: Option<&str>, ops: &[IndexOp<'_>], now: Option<f64>) -> Result<()> {
        let now_ms = self.now_ms(now)?;
        let mut index = self.write_index();
        self.apply_locked(&mut index, instance, ops, now_ms)
    }

    /// [`Router::apply_blocks`] if the index lock is free right now; `None` (and nothing
    /// applied) if a decision (walking, deciding or writing) or another write holds it. A feed that can hold its writes back
    /// (the KV-event ingestor, between the messages of one drained socket) tries this first,
    /// so that it neither waits behind a decision nor makes one wait behind a long batch.
    pub fn try_apply_blocks(
        &self,
        instance: Option<&str>,
        ops: &[IndexOp<'_>],
        now: Option<f64>,
    ) -> Option<Result<()>> {
        let now_ms = match self.now_ms(now) {
            Ok(ms) => ms,
            Err(e) => return Some(Err(e)),
        };
        let mut index = self.index.try_write()?;
        self.drain_deferred(&mut index);
        Some(self.apply_locked(&mut index, instance, ops, now_ms))
    }

    /// The writes of [`Router::apply_blocks`], the index lock held.
    fn apply_locked(
        &self,
        index: &mut KvIndex,
        instance: Option<&str>,
        ops: &[IndexOp<'_>],
        now_ms: u64,
    ) -> Result<()> {
        // Resolved under the lock (fleet changes take it too): a slot cannot change hands
        // between the lookup and the writes.
        let mut local = None;
        let mut first_error = None;
        for op in ops {
            let tier = match *op {
                IndexOp::Store { tier, .. } | IndexOp::Remove { tier, .. } => tier,
            };
            let slot = match tier {
                Tier::Global => None,
                Tier::Local | Tier::Host => match local.get_or_insert_with(|| self.target(instance, tier)) {
                    Ok(Target::Holder(Holder::Instance(slot)) | Target::Host(slot)) => Some(*slot),
                    Ok(Target::Holder(Holder::Global)) => None,
                    Err(e) => {
                        first_error.get_or_insert_with(|| e.clone());
                        continue;
                    }
                },
            };
            let target = match (tier, slot) {
                (Tier::Local, Some(slot)) => Target::Holder(Holder::Instance(slot)),
                (Tier::Host, Some(slot)) => Target::Host(slot),
                _ => Target::Holder(Holder::Global),
            };
            match *op {
                IndexOp::Store { hashes, parent, .. } => index.store_at(target, hashes, parent, now_ms),
                IndexOp::Remove { hashes, .. } => index.remove_at(target, hashes),
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Drops everything `instance` (or the global tier, or `instance`'s host pool) holds.
    pub fn clear(&self, instance: Option<&str>, tier: Tier) -> Result<()> {
        let mut index = self.write_index();
        match self.target(instance, tier)? {
            Target::Holder(Holder::Instance(slot)) => index.clear_instance(slot),
            Target::Holder(Holder::Global) => index.clear_global(),
            Target::Host(slot) => index.clear_host(slot),
        }
        Ok(())
    }
}
