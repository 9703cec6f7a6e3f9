//! `rendezvous_hash`: vllm-router's rendezvous (highest-random-weight) hashing, one of the
//! router arms of the real-hardware reproduction (`clateral912/smetric-router-repro`).
//!
//! Source, read and restated in our words: `src/policies/rendezvous_hash.rs` and
//! `src/policies/hash_key.rs` of `vllm-project/router` (the versions stored at `292889e` and
//! `335c57e`). vllm-router builds a string key from, in order, the first non-empty header of
//! `x-session-id`, `x-user-id`, `x-tenant-id`, `x-correlation-id`, `x-request-id`,
//! `x-trace-id`; else the body's `session_params.session_id`, `user`, `session_id`,
//! `user_id`; else the request text itself (hashed when longer than 100 bytes). It scores
//! every healthy worker with `fbi_hash("{key}:{worker url}")` (mcrouter's FurcHash expanded by
//! MurmurHash64A) and takes the highest. The reproduction's replayer sends `X-Session-Id`
//! with the trace's session id on every request, so the key there is the session.
//!
//! Mapping to this router: the key → `SelectionInput::hash_key` (the caller's
//! `RouteRequest::session_key`, a `u64` hash of its session id, else `prompt_key` of the
//! prompt, the request-text fallback); the worker url → `Candidate::name_hash` (`xxh3_64` of
//! the instance name). Score `mix64(mix64(key) ^ name_hash)`, argmax, ties (never seen in
//! practice) at random. The hash function differs from vllm-router's (SplitMix64's finaliser
//! against FurcHash + MurmurHash64A); both are uniform, so the distribution of keys over
//! instances and the moves on a fleet change are the same in law, not key by key.
//!
//! Invariants: reads no load and no hit; the same key and the same candidate set give the same
//! instance; removing an instance moves only the keys it held (each to its second-highest
//! score), adding one takes about 1/N of the keys from the others.
//!
//! Complexity: O(N), one mix per candidate.

use super::{Policy, Reason, Selection, SelectionInput, argmax_u64};
use crate::rng::mix64;

/// vllm-router's rendezvous hashing.
#[derive(Debug, Default)]
pub struct RendezvousHash;

/// The weight of `name_hash` for `key`.
#[inline]
fn weight(key: u64, name_hash: u64) -> u64 {
    mix64(mix64(key) ^ name_hash)
}

impl Policy for RendezvousHash {
    fn name(&self) -> &'static str {
        "rendezvous_hash"
    }

    fn select(&self, input: &SelectionInput<'_>) -> Selection {
        let c = input.candidates;
        let index = argmax_u64(c.len(), input.rng, |i| weight(input.hash_key, c[i].name_hash));
        Selection {
            index,
            reason: Reason::RendezvousHash,
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
        let s = RendezvousHash.select(&sel);
        assert_eq!(s.reason, Reason::RendezvousHash);
        assert_eq!(rng.draws(), 0);
        c[s.index].slot
    }

    #[test]
    fn a_key_sticks_ignores_load_and_spreads() {
        let c: Vec<Candidate> = (0..4).map(|s| cand(s, 0, 0, 0)).collect();
        let mut count = [0u32; 4];
        for key in 0..4000 {
            let at = pick(&c, key);
            assert_eq!(pick(&c, key), at, "the same key, the same instance");
            count[at as usize] += 1;
        }
        assert!(count.iter().all(|&k| (800..1200).contains(&k)), "{count:?}");
        // Load and hits do not move it.
        let busy: Vec<Candidate> = (0..4)
            .map(|s| cand(s, 50 * u64::from(s), 9 * u64::from(s), 7))
            .collect();
        assert!((0..500).all(|key| pick(&c, key) == pick(&busy, key)));
    }

    #[test]
    fn only_the_keys_of_a_leaving_instance_move() {
        let all: Vec<Candidate> = (0..5).map(|s| cand(s, 0, 0, 0)).collect();
        let without_2: Vec<Candidate> = all.iter().copied().filter(|c| c.slot != 2).collect();
        let mut moved = 0;
        for key in 0..3000 {
            let (before, after) = (pick(&all, key), pick(&without_2, key));
            if before == 2 {
                moved += 1;
            } else {
                assert_eq!(before, after, "key {key} left an instance that stayed");
            }
        }
        assert!((450..750).contains(&moved), "{moved}");
    }
}
