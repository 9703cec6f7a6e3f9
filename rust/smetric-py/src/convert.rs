//! Python → Rust conversions of the per-request arguments.
//!
//! Token ids arrive as buffers of 32- or 64-bit integers (numpy arrays, `array.array`,
//! `memoryview`: read in place or in one validating copy in Rust, no per-element Python
//! object) or as lists of ints (one C-level int read per element). Every id must lie in
//! `[0, 2^32)`; the first offender is reported with its position.
//!
//! A contiguous, 8-byte-aligned buffer of 4-byte ids, routed at a block size
//! `smetric_core::shared_ids_supported` accepts, is not copied ([`InPlaceIds`]): the router
//! reads it after the GIL is released, once, through atomic loads, and checks it while
//! hashing. The exporter keeps the memory alive and refuses to resize it while the buffer is
//! held (the buffer protocol, PEP 3118); a thread that writes the array during the call makes
//! the router see some mixture of old and new ids (a different route), as numpy's own
//! GIL-releasing functions do; the reads are atomic, as pyo3's buffer documentation asks of
//! memory other code may write. Saved: the copy under the GIL (≈ 2 µs of a
//! 32K-token prompt's ≈ 13 µs; BENCHMARKS.md, "The single-thread budget").

use std::sync::atomic::{AtomicU32, AtomicU64};

use pyo3::buffer::{Element, ElementType, PyBuffer, PyUntypedBuffer};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyList, PyString, PyTuple};
use smetric_core::{BlockHash, RequestId, SharedIds, SmetricError, shared_ids_supported};

use crate::errors::to_py;

fn bad_token(position: usize, value: i128) -> PyErr {
    to_py(&SmetricError::InvalidToken { position, value })
}

/// The integer element types a token buffer may hold: 32- and 64-bit, signed or not.
trait TokenElement: Element + Copy + Into<i128> {
    /// Whether every value lies in `[0, 2^32)`: one OR-fold over the slice, in the
    /// element's own width (so that it vectorises as wide as the type allows).
    fn all_token_ids(values: &[Self]) -> bool;
    /// Whether this one value lies in `[0, 2^32)`.
    fn is_token_id(self) -> bool;
    /// The value as a token id (exact when [`TokenElement::is_token_id`]).
    fn narrow(self) -> u32;
}

/// OR of every value: 16 lanes of accumulators, so that the fold runs as many independent
/// vector ORs per cycle as the CPU has ports (a single accumulator chain waits for itself;
/// LLVM picks two).
fn or_fold<T: Copy + Default + std::ops::BitOr<Output = T>>(values: &[T]) -> T {
    const LANES: usize = 16;
    let mut acc = [T::default(); LANES];
    let chunks = values.chunks_exact(LANES);
    let tail = chunks.remainder();
    for chunk in chunks {
        for (a, &v) in acc.iter_mut().zip(chunk) {
            *a = *a | v;
        }
    }
    acc.iter().chain(tail).fold(T::default(), |a, &v| a | v)
}

impl TokenElement for i32 {
    fn all_token_ids(values: &[Self]) -> bool {
        or_fold(values) >= 0
    }
    fn is_token_id(self) -> bool {
        self >= 0
    }
    fn narrow(self) -> u32 {
        self as u32
    }
}
impl TokenElement for u32 {
    fn all_token_ids(_: &[Self]) -> bool {
        true
    }
    fn is_token_id(self) -> bool {
        true
    }
    fn narrow(self) -> u32 {
        self
    }
}
impl TokenElement for i64 {
    fn all_token_ids(values: &[Self]) -> bool {
        or_fold(values) as u64 >> 32 == 0
    }
    fn is_token_id(self) -> bool {
        (self as u64) >> 32 == 0
    }
    fn narrow(self) -> u32 {
        self as u32
    }
}
impl TokenElement for u64 {
    fn all_token_ids(values: &[Self]) -> bool {
        or_fold(values) >> 32 == 0
    }
    fn is_token_id(self) -> bool {
        self >> 32 == 0
    }
    fn narrow(self) -> u32 {
        self as u32
    }
}

/// Token ids as converted with the GIL held: checked already (from Python ints), or a copy
/// of a buffer's values still to be checked and narrowed by [`TokenIds::check`], which
/// needs no GIL and so runs after it is released.
pub(crate) enum TokenIds {
    /// Checked ids.
    Checked(Vec<u32>),
    /// A copy of an int32 buffer.
    I32(Vec<i32>),
    /// A copy of an int64 buffer.
    I64(Vec<i64>),
    /// A copy of a uint64 buffer.
    U64(Vec<u64>),
}

impl TokenIds {
    /// How many ids.
    pub(crate) fn len(&self) -> usize {
        match self {
            Self::Checked(ids) => ids.len(),
            Self::I32(values) => values.len(),
            Self::I64(values) => values.len(),
            Self::U64(values) => values.len(),
        }
    }

    /// The ids as u32, or the first id outside `[0, 2^32)` with its position.
    pub(crate) fn check(self) -> Result<Vec<u32>, SmetricError> {
        match self {
            Self::Checked(ids) => Ok(ids),
            Self::I32(values) => narrow(values),
            Self::I64(values) => narrow(values),
            Self::U64(values) => narrow(values),
        }
    }
}

/// An OR-fold that says whether any id left `[0, 2^32)`, then the narrowing to u32. Two
/// loops, not one: each vectorises on its own (a map that carries the fold's state does
/// not), and for 32-bit elements the narrowing reuses the copy's allocation. Only a bad id
/// takes the slow path that finds and reports it.
fn narrow<T: TokenElement>(values: Vec<T>) -> Result<Vec<u32>, SmetricError> {
    if T::all_token_ids(&values) {
        return Ok(values.into_iter().map(T::narrow).collect());
    }
    let (position, value) = values
        .into_iter()
        .enumerate()
        .find(|(_, v)| !v.is_token_id())
        .map_or((0, 0), |(i, v)| (i, v.into()));
    Err(SmetricError::InvalidToken { position, value })
}

/// A buffer of 4-byte token ids the router reads in place, without the GIL (module doc).
pub(crate) struct InPlaceIds {
    buffer: PyUntypedBuffer,
    /// Words of two ids in the prompt's full blocks.
    block_words: usize,
    /// Ids after them.
    tail: usize,
    signed: bool,
}

impl InPlaceIds {
    /// The buffer read in place at `block_size`, or back to the caller when it cannot be:
    /// ids not 4 bytes, not C-contiguous, not 8-byte aligned, or a block size whose blocks
    /// are not whole words.
    fn new(buffer: PyUntypedBuffer, block_size: usize) -> Result<Self, PyUntypedBuffer> {
        let signed = match ElementType::from_format(buffer.format()) {
            ElementType::SignedInteger { bytes: 4 } => true,
            ElementType::UnsignedInteger { bytes: 4 } => false,
            _ => return Err(buffer),
        };
        let readable = buffer.item_size() == 4
            && buffer.is_c_contiguous()
            && buffer.buf_ptr().align_offset(align_of::<AtomicU64>()) == 0
            && shared_ids_supported(block_size)
            && cfg!(target_pointer_width = "64");
        if !readable {
            return Err(buffer);
        }
        let len = buffer.item_count();
        let full = len / block_size * block_size;
        Ok(Self {
            block_words: full / 2,
            tail: len - full,
            signed,
            buffer,
        })
    }

    /// How many ids.
    pub(crate) fn len(&self) -> usize {
        self.block_words * 2 + self.tail
    }

    /// The ids as the core reads them.
    #[allow(unsafe_code)]
    pub(crate) fn ids(&self) -> SharedIds<'_> {
        let start = self.buffer.buf_ptr();
        // SAFETY: `start` points at `len_bytes() = 8·block_words + 4·tail` bytes of one
        // C-contiguous allocation (checked in `new`: 4-byte items, C-contiguous), aligned to 8
        // (checked; so the tail, 8·block_words bytes on, is aligned to 4), which the exporter
        // keeps alive and in place while `self.buffer` is held (PEP 3118) — as long as the
        // returned borrow. Rust code only reads it, only through relaxed atomic loads, each id
        // once, so nothing here assumes it stable (pyo3's `buf_ptr` asks for atomic access to
        // memory others may write); a thread that writes the array during the call races with
        // the caller's own use of it, which `route`'s documentation rules out as numpy's
        // GIL-releasing functions do. Relaxed loads of at most a register's width do not trap
        // on read-only memory (core::sync::atomic; this path needs a 64-bit target).
        unsafe {
            let blocks = std::slice::from_raw_parts(start.cast::<AtomicU64>().cast_const(), self.block_words);
            let tail = std::slice::from_raw_parts(
                start
                    .cast::<AtomicU64>()
                    .add(self.block_words)
                    .cast::<AtomicU32>()
                    .cast_const(),
                self.tail,
            );
            SharedIds {
                blocks,
                tail,
                signed: self.signed,
            }
        }
    }

    /// Releases the buffer (with the GIL: dropping it elsewhere would take the GIL to do so).
    pub(crate) fn release(self, py: Python<'_>) {
        self.buffer.release(py);
    }
}

/// Token ids from a buffer of 32- or 64-bit integers (numpy arrays, `array.array`,
/// `memoryview`, anything exporting the buffer protocol), dispatched on the buffer's format
/// once (a typed `PyBuffer::get` that fails would cost an exception object per try). The
/// one copy the call needs is made here (the ids cross the GIL's release, after which the
/// exporter's memory may change; `PyBuffer_ToContiguous` also gathers a strided view).
fn any_buffer_tokens(obj: &Bound<'_, PyAny>, buf: PyUntypedBuffer) -> PyResult<TokenIds> {
    let py = obj.py();
    let element = ElementType::from_format(buf.format());
    let supported = matches!(
        element,
        ElementType::SignedInteger { bytes: 4 | 8 } | ElementType::UnsignedInteger { bytes: 4 | 8 }
    );
    // An empty buffer is an empty prompt, as `[]` is. Its data pointer may be anything
    // (CPython's empty `array('I')` has none), so pyo3's typed view would refuse it as
    // misaligned: nothing to copy, so nothing is read.
    if supported && buf.len_bytes() == 0 {
        return Ok(TokenIds::Checked(Vec::new()));
    }
    match element {
        ElementType::SignedInteger { bytes: 4 } => Ok(TokenIds::I32(buf.as_typed::<i32>()?.to_vec(py)?)),
        ElementType::UnsignedInteger { bytes: 4 } => Ok(TokenIds::Checked(buf.as_typed::<u32>()?.to_vec(py)?)),
        ElementType::SignedInteger { bytes: 8 } => Ok(TokenIds::I64(buf.as_typed::<i64>()?.to_vec(py)?)),
        ElementType::UnsignedInteger { bytes: 8 } => Ok(TokenIds::U64(buf.as_typed::<u64>()?.to_vec(py)?)),
        _ => {
            let dtype = obj.getattr("dtype").map_or_else(
                |_| {
                    Ok::<_, PyErr>(format!(
                        "{} of format {:?}",
                        obj.get_type().name()?,
                        buf.format().to_string_lossy()
                    ))
                },
                |d| Ok(d.str()?.to_string()),
            )?;
            Err(to_py(&SmetricError::UnsupportedDtype { dtype }))
        }
    }
}

/// Token ids from a list of ints, a buffer of 32- or 64-bit integers, or any iterable of
/// ints; a buffer's are checked later, by [`TokenIds::check`].
pub(crate) fn tokens(obj: &Bound<'_, PyAny>) -> PyResult<TokenIds> {
    match buffer_of(obj) {
        Some(buf) => any_buffer_tokens(obj, buf),
        None => sequence_tokens(obj),
    }
}

/// A prompt's token ids as [`tokens`] converts them, or, for a buffer [`InPlaceIds`] can read
/// at `block_size`, that buffer, not copied.
pub(crate) fn prompt_tokens(obj: &Bound<'_, PyAny>, block_size: usize) -> PyResult<PromptIds> {
    let Some(buf) = buffer_of(obj) else {
        return Ok(PromptIds::Copied(sequence_tokens(obj)?));
    };
    Ok(match InPlaceIds::new(buf, block_size) {
        Ok(ids) => PromptIds::InPlace(ids),
        Err(buf) => PromptIds::Copied(any_buffer_tokens(obj, buf)?),
    })
}

/// A prompt's token ids: read in place, or converted.
pub(crate) enum PromptIds {
    InPlace(InPlaceIds),
    Copied(TokenIds),
}

/// The buffer `obj` exports, unless it is a list (a list is read through its own fast path).
fn buffer_of(obj: &Bound<'_, PyAny>) -> Option<PyUntypedBuffer> {
    if obj.is_instance_of::<PyList>() {
        return None;
    }
    PyUntypedBuffer::get(obj).ok()
}

/// Token ids from a list, a tuple or any other iterable of ints.
fn sequence_tokens(obj: &Bound<'_, PyAny>) -> PyResult<TokenIds> {
    let mut out = Vec::new();
    if let Ok(list) = obj.cast::<PyList>() {
        if let Some(ids) = list_through_array(list) {
            return Ok(TokenIds::Checked(ids));
        }
        // The slow path finds the offending element and says where it is.
        out.reserve(list.len());
        for (i, item) in list.iter().enumerate() {
            out.push(token_item(i, &item)?);
        }
        return Ok(TokenIds::Checked(out));
    }
    if let Ok(tuple) = obj.cast::<PyTuple>() {
        for (i, item) in tuple.iter().enumerate() {
            out.push(token_item(i, &item)?);
        }
        return Ok(TokenIds::Checked(out));
    }
    for (i, item) in obj.try_iter().map_err(|_| unsupported(obj))?.enumerate() {
        out.push(token_item(i, &item?)?);
    }
    Ok(TokenIds::Checked(out))
}

/// `array.array("I", ...)`, looked up once.
static ARRAY_TYPE: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// A list of ints through CPython's own `array.array("I", list)`, then one copy of its
/// buffer: CPython's conversion loop reads each int without the per-item reference counting
/// and error checks of an element-by-element extraction (a 32K-token list: ≈120 µs against
/// ≈165 µs; `benches/python/route_latency.py`). `None` (the caller takes the slow path, which
/// reports the offending element) when an element is not an int in `[0, 2^32)` or when this
/// platform's `"I"` is not 4 bytes.
fn list_through_array(list: &Bound<'_, PyList>) -> Option<Vec<u32>> {
    let py = list.py();
    let array_type = ARRAY_TYPE
        .get_or_try_init(py, || py.import("array")?.getattr("array").map(Bound::unbind))
        .ok()?;
    let array = array_type.bind(py).call1(("I", list)).ok()?;
    PyBuffer::<u32>::get(&array).ok()?.to_vec(py).ok()
}

/// [`tokens`], checked with the GIL held (for calls whose work is too small to release it).
pub(crate) fn checked_tokens(obj: &Bound<'_, PyAny>) -> PyResult<Vec<u32>> {
    tokens(obj)?.check().map_err(|e| to_py(&e))
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

/// A session key as the core takes it: an `int` in `[0, 2^64)` as is, a `str` as
/// `xxh3_64(utf8, seed=0)` (the mapping of a `str` request id).
pub(crate) fn session_key(obj: &Bound<'_, PyAny>) -> PyResult<u64> {
    if let Ok(s) = obj.cast::<PyString>() {
        return Ok(RequestId::from_name(s.to_str()?).0);
    }
    obj.extract::<u64>().map_err(|_| {
        to_py(&SmetricError::InvalidArgument {
            argument: "session_key",
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
