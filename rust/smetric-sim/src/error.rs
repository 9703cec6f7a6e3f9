//! The simulator's one error type. Bad trace input never panics: every loader error names
//! the file and the 1-based line, so a user can open the offending record.

use std::path::PathBuf;

use thiserror::Error;

/// Everything that can go wrong while loading a workload or running a simulation.
#[derive(Debug, Error)]
pub enum SimError {
    /// The trace file could not be opened or read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// File being read.
        path: PathBuf,
        /// Underlying I/O error.
        source: std::io::Error,
    },
    /// A trace line is not valid JSON for its format, or holds an invalid value.
    #[error("{path}:{line}: {reason}")]
    Parse {
        /// File being read.
        path: PathBuf,
        /// 1-based line number.
        line: u64,
        /// What is wrong with the record.
        reason: String,
    },
    /// A configuration field with an invalid value.
    #[error("invalid config field {field}: {reason}")]
    InvalidConfig {
        /// Field name, dotted for nested structs.
        field: &'static str,
        /// Why the value is rejected.
        reason: String,
    },
    /// The workload has no request to simulate.
    #[error("the workload has no request")]
    EmptyWorkload,
    /// Requests are in flight but no event can make progress (a simulator bug, reported
    /// instead of looping forever).
    #[error("simulation stalled at t={time_s:.3}s with {in_flight} requests in flight")]
    Stalled {
        /// Simulated time of the stall, seconds.
        time_s: f64,
        /// Requests that arrived and never finished.
        in_flight: u64,
    },
    /// The run processed more events than `max_events` allows (a guard against runs that
    /// make almost no progress in simulated time).
    #[error("simulation exceeded its budget of {events} events at t={time_s:.3}s")]
    EventBudget {
        /// Events processed.
        events: u64,
        /// Simulated time when the budget ran out, seconds.
        time_s: f64,
    },
    /// The routing core refused a call.
    #[error("router error: {0}")]
    Router(String),
}

/// Result alias of the simulator.
pub type Result<T> = std::result::Result<T, SimError>;
