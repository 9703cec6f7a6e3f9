//! The free-form values of `BlockStored.extra_keys`, read into [`EventValue`] trees.
//!
//! # Algorithm
//! [`read_value`] dispatches on the next msgpack marker: scalars through the reader's
//! primitives, arrays and maps by recursion one level deeper, `bin` and strings copied out of
//! the payload. [`check_value`] walks the same grammar without building anything: the decoder
//! validates extra keys with it while decoding into its raw form, and builds them only when the
//! owned [`KvEventBatch`](super::KvEventBatch) is asked for.
//!
//! # Invariants
//! * The two functions accept the same inputs, fail with the same errors and stop at the same
//!   position (a property test checks it).
//! * Recursion is bounded by `depth` containers ([`DecodeError::TooDeep`] beyond it), so
//!   hostile nesting cannot overflow the stack; declared lengths are bounded by the reader.
//! * Only plain msgpack is accepted: ext types and the reserved `0xc1` marker have no meaning
//!   in KV events and are a [`DecodeError::WrongType`].
//!
//! # Complexity
//! O(encoded size of the value), one allocation per container and per string or `bin` for
//! [`read_value`], none for [`check_value`].

use super::{DecodeError, EventValue};
use crate::msgpack::Reader;

/// Whether `m` starts a map (fixmap, map16, map32).
fn is_map(m: u8) -> bool {
    matches!(m, 0x80..=0x8f | 0xde | 0xdf)
}

/// Whether `m` starts a string (fixstr, str8/16/32).
fn is_str(m: u8) -> bool {
    matches!(m, 0xa0..=0xbf | 0xd9..=0xdb)
}

fn not_plain(marker: u8, offset: usize) -> DecodeError {
    DecodeError::WrongType {
        expected: "a plain msgpack value",
        marker,
        offset,
    }
}

/// Checks one value exactly as [`read_value`] would read it (same acceptance, same errors,
/// same end position) without building it.
pub(crate) fn check_value(r: &mut Reader<'_>, depth: usize) -> Result<(), DecodeError> {
    let at = r.pos();
    let m = r.peek()?;
    match m {
        // nil and the booleans are one byte each.
        0xc0 | 0xc2 | 0xc3 => r.skip()?,
        0xca | 0xcb => {
            r.float()?;
        }
        0x00..=0x7f | 0xe0..=0xff | 0xcc..=0xd3 => {
            r.int()?;
        }
        0x90..=0x9f | 0xdc | 0xdd | 0x80..=0x8f | 0xde | 0xdf => {
            let Some(depth) = depth.checked_sub(1) else {
                return Err(DecodeError::TooDeep { offset: at });
            };
            let items = if is_map(m) { 2 * r.map_len()? } else { r.array_len()? };
            for _ in 0..items {
                check_value(r, depth)?;
            }
        }
        _ => {
            if r.bin_opt()?.is_none() {
                if is_str(m) {
                    r.str()?;
                } else {
                    return Err(not_plain(m, at));
                }
            }
        }
    }
    Ok(())
}

/// Reads any value into an owned tree, at most `depth` containers deep.
pub(crate) fn read_value(r: &mut Reader<'_>, depth: usize) -> Result<EventValue, DecodeError> {
    let at = r.pos();
    let m = r.peek()?;
    Ok(match m {
        0xc0 => {
            r.skip()?;
            EventValue::Nil
        }
        0xc2 | 0xc3 => EventValue::Bool(r.bool()?),
        0xca | 0xcb => EventValue::Float(r.float()?),
        0x00..=0x7f | 0xe0..=0xff | 0xcc..=0xd3 => {
            let v = r.int()?;
            match i64::try_from(v) {
                Ok(i) => EventValue::Int(i),
                // Only u64 values above i64::MAX land here.
                Err(_) => EventValue::UInt(v as u64),
            }
        }
        0x90..=0x9f | 0xdc | 0xdd | 0x80..=0x8f | 0xde | 0xdf => {
            let Some(depth) = depth.checked_sub(1) else {
                return Err(DecodeError::TooDeep { offset: at });
            };
            if is_map(m) {
                let n = r.map_len()?;
                let mut pairs = Vec::with_capacity(n);
                for _ in 0..n {
                    pairs.push((read_value(r, depth)?, read_value(r, depth)?));
                }
                EventValue::Map(pairs)
            } else {
                let n = r.array_len()?;
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    items.push(read_value(r, depth)?);
                }
                EventValue::Array(items)
            }
        }
        _ => {
            if let Some(b) = r.bin_opt()? {
                EventValue::Bytes(b.to_vec())
            } else if is_str(m) {
                EventValue::Str(r.str()?.to_owned())
            } else {
                return Err(not_plain(m, at));
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::msgpack::marker_rich_bytes;

    #[test]
    fn reads_every_plain_type() {
        // [nil, true, -1, u64::MAX, 1.5f32, "ab", bin"x", {1: []}]
        let bytes = [
            0x98, 0xc0, 0xc3, 0xff, 0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xca, 0x3f, 0xc0, 0x00, 0x00,
            0xa2, b'a', b'b', 0xc4, 0x01, b'x', 0x81, 0x01, 0x90,
        ];
        let want = EventValue::Array(vec![
            EventValue::Nil,
            EventValue::Bool(true),
            EventValue::Int(-1),
            EventValue::UInt(u64::MAX),
            EventValue::Float(1.5),
            EventValue::Str("ab".into()),
            EventValue::Bytes(b"x".to_vec()),
            EventValue::Map(vec![(EventValue::Int(1), EventValue::Array(vec![]))]),
        ]);
        let mut r = Reader::new(&bytes);
        assert_eq!(read_value(&mut r, 3), Ok(want));
        assert_eq!(r.remaining(), 0);
        assert!(matches!(
            read_value(&mut Reader::new(&[0xd4, 0x01, 0x00]), 2),
            Err(DecodeError::WrongType { offset: 0, .. })
        ));
    }

    #[test]
    fn huge_declared_lengths_fail_before_allocating() {
        for bytes in [
            &[0xdd, 0xff, 0xff, 0xff, 0xff, 0x00][..],
            &[0xdf, 0xff, 0xff, 0xff, 0xff][..],
            &[0xdb, 0xff, 0xff, 0xff, 0xff, b'a'][..],
            &[0xc6, 0x7f, 0xff, 0xff, 0xff][..],
        ] {
            let mut r = Reader::new(bytes);
            assert!(matches!(read_value(&mut r, 8), Err(DecodeError::Truncated { .. })));
        }
    }

    #[test]
    fn nesting_is_bounded_by_depth() {
        let mut deep = vec![0x91; 100_000];
        deep.push(0xc0);
        assert!(matches!(
            read_value(&mut Reader::new(&deep), 16),
            Err(DecodeError::TooDeep { .. })
        ));
        assert!(matches!(
            check_value(&mut Reader::new(&deep), 16),
            Err(DecodeError::TooDeep { .. })
        ));
    }

    proptest::proptest! {
        #[test]
        fn check_value_agrees_with_read_value(bytes in marker_rich_bytes(), depth in 0usize..4) {
            let (mut a, mut b) = (Reader::new(&bytes), Reader::new(&bytes));
            let read = read_value(&mut a, depth).map(|_| a.pos());
            let checked = check_value(&mut b, depth).map(|()| b.pos());
            proptest::prop_assert_eq!(read, checked);
        }
    }
}
