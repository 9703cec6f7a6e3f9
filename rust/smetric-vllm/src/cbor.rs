//! Byte-exact `cbor2.dumps(obj, canonical=True)` for the [`Obj`] model.
//!
//! # Algorithm
//! RFC 8949 deterministic encoding of the few types vLLM hashes: tuples become definite-length
//! arrays (major type 4), `bytes` byte strings (2), `str` text strings (3), `None` the simple
//! value `0xf6`, and ints major type 0 (non-negative) or 1 (negative, encoding `-1 - v`).
//! Every length and int uses its shortest head (1, 2, 3, 5 or 9 bytes). Maps, floats and
//! bignums never occur in vLLM's hash inputs, so canonical key ordering is not needed.
//! CBOR has no notion of object identity, so shared tags encode like any other string.
//!
//! # Complexity
//! O(size of the output).

use crate::obj::Obj;

const MAJOR_UINT: u8 = 0;
const MAJOR_NEGINT: u8 = 1;
const MAJOR_BYTES: u8 = 2;
const MAJOR_TEXT: u8 = 3;
const MAJOR_ARRAY: u8 = 4;
const SIMPLE_NULL: u8 = 0xf6;
/// Additional-information values announcing a 1-, 2-, 4- or 8-byte argument.
const ARG_U8: u8 = 0x18;
const ARG_U16: u8 = 0x19;
const ARG_U32: u8 = 0x1a;
const ARG_U64: u8 = 0x1b;

/// Appends the canonical CBOR encoding of `obj` to `out` (which is cleared first).
pub(crate) fn dumps_into(obj: &Obj<'_>, out: &mut Vec<u8>) {
    out.clear();
    encode(obj, out);
}

fn encode(obj: &Obj<'_>, out: &mut Vec<u8>) {
    match obj {
        Obj::None => out.push(SIMPLE_NULL),
        Obj::Int(v) => match u64::try_from(*v) {
            Ok(u) => head(MAJOR_UINT, u, out),
            // -1 - v for v < 0 is !v reinterpreted as unsigned.
            Err(_) => head(MAJOR_NEGINT, !*v as u64, out),
        },
        Obj::Str(s) | Obj::Tag(s) => {
            head(MAJOR_TEXT, s.len() as u64, out);
            out.extend_from_slice(s.as_bytes());
        }
        Obj::Bytes(b) => {
            head(MAJOR_BYTES, b.len() as u64, out);
            out.extend_from_slice(b);
        }
        Obj::Tokens(tokens) => {
            head(MAJOR_ARRAY, tokens.len() as u64, out);
            for &t in *tokens {
                head(MAJOR_UINT, u64::from(t), out);
            }
        }
        Obj::Tuple(items) => {
            head(MAJOR_ARRAY, items.len() as u64, out);
            for item in items {
                encode(item, out);
            }
        }
    }
}

/// Writes the shortest head for `major` with argument `v`.
fn head(major: u8, v: u64, out: &mut Vec<u8>) {
    let m = major << 5;
    if v < 24 {
        out.push(m | v as u8); // v < 24 fits the initial byte
    } else if let Ok(b) = u8::try_from(v) {
        out.extend_from_slice(&[m | ARG_U8, b]);
    } else if let Ok(h) = u16::try_from(v) {
        out.push(m | ARG_U16);
        out.extend_from_slice(&h.to_be_bytes());
    } else if let Ok(w) = u32::try_from(v) {
        out.push(m | ARG_U32);
        out.extend_from_slice(&w.to_be_bytes());
    } else {
        out.push(m | ARG_U64);
        out.extend_from_slice(&v.to_be_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dumps(obj: &Obj<'_>) -> Vec<u8> {
        let mut out = Vec::new();
        dumps_into(obj, &mut out);
        out
    }

    // Expected bytes are `cbor2.dumps(obj, canonical=True)`.

    #[test]
    fn ints_use_shortest_heads() {
        let cases: [(i64, &[u8]); 10] = [
            (0, &[0x00]),
            (23, &[0x17]),
            (24, &[0x18, 24]),
            (255, &[0x18, 0xff]),
            (256, &[0x19, 1, 0]),
            (65536, &[0x1a, 0, 1, 0, 0]),
            (0x1_0000_0000, &[0x1b, 0, 0, 0, 1, 0, 0, 0, 0]),
            (-1, &[0x20]),
            (-25, &[0x38, 24]),
            (i64::MIN, &[0x3b, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]),
        ];
        for (v, expected) in cases {
            assert_eq!(dumps(&Obj::Int(v)), expected, "int {v}");
        }
    }

    #[test]
    fn hash_input_layout() {
        let parent = [0xabu8; 2];
        let obj = Obj::Tuple(vec![
            Obj::Bytes(&parent),
            Obj::Tokens(&[1, 300, u32::MAX]),
            Obj::Tuple(vec![Obj::Tuple(vec![Obj::Tag("cache_salt"), Obj::Str("s")])]),
        ]);
        let mut expected = vec![0x83, 0x42, 0xab, 0xab, 0x83, 0x01, 0x19, 0x01, 0x2c];
        expected.extend_from_slice(&[0x1a, 0xff, 0xff, 0xff, 0xff, 0x81, 0x82, 0x6a]);
        expected.extend_from_slice(b"cache_salt");
        expected.extend_from_slice(&[0x61, b's']);
        assert_eq!(dumps(&obj), expected);
        assert_eq!(dumps(&Obj::None), [0xf6]);
    }
}
