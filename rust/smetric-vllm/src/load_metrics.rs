//! An engine's load read from vLLM's `/metrics` page (the Prometheus text exposition format,
//! version 0.0.4) or its `/load` answer: the parse the load scraper runs every period.
//!
//! Algorithm: one pass over the page's lines. A line is skipped unless it starts with a wanted
//! metric name (a vLLM page is ~640 lines, mostly histogram buckets, of which the load needs
//! 11), so most lines cost a prefix comparison; a wanted line's name, labels and value are then
//! parsed as the format says: `name{label="value",...} value [timestamp]`, label values with
//! the `\\`, `\"` and `\n` escapes. A line that does not parse is skipped (a scrape must not fail
//! on one odd line), comments (`# HELP`, `# TYPE`) and blank lines too.
//!
//! [`engine_sample`] sums, per instance, the series of every engine (data-parallel rank) of the
//! served model: `running` = Σ `vllm:num_requests_running`, `waiting` = Σ
//! `vllm:num_requests_waiting` (each rounded half to even, at least 0), `kv_usage` = the fullest
//! rank's `vllm:kv_cache_usage_perc` clamped to [0, 1], and the prefix-cache counters (local and
//! the KV connectors' `external_` pair) for the scraper's hit rates. Non-finite samples never
//! count.
//!
//! Invariants: parsing never panics and allocates only the samples it returns (labels are
//! borrowed from the page unless an escape forces a copy). Complexity: O(page bytes).

use std::borrow::Cow;

/// A parsed sample: its metric name, its labels in page order, its value.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample<'a> {
    /// The metric name, e.g. `vllm:num_requests_running`.
    pub name: &'a str,
    /// `(label, value)` pairs, values unescaped.
    pub labels: Vec<(&'a str, Cow<'a, str>)>,
    /// The sample's value (`+Inf`, `-Inf` and `NaN` included).
    pub value: f64,
}

impl Sample<'_> {
    /// The value of `label`, if the sample has it.
    #[must_use]
    pub fn label(&self, label: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(name, _)| *name == label)
            .map(|(_, value)| value.as_ref())
    }
}

/// The samples of `text` in page order; with `names`, only those of the metrics named (a line
/// is then skipped before it is parsed unless it starts with one of them).
pub fn samples<'a>(text: &'a str, names: Option<&'a [&'a str]>) -> impl Iterator<Item = Sample<'a>> + 'a {
    text.lines().filter_map(move |line| {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            return None;
        }
        if let Some(names) = names
            && !names.iter().any(|name| line.starts_with(name))
        {
            return None;
        }
        let sample = parse_line(line)?;
        match names {
            // A longer name that starts with a wanted one is another metric.
            Some(names) if !names.contains(&sample.name) => None,
            _ => Some(sample),
        }
    })
}

fn is_name_start(b: u8) -> bool {
    b.is_ascii_alphabetic() || b == b'_' || b == b':'
}

fn is_name_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b':'
}

/// One trimmed, non-comment line, or None when it does not parse.
fn parse_line(line: &str) -> Option<Sample<'_>> {
    let bytes = line.as_bytes();
    if !bytes.first().copied().is_some_and(is_name_start) {
        return None;
    }
    let name_end = bytes.iter().position(|&b| !is_name_char(b)).unwrap_or(bytes.len());
    let (name, mut rest) = line.split_at(name_end);
    let mut labels = Vec::new();
    if let Some(inner) = rest.strip_prefix('{') {
        rest = parse_labels(inner, &mut labels)?;
    }
    let value = parse_value(rest.split_ascii_whitespace().next()?)?;
    Some(Sample { name, labels, value })
}

/// Parses `label="value", ...}` into `labels`; returns what follows the `}`.
fn parse_labels<'a>(mut rest: &'a str, labels: &mut Vec<(&'a str, Cow<'a, str>)>) -> Option<&'a str> {
    loop {
        rest = rest.trim_start();
        if let Some(after) = rest.strip_prefix('}') {
            return Some(after);
        }
        let bytes = rest.as_bytes();
        if !bytes.first().is_some_and(|&b| b.is_ascii_alphabetic() || b == b'_') {
            return None;
        }
        let end = bytes
            .iter()
            .position(|&b| !(b.is_ascii_alphanumeric() || b == b'_'))
            .unwrap_or(bytes.len());
        let (label, after) = rest.split_at(end);
        let after = after.trim_start().strip_prefix('=')?.trim_start().strip_prefix('"')?;
        let (value, after) = quoted(after)?;
        labels.push((label, value));
        rest = after.trim_start();
        if let Some(after) = rest.strip_prefix(',') {
            rest = after;
        } else if !rest.starts_with('}') {
            return None;
        }
    }
}

/// The quoted value that starts `text` (its opening quote taken), unescaped, and what follows
/// its closing quote; None without a closing quote.
fn quoted(text: &str) -> Option<(Cow<'_, str>, &str)> {
    let bytes = text.as_bytes();
    let mut i = 0;
    let mut escaped = false;
    while i < bytes.len() {
        match bytes[i] {
            b'"' => break,
            b'\\' => {
                escaped = true;
                i += 1; // the escaped character, whatever it is, does not end the value
            }
            _ => {}
        }
        i += 1;
    }
    if i >= bytes.len() {
        return None;
    }
    let (raw, after) = (&text[..i], &text[i + 1..]);
    if !escaped {
        return Some((Cow::Borrowed(raw), after));
    }
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            // (A lone trailing backslash cannot occur: it would have escaped the closing quote.)
            Some('\\') | None => out.push('\\'),
            Some('"') => out.push('"'),
            Some('n') => out.push('\n'),
            // Not an escape the format defines: kept as written.
            Some(other) => {
                out.push('\\');
                out.push(other);
            }
        }
    }
    Some((Cow::Owned(out), after))
}

/// A sample value: a float, `+Inf`, `-Inf` or `NaN`.
fn parse_value(field: &str) -> Option<f64> {
    match field {
        "+Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        "NaN" => Some(f64::NAN),
        _ => field.parse().ok(),
    }
}

/// `vllm:num_requests_running`.
pub const RUNNING: &str = "vllm:num_requests_running";
/// `vllm:num_requests_waiting`.
pub const WAITING: &str = "vllm:num_requests_waiting";
/// `vllm:kv_cache_usage_perc` (a fraction in [0, 1], despite its name).
pub const KV_USAGE: &str = "vllm:kv_cache_usage_perc";
const QUERIES: &str = "vllm:prefix_cache_queries_total";
const HITS: &str = "vllm:prefix_cache_hits_total";
const EXTERNAL_QUERIES: &str = "vllm:external_prefix_cache_queries_total";
const EXTERNAL_HITS: &str = "vllm:external_prefix_cache_hits_total";
/// Every metric [`engine_sample`] reads.
pub const LOAD_METRICS: [&str; 7] = [
    RUNNING,
    WAITING,
    KV_USAGE,
    QUERIES,
    HITS,
    EXTERNAL_QUERIES,
    EXTERNAL_HITS,
];

/// One instance's load, summed over its engines; every field is None when its metric was absent.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct EngineSample {
    /// Requests running, over every rank.
    pub running: Option<u64>,
    /// Requests waiting, over every rank.
    pub waiting: Option<u64>,
    /// The fullest rank's KV cache usage, in [0, 1].
    pub kv_usage: Option<f64>,
    /// Prefix-cache queries (tokens), a counter.
    pub prefix_cache_queries: Option<f64>,
    /// Prefix-cache hits (tokens), a counter.
    pub prefix_cache_hits: Option<f64>,
    /// The KV connector's prefix-cache queries, a counter.
    pub external_prefix_cache_queries: Option<f64>,
    /// The KV connector's prefix-cache hits, a counter.
    pub external_prefix_cache_hits: Option<f64>,
}

/// The load in one `/metrics` page; `model_name` keeps only that model's series.
#[must_use]
pub fn engine_sample(text: &str, model_name: Option<&str>) -> EngineSample {
    // Per metric of LOAD_METRICS: the sum (the max for KV usage) of its counted samples.
    let mut acc: [Option<f64>; 7] = [None; 7];
    for sample in samples(text, Some(&LOAD_METRICS)) {
        if !sample.value.is_finite() || model_name.is_some_and(|m| sample.label("model_name") != Some(m)) {
            continue;
        }
        let Some(i) = LOAD_METRICS.iter().position(|name| *name == sample.name) else {
            continue;
        };
        acc[i] = Some(match (acc[i], LOAD_METRICS[i] == KV_USAGE) {
            (None, _) => sample.value,
            (Some(seen), true) => seen.max(sample.value),
            (Some(seen), false) => seen + sample.value,
        });
    }
    // Counts as Python's `round` makes them (half to even), the way the scraper always did.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let count = |v: Option<f64>| v.map(|v| v.round_ties_even().max(0.0) as u64);
    EngineSample {
        running: count(acc[0]),
        waiting: count(acc[1]),
        kv_usage: acc[2].map(|u| u.clamp(0.0, 1.0)),
        prefix_cache_queries: acc[3],
        prefix_cache_hits: acc[4],
        external_prefix_cache_queries: acc[5],
        external_prefix_cache_hits: acc[6],
    }
}

/// Why a `/load` answer was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LoadBodyError {
    /// Not a JSON object.
    #[error("the body is not a JSON object: {0}")]
    NotJson(String),
    /// No `server_load` field.
    #[error("no server_load in the body")]
    Missing,
    /// `server_load` is not a non-negative integer.
    #[error("server_load is not a count: {0}")]
    NotACount(String),
}

/// The count in vLLM's `GET /load` answer (`{"server_load": n}`, `--enable-server-load-tracking`).
///
/// # Errors
/// The body is not a JSON object with a non-negative integer `server_load`.
pub fn server_load(body: &[u8]) -> Result<u64, LoadBodyError> {
    let value: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(body).map_err(|e| LoadBodyError::NotJson(e.to_string()))?;
    let load = value.get("server_load").ok_or(LoadBodyError::Missing)?;
    load.as_u64().ok_or_else(|| LoadBodyError::NotACount(load.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_parse_as_the_format_says() {
        let text = "# HELP x a help line with {braces}\n\
            x{a=\"q\\\"u\\\\o\\n\",b=\"\"} 1e3 1700000000000\n\
            y NaN\nz +Inf\nbroken{a=1} 2\nnovalue{}\nw{a=\"1\",} -2.5\n  v{ a = \"t\\tx\" } 4\nu {a=\"1\"} 3\n";
        let all: Vec<Sample<'_>> = samples(text, None).collect();
        let names: Vec<&str> = all.iter().map(|s| s.name).collect();
        assert_eq!(names, ["x", "y", "z", "w", "v"]);
        assert_eq!(
            all[0].labels,
            [("a", Cow::Borrowed("q\"u\\o\n")), ("b", Cow::Borrowed(""))]
        );
        assert!((all[0].value - 1000.0).abs() < f64::EPSILON);
        assert!(all[1].value.is_nan() && all[2].value == f64::INFINITY);
        assert_eq!(all[3].label("a"), Some("1"));
        assert_eq!(all[4].label("a"), Some("t\\tx"));
    }

    #[test]
    fn a_wanted_name_is_the_whole_name() {
        let text = "vllm:num_requests_running_total 9\nvllm:num_requests_running 2\n";
        let only: Vec<Sample<'_>> = samples(text, Some(&[RUNNING])).collect();
        assert_eq!(only.len(), 1);
        assert_eq!(engine_sample(text, None).running, Some(2));
    }

    #[test]
    fn ranks_add_up_and_the_fullest_rank_is_the_usage() {
        let text = "vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 2.5\n\
            vllm:num_requests_running{engine=\"1\",model_name=\"m\"} 1\n\
            vllm:num_requests_waiting{engine=\"0\",model_name=\"other\"} 5\n\
            vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.25\n\
            vllm:kv_cache_usage_perc{engine=\"1\",model_name=\"m\"} 0.5\n\
            vllm:prefix_cache_hits_total{model_name=\"m\"} NaN\n";
        let m = engine_sample(text, Some("m"));
        assert_eq!((m.running, m.waiting, m.kv_usage), (Some(4), None, Some(0.5)));
        assert_eq!(m.prefix_cache_hits, None, "a non-finite sample never counts");
        assert_eq!(engine_sample(text, None).waiting, Some(5));
        assert_eq!(engine_sample("vllm:num_requests_running 2.5\n", None).running, Some(2));
        assert_eq!(engine_sample("vllm:num_requests_waiting -3\n", None).waiting, Some(0));
        assert_eq!(
            engine_sample("vllm:kv_cache_usage_perc 1.5\n", None).kv_usage,
            Some(1.0)
        );
    }

    #[test]
    fn a_load_answer_is_a_count_or_a_typed_error() {
        assert_eq!(server_load(br#"{"server_load": 7}"#), Ok(7));
        assert_eq!(server_load(b"{}"), Err(LoadBodyError::Missing));
        assert!(matches!(
            server_load(br#"{"server_load": -1}"#),
            Err(LoadBodyError::NotACount(_))
        ));
        assert!(matches!(
            server_load(br#"{"server_load": true}"#),
            Err(LoadBodyError::NotACount(_))
        ));
        assert!(matches!(server_load(b"[1]"), Err(LoadBodyError::NotJson(_))));
    }

    #[test]
    fn odd_lines_never_panic() {
        for line in [
            "{",
            "x{",
            "x{a",
            "x{a=",
            "x{a=\"",
            "x{a=\"\\",
            "x{a=\"v\"",
            "x{a=\"v\"} ",
            "é 1",
            "x{é=\"1\"} 1",
        ] {
            assert!(samples(line, None).next().is_none(), "{line:?}");
        }
    }
}
