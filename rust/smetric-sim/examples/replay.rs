//! Replays trace files through the simulator with one policy and prints the headline numbers.
//!
//! ```text
//! cargo run --release -p smetric-sim --example replay -- weka smetric FILE...
//! cargo run --release -p smetric-sim --example replay -- mooncake lmetric FILE
//! ```
//! Environment knobs (all optional): `SIM_INSTANCES`, `SIM_SESSION_RATE`, `SIM_TIME_SCALE`,
//! `SIM_TIER=0` (switch the global tier off), `SIM_TIER_PATH=lmcache|mooncake-store|cpu-offload`,
//! `SIM_LAYERWISE=1`, `SIM_SHARED_PREFIX=0`, `SIM_COARSEN`,
//! `SIM_INDEX_FEED=approximate|events|oracle`, `SIM_EVENT_DELAY_S`,
//! `SIM_RECORDS=path.csv` (write one line per request).

use std::fmt::Write as _;
use std::time::Instant;

use smetric_sim::{
    BailianOptions, IndexFeed, PolicyKind, SimConfig, SimError, TierPath, WekaOptions, load_azure, load_bailian,
    load_mooncake, load_weka, run,
};

fn env_f64(name: &str) -> Option<f64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

#[allow(clippy::print_stdout)]
fn main() -> Result<(), SimError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = || SimError::InvalidConfig {
        field: "args",
        reason: "usage: replay FORMAT POLICY FILE...".into(),
    };
    let (format, policy, files) = match args.as_slice() {
        [f, p, files @ ..] if !files.is_empty() => (f.as_str(), p.as_str(), files),
        _ => return Err(usage()),
    };
    let policy = PolicyKind::parse(policy).map_err(|e| SimError::Router(e.to_string()))?;
    let t0 = Instant::now();
    let workload = match format {
        "weka" => {
            let options = WekaOptions {
                coarsen: env_f64("SIM_COARSEN").map_or(4, |v| v as u32),
                shared_prefix: env_f64("SIM_SHARED_PREFIX").is_none_or(|v| v != 0.0),
            };
            load_weka(files, &options)?
        }
        "bailian" => load_bailian(&files[0], &BailianOptions::default())?,
        "mooncake" => load_mooncake(&files[0])?,
        "azure" => load_azure(&files[0])?,
        _ => return Err(usage()),
    };
    let loaded = t0.elapsed().as_secs_f64();
    let mut config = SimConfig::default();
    if let Some(n) = env_f64("SIM_INSTANCES") {
        config.instances = n as u32;
    }
    if let Some(r) = env_f64("SIM_SESSION_RATE") {
        config.session_rate_per_s = r;
    }
    if let Some(s) = env_f64("SIM_TIME_SCALE") {
        config.time_scale = s;
    }
    if env_f64("SIM_TIER") == Some(0.0) {
        config.global_tier.enabled = false;
    }
    if let Ok(path) = std::env::var("SIM_TIER_PATH") {
        config.global_tier.path = TierPath::parse(&path).ok_or(SimError::InvalidConfig {
            field: "SIM_TIER_PATH",
            reason: format!("unknown tier path {path:?}"),
        })?;
    }
    config.global_tier.layerwise = env_f64("SIM_LAYERWISE") == Some(1.0);
    if let Ok(feed) = std::env::var("SIM_INDEX_FEED") {
        config.index_feed = IndexFeed::parse(&feed).ok_or(SimError::InvalidConfig {
            field: "SIM_INDEX_FEED",
            reason: format!("unknown feed {feed:?}"),
        })?;
    }
    if let Some(d) = env_f64("SIM_EVENT_DELAY_S") {
        config.event_delay_s = d;
    }
    let records_path = std::env::var("SIM_RECORDS").ok();
    config.keep_records = records_path.is_some();
    let t1 = Instant::now();
    let report = run(&config, &workload, policy)?;
    let simulated = t1.elapsed().as_secs_f64();
    println!(
        "workload {} requests={} ids={} block={} load={loaded:.2}s sim={simulated:.2}s",
        workload.name(),
        workload.len(),
        workload.total_hash_ids(),
        workload.block_tokens()
    );
    println!(
        "policy {} completed={} rejected={} makespan={:.0}s iterations={} events={}",
        report.policy, report.completed, report.rejected, report.makespan_s, report.iterations, report.events
    );
    println!(
        "ttft p50/p90/p99 = {:.3}/{:.3}/{:.3}s  tpot p50/p90/p99 = {:.4}/{:.4}/{:.4}s",
        report.ttft.p50, report.ttft.p90, report.ttft.p99, report.tpot.p50, report.tpot.p90, report.tpot.p99
    );
    for slo in &report.slo {
        println!(
            "slo tpot<={:.3}s: attainment={:.3} (ttft {:.3}, tpot {:.3}) tps_under_slo={:.1} output_tps={:.1}",
            slo.tpot_s,
            slo.attainment,
            slo.ttft_attainment,
            slo.tpot_attainment,
            slo.tps_under_slo,
            slo.output_tps_under_slo
        );
    }
    println!(
        "hits local={:.3} global={:.3}  home_share={:?} migrations={} router_migrations={} turn_acc={:?} ({})",
        report.local_hit_ratio,
        report.global_hit_ratio,
        report.followup_home_share,
        report.migrations,
        report.router_migrations,
        report.turn_inference_accuracy,
        report.turn_inference_samples
    );
    println!(
        "imbalance cv queued mean={:.3} p90={:.3} requests mean={:.3}  preemptions={} gpu_evictions={} tier_fetches={} tier_evictions={}",
        report.imbalance_queued_cv_mean,
        report.imbalance_queued_cv_p90,
        report.imbalance_requests_cv_mean,
        report.preemptions,
        report.gpu_evictions,
        report.tier_fetches,
        report.tier_evictions
    );
    println!("reasons {:?}", report.reasons);
    println!(
        "index feed {} (delay {} s): local-hit prediction error {:.4}, over-predicted {:.3}, counters {:?}",
        report.index_feed,
        report.event_delay_s,
        report.local_hit_prediction_error,
        report.local_hit_overpredicted_share,
        report.feed_counters
    );
    if let Some(path) = records_path {
        let io = |source| SimError::Io {
            path: path.clone().into(),
            source,
        };
        let mut out = String::from(
            "index,instance,arrival_s,first_token_s,finish_s,input,output,local_hit,global_hit,truth,inferred,reason,rejected,preemptions\n",
        );
        let opt = |v: Option<f64>| v.map_or(String::new(), |x| format!("{x:.6}"));
        for r in &report.records {
            let _ = writeln!(
                out,
                "{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
                r.index,
                r.instance.map_or(String::new(), |i| i.to_string()),
                opt(r.arrival_s),
                opt(r.first_token_s),
                opt(r.finish_s),
                r.input_tokens,
                r.output_tokens,
                r.local_hit_tokens,
                r.global_hit_tokens,
                r.first_turn_truth.map_or(String::new(), |b| b.to_string()),
                r.first_turn_inferred.map_or(String::new(), |b| b.to_string()),
                r.reason,
                r.rejected,
                r.preemptions
            );
        }
        std::fs::write(&path, out).map_err(io)?;
    }
    Ok(())
}
