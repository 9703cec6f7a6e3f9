//! The instances' names as Python strings, made once per name and reused as the keys of a
//! query's two dicts. (Not for a decision's `instance`: from Python a 32K-token stay-home route
//! measured ≈ 1.5 µs slower with the shared string than with a new one, in every one of ten
//! alternated runs, the extra time in the core's walk; why was not found. `BENCHMARKS.md`.)
//!
//! Why: a fresh `str` per use costs its allocation and UTF-8 decode and, as a dict key, its
//! hash (a `str` caches its hash, so a reused key is hashed once in its life). `Router.query()`
//! keys two dicts by every instance's name on each call; with the GIL held all along, that
//! work is what a second querying thread waits for.
//!
//! Algorithm: a map (multiply-mix hashed, `MixMap`) from the address of the core's `Arc<str>`
//! of a name to that `Arc` (kept, so the address names that one string while it is a key) and
//! its Python string.
//! Invariants: every access holds the GIL, so the mutex is never waited for; at most
//! [`MAX_NAMES`] entries (instances that come and go under new names make the cache start
//! over, never grow without bound). Complexity: O(1) a name.

use std::sync::{Arc, Mutex, PoisonError};

use pyo3::prelude::*;
use pyo3::types::PyString;
use smetric_core::MixMap;

/// Entries past which the cache starts over.
const MAX_NAMES: usize = 4096;

/// A name's `Arc<str>` (kept alive while its address is a key) and its Python string.
type Entry = (Arc<str>, Py<PyString>);

/// Python strings of instance names, by the address of their `Arc<str>` (see the module doc).
#[derive(Default)]
pub(crate) struct NameStrings(Mutex<MixMap<u64, Entry>>);

impl NameStrings {
    /// `name` as a Python string, made on its first use.
    pub(crate) fn get<'py>(&self, py: Python<'py>, name: &Arc<str>) -> Bound<'py, PyString> {
        // A `u64` key: the multiply-mix hasher takes it in one step (a `usize` goes byte by byte).
        let key = Arc::as_ptr(name).cast::<u8>() as usize as u64;
        let mut map = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((_, s)) = map.get(&key) {
            return s.bind(py).clone();
        }
        if map.len() >= MAX_NAMES {
            map.clear();
        }
        let s = PyString::new(py, name);
        map.insert(key, (Arc::clone(name), s.clone().unbind()));
        s
    }
}
