//! `vllm_block_hashes` and `vllm_event_hash`: thin bindings of `smetric-vllm`, whose block
//! hashes are byte-identical to vLLM 0.33's prefix cache. `smetric.vllm` is the typed facade.
//!
//! Bad arguments raise the `ValueError` subclasses of `smetric.errors`
//! (`InvalidBlockSizeError`, `InvalidTokenError`, `InvalidArgumentError`); wrong argument
//! types raise `TypeError`.

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyModule};
use smetric_core::DEFAULT_BLOCK_SIZE;
use smetric_vllm::{BlockHasher, HashAlgo, HashError, LoraKey, RequestKeys};

use crate::errors::python_error;

fn argument_error(py: Python<'_>, argument: &str, err: &HashError) -> PyErr {
    let message = err.to_string();
    python_error(py, "InvalidArgumentError", &message, |k| {
        k.set_item("argument", argument)?;
        k.set_item("reason", &message)
    })
}

/// Token ids from any iterable of ints; the first id outside `[0, 2**32)` is reported.
fn tokens(obj: &Bound<'_, PyAny>) -> PyResult<Vec<u32>> {
    let py = obj.py();
    let mut out = Vec::with_capacity(obj.len().unwrap_or(0));
    for (position, item) in obj.try_iter()?.enumerate() {
        let item = item?;
        if let Ok(token) = item.extract::<u32>() {
            out.push(token);
            continue;
        }
        // Not a u32: an int out of range is a value error, anything else a type error.
        let Ok(value) = item.call_method0("__index__") else {
            let kind = item.get_type().name()?;
            return Err(PyTypeError::new_err(format!(
                "token ids must be ints, got {kind} at position {position}"
            )));
        };
        let message = format!("token id {value} at position {position} is outside [0, 2**32)");
        return Err(python_error(py, "InvalidTokenError", &message, |k| {
            k.set_item("position", position)?;
            k.set_item("value", value)
        }));
    }
    Ok(out)
}

/// The vLLM prefix-cache block hashes of a prompt, one full digest per full block.
///
/// Args:
///     tokens: the prompt's token ids (any iterable of ints in ``[0, 2**32)``).
///     block_size: tokens per block (vLLM's ``block_size``; default ``DEFAULT_BLOCK_SIZE``).
///     algo: ``--prefix-caching-hash-algo``: ``"sha256"``, ``"sha256_cbor"``, ``"xxhash"``
///         or ``"xxhash_cbor"``.
///     seed: the engine's ``PYTHONHASHSEED`` string, or None if unset (required for xxhash).
///     lora: ``(lora_name, lora_path)`` of the request's LoRA adapter, or None.
///     cache_salt: the request's ``cache_salt``, or None.
///
/// Returns:
///     list[bytes]: 32-byte (sha256) or 16-byte (xxhash) digests; a trailing partial block
///     has none.
///
/// Raises:
///     InvalidBlockSizeError, InvalidTokenError, InvalidArgumentError (all ``ValueError``).
#[pyfunction]
#[allow(clippy::doc_markdown)] // a Python docstring (it becomes `__doc__`), not rustdoc
#[pyo3(signature = (tokens, block_size = i64::from(DEFAULT_BLOCK_SIZE), algo = "sha256", seed = None, lora = None, cache_salt = None))]
fn vllm_block_hashes<'py>(
    py: Python<'py>,
    tokens: &Bound<'py, PyAny>,
    block_size: i64,
    algo: &str,
    seed: Option<String>,
    lora: Option<(String, String)>,
    cache_salt: Option<String>,
) -> PyResult<Bound<'py, PyList>> {
    let algo: HashAlgo = algo.parse().map_err(|e| argument_error(py, "algo", &e))?;
    let hasher = match BlockHasher::new(algo, usize::try_from(block_size).unwrap_or(0), seed.as_deref()) {
        Ok(hasher) => hasher,
        Err(HashError::ZeroBlockSize) => {
            let message = format!("block_size must be a positive integer, got {block_size}");
            return Err(python_error(py, "InvalidBlockSizeError", &message, |k| {
                k.set_item("block_size", block_size)
            }));
        }
        Err(e) => return Err(argument_error(py, "seed", &e)),
    };
    let tokens = self::tokens(tokens)?;
    let keys = RequestKeys {
        lora: lora.map(|(name, path)| LoraKey { name, path }),
        cache_salt,
        mm: Vec::new(),
    };
    let digests = py.detach(|| hasher.block_hashes(&tokens, &keys));
    PyList::new(py, digests.iter().map(|d| PyBytes::new(py, d.as_bytes())))
}

/// The 64-bit int vLLM publishes in KV events for a block digest: its last 8 bytes read
/// big-endian (``int.from_bytes(digest, "big") & (2**64 - 1)``).
///
/// Args:
///     digest: a block digest as returned by ``vllm_block_hashes``.
///
/// Returns:
///     int: the event hash, in ``[0, 2**64)``.
#[pyfunction]
#[allow(clippy::doc_markdown)] // a Python docstring (it becomes `__doc__`), not rustdoc
fn vllm_event_hash(digest: &[u8]) -> u64 {
    smetric_vllm::event_hash(digest)
}

/// The router namespace of a request for LoRA adapter ``lora_name`` (None: the base model)
/// with vLLM's ``cache_salt`` (``smetric.vllm.cache_namespace``).
///
/// Raises:
///     ValueError: an empty adapter name or salt.
#[pyfunction]
#[pyo3(signature = (lora_name = None, cache_salt = None))]
fn vllm_cache_namespace(lora_name: Option<&str>, cache_salt: Option<&str>) -> PyResult<Option<String>> {
    smetric_vllm::cache_namespace(lora_name, cache_salt).map_err(|e| PyValueError::new_err(e.to_string()))
}

/// Adds the vLLM hashing functions to `smetric._core`.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(vllm_block_hashes, m)?)?;
    m.add_function(wrap_pyfunction!(vllm_event_hash, m)?)?;
    m.add_function(wrap_pyfunction!(vllm_cache_namespace, m)?)?;
    Ok(())
}
