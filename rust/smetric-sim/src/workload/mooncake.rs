//! Loader of the Mooncake FAST'25 traces (traces README §2–3): `timestamp` in **ms**,
//! `input_length`, `output_length`, `hash_ids` of 512-token blocks including the partial
//! tail (`ceil(input/512)` ids; only the `floor(input/512)` full ones are kept).
//!
//! There are no sessions: every request is its own session, its first-turn ground truth is
//! unknown (`None`), and arrivals are open loop (`timestamp / 1000 / time_scale`).
//!
//! Complexity: O(ids in the file) time; memory O(kept ids + requests).

use std::path::Path;

use serde::Deserialize;

use super::{
    ArrivalKind, RequestSpec, Workload, WorkloadBuilder, for_each_line, output_tokens, parse_error, prompt_tokens,
    time_field,
};
use crate::error::Result;

/// Tokens per block id in the Mooncake traces.
pub const MOONCAKE_BLOCK_TOKENS: u32 = 512;
/// Milliseconds per second (Mooncake timestamps are in ms).
const MS_PER_S: f64 = 1000.0;

#[derive(Deserialize)]
struct Row {
    timestamp: f64,
    input_length: u64,
    output_length: u64,
    #[serde(default)]
    hash_ids: Vec<u64>,
}

/// Loads a Mooncake trace file.
pub fn load_mooncake(path: impl AsRef<Path>) -> Result<Workload> {
    let path = path.as_ref();
    let mut builder = WorkloadBuilder::new("mooncake", MOONCAKE_BLOCK_TOKENS, ArrivalKind::OpenLoop);
    for_each_line(path, |line, text| {
        let row: Row = serde_json::from_str(text).map_err(|e| parse_error(path, line, e.to_string()))?;
        let input = prompt_tokens(path, line, row.input_length)?;
        let timestamp = time_field(path, line, "timestamp", row.timestamp)? / MS_PER_S;
        let full = row.hash_ids.len().min((input / MOONCAKE_BLOCK_TOKENS) as usize);
        let index = builder.len() as u32;
        let spec = RequestSpec::standalone(index, input, output_tokens(row.output_length), timestamp);
        builder.push(spec, row.hash_ids[..full].iter().copied());
        Ok(())
    })?;
    builder.build()
}
