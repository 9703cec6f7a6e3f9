//! Reading a request body's JSON as Python's checks read it, without building a tree: fields
//! kept as borrowed slices of the body (`RawValue`), decoded one by one where the rule needs
//! them. A value of the wrong JSON type reads as `None` — the native path then hands the body to
//! the app, whose check answers it. `Option<&RawValue>` fields read JSON `null` as `None`, as
//! Python's `dict.get` does; O(value bytes) a read.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;

/// A JSON string's text, borrowed unless it escapes a character.
#[derive(Deserialize)]
struct Text<'a>(#[serde(borrow)] Cow<'a, str>);

/// A JSON string's text; `None` for any other value.
pub(crate) fn string(raw: &RawValue) -> Option<Cow<'_, str>> {
    raw.get()
        .starts_with('"')
        .then(|| serde_json::from_str::<Text<'_>>(raw.get()).ok())
        .flatten()
        .map(|t| t.0)
}

/// A JSON object as `T`; `None` for anything else (serde's derive would also read an array
/// positionally, which Python's `Mapping` checks refuse).
pub(crate) fn object<'a, T: Deserialize<'a>>(raw: &'a RawValue) -> Option<T> {
    raw.get()
        .starts_with('{')
        .then(|| serde_json::from_str(raw.get()).ok())
        .flatten()
}

/// A JSON array's elements, borrowed.
pub(crate) fn list(raw: &RawValue) -> Option<Vec<&RawValue>> {
    raw.get()
        .starts_with('[')
        .then(|| serde_json::from_str(raw.get()).ok())
        .flatten()
}

pub(crate) fn is_object(raw: &RawValue) -> bool {
    raw.get().starts_with('{')
}
