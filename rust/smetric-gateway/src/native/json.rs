//! Reading a request body's JSON as Python's checks read it, without building a tree: fields
//! kept as borrowed slices of the body (`RawValue`), decoded one by one where the rule needs
//! them. A value of the wrong JSON type reads as `None` — the native path then hands the body to
//! the app, whose check answers it. `Option<&RawValue>` fields read JSON `null` as `None`, as
//! Python's `dict.get` does; O(value bytes) a read.

use std::borrow::Cow;

use serde::ser::{SerializeMap, Serializer};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

/// A JSON string's text, borrowed unless it escapes a character.
#[derive(Deserialize)]
struct Text<'a>(#[serde(borrow)] Cow<'a, str>);

/// A JSON string's text; `None` for any other value.
pub(crate) fn string(raw: &RawValue) -> Option<Cow<'_, str>> {
    is_string(raw)
        .then(|| serde_json::from_str::<Text<'_>>(raw.get()).ok())
        .flatten()
        .map(|t| t.0)
}

/// Whether a JSON value is a string, from its first byte (its text not decoded).
pub(crate) fn is_string(raw: &RawValue) -> bool {
    raw.get().starts_with('"')
}

/// A JSON object as `T`; `None` for anything else (serde's derive would also read an array
/// positionally, which Python's `Mapping` checks refuse).
pub(crate) fn object<'a, T: Deserialize<'a>>(raw: &'a RawValue) -> Option<T> {
    raw.get()
        .starts_with('{')
        .then(|| serde_json::from_str(raw.get()).ok())
        .flatten()
}

/// A JSON object read as `T` in the pass that reads its container, any other JSON value
/// refused (serde's derive would also read an array positionally, which Python's `Mapping`
/// checks refuse): `Vec<Obj<T>>` reads a list of objects without a second pass over each.
pub(crate) struct Obj<T>(pub(crate) T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Obj<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de>> serde::de::Visitor<'de> for Visit<T> {
            type Value = Obj<T>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<Obj<T>, A::Error> {
                T::deserialize(serde::de::value::MapAccessDeserializer::new(map)).map(Obj)
            }
        }
        d.deserialize_map(Visit(std::marker::PhantomData))
    }
}

/// A JSON string or list of `T`, read in the pass that reads its container: the string decoded
/// where it stands (borrowed unless it escapes a character), the list's elements as `T`; any
/// other JSON value fails the parse (a message's content, a Responses `input`).
pub(crate) enum TextOrList<'a, T> {
    Text(Cow<'a, str>),
    List(Vec<T>),
}

impl<'de: 'a, 'a, T: Deserialize<'de>> Deserialize<'de> for TextOrList<'a, T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit<'a, T>(std::marker::PhantomData<(&'a (), T)>);
        impl<'de: 'a, 'a, T: Deserialize<'de>> serde::de::Visitor<'de> for Visit<'a, T> {
            type Value = TextOrList<'a, T>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string or a list")
            }
            fn visit_borrowed_str<E: serde::de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(TextOrList::Text(Cow::Borrowed(v)))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(TextOrList::Text(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Self::Value, E> {
                Ok(TextOrList::Text(Cow::Owned(v)))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut items = Vec::new();
                while let Some(item) = seq.next_element()? {
                    items.push(item);
                }
                Ok(TextOrList::List(items))
            }
        }
        d.deserialize_any(Visit(std::marker::PhantomData))
    }
}

/// A body's JSON object read as `T` in one pass: `None` for one nested deeper than Python's
/// parser takes (`openai_body::MAX_NESTING`), not JSON, or not an object — the app's to answer.
pub(crate) fn body_object<'a, T: Deserialize<'a>>(raw: &'a [u8]) -> Option<T> {
    within_nesting(raw)?;
    serde_json::from_slice::<Obj<T>>(raw).ok().map(|o| o.0)
}

/// `Some` unless `raw` nests deeper than Python's parser takes (`openai_body::MAX_NESTING`).
fn within_nesting(raw: &[u8]) -> Option<()> {
    (!smetric_vllm::openai_body::nests_deeper_than(raw, smetric_vllm::openai_body::MAX_NESTING)).then_some(())
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

/// An object's entries in order, values as raw JSON.
pub(crate) fn ordered_entries(raw: &RawValue) -> Option<Vec<(String, &RawValue)>> {
    struct Entries<'a>(Vec<(String, &'a RawValue)>);
    impl<'de> Deserialize<'de> for Entries<'de> {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct Visit;
            impl<'de> serde::de::Visitor<'de> for Visit {
                type Value = Entries<'de>;
                fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                    f.write_str("an object")
                }
                fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Entries<'de>, A::Error> {
                    let mut out = Vec::new();
                    while let Some((k, v)) = map.next_entry::<String, &'de RawValue>()? {
                        out.push((k, v));
                    }
                    Ok(Entries(out))
                }
            }
            d.deserialize_map(Visit)
        }
    }
    serde_json::from_str::<Entries<'_>>(raw.get()).ok().map(|e| e.0)
}

/// A text as a JSON string.
pub(crate) fn json_str(text: &str) -> String {
    serde_json::to_string(text).unwrap_or_default()
}

/// A field kept as the body's JSON text (an id, a name): serialized as the value it reads as,
/// its objects' keys in the text's order (a template value keeps them so).
pub(crate) struct RawJson<'a>(pub(crate) &'a str);

impl Serialize for RawJson<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serde_json::from_str::<minijinja::Value>(self.0)
            .map_err(serde::ser::Error::custom)?
            .serialize(serializer)
    }
}

/// A JSON object being built in key order: what Python's dict operations on a message do (a
/// set key keeps its place; a new one goes last). A value is JSON text, or a decoded text kept
/// as it is (escaped only when written as JSON: a template value takes it without a round trip).
#[derive(Default, Clone)]
pub(crate) struct Entries<'a>(Vec<(Cow<'a, str>, EntryValue<'a>)>);

#[derive(Clone)]
enum EntryValue<'a> {
    Json(Cow<'a, str>),
    Text(Cow<'a, str>),
}

impl EntryValue<'_> {
    fn json(&self) -> Cow<'_, str> {
        match self {
            Self::Json(json) => Cow::Borrowed(json),
            Self::Text(text) => Cow::Owned(json_str(text)),
        }
    }
}

impl<'a> Entries<'a> {
    /// An object's entries, in order (`None`: not an object).
    pub(crate) fn of(raw: &'a RawValue) -> Option<Self> {
        Some(Self(
            ordered_entries(raw)?
                .into_iter()
                .map(|(k, v)| (Cow::Owned(k), EntryValue::Json(Cow::Borrowed(v.get()))))
                .collect(),
        ))
    }

    fn put(&mut self, key: &'a str, value: EntryValue<'a>) {
        match self.0.iter_mut().find(|(k, _)| k == key) {
            Some(slot) => slot.1 = value,
            None => self.0.push((Cow::Borrowed(key), value)),
        }
    }

    /// `d[key] = json`.
    pub(crate) fn set(&mut self, key: &'a str, json: impl Into<Cow<'a, str>>) {
        self.put(key, EntryValue::Json(json.into()));
    }

    /// `d[key] = text`, a string.
    pub(crate) fn set_text(&mut self, key: &'a str, text: impl Into<Cow<'a, str>>) {
        self.put(key, EntryValue::Text(text.into()));
    }

    /// `del d[key]` (nothing when absent).
    pub(crate) fn remove(&mut self, key: &str) {
        self.0.retain(|(k, _)| k != key);
    }

    /// `d.get(key)`'s JSON text.
    pub(crate) fn get(&self, key: &str) -> Option<Cow<'_, str>> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| v.json())
    }

    /// The object's JSON text.
    pub(crate) fn push_json(&self, out: &mut String) {
        out.push('{');
        for (n, (k, v)) in self.0.iter().enumerate() {
            if n > 0 {
                out.push_str(", ");
            }
            out.push_str(&json_str(k));
            out.push_str(": ");
            out.push_str(&v.json());
        }
        out.push('}');
    }
}

/// The object as its JSON or as template values (`minijinja::value::Serde`), keys in order: a
/// JSON value read from its text, a text as the string it is.
impl Serialize for Entries<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut m = serializer.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            match v {
                EntryValue::Json(json) => m.serialize_entry(k.as_ref(), &RawJson(json))?,
                EntryValue::Text(text) => m.serialize_entry(k.as_ref(), text.as_ref())?,
            }
        }
        m.end()
    }
}

/// A body posted to an API as borrowed JSON: `None` for one nested deeper than Python's parser
/// takes (`openai_body::MAX_NESTING`) or not JSON — the app's to answer.
pub(crate) fn body(raw: &[u8]) -> Option<&RawValue> {
    within_nesting(raw)?;
    serde_json::from_slice(raw).ok()
}

/// Whether `value` is an integer of at least `least` as Python's `isinstance(v, int)` sees it
/// (not a bool, not a float such as `2.5`); None for a number past 64 bits or a float with no
/// fraction left (told apart by Python).
pub(crate) fn python_int_at_least(value: Option<&serde_json::Value>, least: u64) -> Option<bool> {
    Some(match value {
        // A fraction survives only from a literal with one: a float to Python. `1.0`, `1e3` and
        // integers past 64 bits all arrive whole: told apart by Python.
        Some(serde_json::Value::Number(n)) if n.is_f64() => {
            if n.as_f64().is_some_and(|f| f.fract() != 0.0) {
                false
            } else {
                return None;
            }
        }
        Some(serde_json::Value::Number(n)) => n.as_u64().is_some_and(|n| n >= least),
        _ => false,
    })
}
