//! Unit tests of the decoder on hand-made payloads: both event encodings (map and array
//! form), unknown event types and keys, typed errors with their offsets, and hostile lengths
//! against the configured limits.

use super::*;
use crate::events::decode_batch;

use crate::test_msgpack::Mp;

/// `[ts, [<events>], dp]` header for `n` events; append the events after it.
fn batch(n: u8) -> Mp {
    Mp::default().arr(3).f(2.5).arr(usize::from(n))
}

fn stored_map(medium: &str) -> Mp {
    batch(1)
        .map(5)
        .s("block_size")
        .u(2)
        .s("type")
        .s("BlockStored")
        .s("block_hashes")
        .arr(2)
        .u(u64::MAX)
        .i(-2)
        .s("token_ids")
        .arr(4)
        .u(1)
        .u(2)
        .u(3)
        .u(u64::from(u32::MAX))
        .s("medium")
        .s(medium)
}

#[test]
fn map_event_with_type_not_first() {
    let b = decode_batch(&stored_map("gPu").u(3).0).unwrap();
    assert_eq!((b.ts, b.dp_rank, b.unknown_events), (2.5, Some(3), 0));
    let KvEvent::BlockStored(s) = &b.events[0] else {
        panic!("{b:?}");
    };
    assert_eq!(
        s.block_hashes,
        [ExternalBlockHash::Int(u64::MAX), ExternalBlockHash::Int(u64::MAX - 1)]
    );
    assert_eq!(s.token_ids, [1, 2, 3, u32::MAX]);
    assert_eq!(s.block_size, 2);
    assert_eq!(s.medium, Some(Medium::Gpu));
    assert_eq!(s.parent_block_hash, None);
}

#[test]
fn array_form_with_trailing_extras_and_two_element_batch() {
    let input = Mp::default()
        .arr(2)
        .f(1.0)
        .arr(2)
        .arr(11)
        .s("BlockStored")
        .arr(1)
        .bin(&[9; 32])
        .bin(&[8; 32])
        .arr(0)
        .u(0)
        .nil()
        .s("STORAGE")
        .nil()
        .arr(1)
        .nil()
        .u(1)
        .s("future-field")
        .arr(1)
        .s("AllBlocksCleared");
    let b = decode_batch(&input.0).unwrap();
    assert_eq!(b.dp_rank, None);
    let KvEvent::BlockStored(s) = &b.events[0] else {
        panic!("{b:?}");
    };
    assert_eq!(s.block_hashes, [ExternalBlockHash::Bytes(vec![9; 32])]);
    assert_eq!(s.parent_block_hash, Some(ExternalBlockHash::Bytes(vec![8; 32])));
    assert_eq!(s.medium, Some(Medium::Storage));
    assert_eq!(s.extra_keys, Some(vec![None]));
    assert_eq!(s.group_idx, Some(1));
    assert_eq!(b.events[1], KvEvent::AllBlocksCleared);
}

#[test]
fn unknown_event_types_are_counted_or_rejected() {
    let input = batch(3)
        .map(2)
        .s("type")
        .s("BlockPinned")
        .s("block_hashes")
        .arr(1)
        .u(1)
        .arr(2)
        .s("BlockTouched")
        .map(0)
        .map(1)
        .s("type")
        .s("AllBlocksCleared")
        .nil();
    let b = decode_batch(&input.0).unwrap();
    assert_eq!((b.unknown_events, b.events.len()), (2, 1));
    let strict = DecodeOptions {
        reject_unknown_events: true,
        ..DecodeOptions::default()
    };
    assert_eq!(
        strict.decode_batch(&input.0),
        Err(DecodeError::UnknownEventType("BlockPinned".into()))
    );
}

#[test]
fn map_batch_and_unknown_keys() {
    let input = Mp::default()
        .map(4)
        .s("events")
        .arr(1)
        .map(3)
        .s("type")
        .s("BlockRemoved")
        .s("new_field")
        .map(1)
        .s("k")
        .arr(0)
        .s("block_hashes")
        .arr(1)
        .u(7)
        .s("ts")
        .f(3.0)
        .s("data_parallel_rank")
        .u(2)
        .s("extra")
        .nil();
    let b = decode_batch(&input.0).unwrap();
    assert_eq!((b.ts, b.dp_rank), (3.0, Some(2)));
    assert_eq!(
        b.events,
        [KvEvent::BlockRemoved(BlockRemoved {
            block_hashes: vec![ExternalBlockHash::Int(7)],
            ..BlockRemoved::default()
        })]
    );
}

#[test]
fn typed_errors() {
    let err = |m: Mp| decode_batch(&m.0).unwrap_err();
    assert_eq!(decode_batch(&[]), Err(DecodeError::Truncated { offset: 0 }));
    assert!(matches!(
        err(batch(1)
            .map(2)
            .s("type")
            .s("BlockRemoved")
            .s("block_hashes")
            .arr(1)
            .s("x")
            .nil()),
        DecodeError::WrongType {
            expected: "block hash (int or bytes)",
            ..
        }
    ));
    let stored = || batch(1).map(4).s("type").s("BlockStored").s("block_hashes").arr(0);
    assert!(matches!(
        err(stored().s("block_size").u(16).s("token_ids").arr(1).i(-1).nil()),
        DecodeError::OutOfRange {
            what: "token id",
            value: -1,
            ..
        }
    ));
    assert!(matches!(
        err(stored().s("block_size").u(16).s("token_ids").arr(1).u(1 << 32).nil()),
        DecodeError::OutOfRange { what: "token id", .. }
    ));
    assert_eq!(
        err(stored().s("block_size").u(16).s("medium").nil().nil()),
        DecodeError::MissingField {
            event: "BlockStored",
            field: "token_ids"
        }
    );
    assert_eq!(
        err(batch(1).map(1).s("block_hashes").arr(0).nil()),
        DecodeError::MissingField {
            event: "event",
            field: "type"
        }
    );
    assert!(matches!(
        err(Mp::default().arr(3).s("ts")),
        DecodeError::WrongType { expected: "float", .. }
    ));
    assert_eq!(
        err(Mp::default().arr(1).f(1.0)),
        DecodeError::MissingField {
            event: "KVEventBatch",
            field: "events"
        }
    );
    assert!(matches!(
        err(batch(1).u(5).nil()),
        DecodeError::WrongType { expected: "array", .. }
    ));
    assert_eq!(err(batch(0).nil().nil()), DecodeError::TrailingBytes { extra: 1 });
}

#[test]
fn hostile_lengths_and_limits() {
    // events: array32 claiming 4 billion entries.
    let huge = batch(0).raw(&[]);
    let mut bytes = huge.0[..huge.0.len() - 1].to_vec();
    bytes.extend_from_slice(&[0xdd, 0xff, 0xff, 0xff, 0xff, 0xc0]);
    assert!(matches!(decode_batch(&bytes), Err(DecodeError::Truncated { .. })));

    let small = DecodeOptions {
        max_events: 1,
        max_token_ids: 2,
        max_depth: 2,
        ..DecodeOptions::default()
    };
    let two_events = batch(2).arr(1).s("AllBlocksCleared").arr(1).s("AllBlocksCleared").nil();
    assert_eq!(
        small.decode_batch(&two_events.0),
        Err(DecodeError::TooLarge {
            what: "events",
            len: 2,
            limit: 1
        })
    );
    let stored = |tokens: u8| {
        let mut m = batch(1).arr(5).s("BlockStored").arr(0).nil().arr(usize::from(tokens));
        for t in 0..tokens {
            m = m.u(u64::from(t));
        }
        m.u(1).nil()
    };
    assert!(small.decode_batch(&stored(2).0).is_ok());
    assert!(matches!(
        small.decode_batch(&stored(3).0),
        Err(DecodeError::TooLarge { what: "token_ids", .. })
    ));
    // extra_keys entry nested three arrays deep.
    let deep = batch(1)
        .map(5)
        .s("type")
        .s("BlockStored")
        .s("block_hashes")
        .arr(0)
        .s("token_ids")
        .arr(0)
        .s("block_size")
        .u(1)
        .s("extra_keys")
        .arr(1)
        .arr(1)
        .arr(1)
        .arr(1)
        .arr(0)
        .nil();
    assert!(matches!(small.decode_batch(&deep.0), Err(DecodeError::TooDeep { .. })));
    assert!(decode_batch(&deep.0).is_ok());
}
