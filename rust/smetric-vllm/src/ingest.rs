//! KV-event ingestion: vLLM's cache events, as received from its `ZmqEventPublisher`, applied
//! to smetric's own two-tier index. Socket handling lives in the caller (`smetric.events`
//! in Python); this module is the logic, testable with plain cargo.
//!
//! # Model
//! A *source* is one publisher (one engine, i.e. one data-parallel rank) feeding one router
//! instance. Several sources may feed one instance (the ranks behind one API server): the
//! instance then holds the union of their blocks. CPU and STORAGE blocks of every source go to
//! the global tier, which holds a block while any source does.
//!
//! Engine block hashes are mapped to smetric's own chained xxh3 hashes through the token ids
//! that `BlockStored` carries, as llm-d and Dynamo do, so neither the engine's hash algorithm
//! nor its seed matters (rules: the `apply` submodule and `docs/kv-events.md` §1).
//!
//! # Sequence numbers
//! Per source, the next expected sequence number starts at 0.
//! * `seq == expected`: applied.
//! * `seq > expected` (a gap): with a replay endpoint the message is held back and the caller
//!   is asked to request a replay from `expected` ([`Step::replay_from`]); live messages are
//!   buffered until the replay ends ([`Ingestor::on_replay_reply`]), fails
//!   ([`Ingestor::on_replay_failed`]) or overflows [`IngestConfig::max_pending_batches`].
//!   Without a replay endpoint — or when the replay cannot fill the gap — the source is
//!   *reset*: every block it put in the index is removed, then the message is applied.
//! * `seq` at or below the last sequence number received live (the publisher restarted), or a
//!   different data-parallel rank: reset, then applied. A live `seq` below `expected` but above
//!   the last live one was already applied by a replay: skipped as stale.
//! * The very first message may have any `seq`: with a replay endpoint, history from 0 is
//!   replayed first; without one it is accepted as is (a late join).
//!
//! A payload that fails to decode consumes its sequence number and changes nothing else; it is
//! counted in [`IngestStats::decode_errors`]. Nothing panics on any input.
//!
//! # Invariant
//! What the ingestor put in the index is exactly the union, over sources, of the blocks their
//! events hold now (minus what the index itself evicted for capacity or age); a block leaves
//! the index when the last source holding it in that tier removes it.

mod apply;
mod map;
mod stats;

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use smetric_core::{IndexOp, Router, SmetricError};

use crate::events::{DecodeError, DecodeOptions, RawBatch};
use crate::frames::{END_SEQ, ReplayFrames, replay_frames};
use apply::Feed;
use map::Refs;
pub use stats::IngestStats;

/// Where the ingestor writes: the router's index. [`Router`] implements it (on its own clock),
/// and so does [`RouterAt`] (on a caller's clock).
///
/// The ingestor writes only through [`IndexSink::apply`], one call per batch, so that is the
/// one write a sink provides.
pub trait IndexSink {
    /// Tokens per router block.
    fn block_size(&self) -> u32;
    /// The router's hash seed (`RouterConfig::hash_seed`).
    fn hash_seed(&self) -> u64;

    /// Whether `instance` is in the index now. The ingestor asks once per batch, before its
    /// first write to the instance's tier, and skips (and counts) those writes if it is not.
    /// Default: `true` (a write to an unknown instance then fails in [`IndexSink::apply`]).
    fn has_instance(&self, instance: &str) -> bool {
        let _ = instance;
        true
    }

    /// Applies the writes of one batch in order, the `Local` tier meaning `instance`, as
    /// `Router::apply_blocks` does: the same as one `Router::store_blocks` or
    /// `Router::remove_blocks` call per op, where a failing op is skipped and the first error
    /// returned. `Router` takes its index lock once for the whole batch.
    fn apply(&self, instance: &str, ops: &[IndexOp<'_>]) -> Result<(), SinkError>;

    /// [`IndexSink::apply`] if it can be done without waiting, else `None` and nothing
    /// applied: the ingestor then keeps the writes queued and tries again after the next
    /// message of the same [`Ingestor::on_messages`] call. Default: always [`IndexSink::apply`].
    fn try_apply(&self, instance: &str, ops: &[IndexOp<'_>]) -> Option<Result<(), SinkError>> {
        Some(self.apply(instance, ops))
    }
}

/// Most blocks of index writes [`Ingestor::on_messages`] holds back while the router's index
/// lock is busy, before it waits for the lock: a bound on how long a decision can then wait
/// behind one batch of writes (a 256-block touch costs a few µs).
pub const DEFERRED_WRITES_MAX_BLOCKS: usize = 256;

/// Why the sink refused a write.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SinkError {
    /// The instance is not (or no longer) in the router.
    #[error("unknown instance")]
    UnknownInstance,
    /// Anything else.
    #[error("{0}")]
    Other(String),
}

impl From<SmetricError> for SinkError {
    fn from(e: SmetricError) -> Self {
        match e {
            SmetricError::UnknownInstance { .. } => Self::UnknownInstance,
            other => Self::Other(other.to_string()),
        }
    }
}

impl IndexSink for Router {
    fn block_size(&self) -> u32 {
        RouterAt::wall_clock(self).block_size()
    }

    fn hash_seed(&self) -> u64 {
        RouterAt::wall_clock(self).hash_seed()
    }

    fn has_instance(&self, instance: &str) -> bool {
        RouterAt::wall_clock(self).has_instance(instance)
    }

    fn apply(&self, instance: &str, ops: &[IndexOp<'_>]) -> Result<(), SinkError> {
        RouterAt::wall_clock(self).apply(instance, ops)
    }

    fn try_apply(&self, instance: &str, ops: &[IndexOp<'_>]) -> Option<Result<(), SinkError>> {
        RouterAt::wall_clock(self).try_apply(instance, ops)
    }
}

/// A [`Router`] as a sink whose writes carry a given time: `None` is the router's own clock
/// (what `impl IndexSink for Router` uses), `Some(t)` a caller's clock in seconds — a
/// simulator's, so written blocks age against the same times its routing uses.
#[derive(Debug, Clone, Copy)]
pub struct RouterAt<'a> {
    /// The router written.
    pub router: &'a Router,
    /// The time of every write (`now` of `Router::store_blocks` / `apply_blocks`).
    pub now: Option<f64>,
}

impl<'a> RouterAt<'a> {
    /// The router on its own clock.
    pub fn wall_clock(router: &'a Router) -> Self {
        Self { router, now: None }
    }
}

impl IndexSink for RouterAt<'_> {
    fn block_size(&self) -> u32 {
        self.router.block_size()
    }

    fn hash_seed(&self) -> u64 {
        self.router.config().hash_seed
    }

    fn has_instance(&self, instance: &str) -> bool {
        self.router.load(instance).is_ok()
    }

    fn apply(&self, instance: &str, ops: &[IndexOp<'_>]) -> Result<(), SinkError> {
        Ok(self.router.apply_blocks(Some(instance), ops, self.now)?)
    }

    fn try_apply(&self, instance: &str, ops: &[IndexOp<'_>]) -> Option<Result<(), SinkError>> {
        self.router
            .try_apply_blocks(Some(instance), ops, self.now)
            .map(|r| r.map_err(SinkError::from))
    }
}

/// Limits of an [`Ingestor`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IngestConfig {
    /// Decoder limits.
    pub decode: DecodeOptions,
    /// Most engine blocks mapped per source; beyond it the least recently used eighth is
    /// evicted and leaves the index. 2^18 blocks ≈ 4M tokens at block size 16, ≈ 20 MB.
    pub max_mapped_blocks: usize,
    /// Most live batches held back while a replay runs (vLLM buffers 10,000 for replay).
    pub max_pending_batches: usize,
}

impl IngestConfig {
    /// The defaults, defined once: [`Default`] returns them and the Python binding's keyword
    /// defaults read them.
    pub const DEFAULT: Self = Self {
        decode: DecodeOptions::DEFAULT,
        max_mapped_blocks: 1 << 18,
        max_pending_batches: 10_000,
    };
}

impl Default for IngestConfig {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// Where a source's non-GPU media (vLLM's `CPU` and `STORAGE`) live (docs §2.8).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Offload {
    /// A store every instance reads (Mooncake, a shared LMCache server): the global tier.
    #[default]
    Shared,
    /// The instance's own host memory (vLLM's `OffloadingConnector`, LMCache's local CPU
    /// backend) or the store of its host pool: credited to that instance (and its pool) only.
    HostLocal,
}

impl Offload {
    /// The name at the bindings and in config files.
    pub fn name(self) -> &'static str {
        match self {
            Self::Shared => "shared",
            Self::HostLocal => "host",
        }
    }

    /// The offload called `name`.
    pub fn parse(name: &str) -> Option<Self> {
        [Self::Shared, Self::HostLocal].into_iter().find(|o| o.name() == name)
    }
}

/// Handle of a source, from [`Ingestor::add_source`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SourceId(pub u32);

/// A [`SourceId`] the ingestor never issued, or one already removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("unknown KV-event source {}", .0.0)]
pub struct UnknownSource(pub SourceId);

/// What the caller must do after handing in a message.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Step {
    /// Send a replay request (`[b"", from as 8 bytes big-endian]`) on the source's DEALER.
    pub replay_from: Option<u64>,
    /// The replay ended (its end marker arrived or it was given up); stop waiting for it.
    pub replay_done: bool,
    /// The message was dropped because it did not decode (already counted).
    pub error: Option<DecodeError>,
}

/// A decoded batch and the payload its ranges point into.
#[derive(Debug, Clone, Copy)]
struct BatchRef<'a> {
    raw: &'a RawBatch,
    payload: &'a [u8],
}

impl BatchRef<'_> {
    fn to_held(self) -> Held {
        Held {
            raw: self.raw.clone(),
            payload: self.payload.into(),
        }
    }
}

/// A batch held back while a replay runs.
#[derive(Debug)]
struct Held {
    raw: RawBatch,
    payload: Box<[u8]>,
}

impl Held {
    fn as_batch(&self) -> BatchRef<'_> {
        BatchRef {
            raw: &self.raw,
            payload: &self.payload,
        }
    }
}

/// The data-parallel rank a source's batches carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rank {
    /// No batch applied yet.
    Unseen,
    /// The rank of the batches so far (`None`: the publisher sent none).
    Seen(Option<i64>),
}

#[derive(Debug)]
struct Source {
    feed: Feed,
    has_replay: bool,
    /// Next expected sequence number; `None` before the first message.
    next_seq: Option<u64>,
    /// The last sequence number received live (on the PUB socket).
    last_live: Option<u64>,
    dp_rank: Rank,
    /// Live batches held back while a replay runs (`Some` = replaying).
    pending: Option<VecDeque<(u64, Option<Held>)>>,
}

/// Applies KV-event streams of many sources to one index. Not synchronised: wrap it in a mutex
/// to share it.
#[derive(Debug)]
pub struct Ingestor {
    config: IngestConfig,
    sources: Vec<Option<Source>>,
    refs: Refs,
    holders: HashMap<Arc<str>, u32>,
    retired: IngestStats,
    /// The decoding buffers, reused by every message.
    scratch: RawBatch,
}

/// `(seq, payload)` of a PUB message's frames `[topic, seq, payload]`.
fn pub_frames<F: AsRef<[u8]>>(frames: &[F]) -> Result<(u64, &[u8]), DecodeError> {
    let [_topic, seq, payload] = frames else {
        return Err(DecodeError::FrameCount {
            expected: "3",
            got: frames.len(),
        });
    };
    let seq = <[u8; 8]>::try_from(seq.as_ref()).map_err(|_| DecodeError::BadSeqFrame {
        len: seq.as_ref().len(),
    })?;
    Ok((u64::from_be_bytes(seq), payload.as_ref()))
}

impl Ingestor {
    /// An ingestor without sources.
    pub fn new(config: IngestConfig) -> Self {
        Self {
            config,
            sources: Vec::new(),
            refs: Refs::default(),
            holders: HashMap::new(),
            retired: IngestStats::default(),
            scratch: RawBatch::default(),
        }
    }

    /// Registers a publisher feeding `instance`; `has_replay` says whether the caller can send
    /// replay requests for it. Its CPU and STORAGE blocks go to the global tier.
    pub fn add_source(&mut self, instance: &str, has_replay: bool) -> SourceId {
        self.add_source_with(instance, has_replay, Offload::Shared)
    }

    /// [`Ingestor::add_source`], with where the source's CPU and STORAGE blocks live.
    pub fn add_source_with(&mut self, instance: &str, has_replay: bool, offload: Offload) -> SourceId {
        let next = self.holders.len() as u32 + 1;
        let holder = *self.holders.entry(Arc::from(instance)).or_insert(next);
        let source = Source {
            feed: Feed::new(
                instance,
                holder,
                offload == Offload::HostLocal,
                self.config.max_mapped_blocks,
            ),
            has_replay,
            next_seq: None,
            last_live: None,
            dp_rank: Rank::Unseen,
            pending: None,
        };
        let free = self.sources.iter().position(Option::is_none);
        let slot = free.unwrap_or(self.sources.len());
        if slot == self.sources.len() {
            self.sources.push(Some(source));
        } else {
            self.sources[slot] = Some(source);
        }
        SourceId(slot as u32)
    }

    /// Unregisters a source, removing what it put in the index; its counters stay in the totals.
    pub fn remove_source<S: IndexSink + ?Sized>(&mut self, sink: &S, id: SourceId) -> Result<(), UnknownSource> {
        self.reset_source(sink, id)?;
        let source = self.sources[id.0 as usize].take().ok_or(UnknownSource(id))?;
        self.retired.add(&source.feed.stats);
        Ok(())
    }

    /// Removes everything a source put in the index and forgets its sequence state.
    pub fn reset_source<S: IndexSink + ?Sized>(&mut self, sink: &S, id: SourceId) -> Result<(), UnknownSource> {
        let (source, refs) = self.source(id)?;
        source.next_seq = None;
        source.last_live = None;
        source.dp_rank = Rank::Unseen;
        source.pending = None;
        source.feed.release(u8::MAX, refs, sink);
        Ok(())
    }

    /// The source and the shared reference counts, borrowed together.
    fn source(&mut self, id: SourceId) -> Result<(&mut Source, &mut Refs), UnknownSource> {
        let (source, refs, _) = self.source_and_scratch(id)?;
        Ok((source, refs))
    }

    /// The source, the shared reference counts and the decoding buffers, borrowed together.
    fn source_and_scratch(&mut self, id: SourceId) -> Result<(&mut Source, &mut Refs, &mut RawBatch), UnknownSource> {
        let source = self
            .sources
            .get_mut(id.0 as usize)
            .and_then(Option::as_mut)
            .ok_or(UnknownSource(id))?;
        Ok((source, &mut self.refs, &mut self.scratch))
    }

    /// Counters summed over all sources, removed ones included.
    pub fn stats(&self) -> IngestStats {
        let mut total = self.retired.clone();
        for source in self.sources.iter().flatten() {
            total.add(&source.feed.stats);
        }
        total
    }

    /// Blocks the sources hold through their events: `(local, global)`, where `local` sums the
    /// distinct blocks of every instance. With an index that never evicts (exact mode, enough
    /// capacity, no TTL) these equal the index's own counts.
    pub fn held_blocks(&self) -> (usize, usize) {
        self.refs.held()
    }

    /// Counters of one source.
    pub fn source_stats(&self, id: SourceId) -> Result<IngestStats, UnknownSource> {
        self.sources
            .get(id.0 as usize)
            .and_then(Option::as_ref)
            .map(|s| s.feed.stats.clone())
            .ok_or(UnknownSource(id))
    }

    /// Hands in one PUB message (`[topic, seq, payload]`).
    pub fn on_message<S: IndexSink + ?Sized, F: AsRef<[u8]>>(
        &mut self,
        sink: &S,
        id: SourceId,
        frames: &[F],
    ) -> Result<Step, UnknownSource> {
        let decode = self.config.decode;
        let max_pending = self.config.max_pending_batches;
        let (source, refs, scratch) = self.source_and_scratch(id)?;
        source.feed.stats.messages += 1;
        let (seq, payload) = match pub_frames(frames) {
            Ok(parts) => parts,
            Err(e) => return Ok(source.decode_error(e)),
        };
        let mut step = Step::default();
        let batch = match decode.decode_raw(payload, scratch) {
            Ok(()) => Some(BatchRef { raw: scratch, payload }),
            Err(e) => {
                step = source.decode_error(e);
                None
            }
        };
        // The SUB delivers in order, so a sequence number at or below the last live one means
        // the publisher restarted (lower numbers already applied by a replay are merely stale).
        let restarted = source.last_live.is_some_and(|last| seq <= last);
        source.last_live = Some(seq);
        if restarted {
            source.feed.stats.restarts += 1;
            step.replay_done = source.pending.take().is_some();
            source.restart(seq, batch, refs, sink);
            return Ok(step);
        }
        if let Some(pending) = &mut source.pending {
            pending.push_back((seq, batch.map(BatchRef::to_held)));
            if pending.len() > max_pending {
                source.finish_replay(refs, sink);
                step.replay_done = true;
            }
            return Ok(step);
        }
        step.replay_from = source.accept(seq, batch, true, refs, sink);
        Ok(step)
    }

    /// Hands in several PUB messages of one source, in order: the same steps and the same
    /// index as [`Ingestor::on_message`] for each, but a message's index writes go to the sink
    /// with [`IndexSink::try_apply`]: when the router's index lock is busy (a decision holds
    /// it), the writes stay queued and join the next message's, and whatever is still queued
    /// at the end, or more than [`DEFERRED_WRITES_MAX_BLOCKS`] blocks, is applied waiting for
    /// the lock. The ingestor thus never waits behind a decision in the middle of a batch,
    /// and a decision never waits behind more than a bounded batch of writes. Every write is
    /// visible to decisions when the call returns, in the order the events came.
    pub fn on_messages<S: IndexSink + ?Sized, M: AsRef<[F]>, F: AsRef<[u8]>>(
        &mut self,
        sink: &S,
        id: SourceId,
        messages: &[M],
    ) -> Result<Vec<Step>, UnknownSource> {
        self.source(id)?.0.feed.defer_commit = true;
        let steps = messages
            .iter()
            .map(|frames| self.on_message(sink, id, frames.as_ref()))
            .collect();
        // The source exists (checked above; nothing in between removes it).
        let (source, refs) = self.source(id)?;
        source.feed.defer_commit = false;
        source.feed.flush(refs, sink);
        steps
    }

    /// Hands in one reply from the source's replay DEALER (either reply layout).
    pub fn on_replay_reply<S: IndexSink + ?Sized, F: AsRef<[u8]>>(
        &mut self,
        sink: &S,
        id: SourceId,
        frames: &[F],
    ) -> Result<Step, UnknownSource> {
        let decode = self.config.decode;
        let (source, refs, scratch) = self.source_and_scratch(id)?;
        let reply = replay_frames(frames).and_then(|reply| match reply {
            ReplayFrames::End => Ok(None),
            ReplayFrames::Batch { seq, payload, .. } => {
                decode.decode_raw(payload, scratch).map(|()| Some((seq, payload)))
            }
        });
        if source.pending.is_none() {
            // A reply to a replay already given up; it changes nothing.
            if matches!(reply, Ok(Some(_))) {
                source.feed.stats.stale_messages += 1;
            }
            return Ok(Step::default());
        }
        match reply {
            Err(e) => Ok(source.decode_error(e)),
            Ok(None) => {
                source.finish_replay(refs, sink);
                Ok(Step {
                    replay_done: true,
                    ..Step::default()
                })
            }
            Ok(Some((seq, payload))) => {
                source.feed.stats.messages += 1;
                if seq == END_SEQ {
                    return Ok(Step::default());
                }
                source.accept(seq, Some(BatchRef { raw: scratch, payload }), false, refs, sink);
                Ok(Step::default())
            }
        }
    }

    /// The replay of a source timed out (or its socket failed): resume from the held-back batches.
    pub fn on_replay_failed<S: IndexSink + ?Sized>(&mut self, sink: &S, id: SourceId) -> Result<Step, UnknownSource> {
        let (source, refs) = self.source(id)?;
        if source.pending.is_some() {
            source.finish_replay(refs, sink);
        }
        Ok(Step {
            replay_done: true,
            ..Step::default()
        })
    }
}

impl Source {
    fn decode_error(&mut self, e: DecodeError) -> Step {
        let stats = &mut self.feed.stats;
        stats.decode_errors += 1;
        *stats.decode_errors_by_kind.entry(e.kind()).or_insert(0) += 1;
        Step {
            error: Some(e),
            ..Step::default()
        }
    }

    /// Sequence logic for one message; returns the replay start when one must be requested.
    fn accept<S: IndexSink + ?Sized>(
        &mut self,
        seq: u64,
        batch: Option<BatchRef<'_>>,
        may_replay: bool,
        refs: &mut Refs,
        sink: &S,
    ) -> Option<u64> {
        let rank = batch.map(|b| b.raw.dp_rank);
        if let (Rank::Seen(seen), Some(rank)) = (self.dp_rank, rank)
            && seen != rank
        {
            self.feed.stats.restarts += 1;
            self.restart(seq, batch, refs, sink);
            return None;
        }
        let expected = match self.next_seq {
            Some(expected) => expected,
            None if seq == 0 => 0,
            None if may_replay && self.has_replay => {
                self.feed.stats.replays += 1;
                self.next_seq = Some(0);
                self.pending = Some(VecDeque::from([(seq, batch.map(BatchRef::to_held))]));
                return Some(0);
            }
            None => {
                self.feed.stats.late_joins += 1;
                seq
            }
        };
        if seq < expected {
            self.feed.stats.stale_messages += 1;
            return None;
        }
        if seq > expected {
            if !may_replay {
                // A replayed or held-back batch past the expected one: the replay left a gap.
                self.feed.stats.replay_failures += 1;
            } else if self.has_replay {
                self.feed.stats.gaps += 1;
                self.feed.stats.replays += 1;
                self.pending = Some(VecDeque::from([(seq, batch.map(BatchRef::to_held))]));
                return Some(expected);
            } else {
                self.feed.stats.gaps += 1;
            }
            self.restart(seq, batch, refs, sink);
            return None;
        }
        self.apply(seq, batch, refs, sink);
        None
    }

    fn apply<S: IndexSink + ?Sized>(&mut self, seq: u64, batch: Option<BatchRef<'_>>, refs: &mut Refs, sink: &S) {
        if let Some(batch) = batch {
            self.dp_rank = Rank::Seen(batch.raw.dp_rank);
            self.feed.apply(batch, refs, sink);
        }
        self.next_seq = Some(seq.saturating_add(1));
    }

    /// Resets the source, then applies the message as the start of a new stream.
    fn restart<S: IndexSink + ?Sized>(&mut self, seq: u64, batch: Option<BatchRef<'_>>, refs: &mut Refs, sink: &S) {
        self.feed.stats.resets += 1;
        self.feed.release(u8::MAX, refs, sink);
        self.dp_rank = Rank::Unseen;
        self.apply(seq, batch, refs, sink);
    }

    /// Applies the held-back batches; a gap left before them resets the source.
    fn finish_replay<S: IndexSink + ?Sized>(&mut self, refs: &mut Refs, sink: &S) {
        for (seq, held) in self.pending.take().unwrap_or_default() {
            self.accept(seq, held.as_ref().map(Held::as_batch), false, refs, sink);
        }
    }
}

#[cfg(test)]
mod tests;
