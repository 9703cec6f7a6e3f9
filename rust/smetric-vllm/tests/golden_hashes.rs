//! Checks every golden vector produced by the real vLLM 0.33.0
//! (`scripts/vllm_golden/generate.py`) against this crate's hashers.

use std::fmt::Write as _;
use std::path::PathBuf;

use serde_json::Value;
use smetric_vllm::{
    BlockDigest, BlockHasher, ExtraKey, HashAlgo, LoraKey, MmPlaceholder, RequestKeys, event_hash, none_hash,
};

fn golden() -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/vllm/golden_hashes.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_str(&text).expect("golden JSON parses")
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

fn tokens(v: &Value) -> Vec<u32> {
    if let Some(list) = v["tokens"].as_array() {
        return list
            .iter()
            .map(|t| u32::try_from(t.as_u64().expect("int token")).expect("u32 token"))
            .collect();
    }
    let r = &v["tokens_range"];
    let (start, step, count) = (
        r["start"].as_u64().unwrap(),
        r["step"].as_u64().unwrap(),
        r["count"].as_u64().unwrap(),
    );
    (0..count).map(|i| u32::try_from(start + i * step).unwrap()).collect()
}

fn hasher(v: &Value, block_size: usize) -> BlockHasher {
    let algo: HashAlgo = v["algo"].as_str().unwrap().parse().unwrap();
    BlockHasher::new(algo, block_size, v["seed"].as_str()).unwrap()
}

fn request_keys(v: &Value) -> RequestKeys {
    let lora = v["lora"].as_object().map(|l| LoraKey {
        name: l["name"].as_str().unwrap().to_owned(),
        path: l["path"].as_str().unwrap().to_owned(),
    });
    let mm = v["mm"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| MmPlaceholder {
            identifier: m["identifier"].as_str().unwrap().to_owned(),
            offset: usize::try_from(m["offset"].as_u64().unwrap()).unwrap(),
            length: usize::try_from(m["length"].as_u64().unwrap()).unwrap(),
        })
        .collect();
    RequestKeys {
        lora,
        cache_salt: v["cache_salt"].as_str().map(str::to_owned),
        mm,
    }
}

/// Checks one vector; returns a description of the mismatch, if any.
fn check(v: &Value) -> Option<String> {
    let id = v["id"].as_str().unwrap();
    let toks = tokens(v);
    match v["kind"].as_str().unwrap() {
        "request" => {
            let block_size = usize::try_from(v["block_size"].as_u64().unwrap()).unwrap();
            let digests = hasher(v, block_size).block_hashes(&toks, &request_keys(v));
            let got: Vec<String> = digests.iter().map(|d| hex(d.as_bytes())).collect();
            let want: Vec<&str> = v["hashes"]
                .as_array()
                .unwrap()
                .iter()
                .map(|h| h.as_str().unwrap())
                .collect();
            if got != want {
                return Some(format!("{id}: hashes {got:?} != {want:?}"));
            }
            let got_ints: Vec<u64> = digests.iter().map(BlockDigest::event_hash).collect();
            let want_ints: Vec<u64> = v["event_hashes"]
                .as_array()
                .unwrap()
                .iter()
                .map(|h| h.as_u64().unwrap())
                .collect();
            (got_ints != want_ints).then(|| format!("{id}: event hashes {got_ints:?} != {want_ints:?}"))
        }
        "block" => {
            let parent = v["parent"]
                .as_str()
                .map(|p| BlockDigest::from_bytes(&unhex(p)).unwrap());
            let raw_keys: Vec<Vec<Value>> = v["extra_keys"]
                .as_array()
                .map(|keys| keys.iter().map(|k| k.as_array().unwrap().clone()).collect())
                .unwrap_or_default();
            let byte_values: Vec<Vec<u8>> = raw_keys
                .iter()
                .map(|k| k.get(1).and_then(|x| x["hex"].as_str()).map(unhex).unwrap_or_default())
                .collect();
            let keys: Vec<ExtraKey<'_>> = raw_keys
                .iter()
                .zip(&byte_values)
                .map(|(k, bytes)| match k[0].as_str().unwrap() {
                    "lora" => ExtraKey::Lora {
                        name: k[1].as_str().unwrap(),
                        path: k[2].as_str().unwrap(),
                    },
                    "mm" => ExtraKey::Mm {
                        identifier: k[1].as_str().unwrap(),
                        offset: k[2].as_i64().unwrap(),
                    },
                    "cache_salt" => ExtraKey::CacheSalt(k[1].as_str().unwrap()),
                    "prompt_embeds" => ExtraKey::PromptEmbeds(bytes),
                    other => panic!("{id}: unknown key tag {other}"),
                })
                .collect();
            let digest = hasher(v, toks.len().max(1)).hash_block(parent.as_ref(), &toks, &keys);
            let want = v["digest"].as_str().unwrap();
            if hex(digest.as_bytes()) != want {
                return Some(format!("{id}: digest {digest:x} != {want}"));
            }
            let want_int = v["event_hash"].as_u64().unwrap();
            (digest.event_hash() != want_int).then(|| format!("{id}: event hash {} != {want_int}", digest.event_hash()))
        }
        other => Some(format!("{id}: unknown kind {other}")),
    }
}

#[test]
fn every_golden_vector_matches_vllm() {
    let doc = golden();
    assert_eq!(doc["vllm_version"], "0.33.0");
    let vectors = doc["vectors"].as_array().unwrap();
    let failures: Vec<String> = vectors.iter().filter_map(check).collect();
    assert!(
        failures.is_empty(),
        "{} of {} vectors differ:\n{}",
        failures.len(),
        vectors.len(),
        failures.join("\n")
    );
}

#[test]
fn none_hashes_match_vllm() {
    let doc = golden();
    for entry in doc["none_hashes"].as_array().unwrap() {
        let algo: HashAlgo = entry["algo"].as_str().unwrap().parse().unwrap();
        let seed = entry["seed"].as_str().unwrap_or(smetric_vllm::DEFAULT_NONE_HASH_SEED);
        let got = none_hash(algo, seed);
        assert_eq!(
            hex(got.as_bytes()),
            entry["digest"].as_str().unwrap(),
            "{algo} seed {seed}"
        );
        let hasher = BlockHasher::new(algo, 16, entry["seed"].as_str()).unwrap();
        assert_eq!(hasher.none_hash(), &got);
    }
}

#[test]
fn golden_set_covers_the_contract() {
    let doc = golden();
    let vectors = doc["vectors"].as_array().unwrap();
    assert!(vectors.len() >= 200, "only {} vectors", vectors.len());
    for algo in HashAlgo::ALL {
        let of_algo: Vec<&Value> = vectors.iter().filter(|v| v["algo"] == algo.as_str()).collect();
        assert!(of_algo.len() >= 40, "{algo}: {} vectors", of_algo.len());
        let all_tokens: Vec<u32> = of_algo.iter().flat_map(|v| tokens(v)).collect();
        for t in [255, 256, 65535, 65536, (1 << 31) - 1, 1 << 31, u32::MAX] {
            assert!(all_tokens.contains(&t), "{algo}: no token {t}");
        }
        for bs in 1..=3 {
            assert!(
                of_algo.iter().any(|v| v["block_size"] == bs),
                "{algo}: no block size {bs}"
            );
        }
        let has = |pred: &dyn Fn(&Value) -> bool| of_algo.iter().any(|v| pred(v));
        assert!(
            has(&|v| v["lora"].is_object() && v["cache_salt"].is_string()),
            "{algo}: LoRA+salt"
        );
        assert!(has(&|v| v["mm"].as_array().is_some_and(|m| m.len() > 1)), "{algo}: mm");
        assert!(has(&|v| v["kind"] == "block"), "{algo}: block vectors");
    }
}

#[test]
fn event_hash_is_the_int_vllm_publishes() {
    let doc = golden();
    for v in doc["vectors"].as_array().unwrap() {
        if let (Some(hashes), Some(ints)) = (v["hashes"].as_array(), v["event_hashes"].as_array()) {
            for (h, i) in hashes.iter().zip(ints) {
                assert_eq!(event_hash(&unhex(h.as_str().unwrap())), i.as_u64().unwrap());
            }
        }
    }
}
