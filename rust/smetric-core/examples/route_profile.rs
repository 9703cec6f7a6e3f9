//! A fixed, deterministic workload for profiling `Router::route` (callgrind, perf).
//!
//! Run: `cargo run --profile profiling -p smetric-core --example route_profile -- [tokens] [routes]
//! [shared] [timed] [cycle]` (defaults 32,768 tokens, 1,000 routes, no shared prefix, timed, 1;
//! `timed` = 0 skips the per-call timing, for instruction counts). It mirrors the criterion
//! bench `route/{n}/32`: a 32-instance SMetric router warmed with 256 sessions' prompts (the first
//! `shared` tokens common to all, like a system prompt), then session 7's prompt routed `routes`
//! times, each followed by `on_finished` so the load board stays steady. With `cycle` > 1 the
//! routes cycle through that many sessions' prompts instead, so that each route's chain is not
//! the newest in its holders (like the `route/{n}-cycle16/32` bench). Prints p50/p99/max over
//! the calls during which the thread was not descheduled (on a busy machine, preemptions are
//! not the router's latency).
//!
//! Instructions per route, independent of the warm-up: run it under
//! `valgrind --tool=callgrind` with two route counts and divide the difference of the totals
//! by the difference of the counts (or read `Router::route`'s inclusive cost).

use std::hint::black_box;
use std::time::Instant;

use smetric_core::{PolicyKind, Prompt, RouteRequest, Router, RouterConfig};

fn tokens(n: usize, salt: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| i.wrapping_mul(2_654_435_761).wrapping_add(salt) % 151_936)
        .collect()
}

/// Times this thread was scheduled in (Linux `schedstat`), to leave out preempted calls.
fn timeslices() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    s.split_whitespace().nth(2)?.parse().ok()
}

fn main() {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(32_768);
    let routes: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(1_000);
    let shared: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(0);
    // `0` skips the per-call timing (whose /proc reads would pollute an instruction count).
    let timed = args.next().is_none_or(|a| a != "0");
    // Sessions whose prompts the measured routes cycle through: 1 repeats session 7's prompt
    // (its blocks already are the newest of its holders), more make every route move its
    // chain to the front of both holders' LRU orders.
    let cycle: u32 = args.next().and_then(|a| a.parse().ok()).unwrap_or(1).clamp(1, 256);
    let names: Vec<String> = (0..32).map(|i| format!("gpu-{i}")).collect();
    let router = Router::new(&names, PolicyKind::Smetric, 16, 0, RouterConfig::default()).expect("valid router");
    let system = tokens(shared.min(n), 1_000);
    let session = |s: u32| {
        let mut p = system.clone();
        p.extend(tokens(n - system.len(), s));
        p
    };
    for s in 0..256 {
        let d = router
            .route(&RouteRequest::new(Prompt::Tokens(&session(s))))
            .expect("route");
        router.on_finished(d.request_id, 0);
    }
    let prompts: Vec<Vec<u32>> = (0..cycle).map(|k| session((7 + k * 37) % 256)).collect();
    let mut sum = 0u64;
    let mut times = Vec::with_capacity(routes as usize);
    let mut preempted = 0;
    for k in 0..routes {
        let prompt = &prompts[(k % u64::from(cycle)) as usize];
        let slices = if timed { timeslices() } else { None };
        let t0 = Instant::now();
        let d = router
            .route(&RouteRequest::new(Prompt::Tokens(black_box(prompt))))
            .expect("route");
        let dt = t0.elapsed().as_nanos() as u64;
        // A call during which the thread was descheduled measures the machine, not the router.
        if !timed || (slices.is_some() && slices != timeslices()) {
            preempted += 1;
        } else {
            times.push(dt);
        }
        router.on_finished(d.request_id, 0);
        sum += u64::from(d.instance.0);
    }
    black_box(sum);
    times.sort_unstable();
    if let Some(&max) = times.last() {
        let at = |q: f64| times[((times.len() - 1) as f64 * q) as usize] as f64 / 1e3;
        eprintln!(
            "route {n} tokens ({shared} shared, {cycle} prompts): p50 {:.2} us  p99 {:.2} us  max {:.2} us  ({preempted} preempted calls left out)",
            at(0.5),
            at(0.99),
            max as f64 / 1e3
        );
    }
}
