//! Routing and KV-event ingestion at once in one process, without Python: the core's own
//! concurrency (the index mutex, hashing outside it, batched ingestion), with no GIL in the way.
//!
//! Run: `cargo run --release -p smetric-vllm --example concurrency -- [seconds]` (default 2).
//! Prints, for 32K-token `smetric` routes on 32 instances (exact index, as a fleet with KV events
//! runs it) and for the captured vLLM 0.33 stream (`tests/data/vllm/captured_stream.json`,
//! handed in with `Ingestor::on_messages` a pass at a time, the source reset after each):
//! * routes/s from 1 thread and from 2 threads;
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

/// Routes until `stop`; returns the count.
fn route_loop(r: &Router, prompt: &[u32], stop: &AtomicBool) -> u64 {
    let mut n = 0;
    while !stop.load(Ordering::Relaxed) {
        let d = r.route(&RouteRequest::new(Prompt::Tokens(prompt))).expect("routes");
        r.on_finished(d.request_id, 0);
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

/// Runs `routers` routing threads and, with `ingest`, one ingesting thread for `secs`; returns
/// (routes/s, messages/s).
fn run(secs: f64, routers: usize, ingest: bool) -> (f64, f64) {
    let p = prompt();
    let r = router(&p);
    let stream = captured_stream();
    let stop = AtomicBool::new(false);
    let (routes, messages) = thread::scope(|s| {
        let routing: Vec<_> = (0..routers).map(|_| s.spawn(|| route_loop(&r, &p, &stop))).collect();
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
    let t = Instant::now();
    let (one, _) = run(secs, 1, false);
    let (two, _) = run(secs, 2, false);
    let (_, ingest_alone) = run(secs, 0, true);
    let (routes_both, ingest_both) = run(secs, 1, true);
    println!(
        "routes/s (32K tokens, smetric, 32 instances): 1 thread {one:.0}, 2 threads {two:.0} (x{:.2})",
        two / one
    );
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
