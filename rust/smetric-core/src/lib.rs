//! # smetric-core
//!
//! The routing core of smetric: it decides which vLLM instance serves each request of an
//! LLM-agent fleet. It implements SMetric — first turns of agent sessions placed for load
//! balance, follow-ups routed to where their KV$ lives, sessions moved when their home is
//! overloaded or evicted — and the baselines it is measured against.
//!
//! * [`hash`] — block hashes of token ids (xxh3 per block, chained by a cheap mix);
//! * [`index`] — the two-tier (GPU per instance, global CPU/store) KV$ index;
//! * [`load`] — the lock-free load board;
//! * [`drain_rate`] — each instance's prefill drain rate, learned from first-token latencies;
//! * [`fetch_cost`] — each instance's cost of loading a prefix from the shared store, learned
//!   the same way;
//! * [`recent_load`] — each instance's requests routed within a sliding window (`preble`);
//! * [`mix_map`] — the hash map for keys that already are hashes or small ids;
//! * [`policy`] — the policies, one file each (`smetric` in its two rules, v1 and v2);
//! * [`turn`] — stateless first-turn inference;
//! * [`router`] — the decision path tying them together;
//! * [`pd`] — disaggregated prefill/decode: the router over a prefill pool plus the decode choice;
//! * [`session_admission`] — the stage after the policy that admits, moves or holds a session's
//!   request when its instance's resident sessions would overflow the KV cache.
//!
//! No pyo3 here: the crate builds, tests, benches and fuzzes with plain cargo; the Python
//! bindings live in `rust/smetric-py`. The normative semantics are in
//! `docs/routing-semantics.md`, shared with the plain-Python reference.

pub mod config;
pub mod decode_contract;
pub mod decode_model;
pub mod drain_rate;
pub mod error;
pub mod fetch_cost;
pub mod fleet;
pub mod hash;
pub mod ids;
pub mod index;
pub mod load;
#[cfg(test)]
mod lockstep;
pub mod mix_map;
pub mod pd;
pub mod policy;
mod prefetch;
pub mod recent_load;
pub mod rng;
pub mod router;
pub mod session_admission;
pub mod turn;

pub use config::{
    CacheFirstMode, DEFAULT_BLOCK_SIZE, DecodeMask, IndexMode, L_EQ_QWEN3_235B_A22B, L_EQ_QWEN3_CODER_30B_A3B,
    MigrationRule, RouterConfig, SmetricRule, VllmRouterSmetricForm,
};
pub use error::{Result, SmetricError};
pub use hash::{
    SharedIds, chain_root, chain_shared_into, chain_tokens_into, hash_tokens, hash_tokens_into, shared_ids_supported,
};
pub use ids::{BlockHash, InstanceId, RequestId};
pub use index::{Holder, HostPool, IndexQuery, KvIndex};
pub use load::{EffectiveLoad, LoadEffect, LoadSnapshot, PeerLoad};
pub use mix_map::{MixHasher, MixMap};
pub use pd::{DecodeRule, PdConfig, PdDecision, PdRouter};
pub use policy::{Candidate, Policy, PolicyKind, Reason, Selection, SelectionInput};
pub use router::{Decision, Hits, IndexOp, Prompt, RouteRequest, Router, RouterStats, Tier};
pub use turn::{TurnHint, TurnSource, first_turn_from_roles};
