//! Routing and KV-event ingestion at once in one process, without Python: the core's own
//! concurrency (the index's read-write lock: hashing outside it, the walk under its shared
//! side, the commit under its exclusive side; batched ingestion), with no GIL in the way.
//!
//! Run: `cargo run --release -p smetric-vllm --example concurrency -- [seconds] [runs]` (defaults
//! 2 and 1). Prints, for 32K-token `smetric` routes on 32 instances (exact index, as a fleet with
//! KV events runs it) and for the captured vLLM 0.33 stream (`tests/data/vllm/captured_stream.json`,
//! handed in with `Ingestor::on_messages` a pass at a time, the source reset after each):
//! * routes/s from 1 thread and from 2 threads, route + `on_finished` and the realistic loop
//!   route + `on_prefilled` + `on_finished`, 1 and 2 threads interleaved over `runs` runs;
//! * the same prompt only hashed, from 1 and 2 threads: the control (no lock, so its ratio is
//!   what the machine gives a second thread) and the part of a route that runs outside the
//!   index lock; the pre-hashed route is the rest (the walk under the shared lock, the commit
//!   under the exclusive one), and route ÷ that rest is the ceiling if all of it serialised
//!   (as it did under the index mutex before the shared-lock walk);
//! * routes/s and event batches/s alone and with the other running on the second core.
//!
//! `benches/python/concurrency.py` measures the same through the Python bindings, where the GIL
//! adds its own hand-offs.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use smetric_core::{IndexMode, PolicyKind, Prompt, RouteRequest, Router, RouterConfig};
use smetric_vllm::{IngestConfig, Ingestor};

fn captured_stream() -> Vec<Vec<Vec<u8>>> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/vllm/captured_stream.json");
    let text = std::fs::read_to_string(&path).expect("captured_stream.json is in the repository");
    let doc: serde_json::Value = serde_json::from_str(&text).expect("the capture parses");
    let unhex = |s: &str| -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
            .collect()
    };
    doc["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .enumerate()
        .map(|(seq, m)| {
            let f = m.as_array().expect("frames");
            // Sequence numbers from 0 in every pass: the source is reset after each.
            vec![
                unhex(f[0].as_str().expect("topic")),
                (seq as u64).to_be_bytes().to_vec(),
                unhex(f[2].as_str().expect("payload")),
            ]
        })
        .collect()
}

fn prompt() -> Vec<u32> {
    // A fixed pseudo-random 32K-token prompt.
    let mut x = 0x9E37_79B9_7F4A_7C15_u64;
    (0..32_768)
        .map(|_| {
            x = smetric_core::rng::mix64(x);
            (x % 151_936) as u32
        })
        .collect()
}

fn router(prompt: &[u32]) -> Router {
    let names: Vec<String> = (0..32).map(|i| format!("gpu-{i}")).collect();
    let config = RouterConfig {
        index_mode: IndexMode::Exact,
        ..RouterConfig::default()
    };
    let r = Router::new(&names, PolicyKind::Smetric, 16, 0, config).expect("valid router");
    let chain = r.hash_tokens(prompt, None);
    r.store_blocks(Some("gpu-7"), smetric_core::Tier::Local, &chain, None, None)
        .expect("gpu-7 exists");
    r
}

/// Routes until `stop` (with `lifecycle`, reporting `on_prefilled` before `on_finished`, as an
/// embedding router does for every request); returns the count.
fn route_loop(r: &Router, prompt: &[u32], stop: &AtomicBool, lifecycle: bool) -> u64 {
    let mut n = 0;
    while !stop.load(Ordering::Relaxed) {
        let d = r.route(&RouteRequest::new(Prompt::Tokens(prompt))).expect("routes");
        if lifecycle {
            r.on_prefilled(d.request_id);
        }
        r.on_finished(d.request_id, 0);
        n += 1;
    }
    n
}

/// Hashes the prompt until `stop` (what a route does before it takes the index lock); returns
/// the count.
fn hash_loop(r: &Router, prompt: &[u32], stop: &AtomicBool) -> u64 {
    let mut n = 0;
    while !stop.load(Ordering::Relaxed) {
        std::hint::black_box(r.hash_tokens(std::hint::black_box(prompt), None));
        n += 1;
    }
    n
}

/// Ingests passes of the stream until `stop`; returns the messages handed in.
fn ingest_loop(r: &Router, stream: &[Vec<Vec<u8>>], stop: &AtomicBool) -> u64 {
    let mut ing = Ingestor::new(IngestConfig::DEFAULT);
    let src = ing.add_source("gpu-3", false);
    let mut n = 0;
    while !stop.load(Ordering::Relaxed) {
        ing.on_messages(r, src, stream).expect("a registered source");
        ing.reset_source(r, src).expect("a registered source");
        n += stream.len() as u64;
    }
    n
}

/// Hashes/s of the 32K prompt from `threads` threads.
fn hash_rate(secs: f64, threads: usize) -> f64 {
    let p = prompt();
    let r = router(&p);
    let stop = AtomicBool::new(false);
    let n: u64 = thread::scope(|s| {
        let hs: Vec<_> = (0..threads).map(|_| s.spawn(|| hash_loop(&r, &p, &stop))).collect();
        thread::sleep(Duration::from_secs_f64(secs));
        stop.store(true, Ordering::Relaxed);
        hs.into_iter().map(|h| h.join().expect("no panic")).sum()
    });
    n as f64 / secs
}

/// µs per route of the prompt's chain already hashed, plus its `on_finished`, from 1 thread: the
/// upper bound of what a route holds the index lock for, shared and exclusive together (the
/// in-flight record and `on_finished` run outside it).
fn prehashed_route_us(secs: f64) -> f64 {
    let tokens = prompt();
    let r = router(&tokens);
    let chain = r.hash_tokens(&tokens, None);
    let hashed = Prompt::Hashes {
        hashes: &chain,
        num_tokens: Some(tokens.len() as u64),
    };
    let start = Instant::now();
    let mut routes = 0_u64;
    while start.elapsed().as_secs_f64() < secs {
        let d = r.route(&RouteRequest::new(hashed)).expect("routes");
        r.on_finished(d.request_id, 0);
        routes += 1;
    }
    start.elapsed().as_secs_f64() * 1e6 / routes as f64
}

/// Runs `routers` routing threads and, with `ingest`, one ingesting thread for `secs`; returns
/// (routes/s, messages/s).
fn run(secs: f64, routers: usize, ingest: bool) -> (f64, f64) {
    run_with(secs, routers, ingest, false)
}

/// As [`run`], choosing the routing loop.
fn run_with(secs: f64, routers: usize, ingest: bool, lifecycle: bool) -> (f64, f64) {
    let p = prompt();
    let r = router(&p);
    let stream = captured_stream();
    let stop = AtomicBool::new(false);
    let (routes, messages) = thread::scope(|s| {
        let routing: Vec<_> = (0..routers)
            .map(|_| s.spawn(|| route_loop(&r, &p, &stop, lifecycle)))
            .collect();
        let ingesting = ingest.then(|| s.spawn(|| ingest_loop(&r, &stream, &stop)));
        thread::sleep(Duration::from_secs_f64(secs));
        stop.store(true, Ordering::Relaxed);
        let routes: u64 = routing.into_iter().map(|h| h.join().expect("no panic")).sum();
        (routes, ingesting.map_or(0, |h| h.join().expect("no panic")))
    });
    (routes as f64 / secs, messages as f64 / secs)
}

#[allow(clippy::print_stdout)]
fn main() {
    let secs: f64 = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(2.0);
    let runs: usize = std::env::args().nth(2).and_then(|a| a.parse().ok()).unwrap_or(1).max(1);
    let t = Instant::now();
    let mut one = 0.0;
    for (label, lifecycle) in [
        ("route + on_finished", false),
        ("route + on_prefilled + on_finished", true),
    ] {
        let (mut ones, mut ratios) = (Vec::new(), Vec::new());
        for _ in 0..runs {
            let (a, _) = run_with(secs, 1, false, lifecycle);
            let (b, _) = run_with(secs, 2, false, lifecycle);
            ones.push(a);
            ratios.push(b / a);
        }
        ratios.sort_by(f64::total_cmp);
        if !lifecycle {
            // The quietest run: a run that CI slowed would overstate the route's cost.
            one = ones.iter().copied().fold(0.0, f64::max);
        }
        println!(
            "routes/s (32K tokens, smetric, 32 instances), {label}: 1 thread {:.0}-{:.0}, 2 threads ÷ 1 thread x{:.2}-{:.2} ({})",
            ones.iter().copied().fold(f64::INFINITY, f64::min),
            ones.iter().copied().fold(0.0, f64::max),
            ratios[0],
            ratios[ratios.len() - 1],
            ratios.iter().map(|x| format!("{x:.2}")).collect::<Vec<_>>().join(" "),
        );
    }
    // The control: hashing takes no lock, so its 2-thread ratio is what the machine gives two
    // threads (the ceiling of any routing ratio measured beside it).
    let (mut hash_ones, mut hash_ratios) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        let a = hash_rate(secs, 1);
        hash_ratios.push(hash_rate(secs, 2) / a);
        hash_ones.push(a);
    }
    hash_ratios.sort_by(f64::total_cmp);
    println!(
        "control, hashing only (no lock): 2 threads ÷ 1 thread x{:.2}-{:.2} ({})",
        hash_ratios[0],
        hash_ratios[hash_ratios.len() - 1],
        hash_ratios
            .iter()
            .map(|x| format!("{x:.2}"))
            .collect::<Vec<_>>()
            .join(" "),
    );
    let hashes = hash_ones.iter().copied().fold(0.0, f64::max);
    let prehashed_us = prehashed_route_us(secs);
    println!(
        "route of the pre-hashed chain + on_finished, 1 thread: {prehashed_us:.2} µs (the most a route holds the index lock, shared and exclusive)"
    );
    // A route is its hash (parallel) plus at most `prehashed_us` under the index lock: were all
    // of it to serialise, two threads would reach at most route / locked routes per route-time
    // (and two cores at most ×2); the walk under the shared lock does not serialise.
    let (route_us, hash_us) = (1e6 / one, 1e6 / hashes);
    println!(
        "quietest runs, 1 thread: hash alone {hash_us:.2} µs, route + on_finished {route_us:.2} µs; \
         2-thread ceiling were the whole locked part to serialise: x{:.2} (route ÷ pre-hashed route)",
        route_us / prehashed_us.max(f64::MIN_POSITIVE)
    );
    let (_, ingest_alone) = run(secs, 0, true);
    let (routes_both, ingest_both) = run(secs, 1, true);
    println!(
        "routes/s: alone {one:.0}, with ingestion {routes_both:.0} (x{:.2})",
        routes_both / one
    );
    println!(
        "event batches/s: alone {ingest_alone:.0}, with routing {ingest_both:.0} (x{:.2})",
        ingest_both / ingest_alone
    );
    eprintln!("({:.1} s)", t.elapsed().as_secs_f64());
}
