//! What the simulated engines tell the router about their caches, and how it gets there.
//!
//! A real fleet keeps the router's KV$ index in step with the engines through vLLM's KV-cache
//! events (`BlockStored` / `BlockRemoved` over ZMQ). The simulator can feed its router three
//! ways ([`IndexFeed`]), so a report can put them side by side:
//!
//! * **approximate** — no events: the router inserts a request's blocks into its own index
//!   when it routes it and ages them out by capacity (LRU) and TTL. It never sees an eviction.
//! * **events** — every engine logs its cache changes as vLLM does (the block pool: blocks
//!   newly cached, one `BlockRemoved` per evicted block; the tier connector: blocks it put into
//!   the global store and, later, their removal). At the end of each engine step the log is
//!   encoded as the msgpack `KVEventBatch` vLLM's `ZmqEventPublisher` sends (`smetric_vllm::
//!   encode_batch`, byte-identical to vLLM 0.33's), framed `[topic, seq, payload]`, and
//!   delivered `delay_s` later to the production ingestor (`smetric_vllm::Ingestor`), which
//!   maps engine hashes to smetric's own through the token ids and writes the router's exact
//!   index. Routing then uses smetric's token-derived hashes, as in production.
//! * **oracle** — the same changes are written into the router's exact index the instant the
//!   engine makes them, with no encoding, batching or delay: the best any event feed can do.
//!
//! Trace blocks have ids, not tokens. [`block_tokens`] turns an id into a deterministic token
//! block (ids below a Qwen-sized vocabulary), the same on the engine side (event payloads) and
//! the router side (the prompt it routes), so the ingestor's token-based mapping is exercised
//! for real. Distinct ids give distinct blocks with probability 1 − 2^-250 per pair.
//!
//! Ownership of the global store: the instance whose write first put a block in the store
//! announces it (`BlockStored`, medium CPU) and announces its eviction (`BlockRemoved`, CPU),
//! whoever caused it; a write that only refreshes a stored block announces nothing. Each
//! store block therefore has exactly one announcing source, so the ingestor's per-source
//! reference counts keep the router's global tier equal to the store.
//!
//! Invariants: a [`CacheLog`] records changes in the order the engine made them; a run of
//! `Stored` hashes is a contiguous piece of one request's chain and `parent` is the chain
//! block before it (`None` at the chain start). Complexity: O(1) amortised per change; the
//! token synthesis is O(block) per published block.

use std::ops::Range;

use smetric_core::rng::{GOLDEN_GAMMA, mix64};
use smetric_vllm::{BlockRemoved, BlockStored, ExternalBlockHash, KvEvent, KvEventBatch, encode_batch};

/// How the simulated router's KV$ index is fed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum IndexFeed {
    /// Insert on route; the router never hears from the engines (the default, as before).
    #[default]
    Approximate,
    /// vLLM KV-event batches through the real encoder and ingestor, after a delay.
    Events,
    /// The engines' changes written into the index at the instant they happen.
    Oracle,
}

/// Serialised by name (`"approximate"`, `"events"`, `"oracle"`).
impl serde::Serialize for IndexFeed {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl IndexFeed {
    /// Every feed, in report order.
    pub const ALL: [Self; 3] = [Self::Approximate, Self::Events, Self::Oracle];

    /// Report name: `approximate`, `events`, `oracle`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Approximate => "approximate",
            Self::Events => "events",
            Self::Oracle => "oracle",
        }
    }

    /// Parses a report name (also `event-fed` / `event_fed` for `events`).
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "approximate" => Some(Self::Approximate),
            "events" | "event-fed" | "event_fed" => Some(Self::Events),
            "oracle" => Some(Self::Oracle),
            _ => None,
        }
    }

    /// Whether the engines log their cache changes.
    pub(crate) fn logs_changes(self) -> bool {
        self != Self::Approximate
    }
}

/// Tier of a change: the engine's GPU pool or the global CPU store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Medium {
    /// The instance's GPU prefix cache (`medium: "GPU"`).
    Gpu,
    /// The global store (`medium: "CPU"`).
    Cpu,
}

/// One logged change: blocks `hashes` (a range of [`CacheLog::hashes`]) entered or left a tier.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheChange {
    /// Stored (`true`) or removed.
    pub stored: bool,
    /// Which tier.
    pub medium: Medium,
    /// For a store: the chain block before the first one.
    pub parent: Option<u64>,
    /// The blocks, as a range of [`CacheLog::hashes`].
    pub hashes: Range<usize>,
}

/// An engine's cache changes since its last publication, in order.
#[derive(Clone, Debug, Default)]
pub struct CacheLog {
    enabled: bool,
    hashes: Vec<u64>,
    changes: Vec<CacheChange>,
}

impl CacheLog {
    /// A log that records (`enabled`) or ignores every change.
    pub fn new(enabled: bool) -> Self {
        Self {
            enabled,
            ..Self::default()
        }
    }

    /// Records that `hashes` (a contiguous piece of one chain, after `parent`) were stored.
    pub fn stored(&mut self, medium: Medium, parent: Option<u64>, hashes: &[u64]) {
        if !self.enabled || hashes.is_empty() {
            return;
        }
        let start = self.hashes.len();
        self.hashes.extend_from_slice(hashes);
        self.changes.push(CacheChange {
            stored: true,
            medium,
            parent,
            hashes: start..self.hashes.len(),
        });
    }

    /// Records that `hash` left `medium`. GPU removals stay one block per change, as vLLM's
    /// block pool sends them; CPU removals join the previous CPU removal.
    pub fn removed(&mut self, medium: Medium, hash: u64) {
        if !self.enabled {
            return;
        }
        self.hashes.push(hash);
        let end = self.hashes.len();
        if medium == Medium::Cpu
            && let Some(last) = self.changes.last_mut()
            && !last.stored
            && last.medium == Medium::Cpu
            && last.hashes.end + 1 == end
        {
            last.hashes.end = end;
            return;
        }
        self.changes.push(CacheChange {
            stored: false,
            medium,
            parent: None,
            hashes: end - 1..end,
        });
    }

    /// True when nothing is recorded.
    pub fn is_empty(&self) -> bool {
        self.changes.is_empty()
    }

    /// The recorded changes, in order.
    pub fn changes(&self) -> &[CacheChange] {
        &self.changes
    }

    /// The blocks of `change`.
    pub fn blocks(&self, change: &CacheChange) -> &[u64] {
        &self.hashes[change.hashes.clone()]
    }

    /// Forgets everything recorded (keeps the buffers).
    pub fn clear(&mut self) {
        self.hashes.clear();
        self.changes.clear();
    }
}

/// Token ids are drawn below this bound (Qwen's vocabulary size), so payloads have the byte
/// size of real ones.
pub const VOCAB: u32 = 151_936;

/// Appends the `block_tokens` token ids standing for trace block `id` to `out`.
pub fn block_tokens(id: u64, block_tokens: u32, out: &mut Vec<u32>) {
    for j in 0..u64::from(block_tokens) {
        let z = mix64(id ^ j.wrapping_mul(GOLDEN_GAMMA));
        // Multiply-shift range reduction (no division): (z_hi · VOCAB) >> 32 < VOCAB.
        out.push(u32::try_from(((z >> 32) * u64::from(VOCAB)) >> 32).unwrap_or(0));
    }
}

/// One published ZMQ message: `[topic, seq (8 bytes big-endian), payload]`.
pub type Frames = [Vec<u8>; 3];

/// The engine side of the event feed: turns each instance's [`CacheLog`] into the frames
/// vLLM's `ZmqEventPublisher` would send (topic `""`, per-instance sequence from 0, data
/// parallel rank 0).
#[derive(Debug)]
pub struct EventPublisher {
    block_tokens: u32,
    next_seq: Vec<u64>,
    batch: KvEventBatch,
    /// Messages published.
    pub batches: u64,
    /// Events in them.
    pub events: u64,
    /// Payload bytes.
    pub bytes: u64,
}

impl EventPublisher {
    /// A publisher for `instances` engines with `block_tokens`-token blocks.
    pub fn new(instances: u32, block_tokens: u32) -> Self {
        Self {
            block_tokens,
            next_seq: vec![0; instances as usize],
            batch: KvEventBatch::default(),
            batches: 0,
            events: 0,
            bytes: 0,
        }
    }

    /// Encodes `log` as instance `instance`'s next message at time `now`; `None` when the
    /// log is empty (an engine publishes nothing for a step that changed nothing).
    pub fn publish(&mut self, instance: u32, log: &CacheLog, now: f64) -> Option<Frames> {
        if log.is_empty() {
            return None;
        }
        self.batch.ts = now;
        self.batch.dp_rank = Some(0);
        self.batch.events.clear();
        for change in log.changes() {
            let blocks = log.blocks(change);
            let medium = Some(match change.medium {
                Medium::Gpu => smetric_vllm::Medium::Gpu,
                Medium::Cpu => smetric_vllm::Medium::Cpu,
            });
            let hashes = blocks.iter().map(|&h| ExternalBlockHash::Int(h)).collect();
            let event = if change.stored {
                let mut token_ids = Vec::with_capacity(blocks.len() * self.block_tokens as usize);
                for &h in blocks {
                    block_tokens(h, self.block_tokens, &mut token_ids);
                }
                KvEvent::BlockStored(Box::new(BlockStored {
                    block_hashes: hashes,
                    parent_block_hash: change.parent.map(ExternalBlockHash::Int),
                    token_ids,
                    block_size: self.block_tokens,
                    medium,
                    ..BlockStored::default()
                }))
            } else {
                KvEvent::BlockRemoved(BlockRemoved {
                    block_hashes: hashes,
                    medium,
                    ..BlockRemoved::default()
                })
            };
            self.batch.events.push(event);
        }
        let mut payload = Vec::new();
        encode_batch(&self.batch, &mut payload);
        let seq = &mut self.next_seq[instance as usize];
        let frames = [Vec::new(), seq.to_be_bytes().to_vec(), payload];
        *seq += 1;
        self.batches += 1;
        self.events += self.batch.events.len() as u64;
        self.bytes += frames[2].len() as u64;
        Some(frames)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_keeps_order_and_merges_cpu_removals_only() {
        let mut log = CacheLog::new(true);
        log.stored(Medium::Gpu, None, &[1, 2]);
        log.removed(Medium::Gpu, 7);
        log.removed(Medium::Gpu, 8);
        log.removed(Medium::Cpu, 3);
        log.removed(Medium::Cpu, 4);
        log.stored(Medium::Cpu, Some(2), &[5]);
        let got: Vec<(bool, Medium, Vec<u64>)> = log
            .changes()
            .iter()
            .map(|c| (c.stored, c.medium, log.blocks(c).to_vec()))
            .collect();
        assert_eq!(
            got,
            [
                (true, Medium::Gpu, vec![1, 2]),
                (false, Medium::Gpu, vec![7]),
                (false, Medium::Gpu, vec![8]),
                (false, Medium::Cpu, vec![3, 4]),
                (true, Medium::Cpu, vec![5]),
            ]
        );
        assert_eq!(log.changes()[4].parent, Some(2));
        log.clear();
        assert!(log.is_empty());
        let mut off = CacheLog::new(false);
        off.stored(Medium::Gpu, None, &[1]);
        off.removed(Medium::Gpu, 1);
        assert!(off.is_empty());
    }

    #[test]
    fn block_tokens_are_deterministic_distinct_and_in_vocab() {
        let (mut a, mut b, mut c) = (Vec::new(), Vec::new(), Vec::new());
        block_tokens(42, 64, &mut a);
        block_tokens(42, 64, &mut b);
        block_tokens(43, 64, &mut c);
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_eq!(a.len(), 64);
        assert!(a.iter().chain(&c).all(|&t| t < VOCAB));
    }

    #[test]
    fn published_frames_decode_to_the_logged_changes() {
        let mut log = CacheLog::new(true);
        log.stored(Medium::Gpu, Some(9), &[1, 2]);
        log.removed(Medium::Cpu, 3);
        let mut publisher = EventPublisher::new(2, 4);
        assert!(publisher.publish(1, &CacheLog::new(true), 0.0).is_none());
        let frames = publisher.publish(1, &log, 2.5).unwrap();
        let second = publisher.publish(1, &log, 3.0).unwrap();
        let msg = smetric_vllm::decode_pub_message(&frames).unwrap();
        assert_eq!((msg.topic.as_str(), msg.seq), ("", 0));
        assert_eq!(smetric_vllm::decode_pub_message(&second).unwrap().seq, 1);
        assert!((msg.batch.ts - 2.5).abs() < 1e-12);
        let KvEvent::BlockStored(stored) = &msg.batch.events[0] else {
            panic!("not a store")
        };
        assert_eq!(
            stored.block_hashes,
            [ExternalBlockHash::Int(1), ExternalBlockHash::Int(2)]
        );
        assert_eq!(stored.parent_block_hash, Some(ExternalBlockHash::Int(9)));
        let mut want = Vec::new();
        block_tokens(1, 4, &mut want);
        block_tokens(2, 4, &mut want);
        assert_eq!(stored.token_ids, want);
        assert_eq!(stored.medium, Some(smetric_vllm::Medium::Gpu));
        assert!(
            matches!(&msg.batch.events[1], KvEvent::BlockRemoved(r) if r.medium == Some(smetric_vllm::Medium::Cpu))
        );
        assert_eq!((publisher.batches, publisher.events), (2, 4));
    }

    #[test]
    fn feeds_parse_their_names() {
        for feed in IndexFeed::ALL {
            assert_eq!(IndexFeed::parse(feed.name()), Some(feed));
        }
        assert_eq!(IndexFeed::parse("event-fed"), Some(IndexFeed::Events));
        assert_eq!(IndexFeed::parse("exact"), None);
    }
}
