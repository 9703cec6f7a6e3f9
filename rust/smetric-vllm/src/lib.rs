//! vLLM wire compatibility for smetric: byte-identical prefix-cache block hashes, typed
//! decoding of vLLM's KV-cache events, and the router's parse of OpenAI request bodies. Pure
//! Rust, no Python.
//!
//! # Block hashes ([`hash`])
//! [`BlockHasher`] reproduces vLLM 0.33's `hash_block_tokens` chain for all four
//! `--prefix-caching-hash-algo` values ([`HashAlgo`]): it serializes
//! `(parent_digest, tuple(tokens), extra_keys)` exactly as CPython's pickle protocol 5 or
//! `cbor2.dumps(canonical=True)` would, then digests it with SHA-256 or XXH3-128. The root
//! parent is `NONE_HASH = hash_fn(seed)` with the engine's `PYTHONHASHSEED` or
//! [`DEFAULT_NONE_HASH_SEED`]. Tagged extra keys ([`RequestKeys`], [`ExtraKey`]) cover LoRA
//! adapters, the cache salt (first block only), multimodal items and prompt embeddings.
//! [`event_hash`] folds a digest into the 64-bit int vLLM publishes in events.
//!
//! Invariants: only full blocks are hashed; digest `i` identifies the whole prefix up to the
//! end of block `i`. Complexity: O(n) for n tokens, one digest per block.
//!
//! Correctness is pinned by golden vectors generated with the real vLLM 0.33.0
//! (`tests/data/vllm/golden_hashes.json`, see `scripts/vllm_golden/`).
//!
//! # KV events ([`events`], [`frames`])
//! [`decode_batch`] turns a `KVEventBatch` msgpack payload into a [`KvEventBatch`] of typed
//! [`KvEvent`]s, accepting both the ≤0.23 positional (array) and the ≥0.24 map encoding of
//! events. [`decode_pub_message`] and [`decode_replay_reply`] add the ZMQ frame layer (topic,
//! big-endian sequence number, replay end marker).
//!
//! Invariants: decoding never panics; malformed input is a typed [`DecodeError`]; allocations
//! are bounded by the input length and [`DecodeOptions`]. Complexity: O(payload size).
//!
//! # Ingestion ([`ingest`])
//! [`Ingestor`] applies decoded event streams of many publishers to a `smetric_core::Router`
//! (any [`IndexSink`]): engine hashes are mapped to smetric's own block hashes through the
//! token ids of `BlockStored`, GPU blocks go to the instance's tier and CPU/STORAGE blocks to
//! the global tier, and sequence gaps trigger a replay or a reset of the source. A batch is
//! decoded into reused buffers and its index writes reach the router in one
//! `Router::apply_blocks` call. Counters: [`IngestStats`]. The socket loop lives in Python
//! (`smetric.events`).
//!
//! # OpenAI request bodies ([`openai_body`])
//! [`parse_openai_body`] reads the fields of a `/v1/chat/completions` or `/v1/completions` body
//! that a router needs (the prompt or messages, `cache_salt`, the session keys, `max_tokens`, …)
//! in one `serde_json` pass, keeping the rest unparsed; a flat list of token ids is read into a
//! `Vec<u32>` by a byte loop. Every failure is a [`BodyError`] naming its field. The proxy
//! (`smetric serve`) parses each request with it, through the bindings.
//! [`escapes_lone_surrogate`] ([`lone_surrogate`]) is the check of any API's JSON body for an
//! escaped lone UTF-16 surrogate, which engines decode and then fail on.
//!
//! # Engine load ([`load_metrics`])
//! [`load_metrics::engine_sample`] reads an engine's load (running, waiting, KV usage, the
//! prefix-cache counters) from its `/metrics` page in one pass that parses only the lines it
//! needs; [`load_metrics::samples`] is the Prometheus text parse under it. The load scraper
//! (`smetric-gateway`'s `engine_load`) runs it every period.
//!
//! ```
//! use smetric_vllm::{BlockHasher, HashAlgo, RequestKeys};
//!
//! let hasher = BlockHasher::new(HashAlgo::Sha256, 16, None).unwrap();
//! let tokens: Vec<u32> = (1000..1016).collect();
//! let keys = hasher.event_hashes(&tokens, &RequestKeys::default());
//! assert_eq!(keys, [7_322_446_309_363_477_352]);
//! ```

#![warn(missing_docs)]

mod cbor;
pub mod events;
pub mod frames;
pub mod hash;
pub mod ingest;
pub mod load_metrics;
pub mod lone_surrogate;
mod msgpack;
mod obj;
pub mod openai_body;
mod pickle;
#[cfg(test)]
mod test_msgpack;

pub use events::{
    BlockExtraKeys, BlockRemoved, BlockStored, DecodeError, DecodeOptions, EventValue, ExternalBlockHash, KvEvent,
    KvEventBatch, Medium, decode_batch, encode_batch, encode_batch_to_vec,
};
#[doc(hidden)]
pub use events::{DecodeBuffers, decode_reusing};
pub use frames::{END_SEQ, KvEventMessage, ReplayReply, decode_pub_message, decode_replay_reply, replay_request};
pub use hash::{
    BlockDigest, BlockHasher, DEFAULT_NONE_HASH_SEED, EmptyNamespacePart, ExtraKey, HashAlgo, HashError, LoraKey,
    MmPlaceholder, RequestKeys, cache_namespace, event_hash, none_hash,
};
pub use ingest::{
    IndexSink, IngestConfig, IngestStats, Ingestor, Offload, RouterAt, SinkError, SourceId, Step, UnknownSource,
};
pub use lone_surrogate::escapes_lone_surrogate;
pub use openai_body::{
    BodyError, Endpoint, OpenAiBody, Prompt, json_syntax_error, parse_chat_body_with, parse_openai_body,
};
