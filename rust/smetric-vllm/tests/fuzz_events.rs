//! Property-based fuzzing of the KV-event decoder and the ingestor (proptest).
//!
//! Inputs: arbitrary bytes; arbitrary bytes behind a valid batch header; and structured
//! mutations (bit flips, byte sets, inserts, deletes, truncations, splices, huge length headers)
//! of the real payloads captured from vLLM 0.33.0 (`tests/data/vllm/*.json`), sent as PUB
//! messages and as replay replies in random sequence orders.
//!
//! Properties: nothing panics; every message is either applied or counted as an error; the
//! index is never corrupted — after every message it holds exactly the blocks the ingestor's
//! sources hold (`Ingestor::held_blocks` equals the router's own counts); and writing a batch
//! in one `Router::apply_blocks` call changes the index and the counters exactly as one
//! `store_blocks` / `remove_blocks` call per write does.
//!
//! Runs 256 cases per property by default; `PROPTEST_CASES=N` runs N (docs/kv-events.md records
//! the ≥1M-case run).

use std::path::PathBuf;
use std::sync::OnceLock;

use proptest::prelude::*;
use proptest::test_runner::Config;
use serde_json::Value;
use smetric_core::{IndexMode, IndexOp, PolicyKind, Router, RouterConfig, Tier};
use smetric_vllm::{
    IndexSink, IngestConfig, Ingestor, SinkError, SourceId, decode_batch, decode_pub_message, decode_replay_reply,
};

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

/// Every non-empty payload of both capture files.
fn payloads() -> &'static [Vec<u8>] {
    static PAYLOADS: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    PAYLOADS.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/vllm");
        let read =
            |name: &str| -> Value { serde_json::from_str(&std::fs::read_to_string(dir.join(name)).unwrap()).unwrap() };
        let mut out = Vec::new();
        let events = read("captured_events.json");
        for stream in events["streams"].as_array().unwrap() {
            for m in stream["messages"].as_array().unwrap() {
                out.push(unhex(m["frames"].as_array().unwrap().last().unwrap().as_str().unwrap()));
            }
        }
        let stream = read("captured_stream.json");
        for m in stream["messages"].as_array().unwrap() {
            out.push(unhex(m.as_array().unwrap()[2].as_str().unwrap()));
        }
        out.retain(|p| !p.is_empty());
        assert!(out.len() > 80);
        out
    })
}

fn config() -> Config {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256);
    Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    }
}

#[derive(Debug, Clone)]
enum Mutation {
    Flip(usize, u8),
    Set(usize, u8),
    Insert(usize, Vec<u8>),
    Delete(usize, usize),
    Truncate(usize),
    Splice {
        from: usize,
        start: usize,
        len: usize,
        at: usize,
    },
    /// A container or string header claiming a huge length.
    Huge(usize, u8),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let pos = any::<usize>();
    prop_oneof![
        (pos, 1..=255u8).prop_map(|(p, m)| Mutation::Flip(p, m)),
        (pos, any::<u8>()).prop_map(|(p, b)| Mutation::Set(p, b)),
        (pos, proptest::collection::vec(any::<u8>(), 1..16)).prop_map(|(p, b)| Mutation::Insert(p, b)),
        (pos, 1..64usize).prop_map(|(p, n)| Mutation::Delete(p, n)),
        pos.prop_map(Mutation::Truncate),
        (any::<usize>(), pos, 1..256usize, pos).prop_map(|(from, start, len, at)| Mutation::Splice {
            from,
            start,
            len,
            at
        }),
        (
            pos,
            prop::sample::select(vec![0xdcu8, 0xdd, 0xde, 0xdf, 0xda, 0xdb, 0xc5, 0xc6, 0x9f, 0x8f])
        )
            .prop_map(|(p, m)| Mutation::Huge(p, m)),
    ]
}

fn mutate(base: &[u8], mutations: &[Mutation]) -> Vec<u8> {
    let mut p = base.to_vec();
    for m in mutations {
        let at = |i: usize, len: usize| if len == 0 { 0 } else { i % len };
        match m {
            Mutation::Flip(i, mask) if !p.is_empty() => {
                let i = at(*i, p.len());
                p[i] ^= mask;
            }
            Mutation::Set(i, b) if !p.is_empty() => {
                let i = at(*i, p.len());
                p[i] = *b;
            }
            Mutation::Insert(i, bytes) => {
                let i = at(*i, p.len() + 1);
                p.splice(i..i, bytes.iter().copied());
            }
            Mutation::Delete(i, n) if !p.is_empty() => {
                let i = at(*i, p.len());
                let end = (i + n).min(p.len());
                p.drain(i..end);
            }
            Mutation::Truncate(n) => p.truncate(at(*n, p.len() + 1)),
            Mutation::Splice {
                from,
                start,
                len,
                at: to,
            } => {
                let src = &payloads()[from % payloads().len()];
                let s = at(*start, src.len());
                let piece = src[s..(s + len).min(src.len())].to_vec();
                let i = at(*to, p.len() + 1);
                p.splice(i..i, piece);
            }
            Mutation::Huge(i, marker) if !p.is_empty() => {
                let i = at(*i, p.len());
                p[i] = *marker;
                let tail = [0xff; 4];
                let end = (i + 5).min(p.len());
                p.splice(i + 1..end, tail);
            }
            _ => {}
        }
    }
    p
}

/// A fresh router (exact mode) and ingestor with one replaying and one plain source.
fn setup() -> (Router, Ingestor, SourceId, SourceId) {
    let config = RouterConfig {
        index_mode: IndexMode::Exact,
        ..RouterConfig::default()
    };
    let r = Router::new(&["a".to_owned(), "b".to_owned()], PolicyKind::Smetric, 16, 0, config).unwrap();
    let mut ing = Ingestor::new(IngestConfig {
        max_mapped_blocks: 64,
        max_pending_batches: 4,
        ..IngestConfig::default()
    });
    let (a, b) = (ing.add_source("a", true), ing.add_source("b", false));
    (r, ing, a, b)
}

/// The index holds exactly what the sources hold.
fn consistent(r: &Router, ing: &Ingestor) -> Result<(), TestCaseError> {
    let stats = r.stats();
    let local: usize = stats.local_blocks.iter().map(|(_, n)| n).sum();
    prop_assert_eq!(ing.held_blocks(), (local, stats.index.global_blocks));
    Ok(())
}

/// A sink writing through one router call per write (`store_blocks` / `remove_blocks`): the
/// reference that `Router::apply_blocks`, one call per batch, must agree with.
struct PerCall(Router);

impl IndexSink for PerCall {
    fn block_size(&self) -> u32 {
        self.0.block_size()
    }

    fn hash_seed(&self) -> u64 {
        self.0.config().hash_seed
    }

    fn has_instance(&self, instance: &str) -> bool {
        self.0.load(instance).is_ok()
    }

    /// One call per op; a failing op is skipped and the first error returned.
    fn apply(&self, instance: &str, ops: &[IndexOp<'_>]) -> Result<(), SinkError> {
        let mut first_error = None;
        for op in ops {
            let written = match *op {
                IndexOp::Store { tier, hashes, parent } => {
                    let local = (tier == Tier::Local).then_some(instance);
                    self.0.store_blocks(local, tier, hashes, parent, None)
                }
                IndexOp::Remove { tier, hashes } => {
                    self.0
                        .remove_blocks((tier == Tier::Local).then_some(instance), tier, hashes)
                }
            };
            if let Err(e) = written {
                first_error.get_or_insert(SinkError::from(e));
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

/// What an index holds: blocks per instance and global blocks.
fn contents(r: &Router) -> (Vec<usize>, usize) {
    let stats = r.stats();
    (
        stats.local_blocks.iter().map(|(_, n)| *n).collect(),
        stats.index.global_blocks,
    )
}

fn pub_frames(seq: u64, payload: Vec<u8>) -> Vec<Vec<u8>> {
    vec![b"kv@fuzz".to_vec(), seq.to_be_bytes().to_vec(), payload]
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600), headed in any::<bool>()) {
        // A valid `[ts, ...` header gets random bytes past the first byte.
        let payload = if headed {
            let mut p = vec![0x93, 0xcb, 0x41, 0xda, 0x4b, 0x0b, 0xc0, 0, 0, 0];
            p.extend_from_slice(&bytes);
            p
        } else {
            bytes
        };
        if let Ok(batch) = decode_batch(&payload) {
            prop_assert!(batch.events.len() + batch.unknown_events <= payload.len());
        }
        let (r, mut ing, a, b) = setup();
        for src in [a, b] {
            ing.on_message(&r, src, &pub_frames(0, payload.clone())).unwrap();
            ing.on_replay_reply(&r, src, &[Vec::new(), Vec::new(), 1u64.to_be_bytes().to_vec(), payload.clone()])
                .unwrap();
        }
        let frames: Vec<&[u8]> = payload.chunks(7).collect();
        let _ = decode_pub_message(&frames);
        let _ = decode_replay_reply(&frames);
        consistent(&r, &ing)?;
    }

    #[test]
    fn mutated_captures_never_corrupt_the_index(
        picks in proptest::collection::vec((any::<usize>(), proptest::collection::vec(mutation(), 0..6)), 1..6),
    ) {
        let (r, mut ing, a, b) = setup();
        for (seq, (pick, mutations)) in picks.iter().enumerate() {
            let base = &payloads()[pick % payloads().len()];
            let payload = mutate(base, mutations);
            let outcome = decode_batch(&payload);
            let step = ing.on_message(&r, b, &pub_frames(seq as u64, payload)).unwrap();
            prop_assert_eq!(outcome.is_err(), step.error.is_some());
            consistent(&r, &ing)?;
        }
        let s = ing.stats();
        prop_assert_eq!(s.messages, picks.len() as u64);
        prop_assert_eq!(s.batches + s.decode_errors, picks.len() as u64);
        let _ = a;
    }

    #[test]
    fn random_sequences_and_replays_keep_the_index_consistent(
        ops in proptest::collection::vec(
            (0..6u8, any::<usize>(), 0..4u64, proptest::collection::vec(mutation(), 0..2)),
            1..24,
        ),
    ) {
        let (r, mut ing, a, b) = setup();
        let mut seq = 0u64;
        for (op, pick, jump, mutations) in ops {
            let payload = mutate(&payloads()[pick % payloads().len()], &mutations);
            let src = if pick % 3 == 0 { b } else { a };
            match op {
                // Next message, a gap, or the sequence going back (a restart).
                0 | 1 => {
                    seq += if op == 0 { 1 } else { jump };
                    ing.on_message(&r, src, &pub_frames(seq, payload)).unwrap();
                }
                2 => {
                    seq = seq.saturating_sub(jump);
                    ing.on_message(&r, src, &pub_frames(seq, payload)).unwrap();
                }
                // Replay replies in the new and the old layout, end markers, timeouts.
                3 => {
                    let s = seq.saturating_sub(jump).to_be_bytes().to_vec();
                    let frames = if pick % 2 == 0 {
                        vec![Vec::new(), b"t".to_vec(), s, payload]
                    } else {
                        vec![Vec::new(), s, payload]
                    };
                    ing.on_replay_reply(&r, src, &frames).unwrap();
                }
                4 => {
                    let end = vec![Vec::new(), Vec::new(), u64::MAX.to_be_bytes().to_vec(), Vec::new()];
                    ing.on_replay_reply(&r, src, &end).unwrap();
                }
                _ => {
                    ing.on_replay_failed(&r, src).unwrap();
                }
            }
            consistent(&r, &ing)?;
        }
        ing.remove_source(&r, a).unwrap();
        ing.remove_source(&r, b).unwrap();
        consistent(&r, &ing)?;
        let stats = r.stats();
        prop_assert_eq!(stats.local_blocks.iter().map(|(_, n)| n).sum::<usize>() + stats.index.global_blocks, 0);
    }

    #[test]
    fn batched_writes_match_one_call_per_write(
        picks in proptest::collection::vec((any::<usize>(), proptest::collection::vec(mutation(), 0..4)), 1..8),
    ) {
        let (batched, mut ing_batched, _, b) = setup();
        let (per_call, mut ing_per_call, _, b2) = setup();
        let per_call = PerCall(per_call);
        // A source whose instance the router does not have: its local writes are refused.
        let (ghost, ghost2) = (ing_batched.add_source("ghost", false), ing_per_call.add_source("ghost", false));
        for (seq, (pick, mutations)) in picks.iter().enumerate() {
            let payload = mutate(&payloads()[pick % payloads().len()], mutations);
            let (src, src2) = if pick % 4 == 0 { (ghost, ghost2) } else { (b, b2) };
            let one = ing_batched.on_message(&batched, src, &pub_frames(seq as u64, payload.clone())).unwrap();
            let two = ing_per_call.on_message(&per_call, src2, &pub_frames(seq as u64, payload)).unwrap();
            prop_assert_eq!(one, two);
            prop_assert_eq!(ing_batched.stats(), ing_per_call.stats());
            prop_assert_eq!(ing_batched.held_blocks(), ing_per_call.held_blocks());
            prop_assert_eq!(contents(&batched), contents(&per_call.0));
            consistent(&batched, &ing_batched)?;
        }
    }
}
