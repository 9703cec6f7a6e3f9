//! A synthetic agent-session workload whose reuse statistics are parameters.
//!
//! **Model.** `sessions` closed-loop sessions (each its own root session; the simulator starts
//! them as a Poisson stream at `session_rate_per_s`, and [`Workload::replicate`] multiplies them
//! for load, as for Weka). Session `s` has `T_s` requests (turns), `T_s` uniform on
//! `{1, …, 2·mean_turns − 1}`. Request `t` (1-based) of a session has the prompt
//!
//! ```text
//! [ system prompt P ][ task template U ][ first user message M ][ g · (t − 1) ][ tail V ]
//!   pool of `system_prompts`, shared      private                 history      volatile
//! ```
//!
//! * `P` is one of `system_prompts` prompts and `U` one of `templates` task templates, both
//!   drawn per session and shared across sessions (block ids tagged [`SHARED_ID_TAG`], so
//!   replicas keep sharing them).
//! * Each follow-up appends `g` tokens of history: the previous output plus the tool result
//!   (agent-triggered: every request after a session's first is a tool-result follow-up, so
//!   the agent-triggered share is `1 − 1/mean_turns`, 93.3 % at the default 15).
//! * `V` is a per-request volatile tail (the agent's state / reminder block that is re-rendered
//!   every turn and never kept in the history): recomputed by every request. It is the knob
//!   that brings the reusable share down to its target; without it a 15-turn session whose
//!   history grows linearly would reuse ≥ 93 % of its prefill tokens.
//! * Think time before each follow-up (tool latency): exponential with mean `think_mean_s`
//!   (default 40 s: `P(think ≤ 100 s) = 1 − e^{−2.5}` ≈ 92 %, so ≈ 90 % of re-accesses fall
//!   within 100 s once the previous request's service time is added).
//! * Outputs: uniform on `[output/2, 3·output/2]` tokens (agents emit a few hundred).
//!
//! **Solving for the segment sizes.** With `μ = mean_turns`, `A = E[T(T−1)/2]`,
//! `B = E[(T−1)(T−2)/2]` and the mean final context `C = context_ratio · kv_tokens`, a session
//! prefills on average `Tot = μ·(C − (μ−1)·g) + g·A` tokens, of which
//! `μ·P` are reused shared prompt, `μ·U` reused template, `(μ−1)·M + g·B` reused own history and
//! `M + μ·V + (μ−1)·g` new. Setting those to `reusable_share · shared_share · Tot`, …,
//! `(1 − reusable_share) · Tot` gives `P`, `U`, `M`, `V` in closed form (linear). When the
//! growth `g` does not fit the context (short contexts), `g` is halved until every segment is
//! non-negative. `C` is lowered where the longest session (`2·mean_turns − 1` turns) would
//! outgrow the longest prompt the engine accepts ([`SyntheticOptions::max_context`]), so at
//! `context_ratio` 1 the mean final context is ≈ 0.84× KV at the defaults. Segments are rounded
//! to whole blocks (chains hold full blocks only), and a session still stops early rather than
//! let a prompt exceed that cap.
//!
//! **Block ids.** A chain hash as vLLM's: block `k`'s id mixes block `k − 1`'s id with the
//! block's content key, so equal prefixes give equal ids and nothing else does. Blocks of
//! `P` and `U` are tagged shared; the rest are private to the session and request.
//!
//! **Invariants.** Deterministic in `seed`; request `t + 1`'s chain extends request `t`'s
//! chain minus its tail `V`; every chain starts with its session's `P` blocks.
//!
//! **Complexity.** O(total chain ids) time and memory.

use serde::Serialize;

use super::{ArrivalKind, RequestSpec, SHARED_ID_TAG, Workload, WorkloadBuilder, mix64};
use crate::config::SimConfig;
use crate::error::{Result, SimError};

/// Parameters of [`synthetic_agent_sessions`]; the defaults are the centre of the regime map,
/// set to the published Bailian agent-trace statistics (`docs/algorithms.md` §2).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SyntheticOptions {
    /// Sessions generated (replicated for load by the runner).
    pub sessions: u32,
    /// Seed of every draw.
    pub seed: u64,
    /// Tokens per block of the chains.
    pub block_tokens: u32,
    /// One instance's GPU KV capacity in tokens (the unit of `context_ratio`).
    pub kv_tokens: u64,
    /// Mean final context of a session ÷ `kv_tokens`.
    pub context_ratio: f64,
    /// Longest prompt generated; `None`: min(`kv_tokens`, the default engine's `max_model_len`)
    /// minus room for the output (at `context_ratio` 1 this caps the mean final context
    /// below `kv_tokens`: the profile's 262,144-token window is 0.92× its KV).
    pub max_context_tokens: Option<u64>,
    /// Mean requests per session.
    pub mean_turns: f64,
    /// History appended per follow-up (previous output + tool result), tokens (halved until
    /// it fits a short context).
    pub growth_tokens: u32,
    /// Mean output tokens of a request.
    pub output_tokens: u32,
    /// Mean think time (tool latency) before a follow-up, seconds.
    pub think_mean_s: f64,
    /// Target share of prefill tokens that are reusable.
    pub reusable_share: f64,
    /// Target share of the reuse that comes from system prompts shared across sessions.
    pub shared_share: f64,
    /// Target share of the reuse that comes from task templates shared across sessions (the
    /// rest is the session's own earlier turns).
    pub template_share: f64,
    /// Size of the system-prompt pool.
    pub system_prompts: u32,
    /// Size of the task-template pool.
    pub templates: u32,
}

impl Default for SyntheticOptions {
    fn default() -> Self {
        Self {
            sessions: 200,
            seed: 0,
            block_tokens: 256,
            kv_tokens: SimConfig::default().kv_tokens(),
            context_ratio: 0.1,
            max_context_tokens: None,
            mean_turns: 15.0,
            growth_tokens: 1536,
            output_tokens: 256,
            think_mean_s: 40.0,
            reusable_share: 0.815,
            shared_share: 0.19,
            template_share: 0.14,
            system_prompts: 4,
            templates: 16,
        }
    }
}

/// Segment sizes of a session, in tokens (before rounding to blocks).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SyntheticShape {
    /// System prompt.
    pub system_tokens: f64,
    /// Task template.
    pub template_tokens: f64,
    /// First user message (private).
    pub message_tokens: f64,
    /// History growth per follow-up.
    pub growth_tokens: f64,
    /// Volatile tail of every request.
    pub tail_tokens: f64,
    /// Mean final context: `context_ratio · kv_tokens`, or less where the longest session
    /// (`2·mean_turns − 1` turns) would outgrow `max_context`.
    pub context_tokens: f64,
}

fn invalid(field: &'static str, reason: impl Into<String>) -> SimError {
    SimError::InvalidConfig {
        field,
        reason: reason.into(),
    }
}

impl SyntheticOptions {
    fn validate(&self) -> Result<()> {
        let unit = |x: f64| (0.0..=1.0).contains(&x);
        if self.sessions == 0 {
            return Err(invalid("sessions", "must be >= 1"));
        }
        if self.block_tokens == 0 {
            return Err(invalid("block_tokens", "must be >= 1"));
        }
        if !(self.context_ratio > 0.0 && self.context_ratio.is_finite()) {
            return Err(invalid("context_ratio", "must be > 0"));
        }
        if !(self.mean_turns >= 1.0 && self.mean_turns <= 10_000.0) {
            return Err(invalid("mean_turns", "must be in [1, 10000]"));
        }
        if !(self.think_mean_s >= 0.0 && self.think_mean_s.is_finite()) {
            return Err(invalid("think_mean_s", "must be finite and >= 0"));
        }
        if !unit(self.reusable_share) {
            return Err(invalid("reusable_share", "must be in [0, 1]"));
        }
        if !(unit(self.shared_share) && unit(self.template_share) && self.shared_share + self.template_share <= 1.0) {
            return Err(invalid(
                "shared_share",
                "shared_share and template_share must be >= 0 and sum to <= 1",
            ));
        }
        if self.system_prompts == 0 || self.templates == 0 {
            return Err(invalid("system_prompts", "the pools need at least one entry"));
        }
        if self.output_tokens == 0 {
            return Err(invalid("output_tokens", "must be >= 1"));
        }
        Ok(())
    }

    /// Longest prompt generated (see `max_context_tokens`). vLLM rejects a prompt + output
    /// beyond `max_model_len`, and the default engine's is min(context window, KV).
    pub fn max_context(&self) -> u64 {
        self.max_context_tokens.unwrap_or_else(|| {
            let model_len = SimConfig::default().model_len().min(self.kv_tokens);
            model_len.saturating_sub(2 * u64::from(self.output_tokens))
        })
    }

    /// Largest number of turns a session can draw.
    fn max_turns(&self) -> u32 {
        (2.0 * self.mean_turns - 1.0).round().max(1.0) as u32
    }

    /// The segment sizes that meet the targets in expectation (module docs).
    ///
    /// # Errors
    /// [`SimError::InvalidConfig`] for out-of-range options, or targets that no non-negative
    /// segment sizes meet (e.g. a reusable share above what the history alone reuses).
    pub fn shape(&self) -> Result<SyntheticShape> {
        self.validate()?;
        let longest = f64::from(self.max_turns());
        let mu = f64::midpoint(longest, 1.0); // the realised mean of uniform {1..longest}
        let e_t2 = (longest + 1.0) * (2.0 * longest + 1.0) / 6.0;
        let pairs = (e_t2 - mu) / 2.0; // E[T(T-1)/2]
        let pairs_before = pairs - (mu - 1.0); // E[(T-1)(T-2)/2]
        // The mean final context, lowered where the longest session would outgrow the cap.
        let max_context = self.max_context() as f64;
        let context_for = |g: f64| (self.context_ratio * self.kv_tokens as f64).min(max_context - (longest - mu) * g);
        let reusable = self.reusable_share;
        let same = 1.0 - self.shared_share - self.template_share;
        let solve = |g: f64| {
            let context = context_for(g);
            let tot = mu * (context - (mu - 1.0) * g) + g * pairs;
            let system = self.shared_share * reusable * tot / mu;
            let template = self.template_share * reusable * tot / mu;
            let message = if mu > 1.0 {
                (same * reusable * tot - g * pairs_before) / (mu - 1.0)
            } else {
                0.0
            };
            let tail = ((1.0 - reusable) * tot - message - (mu - 1.0) * g) / mu;
            SyntheticShape {
                system_tokens: system,
                template_tokens: template,
                message_tokens: message,
                growth_tokens: g,
                tail_tokens: tail,
                context_tokens: context,
            }
        };
        let ok = |s: &SyntheticShape| {
            s.system_tokens >= 0.0 && s.template_tokens >= 0.0 && s.message_tokens >= 0.0 && s.tail_tokens >= 0.0
        };
        let mut g = f64::from(self.growth_tokens);
        for _ in 0..40 {
            let s = solve(g);
            if ok(&s) {
                return Ok(s);
            }
            g /= 2.0;
        }
        Err(invalid(
            "reusable_share",
            format!("no segment sizes meet reusable_share {reusable} with these shares and turns"),
        ))
    }
}

/// Uniform in [0, 1) from a key.
pub(crate) fn unit(key: u64) -> f64 {
    (mix64(key) >> 11) as f64 / (1_u64 << 53) as f64
}

/// Blocks of a segment of `tokens` tokens.
fn blocks(tokens: f64, block: u32) -> u64 {
    (tokens / f64::from(block)).round().max(0.0) as u64
}

/// Builds the workload of the module docs.
///
/// # Errors
/// [`SimError::InvalidConfig`] for out-of-range options (see [`SyntheticOptions::shape`]).
pub fn synthetic_agent_sessions(options: &SyntheticOptions) -> Result<Workload> {
    let shape = options.shape()?;
    let bt = options.block_tokens;
    let (system_blocks, template_blocks, message_blocks, growth_blocks, tail_blocks) = (
        blocks(shape.system_tokens, bt),
        blocks(shape.template_tokens, bt),
        blocks(shape.message_tokens, bt),
        blocks(shape.growth_tokens, bt).max(1),
        blocks(shape.tail_tokens, bt),
    );
    let out_mean = f64::from(options.output_tokens);
    let cap = options.max_context() / u64::from(bt);
    let seed = mix64(options.seed ^ 0x5EED_A6E7_5E55_1045);
    let name = format!("synthetic(x{:.3} KV)", options.context_ratio);
    let mut builder = WorkloadBuilder::new(name, bt, ArrivalKind::ClosedLoop);
    let max_turns = u64::from(options.max_turns());
    let mut chain: Vec<u64> = Vec::new();
    for s in 0..options.sessions {
        let key = |what: u64, k: u64| mix64(seed ^ mix64((u64::from(s) << 32) ^ (what << 56) ^ k));
        let turns = 1 + (unit(key(1, 0)) * max_turns as f64) as u64;
        let prompt = (unit(key(2, 0)) * f64::from(options.system_prompts)) as u64;
        let template = (unit(key(3, 0)) * f64::from(options.templates)) as u64;
        // History: the shared head, then private blocks; every id chains on its parent's.
        chain.clear();
        let mut parent = seed;
        for k in 0..system_blocks {
            parent = mix64(parent ^ mix64(0xA000 ^ (prompt << 20) ^ k)) | SHARED_ID_TAG;
            chain.push(parent);
        }
        for k in 0..template_blocks {
            parent = mix64(parent ^ mix64(0xB000 ^ (template << 20) ^ k)) | SHARED_ID_TAG;
            chain.push(parent);
        }
        let mut private = 0_u64;
        let mut next_private = |parent: u64| {
            private += 1;
            mix64(parent ^ key(4, private)) & !SHARED_ID_TAG
        };
        for _ in 0..message_blocks {
            parent = next_private(parent);
            chain.push(parent);
        }
        let mut prev = None;
        for t in 0..turns {
            if t > 0 {
                for _ in 0..growth_blocks {
                    parent = next_private(parent);
                    chain.push(parent);
                }
            }
            let history = chain.len() as u64;
            if history + tail_blocks > cap && t > 0 {
                break; // the next prompt would not fit: the session ends
            }
            let mut tail_parent = parent;
            let tail: Vec<u64> = (0..tail_blocks)
                .map(|_| {
                    tail_parent = next_private(tail_parent);
                    tail_parent
                })
                .collect();
            let input = ((history + tail_blocks) * u64::from(bt)).clamp(1, u64::from(u32::MAX)) as u32;
            let output = (out_mean * (0.5 + unit(key(5, t)))).round().max(1.0) as u32;
            let think = if t == 0 {
                0.0
            } else {
                -options.think_mean_s * (1.0 - unit(key(6, t))).ln()
            };
            let spec = RequestSpec {
                trace_id: (i64::from(s) << 16) | t as i64,
                input_tokens: input,
                output_tokens: output,
                time_s: 0.0,
                think_s: think,
                prev,
                session: s,
                root_session: s,
                first_turn: Some(t == 0),
            };
            prev = Some(builder.push(spec, chain.iter().copied().chain(tail)));
        }
    }
    builder.build()
}

/// Reuse statistics of a workload, measured from its chains (the generator's tests; the
/// regime map reports them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct ReuseStats {
    /// Requests.
    pub requests: u64,
    /// Share of prefill tokens whose block appeared in an earlier request (trace order).
    pub reusable_share: f64,
    /// Share of the reuse on blocks tagged shared (system prompts, templates).
    pub shared_reuse_share: f64,
    /// Share of the reuse on blocks an earlier request of the same session held.
    pub same_session_reuse_share: f64,
    /// Share of follow-ups whose think time is at most 100 s.
    pub think_within_100s: f64,
    /// Share of requests that are follow-ups (agent-triggered).
    pub followup_share: f64,
    /// Mean prompt of a session's last request ÷ `kv_tokens`.
    pub final_context_ratio: f64,
}

/// Measures [`ReuseStats`] of `workload` against an instance KV of `kv_tokens`. O(ids).
pub fn reuse_stats(workload: &Workload, kv_tokens: u64) -> ReuseStats {
    let mut seen: hashbrown::HashMap<u64, u32> = hashbrown::HashMap::new();
    let (mut total, mut reused, mut shared, mut same) = (0_u64, 0_u64, 0_u64, 0_u64);
    let (mut followups, mut quick) = (0_u64, 0_u64);
    let mut last: hashbrown::HashMap<u32, u32> = hashbrown::HashMap::new();
    let bt = u64::from(workload.block_tokens());
    for (i, r) in workload.requests().iter().enumerate() {
        total += u64::from(r.input_tokens);
        for &id in workload.chain(i) {
            if let Some(&owner) = seen.get(&id) {
                reused += bt;
                if id & SHARED_ID_TAG != 0 {
                    shared += bt;
                } else if owner == r.session {
                    same += bt;
                }
            } else {
                seen.insert(id, r.session);
            }
        }
        if r.prev.is_some() {
            followups += 1;
            quick += u64::from(r.think_s <= 100.0);
        }
        last.insert(r.session, r.input_tokens);
    }
    let ratio = |a: u64, b: u64| if b == 0 { 0.0 } else { a as f64 / b as f64 };
    let final_mean = last.values().map(|&t| f64::from(t)).sum::<f64>() / last.len().max(1) as f64;
    ReuseStats {
        requests: workload.len() as u64,
        reusable_share: ratio(reused, total),
        shared_reuse_share: ratio(shared, reused),
        same_session_reuse_share: ratio(same, reused),
        think_within_100s: ratio(quick, followups),
        followup_share: ratio(followups, workload.len() as u64),
        final_context_ratio: final_mean / kv_tokens.max(1) as f64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_hit_the_bailian_statistics() {
        let o = SyntheticOptions::default();
        let w = synthetic_agent_sessions(&o).unwrap();
        let s = reuse_stats(&w, o.kv_tokens);
        let near = |x: f64, target: f64, tol: f64, what: &str| {
            assert!(
                (x - target).abs() <= tol,
                "{what}: {x:.4} vs target {target} ± {tol} ({s:?})"
            );
        };
        near(s.reusable_share, 0.815, 0.02, "reusable share");
        near(
            s.shared_reuse_share,
            0.19 + 0.14,
            0.03,
            "shared (system prompt + template) share of reuse",
        );
        near(s.same_session_reuse_share, 0.67, 0.03, "same-session share of reuse");
        near(s.think_within_100s, 0.9, 0.03, "think time within 100 s");
        near(s.followup_share, 0.935, 0.01, "agent-triggered share");
        near(s.final_context_ratio, 0.1, 0.015, "final context / KV");
        // The system prompt alone: the first `P` blocks of every chain.
        let p = blocks(o.shape().unwrap().system_tokens, o.block_tokens) as usize;
        let reused_tokens = s.reusable_share * w.requests().iter().map(|r| f64::from(r.input_tokens)).sum::<f64>();
        let system = (w.len() * p * o.block_tokens as usize) as f64 / reused_tokens;
        near(system, 0.19, 0.02, "system-prompt share of reuse");
        eprintln!("synthetic defaults: {s:?}; system-prompt share of reuse {system:.4}");
    }

    #[test]
    fn context_ratio_is_met_across_the_map() {
        for ratio in [0.05, 0.25, 0.5, 1.0] {
            let o = SyntheticOptions {
                context_ratio: ratio,
                sessions: 60,
                ..SyntheticOptions::default()
            };
            let w = synthetic_agent_sessions(&o).unwrap();
            let s = reuse_stats(&w, o.kv_tokens);
            let target = o.shape().unwrap().context_tokens / o.kv_tokens as f64;
            if ratio <= 0.5 {
                assert!((target - ratio).abs() < 1e-9, "ratio {ratio} is met as asked");
            }
            assert!(
                (s.final_context_ratio - target).abs() <= 0.1 * target + 0.01,
                "ratio {ratio}: {s:?}"
            );
            assert!((s.reusable_share - 0.815).abs() <= 0.04, "ratio {ratio}: {s:?}");
            assert!(s.followup_share > 0.9, "ratio {ratio}: {s:?}");
            eprintln!("context_ratio {ratio}: target {target:.3}, {s:?}");
            let longest = w
                .requests()
                .iter()
                .map(|r| u64::from(r.input_tokens + r.output_tokens))
                .max()
                .unwrap();
            assert!(
                longest <= SimConfig::default().model_len(),
                "a request always fits the engine's max_model_len"
            );
        }
    }

    #[test]
    fn deterministic_by_seed_and_chains_extend() {
        let o = SyntheticOptions {
            sessions: 20,
            ..SyntheticOptions::default()
        };
        let a = synthetic_agent_sessions(&o).unwrap();
        let b = synthetic_agent_sessions(&o).unwrap();
        assert_eq!(a.requests(), b.requests());
        assert!((0..a.len()).all(|i| a.chain(i) == b.chain(i)));
        let c = synthetic_agent_sessions(&SyntheticOptions { seed: 1, ..o.clone() }).unwrap();
        assert!((0..a.len().min(c.len())).any(|i| a.chain(i) != c.chain(i)));
        let shape = o.shape().unwrap();
        let tail = blocks(shape.tail_tokens, o.block_tokens) as usize;
        for (i, r) in a.requests().iter().enumerate() {
            if let Some(p) = r.prev {
                let parent = a.chain(p as usize);
                let history = &parent[..parent.len() - tail];
                assert_eq!(
                    &a.chain(i)[..history.len()],
                    history,
                    "request {i} extends its predecessor"
                );
            }
            assert_ne!(
                a.chain(i)[0] & SHARED_ID_TAG,
                0,
                "every chain opens on the shared prompt"
            );
        }
    }

    #[test]
    fn bad_options_are_rejected() {
        let bad = [
            SyntheticOptions {
                sessions: 0,
                ..SyntheticOptions::default()
            },
            SyntheticOptions {
                context_ratio: 0.0,
                ..SyntheticOptions::default()
            },
            SyntheticOptions {
                shared_share: 0.9,
                template_share: 0.2,
                ..SyntheticOptions::default()
            },
            SyntheticOptions {
                reusable_share: 0.999,
                mean_turns: 2.0,
                ..SyntheticOptions::default()
            },
        ];
        for o in bad {
            assert!(synthetic_agent_sessions(&o).is_err(), "{o:?}");
        }
    }
}
