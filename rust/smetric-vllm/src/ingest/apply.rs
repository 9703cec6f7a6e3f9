//! One source's events applied to the router's index.
//!
//! # Algorithm
//! * `BlockStored` with token ids: the smetric chain is rebuilt from the tokens — the parent's
//!   smetric hash comes from the engine map (no parent: the chain root of the router's seed and
//!   the event's LoRA name as namespace) — and stored in the tier of the event's medium; each
//!   engine hash is mapped to the smetric blocks it covers. An engine block of `k` router
//!   blocks maps to `k` smetric blocks. The engine's own hash algorithm and seed never matter.
//! * `BlockStored` without token ids (offloading placeholders): each engine hash already mapped
//!   is stored again in the event's tier; the others are counted as unmapped.
//! * `BlockRemoved`: each mapped hash loses the event's tier; blocks no source holds in that
//!   holder any more are removed from the index.
//! * `AllBlocksCleared`: every block the source holds on the GPU leaves the instance's tier.
//!
//! Media: GPU (or none, as before vLLM 0.24) → the instance's local tier; CPU and STORAGE →
//! the global tier; matched case-insensitively by the decoder. Only KV-cache group 0 is followed.
//!
//! # Complexity
//! O(tokens + hashes) per event; a clear is O(mapped blocks of the source).

use std::sync::Arc;

use smetric_core::hash::{chain_root, hash_block};
use smetric_core::{BlockHash, Tier};

use super::map::{CPU, EngineMap, GPU, Gone, Refs, STORAGE};
use super::{IndexSink, IngestStats, SinkError};
use crate::events::{BlockExtraKeys, BlockRemoved, BlockStored, EventValue, KvEvent, KvEventBatch, Medium};

/// The part of a source that events change.
#[derive(Debug)]
pub(super) struct Feed {
    pub(super) instance: Arc<str>,
    pub(super) holder: u32,
    pub(super) map: EngineMap,
    pub(super) stats: IngestStats,
}

fn tier_bit(medium: Option<&Medium>) -> Option<u8> {
    match medium {
        None | Some(Medium::Gpu) => Some(GPU),
        Some(Medium::Cpu) => Some(CPU),
        Some(Medium::Storage) => Some(STORAGE),
        Some(Medium::Other(_)) => None,
    }
}

/// Whether a block's extra keys are nothing smetric's chain lacks: none, or the LoRA name.
fn plain_block(keys: Option<&BlockExtraKeys>, lora_name: Option<&str>) -> bool {
    match keys {
        None | Some(None) => true,
        Some(Some(keys)) => match (keys.as_slice(), lora_name) {
            ([], _) => true,
            ([EventValue::Str(s)], Some(lora)) => s == lora,
            _ => false,
        },
    }
}

impl Feed {
    fn tier_of(&self, bit: u8) -> (Option<&str>, Tier) {
        if bit == GPU {
            (Some(&self.instance), Tier::Local)
        } else {
            (None, Tier::Global)
        }
    }

    fn sink_ok(&mut self, result: &Result<(), SinkError>) -> bool {
        match result {
            Ok(()) => true,
            Err(SinkError::UnknownInstance) => {
                self.stats.unknown_instances += 1;
                false
            }
            Err(SinkError::Other(_)) => {
                self.stats.sink_errors += 1;
                false
            }
        }
    }

    /// Applies every event of a batch.
    pub(super) fn apply<S: IndexSink + ?Sized>(&mut self, batch: &KvEventBatch, refs: &mut Refs, sink: &S) {
        self.stats.batches += 1;
        self.stats.unknown_event_types += batch.unknown_events as u64;
        for event in &batch.events {
            self.stats.events += 1;
            let mut gone = Gone::default();
            match event {
                KvEvent::BlockStored(stored) => self.stored(stored, refs, sink, &mut gone),
                KvEvent::BlockRemoved(removed) => self.removed(removed, refs, &mut gone),
                KvEvent::AllBlocksCleared => {
                    self.stats.cleared += 1;
                    self.map.lose_all(refs, self.holder, GPU, &mut gone);
                }
            }
            self.flush(&gone, sink);
        }
        self.stats.mapped_blocks = self.map.len() as u64;
    }

    /// Removes every block the source holds in the tiers of `bits` from the index.
    pub(super) fn release<S: IndexSink + ?Sized>(&mut self, bits: u8, refs: &mut Refs, sink: &S) {
        let mut gone = Gone::default();
        self.map.lose_all(refs, self.holder, bits, &mut gone);
        self.flush(&gone, sink);
        self.stats.mapped_blocks = self.map.len() as u64;
    }

    /// Removes the blocks that left their holders.
    fn flush<S: IndexSink + ?Sized>(&mut self, gone: &Gone, sink: &S) {
        if !gone.local.is_empty() {
            let ok = self.sink_ok(&sink.remove(Some(&self.instance), Tier::Local, &gone.local));
            // An unknown instance has no index left to remove from: nothing to count twice.
            if ok {
                self.stats.removed_blocks += gone.local.len() as u64;
            }
        }
        if !gone.global.is_empty() && self.sink_ok(&sink.remove(None, Tier::Global, &gone.global)) {
            self.stats.removed_blocks += gone.global.len() as u64;
        }
    }

    fn stored<S: IndexSink + ?Sized>(&mut self, ev: &BlockStored, refs: &mut Refs, sink: &S, gone: &mut Gone) {
        let Some(bit) = tier_bit(ev.medium.as_ref()) else {
            self.stats.unknown_media += 1;
            return;
        };
        if ev.group_idx.is_some_and(|g| g != 0) {
            self.stats.other_groups += 1;
            return;
        }
        if ev.block_hashes.is_empty() {
            return;
        }
        if ev.token_ids.is_empty() {
            self.placeholder(ev, bit, refs, sink, gone);
            return;
        }
        let block_size = sink.block_size();
        if ev.block_size == 0 || ev.block_size % block_size != 0 {
            self.stats.block_size_mismatches += 1;
            return;
        }
        let engine_block = ev.block_size as usize;
        if ev.token_ids.len() != ev.block_hashes.len() * engine_block {
            self.stats.malformed_events += 1;
            return;
        }
        let lora = ev.lora_name.as_deref();
        let extra = ev.extra_keys.as_deref().unwrap_or_default();
        let usable = (0..ev.block_hashes.len())
            .position(|i| !plain_block(extra.get(i), lora))
            .unwrap_or(ev.block_hashes.len());
        if usable < ev.block_hashes.len() {
            self.stats.unsupported_extra_keys += 1;
        }
        if usable == 0 {
            return;
        }
        let (root, parent) = match &ev.parent_block_hash {
            None => (chain_root(sink.hash_seed(), lora), None),
            Some(p) => {
                let Some(last) = self.map.lookup(p.to_u64()).map(super::map::Blocks::last) else {
                    self.stats.unmapped_hashes += 1;
                    return;
                };
                (last.0, Some(last))
            }
        };
        let router_block = block_size as usize;
        let mut chain = Vec::with_capacity(usable * engine_block / router_block);
        let mut prev = root;
        for block in ev.token_ids[..usable * engine_block].chunks_exact(router_block) {
            prev = hash_block(prev, block);
            chain.push(BlockHash(prev));
        }
        let (instance, tier) = self.tier_of(bit);
        if !self.sink_ok(&sink.store(instance, tier, &chain, parent)) {
            return;
        }
        self.stats.stored_blocks += chain.len() as u64;
        let per_engine = engine_block / router_block;
        for (engine, blocks) in ev.block_hashes.iter().zip(chain.chunks_exact(per_engine)) {
            let evicted = self.map.gain(refs, self.holder, engine.to_u64(), blocks, bit, gone);
            self.stats.map_evictions += evicted as u64;
        }
    }

    /// A `BlockStored` without tokens: only hashes mapped earlier can be placed.
    fn placeholder<S: IndexSink + ?Sized>(
        &mut self,
        ev: &BlockStored,
        bit: u8,
        refs: &mut Refs,
        sink: &S,
        gone: &mut Gone,
    ) {
        for engine in &ev.block_hashes {
            let key = engine.to_u64();
            let Some(blocks) = self.map.lookup(key).map(|b| b.as_slice().to_vec()) else {
                self.stats.unmapped_hashes += 1;
                continue;
            };
            let (instance, tier) = self.tier_of(bit);
            if !self.sink_ok(&sink.store(instance, tier, &blocks, None)) {
                return;
            }
            self.stats.stored_blocks += blocks.len() as u64;
            let evicted = self.map.gain(refs, self.holder, key, &blocks, bit, gone);
            self.stats.map_evictions += evicted as u64;
        }
    }

    fn removed(&mut self, ev: &BlockRemoved, refs: &mut Refs, gone: &mut Gone) {
        let Some(bit) = tier_bit(ev.medium.as_ref()) else {
            self.stats.unknown_media += 1;
            return;
        };
        if ev.group_idx.is_some_and(|g| g != 0) {
            self.stats.other_groups += 1;
            return;
        }
        for engine in &ev.block_hashes {
            if !self.map.lose(refs, self.holder, engine.to_u64(), bit, gone) {
                self.stats.unmapped_hashes += 1;
            }
        }
    }
}
