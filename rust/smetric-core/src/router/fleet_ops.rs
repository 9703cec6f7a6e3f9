//! Fleet changes (instances joining and leaving) and engine load snapshots.
//!
//! Invariants: a fleet change happens under the index's exclusive lock, so the index's slots
//! and the published [`crate::fleet::Fleet`] change together and no decision sees one without
//! the other (a decision holds the shared lock from its walk to its load bump; its index
//! write under the exclusive lock, if any, is dropped if its instance left meanwhile); a
//! slot reused by a new instance gets a new generation, so the old occupant's requests never
//! touch the new one's counters.
//!
//! Complexity: add O(instances); remove O(instances + blocks the instance held); load
//! updates and reads O(1), lock-free.

use std::sync::Arc;

use super::Router;
use crate::error::{Result, SmetricError};
use crate::ids::InstanceId;
use crate::load::{LoadEffect, LoadSnapshot, PeerLoad};

impl Router {
    /// Adds an instance (empty index, zero load).
    pub fn add_instance(&self, name: &str) -> Result<InstanceId> {
        let mut index = self.write_index();
        let mut fleet = (**self.fleet.load()).clone();
        let slot = fleet.add(name)?;
        index.add_slot(slot);
        self.fleet.store(Arc::new(fleet));
        Ok(InstanceId(slot))
    }

    /// Removes an instance; its index entries and load go with it. Requests in flight on it
    /// are forgotten by their later lifecycle calls.
    pub fn remove_instance(&self, name: &str) -> Result<()> {
        let mut index = self.write_index();
        let mut fleet = (**self.fleet.load()).clone();
        let slot = fleet.remove(name)?;
        index.remove_slot(slot);
        self.fleet.store(Arc::new(fleet));
        Ok(())
    }

    /// Stores an engine load snapshot for `instance`.
    pub fn update_load(
        &self,
        instance: &str,
        running: Option<u64>,
        waiting: Option<u64>,
        kv_usage: Option<f64>,
        now: Option<f64>,
    ) -> Result<()> {
        let now_ms = self.now_ms(now)?;
        if let Some(k) = kv_usage
            && !(k.is_finite() && (0.0..=1.0).contains(&k))
        {
            return Err(SmetricError::InvalidArgument {
                argument: "kv_usage",
                reason: format!("must be in [0, 1], got {k}"),
            });
        }
        let fleet = self.fleet.load();
        let (_, m) = fleet.by_name(instance)?;
        m.load.update_engine(running, waiting, kv_usage, now_ms);
        Ok(())
    }

    /// Applies a load effect that happened elsewhere (a peer router replica's request) to the
    /// board of the instance in `slot`, so that this router's decisions count it. Returns
    /// whether the slot holds a live instance. The effect is added to the router's own
    /// counters: the caller applies each request's effects in order, exactly once (its
    /// `Routed`, then `Prefilled`, then `Done`), and the counters saturate at zero if it does
    /// not. Lock-free: O(1) atomics.
    pub fn apply_load_effect(&self, slot: InstanceId, effect: LoadEffect) -> bool {
        let fleet = self.fleet.load();
        fleet.member(slot.0).map(|m| m.load.apply(effect)).is_some()
    }

    /// Replaces the in-flight work peer router replicas have on `instance` (their own boards'
    /// counters summed, from their last snapshots on the replica bus): decisions add it to this
    /// router's own counts. O(1), lock-free.
    pub fn set_peer_load(&self, instance: &str, peers: PeerLoad) -> Result<()> {
        let fleet = self.fleet.load();
        fleet.by_name(instance)?.1.load.set_peers(&peers);
        Ok(())
    }

    /// The peers' in-flight work on `instance`, as last set.
    pub fn peer_load(&self, instance: &str) -> Result<PeerLoad> {
        let fleet = self.fleet.load();
        Ok(fleet.by_name(instance)?.1.load.peers())
    }

    /// The load counters of `instance`.
    pub fn load(&self, instance: &str) -> Result<LoadSnapshot> {
        let fleet = self.fleet.load();
        Ok(fleet.by_name(instance)?.1.load.snapshot())
    }
}
