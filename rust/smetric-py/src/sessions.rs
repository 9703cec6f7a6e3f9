//! `SessionTable`: the proxy's per-session state (`smetric_gateway::session_table`), one table
//! shared by the app and the gateway's native path. Conversion only: a key is taken as its
//! UTF-8 bytes (a `str` with lone surrogates as Python's `surrogatepass` encodes it, so every
//! `str` has one digest), a bad setting is `InvalidConfigError`. Every call is O(key length)
//! and holds the GIL (it is a few hundred nanoseconds: releasing it would cost more).

use std::borrow::Cow;
use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString};
use smetric_gateway::session_table::{self, DEFAULT_CAPACITY, DEFAULT_TTL_S, SessionTable, SessionTableError};

use crate::errors::python_error;

#[pyclass(frozen, module = "smetric._core", name = "SessionTable")]
pub(crate) struct PySessionTable {
    pub(crate) inner: Arc<SessionTable>,
}

/// A key's bytes: UTF-8, or for a `str` holding lone surrogates, `surrogatepass`'s encoding.
fn key_bytes<'a>(key: &'a Bound<'_, PyString>) -> PyResult<Cow<'a, [u8]>> {
    if let Ok(text) = key.to_str() {
        return Ok(Cow::Borrowed(text.as_bytes()));
    }
    let encoded = key.call_method1("encode", ("utf-8", "surrogatepass"))?;
    Ok(Cow::Owned(encoded.cast::<PyBytes>()?.as_bytes().to_vec()))
}

#[pymethods]
impl PySessionTable {
    #[new]
    #[pyo3(
        signature = (capacity = DEFAULT_CAPACITY, ttl_s = DEFAULT_TTL_S),
        text_signature = "(capacity=100000, ttl_s=3600.0)"
    )]
    fn new(py: Python<'_>, capacity: usize, ttl_s: f64) -> PyResult<Self> {
        let table = SessionTable::new(capacity, ttl_s).map_err(|e| {
            let field = match e {
                SessionTableError::Capacity => "capacity",
                SessionTableError::Ttl(_) => "ttl_s",
            };
            python_error(py, "InvalidConfigError", &e.to_string(), |k| {
                k.set_item("field", field)?;
                k.set_item("reason", e.to_string())
            })
        })?;
        Ok(Self { inner: Arc::new(table) })
    }

    #[getter]
    fn capacity(&self) -> usize {
        self.inner.capacity()
    }

    #[getter]
    fn ttl_s(&self) -> f64 {
        self.inner.ttl_s()
    }

    #[pyo3(signature = (key, now = None))]
    fn next_turn(&self, key: &Bound<'_, PyString>, now: Option<f64>) -> PyResult<u32> {
        Ok(self.inner.next_turn(&key_bytes(key)?, now))
    }

    #[pyo3(signature = (key, instance, now = None))]
    fn place(&self, key: &Bound<'_, PyString>, instance: &str, now: Option<f64>) -> PyResult<()> {
        self.inner.place(&key_bytes(key)?, instance, now);
        Ok(())
    }

    #[pyo3(signature = (key, now = None))]
    fn home(&self, key: &Bound<'_, PyString>, now: Option<f64>) -> PyResult<Option<String>> {
        Ok(self.inner.home(&key_bytes(key)?, now).map(|h| h.to_string()))
    }

    fn end(&self, key: &Bound<'_, PyString>) -> PyResult<bool> {
        Ok(self.inner.end(&key_bytes(key)?))
    }

    fn heap_bytes(&self) -> usize {
        self.inner.heap_bytes()
    }

    fn __len__(&self) -> usize {
        self.inner.len()
    }
}

/// The fixed-size form a session key is kept in (`SessionTable`'s own).
#[pyfunction]
pub(crate) fn session_digest<'py>(key: &Bound<'py, PyString>) -> PyResult<Bound<'py, PyBytes>> {
    Ok(PyBytes::new(key.py(), &session_table::session_digest(&key_bytes(key)?)))
}
