//! The fleet: instance names, slots and their load counters, published as an immutable
//! snapshot so that routing reads it without a lock.
//!
//! Slots are reused: `add_instance` takes the lowest free slot and bumps its generation, so
//! a request routed to an earlier occupant of the slot can never touch the new occupant's
//! counters (lifecycle calls compare generations).
//!
//! Complexity: lookups by slot O(1), by name O(N) (N is a fleet size, tens to a thousand,
//! and name lookups only happen on control-plane calls).

use std::sync::Arc;

use crate::error::{Result, SmetricError};
use crate::load::InstanceLoad;

/// One occupied slot.
#[derive(Debug, Clone)]
pub struct Member {
    /// The instance's name (e.g. its base URL).
    pub name: Arc<str>,
    /// `xxh3_64` (seed 0) of the name's UTF-8 bytes: the instance's identity to the hash
    /// policies (`consistent_hash`, `rendezvous_hash`), so a name keeps its keys across slots.
    pub name_hash: u64,
    /// Bumped every time the slot gets a new occupant.
    pub generation: u32,
    /// Its load counters.
    pub load: Arc<InstanceLoad>,
}

/// An immutable view of the fleet.
#[derive(Debug, Clone, Default)]
pub struct Fleet {
    slots: Vec<Option<Member>>,
    /// Generation of each slot's latest occupant (kept when the slot is freed).
    generations: Vec<u32>,
}

impl Fleet {
    /// A fleet of the given names in slots `0..`.
    pub fn new(names: &[String]) -> Result<Self> {
        let mut fleet = Self::default();
        for name in names {
            fleet.add(name)?;
        }
        Ok(fleet)
    }

    /// Adds `name` in the lowest free slot and returns the slot.
    pub fn add(&mut self, name: &str) -> Result<u32> {
        if self.slot_of(name).is_some() {
            return Err(SmetricError::DuplicateInstance { name: name.to_owned() });
        }
        let slot = self.slots.iter().position(Option::is_none).unwrap_or(self.slots.len());
        if slot as u32 >= crate::index::MAX_SLOTS {
            return Err(SmetricError::InvalidArgument {
                argument: "instances",
                reason: format!("a router addresses at most {} instances", crate::index::MAX_SLOTS),
            });
        }
        if slot == self.slots.len() {
            self.slots.push(None);
            self.generations.push(0);
        }
        self.generations[slot] += 1;
        self.slots[slot] = Some(Member {
            name: Arc::from(name),
            name_hash: xxhash_rust::xxh3::xxh3_64(name.as_bytes()),
            generation: self.generations[slot],
            load: Arc::default(),
        });
        Ok(slot as u32)
    }

    /// Frees `name`'s slot and returns it.
    pub fn remove(&mut self, name: &str) -> Result<u32> {
        let slot = self
            .slot_of(name)
            .ok_or_else(|| SmetricError::UnknownInstance { name: name.to_owned() })?;
        self.slots[slot as usize] = None;
        Ok(slot)
    }

    /// The slot of `name`, if present.
    pub fn slot_of(&self, name: &str) -> Option<u32> {
        self.slots
            .iter()
            .position(|m| m.as_ref().is_some_and(|m| &*m.name == name))
            .map(|s| s as u32)
    }

    /// The member in `slot`, if occupied.
    pub fn member(&self, slot: u32) -> Option<&Member> {
        self.slots.get(slot as usize).and_then(Option::as_ref)
    }

    /// The member called `name`.
    pub fn by_name(&self, name: &str) -> Result<(u32, &Member)> {
        let slot = self
            .slot_of(name)
            .ok_or_else(|| SmetricError::UnknownInstance { name: name.to_owned() })?;
        Ok((slot, self.member(slot).expect("slot_of returns occupied slots")))
    }

    /// Occupied slots in slot order.
    pub fn members(&self) -> impl Iterator<Item = (u32, &Member)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(s, m)| m.as_ref().map(|m| (s as u32, m)))
    }

    /// Number of slots, occupied or not: every slot is below it.
    pub fn slots(&self) -> usize {
        self.slots.len()
    }

    /// Number of live instances.
    pub fn len(&self) -> usize {
        self.members().count()
    }

    /// Whether no instance is live.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
