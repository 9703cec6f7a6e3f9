//! `consistent_hash`: vllm-router's ring-based consistent hashing, one of the router arms of
//! the real-hardware reproduction (`clateral912/smetric-router-repro`).
//!
//! Source, read and restated in our words: `src/policies/consistent_hash.rs` and
//! `src/policies/hash_key.rs` of `vllm-project/router` (the versions stored at `080589a` and
//! `335c57e`). The key is `rendezvous_hash`'s (a session header, else a session or user field
//! of the body, else the request text). The ring holds 160 virtual nodes per worker, node `v`
//! of worker `u` at `fbi_hash("{u}:{v}")`; a key goes to the first node at or after
//! `fbi_hash(key)`, wrapping to the smallest. vllm-router rebuilds the ring from every worker
//! it is given; when the key's worker is unhealthy it falls back to the first healthy worker.
//!
//! Mapping to this router: key → `SelectionInput::hash_key` (session key, else `prompt_key`);
//! worker url → `Candidate::name_hash`. Node `v` of instance `i` sits at
//! `mix64(name_hash_i + (v + 1)·γ)`, the key at `mix64(key)`; the owner is the candidate whose
//! nearest node clockwise is nearest, `argmin_i min_v (node_{i,v} − point) mod 2^64` — the
//! ring lookup without keeping a ring, so the policy holds no state and a fleet change needs
//! no rebuild. Differences: the hash function (SplitMix64's finaliser against FurcHash +
//! MurmurHash64A; both uniform, so the share of the ring each instance owns and the moves on a
//! fleet change are the same in law, not key by key); the ring is built over the candidates, so
//! an instance the caller excludes hands its keys to their ring successors, where vllm-router
//! sends every such key to its first healthy worker.
//!
//! Invariants: reads no load and no hit; removing an instance moves only its keys, adding one
//! takes keys only from others; an exact tie (two nodes at one point) is broken at random.
//!
//! Complexity: O(N·V), V = 160 virtual nodes, one mix per node (no ring kept).

use super::{Policy, Reason, Selection, SelectionInput, argmax_u64};
use crate::rng::{GOLDEN_GAMMA, mix64};

/// vllm-router's virtual nodes per worker (`VIRTUAL_NODES_PER_WORKER`).
pub const VIRTUAL_NODES: u64 = 160;

/// vllm-router's consistent hashing.
#[derive(Debug, Default)]
pub struct ConsistentHash;

/// The clockwise distance from `point` to the nearest of `name_hash`'s virtual nodes.
fn distance(point: u64, name_hash: u64) -> u64 {
    (1..=VIRTUAL_NODES)
        .map(|v| mix64(name_hash.wrapping_add(v.wrapping_mul(GOLDEN_GAMMA))).wrapping_sub(point))
        .min()
        .unwrap_or(u64::MAX)
}

impl Policy for ConsistentHash {
    fn name(&self) -> &'static str {
        "consistent_hash"
    }

    fn select(&self, input: &SelectionInput<'_>) -> Selection {
        let c = input.candidates;
        let point = mix64(input.hash_key);
        // The nearest as the largest complement: argmax over u64 keeps exact ties exact.
        let index = argmax_u64(c.len(), input.rng, |i| !distance(point, c[i].name_hash));
        Selection {
            index,
            reason: Reason::ConsistentHash,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RouterConfig;
    use crate::policy::Candidate;
    use crate::policy::test_support::{cand, input};
    use crate::rng::DrawCounter;

    fn pick(c: &[Candidate], key: u64) -> u32 {
        let cfg = RouterConfig::default();
        let rng = DrawCounter::new(0);
        let sel = SelectionInput {
            hash_key: key,
            ..input(c, 100, false, &cfg, &rng)
        };
        let s = ConsistentHash.select(&sel);
        assert_eq!(s.reason, Reason::ConsistentHash);
        c[s.index].slot
    }

    #[test]
    fn the_nearest_node_clockwise_owns_the_key() {
        // Against an explicit ring: sorted nodes, first at or after the point, wrapping.
        let c: Vec<Candidate> = (0..3).map(|s| cand(s, 0, 0, 0)).collect();
        let mut ring: Vec<(u64, u32)> = c
            .iter()
            .flat_map(|x| {
                (1..=VIRTUAL_NODES)
                    .map(move |v| (mix64(x.name_hash.wrapping_add(v.wrapping_mul(GOLDEN_GAMMA))), x.slot))
            })
            .collect();
        ring.sort_unstable();
        for key in 0..500 {
            let point = mix64(key);
            let owner = ring.iter().find(|(p, _)| *p >= point).unwrap_or(&ring[0]).1;
            assert_eq!(pick(&c, key), owner);
        }
    }

    #[test]
    fn keys_stick_spread_and_only_a_leavers_keys_move() {
        let all: Vec<Candidate> = (0..4).map(|s| cand(s, 0, 0, 0)).collect();
        let busy: Vec<Candidate> = (0..4).map(|s| cand(s, 100 * u64::from(s), u64::from(s), 0)).collect();
        let without_1: Vec<Candidate> = all.iter().copied().filter(|c| c.slot != 1).collect();
        let (mut count, mut moved) = ([0u32; 4], 0);
        for key in 0..4000 {
            let before = pick(&all, key);
            assert_eq!(pick(&busy, key), before, "load and hits do not move a key");
            count[before as usize] += 1;
            let after = pick(&without_1, key);
            if before == 1 {
                moved += 1;
            } else {
                assert_eq!(after, before, "key {key} left an instance that stayed");
            }
        }
        // 160 virtual nodes keep each share within a few percent of 1/4.
        assert!(count.iter().all(|&k| (800..1200).contains(&k)), "{count:?}");
        assert_eq!(moved, count[1]);
    }
}
