//! Loader of the Alibaba Bailian traces (`qwen-bailian-usagetraces-anon`, `docs/algorithms.md` §3):
//! `chat_id`, `parent_chat_id`, `timestamp` (s), `input_length`, `output_length`, `turn`,
//! `hash_ids` of 16-token blocks.
//!
//! * Only full blocks are kept: `hash_ids` has `ceil(input/16)` entries and the last may cover
//!   a partial block, whose hash can even change between turns (FAQ quirk b).
//! * Sessions are rebuilt as request-sim does: a request whose parent is known (and is not
//!   itself) joins its parent's session; otherwise it opens one. A parent that appears later
//!   in the file than its child cannot be linked in one streaming pass; the child then opens
//!   its own session (the trace is time-ordered, so this does not happen in practice).
//! * Ground truth first turn: `parent_chat_id == -1`, `parent_chat_id == chat_id` or `turn == 1`.
//! * Arrivals: open loop (`timestamp / time_scale`) or, with `gate_on_parent`, a child also
//!   waits for its parent to finish (closed-loop gating, `docs/algorithms.md` §3 step 5).
//!
//! Complexity: O(ids in the file) time; memory O(kept ids + requests).

use std::path::Path;

use hashbrown::HashMap;
use serde::Deserialize;

use super::{
    ArrivalKind, RequestSpec, Workload, WorkloadBuilder, for_each_line, output_tokens, parse_error, prompt_tokens,
    time_field,
};
use crate::error::Result;

/// Tokens per block id in the Bailian traces.
pub const BAILIAN_BLOCK_TOKENS: u32 = 16;

/// Options of the Bailian loader.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BailianOptions {
    /// A child request also waits for its parent to finish (arrival = max(trace time, parent end)).
    pub gate_on_parent: bool,
}

#[derive(Deserialize)]
struct Row {
    chat_id: i64,
    #[serde(default = "no_parent")]
    parent_chat_id: i64,
    timestamp: f64,
    input_length: u64,
    output_length: u64,
    #[serde(default)]
    turn: u32,
    #[serde(default)]
    hash_ids: Vec<u64>,
}

fn no_parent() -> i64 {
    -1
}

/// Loads a Bailian trace file.
pub fn load_bailian(path: impl AsRef<Path>, options: &BailianOptions) -> Result<Workload> {
    let path = path.as_ref();
    let arrival = if options.gate_on_parent {
        ArrivalKind::GatedOpenLoop
    } else {
        ArrivalKind::OpenLoop
    };
    let mut builder = WorkloadBuilder::new("bailian", BAILIAN_BLOCK_TOKENS, arrival);
    let mut by_chat: HashMap<i64, u32> = HashMap::new();
    let mut sessions = 0_u32;
    for_each_line(path, |line, text| {
        let row: Row = serde_json::from_str(text).map_err(|e| parse_error(path, line, e.to_string()))?;
        let input = prompt_tokens(path, line, row.input_length)?;
        let timestamp = time_field(path, line, "timestamp", row.timestamp)?;
        if by_chat.contains_key(&row.chat_id) {
            return Err(parse_error(path, line, format!("duplicate chat_id {}", row.chat_id)));
        }
        let is_root = row.parent_chat_id < 0 || row.parent_chat_id == row.chat_id;
        let parent = if is_root {
            None
        } else {
            by_chat.get(&row.parent_chat_id).copied()
        };
        let session = if let Some(s) = parent.and_then(|p| builder.request_mut(p).map(|r| r.session)) {
            s
        } else {
            sessions += 1;
            sessions - 1
        };
        let full = row.hash_ids.len().min((input / BAILIAN_BLOCK_TOKENS) as usize);
        let spec = RequestSpec {
            trace_id: row.chat_id,
            input_tokens: input,
            output_tokens: output_tokens(row.output_length),
            time_s: timestamp,
            think_s: 0.0,
            prev: parent,
            session,
            root_session: session,
            first_turn: Some(is_root || row.turn == 1),
        };
        let idx = builder.push(spec, row.hash_ids[..full].iter().copied());
        by_chat.insert(row.chat_id, idx);
        Ok(())
    })?;
    builder.build()
}
