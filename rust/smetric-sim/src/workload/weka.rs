//! Loader of the Weka Claude-Code session traces (`weka_cc_sessions_*.jsonl.gz`, traces
//! README §1): closed-loop agent sessions with 64-token block ids.
//!
//! * **Closed loop.** A root session's first request leaves at the session's start (drawn by
//!   the simulator); every later request leaves `think_time` after its `prev_request_id`
//!   finishes (kv-cache-tester's "think-only" replay, README caveat 1). A missing
//!   `think_time` falls back to the recorded gap `t − t_prev − api_time_prev` (≥ 0).
//! * **Subagents.** A subagent's first request follows the parent request issued before it;
//!   the source records no think time for it (0), so it keeps its recorded offset from the
//!   end of that parent request, `t − t_prev − api_time_prev` (≥ 0). Subagents are their own
//!   (sub)sessions for turn metrics and share the root session's start.
//! * **Coarsening.** Ids are prefix-chained (README caveat 3: every id always has the same
//!   predecessor), so the last 64-token id of a group of `coarsen` ids names the whole
//!   `64·coarsen`-token prefix exactly. Keeping every `coarsen`-th id turns the 70.5M
//!   references of the four files into 17.6M at the default `coarsen = 4` (256-token blocks,
//!   ≈141 MB) and shrinks every per-block cost by 4. Hits are then counted in 256-token
//!   steps, which matters little next to 113K-token median prompts.
//! * **Shared system prompt** (README caveat 2, on by default). The source ids are per
//!   session, so no two sessions share a block; in production the tool definitions and
//!   system prompt are shared. With `shared_prefix`, the first
//!   `floor((session_tool_tokens + session_system_tokens) / block)` blocks of every
//!   (sub)session are replaced by ids derived from the `(tool, system)` token counts, so
//!   sessions with identical counts share them. The data do not prove this sharing; it is a
//!   modelling choice to switch off when measuring pure session locality.
//!
//! Complexity: O(ids in the file) time; memory O(kept ids + requests).

use std::path::Path;

use hashbrown::HashMap;
use serde::Deserialize;

use super::{
    ArrivalKind, RequestSpec, SHARED_ID_TAG, Workload, WorkloadBuilder, for_each_line, mix64, output_tokens,
    parse_error, prompt_tokens, time_field,
};
use crate::error::Result;

/// Tokens per block id in the Weka traces.
pub const WEKA_BLOCK_TOKENS: u32 = 64;
/// Default coarsening: 4 × 64 = 256-token blocks (LMCache's chunk size).
pub const DEFAULT_COARSEN: u32 = 4;
/// Tag bit of synthetic shared-prefix ids; Weka's own ids are small sequential integers.
const SHARED_PREFIX_TAG: u64 = SHARED_ID_TAG;

/// Options of the Weka loader.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WekaOptions {
    /// Keep every `coarsen`-th 64-token id (block = `64·coarsen` tokens). 1 keeps them all.
    pub coarsen: u32,
    /// Map the leading tool + system-prompt blocks onto ids shared across sessions.
    pub shared_prefix: bool,
}

impl Default for WekaOptions {
    fn default() -> Self {
        Self {
            coarsen: DEFAULT_COARSEN,
            shared_prefix: true,
        }
    }
}

#[derive(Deserialize)]
struct Row {
    request_id: i64,
    prev_request_id: i64,
    session_id: String,
    root_session_id: String,
    #[serde(default)]
    turn: u32,
    t: f64,
    input_length: u64,
    output_length: u64,
    #[serde(default)]
    hash_ids: Vec<u64>,
    #[serde(default)]
    think_time: Option<f64>,
    #[serde(default)]
    api_time: Option<f64>,
    #[serde(default)]
    session_tool_tokens: Option<u64>,
    #[serde(default)]
    session_system_tokens: Option<u64>,
}

/// What the second pass needs about each request.
struct Pending {
    prev_trace_id: i64,
    t: f64,
    api_time: Option<f64>,
    think_time: Option<f64>,
}

/// Id of block `index` of the shared prefix of sessions with these tool/system token counts.
pub fn shared_prefix_id(tool_tokens: u64, system_tokens: u64, index: u64) -> u64 {
    let key = mix64(tool_tokens.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ system_tokens);
    SHARED_PREFIX_TAG | (mix64(key ^ index.wrapping_mul(0xD6E8_FEB8_6659_FD93)) >> 1)
}

/// Loads one or more Weka files (in the order given) as one closed-loop workload.
pub fn load_weka<P: AsRef<Path>>(paths: &[P], options: &WekaOptions) -> Result<Workload> {
    let coarsen = options.coarsen.max(1);
    let block_tokens = WEKA_BLOCK_TOKENS * coarsen;
    let name = format!("weka({} file{})", paths.len(), if paths.len() == 1 { "" } else { "s" });
    let mut builder = WorkloadBuilder::new(name, block_tokens, ArrivalKind::ClosedLoop);
    let mut by_trace_id: HashMap<i64, u32> = HashMap::new();
    let mut sessions: HashMap<String, u32> = HashMap::new();
    let mut roots: HashMap<String, u32> = HashMap::new();
    let mut pending: Vec<Pending> = Vec::new();
    let mut chain = Vec::new();
    for path in paths {
        let path = path.as_ref();
        for_each_line(path, |line, text| {
            let row: Row = serde_json::from_str(text).map_err(|e| parse_error(path, line, e.to_string()))?;
            let input = prompt_tokens(path, line, row.input_length)?;
            let t = time_field(path, line, "t", row.t)?;
            let think_time = match row.think_time {
                Some(v) => Some(time_field(path, line, "think_time", v)?),
                None => None,
            };
            let api_time = match row.api_time {
                Some(v) => Some(time_field(path, line, "api_time", v)?),
                None => None,
            };
            if by_trace_id.contains_key(&row.request_id) {
                return Err(parse_error(
                    path,
                    line,
                    format!("duplicate request_id {}", row.request_id),
                ));
            }
            let next_session = sessions.len() as u32;
            let session = *sessions.entry(row.session_id).or_insert(next_session);
            let next_root = roots.len() as u32;
            let root_session = *roots.entry(row.root_session_id).or_insert(next_root);
            // Only full 64-token blocks exist; ids past floor(input/64) would be a partial tail.
            let full = row.hash_ids.len().min((input / WEKA_BLOCK_TOKENS) as usize);
            let kept = full / coarsen as usize;
            chain.clear();
            chain.extend((0..kept).map(|j| row.hash_ids[(j + 1) * coarsen as usize - 1]));
            if options.shared_prefix {
                let tool = row.session_tool_tokens.unwrap_or(0);
                let system = row.session_system_tokens.unwrap_or(0);
                let shared = ((tool + system) / u64::from(block_tokens)) as usize;
                for (j, id) in chain.iter_mut().take(shared).enumerate() {
                    *id = shared_prefix_id(tool, system, j as u64);
                }
            }
            let spec = RequestSpec {
                trace_id: row.request_id,
                input_tokens: input,
                output_tokens: output_tokens(row.output_length),
                time_s: t,
                think_s: 0.0,
                prev: None,
                session,
                root_session,
                first_turn: Some(row.prev_request_id < 0 || row.turn == 1),
            };
            let idx = builder.push(spec, chain.iter().copied());
            by_trace_id.insert(row.request_id, idx);
            pending.push(Pending {
                prev_trace_id: row.prev_request_id,
                t,
                api_time,
                think_time,
            });
            Ok(())
        })?;
    }
    resolve_prev(&mut builder, &pending, &by_trace_id);
    builder.build()
}

/// Second pass: links each request to its `prev` and sets its closed-loop think time.
fn resolve_prev(builder: &mut WorkloadBuilder, pending: &[Pending], by_trace_id: &HashMap<i64, u32>) {
    for (i, p) in pending.iter().enumerate() {
        let prev = if p.prev_trace_id < 0 {
            None
        } else {
            by_trace_id.get(&p.prev_trace_id).copied()
        };
        let (prev_session, prev_t, prev_api) = match prev {
            Some(j) => {
                let session = builder.request_mut(j).map(|r| r.session);
                (session, pending[j as usize].t, pending[j as usize].api_time)
            }
            None => (None, 0.0, None),
        };
        let Some(r) = builder.request_mut(i as u32) else {
            continue;
        };
        match prev {
            None => {
                // A dangling prev (its source file was not staged) starts with the session.
                r.prev = None;
            }
            Some(j) => {
                let recorded_gap = (p.t - prev_t - prev_api.unwrap_or(0.0)).max(0.0);
                r.prev = Some(j);
                r.think_s = if prev_session == Some(r.session) {
                    p.think_time.unwrap_or(recorded_gap)
                } else {
                    recorded_gap
                };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_ids_depend_on_counts_and_index_only() {
        assert_eq!(shared_prefix_id(10, 20, 3), shared_prefix_id(10, 20, 3));
        assert_ne!(shared_prefix_id(10, 20, 3), shared_prefix_id(10, 21, 3));
        assert_ne!(shared_prefix_id(10, 20, 3), shared_prefix_id(10, 20, 4));
        assert_ne!(shared_prefix_id(20, 10, 0), shared_prefix_id(10, 20, 0));
        assert!(shared_prefix_id(1, 2, 3) & SHARED_PREFIX_TAG != 0);
    }
}
