//! Per-run metrics: latency percentiles, SLO attainment, TPS under SLO, cache hit ratios,
//! session stickiness, load imbalance, turn-inference accuracy.
//!
//! Definitions:
//! * **Measured requests**: requests whose arrival lies in `[measure_start_s, window_end]`,
//!   where `window_end` is `measure_end_s` or, by default, the last finish time.
//! * **TTFT** = first token − arrival (includes frontend, routing queue, tier fetch, queueing
//!   and prefill). **TPOT** = (finish − first token) / (output − 1); undefined for one-token
//!   outputs, which meet any TPOT bound. **Tail TBT** (Mooncake FAST'25's TBT) = the mean of
//!   the longest tenth (rounded up) of a request's `output − 1` inter-token gaps
//!   ([`crate::token_gaps`]); a stall that a mean TPOT spreads thin stays in it. Undefined for
//!   one-token outputs, like TPOT.
//! * **SLO met**: TTFT ≤ `ttft_base_s + ttft_s_per_token · input`, TPOT ≤ bound and, when
//!   `tbt_tail_s` is set, tail TBT ≤ it. Rejected requests (longer than `max_model_len`) never
//!   meet it.
//! * **TPS under SLO** = Σ (input + output) tokens of measured requests meeting the SLO ÷
//!   window length; **output TPS under SLO** counts output tokens only; **prefill TPS under
//!   SLO** = Σ prompt tokens of measured requests whose TTFT meets the bound (whatever their
//!   TPOT) ÷ window length (the seed's PD metric).
//! * **PD runs** (`crate::pd`): TTFT ends at the decode instance's first token, after the pull.
//! * **Hit ratios**: local = prompt tokens served from the instance's GPU prefix cache at
//!   first admission ÷ prompt tokens of measured, served (not rejected) requests; global =
//!   tokens loaded from the global tier ÷ the same denominator.
//! * **Follow-up home share**: among measured ground-truth follow-ups, the share placed on
//!   the instance that served their (sub)session's first request.
//! * **Migrations**: ground-truth follow-ups placed on another instance than their `prev`
//!   (same session). `router_migrations` counts decisions whose reason says "migrate".
//! * **Imbalance**: coefficient of variation (σ/μ over instances) of per-instance queued
//!   prefill tokens, sampled every `sample_interval_s` while anything is queued; also of
//!   per-instance request counts (running + waiting).
//! * **Turn-inference accuracy**: routed requests whose placer verdict equals the trace's
//!   ground truth, over those that have both.
//! * **Local-hit prediction** (how well the router's index saw the caches): over measured,
//!   served requests, the share whose predicted local hit on the chosen instance exceeded the
//!   hit they got at first admission (`local_hit_overpredicted_share`: the router counted on
//!   cache that was gone), and Σ |predicted − actual| ÷ served prompt tokens
//!   (`local_hit_prediction_error`). Admission comes after routing, so even an oracle index is
//!   off by what changed in between.
//!
//! Percentiles use the nearest-rank method on sorted samples. Complexity: O(n log n).
//!
//! The report types implement `serde::Serialize` in the shape the Python binding returns
//! (`smetric._types.SimReport`): name/value pairs as maps, the load series as rows of one value
//! per instance, and the per-request records left to the caller (they are large and optional).

use serde::ser::{Serialize, Serializer};

use crate::config::{SimConfig, SloConfig};
use crate::workload::Workload;

/// Outcome of one request.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RequestRecord {
    /// Index of the request in the workload.
    pub index: u32,
    /// Arrival time, seconds (`None`: never arrived).
    pub arrival_s: Option<f64>,
    /// First token time, seconds.
    pub first_token_s: Option<f64>,
    /// Finish time, seconds (for a rejected request: its rejection time).
    pub finish_s: Option<f64>,
    /// Instance it ran on.
    pub instance: Option<u32>,
    /// Prompt tokens.
    pub input_tokens: u32,
    /// Output tokens.
    pub output_tokens: u32,
    /// Prompt tokens hit in the GPU prefix cache at first admission.
    pub local_hit_tokens: u64,
    /// Prompt tokens loaded from the global tier.
    pub global_hit_tokens: u64,
    /// Local hit the placer expected on the chosen instance (its index is approximate).
    pub predicted_local_hit_tokens: u64,
    /// Global-tier hit the placer expected.
    pub predicted_global_hit_tokens: u64,
    /// Trace ground truth: first request of its session.
    pub first_turn_truth: Option<bool>,
    /// The placer's verdict.
    pub first_turn_inferred: Option<bool>,
    /// The placer's reason.
    pub reason: &'static str,
    /// Longer than `max_model_len`: never routed or served.
    pub rejected: bool,
    /// Times it was preempted.
    pub preemptions: u32,
    /// Tail TBT: mean of the longest tenth of its inter-token gaps, seconds (`None` for
    /// one-token outputs and requests that did not finish).
    pub tbt_tail_s: Option<f64>,
}

impl RequestRecord {
    /// Time to first token, seconds.
    pub fn ttft_s(&self) -> Option<f64> {
        Some(self.first_token_s? - self.arrival_s?)
    }

    /// Time per output token after the first, seconds (`None` for one-token outputs).
    pub fn tpot_s(&self) -> Option<f64> {
        if self.output_tokens <= 1 {
            return None;
        }
        Some((self.finish_s? - self.first_token_s?) / f64::from(self.output_tokens - 1))
    }
}

/// p50 / p90 / p99 / mean of a latency, seconds (0 when there is no sample).
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct Percentiles {
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Mean.
    pub mean: f64,
    /// Samples.
    pub count: u64,
}

impl Percentiles {
    /// Percentiles of `samples` (sorted in place).
    pub fn of(samples: &mut [f64]) -> Self {
        if samples.is_empty() {
            return Self::default();
        }
        samples.sort_by(f64::total_cmp);
        let rank = |q: f64| {
            let k = (q * samples.len() as f64).ceil() as usize;
            samples[k.clamp(1, samples.len()) - 1]
        };
        Self {
            p50: rank(0.50),
            p90: rank(0.90),
            p99: rank(0.99),
            mean: samples.iter().sum::<f64>() / samples.len() as f64,
            count: samples.len() as u64,
        }
    }
}

/// Results for one TPOT bound.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct SloReport {
    /// TPOT bound, seconds.
    pub tpot_s: f64,
    /// TTFT bound at zero tokens, seconds.
    pub ttft_base_s: f64,
    /// TTFT bound slope, seconds per input token.
    pub ttft_s_per_token: f64,
    /// Measured requests meeting both bounds.
    pub met: u64,
    /// `met` ÷ measured requests.
    pub attainment: f64,
    /// Share of measured requests meeting the TTFT bound.
    pub ttft_attainment: f64,
    /// Share of measured requests meeting the TPOT bound.
    pub tpot_attainment: f64,
    /// Tail-TBT bound, seconds (`None`: not part of this SLO).
    pub tbt_tail_s: Option<f64>,
    /// Share of measured requests meeting the tail-TBT bound (every served one without a bound).
    pub tbt_tail_attainment: f64,
    /// (input + output) tokens of requests meeting the SLO per second of the window.
    pub tps_under_slo: f64,
    /// Prompt tokens per second of measured requests whose TTFT meets the bound, whatever
    /// their TPOT (the seed's "prefill TPS under the TTFT SLO").
    pub prefill_tps_under_slo: f64,
    /// Output tokens of requests meeting the SLO per second of the window.
    pub output_tps_under_slo: f64,
}

/// Per-instance load over time, sampled every `series_interval_s` (empty when it is `None`).
///
/// Row `k` (time `time_s[k]`) of each matrix is `values[k·instances .. (k+1)·instances]`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LoadSeries {
    /// Instances per row.
    pub instances: u32,
    /// Sample times, seconds.
    pub time_s: Vec<f64>,
    /// Requests running or waiting (including KV fetches) per instance.
    pub requests: Vec<u32>,
    /// Queued (not yet computed) prefill tokens per instance.
    pub queued_tokens: Vec<u64>,
    /// Share of GPU KV blocks in use per instance.
    pub kv_usage: Vec<f64>,
}

/// A flat per-instance matrix serialised as its rows.
struct Rows<'a, T>(&'a [T], u32);

impl<T: Serialize> Serialize for Rows<'_, T> {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_seq(self.0.chunks(self.1.max(1) as usize))
    }
}

impl Serialize for LoadSeries {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut out = s.serialize_struct("LoadSeries", 5)?;
        out.serialize_field("instances", &self.instances)?;
        out.serialize_field("time_s", &self.time_s)?;
        out.serialize_field("requests", &Rows(&self.requests, self.instances))?;
        out.serialize_field("queued_tokens", &Rows(&self.queued_tokens, self.instances))?;
        out.serialize_field("kv_usage", &Rows(&self.kv_usage, self.instances))?;
        out.end()
    }
}

/// `(name, value)` pairs serialised as a map.
fn pairs_as_map<S: Serializer>(pairs: &[(String, u64)], s: S) -> std::result::Result<S::Ok, S::Error> {
    s.collect_map(pairs.iter().map(|(name, value)| (name, value)))
}

/// Everything one run reports. Plain fields, so bindings can copy it out.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct SimReport {
    /// Policy name.
    pub policy: String,
    /// Workload name.
    pub workload: String,
    /// Profile name.
    pub profile: String,
    /// Instances simulated.
    pub instances: u32,
    /// Requests in the workload.
    pub requests: u64,
    /// Requests that finished.
    pub completed: u64,
    /// Requests rejected for exceeding `max_model_len`.
    pub rejected: u64,
    /// Requests in the measured window.
    pub measured: u64,
    /// Measured requests rejected for exceeding `max_model_len` (they count as missing the
    /// SLO: no routing policy can serve them).
    pub measured_rejected: u64,
    /// Measured window start, seconds.
    pub window_start_s: f64,
    /// Measured window end, seconds.
    pub window_end_s: f64,
    /// Last event time, seconds.
    pub makespan_s: f64,
    /// TTFT of measured, served requests.
    pub ttft: Percentiles,
    /// TPOT of measured, served requests with more than one output token.
    pub tpot: Percentiles,
    /// Tail TBT of the same requests.
    pub tbt_tail: Percentiles,
    /// One entry per configured TPOT bound; the first is the headline.
    pub slo: Vec<SloReport>,
    /// Input tokens of measured requests.
    pub input_tokens: u64,
    /// Output tokens of measured requests.
    pub output_tokens: u64,
    /// Share of served measured prompt tokens hit in GPU prefix caches.
    pub local_hit_ratio: f64,
    /// Share of served measured prompt tokens loaded from the global tier.
    pub global_hit_ratio: f64,
    /// Share of measured follow-ups placed on their session's first-turn instance.
    pub followup_home_share: Option<f64>,
    /// Measured follow-ups.
    pub followups: u64,
    /// Measured follow-ups placed away from their previous request's instance.
    pub migrations: u64,
    /// Decisions whose reason is a migration.
    pub router_migrations: u64,
    /// Turn-inference accuracy against the trace ground truth.
    pub turn_inference_accuracy: Option<f64>,
    /// Requests with both a verdict and a ground truth.
    pub turn_inference_samples: u64,
    /// Mean CV of per-instance queued prefill tokens.
    pub imbalance_queued_cv_mean: f64,
    /// 90th percentile of that CV.
    pub imbalance_queued_cv_p90: f64,
    /// Mean CV of per-instance request counts (running + waiting).
    pub imbalance_requests_cv_mean: f64,
    /// Imbalance samples taken.
    pub imbalance_samples: u64,
    /// Preemptions (recompute) over all instances.
    pub preemptions: u64,
    /// Cached GPU blocks evicted over all instances.
    pub gpu_evictions: u64,
    /// Blocks dropped by the global tier.
    pub tier_evictions: u64,
    /// Fetches from the global tier.
    pub tier_fetches: u64,
    /// Bytes fetched from the global tier (per GPU link).
    pub tier_fetch_bytes: f64,
    /// Engine steps simulated.
    pub iterations: u64,
    /// Events processed.
    pub events: u64,
    /// Decisions per reason, sorted by reason.
    #[serde(serialize_with = "pairs_as_map")]
    pub reasons: Vec<(String, u64)>,
    /// How the router's index was fed (`approximate`, `events`, `oracle`).
    pub index_feed: String,
    /// Publication-to-application delay of KV events, seconds (with `events`).
    pub event_delay_s: f64,
    /// What the router was told of each request's turn (`request`, `index`).
    pub turns: String,
    /// Share of measured, served requests whose predicted local hit exceeded the real one.
    pub local_hit_overpredicted_share: f64,
    /// Σ |predicted − actual local hit| ÷ served measured prompt tokens.
    pub local_hit_prediction_error: f64,
    /// Index-feed counters, `(name, value)`: the publisher's (`published_*`) and the
    /// ingestor's (`ingest_*`) with `events`; empty otherwise.
    #[serde(serialize_with = "pairs_as_map")]
    pub feed_counters: Vec<(String, u64)>,
    /// Per-instance load over time (when `series_interval_s` is set).
    pub load_series: LoadSeries,
    /// PD runs: transfers and decode-side pressure (`crate::pd`); `None` co-located.
    pub pd: Option<PdReport>,
    /// Per-request outcomes when `keep_records` is set (not serialised: see the module docs).
    #[serde(skip)]
    pub records: Vec<RequestRecord>,
}

/// Counters the event loop gathers for the report.
#[derive(Clone, Debug, Default)]
pub(crate) struct RunCounters {
    pub makespan_s: f64,
    pub preemptions: u64,
    pub gpu_evictions: u64,
    pub tier_evictions: u64,
    pub tier_fetches: u64,
    pub tier_fetch_bytes: f64,
    pub iterations: u64,
    pub events: u64,
    pub queued_cv: Vec<f64>,
    pub requests_cv: Vec<f64>,
    pub load_series: LoadSeries,
    /// Index-feed counters (publisher and ingestor), `(name, value)`.
    pub feed: Vec<(String, u64)>,
}

/// Coefficient of variation of `values` (None when their mean is 0).
pub(crate) fn coefficient_of_variation(values: impl Iterator<Item = f64> + Clone) -> Option<f64> {
    let n = values.clone().count() as f64;
    if n == 0.0 {
        return None;
    }
    let mean = values.clone().sum::<f64>() / n;
    if mean <= 0.0 {
        return None;
    }
    let var = values.map(|v| (v - mean) * (v - mean)).sum::<f64>() / n;
    Some(var.sqrt() / mean)
}

/// SLO results of `records` under `slo` (one [`SloReport`] per TPOT bound), over the requests
/// that arrived in `[window_start_s, window_end_s]`; tokens per second are per second of that
/// window. [`SimReport::slo`] is this function applied to the run's own `SloConfig`; calling
/// it again on [`SimReport::records`] (kept with `keep_records`) scores the same run under
/// other SLOs without simulating it again. O(records · bounds).
pub fn evaluate_slo(
    slo: &SloConfig,
    records: &[RequestRecord],
    window_start_s: f64,
    window_end_s: f64,
) -> Vec<SloReport> {
    let window = (window_end_s - window_start_s).max(f64::MIN_POSITIVE);
    // Per bound: (met, ttft met, tpot met, tokens of met, output tokens of met).
    let mut met = vec![(0_u64, 0_u64, 0_u64, 0_u64, 0_u64); slo.tpot_s.len()];
    let (mut measured, mut tbt_met, mut ttft_met_prompt) = (0_u64, 0_u64, 0_u64);
    for r in records {
        if !r.arrival_s.is_some_and(|a| a >= window_start_s && a <= window_end_s) {
            continue;
        }
        measured += 1;
        let tokens = u64::from(r.input_tokens) + u64::from(r.output_tokens);
        let ttft_ok = !r.rejected && r.ttft_s().is_some_and(|t| t <= slo.ttft_bound(r.input_tokens));
        let served = !r.rejected && r.finish_s.is_some();
        let tbt_ok = served
            && slo
                .tbt_tail_s
                .is_none_or(|bound| r.tbt_tail_s.is_none_or(|t| t <= bound));
        tbt_met += u64::from(tbt_ok);
        if ttft_ok {
            ttft_met_prompt += u64::from(r.input_tokens);
        }
        let tpot = r.tpot_s();
        for (k, &bound) in slo.tpot_s.iter().enumerate() {
            let tpot_ok = served && tpot.is_none_or(|t| t <= bound);
            let m = &mut met[k];
            m.1 += u64::from(ttft_ok);
            m.2 += u64::from(tpot_ok);
            if ttft_ok && tpot_ok && tbt_ok {
                m.0 += 1;
                m.3 += tokens;
                m.4 += u64::from(r.output_tokens);
            }
        }
    }
    let measured = measured.max(1) as f64;
    slo.tpot_s
        .iter()
        .zip(&met)
        .map(|(&tpot_s, &(n, ttft_n, tpot_n, tokens, output))| SloReport {
            tpot_s,
            ttft_base_s: slo.ttft_base_s,
            ttft_s_per_token: slo.ttft_s_per_token,
            met: n,
            attainment: n as f64 / measured,
            ttft_attainment: ttft_n as f64 / measured,
            tpot_attainment: tpot_n as f64 / measured,
            tbt_tail_s: slo.tbt_tail_s,
            tbt_tail_attainment: tbt_met as f64 / measured,
            tps_under_slo: tokens as f64 / window,
            prefill_tps_under_slo: ttft_met_prompt as f64 / window,
            output_tps_under_slo: output as f64 / window,
        })
        .collect()
}

/// Builds the report from the per-request records.
pub(crate) fn summarize(
    config: &SimConfig,
    workload: &Workload,
    policy: String,
    records: Vec<RequestRecord>,
    mut counters: RunCounters,
) -> SimReport {
    let last_finish = records.iter().filter_map(|r| r.finish_s).fold(0.0_f64, f64::max);
    let window_start = config.measure_start_s;
    let window_end = config.measure_end_s.unwrap_or(last_finish).max(window_start);
    let in_window = |r: &RequestRecord| r.arrival_s.is_some_and(|a| a >= window_start && a <= window_end);

    let specs = workload.requests();
    // Instance of each session's first request (the session's "home").
    let mut home: Vec<Option<u32>> = vec![None; workload.sessions() as usize];
    for r in &records {
        let spec = &specs[r.index as usize];
        if spec.first_turn == Some(true) && home[spec.session as usize].is_none() {
            home[spec.session as usize] = r.instance;
        }
    }

    let mut report = SimReport {
        policy,
        workload: workload.name().to_owned(),
        profile: config.profile.name.clone(),
        instances: config.instances,
        requests: records.len() as u64,
        window_start_s: window_start,
        window_end_s: window_end,
        makespan_s: counters.makespan_s,
        preemptions: counters.preemptions,
        gpu_evictions: counters.gpu_evictions,
        tier_evictions: counters.tier_evictions,
        tier_fetches: counters.tier_fetches,
        tier_fetch_bytes: counters.tier_fetch_bytes,
        iterations: counters.iterations,
        events: counters.events,
        index_feed: config.index_feed.name().to_owned(),
        event_delay_s: config.event_delay_s,
        turns: config.turns.name().to_owned(),
        feed_counters: std::mem::take(&mut counters.feed),
        ..SimReport::default()
    };
    let (mut overpredicted, mut prediction_error) = (0_u64, 0_u64);
    let mut ttfts = Vec::new();
    let mut tpots = Vec::new();
    let mut tbt_tails = Vec::new();
    let (mut local_hit, mut global_hit, mut served_prompt) = (0_u64, 0_u64, 0_u64);
    let (mut home_hits, mut turn_right) = (0_u64, 0_u64);
    let mut reasons: std::collections::BTreeMap<&'static str, u64> = std::collections::BTreeMap::new();
    for r in &records {
        report.completed += u64::from(r.finish_s.is_some() && !r.rejected);
        report.rejected += u64::from(r.rejected);
        if r.instance.is_some() {
            *reasons.entry(r.reason).or_default() += 1;
            report.router_migrations += u64::from(r.reason.contains("migrate"));
        }
        if let (Some(truth), Some(verdict)) = (r.first_turn_truth, r.first_turn_inferred) {
            report.turn_inference_samples += 1;
            turn_right += u64::from(truth == verdict);
        }
        if !in_window(r) {
            continue;
        }
        report.measured += 1;
        report.input_tokens += u64::from(r.input_tokens);
        report.output_tokens += u64::from(r.output_tokens);
        if r.rejected {
            report.measured_rejected += 1;
        } else {
            served_prompt += u64::from(r.input_tokens);
            overpredicted += u64::from(r.predicted_local_hit_tokens > r.local_hit_tokens);
            prediction_error += r.predicted_local_hit_tokens.abs_diff(r.local_hit_tokens);
        }
        local_hit += r.local_hit_tokens;
        global_hit += r.global_hit_tokens;
        let spec = &specs[r.index as usize];
        if spec.first_turn == Some(false) && r.instance.is_some() {
            report.followups += 1;
            home_hits += u64::from(home[spec.session as usize] == r.instance);
            let prev = spec.prev.filter(|&p| specs[p as usize].session == spec.session);
            if let Some(p) = prev {
                let prev_instance = records[p as usize].instance;
                report.migrations += u64::from(prev_instance.is_some() && prev_instance != r.instance);
            }
        }
        let ttft = r.ttft_s();
        let tpot = r.tpot_s();
        if let Some(t) = ttft {
            ttfts.push(t);
        }
        if let Some(t) = tpot {
            tpots.push(t);
        }
        if let Some(t) = r.tbt_tail_s {
            tbt_tails.push(t);
        }
    }
    let prompt = served_prompt.max(1) as f64;
    report.ttft = Percentiles::of(&mut ttfts);
    report.tpot = Percentiles::of(&mut tpots);
    report.tbt_tail = Percentiles::of(&mut tbt_tails);
    report.local_hit_ratio = local_hit as f64 / prompt;
    report.global_hit_ratio = global_hit as f64 / prompt;
    let served = (report.measured - report.measured_rejected).max(1) as f64;
    report.local_hit_overpredicted_share = overpredicted as f64 / served;
    report.local_hit_prediction_error = prediction_error as f64 / prompt;
    report.followup_home_share = (report.followups > 0).then(|| home_hits as f64 / report.followups as f64);
    report.turn_inference_accuracy =
        (report.turn_inference_samples > 0).then(|| turn_right as f64 / report.turn_inference_samples as f64);
    report.slo = evaluate_slo(&config.slo, &records, window_start, window_end);
    let queued = Percentiles::of(&mut counters.queued_cv);
    report.imbalance_queued_cv_mean = queued.mean;
    report.imbalance_queued_cv_p90 = queued.p90;
    report.imbalance_samples = queued.count;
    report.imbalance_requests_cv_mean = Percentiles::of(&mut counters.requests_cv).mean;
    report.reasons = reasons.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
    report.load_series = std::mem::take(&mut counters.load_series);
    if config.keep_records {
        report.records = records;
    }
    report
}

/// What a PD run reports beyond the co-located metrics.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct PdReport {
    /// Prefill instances.
    pub prefill_instances: u32,
    /// Decode instances.
    pub decode_instances: u32,
    /// The decode rule applied.
    pub decode_rule: String,
    /// Pulls completed.
    pub transfers: u64,
    /// Bytes pulled, summed over ranks (the whole model's KV).
    pub transfer_bytes: f64,
    /// Prompt tokens a decode instance's own prefix cache held (not pulled), summed.
    pub decode_hit_tokens: u64,
    /// Seconds from the pull's submission to its end (queueing behind the rank included).
    pub transfer_time: Percentiles,
    /// Seconds from the prefill instance's last step to the decode instance's allocation
    /// (waiting for decode KV space: the decode side's KV pressure).
    pub decode_admission_wait: Percentiles,
    /// Mean share of decode KV blocks in use, sampled every `sample_interval_s`.
    pub decode_kv_usage_mean: f64,
    /// Largest sampled share of decode KV blocks in use.
    pub decode_kv_usage_max: f64,
    /// Preemptions on decode instances.
    pub decode_preemptions: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let mut v: Vec<f64> = (1..=100).map(f64::from).collect();
        let p = Percentiles::of(&mut v);
        assert!((p.p50 - 50.0).abs() < 1e-12);
        assert!((p.p90 - 90.0).abs() < 1e-12);
        assert!((p.p99 - 99.0).abs() < 1e-12);
        assert!((p.mean - 50.5).abs() < 1e-12);
        assert_eq!(Percentiles::of(&mut []).count, 0);
    }

    #[test]
    fn cv_of_equal_values_is_zero_and_of_zeros_undefined() {
        assert!(coefficient_of_variation([2.0, 2.0].into_iter()).unwrap().abs() < 1e-12);
        assert!(coefficient_of_variation([0.0, 0.0].into_iter()).is_none());
        let cv = coefficient_of_variation([0.0, 2.0].into_iter()).unwrap();
        assert!((cv - 1.0).abs() < 1e-12);
    }

    #[test]
    fn tpot_excludes_the_first_token() {
        let r = RequestRecord {
            arrival_s: Some(1.0),
            first_token_s: Some(2.0),
            finish_s: Some(4.0),
            output_tokens: 5,
            ..RequestRecord::default()
        };
        assert!((r.ttft_s().unwrap() - 1.0).abs() < 1e-12);
        assert!((r.tpot_s().unwrap() - 0.5).abs() < 1e-12);
        let one = RequestRecord { output_tokens: 1, ..r };
        assert!(one.tpot_s().is_none());
    }
}
