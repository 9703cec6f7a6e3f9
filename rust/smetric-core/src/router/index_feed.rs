//! Explicit index writes: what an instance's GPU cache or the global tier stored or dropped,
//! as KV events (`smetric-vllm`'s ingestor) or a caller report them.
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
use crate::index::{Holder, KvIndex};
use crate::router::request::{IndexOp, Tier};

impl Router {
    fn holder(&self, instance: Option<&str>, tier: Tier) -> Result<Holder> {
        match (tier, instance) {
            (Tier::Global, _) => Ok(Holder::Global),
            (Tier::Local, Some(name)) => Ok(Holder::Instance(self.fleet.load().by_name(name)?.0)),
            (Tier::Local, None) => Err(SmetricError::InvalidArgument {
                argument: "instance",
                reason: "tier=\"local\" needs an instance name".to_owned(),
            }),
        }
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
        let mut index = self.index.write();
        let holder = self.holder(instance, tier)?;
        index.touch(holder, hashes, parent, now_ms);
        Ok(())
    }

    /// Records that `instance` (or the global tier) dropped `hashes`.
    pub fn remove_blocks(&self, instance: Option<&str>, tier: Tier, hashes: &[BlockHash]) -> Result<()> {
        let mut index = self.index.write();
        let holder = self.holder(instance, tier)?;
        index.remove(holder, hashes);
        Ok(())
    }

    /// Applies `ops` in order under one index lock and one clock reading: the same as calling
    /// [`Router::store_blocks`] / [`Router::remove_blocks`] with `instance` for each op, but
    /// `instance` is resolved once. An op that fails (its tier is `Local` and `instance` is
    /// absent or unknown) is skipped and the others still apply; the first error is returned.
    ///
    /// Complexity: the sum of the ops' costs, plus one lock acquisition and one name lookup.
    pub fn apply_blocks(&self, instance: Option<&str>, ops: &[IndexOp<'_>], now: Option<f64>) -> Result<()> {
        let now_ms = self.now_ms(now)?;
        let mut index = self.index.write();
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
            let holder = match tier {
                Tier::Global => Holder::Global,
                Tier::Local => match local.get_or_insert_with(|| self.holder(instance, Tier::Local)) {
                    Ok(holder) => *holder,
                    Err(e) => {
                        first_error.get_or_insert_with(|| e.clone());
                        continue;
                    }
                },
            };
            match *op {
                IndexOp::Store { hashes, parent, .. } => index.touch(holder, hashes, parent, now_ms),
                IndexOp::Remove { hashes, .. } => index.remove(holder, hashes),
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Drops everything `instance` (or the global tier) holds.
    pub fn clear(&self, instance: Option<&str>, tier: Tier) -> Result<()> {
        let mut index = self.index.write();
        match self.holder(instance, tier)? {
            Holder::Instance(slot) => index.clear_instance(slot),
            Holder::Global => index.clear_global(),
        }
        Ok(())
    }
}
