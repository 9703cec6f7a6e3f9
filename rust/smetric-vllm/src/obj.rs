//! The tiny Python object model that vLLM feeds to its block hash functions.
//!
//! vLLM hashes the 3-tuple `(parent_hash: bytes, tokens: tuple[int, ...], extra_keys: tuple | None)`.
//! Both serializers ([`crate::pickle`] and [`crate::cbor`]) walk this model, so the set of
//! supported Python types is exactly the set of variants here.
//!
//! Object identity matters to pickle (an object seen twice is written as a memo reference).
//! vLLM's tag strings (`"lora"`, `"mm"`, ...) are code constants, so every occurrence in one
//! hash input is the same object; every other `str`/`bytes` value is assumed to be a distinct
//! object. That holds for values vLLM decodes from requests, with one unreproducible corner:
//! CPython may hand out one shared object for equal one-character strings, so a LoRA whose
//! name and path are the same single character can pickle differently (CBOR is unaffected).

/// A borrowed Python value, as far as vLLM's hash inputs need one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Obj<'a> {
    /// `None`.
    None,
    /// A Python `int` that fits in 64 bits.
    Int(i64),
    /// A `str` object built at run time: a distinct object.
    Str(&'a str),
    /// A `str` constant from vLLM's source (`"lora"`, `"mm"`, ...): one shared object.
    Tag(&'static str),
    /// A `bytes` object: a distinct object.
    Bytes(&'a [u8]),
    /// A tuple of token ids, kept as a slice so blocks are hashed without copying.
    Tokens(&'a [u32]),
    /// A tuple of arbitrary values.
    Tuple(Vec<Obj<'a>>),
}
