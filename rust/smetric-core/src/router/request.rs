//! The types a caller hands the router and gets back: a prompt, a routing request, the
//! decision, the hits of a query, and the index writes of a feed.

use std::sync::Arc;

use crate::hash::SharedIds;
use crate::ids::{BlockHash, InstanceId, RequestId};
use crate::policy::Reason;
use crate::turn::{TurnHint, TurnSource};

/// The prompt of a request.
#[derive(Debug, Clone, Copy)]
pub enum Prompt<'a> {
    /// Token ids; the router hashes full blocks.
    Tokens(&'a [u32]),
    /// Token ids read in place from memory another thread may write (a Python buffer once
    /// the GIL is released); the router hashes full blocks, reading each id once. Only for a
    /// block size [`crate::hash::shared_ids_supported`] accepts.
    Shared(SharedIds<'a>),
    /// A pre-hashed block chain (e.g. a trace's `hash_ids`) and the prompt length, which
    /// defaults to `hashes.len() · block_size`.
    Hashes {
        /// The chain.
        hashes: &'a [BlockHash],
        /// Prompt length in tokens.
        num_tokens: Option<u64>,
    },
}

/// One routing request.
#[derive(Debug, Clone, Copy)]
pub struct RouteRequest<'a> {
    /// The prompt.
    pub prompt: Prompt<'a>,
    /// Namespace mixed into the hash chain (LoRA name, cache salt); tokens only.
    pub namespace: Option<&'a str>,
    /// What the caller knows about the turn.
    pub turn: TurnHint,
    /// The caller's id; the router issues one when absent.
    pub request_id: Option<RequestId>,
    /// Time in seconds; the router's own clock when absent.
    pub now: Option<f64>,
    /// Instances this decision must not choose (a proxy's retry after a failed attempt, or
    /// instances it has ejected). Names the fleet no longer has are ignored; when every
    /// instance is excluded the call fails with `NoInstances`.
    pub exclude: &'a [&'a str],
    /// The instance that served this request's session last, as the caller knows it (the
    /// session cookie llm-d's endpoint picker sets and its client echoes). Only
    /// `llmd_session_affinity` reads it; a name that is not a candidate counts as none.
    pub previous_instance: Option<&'a str>,
    /// The request's session key, as the caller hashes its session id into a `u64` (what
    /// vllm-router's hash policies hash: its `x-session-id` header, or a `user` / `session_id`
    /// field of the body). Only `consistent_hash` and `rendezvous_hash` read it; when absent
    /// they hash the prompt instead (vllm-router's last fallback, the request text).
    pub session_key: Option<u64>,
    /// The request's output length as recorded (a trace replay's): only `smetric`'s decode
    /// mask in its oracle form reads it (`decode_contract.rs`); a deployment does not know it.
    pub output_tokens: Option<u64>,
}

impl<'a> RouteRequest<'a> {
    /// A request with only a prompt.
    pub fn new(prompt: Prompt<'a>) -> Self {
        Self {
            prompt,
            namespace: None,
            turn: TurnHint::Unknown,
            request_id: None,
            now: None,
            exclude: &[],
            previous_instance: None,
            session_key: None,
            output_tokens: None,
        }
    }
}

/// The router's answer.
#[derive(Debug, Clone)]
pub struct Decision {
    /// Chosen instance slot.
    pub instance: InstanceId,
    /// Chosen instance name.
    pub instance_name: Arc<str>,
    /// Whether the request was treated as a first turn.
    pub first_turn: bool,
    /// Where that verdict came from.
    pub turn_source: TurnSource,
    /// Local prefix hit on the chosen instance, in tokens.
    pub local_hit_tokens: u64,
    /// Global-tier prefix hit, in tokens.
    pub global_hit_tokens: u64,
    /// Prefix hit in the chosen instance's host pool (docs §2.8), in tokens.
    pub host_hit_tokens: u64,
    /// Tokens the chosen instance will prefill: `n − max(local, host, global)`.
    pub prefill_tokens: u64,
    /// Prompt length in tokens.
    pub num_tokens: u64,
    /// Why the policy chose it.
    pub reason: Reason,
    /// The request's id (the caller's or an issued one).
    pub request_id: RequestId,
}

/// Hits of every live instance for one prompt (introspection; `Router::query`).
#[derive(Debug, Clone)]
pub struct Hits {
    /// `(name, local hit tokens)` in slot order.
    pub local: Vec<(Arc<str>, u64)>,
    /// Global-tier hit in tokens.
    pub global_hit_tokens: u64,
    /// `(name, hit tokens in its host pool)` in slot order (docs §2.8).
    pub host: Vec<(Arc<str>, u64)>,
    /// Deepest match over all holders, in blocks.
    pub deepest_blocks: u32,
    /// Children of the deepest matched block.
    pub branches: u32,
}

/// Which tier an explicit index call addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    /// An instance's GPU cache.
    Local,
    /// The cluster-wide CPU/store tier.
    Global,
    /// The instance's host pool: its own host memory, or the store it shares with the
    /// instances of its pool (docs §2.8). Credited to those instances only.
    Host,
}

impl Tier {
    /// The tier's name at the bindings (`"local"`, `"global"`, `"host"`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Local => "local",
            Self::Global => "global",
            Self::Host => "host",
        }
    }
}

/// One index write of a batch applied by [`Router::apply_blocks`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IndexOp<'a> {
    /// As [`Router::store_blocks`]: the tier now holds `hashes`, a run continuing `parent`.
    Store {
        /// The tier written.
        tier: Tier,
        /// The run.
        hashes: &'a [BlockHash],
        /// The block the run continues.
        parent: Option<BlockHash>,
    },
    /// As [`Router::remove_blocks`]: the tier dropped `hashes`.
    Remove {
        /// The tier written.
        tier: Tier,
        /// The dropped blocks.
        hashes: &'a [BlockHash],
    },
}
