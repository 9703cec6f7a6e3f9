//! Profile files and per-field overrides (`docs/perf-model.md` §9): a calibrated or measured
//! profile read from JSON, and single constants set on top of any profile.
//!
//! ```json
//! {"format": "smetric-profile/1",
//!  "name": "my-h20-run",
//!  "base": "h20-3e-qwen3-coder-30b-a3b",
//!  "profile": {"kv_read_efficiency": 0.8, "step_overhead_s": 0.0054, "kv_capacity_tokens": 590000},
//!  "provenance": {"free-form": "ignored by the loader"}}
//! ```
//!
//! * `format` must be [`PROFILE_FILE_FORMAT`]; `name` (a non-empty string) becomes the
//!   profile's name; `base` (optional, `null` allowed) is a built-in profile name
//!   ([`Profile::BUILTIN`]); `provenance` (optional) is free-form and never read. Any other
//!   top-level key is an error: the format is versioned, so a new key needs a new version.
//! * `profile` maps [`Profile::FIELDS`] — the `Profile` struct's numeric field names, in its
//!   units (SI: seconds, bytes, bytes/s, tokens) — to JSON numbers. With a `base` each key
//!   replaces the base's value; without one every field must be given.
//! * Every value goes through [`Profile::set_field`] (a number; a non-negative integer that
//!   fits for the integer fields) and the whole profile through [`Profile::validate`] (ranges
//!   and cross-field rules), so a file, a CLI flag and a Python override are held to the
//!   same rules. Every failure is a [`SimError::InvalidConfig`] naming the field
//!   (`profile_file.format`, `profile.kv_read_efficiency`, …), with the file's path in the
//!   reason; an unreadable file is [`SimError::Io`]. Nothing here panics.

use std::path::Path;

use serde_json::{Map, Value};

use crate::error::{Result, SimError};
use crate::perf_model::Profile;

/// The `format` tag of a profile file this loader reads.
pub const PROFILE_FILE_FORMAT: &str = "smetric-profile/1";

/// The numeric fields of [`Profile`]: the file's `profile` keys, with their dotted error names.
const FIELDS: [(&str, &str); 22] = [
    ("tp", "profile.tp"),
    ("layers", "profile.layers"),
    ("hidden", "profile.hidden"),
    ("moe_layers", "profile.moe_layers"),
    ("experts", "profile.experts"),
    ("top_k", "profile.top_k"),
    ("dense_weight_bytes", "profile.dense_weight_bytes"),
    ("expert_weight_bytes", "profile.expert_weight_bytes"),
    ("kv_bytes_per_token_rank", "profile.kv_bytes_per_token_rank"),
    ("kv_bytes_per_token", "profile.kv_bytes_per_token"),
    ("hbm_bytes_per_s", "profile.hbm_bytes_per_s"),
    ("weight_read_efficiency", "profile.weight_read_efficiency"),
    ("kv_read_efficiency", "profile.kv_read_efficiency"),
    ("step_overhead_s", "profile.step_overhead_s"),
    ("linear_s_per_token", "profile.linear_s_per_token"),
    ("attention_s_per_pair", "profile.attention_s_per_pair"),
    ("allreduce_latency_s", "profile.allreduce_latency_s"),
    ("allreduce_bytes_per_s", "profile.allreduce_bytes_per_s"),
    ("frontend_base_s", "profile.frontend_base_s"),
    ("frontend_s_per_token", "profile.frontend_s_per_token"),
    ("kv_capacity_tokens", "profile.kv_capacity_tokens"),
    ("max_context_tokens", "profile.max_context_tokens"),
];

fn invalid(field: &'static str, reason: String) -> SimError {
    SimError::InvalidConfig { field, reason }
}

/// `value` as an integer of at most `max`, or why not.
fn integer(value: f64, max: u64) -> std::result::Result<u64, String> {
    // 2^53: every integer below it is exact in an f64, so the cast back is too.
    if value.is_finite() && value >= 0.0 && value.fract() == 0.0 && value <= (max.min(1 << 53)) as f64 {
        Ok(value as u64)
    } else {
        Err(format!("must be an integer in 0..={max}, got {value}"))
    }
}

/// JSON's name for the type of `value`, for error messages.
fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

impl Profile {
    /// The field names a profile file's `profile` object and the overrides accept: every
    /// field of the struct but `name`.
    pub const FIELDS: [&'static str; 22] = {
        let mut names = [""; 22];
        let mut i = 0;
        while i < FIELDS.len() {
            names[i] = FIELDS[i].0;
            i += 1;
        }
        names
    };

    /// Sets the numeric field `key` to `value`, in the struct's units. Checks the value's
    /// type only (finite; a non-negative integer that fits for the integer fields): ranges
    /// and cross-field rules are [`Profile::validate`]'s, to call once every field is set.
    ///
    /// # Errors
    /// [`SimError::InvalidConfig`] naming `profile.<key>` (`profile` for an unknown key).
    pub fn set_field(&mut self, key: &str, value: f64) -> Result<()> {
        let Some(&(_, field)) = FIELDS.iter().find(|(k, _)| *k == key) else {
            return Err(invalid(
                "profile",
                format!("unknown field {key:?} (known: {})", Self::FIELDS.join(", ")),
            ));
        };
        self.assign(key, value).map_err(|reason| invalid(field, reason))
    }

    /// [`Profile::set_field`] for a known `key`: the reason on failure.
    fn assign(&mut self, key: &str, value: f64) -> std::result::Result<(), String> {
        let u32_of = |v: f64| integer(v, u64::from(u32::MAX)).map(|n| n as u32);
        let finite = |v: f64| {
            if v.is_finite() {
                Ok(v)
            } else {
                Err(format!("must be a finite number, got {v}"))
            }
        };
        match key {
            "tp" => self.tp = u32_of(value)?,
            "layers" => self.layers = u32_of(value)?,
            "hidden" => self.hidden = u32_of(value)?,
            "moe_layers" => self.moe_layers = u32_of(value)?,
            "experts" => self.experts = u32_of(value)?,
            "top_k" => self.top_k = u32_of(value)?,
            "dense_weight_bytes" => self.dense_weight_bytes = finite(value)?,
            "expert_weight_bytes" => self.expert_weight_bytes = finite(value)?,
            "kv_bytes_per_token_rank" => self.kv_bytes_per_token_rank = finite(value)?,
            "kv_bytes_per_token" => self.kv_bytes_per_token = finite(value)?,
            "hbm_bytes_per_s" => self.hbm_bytes_per_s = finite(value)?,
            "weight_read_efficiency" => self.weight_read_efficiency = finite(value)?,
            "kv_read_efficiency" => self.kv_read_efficiency = finite(value)?,
            "step_overhead_s" => self.step_overhead_s = finite(value)?,
            "linear_s_per_token" => self.linear_s_per_token = finite(value)?,
            "attention_s_per_pair" => self.attention_s_per_pair = finite(value)?,
            "allreduce_latency_s" => self.allreduce_latency_s = finite(value)?,
            "allreduce_bytes_per_s" => self.allreduce_bytes_per_s = finite(value)?,
            "frontend_base_s" => self.frontend_base_s = finite(value)?,
            "frontend_s_per_token" => self.frontend_s_per_token = finite(value)?,
            "kv_capacity_tokens" => self.kv_capacity_tokens = integer(value, u64::MAX)?,
            "max_context_tokens" => self.max_context_tokens = u32_of(value)?,
            _ => unreachable!("FIELDS and this match list the same keys"),
        }
        Ok(())
    }

    /// Reads a profile file (the module docs give the format): [`ProfileFile::load`]'s profile.
    ///
    /// # Errors
    /// As [`ProfileFile::load`].
    pub fn from_file(path: &Path) -> Result<Self> {
        ProfileFile::load(path).map(|f| f.profile)
    }
}

/// A profile file, read and resolved: its name, its base, and the whole profile.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct ProfileFile {
    /// The file's `name`, also the profile's.
    pub name: String,
    /// The built-in profile the file starts from, if any.
    pub base: Option<String>,
    /// The base with the file's fields set (every field, without a base), validated.
    /// Serialised flat, beside `name` and `base`.
    #[serde(flatten)]
    pub profile: Profile,
}

impl ProfileFile {
    /// Reads and resolves the profile file at `path`.
    ///
    /// # Errors
    /// [`SimError::Io`] when the file cannot be read; [`SimError::InvalidConfig`] naming the
    /// field for anything wrong in it, the path in the reason.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|source| SimError::Io {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&text).map_err(|e| match e {
            SimError::InvalidConfig { field, reason } => invalid(field, format!("{}: {reason}", path.display())),
            other => other,
        })
    }

    /// Parses and resolves the text of a profile file.
    ///
    /// # Errors
    /// [`SimError::InvalidConfig`] naming the field.
    pub fn parse(text: &str) -> Result<Self> {
        let doc: Value = serde_json::from_str(text).map_err(|e| invalid("profile_file", format!("not JSON: {e}")))?;
        let Value::Object(doc) = doc else {
            return Err(invalid(
                "profile_file",
                format!("must be a JSON object, got {}", json_type(&doc)),
            ));
        };
        for key in doc.keys() {
            if !matches!(key.as_str(), "format" | "name" | "base" | "profile" | "provenance") {
                return Err(invalid(
                    "profile_file",
                    format!("unknown key {key:?} (known: format, name, base, profile, provenance)"),
                ));
            }
        }
        match doc.get("format") {
            Some(Value::String(f)) if f == PROFILE_FILE_FORMAT => {}
            Some(Value::String(f)) => {
                return Err(invalid(
                    "profile_file.format",
                    format!("unsupported format {f:?} (this loader reads {PROFILE_FILE_FORMAT:?})"),
                ));
            }
            other => {
                return Err(invalid(
                    "profile_file.format",
                    format!(
                        "must be the string {PROFILE_FILE_FORMAT:?}, got {}",
                        other.map_or("nothing", json_type)
                    ),
                ));
            }
        }
        let name = match doc.get("name") {
            Some(Value::String(n)) if !n.is_empty() => n.clone(),
            other => {
                return Err(invalid(
                    "profile_file.name",
                    format!("must be a non-empty string, got {}", other.map_or("nothing", json_type)),
                ));
            }
        };
        let (base_name, base) = match doc.get("base") {
            None | Some(Value::Null) => (None, None),
            Some(Value::String(b)) => (
                Some(b.clone()),
                Some(Profile::by_name(b).map_err(|e| match e {
                    SimError::InvalidConfig { reason, .. } => invalid("profile_file.base", reason),
                    other => other,
                })?),
            ),
            Some(other) => {
                return Err(invalid(
                    "profile_file.base",
                    format!("must be a built-in profile name or null, got {}", json_type(other)),
                ));
            }
        };
        let fields: &Map<String, Value> = match doc.get("profile") {
            Some(Value::Object(m)) => m,
            other => {
                return Err(invalid(
                    "profile_file.profile",
                    format!("must be an object, got {}", other.map_or("nothing", json_type)),
                ));
            }
        };
        if base.is_none() {
            let missing: Vec<&str> = Profile::FIELDS
                .iter()
                .copied()
                .filter(|k| !fields.contains_key(*k))
                .collect();
            if let Some(first) = missing.first() {
                let field = FIELDS.iter().find(|(k, _)| k == first).map_or("profile", |f| f.1);
                return Err(invalid(
                    field,
                    format!(
                        "missing, and a profile file without a base gives every field (missing: {})",
                        missing.join(", ")
                    ),
                ));
            }
        }
        // Without a base every field is set below; the H20 30B profile only fills the struct.
        let mut profile = base.unwrap_or_else(Profile::h20_qwen3_coder_30b);
        profile.name.clone_from(&name);
        for (key, value) in fields {
            let number = match value {
                Value::Number(n) => n.as_u64().map_or_else(|| n.as_f64(), |u| Some(u as f64)),
                _ => None,
            };
            match number {
                Some(v) => profile.set_field(key, v)?,
                // Unknown keys first, so a misspelt key is reported as such whatever its value.
                None if !Profile::FIELDS.contains(&key.as_str()) => profile.set_field(key, 0.0)?,
                None => {
                    let field = FIELDS.iter().find(|(k, _)| k == key).map_or("profile", |f| f.1);
                    return Err(invalid(field, format!("must be a number, got {}", json_type(value))));
                }
            }
        }
        profile.validate()?;
        Ok(Self {
            name,
            base: base_name,
            profile,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Profile> {
        ProfileFile::parse(text).map(|f| f.profile)
    }

    fn field_of(result: Result<Profile>) -> &'static str {
        match result {
            Err(SimError::InvalidConfig { field, .. }) => field,
            other => panic!("expected InvalidConfig, got {other:?}"),
        }
    }

    #[test]
    fn a_base_with_overrides_changes_only_the_given_fields() {
        let p = parse(
            r#"{"format": "smetric-profile/1", "name": "run", "base": "h20-3e-qwen3-coder-30b-a3b",
                "profile": {"kv_read_efficiency": 0.8, "step_overhead_s": 0.0054, "kv_capacity_tokens": 590000},
                "provenance": {"anything": [1, 2]}}"#,
        )
        .unwrap();
        let expected = Profile {
            name: "run".into(),
            kv_read_efficiency: 0.8,
            step_overhead_s: 0.0054,
            kv_capacity_tokens: 590_000,
            ..Profile::by_name("h20-3e-qwen3-coder-30b-a3b").unwrap()
        };
        assert_eq!(p, expected);
    }

    #[test]
    fn a_file_without_a_base_gives_every_field() {
        let full = Profile::h20_qwen3_coder_30b();
        let fields: Map<String, Value> = Profile::FIELDS
            .iter()
            .map(|k| {
                let v = serde_json::to_value(&full).unwrap()[*k].clone();
                ((*k).to_owned(), v)
            })
            .collect();
        let doc = |fields: &Map<String, Value>| {
            serde_json::json!({"format": PROFILE_FILE_FORMAT, "name": "whole", "profile": fields}).to_string()
        };
        let p = parse(&doc(&fields)).unwrap();
        assert_eq!(
            p,
            Profile {
                name: "whole".into(),
                ..full
            }
        );
        let mut partial = fields.clone();
        partial.remove("hidden");
        assert_eq!(field_of(parse(&doc(&partial))), "profile.hidden");
    }

    #[test]
    fn every_bad_input_names_its_field() {
        let with = |profile: &str| {
            format!(
                r#"{{"format": "smetric-profile/1", "name": "x", "base": "h20-qwen3-coder-30b-a3b", "profile": {profile}}}"#
            )
        };
        let cases = [
            ("[]".to_owned(), "profile_file"),
            ("not json".to_owned(), "profile_file"),
            (
                r#"{"format": "smetric-profile/2", "name": "x", "profile": {}}"#.to_owned(),
                "profile_file.format",
            ),
            (r#"{"name": "x", "profile": {}}"#.to_owned(), "profile_file.format"),
            (
                r#"{"format": "smetric-profile/1", "profile": {}}"#.to_owned(),
                "profile_file.name",
            ),
            (
                r#"{"format": "smetric-profile/1", "name": "x", "base": "a100", "profile": {}}"#.to_owned(),
                "profile_file.base",
            ),
            (
                r#"{"format": "smetric-profile/1", "name": "x", "base": 3, "profile": {}}"#.to_owned(),
                "profile_file.base",
            ),
            (
                r#"{"format": "smetric-profile/1", "name": "x", "base": "h20-qwen3-coder-30b-a3b"}"#.to_owned(),
                "profile_file.profile",
            ),
            (
                r#"{"format": "smetric-profile/1", "name": "x", "extra": 1, "profile": {}}"#.to_owned(),
                "profile_file",
            ),
            (with(r#"{"kv_read_eficiency": 0.5}"#), "profile"),
            (with(r#"{"name": "y"}"#), "profile"),
            (with(r#"{"kv_read_efficiency": "0.5"}"#), "profile.kv_read_efficiency"),
            (with(r#"{"kv_read_efficiency": 1.5}"#), "profile.kv_read_efficiency"),
            (with(r#"{"kv_read_efficiency": 0}"#), "profile.kv_read_efficiency"),
            (with(r#"{"step_overhead_s": -0.001}"#), "profile.step_overhead_s"),
            (with(r#"{"kv_capacity_tokens": 1.5}"#), "profile.kv_capacity_tokens"),
            (with(r#"{"kv_capacity_tokens": 0}"#), "profile.kv_capacity_tokens"),
            (with(r#"{"tp": -1}"#), "profile.tp"),
            (with(r#"{"layers": 4294967296}"#), "profile.layers"),
            (with(r#"{"top_k": 200}"#), "profile.top_k"),
            (with(r#"{"hbm_bytes_per_s": 1e400}"#), "profile_file"),
        ];
        for (text, field) in cases {
            assert_eq!(field_of(parse(&text)), field, "{text}");
        }
        let mut p = Profile::h20_qwen3_coder_30b();
        assert_eq!(
            field_of(p.set_field("step_overhead_s", f64::NAN).map(|()| p.clone())),
            "profile.step_overhead_s"
        );
        assert_eq!(
            field_of(p.set_field("tp", f64::INFINITY).map(|()| p.clone())),
            "profile.tp"
        );
    }

    #[test]
    fn the_documented_example_loads() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/profiles/example-h20-3e.json");
        let file = ProfileFile::load(&path).unwrap();
        assert_eq!(file.name, "example-h20-3e-run");
        assert_eq!(file.base.as_deref(), Some("h20-3e-qwen3-coder-30b-a3b"));
        assert_eq!(file.profile.kv_capacity_tokens, 590_000);
    }

    #[test]
    fn a_missing_file_is_an_io_error() {
        let err = Profile::from_file(Path::new("/nonexistent/profile.json")).unwrap_err();
        assert!(matches!(err, SimError::Io { .. }), "{err}");
    }
}
