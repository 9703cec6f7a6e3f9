//! Routing policies behind one trait. One file per policy; each opens with its rule.
//!
//! A policy sees the candidates (live instances in slot order) with their local prefix
//! hits and their effective load, plus the request's size, global-tier hit and turn, and
//! returns the index of the chosen candidate. Policies never lock: the load values were
//! read from atomics by the router, the hits come from the index query.
//!
//! Ties are broken at random with the router's counter-based generator (docs §5); a single
//! best candidate takes no draw, which keeps the Python reference in lock-step.
//!
//! Complexity: every policy is O(candidates) per decision.

mod bailian_top3;
mod cache_first;
mod consistent_hash;
mod dynamo_host_tier;
mod least_load;
mod linear;
mod llmd_prefix_load;
mod llmd_session_affinity;
mod lmetric;
mod lpwl;
mod power_of_two;
mod preble;
mod rendezvous_hash;
mod round_robin;
mod smetric;
mod smetric_paper;
mod vllm_router_cache_aware;
mod vllm_router_smetric;

use std::fmt::Debug;

use crate::config::RouterConfig;
use crate::error::{Result, SmetricError};
use crate::rng::DrawCounter;

pub use bailian_top3::BailianTop3;
pub use cache_first::CacheFirst;
pub use consistent_hash::ConsistentHash;
pub use dynamo_host_tier::DynamoHostTier;
pub use least_load::LeastLoad;
pub use linear::Linear;
pub use llmd_prefix_load::LlmdPrefixLoad;
pub use llmd_session_affinity::LlmdSessionAffinity;
pub use lmetric::Lmetric;
pub use lpwl::Lpwl;
pub use power_of_two::PowerOfTwo;
pub use preble::Preble;
pub(crate) use preble::routed_cost_us as preble_routed_cost_us;
pub use rendezvous_hash::RendezvousHash;
pub use round_robin::RoundRobin;
pub use smetric::Smetric;
pub use vllm_router_cache_aware::VllmRouterCacheAware;
pub use vllm_router_smetric::VllmRouterSmetric;

/// One instance as a policy sees it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Candidate {
    /// Slot of the instance.
    pub slot: u32,
    /// The instance's identity to the hash policies: `xxh3_64` of its name (`fleet::Member`).
    pub name_hash: u64,
    /// Local (GPU) prefix hit for this request, in tokens.
    pub local_hit_tokens: u64,
    /// Prefix hit in the instance's host pool (its own host memory or a store it shares,
    /// docs §2.8), in tokens; 0 without host tiers.
    pub host_hit_tokens: u64,
    /// Batch size (requests in flight).
    pub bs: u64,
    /// Requests not yet prefilled.
    pub waiting: u64,
    /// Uncached prompt tokens queued for prefill.
    pub queued: u64,
    /// Prompt tokens of the requests in flight.
    pub active: u64,
    /// Prefill work queued (cold-token equivalents, see [`prefill_work`]): `smetric` v2's `q`.
    pub queued_work: u64,
    /// The instance's prefill drain rate, work units per second (configured, learned, or the
    /// fallback): `smetric` v2's `RATE`.
    pub drain_rate: f64,
    /// The drain rate as vllm-router learns it (configured, or the p90 of own-work samples,
    /// `drain_rate.rs`); `None` until learned. Read by `vllm_router_smetric` only.
    pub peer_drain_rate: Option<f64>,
    /// Requests routed here within the last `preble_window_s` (`recent_load.rs`); 0 unless
    /// the policy is `preble`.
    pub recent_requests: u64,
    /// Their AIBrix cost (`policy/preble.rs`), microseconds; 0 unless the policy is `preble`.
    pub recent_cost_us: u64,
    /// The smallest non-negative balance of the live decodes here, seconds: the stall the
    /// tightest one can still absorb (`decode_contract.rs`). `None` when none is live or has a
    /// balance left, and whenever `smetric`'s decode mask is off (nobody computes it then).
    pub decode_room_s: Option<f64>,
    /// Seconds since the last use of the most recently used block this instance's GPU cache
    /// has evicted (for capacity, or by an engine's removal event): how recent the KV$ a chain
    /// placed here displaces is. `None` until the cache has evicted one (it has had room), and
    /// whenever the guard is off (nobody reads it then). Read by `smetric` v2's displacement
    /// guard (`smetric_retention_s`).
    pub evicted_age_s: Option<f64>,
    /// The predicted decode pace here with this request added, seconds per output token (the
    /// router's fit, `decode_model.rs`, at this instance's in-flight context plus the
    /// request's). `None` until the fit exists, and whenever the decode budget
    /// (`smetric_tpot_budget_s`) is off. Read by `smetric` v2's decode budget.
    pub tpot_s: Option<f64>,
    /// What loading a token from the shared store costs here, work units (the instance's
    /// learned cost, `fetch_cost.rs`, or `global_fetch_cost` until learned). 0 unless
    /// `smetric_learn_fetch_cost` is on (a store hit is then free, as before). Read by
    /// `smetric` v2.
    pub fetch_cost: f64,
}

/// The prefill work of computing `new_tokens` at the end of an `prompt_tokens`-token prompt,
/// in cold-token equivalents, rounded up: `n + n·(L − n/2)/L_EQ` (linear cost plus causal
/// attention over the context; `config::L_EQ_QWEN3_CODER_30B_A3B` derives it). What the load
/// board charges at routing and releases at the first token.
///
/// Written with the reciprocal `1/L_EQ` so that a loop over candidates divides once (the
/// division is loop-invariant and hoisted), not once per candidate, and rounded up by
/// [`ceil_to_u64`], not `f64::ceil`: x86-64's baseline has no SSE4.1 `roundsd`, so `ceil` is a
/// call into libm's software rounding, about a tenth of a 1K-token route's instructions.
#[inline]
pub fn prefill_work(new_tokens: u64, prompt_tokens: u64, l_eq_tokens: f64) -> u64 {
    let (n, l) = (new_tokens as f64, prompt_tokens as f64);
    ceil_to_u64(n + n * (l - n / 2.0) * (1.0 / l_eq_tokens))
}

/// The work of loading `fetched` tokens from the shared store at `cost` work units each
/// (`fetch_cost.rs` learns the cost), rounded up as [`prefill_work`] rounds.
#[inline]
pub fn fetch_work(fetched: u64, cost: f64) -> u64 {
    ceil_to_u64(fetched as f64 * cost)
}

/// `x.ceil() as u64` for every `x`, without the libm call: truncate (saturating, NaN to 0,
/// as `as` does), then add one when the truncation lost a positive fraction. Equal to
/// `x.ceil() as u64` wherever the latter is defined by `as`: a negative `x` gives 0 both ways
/// (`ceil` of `-0.5` is `-0.0`), and past `u64::MAX` both saturate.
#[inline]
pub fn ceil_to_u64(x: f64) -> u64 {
    let t = x as u64;
    t + u64::from((t as f64) < x && t < u64::MAX)
}

impl Candidate {
    /// The tokens this instance would prefill for a prompt of `num_tokens` with a global-tier
    /// hit of `global_hit_tokens`: `n − max(local, host, global)` (docs §3 `prefill(r, X)`), what the
    /// load board queues when the request is routed here.
    #[inline]
    pub fn prefill_tokens(&self, num_tokens: u64, global_hit_tokens: u64) -> u64 {
        num_tokens - self.resident_hit_tokens().max(global_hit_tokens).min(num_tokens)
    }

    /// The prefix this instance has without the shared store: its GPU's or its host pool's.
    #[inline]
    pub fn resident_hit_tokens(&self) -> u64 {
        self.local_hit_tokens.max(self.host_hit_tokens)
    }

    /// The prefix this instance can load instead of computing, from its host pool or the
    /// shared store (`global_hit_tokens`): the off-GPU hit the tiers give it.
    #[inline]
    pub fn tier_hit_tokens(&self, global_hit_tokens: u64) -> u64 {
        self.host_hit_tokens.max(global_hit_tokens)
    }

    /// The tokens a prefill here loads rather than computes, by source (docs §2.8):
    /// `(from the host pool, from the shared store)` — each token from the nearest source
    /// that holds it (GPU, then host pool, then store), so none is counted twice.
    #[inline]
    pub fn loaded_tokens(&self, num_tokens: u64, global_hit_tokens: u64) -> (u64, u64) {
        let local = self.local_hit_tokens.min(num_tokens);
        let host = self.host_hit_tokens.min(num_tokens);
        let global = global_hit_tokens.min(num_tokens);
        (host.saturating_sub(local), global.saturating_sub(local.max(host)))
    }

    /// The work of loading what a prefill here takes from the shared store, at this
    /// instance's [`Candidate::fetch_cost`] (0 when that is 0).
    #[inline]
    pub fn store_fetch_work(&self, num_tokens: u64, global_hit_tokens: u64) -> u64 {
        fetch_work(self.loaded_tokens(num_tokens, global_hit_tokens).1, self.fetch_cost)
    }
}

/// Everything a policy may read for one decision.
#[derive(Debug)]
pub struct SelectionInput<'a> {
    /// Live instances in slot order (never empty).
    pub candidates: &'a [Candidate],
    /// Prompt length in tokens.
    pub num_tokens: u64,
    /// Global-tier prefix hit in tokens (0 when the tier is disabled).
    pub global_hit_tokens: u64,
    /// Whether the request was judged a first turn.
    pub first_turn: bool,
    /// Tokens per block.
    pub block_size: u32,
    /// Whether the instances only prefill (the prefill pool of a PD router) rather than
    /// prefill and decode (co-located).
    pub prefill_only: bool,
    /// The candidate that served the request's session last, as the caller says
    /// (`RouteRequest::previous_instance`); `None` when not said or not a candidate.
    pub previous: Option<usize>,
    /// The key the hash policies hash: the caller's session key
    /// (`RouteRequest::session_key`), else [`prompt_key`] of the prompt.
    pub hash_key: u64,
    /// The router's configuration.
    pub config: &'a RouterConfig,
    /// The router's random stream.
    pub rng: &'a DrawCounter,
}

/// Why a policy chose what it chose. [`Reason::name`] gives the `Decision.reason` string.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// `round_robin`.
    RoundRobin,
    /// `least_load`.
    LeastLoad,
    /// `cache_first`, weighted sampling.
    CacheFirstWeighted,
    /// `cache_first`, deterministic argmax of the score.
    CacheFirstArgmax,
    /// `cache_first`, max-hit variant.
    CacheFirstMaxHit,
    /// `linear`.
    Linear,
    /// `lmetric`.
    Lmetric,
    /// `lpwl`.
    Lpwl,
    /// `llmd_prefix_load`.
    LlmdPrefixLoad,
    /// `dynamo_host_tier`.
    DynamoHostTier,
    /// `bailian_top3`.
    BailianTop3,
    /// `preble`, exploit: the longest cached prefix covers more than the threshold.
    PrebleExploit,
    /// `preble`, explore: the least windowed cost.
    PrebleExplore,
    /// `llmd_session_affinity`.
    LlmdSessionAffinity,
    /// `consistent_hash`.
    ConsistentHash,
    /// `rendezvous_hash`.
    RendezvousHash,
    /// `power_of_two`.
    PowerOfTwo,
    /// `vllm_router_cache_aware`, the fleet is imbalanced: the least loaded.
    CacheAwareBalance,
    /// `vllm_router_cache_aware`, the best match covers more than the threshold: its holder.
    CacheAwareMatch,
    /// `vllm_router_cache_aware`, the best match does not: the least loaded.
    CacheAwareLowMatch,
    /// `smetric`, first turn placed for load balance.
    FirstTurnLeastLoaded,
    /// `smetric`, follow-up kept at its home.
    Sticky,
    /// `smetric`, follow-up moved: its home lost its KV$.
    MigrateEvicted,
    /// `smetric`, follow-up moved: its home is overloaded.
    MigrateOverloaded,
    /// `smetric` (cost rule), follow-up moved: another instance's score beats its home's.
    MigrateCheaper,
    /// `smetric` v2, follow-up moved: its home cannot meet the TTFT budget and another can.
    MigrateInfeasible,
    /// `smetric` v2, follow-up kept at its home although the home cannot meet the TTFT
    /// budget: no instance can.
    StayNoneFeasible,
    /// `smetric` v2 with the decode mask, follow-up moved: its prefill at home would break a
    /// live decode's budget there.
    MigrateUnsafe,
    /// `smetric` v2 with the displacement guard, follow-up kept at its home although its rule
    /// would move it: every instance it could move to is churning (`smetric_retention_s`).
    StayChurning,
    /// `smetric` v2 in the KV-bound regime (`smetric_kv_bound_share`), follow-up kept at its
    /// home although its rule would move it: the fleet's GPU KV is the binding resource.
    StayKvBound,
    /// `smetric` v2 with a decode budget (`smetric_tpot_budget_s`), follow-up moved: its home
    /// is predicted over the budget per output token and another instance within it and
    /// within the TTFT budget.
    MigrateTpot,
}

impl Reason {
    /// The reason as reported in `Decision.reason`.
    pub fn name(self) -> &'static str {
        match self {
            Self::RoundRobin => "round-robin",
            Self::LeastLoad => "least-load",
            Self::CacheFirstWeighted => "cache-first: weighted",
            Self::CacheFirstArgmax => "cache-first: argmax",
            Self::CacheFirstMaxHit => "cache-first: max-hit",
            Self::Linear => "linear",
            Self::Lmetric => "lmetric",
            Self::Lpwl => "lpwl",
            Self::LlmdPrefixLoad => "llmd-prefix-load",
            Self::DynamoHostTier => "dynamo-host-tier",
            Self::BailianTop3 => "bailian-top3",
            Self::PrebleExploit => "preble: exploit",
            Self::PrebleExplore => "preble: explore",
            Self::LlmdSessionAffinity => "llmd-session-affinity",
            Self::ConsistentHash => "consistent-hash",
            Self::RendezvousHash => "rendezvous-hash",
            Self::PowerOfTwo => "power-of-two",
            Self::CacheAwareBalance => "vllm-router-cache-aware: load balance",
            Self::CacheAwareMatch => "vllm-router-cache-aware: cache affinity",
            Self::CacheAwareLowMatch => "vllm-router-cache-aware: low match",
            Self::FirstTurnLeastLoaded => "first-turn: least-loaded",
            Self::Sticky => "follow-up: sticky",
            Self::MigrateEvicted => "follow-up: migrate (local KV$ evicted)",
            Self::MigrateOverloaded => "follow-up: migrate (home overloaded)",
            Self::MigrateCheaper => "follow-up: migrate (cheaper elsewhere)",
            Self::MigrateInfeasible => "follow-up: migrate (home misses TTFT budget)",
            Self::StayNoneFeasible => "follow-up: sticky (no instance meets TTFT budget)",
            Self::MigrateUnsafe => "follow-up: migrate (home would break a live decode)",
            Self::StayChurning => "follow-up: sticky (every target churning)",
            Self::StayKvBound => "follow-up: sticky (fleet KV-bound)",
            Self::MigrateTpot => "follow-up: migrate (home misses TPOT budget)",
        }
    }

    /// All reasons, for stats.
    pub const ALL: [Reason; 31] = [
        Self::RoundRobin,
        Self::LeastLoad,
        Self::CacheFirstWeighted,
        Self::CacheFirstArgmax,
        Self::CacheFirstMaxHit,
        Self::Linear,
        Self::Lmetric,
        Self::Lpwl,
        Self::LlmdPrefixLoad,
        Self::DynamoHostTier,
        Self::BailianTop3,
        Self::PrebleExploit,
        Self::PrebleExplore,
        Self::LlmdSessionAffinity,
        Self::ConsistentHash,
        Self::RendezvousHash,
        Self::PowerOfTwo,
        Self::CacheAwareBalance,
        Self::CacheAwareMatch,
        Self::CacheAwareLowMatch,
        Self::FirstTurnLeastLoaded,
        Self::Sticky,
        Self::MigrateEvicted,
        Self::MigrateOverloaded,
        Self::MigrateCheaper,
        Self::MigrateInfeasible,
        Self::StayNoneFeasible,
        Self::MigrateUnsafe,
        Self::StayChurning,
        Self::StayKvBound,
        Self::MigrateTpot,
    ];
}

/// A policy's answer: an index into `SelectionInput::candidates` and the reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Selection {
    /// Index into the candidates.
    pub index: usize,
    /// Why.
    pub reason: Reason,
}

/// A routing policy.
pub trait Policy: Send + Sync + Debug {
    /// The policy's name (as accepted by [`PolicyKind::parse`]).
    fn name(&self) -> &'static str;
    /// Chooses one candidate. `input.candidates` is never empty.
    fn select(&self, input: &SelectionInput<'_>) -> Selection;
}

/// The policies smetric ships.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PolicyKind {
    /// Rotate through the fleet.
    RoundRobin,
    /// vLLM's data-parallel balancer: argmin 4·waiting + running.
    LeastLoad,
    /// The Bailian production scheduler (cache-first, normalised weighted score).
    CacheFirst,
    /// Dynamo's linear cost: w·prefill blocks + decode blocks.
    Linear,
    /// LMetric: argmin (queued + new prefill tokens) · (batch + 1).
    Lmetric,
    /// Least pending prefill work: argmin queued + uncached tokens, no batch term.
    Lpwl,
    /// llm-d's prefix + load profile: argmax 2·prefix + free KV + inverse queue.
    LlmdPrefixLoad,
    /// Dynamo's KV-router cost with the host tier's hit credited at 0.75 of a GPU hit.
    DynamoHostTier,
    /// Bailian's production rule as the SMetric authors port it: `2^(50·reuse + 20·(mean
    /// load − load))`, sampled over the top 3.
    BailianTop3,
    /// vllm-router's `smetric` (PR #330), a peer implementation of the paper's v2 rule:
    /// learned p90 rate, `(q + w) × in-flight` score, the TTFT test.
    VllmRouterSmetric,
    /// Preble as AIBrix ports it: the longest cached prefix when it covers more than half the
    /// prompt, else the least cost over a sliding window of routed requests.
    Preble,
    /// llm-d's session-affinity + active-requests profile: argmax (previous instance) + (1 −
    /// in-flight / max in-flight).
    LlmdSessionAffinity,
    /// vllm-router's `consistent_hash`: a ring of 160 virtual nodes per instance, keyed by the
    /// session key (else the prompt).
    ConsistentHash,
    /// vllm-router's `rendezvous_hash`: the highest hash of (key, instance).
    RendezvousHash,
    /// vllm-router's `power_of_two`: two distinct random candidates, the fewer in flight wins.
    PowerOfTwo,
    /// vllm-router's `cache_aware`: least load when imbalanced, else the best prefix match
    /// above `cache_aware_cache_threshold`, else least load.
    VllmRouterCacheAware,
    /// SMetric: first turns load-balanced, follow-ups cache-aware; `RouterConfig::smetric_rule`
    /// chooses how a follow-up leaves its home (v1 overload thresholds, v2 TTFT feasibility).
    Smetric,
}

impl PolicyKind {
    /// Every policy, in the order reports list them.
    pub const ALL: [PolicyKind; 17] = [
        Self::RoundRobin,
        Self::LeastLoad,
        Self::CacheFirst,
        Self::Linear,
        Self::Lmetric,
        Self::Lpwl,
        Self::LlmdPrefixLoad,
        Self::DynamoHostTier,
        Self::BailianTop3,
        Self::VllmRouterSmetric,
        Self::Preble,
        Self::LlmdSessionAffinity,
        Self::ConsistentHash,
        Self::RendezvousHash,
        Self::PowerOfTwo,
        Self::VllmRouterCacheAware,
        Self::Smetric,
    ];

    /// The policy's name.
    pub fn name(self) -> &'static str {
        match self {
            Self::RoundRobin => "round_robin",
            Self::LeastLoad => "least_load",
            Self::CacheFirst => "cache_first",
            Self::Linear => "linear",
            Self::Lmetric => "lmetric",
            Self::Lpwl => "lpwl",
            Self::LlmdPrefixLoad => "llmd_prefix_load",
            Self::DynamoHostTier => "dynamo_host_tier",
            Self::BailianTop3 => "bailian_top3",
            Self::VllmRouterSmetric => "vllm_router_smetric",
            Self::Preble => "preble",
            Self::LlmdSessionAffinity => "llmd_session_affinity",
            Self::ConsistentHash => "consistent_hash",
            Self::RendezvousHash => "rendezvous_hash",
            Self::PowerOfTwo => "power_of_two",
            Self::VllmRouterCacheAware => "vllm_router_cache_aware",
            Self::Smetric => "smetric",
        }
    }

    /// Parses a policy name.
    pub fn parse(name: &str) -> Result<Self> {
        Self::ALL
            .into_iter()
            .find(|k| k.name() == name)
            .ok_or_else(|| SmetricError::UnknownPolicy {
                name: name.to_owned(),
                known: Self::ALL.map(PolicyKind::name).join(", "),
            })
    }

    /// A fresh policy object.
    pub fn build(self) -> Box<dyn Policy> {
        match self {
            Self::RoundRobin => Box::new(RoundRobin::default()),
            Self::LeastLoad => Box::new(LeastLoad),
            Self::CacheFirst => Box::new(CacheFirst),
            Self::Linear => Box::new(Linear),
            Self::Lmetric => Box::new(Lmetric),
            Self::Lpwl => Box::new(Lpwl),
            Self::LlmdPrefixLoad => Box::new(LlmdPrefixLoad),
            Self::DynamoHostTier => Box::new(DynamoHostTier),
            Self::BailianTop3 => Box::new(BailianTop3),
            Self::VllmRouterSmetric => Box::new(VllmRouterSmetric),
            Self::Preble => Box::new(Preble),
            Self::LlmdSessionAffinity => Box::new(LlmdSessionAffinity),
            Self::ConsistentHash => Box::new(ConsistentHash),
            Self::RendezvousHash => Box::new(RendezvousHash),
            Self::PowerOfTwo => Box::new(PowerOfTwo),
            Self::VllmRouterCacheAware => Box::new(VllmRouterCacheAware),
            Self::Smetric => Box::new(Smetric),
        }
    }
}

/// The hash key of a prompt the caller gave no session key for: `mix64(last ^ n)`, `last` the
/// last hash of its full-block chain (0 for a prompt shorter than a block), `n` its length. The
/// same prompt always gets the same key (vllm-router's fallback hashes the request text).
pub fn prompt_key(chain_last: Option<u64>, num_tokens: u64) -> u64 {
    crate::rng::mix64(chain_last.unwrap_or(0) ^ num_tokens)
}

/// Index of the largest `score`, ties at random (one draw only for a tie): the hash policies'
/// argmax over 64-bit scores, which an `f64` score would round into false ties.
pub(crate) fn argmax_u64(n: usize, rng: &DrawCounter, score: impl Fn(usize) -> u64) -> usize {
    let best = (0..n).map(&score).max().unwrap_or(0);
    let ties = (0..n).filter(|&i| score(i) == best).count();
    let k = rng.pick(ties);
    (0..n).filter(|&i| score(i) == best).nth(k).unwrap_or(0)
}

/// Index (into `items`) of the smallest score among the allowed items, ties at random.
/// Returns `None` when no item is allowed.
///
/// Ties are exact float equality on purpose: scores are products of integer counters, and
/// the Python reference must find the very same ties.
#[allow(clippy::float_cmp)]
pub(crate) fn argmin_by(
    n: usize,
    rng: &DrawCounter,
    allowed: impl Fn(usize) -> bool,
    score: impl Fn(usize) -> f64,
) -> Option<usize> {
    // Each allowed candidate's score, kept for the tie pass when the fleet fits the stack
    // buffer (a score costs a prefill-work evaluation; an idle fleet ties everywhere).
    const KEPT: usize = 64;
    let mut kept = [f64::NAN; KEPT];
    let mut best = f64::INFINITY;
    let mut first = 0usize;
    let mut ties = 0usize;
    for i in (0..n).filter(|&i| allowed(i)) {
        let s = score(i);
        if i < KEPT {
            kept[i] = s;
        }
        if ties == 0 || s < best {
            best = s;
            first = i;
            ties = 1;
        } else if s == best {
            ties += 1;
        }
    }
    match ties {
        0 => None,
        // A single best takes no draw and needs no second pass.
        1 => Some(first),
        _ => {
            let k = rng.pick(ties);
            // The second pass starts at the first tie (nothing before it scored `best`); a
            // kept NaN marks a candidate that was not allowed (an allowed score is never NaN
            // where it ties: NaN equals nothing).
            (first..n)
                .filter(|&i| {
                    if i < KEPT {
                        kept[i] == best
                    } else {
                        allowed(i) && score(i) == best
                    }
                })
                .nth(k)
        }
    }
}

/// [`argmin_by`] over every candidate.
pub(crate) fn argmin(n: usize, rng: &DrawCounter, score: impl Fn(usize) -> f64) -> usize {
    argmin_by(n, rng, |_| true, score).unwrap_or(0)
}

#[cfg(test)]
pub(crate) mod test_support {
    use super::*;

    pub(crate) fn cand(slot: u32, hit: u64, bs: u64, queued: u64) -> Candidate {
        Candidate {
            slot,
            name_hash: crate::rng::mix64(u64::from(slot) + 1),
            local_hit_tokens: hit,
            host_hit_tokens: 0,
            bs,
            waiting: 0,
            queued,
            active: 0,
            queued_work: 0,
            drain_rate: RouterConfig::DEFAULT.smetric_drain_rate_fallback,
            peer_drain_rate: None,
            recent_requests: 0,
            recent_cost_us: 0,
            decode_room_s: None,
            evicted_age_s: None,
            tpot_s: None,
            fetch_cost: 0.0,
        }
    }

    pub(crate) fn input<'a>(
        candidates: &'a [Candidate],
        n: u64,
        first_turn: bool,
        config: &'a RouterConfig,
        rng: &'a DrawCounter,
    ) -> SelectionInput<'a> {
        SelectionInput {
            candidates,
            num_tokens: n,
            global_hit_tokens: 0,
            first_turn,
            block_size: 16,
            prefill_only: false,
            previous: None,
            hash_key: 0,
            config,
            rng,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceil_to_u64_is_ceil_as_u64() {
        let edges = [
            0.0,
            -0.0,
            -0.5,
            -1e300,
            0.5,
            1.0,
            1.0 + f64::EPSILON,
            2f64.powi(52) + 0.5,
            2f64.powi(53),
            2f64.powi(63),
            2f64.powi(64) - 2048.0,
            2f64.powi(64),
            1e300,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
            f64::MIN_POSITIVE,
        ];
        let mut rng = 0x9e37_79b9_7f4a_7c15_u64;
        let random = (0..100_000).map(|_| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            // Integral and fractional values over the range prefill work takes and beyond.
            (rng >> 11) as f64 / (1u64 << (rng % 40)) as f64
        });
        for x in edges.into_iter().chain(random) {
            assert_eq!(ceil_to_u64(x), x.ceil() as u64, "{x:e}");
        }
        for (n, l) in [(0, 0), (1, 1), (4_096, 65_536), (32_768, 32_768), (131_072, 131_072)] {
            let (nf, lf) = (n as f64, l as f64);
            let exact = (nf + nf * (lf - nf / 2.0) * (1.0 / 6_923.0)).ceil() as u64;
            assert_eq!(prefill_work(n, l, 6_923.0), exact);
        }
    }

    #[test]
    fn argmin_ties_are_random_but_reproducible() {
        let scores = [3.0, 1.0, 1.0, 2.0, 1.0];
        let picks: Vec<usize> = (0..50)
            .map(|k| {
                let rng = DrawCounter::new(k);
                argmin(scores.len(), &rng, |i| scores[i])
            })
            .collect();
        assert!(picks.iter().all(|p| [1, 2, 4].contains(p)));
        assert!(
            picks.contains(&2) && picks.contains(&4),
            "ties must not always go to the lowest index"
        );
        let rng = DrawCounter::new(0);
        assert_eq!(argmin(3, &rng, |i| i as f64), 0);
        assert_eq!(rng.draws(), 0);
    }

    #[test]
    fn names_round_trip() {
        for k in PolicyKind::ALL {
            assert_eq!(PolicyKind::parse(k.name()).unwrap(), k);
            assert_eq!(k.build().name(), k.name());
        }
        assert!(matches!(
            PolicyKind::parse("nope"),
            Err(SmetricError::UnknownPolicy { .. })
        ));
    }
}
