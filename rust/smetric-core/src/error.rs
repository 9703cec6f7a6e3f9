//! The core's one error type. The bindings map each variant to a Python exception class
//! (a `ValueError` subclass under `SmetricError`) that carries the fields as attributes.

use thiserror::Error;

/// Everything that can go wrong in a call into the routing core. No call panics on bad input.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum SmetricError {
    /// `block_size` must be at least one token.
    #[error("block_size must be >= 1, got {block_size}")]
    InvalidBlockSize { block_size: u64 },
    /// A token id outside `[0, 2^32)`.
    #[error("token id {value} at position {position} is outside [0, 2^32)")]
    InvalidToken { position: usize, value: i128 },
    /// A token array whose element type is not an integer type the router accepts.
    #[error("token array dtype {dtype:?} is not supported (use int32, uint32, int64 or a list of ints)")]
    UnsupportedDtype { dtype: String },
    /// The router was given no instance, every instance was removed, or a call excluded
    /// every remaining one.
    #[error("the router has no instance to route to")]
    NoInstances,
    /// A name that is not one of the router's instances.
    #[error("unknown instance {name:?}")]
    UnknownInstance { name: String },
    /// `add_instance` with a name already present.
    #[error("instance {name:?} is already in the fleet")]
    DuplicateInstance { name: String },
    /// A policy name the router does not know.
    #[error("unknown policy {name:?} (known: {known})")]
    UnknownPolicy { name: String, known: String },
    /// A configuration field with an invalid value.
    #[error("invalid config field {field}: {reason}")]
    InvalidConfig { field: &'static str, reason: String },
    /// A call argument with an invalid value (e.g. `turn=0`, a negative `now`).
    #[error("invalid argument {argument}: {reason}")]
    InvalidArgument { argument: &'static str, reason: String },
    /// `route()` without tokens or hashes.
    #[error("route() needs tokens or hashes")]
    MissingPrompt,
}

/// Result alias of the core.
pub type Result<T> = std::result::Result<T, SmetricError>;
