//! Criterion benchmarks of KV-event ingestion: decode a vLLM `KVEventBatch` and apply it to the
//! router's index (engine-hash mapping, store/remove).
//!
//! Run: `cargo bench -p smetric-vllm --bench events`. Input: the real frames of
//! `tests/data/vllm/captured_stream.json` (vLLM 0.33.0's own KV-cache manager serving an agent
//! workload), replayed cyclically with fresh sequence numbers; each pass clears the instance so
//! that every pass does the same work. Throughput is reported in block events (one stored or
//! removed block hash = one event), the unit of the budget in BENCHMARKS.md.
//!
//! * `decode/captured_stream` — msgpack decoding into the owned `KvEventBatch` (`decode_batch`);
//! * `decode_reusing/captured_stream` — the ingestor's decoding: reusable buffers, no owned
//!   events, no allocation once the buffers have grown;
//! * `ingest/captured_stream` — decoding + mapping + index updates into a `Router`
//!   (`Ingestor::on_message`, one `Router::apply_blocks` call per batch).

use std::hint::black_box;
use std::path::PathBuf;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use smetric_core::{IndexMode, PolicyKind, Router, RouterConfig, Tier};
use smetric_vllm::{DecodeBuffers, DecodeOptions, IngestConfig, Ingestor, KvEvent, decode_batch, decode_reusing};

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

/// The captured PUB messages as `[topic, seq, payload]` frames, and the router block size.
fn captured() -> (Vec<[Vec<u8>; 3]>, u32) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/vllm/captured_stream.json");
    let text = std::fs::read_to_string(&path).expect("captured stream");
    let doc: serde_json::Value = serde_json::from_str(&text).expect("json");
    let block_size = u32::try_from(doc["truth"]["block_size"].as_u64().expect("block size")).expect("u32");
    let messages = doc["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .map(|m| {
            let f: Vec<Vec<u8>> = m
                .as_array()
                .expect("frames")
                .iter()
                .map(|x| unhex(x.as_str().expect("hex")))
                .collect();
            [f[0].clone(), f[1].clone(), f[2].clone()]
        })
        .collect();
    (messages, block_size)
}

/// Block events (hashes stored or removed) in one pass over the messages.
fn block_events(messages: &[[Vec<u8>; 3]]) -> u64 {
    messages
        .iter()
        .map(|m| {
            let batch = decode_batch(&m[2]).expect("decodes");
            batch
                .events
                .iter()
                .map(|e| match e {
                    KvEvent::BlockStored(s) => s.block_hashes.len() as u64,
                    KvEvent::BlockRemoved(r) => r.block_hashes.len() as u64,
                    KvEvent::AllBlocksCleared => 1,
                })
                .sum::<u64>()
        })
        .sum()
}

fn bench_events(c: &mut Criterion) {
    let (messages, block_size) = captured();
    let events = block_events(&messages);
    let mut g = c.benchmark_group("events");
    g.throughput(Throughput::Elements(events));
    g.bench_function("decode/captured_stream", |b| {
        b.iter(|| {
            for m in &messages {
                black_box(decode_batch(black_box(&m[2])).expect("decodes"));
            }
        });
    });
    let options = DecodeOptions::default();
    let mut buffers = DecodeBuffers::default();
    g.bench_function("decode_reusing/captured_stream", |b| {
        b.iter(|| {
            for m in &messages {
                black_box(decode_reusing(&options, black_box(&m[2]), &mut buffers).expect("decodes"));
            }
        });
    });
    let config = RouterConfig {
        index_mode: IndexMode::Exact,
        ..RouterConfig::default()
    };
    let router = Router::new(&["a".to_owned()], PolicyKind::Smetric, block_size, 0, config).expect("router");
    let mut ingestor = Ingestor::new(IngestConfig::default());
    let source = ingestor.add_source("a", false);
    let mut seq = 0u64;
    g.bench_function("ingest/captured_stream", |b| {
        b.iter(|| {
            for m in &messages {
                let frames = [m[0].as_slice(), &seq.to_be_bytes(), m[2].as_slice()];
                seq += 1;
                black_box(ingestor.on_message(&router, source, &frames).expect("known source"));
            }
            router.clear(Some("a"), Tier::Local).expect("clear");
            router.clear(None, Tier::Global).expect("clear");
        });
    });
    g.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(30)
}

criterion_group! { name = benches; config = config(); targets = bench_events }
criterion_main!(benches);
