//! Python → Rust conversions of the per-request arguments.
//!
//! Token ids arrive as numpy arrays (int32, uint32, int64, through the buffer protocol:
//! one validating copy in Rust, no per-element Python object) or as lists of ints. Every id
//! must lie in `[0, 2^32)`; the first offender is reported with its position.

use pyo3::buffer::PyBuffer;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString, PyTuple};
use smetric_core::{BlockHash, RequestId, SmetricError};

use crate::errors::to_py;

fn bad_token(position: usize, value: i128) -> PyErr {
    to_py(&SmetricError::InvalidToken { position, value })
}

/// Converts a copied buffer, reporting the first id outside `[0, 2^32)`. The check and the
/// conversion are two tight branch-free loops (the happy path never builds an error).
fn narrow<T: Copy + TryInto<u32> + Into<i128>>(values: Vec<T>) -> PyResult<Vec<u32>> {
    if let Some(i) = values.iter().position(|&v| TryInto::<u32>::try_into(v).is_err()) {
        return Err(bad_token(i, values[i].into()));
    }
    Ok(values.into_iter().map(|v| v.try_into().unwrap_or(0)).collect())
}

/// Token ids from a numpy array, any object exporting a 1-D integer buffer, or a sequence of ints.
pub(crate) fn tokens(obj: &Bound<'_, PyAny>) -> PyResult<Vec<u32>> {
    let py = obj.py();
    let mut out = Vec::new();
    if let Ok(list) = obj.cast::<PyList>() {
        out.reserve(list.len());
        for (i, item) in list.iter().enumerate() {
            out.push(token_item(i, &item)?);
        }
        return Ok(out);
    }
    // One memcpy out of the exporter (PyBuffer_ToContiguous), then a validating pass for signed
    // types. int32 first: it is what tokenizers hand out most, and a failed typed `get` costs an
    // exception object.
    // The happy path checks with one OR-fold (vectorised) and converts in place; only a bad id
    // takes the slow path that finds and reports it.
    if let Ok(buf) = PyBuffer::<i32>::get(obj) {
        let v = buf.to_vec(py)?;
        if v.iter().fold(0i32, |a, &t| a | t) >= 0 {
            return Ok(v.into_iter().map(|t| t as u32).collect());
        }
        return narrow(v);
    }
    if let Ok(buf) = PyBuffer::<u32>::get(obj) {
        return buf.to_vec(py);
    }
    if let Ok(buf) = PyBuffer::<i64>::get(obj) {
        let v = buf.to_vec(py)?;
        if v.iter().fold(0u64, |a, &t| a | t as u64) >> 32 == 0 {
            return Ok(v.into_iter().map(|t| t as u32).collect());
        }
        return narrow(v);
    }
    if obj.hasattr("dtype")? || obj.hasattr("__buffer__")? {
        let dtype = obj.getattr("dtype").map_or_else(
            |_| obj.get_type().name().map(|n| n.to_string()),
            |d| d.str().map(|s| s.to_string()),
        )?;
        return Err(to_py(&SmetricError::UnsupportedDtype { dtype }));
    }
    if let Ok(tuple) = obj.cast::<PyTuple>() {
        for (i, item) in tuple.iter().enumerate() {
            out.push(token_item(i, &item)?);
        }
        return Ok(out);
    }
    let mut values = Vec::new();
    for (i, item) in obj.try_iter().map_err(|_| unsupported(obj))?.enumerate() {
        values.push(token_item(i, &item?)?);
    }
    Ok(values)
}

fn unsupported(obj: &Bound<'_, PyAny>) -> PyErr {
    let dtype = obj.get_type().name().map_or_else(|_| "?".to_owned(), |n| n.to_string());
    to_py(&SmetricError::UnsupportedDtype { dtype })
}

fn token_item(i: usize, item: &Bound<'_, PyAny>) -> PyResult<u32> {
    if let Ok(v) = item.extract::<u32>() {
        return Ok(v);
    }
    if item.is_instance_of::<pyo3::types::PyBool>() || !item.is_instance_of::<pyo3::types::PyInt>() {
        // numpy integer scalars are not PyInt but index like ints.
        if let Ok(v) = item.call_method0("__index__").and_then(|v| v.extract::<i128>()) {
            return u32::try_from(v).map_err(|_| bad_token(i, v));
        }
        return Err(to_py(&SmetricError::UnsupportedDtype {
            dtype: format!("list of {}", item.get_type().name()?),
        }));
    }
    let v = item.extract::<i128>().unwrap_or(i128::MAX);
    Err(bad_token(i, v))
}

/// A pre-hashed chain: a list (or array) of ints in `[0, 2^64)`.
pub(crate) fn hashes(obj: &Bound<'_, PyAny>) -> PyResult<Vec<BlockHash>> {
    if let Ok(buf) = PyBuffer::<u64>::get(obj) {
        return Ok(buf.to_vec(obj.py())?.into_iter().map(BlockHash).collect());
    }
    if let Ok(buf) = PyBuffer::<i64>::get(obj) {
        return buf
            .to_vec(obj.py())?
            .into_iter()
            .enumerate()
            .map(|(i, v)| u64::try_from(v).map(BlockHash).map_err(|_| bad_hash(i)))
            .collect();
    }
    let mut out = Vec::new();
    for (i, item) in obj.try_iter().map_err(|_| unsupported(obj))?.enumerate() {
        out.push(BlockHash(item?.extract::<u64>().map_err(|_| bad_hash(i))?));
    }
    Ok(out)
}

fn bad_hash(i: usize) -> PyErr {
    to_py(&SmetricError::InvalidArgument {
        argument: "hashes",
        reason: format!("element {i} is not an int in [0, 2^64)"),
    })
}

/// A request id: an int in `[0, 2^64)` or a string.
pub(crate) fn request_id(obj: &Bound<'_, PyAny>) -> PyResult<RequestId> {
    if let Ok(s) = obj.cast::<PyString>() {
        return Ok(RequestId::from_name(s.to_str()?));
    }
    obj.extract::<u64>().map(RequestId).map_err(|_| {
        to_py(&SmetricError::InvalidArgument {
            argument: "request_id",
            reason: "must be a str or an int in [0, 2^64)".to_owned(),
        })
    })
}

/// The roles of a chat history: dicts with a `"role"` key or objects with a `.role`.
pub(crate) fn roles(obj: &Bound<'_, PyAny>) -> PyResult<Vec<String>> {
    let mut out = Vec::new();
    for (i, m) in obj.try_iter()?.enumerate() {
        let m = m?;
        let role = if let Ok(d) = m.cast::<PyDict>() {
            d.get_item("role")?
        } else {
            m.getattr("role").ok()
        };
        let role = role.ok_or_else(|| {
            to_py(&SmetricError::InvalidArgument {
                argument: "messages",
                reason: format!("message {i} has no role"),
            })
        })?;
        out.push(role.extract::<String>().map_err(|_| {
            to_py(&SmetricError::InvalidArgument {
                argument: "messages",
                reason: format!("role of message {i} is not a str"),
            })
        })?);
    }
    Ok(out)
}
