//! Template values written as Python writes them, so that a chat template renders the same
//! text in the gateway as under transformers' Jinja: `str()` of a printed value (`None`,
//! `True`, `1.0`, `['a']`) and `json.dumps` for the `tojson` filter (`", "` and `": "` between
//! items, non-ASCII kept, floats in Python's shortest `repr`).
//!
//! Invariants: a string is escaped as `json.dumps(ensure_ascii=False)` escapes it (the control
//! characters, `"` and `\`, nothing else); maps keep their insertion order unless `sort_keys`.
//! Complexity: O(size of the value).

use std::fmt::Write;

use minijinja::value::{Value, ValueKind};

/// Python's `repr(float)`: the shortest digits that read back to `x`, in fixed notation when
/// the exponent is in `[-4, 16)` (with `.0` when integral), else `d.ddde±XX`.
pub(crate) fn py_float_repr(x: f64) -> String {
    if x.is_nan() {
        return "nan".to_owned();
    }
    if x.is_infinite() {
        return if x > 0.0 { "inf" } else { "-inf" }.to_owned();
    }
    if x == 0.0 {
        return if x.is_sign_negative() { "-0.0" } else { "0.0" }.to_owned();
    }
    // Rust's `{:e}` is the shortest round-trip form too: "1.2345e-5", "1e16".
    let sci = format!("{x:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let negative = mantissa.starts_with('-');
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let sign = if negative { "-" } else { "" };
    if (-4..16).contains(&exp) {
        let point = exp + 1; // digits before the decimal point
        let body = if point <= 0 {
            format!("0.{}{digits}", "0".repeat(point.unsigned_abs() as usize))
        } else if point as usize >= digits.len() {
            format!("{digits}{}.0", "0".repeat(point as usize - digits.len()))
        } else {
            let (int, frac) = digits.split_at(point as usize);
            format!("{int}.{frac}")
        };
        return format!("{sign}{body}");
    }
    let (first, rest) = digits.split_at(1);
    let frac = if rest.is_empty() {
        String::new()
    } else {
        format!(".{rest}")
    };
    let esign = if exp < 0 { '-' } else { '+' };
    format!("{sign}{first}{frac}e{esign}{:02}", exp.unsigned_abs())
}

/// A number as Python prints it (an int in decimal, a float in its `repr`).
fn py_number(value: &Value) -> String {
    if value.is_integer() {
        return value.to_string();
    }
    f64::try_from(value.clone()).map_or_else(|_| value.to_string(), py_float_repr)
}

/// Python's `repr` of a string: single quotes unless the text has `'` and no `"`.
fn py_str_repr(s: &str, out: &mut String) {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

/// Python's `repr` of a value inside a printed container.
fn py_repr(value: &Value, out: &mut String) {
    match value.kind() {
        ValueKind::String => py_str_repr(value.as_str().unwrap_or_default(), out),
        _ => py_str(value, out),
    }
}

/// Python's `str()` of a template value, appended to `out` (what `{{ value }}` prints).
pub(crate) fn py_str(value: &Value, out: &mut String) {
    match value.kind() {
        ValueKind::Undefined => {}
        ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if value.is_true() { "True" } else { "False" }),
        ValueKind::Number => out.push_str(&py_number(value)),
        ValueKind::String => out.push_str(value.as_str().unwrap_or_default()),
        ValueKind::Seq => {
            out.push('[');
            for (k, item) in value.try_iter().into_iter().flatten().enumerate() {
                if k > 0 {
                    out.push_str(", ");
                }
                py_repr(&item, out);
            }
            out.push(']');
        }
        ValueKind::Map => {
            out.push('{');
            for (k, key) in value.try_iter().into_iter().flatten().enumerate() {
                if k > 0 {
                    out.push_str(", ");
                }
                py_repr(&key, out);
                out.push_str(": ");
                py_repr(&value.get_item(&key).unwrap_or_default(), out);
            }
            out.push('}');
        }
        _ => out.push_str(&value.to_string()),
    }
}

/// `json.dumps`'s layout options (`indent`, `separators`, `sort_keys`; `ensure_ascii=False`).
pub(crate) struct JsonStyle {
    pub(crate) indent: Option<String>,
    pub(crate) item_sep: String,
    pub(crate) key_sep: String,
    pub(crate) sort_keys: bool,
}

impl JsonStyle {
    /// Python's defaults for an indent: `", "` and `": "` without one, `","` with one.
    pub(crate) fn new(indent: Option<String>, separators: Option<(String, String)>, sort_keys: bool) -> Self {
        let (item_sep, key_sep) = separators.unwrap_or_else(|| {
            let item = if indent.is_some() { "," } else { ", " };
            (item.to_owned(), ": ".to_owned())
        });
        Self {
            indent,
            item_sep,
            key_sep,
            sort_keys,
        }
    }
}

/// Why a value has no JSON text (`json.dumps` raises a `TypeError` for it).
#[derive(Debug)]
pub(crate) struct NotJson(pub(crate) &'static str);

/// `json.dumps(value, ensure_ascii=False, ...)` of a template value.
pub(crate) fn py_json(value: &Value, style: &JsonStyle) -> Result<String, NotJson> {
    let mut out = String::new();
    write_json(value, style, 0, &mut out)?;
    Ok(out)
}

fn newline(style: &JsonStyle, depth: usize, out: &mut String) {
    if let Some(indent) = &style.indent {
        out.push('\n');
        for _ in 0..depth {
            out.push_str(indent);
        }
    }
}

fn json_key(key: &Value) -> Result<String, NotJson> {
    Ok(match key.kind() {
        ValueKind::String => key.as_str().unwrap_or_default().to_owned(),
        ValueKind::Bool => if key.is_true() { "true" } else { "false" }.to_owned(),
        ValueKind::None => "null".to_owned(),
        ValueKind::Number => py_number(key),
        _ => return Err(NotJson("keys must be str, int, float, bool or None")),
    })
}

fn write_json(value: &Value, style: &JsonStyle, depth: usize, out: &mut String) -> Result<(), NotJson> {
    match value.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => {
            let text = py_number(value);
            out.push_str(match text.as_str() {
                "nan" => "NaN",
                "inf" => "Infinity",
                "-inf" => "-Infinity",
                _ => &text,
            });
        }
        ValueKind::String => {
            out.push_str(&serde_json::to_string(value.as_str().unwrap_or_default()).unwrap_or_default());
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter().map_err(|_| NotJson("not iterable"))?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (k, item) in items.iter().enumerate() {
                if k > 0 {
                    out.push_str(&style.item_sep);
                }
                newline(style, depth + 1, out);
                write_json(item, style, depth + 1, out)?;
            }
            newline(style, depth, out);
            out.push(']');
        }
        ValueKind::Map => {
            let mut pairs: Vec<(String, Value)> = Vec::new();
            for key in value.try_iter().map_err(|_| NotJson("not iterable"))? {
                let item = value.get_item(&key).unwrap_or_default();
                pairs.push((json_key(&key)?, item));
            }
            if style.sort_keys {
                pairs.sort_by(|a, b| a.0.cmp(&b.0));
            }
            if pairs.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            out.push('{');
            for (k, (key, item)) in pairs.iter().enumerate() {
                if k > 0 {
                    out.push_str(&style.item_sep);
                }
                newline(style, depth + 1, out);
                out.push_str(&serde_json::to_string(key).unwrap_or_default());
                out.push_str(&style.key_sep);
                write_json(item, style, depth + 1, out)?;
            }
            newline(style, depth, out);
            out.push('}');
        }
        ValueKind::Undefined => return Err(NotJson("Undefined is not JSON serializable")),
        _ => return Err(NotJson("the value is not JSON serializable")),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_print_as_python_repr() {
        for (x, want) in [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (1e-4, "0.0001"),
            (1e-5, "1e-05"),
            (1.5e-7, "1.5e-07"),
            (1e15, "1000000000000000.0"),
            (1e16, "1e+16"),
            (123_456.789, "123456.789"),
            (-2.5, "-2.5"),
            (1.234_5e300, "1.2345e+300"),
            (0.0, "0.0"),
        ] {
            assert_eq!(py_float_repr(x), want, "{x}");
        }
    }

    #[test]
    fn json_has_pythons_layout() {
        let v: Value = serde_json::from_str(r#"{"b": [1, 2.0, "é\n"], "a": {}, "c": null, "d": true}"#).unwrap();
        let plain = JsonStyle::new(None, None, false);
        assert_eq!(
            py_json(&v, &plain).unwrap(),
            r#"{"b": [1, 2.0, "é\n"], "a": {}, "c": null, "d": true}"#
        );
        let sorted = JsonStyle::new(Some("  ".to_owned()), None, true);
        assert_eq!(
            py_json(&v, &sorted).unwrap(),
            "{\n  \"a\": {},\n  \"b\": [\n    1,\n    2.0,\n    \"é\\n\"\n  ],\n  \"c\": null,\n  \"d\": true\n}"
        );
    }

    #[test]
    fn printed_values_are_pythons_str() {
        let v: Value = serde_json::from_str(r#"[null, true, 1.0, "it's", {"k": [false]}]"#).unwrap();
        let mut out = String::new();
        py_str(&v, &mut out);
        assert_eq!(out, r#"[None, True, 1.0, "it's", {'k': [False]}]"#);
    }
}
