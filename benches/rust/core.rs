//! Criterion benchmarks of the routing core's decision path.
//!
//! Run: `cargo bench -p smetric-core --bench core` (all), or filter, e.g.
//! `cargo bench -p smetric-core --bench core -- route/`. `cargo test --benches` runs each
//! once as a smoke test (what CI does). Figures and the machine: `BENCHMARKS.md`.
//!
//! Groups:
//! * `hash/{1K,8K,32K,128K}` — block hashing of that many tokens (xxh3 per block, chained by
//!   `chain_step`); beside it at 32K, `hash-floor/content-only` (the xxh3 calls alone, no
//!   chain: the floor of any per-block definition) and `hash-floor/seeded-chain` (the first
//!   definition, each xxh3 seeded with its parent's hash, so each call waits for the last);
//! * `query/{hit,miss,partial}/{8,32,128,1024}` — one index query of a 32K-token (2,048
//!   block) prompt against an index holding 1M (block, instance) entries;
//! * `select/{policy}/{8,32,128,1024}` — one policy decision over that many candidates;
//! * `route/{1K,32K}/32` — a whole `Router::route` (hash + query + score + insert) on a warm
//!   index with 32 instances, followed by the lifecycle calls that keep the board steady; the
//!   same prompt each time, so its chain already is the newest in both holders;
//! * `route/{1K,32K}-cycle16/32` — the same, cycling through 16 sessions' prompts, so that each
//!   route moves its chain to the front of both holders' LRU orders;
//! * `route/32K-two-homes/32` — `route/32K-cycle16/32` on 16 sessions each held by two
//!   instances (routed once more with its first home excluded): a moved session's old copy;
//! * `route/32K-new/32` — the write-heavy route: every prompt a new session's first turn (a new
//!   first token), on an index whose global tier (1M blocks) and GPU caches are full, so each
//!   route creates 2,048 entries and evicts as many (the block table's probes miss cache).

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use smetric_core::index::IndexLimits;
use smetric_core::rng::DrawCounter;
use smetric_core::{
    BlockHash, Candidate, Decision, Holder, IndexQuery, KvIndex, PolicyKind, Prompt, RouteRequest, Router,
    RouterConfig, SelectionInput, hash_tokens,
};

const PROMPT_BLOCKS: u64 = 2_048;
const INDEXED_ENTRIES: u64 = 1_000_000;

fn tokens(n: usize, salt: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| i.wrapping_mul(2_654_435_761).wrapping_add(salt) % 151_936)
        .collect()
}

fn bench_hash(c: &mut Criterion) {
    let mut g = c.benchmark_group("hash");
    for (label, n) in [("1K", 1_024), ("8K", 8_192), ("32K", 32_768), ("128K", 131_072)] {
        let t = tokens(n, 1);
        g.throughput(Throughput::Elements(n as u64));
        g.bench_function(label, |b| b.iter(|| hash_tokens(black_box(&t), 16, 0, None)));
    }
    g.finish();
    let t = tokens(32_768, 1);
    let mut g = c.benchmark_group("hash-floor");
    g.throughput(Throughput::Elements(32_768));
    g.bench_function("content-only", |b| {
        b.iter(|| {
            black_box(&t)
                .chunks_exact(16)
                .map(smetric_core::hash::block_content_hash)
                .collect::<Vec<u64>>()
        });
    });
    g.bench_function("seeded-chain", |b| {
        b.iter(|| {
            let mut parent = 0u64;
            black_box(&t)
                .chunks_exact(16)
                .map(|block| {
                    parent = xxhash_rust::xxh3::xxh3_64_with_seed(bytemuck::cast_slice(block), parent);
                    parent
                })
                .collect::<Vec<u64>>()
        });
    });
    g.finish();
}

/// An index with `INDEXED_ENTRIES` (block, instance) entries: distinct 2,048-block chains
/// spread round-robin over the instances. Chain `k` uses hashes `k·2^32 + i`.
fn filled_index(instances: u32) -> KvIndex {
    let mut ix = KvIndex::new(IndexLimits {
        local_capacity: 1 << 30,
        global_capacity: 0,
        local_ttl_ms: None,
    });
    for s in 0..instances {
        ix.add_slot(s);
    }
    let chains = INDEXED_ENTRIES / PROMPT_BLOCKS;
    for k in 0..chains {
        let chain: Vec<BlockHash> = (0..PROMPT_BLOCKS).map(|i| BlockHash((k << 32) + i)).collect();
        ix.touch(Holder::Instance((k % u64::from(instances)) as u32), &chain, None, 0);
    }
    ix
}

fn bench_query(c: &mut Criterion) {
    let mut g = c.benchmark_group("query");
    for instances in [8u32, 32, 128, 1024] {
        let mut ix = filled_index(instances);
        let hit: Vec<BlockHash> = (0..PROMPT_BLOCKS).map(|i| BlockHash((7 << 32) + i)).collect();
        let miss: Vec<BlockHash> = (0..PROMPT_BLOCKS).map(|i| BlockHash((u64::MAX >> 1) - i)).collect();
        let partial: Vec<BlockHash> = (0..PROMPT_BLOCKS)
            .map(|i| {
                BlockHash(if i < PROMPT_BLOCKS / 2 {
                    (7 << 32) + i
                } else {
                    u64::MAX - i
                })
            })
            .collect();
        let mut out = IndexQuery::default();
        for (label, chain) in [("hit", &hit), ("miss", &miss), ("partial", &partial)] {
            g.bench_with_input(BenchmarkId::new(label, instances), chain, |b, chain| {
                b.iter(|| {
                    ix.query(black_box(chain), 0, &mut out);
                    out.deepest_blocks
                });
            });
        }
    }
    g.finish();
}

fn bench_select(c: &mut Criterion) {
    let mut g = c.benchmark_group("select");
    let config = RouterConfig::default();
    let rng = DrawCounter::new(0);
    for n in [8u32, 32, 128, 1024] {
        let candidates: Vec<Candidate> = (0..n)
            .map(|i| Candidate {
                slot: i,
                name_hash: smetric_core::rng::mix64(u64::from(i)),
                local_hit_tokens: u64::from(i % 5) * 4_096,
                host_hit_tokens: 0,
                bs: u64::from(i % 7),
                waiting: u64::from(i % 3),
                queued: u64::from(i % 11) * 512,
                active: u64::from(i % 13) * 10_000,
                queued_work: u64::from(i % 11) * 900,
                drain_rate: 22_000.0,
                peer_drain_rate: Some(22_000.0),
                recent_requests: u64::from(i % 9),
                recent_cost_us: u64::from(i % 9) * 6_750_000,
                decode_room_s: None,
                evicted_age_s: None,
                tpot_s: None,
                fetch_cost: 0.0,
            })
            .collect();
        let paper = RouterConfig::PAPER;
        let mut runs: Vec<(String, &RouterConfig, PolicyKind)> = PolicyKind::ALL
            .iter()
            .map(|k| (k.name().to_owned(), &config, *k))
            .collect();
        runs.push(("smetric_paper".to_owned(), &paper, PolicyKind::Smetric));
        for (label, cfg, kind) in runs {
            let policy = kind.build();
            g.bench_with_input(BenchmarkId::new(label, n), &candidates, |b, candidates| {
                b.iter(|| {
                    policy.select(&SelectionInput {
                        candidates: black_box(candidates),
                        num_tokens: 32_768,
                        global_hit_tokens: 16_384,
                        first_turn: false,
                        block_size: 16,
                        prefill_only: false,
                        previous: Some(n as usize / 2),
                        hash_key: 42,
                        config: cfg,
                        rng: &rng,
                    })
                });
            });
        }
    }
    g.finish();
}

/// One route of `request` and its finish, which keeps the load board steady.
fn route_finished(router: &Router, request: &RouteRequest<'_>) -> Decision {
    let d = router.route(request).expect("route");
    router.on_finished(d.request_id, 0);
    d
}

fn bench_route(c: &mut Criterion) {
    let mut g = c.benchmark_group("route");
    let names: Vec<String> = (0..32).map(|i| format!("gpu-{i}")).collect();
    for (label, n) in [("1K", 1_024usize), ("32K", 32_768)] {
        let router = Router::new(&names, PolicyKind::Smetric, 16, 0, RouterConfig::default()).expect("valid router");
        // Warm: 256 sessions' prompts indexed, and the benchmarked prompt routed once.
        for s in 0..256 {
            route_finished(&router, &RouteRequest::new(Prompt::Tokens(&tokens(n, s))));
        }
        let prompt = tokens(n, 7);
        g.throughput(Throughput::Elements(n as u64));
        g.bench_function(BenchmarkId::new(label, 32), |b| {
            b.iter(|| route_finished(&router, &RouteRequest::new(Prompt::Tokens(black_box(&prompt)))).instance);
        });
        // The same, cycling through 16 sessions' prompts: each route moves its chain to the
        // front of both holders' LRU orders (the benchmark above re-touches the newest run).
        let prompts: Vec<Vec<u32>> = (0..16).map(|k| tokens(n, 7 + 16 * k)).collect();
        let mut next = 0;
        g.bench_function(BenchmarkId::new(format!("{label}-cycle16"), 32), |b| {
            b.iter(|| {
                next = (next + 1) % prompts.len();
                route_finished(&router, &RouteRequest::new(Prompt::Tokens(black_box(&prompts[next])))).instance
            });
        });
    }
    // Sessions on two instances each: every prompt routed once more away from its home.
    let router = Router::new(&names, PolicyKind::Smetric, 16, 0, RouterConfig::default()).expect("valid router");
    let prompts: Vec<Vec<u32>> = (0..16).map(|k| tokens(32_768, 7 + 16 * k)).collect();
    for p in &prompts {
        let home = route_finished(&router, &RouteRequest::new(Prompt::Tokens(p)));
        let away = RouteRequest {
            exclude: &[&home.instance_name],
            ..RouteRequest::new(Prompt::Tokens(p))
        };
        route_finished(&router, &away);
    }
    let mut next = 0;
    g.throughput(Throughput::Elements(32_768));
    g.bench_function(BenchmarkId::new("32K-two-homes", 32), |b| {
        b.iter(|| {
            next = (next + 1) % prompts.len();
            route_finished(&router, &RouteRequest::new(Prompt::Tokens(black_box(&prompts[next])))).instance
        });
    });
    // The write-heavy route: a new chain every call, into full holders.
    let router = Router::new(&names, PolicyKind::Smetric, 16, 0, RouterConfig::default()).expect("valid router");
    let mut prompt = tokens(32_768, 11);
    let mut fresh = 0u32;
    let mut route_new = |prompt: &mut Vec<u32>| {
        fresh += 1;
        prompt[0] = 151_936 + fresh;
        route_finished(&router, &RouteRequest::new(Prompt::Tokens(black_box(prompt)))).instance
    };
    // Past the global tier's capacity (1M blocks = 512 such chains), so every route evicts.
    for _ in 0..640 {
        route_new(&mut prompt);
    }
    g.throughput(Throughput::Elements(32_768));
    g.bench_function(BenchmarkId::new("32K-new", 32), |b| b.iter(|| route_new(&mut prompt)));
    g.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(30)
}

criterion_group! { name = benches; config = config(); targets = bench_hash, bench_query, bench_select, bench_route }
criterion_main!(benches);
