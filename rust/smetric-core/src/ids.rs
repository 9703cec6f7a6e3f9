//! Identifier newtypes used on the hot path.
//!
//! Raw integers and strings never travel through the routing core: a block is a
//! [`BlockHash`], an instance slot an [`InstanceId`], a request a [`RequestId`]. The
//! wrappers are `Copy` and cost nothing at run time.

use std::fmt;

/// Chained 64-bit hash of one full KV block; it covers the block's whole prefix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockHash(pub u64);

/// Slot of an instance in the router's fleet. Slots are reused after removal; a
/// generation counter tells the occupants apart (see `fleet`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct InstanceId(pub u32);

/// Identifier of one routed request, used by the lifecycle calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId(pub u64);

impl RequestId {
    /// First identifier the router issues itself; callers' own ids live below it by convention.
    pub const FIRST_GENERATED: u64 = 1 << 63;

    /// Maps a caller's string id to a request id (xxh3-64 of its UTF-8 bytes, seed 0).
    pub fn from_name(name: &str) -> Self {
        Self(xxhash_rust::xxh3::xxh3_64_with_seed(name.as_bytes(), 0))
    }
}

impl fmt::Display for InstanceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}
