//! Decodes the frames captured from vLLM 0.33.0's real `ZmqEventPublisher`
//! (`scripts/vllm_golden/capture_events.py`) and compares them with what was published.

use std::fmt::Write as _;
use std::path::PathBuf;

use serde_json::{Value, json};
use smetric_vllm::{
    BlockHasher, EventValue, ExternalBlockHash, HashAlgo, KvEvent, KvEventBatch, KvEventMessage, LoraKey, Medium,
    ReplayReply, RequestKeys, decode_batch, decode_pub_message, decode_replay_reply, encode_batch_to_vec,
};

fn captures() -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/vllm/captured_events.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_str(&text).expect("capture JSON parses")
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

fn frames(message: &Value) -> Vec<Vec<u8>> {
    message["frames"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| unhex(f.as_str().unwrap()))
        .collect()
}

/// Every (stream, message) pair.
fn messages(doc: &Value) -> Vec<(&Value, &Value)> {
    doc["streams"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["messages"].as_array().unwrap().iter().map(move |m| (s, m)))
        .collect()
}

fn hash_json(h: &ExternalBlockHash) -> Value {
    match h {
        ExternalBlockHash::Int(v) => json!({ "int": v }),
        ExternalBlockHash::Bytes(b) => json!({ "bytes": hex(b) }),
    }
}

fn value_json(v: &EventValue) -> Value {
    match v {
        EventValue::Nil => Value::Null,
        EventValue::Bool(b) => json!(b),
        EventValue::Int(i) => json!(i),
        EventValue::UInt(u) => json!(u),
        EventValue::Float(f) => json!(f),
        EventValue::Str(s) => json!(s),
        EventValue::Bytes(b) => json!({ "bytes": hex(b) }),
        EventValue::Array(items) => Value::Array(items.iter().map(value_json).collect()),
        EventValue::Map(pairs) => Value::Array(
            pairs
                .iter()
                .map(|(k, v)| json!([value_json(k), value_json(v)]))
                .collect(),
        ),
    }
}

fn medium_json(m: Option<&Medium>) -> Value {
    m.map_or(Value::Null, |m| json!(m.as_str()))
}

/// The decoded event in the capture file's expected-JSON shape (medium canonicalized).
fn event_json(event: &KvEvent) -> Value {
    match event {
        KvEvent::BlockStored(s) => json!({
            "type": "BlockStored",
            "block_hashes": s.block_hashes.iter().map(hash_json).collect::<Vec<_>>(),
            "parent_block_hash": s.parent_block_hash.as_ref().map(hash_json),
            "token_ids": s.token_ids,
            "block_size": s.block_size,
            "lora_id": s.lora_id,
            "medium": medium_json(s.medium.as_ref()),
            "lora_name": s.lora_name,
            "extra_keys": s.extra_keys.as_ref().map(|keys| keys
                .iter()
                .map(|k| k.as_ref().map(|k| k.iter().map(value_json).collect::<Vec<_>>()))
                .collect::<Vec<_>>()),
            "group_idx": s.group_idx,
            "kv_cache_spec_kind": s.kv_cache_spec_kind,
            "kv_cache_spec_sliding_window": s.kv_cache_spec_sliding_window,
            "locality": s.locality,
            "ownership": s.ownership,
            "session_id": s.session_id,
            "lookahead_token_ids": s.lookahead_token_ids,
        }),
        KvEvent::BlockRemoved(r) => json!({
            "type": "BlockRemoved",
            "block_hashes": r.block_hashes.iter().map(hash_json).collect::<Vec<_>>(),
            "medium": medium_json(r.medium.as_ref()),
            "group_idx": r.group_idx,
            "locality": r.locality,
            "ownership": r.ownership,
        }),
        KvEvent::AllBlocksCleared => json!({ "type": "AllBlocksCleared" }),
    }
}

/// The expected event with `rehash` removed and `medium` canonicalized like [`Medium`].
fn expected_event(e: &Value) -> Value {
    let mut e = e.clone();
    let obj = e.as_object_mut().unwrap();
    obj.remove("rehash");
    if let Some(m) = obj.get_mut("medium")
        && let Some(s) = m.as_str()
    {
        *m = json!(Medium::parse(s).as_str());
    }
    e
}

fn check_batch(id: &str, batch: &KvEventBatch, want: &Value) {
    // Timestamps were chosen exactly representable, so they must round-trip bit for bit.
    let want_ts = want["ts"].as_f64().unwrap();
    assert_eq!(batch.ts.to_bits(), want_ts.to_bits(), "{id}: ts");
    assert_eq!(batch.dp_rank, want["dp_rank"].as_i64(), "{id}: dp rank");
    assert_eq!(batch.unknown_events, 0, "{id}");
    let want_events = want["events"].as_array().unwrap();
    assert_eq!(batch.events.len(), want_events.len(), "{id}: event count");
    for (i, (got, want)) in batch.events.iter().zip(want_events).enumerate() {
        assert_eq!(event_json(got), expected_event(want), "{id}: event {i}");
        if let Some(rehash) = want["rehash"].as_object() {
            check_rehash(&format!("{id}: event {i}"), got, rehash);
        }
    }
}

/// Recomputes the published block hashes from the prompt with this crate's hasher.
fn check_rehash(id: &str, event: &KvEvent, rehash: &serde_json::Map<String, Value>) {
    let KvEvent::BlockStored(stored) = event else {
        panic!("{id}: rehash on a non-BlockStored event");
    };
    let algo: HashAlgo = rehash["algo"].as_str().unwrap().parse().unwrap();
    let block_size = usize::try_from(rehash["block_size"].as_u64().unwrap()).unwrap();
    let hasher = BlockHasher::new(algo, block_size, rehash["seed"].as_str()).unwrap();
    let tokens: Vec<u32> = rehash["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| u32::try_from(t.as_u64().unwrap()).unwrap())
        .collect();
    let keys = RequestKeys {
        lora: rehash["lora"].as_object().map(|l| LoraKey {
            name: l["name"].as_str().unwrap().into(),
            path: l["path"].as_str().unwrap().into(),
        }),
        ..RequestKeys::default()
    };
    let digests = hasher.block_hashes(&tokens, &keys);
    let first = usize::try_from(rehash["first_block"].as_u64().unwrap()).unwrap();
    for (k, published) in stored.block_hashes.iter().enumerate() {
        assert!(published.matches(&digests[first + k]), "{id}: block {}", first + k);
        assert_eq!(published.to_u64(), digests[first + k].event_hash(), "{id}");
    }
    match &stored.parent_block_hash {
        None => assert_eq!(first, 0, "{id}: parent missing"),
        Some(parent) => assert!(parent.matches(&digests[first - 1]), "{id}: parent"),
    }
}

fn check_message(id: &str, msg: &KvEventMessage, want: &Value) {
    assert_eq!(msg.topic, want["topic"].as_str().unwrap(), "{id}: topic");
    assert_eq!(msg.seq, want["seq"].as_u64().unwrap(), "{id}: seq");
    check_batch(id, &msg.batch, &want["batch"]);
}

#[test]
fn every_captured_message_decodes_to_what_was_published() {
    let doc = captures();
    assert_eq!(doc["vllm_version"], "0.33.0");
    let mut checked = 0;
    for (stream, message) in messages(&doc) {
        let id = stream["name"].as_str().unwrap();
        let frames = frames(message);
        let want = &message["expected"];
        if stream["socket"] == "DEALER" {
            match decode_replay_reply(&frames).unwrap_or_else(|e| panic!("{id}: {e}")) {
                ReplayReply::End => assert_eq!(want["end"], true, "{id}: unexpected end"),
                ReplayReply::Batch(msg) => {
                    assert_eq!(want["end"], false, "{id}: missed end marker");
                    check_message(id, &msg, want);
                }
            }
        } else {
            let msg = decode_pub_message(&frames).unwrap_or_else(|e| panic!("{id}: {e}"));
            check_message(id, &msg, want);
        }
        checked += 1;
    }
    assert!(checked >= 20, "only {checked} messages");
}

#[test]
fn captures_cover_both_forms_media_ranks_and_replay() {
    let doc = captures();
    let streams = doc["streams"].as_array().unwrap();
    for form in ["map", "array"] {
        assert!(
            streams.iter().any(|s| s["form"] == form && s["socket"] == "SUB"),
            "{form}"
        );
        assert!(
            streams.iter().any(|s| s["form"] == form && s["socket"] == "DEALER"),
            "{form}"
        );
    }
    let mut media = Vec::new();
    let mut ranks = Vec::new();
    let mut types = Vec::new();
    let mut int_and_bytes = (false, false);
    for (_, message) in messages(&doc) {
        let batch = &message["expected"]["batch"];
        ranks.push(batch["dp_rank"].clone());
        for e in batch["events"].as_array().into_iter().flatten() {
            types.push(e["type"].as_str().unwrap().to_owned());
            if let Some(m) = e["medium"].as_str() {
                media.push(m.to_owned());
            }
            for h in e["block_hashes"].as_array().into_iter().flatten() {
                int_and_bytes.0 |= h["int"].is_u64();
                int_and_bytes.1 |= h["bytes"].is_string();
            }
        }
    }
    for m in ["GPU", "CPU", "cpu", "STORAGE", "gpu"] {
        assert!(media.iter().any(|x| x == m), "medium {m}");
    }
    for t in ["BlockStored", "BlockRemoved", "AllBlocksCleared"] {
        assert!(types.iter().any(|x| x == t), "type {t}");
    }
    assert!(ranks.contains(&json!(1)) && ranks.contains(&json!(0)));
    assert_eq!(int_and_bytes, (true, true));
}

#[test]
fn truncated_captured_payloads_are_errors_not_panics() {
    let doc = captures();
    for (stream, message) in messages(&doc) {
        let frames = frames(message);
        let payload = frames.last().unwrap();
        if payload.is_empty() {
            continue;
        }
        for cut in 0..payload.len() {
            assert!(
                decode_batch(&payload[..cut]).is_err(),
                "{}: prefix of {cut} bytes decoded",
                stream["name"]
            );
        }
        let mut longer = payload.clone();
        longer.push(0xc0);
        assert!(decode_batch(&longer).is_err(), "trailing byte accepted");
    }
}

#[test]
fn corrupted_captured_payloads_never_panic() {
    let doc = captures();
    let payloads: Vec<Vec<u8>> = messages(&doc)
        .into_iter()
        .map(|(_, m)| frames(m).pop().unwrap())
        .filter(|p| !p.is_empty())
        .take(12)
        .collect();
    for payload in payloads {
        for i in 0..payload.len() {
            for flip in [0x01, 0x10, 0x80, 0xff] {
                let mut bad = payload.clone();
                bad[i] ^= flip;
                // Any outcome but a panic is fine; a surviving decode must still be consistent.
                if let Ok(batch) = decode_batch(&bad) {
                    assert!(batch.events.len() <= bad.len());
                }
            }
        }
    }
}

/// The encoder the simulator publishes with writes exactly vLLM's bytes: every captured
/// map-form payload decodes and re-encodes to the identical bytes. The decoder upper-cases
/// media (`"cpu"` → CPU), so payloads with a non-canonical medium string are skipped.
#[test]
fn map_form_payloads_re_encode_to_vllms_exact_bytes() {
    let doc = captures();
    let mut identical = 0;
    for (stream, message) in messages(&doc) {
        let id = stream["name"].as_str().unwrap();
        if stream["form"] != "map" {
            continue;
        }
        let frames = frames(message);
        let batch = if stream["socket"] == "DEALER" {
            match decode_replay_reply(&frames).unwrap() {
                ReplayReply::End => continue,
                ReplayReply::Batch(msg) => msg.batch,
            }
        } else {
            decode_pub_message(&frames).unwrap().batch
        };
        let canonical = batch.events.iter().all(|e| {
            let medium = match e {
                KvEvent::BlockStored(s) => s.medium.as_ref(),
                KvEvent::BlockRemoved(r) => r.medium.as_ref(),
                KvEvent::AllBlocksCleared => None,
            };
            medium.is_none_or(|m| !matches!(m, Medium::Other(_)))
        });
        let payload = frames.last().unwrap();
        let lower_case = |m: &[u8]| payload.windows(4).any(|w| w[0] == 0xa3 && &w[1..] == m);
        if !canonical || lower_case(b"cpu") || lower_case(b"gpu") {
            continue;
        }
        assert_eq!(hex(&encode_batch_to_vec(&batch)), hex(payload), "{id}");
        identical += 1;
    }
    assert!(identical >= 10, "only {identical} payloads compared");
}
