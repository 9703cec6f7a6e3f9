//! The ingestor's counters, defined once with their names (the names are the keys of the
//! Python `stats()` dict and of `docs/kv-events.md`).

use std::collections::BTreeMap;

macro_rules! counters {
    ($($(#[doc = $doc:literal])+ $name:ident,)+) => {
        /// Counters of one source, or of all sources together ([`super::Ingestor::stats`]).
        #[derive(Debug, Clone, Default, PartialEq, Eq)]
        pub struct IngestStats {
            $($(#[doc = $doc])+ pub $name: u64,)+
            /// Decode errors by [`crate::DecodeError::kind`].
            pub decode_errors_by_kind: BTreeMap<&'static str, u64>,
        }

        impl IngestStats {
            /// Every counter with its name, in declaration order.
            pub fn counters(&self) -> Vec<(&'static str, u64)> {
                vec![$((stringify!($name), self.$name),)+]
            }

            /// Adds `other`'s counters to these.
            pub fn add(&mut self, other: &Self) {
                $(self.$name += other.$name;)+
                for (kind, n) in &other.decode_errors_by_kind {
                    *self.decode_errors_by_kind.entry(kind).or_insert(0) += n;
                }
            }
        }
    };
}

counters! {
    /// Messages handed in: PUB messages and replayed batches (end markers excluded).
    messages,
    /// Batches applied to the index.
    batches,
    /// Known events applied (`BlockStored`, `BlockRemoved`, `AllBlocksCleared`).
    events,
    /// smetric blocks written to the index by `BlockStored` events (re-stores included).
    stored_blocks,
    /// smetric blocks removed from the index (removals, clears, resets, map evictions).
    removed_blocks,
    /// `AllBlocksCleared` events.
    cleared,
    /// Messages or replay replies that failed to decode (dropped; see `decode_errors_by_kind`).
    decode_errors,
    /// Events of a type the decoder does not know (skipped).
    unknown_event_types,
    /// Engine hashes that could not be resolved to smetric blocks: a `BlockRemoved` or a
    /// token-less `BlockStored` for a hash never stored with tokens, or a `BlockStored` whose
    /// parent is unknown (its blocks are skipped).
    unmapped_hashes,
    /// `BlockStored` events skipped because their block size is not a multiple of the router's.
    block_size_mismatches,
    /// `BlockStored` events cut short at a block with extra keys other than the LoRA name
    /// (cache salt, multimodal, prompt embeddings), which smetric's token hash cannot express.
    unsupported_extra_keys,
    /// `BlockStored` events whose token count is not `len(block_hashes) * block_size`.
    malformed_events,
    /// Events of a KV-cache group other than 0 (hybrid models; skipped).
    other_groups,
    /// Events with a medium other than GPU, CPU or STORAGE (skipped).
    unknown_media,
    /// Index writes refused because the source's instance is not in the router.
    unknown_instances,
    /// Index writes refused for any other reason.
    sink_errors,
    /// Sequence gaps seen on the PUB socket.
    gaps,
    /// Replays requested.
    replays,
    /// Replays that did not fill their gap (timed out, overflowed the held-back buffer, or the
    /// publisher no longer buffered the missing batches): the source was reset instead.
    replay_failures,
    /// Source resets: everything the source had put in the index was removed.
    resets,
    /// Publisher restarts (the sequence number went back, or the data-parallel rank changed).
    restarts,
    /// First messages with a sequence number above 0 and no replay endpoint to catch up from.
    late_joins,
    /// Messages already applied (duplicates from a replay overlapping live messages).
    stale_messages,
    /// Engine-hash map entries evicted for capacity (their blocks leave the index).
    map_evictions,
    /// Engine blocks currently mapped (a gauge, not a counter).
    mapped_blocks,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_named_and_added() {
        let mut a = IngestStats {
            gaps: 2,
            ..IngestStats::default()
        };
        a.decode_errors_by_kind.insert("truncated", 1);
        let mut total = IngestStats::default();
        total.add(&a);
        total.add(&a);
        assert_eq!(total.gaps, 4);
        assert_eq!(total.decode_errors_by_kind["truncated"], 2);
        assert!(total.counters().contains(&("gaps", 4)));
        assert_eq!(total.counters().first(), Some(&("messages", 0)));
    }
}
