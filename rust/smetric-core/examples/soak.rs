//! Memory soak of the approximate index: a busy 32-instance fleet routing agent sessions.
//!
//! Run: `cargo run --release -p smetric-core --example soak -- [routes] [report_every]`
//! (default 2,764,800 routes = 24 h at 32 requests/s, one per instance per second).
//!
//! Sessions share one of 16 system prompts (2K–8K tokens) and grow by 300–3,000 tokens a turn up
//! to ~64K, then end; new sessions keep arriving, so the index churns through far more
//! distinct blocks than its capacity. Every `report_every` routes it prints the index's own
//! estimate (bytes, entries, bytes per (block, holder) pair) and the process RSS, which must
//! stay flat once the capacities are reached.

use std::fmt::Write as _;
use std::time::Instant;

use smetric_core::{PolicyKind, Prompt, RouteRequest, Router, RouterConfig};

const INSTANCES: usize = 32;
const LIVE_SESSIONS: usize = 512;

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1).and_then(|p| p.parse::<u64>().ok()))
        .map_or(0, |pages| pages * 4)
}

/// A tiny deterministic generator (the soak must not depend on a crate for randomness).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        self.0 >> 17
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let routes: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(2_764_800);
    let every: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(200_000);
    let names: Vec<String> = (0..INSTANCES).map(|i| format!("gpu-{i}")).collect();
    let router = Router::new(&names, PolicyKind::Smetric, 16, 0, RouterConfig::default()).expect("valid router");
    let mut rng = Lcg(42);
    let systems: Vec<Vec<u32>> = (0..16)
        .map(|_| {
            let n = 2_048 + rng.below(6_144) as usize;
            (0..n).map(|_| rng.below(151_936) as u32).collect()
        })
        .collect();
    let new_session = |rng: &mut Lcg| -> Vec<u32> { systems[rng.below(16) as usize].clone() };
    let mut sessions: Vec<Vec<u32>> = (0..LIVE_SESSIONS).map(|_| new_session(&mut rng)).collect();
    let start = Instant::now();
    let mut line = String::new();
    for k in 1..=routes {
        let s = rng.below(LIVE_SESSIONS as u64) as usize;
        let grow = 300 + rng.below(2_700) as usize;
        sessions[s].extend((0..grow).map(|_| rng.below(151_936) as u32));
        let d = router
            .route(&RouteRequest::new(Prompt::Tokens(&sessions[s])))
            .expect("route");
        router.on_prefilled(d.request_id);
        router.on_finished(d.request_id, 0);
        if sessions[s].len() > 64_000 {
            sessions[s] = new_session(&mut rng);
        }
        if k % every == 0 || k == routes {
            let st = router.stats();
            let pairs = st.index.local_blocks.iter().sum::<usize>() + st.index.global_blocks;
            line.clear();
            let _ = write!(
                line,
                "routes {k:>9}  {:>6.1} s  entries {:>8}  pairs {:>8}  index {:>7.1} MiB  {:>5.1} B/pair  rss {:>7.1} MiB",
                start.elapsed().as_secs_f64(),
                st.index.entries,
                pairs,
                st.index_bytes as f64 / 1_048_576.0,
                st.index_bytes as f64 / pairs.max(1) as f64,
                rss_kib() as f64 / 1024.0,
            );
            eprintln!("{line}");
            if k == routes {
                eprintln!("index breakdown (bytes): {:?}", st.index_breakdown);
            }
        }
    }
}
