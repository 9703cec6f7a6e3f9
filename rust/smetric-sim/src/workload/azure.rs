//! Loader of the Azure LLM inference traces 2023 (traces README §4): `timestamp` (s),
//! `input_length`, `output_length`; no block ids and no sessions.
//!
//! Without ids nothing can hit a prefix cache, so every chain is empty and the trace
//! exercises only the arrival process, lengths, batching and load balance. Each request is
//! its own session with unknown first-turn ground truth; arrivals are open loop.
//!
//! Complexity: O(lines) time and O(requests) memory.

use std::path::Path;

use serde::Deserialize;

use super::{
    ArrivalKind, RequestSpec, Workload, WorkloadBuilder, for_each_line, output_tokens, parse_error, prompt_tokens,
    time_field,
};
use crate::error::Result;

/// Block size used for KV accounting when a trace has no ids (vLLM's default block).
pub const AZURE_BLOCK_TOKENS: u32 = 16;

#[derive(Deserialize)]
struct Row {
    timestamp: f64,
    input_length: u64,
    output_length: u64,
}

/// Loads an Azure trace file.
pub fn load_azure(path: impl AsRef<Path>) -> Result<Workload> {
    let path = path.as_ref();
    let mut builder = WorkloadBuilder::new("azure", AZURE_BLOCK_TOKENS, ArrivalKind::OpenLoop);
    for_each_line(path, |line, text| {
        let row: Row = serde_json::from_str(text).map_err(|e| parse_error(path, line, e.to_string()))?;
        let input = prompt_tokens(path, line, row.input_length)?;
        let timestamp = time_field(path, line, "timestamp", row.timestamp)?;
        let index = builder.len() as u32;
        let spec = RequestSpec::standalone(index, input, output_tokens(row.output_length), timestamp);
        builder.push(spec, std::iter::empty());
        Ok(())
    })?;
    builder.build()
}
