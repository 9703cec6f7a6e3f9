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
//! the global tier, or, for a source declared host-local (`Offload::HostLocal`: vLLM's
//! `OffloadingConnector`, LMCache's local CPU backend), the instance's host pool (docs
//! §2.8), so one machine's offload is credited to that machine only; matched
//! case-insensitively by the decoder. Only KV-cache group 0 is followed.
//!
//! The index writes of a batch are collected in order ([`Writes`]) and handed to the sink in
//! one [`IndexSink::apply`] call (one lock acquisition in the router). Whether the source's
//! instance is in the router is asked once per batch, before its first local write, so a write
//! the router would refuse is counted and skipped exactly where a direct call would have failed.
//!
//! # Complexity
//! O(tokens + hashes) per event; a clear is O(mapped blocks of the source). No allocation per
//! event once the buffers have grown (one per batch: the op list handed to the sink).

use std::ops::Range;
use std::sync::Arc;

use smetric_core::hash::{chain_root, hash_block};
use smetric_core::{BlockHash, IndexOp, Tier};

use super::map::{CPU, EngineMap, GLOBAL_HOLDER, GPU, Gone, Holders, Refs, STORAGE};
use super::{BatchRef, IndexSink, IngestStats, SinkError};
use crate::events::{EventKind, RawEvent, RawMedium, plain_prefix, reuse};

/// The part of a source that events change.
#[derive(Debug)]
pub(super) struct Feed {
    pub(super) instance: Arc<str>,
    pub(super) holders: Holders,
    pub(super) map: EngineMap,
    pub(super) stats: IngestStats,
    writes: Writes,
    /// While set, a batch's writes stay queued after it is applied, to be handed to the sink
    /// with the next batches' in one call ([`Feed::flush`]): [`crate::Ingestor::on_messages`]
    /// takes the router's index lock once for a whole drained socket, not once per message.
    pub(super) defer_commit: bool,
}

/// Index writes collected while a batch is applied.
#[derive(Debug, Default)]
struct Writes {
    /// The blocks of every write, back to back.
    hashes: Vec<BlockHash>,
    ops: Vec<Write>,
    /// Blocks the current event released from their holders.
    gone: Gone,
    /// Whether the instance is in the index; asked at the batch's first local write.
    instance_known: Option<bool>,
}

/// One [`IndexOp`], its blocks a range of [`Writes::hashes`].
#[derive(Debug)]
struct Write {
    store: bool,
    tier: Tier,
    hashes: Range<usize>,
    parent: Option<BlockHash>,
}

impl Write {
    fn op<'a>(&self, hashes: &'a [BlockHash]) -> IndexOp<'a> {
        let blocks = hashes.get(self.hashes.clone()).unwrap_or_default();
        if self.store {
            IndexOp::Store {
                tier: self.tier,
                hashes: blocks,
                parent: self.parent,
            }
        } else {
            IndexOp::Remove {
                tier: self.tier,
                hashes: blocks,
            }
        }
    }
}

fn tier_bit(medium: Option<RawMedium>) -> Option<u8> {
    match medium {
        None | Some(RawMedium::Gpu) => Some(GPU),
        Some(RawMedium::Cpu) => Some(CPU),
        Some(RawMedium::Storage) => Some(STORAGE),
        Some(RawMedium::Other(_)) => None,
    }
}

/// The index tier a medium's writes go to: the instance's GPU, or the source's offload holder
/// (the global tier, or the instance's host pool when the source offloads host-locally).
fn tier_of(bit: u8, holders: Holders) -> Tier {
    if bit == GPU {
        Tier::Local
    } else if holders.offload == GLOBAL_HOLDER {
        Tier::Global
    } else {
        Tier::Host
    }
}

impl Feed {
    /// `host_local`: the source's CPU and STORAGE media are its instance's host pool (vLLM's
    /// `OffloadingConnector`, LMCache's local CPU backend), not the cluster-wide store.
    pub(super) fn new(instance: &str, holder: u32, host_local: bool, max_mapped_blocks: usize) -> Self {
        Self {
            instance: Arc::from(instance),
            holders: Holders::new(holder, host_local),
            map: EngineMap::new(max_mapped_blocks),
            stats: IngestStats::default(),
            writes: Writes::default(),
            defer_commit: false,
        }
    }

    /// Whether a write to the tier of `bit` can go ahead: the global tier always can, the
    /// instance's tiers (GPU, host pool) if the instance is in the index. Counts a refused write.
    fn writable<S: IndexSink + ?Sized>(&mut self, bit: u8, sink: &S) -> bool {
        if tier_of(bit, self.holders) == Tier::Global {
            return true;
        }
        let instance = &self.instance;
        let known = *self
            .writes
            .instance_known
            .get_or_insert_with(|| sink.has_instance(instance));
        if !known {
            self.stats.unknown_instances += 1;
        }
        known
    }

    /// Queues a write of the blocks `hashes[start..]` of [`Writes::hashes`]. A removal right
    /// after a removal from the same tier joins it (removing `a` then `b` is removing `a ++ b`).
    fn push(&mut self, store: bool, bit: u8, start: usize, parent: Option<BlockHash>) {
        let w = &mut self.writes;
        let tier = tier_of(bit, self.holders);
        if let Some(last) = w.ops.last_mut()
            && !store
            && !last.store
            && last.tier == tier
            && last.hashes.end == start
        {
            last.hashes.end = w.hashes.len();
            return;
        }
        w.ops.push(Write {
            store,
            tier,
            hashes: start..w.hashes.len(),
            parent,
        });
    }

    /// Applies every event of a batch.
    pub(super) fn apply<S: IndexSink + ?Sized>(&mut self, batch: BatchRef<'_>, refs: &mut Refs, sink: &S) {
        self.stats.batches += 1;
        self.stats.unknown_event_types += batch.raw.unknown_events as u64;
        for event in &batch.raw.events {
            self.stats.events += 1;
            match event.kind {
                EventKind::Stored => self.stored(batch, event, refs, sink),
                EventKind::Removed => self.removed(batch, event, refs),
                EventKind::Cleared => {
                    self.stats.cleared += 1;
                    self.map.lose_all(refs, self.holders, GPU, &mut self.writes.gone);
                }
            }
            self.released(sink);
        }
        if !self.defer_commit || self.writes.hashes.len() >= super::DEFERRED_WRITES_MAX_BLOCKS {
            self.commit(refs, sink);
        } else {
            self.try_commit(refs, sink);
        }
    }

    /// Hands the writes queued while commits were deferred to the sink, in one call.
    pub(super) fn flush<S: IndexSink + ?Sized>(&mut self, refs: &mut Refs, sink: &S) {
        self.commit(refs, sink);
    }

    /// Removes every block the source holds in the tiers of `bits` from the index.
    pub(super) fn release<S: IndexSink + ?Sized>(&mut self, bits: u8, refs: &mut Refs, sink: &S) {
        self.map.lose_all(refs, self.holders, bits, &mut self.writes.gone);
        self.released(sink);
        self.commit(refs, sink);
    }

    /// Queues the removal of the blocks that left their holders.
    fn released<S: IndexSink + ?Sized>(&mut self, sink: &S) {
        self.release_gone(GPU, sink);
        self.release_gone(CPU, sink);
    }

    /// Queues the removal of the blocks that left the holder of `bit` (the GPU's, or the
    /// offload holder's for CPU). An unknown instance has no index left to remove from.
    fn release_gone<S: IndexSink + ?Sized>(&mut self, bit: u8, sink: &S) {
        fn gone(w: &mut Writes, bit: u8) -> &mut Vec<BlockHash> {
            if bit == GPU {
                &mut w.gone.local
            } else {
                &mut w.gone.offload
            }
        }
        if gone(&mut self.writes, bit).is_empty() {
            return;
        }
        if self.writable(bit, sink) {
            let w = &mut self.writes;
            let start = w.hashes.len();
            let blocks = std::mem::take(gone(w, bit));
            w.hashes.extend_from_slice(&blocks);
            self.stats.removed_blocks += blocks.len() as u64;
            *gone(&mut self.writes, bit) = blocks;
            self.push(false, bit, start, None);
        }
        gone(&mut self.writes, bit).clear();
    }

    /// Hands the queued writes to the sink in one call.
    fn commit<S: IndexSink + ?Sized>(&mut self, refs: &mut Refs, sink: &S) {
        let w = &mut self.writes;
        if !w.ops.is_empty() {
            let ops: Vec<IndexOp<'_>> = w.ops.iter().map(|op| op.op(&w.hashes)).collect();
            let outcome = sink.apply(&self.instance, &ops);
            self.committed(&outcome, refs);
        }
        self.clear_writes();
    }

    /// [`Feed::commit`] if the sink can take the writes without waiting; else they stay queued.
    fn try_commit<S: IndexSink + ?Sized>(&mut self, refs: &mut Refs, sink: &S) {
        let w = &mut self.writes;
        if w.ops.is_empty() {
            return;
        }
        let ops: Vec<IndexOp<'_>> = w.ops.iter().map(|op| op.op(&w.hashes)).collect();
        if let Some(outcome) = sink.try_apply(&self.instance, &ops) {
            self.committed(&outcome, refs);
            self.clear_writes();
        }
    }

    /// Books what the sink said of a batch of writes.
    fn committed(&mut self, outcome: &Result<(), SinkError>, refs: &mut Refs) {
        match outcome {
            Ok(()) => {}
            Err(SinkError::UnknownInstance) => {
                // The instance left the router after this batch asked: whatever the source
                // held there left with it.
                self.stats.unknown_instances += 1;
                self.map.lose_all(refs, self.holders, GPU, &mut self.writes.gone);
            }
            Err(SinkError::Other(_)) => self.stats.sink_errors += 1,
        }
    }

    fn clear_writes(&mut self) {
        let w = &mut self.writes;
        reuse(&mut w.hashes);
        reuse(&mut w.ops);
        reuse(&mut w.gone.local);
        reuse(&mut w.gone.offload);
        w.instance_known = None;
        self.stats.mapped_blocks = self.map.len() as u64;
    }

    fn stored<S: IndexSink + ?Sized>(&mut self, batch: BatchRef<'_>, ev: &RawEvent, refs: &mut Refs, sink: &S) {
        let Some(bit) = tier_bit(ev.medium) else {
            self.stats.unknown_media += 1;
            return;
        };
        if ev.group_idx.is_some_and(|g| g != 0) {
            self.stats.other_groups += 1;
            return;
        }
        let engine_hashes = batch.raw.hashes(ev);
        if engine_hashes.is_empty() {
            return;
        }
        let tokens = batch.raw.tokens(ev);
        if tokens.is_empty() {
            self.placeholder(engine_hashes.iter().map(|h| h.key), bit, refs, sink);
            return;
        }
        let block_size = sink.block_size();
        if ev.block_size == 0 || !ev.block_size.is_multiple_of(block_size) {
            self.stats.block_size_mismatches += 1;
            return;
        }
        let engine_block = ev.block_size as usize;
        if tokens.len() != engine_hashes.len() * engine_block {
            self.stats.malformed_events += 1;
            return;
        }
        let lora = ev.lora_name.map(|s| s.str(batch.payload));
        let usable = match ev.extra_keys {
            None => engine_hashes.len(),
            Some(extra) => plain_prefix(extra.bytes(batch.payload), lora.map(str::as_bytes), engine_hashes.len()),
        };
        if usable < engine_hashes.len() {
            self.stats.unsupported_extra_keys += 1;
        }
        if usable == 0 {
            return;
        }
        let (root, parent) = match ev.parent {
            None => (chain_root(sink.hash_seed(), lora), None),
            Some(p) => {
                let Some(last) = self.map.lookup(p.key).map(super::map::Blocks::last) else {
                    self.stats.unmapped_hashes += 1;
                    return;
                };
                (last.0, Some(last))
            }
        };
        if !self.writable(bit, sink) {
            return;
        }
        let router_block = block_size as usize;
        let start = self.writes.hashes.len();
        let mut prev = root;
        for block in tokens[..usable * engine_block].chunks_exact(router_block) {
            prev = hash_block(prev, block);
            self.writes.hashes.push(BlockHash(prev));
        }
        self.push(true, bit, start, parent);
        let Self {
            map,
            stats,
            writes,
            holders,
            ..
        } = self;
        let chain = &writes.hashes[start..];
        stats.stored_blocks += chain.len() as u64;
        let per_engine = engine_block / router_block;
        for (engine, blocks) in engine_hashes.iter().zip(chain.chunks_exact(per_engine)) {
            let evicted = map.gain(refs, *holders, engine.key, blocks, bit, &mut writes.gone);
            stats.map_evictions += evicted as u64;
        }
    }

    /// A `BlockStored` without tokens: only hashes mapped earlier can be placed.
    fn placeholder<S: IndexSink + ?Sized>(
        &mut self,
        engine_hashes: impl Iterator<Item = u64>,
        bit: u8,
        refs: &mut Refs,
        sink: &S,
    ) {
        for key in engine_hashes {
            let start = self.writes.hashes.len();
            let Some(blocks) = self.map.lookup(key) else {
                self.stats.unmapped_hashes += 1;
                continue;
            };
            self.writes.hashes.extend_from_slice(blocks.as_slice());
            if !self.writable(bit, sink) {
                self.writes.hashes.truncate(start);
                return;
            }
            self.push(true, bit, start, None);
            let Self {
                map,
                stats,
                writes,
                holders,
                ..
            } = self;
            let blocks = &writes.hashes[start..];
            stats.stored_blocks += blocks.len() as u64;
            let evicted = map.gain(refs, *holders, key, blocks, bit, &mut writes.gone);
            stats.map_evictions += evicted as u64;
        }
    }

    fn removed(&mut self, batch: BatchRef<'_>, ev: &RawEvent, refs: &mut Refs) {
        let Some(bit) = tier_bit(ev.medium) else {
            self.stats.unknown_media += 1;
            return;
        };
        if ev.group_idx.is_some_and(|g| g != 0) {
            self.stats.other_groups += 1;
            return;
        }
        for engine in batch.raw.hashes(ev) {
            if !self
                .map
                .lose(refs, self.holders, engine.key, bit, &mut self.writes.gone)
            {
                self.stats.unmapped_hashes += 1;
            }
        }
    }
}
