//! Routes/s and per-call latency of one shared `Router` from 1, 2 and 4 threads, per workload
//! shape, on the core without Python (issue 33): the counterpart of
//! `benches/python/route_threads.py`, so that what the GIL costs can be told from what the core's
//! locks cost.
//!
//! Run: `cargo run --release -p smetric-core --example concurrent_route -- [seconds] [runs]
//! [tokens]` (defaults 1.5, 5, 32768). Every measurement builds a fresh router (`smetric`, today's
//! defaults unless the shape says otherwise; 32 instances, block 16) and warms it untimed; the
//! threads then share it:
//! * `stay-home`: 256 sessions sharing a 4K system prompt routed once, then every thread
//!   re-sends session 7's prompt (the follow-up stays home: the route renews its blocks);
//! * `distinct`: 64 sessions of distinct tokens routed as first turns, then each thread cycles
//!   through them as turn 2 from its own offset (they stay home under today's defaults);
//! * `move-heavy`: the same on a fleet whose GPU caches hold one such session each
//!   (`local_capacity_blocks` = the prompt's blocks): most follow-ups find their home taken by
//!   another session and move, inserting their chain and evicting the one there;
//! * `write-heavy`: first turns of new sessions: each thread's prompt gets a new first token
//!   every call, so every route adds a whole new chain;
//! * `control`: hashing the prompt only (no lock), whose ratio is what the machine gave a
//!   second thread then;
//! * `apart`: write-heavy's realistic loop with a router of its own per thread (nothing shared):
//!   the most any sharding of the index could give write-heavy on this machine.
//! * `handoff-cond` and `handoff-spin`: stay-home's realistic loop with a lock every thread
//!   holds around [`HELD_NS`] of busy work per iteration (800 ns before the route, 200 ns before
//!   `on_finished`), released for the route and the lifecycle calls — the shape of a Python
//!   caller's loop under the GIL. `cond` is shaped as CPython 3.11's GIL (a flag under a mutex,
//!   waiters asleep on a condition variable, woken by the holder's release), `spin` is the same
//!   lock spun on: their gap is what putting a waiter to sleep and waking it costs a second thread
//!   on this machine, apart from anything CPython or smetric does.
//!
//! Loops: `route` is route + `on_finished`, `realistic` adds `on_prefilled` between them. Every
//! route is timed with `Instant::now` inside its thread (the timer's cost is printed). Runs
//! interleave every configuration, rotated by one from run to run; the table gives, over the
//! runs, routes/s (min/median/max), the ratio to 1 thread of the same shape and loop in the same
//! run, the p50/p99 per route (medians over runs) and the share of routes that moved.

use std::fmt::Write as _;
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use smetric_core::{PolicyKind, Prompt, RouteRequest, Router, RouterConfig, TurnHint};

const INSTANCES: usize = 32;
const BLOCK: u32 = 16;
const SHAPES: [&str; 4] = ["stay-home", "distinct", "move-heavy", "write-heavy"];
const LOOPS: [&str; 2] = ["route", "realistic"];
const CONTROL: &str = "control";
const APART: &str = "apart";
const HANDOFF_COND: &str = "handoff-cond";
const HANDOFF_SPIN: &str = "handoff-spin";
/// Busy work per iteration with the hand-off lock held (the `handoff-*` controls): about what a
/// Python caller's loop runs with the GIL around a route and `on_finished`.
const HELD_NS: [u64; 2] = [800, 200];

/// `n` pseudo-random token ids from `seed`.
fn tokens(n: usize, seed: u64) -> Vec<u32> {
    let mut x = seed;
    (0..n)
        .map(|_| {
            x = smetric_core::rng::mix64(x);
            (x % 151_936) as u32
        })
        .collect()
}

fn router(config: RouterConfig) -> Router {
    let names: Vec<String> = (0..INSTANCES).map(|i| format!("gpu-{i}")).collect();
    Router::new(&names, PolicyKind::Smetric, BLOCK, 0, config).expect("valid router")
}

/// A warm router and what each thread sends: `prompts[k]`, cycled by thread `k`.
struct Workload {
    router: Router,
    prompts: Vec<Vec<Vec<u32>>>,
    turn: TurnHint,
    /// Whether each call's prompt gets a new first token (a new session).
    fresh: bool,
}

fn workload(shape: &str, threads: usize, n: usize) -> Workload {
    match shape {
        "stay-home" => {
            let r = router(RouterConfig::default());
            let system = tokens(4_096.min(n / 2), 1);
            let mut follow_up = Vec::new();
            for s in 0..256 {
                let mut p = system.clone();
                p.extend(tokens(n - system.len(), 100 + s));
                let d = r.route(&RouteRequest::new(Prompt::Tokens(&p))).expect("routes");
                r.on_finished(d.request_id, 0);
                if s == 7 {
                    follow_up = p;
                }
            }
            Workload {
                router: r,
                prompts: vec![vec![follow_up]; threads],
                turn: TurnHint::Unknown,
                fresh: false,
            }
        }
        "distinct" | "move-heavy" => {
            let config = if shape == "move-heavy" {
                RouterConfig {
                    local_capacity_blocks: (n / BLOCK as usize) as u64,
                    ..RouterConfig::default()
                }
            } else {
                RouterConfig::default()
            };
            let r = router(config);
            let sessions: Vec<Vec<u32>> = (0..64).map(|s| tokens(n, 1_000 + s)).collect();
            for p in &sessions {
                let d = r
                    .route(&RouteRequest {
                        turn: TurnHint::Turn(1),
                        ..RouteRequest::new(Prompt::Tokens(p))
                    })
                    .expect("routes");
                r.on_prefilled(d.request_id);
                r.on_finished(d.request_id, 0);
            }
            let prompts = (0..threads)
                .map(|k| {
                    let mut s = sessions.clone();
                    s.rotate_left(k * sessions.len() / threads);
                    s
                })
                .collect();
            Workload {
                router: r,
                prompts,
                turn: TurnHint::Turn(2),
                fresh: false,
            }
        }
        "write-heavy" => Workload {
            router: router(RouterConfig::default()),
            prompts: (0..threads).map(|k| vec![tokens(n, 10_000 + k as u64)]).collect(),
            turn: TurnHint::Turn(1),
            fresh: true,
        },
        _ => unreachable!("unknown shape {shape}"),
    }
}

/// One measurement.
struct Sample {
    rate: f64,
    p50_us: f64,
    p99_us: f64,
    /// Share of the measured routes whose follow-up moved (`None` for the controls).
    moved: Option<f64>,
}

impl Sample {
    /// A measurement's rate, its sorted latencies' p50 and p99, and the share moved.
    fn of(rate: f64, sorted_ns: &[u64], moved: Option<f64>) -> Self {
        Self {
            rate,
            p50_us: percentile(sorted_ns, 0.5),
            p99_us: percentile(sorted_ns, 0.99),
            moved,
        }
    }
}

fn percentile(sorted_ns: &[u64], q: f64) -> f64 {
    sorted_ns[((sorted_ns.len() - 1) as f64 * q) as usize] as f64 / 1e3
}

fn moved_routes(r: &Router) -> (u64, u64) {
    let s = r.stats();
    let moved = s
        .reasons
        .iter()
        .filter(|(name, _)| name.starts_with("follow-up: migrate"))
        .map(|(_, c)| c)
        .sum();
    (s.routed, moved)
}

/// Runs `body(k, &mut latencies)` on `threads` threads until `secs` have passed; `body` returns
/// once its own timed call ended past the deadline. Returns (calls/s, sorted latencies).
fn run_threads<F>(threads: usize, secs: f64, body: F) -> (f64, Vec<u64>)
where
    F: Fn(usize, Instant, &mut Vec<u64>) + Sync,
{
    let start = Instant::now();
    let stop = start + Duration::from_secs_f64(secs);
    let mut all: Vec<u64> = thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|k| {
                let body = &body;
                s.spawn(move || {
                    let mut lat = Vec::with_capacity(1 << 16);
                    body(k, stop, &mut lat);
                    lat
                })
            })
            .collect();
        hs.into_iter().flat_map(|h| h.join().expect("no panic")).collect()
    });
    let elapsed = start.elapsed().as_secs_f64();
    all.sort_unstable();
    (all.len() as f64 / elapsed, all)
}

fn route_threads(shape: &str, realistic: bool, threads: usize, secs: f64, tokens: usize) -> Sample {
    let w = workload(shape, threads, tokens);
    let (routed0, moved0) = moved_routes(&w.router);
    let (rate, lat) = run_threads(threads, secs, |k, stop, lat| route_loop(&w, k, realistic, stop, lat));
    let (routed1, moved1) = moved_routes(&w.router);
    let moved = (moved1 - moved0) as f64 / (routed1 - routed0).max(1) as f64;
    Sample::of(rate, &lat, Some(moved))
}

/// The `apart` control: write-heavy's realistic loop, each thread on a router of its own.
fn apart_threads(threads: usize, secs: f64, tokens: usize) -> Sample {
    let ws: Vec<Workload> = (0..threads).map(|_| workload("write-heavy", threads, tokens)).collect();
    let (rate, lat) = run_threads(threads, secs, |k, stop, lat| route_loop(&ws[k], k, true, stop, lat));
    Sample::of(rate, &lat, None)
}

/// Thread `k`'s loop over `w`'s prompts until `stop`, each route's latency into `lat`.
fn route_loop(w: &Workload, k: usize, realistic: bool, stop: Instant, lat: &mut Vec<u64>) {
    let mut prompts = w.prompts[k].clone();
    let mut call = 0_usize;
    loop {
        let len = prompts.len();
        let prompt = &mut prompts[call % len];
        if w.fresh {
            prompt[0] = call as u32; // a new first token: a new chain from its first block
        }
        let req = RouteRequest {
            turn: w.turn,
            ..RouteRequest::new(Prompt::Tokens(prompt))
        };
        let t0 = Instant::now();
        let d = w.router.route(&req).expect("routes");
        let t1 = Instant::now();
        if realistic {
            w.router.on_prefilled(d.request_id);
        }
        w.router.on_finished(d.request_id, 0);
        lat.push((t1 - t0).as_nanos() as u64);
        call += 1;
        if t1 >= stop {
            break;
        }
    }
}

fn control_threads(threads: usize, secs: f64, n: usize) -> Sample {
    let r = router(RouterConfig::default());
    let p = tokens(n, 1_000);
    let (rate, lat) = run_threads(threads, secs, |_, stop, lat| {
        loop {
            let t0 = Instant::now();
            black_box(r.hash_tokens(black_box(&p), None));
            let t1 = Instant::now();
            lat.push((t1 - t0).as_nanos() as u64);
            if t1 >= stop {
                break;
            }
        }
    });
    Sample::of(rate, &lat, None)
}

/// A lock shaped as CPython 3.11's GIL (`cond`: a flag under a mutex, waiters asleep on a
/// condition variable and woken by a release) or the same lock spun on.
struct HandoffLock {
    sleeps: bool,
    flag: Mutex<bool>,
    released: Condvar,
    spun: AtomicBool,
}

impl HandoffLock {
    fn new(sleeps: bool) -> Self {
        Self {
            sleeps,
            flag: Mutex::new(false),
            released: Condvar::new(),
            spun: AtomicBool::new(false),
        }
    }

    fn take(&self) {
        if self.sleeps {
            let mut held = self.flag.lock().expect("not poisoned");
            while *held {
                held = self.released.wait(held).expect("not poisoned");
            }
            *held = true;
        } else {
            while self
                .spun
                .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
            {
                std::hint::spin_loop();
            }
        }
    }

    fn release(&self) {
        if self.sleeps {
            *self.flag.lock().expect("not poisoned") = false;
            self.released.notify_one();
        } else {
            self.spun.store(false, Ordering::Release);
        }
    }
}

/// Busy-waits `ns` nanoseconds (work done with the hand-off lock held).
fn busy(ns: u64) {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_nanos(ns) {
        std::hint::spin_loop();
    }
}

/// The `handoff-*` controls: stay-home's realistic loop, [`HELD_NS`] of each iteration under a
/// [`HandoffLock`] every thread shares.
fn handoff_threads(threads: usize, secs: f64, n: usize, sleeps: bool) -> Sample {
    let w = workload("stay-home", threads, n);
    let lock = HandoffLock::new(sleeps);
    let (rate, lat) = run_threads(threads, secs, |k, stop, lat| {
        let prompt = &w.prompts[k][0];
        loop {
            lock.take();
            busy(HELD_NS[0]);
            lock.release();
            let t0 = Instant::now();
            let d = w
                .router
                .route(&RouteRequest::new(Prompt::Tokens(prompt)))
                .expect("routes");
            let t1 = Instant::now();
            w.router.on_prefilled(d.request_id);
            lock.take();
            busy(HELD_NS[1]);
            lock.release();
            w.router.on_finished(d.request_id, 0);
            lat.push((t1 - t0).as_nanos() as u64);
            if t1 >= stop {
                break;
            }
        }
    });
    Sample::of(rate, &lat, None)
}

/// p50 ns between two back-to-back `Instant::now` reads.
fn timer_overhead() -> f64 {
    let mut lat: Vec<u64> = (0..100_000)
        .map(|_| {
            let t0 = Instant::now();
            let t1 = Instant::now();
            (t1 - t0).as_nanos() as u64
        })
        .collect();
    lat.sort_unstable();
    lat[lat.len() / 2] as f64
}

/// One configuration and its samples, one per run.
struct Config {
    shape: &'static str,
    lp: &'static str,
    threads: usize,
    samples: Vec<Sample>,
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    let m = xs.len() / 2;
    if xs.len() % 2 == 1 {
        xs[m]
    } else {
        f64::midpoint(xs[m - 1], xs[m])
    }
}

fn spread(xs: &[f64], decimals: usize) -> String {
    let min = xs.iter().copied().fold(f64::INFINITY, f64::min);
    let max = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    format!("{min:.decimals$}/{:.decimals$}/{max:.decimals$}", median(xs.to_vec()))
}

/// Runs every configuration `runs` times, interleaved, and returns the report.
fn report(secs: f64, runs: usize, n: usize) -> String {
    let cores = thread::available_parallelism().map_or(1, std::num::NonZero::get);
    let counts: &[usize] = if cores >= 4 { &[1, 2, 4] } else { &[1, 2] };
    let mut configs: Vec<Config> = Vec::new();
    for shape in SHAPES {
        for lp in LOOPS {
            for &threads in counts {
                configs.push(Config {
                    shape,
                    lp,
                    threads,
                    samples: Vec::new(),
                });
            }
        }
    }
    for control in [CONTROL, APART, HANDOFF_COND, HANDOFF_SPIN] {
        for &threads in counts {
            configs.push(Config {
                shape: control,
                lp: "-",
                threads,
                samples: Vec::new(),
            });
        }
    }
    let mut out = format!(
        "one shared Router: smetric, {INSTANCES} instances, block {BLOCK}, {n}-token prompts; \
         {runs} interleaved runs of {secs} s per configuration; available_parallelism = {cores}\n"
    );
    if cores < 4 {
        writeln!(out, "4 threads: skipped (available_parallelism = {cores} < 4)").expect("writing to a String");
    }
    writeln!(
        out,
        "timer: two Instant::now reads {:.0} ns apart (p50)",
        timer_overhead()
    )
    .expect("writing to a String");
    let total = configs.len();
    for run in 0..runs {
        for j in 0..total {
            let c = &mut configs[(run + j) % total];
            let sample = if c.shape == CONTROL {
                control_threads(c.threads, secs, n)
            } else if c.shape == APART {
                apart_threads(c.threads, secs, n)
            } else if c.shape == HANDOFF_COND || c.shape == HANDOFF_SPIN {
                handoff_threads(c.threads, secs, n, c.shape == HANDOFF_COND)
            } else {
                route_threads(c.shape, c.lp == "realistic", c.threads, secs, n)
            };
            c.samples.push(sample);
        }
        let one = |shape: &str, lp: &str| {
            configs
                .iter()
                .find(|o| o.shape == shape && o.lp == lp && o.threads == 1)
                .map_or(f64::NAN, |o| o.samples[run].rate)
        };
        let ratios: Vec<String> = configs
            .iter()
            .filter(|c| c.threads == 2)
            .map(|c| format!("{}/{} {:.2}", c.shape, c.lp, c.samples[run].rate / one(c.shape, c.lp)))
            .collect();
        writeln!(out, "run {}, x(2 threads ÷ 1): {}", run + 1, ratios.join("  ")).expect("writing to a String");
    }
    writeln!(
        out,
        "{:<12} {:<10} {:>3} {:>26} {:>23} {:>7} {:>7} {:>6}",
        "shape", "loop", "thr", "routes/s min/med/max", "x÷1 thread min/med/max", "p50 µs", "p99 µs", "moved"
    )
    .expect("writing to a String");
    for c in &configs {
        let ones = configs
            .iter()
            .find(|o| o.shape == c.shape && o.lp == c.lp && o.threads == 1)
            .expect("a 1-thread configuration");
        let rates: Vec<f64> = c.samples.iter().map(|s| s.rate).collect();
        let ratios: Vec<f64> = c
            .samples
            .iter()
            .zip(&ones.samples)
            .map(|(s, o)| s.rate / o.rate)
            .collect();
        let moved: Vec<f64> = c.samples.iter().filter_map(|s| s.moved).collect();
        let moved = if moved.is_empty() {
            "-".to_string()
        } else {
            format!("{:.0}%", 100.0 * median(moved))
        };
        writeln!(
            out,
            "{:<12} {:<10} {:>3} {:>26} {:>23} {:>7.2} {:>7.2} {:>6}",
            c.shape,
            c.lp,
            c.threads,
            spread(&rates, 0),
            spread(&ratios, 2),
            median(c.samples.iter().map(|s| s.p50_us).collect()),
            median(c.samples.iter().map(|s| s.p99_us).collect()),
            moved,
        )
        .expect("writing to a String");
    }
    out
}

#[allow(clippy::print_stdout)]
fn main() {
    let mut args = std::env::args().skip(1);
    let secs: f64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(1.5);
    let runs: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(5).max(1);
    let n: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(32_768);
    print!("{}", report(secs, runs, n));
}

#[cfg(test)]
mod tests {
    /// The instrument still measures every shape: a tiny run (one run, 10 ms per configuration,
    /// 1K-token prompts; not timed) prints a row for each shape, loop and thread count and the
    /// two controls, and move-heavy's follow-ups move while stay-home's and distinct's stay.
    #[test]
    fn every_shape_loop_and_thread_count_prints_its_row() {
        let out = super::report(0.01, 1, 1_024);
        let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
        let counts: &[&str] = if cores >= 4 { &["1", "2", "4"] } else { &["1", "2"] };
        let row = |shape: &str, lp: &str, t: &str| {
            out.lines()
                .find(|l| l.split_whitespace().take(3).eq([shape, lp, t]))
                .unwrap_or_else(|| panic!("no row {shape} {lp} {t} in\n{out}"))
                .split_whitespace()
                .last()
                .expect("a moved column")
                .to_string()
        };
        for shape in super::SHAPES {
            for lp in super::LOOPS {
                for t in counts {
                    let moved: f64 = row(shape, lp, t).trim_end_matches('%').parse().expect("a share");
                    if *t == "1" && shape == "move-heavy" {
                        assert!(moved >= 30.0, "{out}");
                    }
                    if *t == "1" && (shape == "stay-home" || shape == "distinct") {
                        assert!(moved <= 10.0, "{out}");
                    }
                }
            }
        }
        for t in counts {
            assert_eq!(row(super::CONTROL, "-", t), "-");
            assert_eq!(row(super::APART, "-", t), "-");
            assert_eq!(row(super::HANDOFF_COND, "-", t), "-");
            assert_eq!(row(super::HANDOFF_SPIN, "-", t), "-");
        }
        assert!(
            out.contains("run 1, x(2 threads ÷ 1): ") && out.contains("timer: "),
            "{out}"
        );
        assert!(cores >= 4 || out.contains("4 threads: skipped"), "{out}");
    }
}
