//! Byte-exact `pickle.dumps(obj, protocol=5)` for the [`Obj`] model, as CPython's C pickler
//! writes it.
//!
//! # Algorithm
//! A single recursive walk that emits the same opcodes, in the same order, as CPython's
//! `_pickle.c`:
//! * `PROTO 5`, then every later write goes into a `FRAME`. A frame is opened lazily by the
//!   first write after the previous one was committed; at the start of each object's save,
//!   a frame holding at least 64 KiB is committed. A committed frame shorter than 4 bytes
//!   loses its 9-byte header. The last frame ends with `STOP`.
//! * `str`/`bytes` payloads of 64 KiB or more bypass framing: the open frame is committed,
//!   the header and payload are written unframed, and the next write opens a new frame.
//! * ints: `BININT1`/`BININT2`/`BININT` when they fit a signed 32-bit int, else `LONG1` with
//!   the minimal little-endian two's-complement bytes.
//! * tuples: `EMPTY_TUPLE` (never memoized); 1–3 items then `TUPLE1..3`; longer ones between
//!   `MARK` and `TUPLE`.
//! * every `str`, `bytes` and non-empty tuple is followed by `MEMOIZE`; an object that is
//!   already in the memo (the same object, see [`crate::obj`]) is written as `BINGET` /
//!   `LONG_BINGET` instead.
//!
//! # Invariants
//! Only shared objects ([`Obj::Tag`]) are looked up, keyed by value; every other object still
//! takes a memo slot so later indices stay aligned with CPython's.
//!
//! # Complexity
//! O(size of the output); the memo lookup is a linear scan over the handful of tags a vLLM
//! hash input can contain.

use crate::obj::Obj;

const PROTO: u8 = 0x80;
const FRAME: u8 = 0x95;
const MEMOIZE: u8 = 0x94;
const BINGET: u8 = b'h';
const LONG_BINGET: u8 = b'j';
const STOP: u8 = b'.';
const NONE: u8 = b'N';
const MARK: u8 = b'(';
const TUPLE: u8 = b't';
const EMPTY_TUPLE: u8 = b')';
const TUPLE_N: [u8; 3] = [0x85, 0x86, 0x87];
const BININT: u8 = b'J';
const BININT1: u8 = b'K';
const BININT2: u8 = b'M';
const LONG1: u8 = 0x8a;
const SHORT_BINBYTES: u8 = b'C';
const BINBYTES: u8 = b'B';
const BINBYTES8: u8 = 0x8e;
const SHORT_BINUNICODE: u8 = 0x8c;
const BINUNICODE: u8 = b'X';
const BINUNICODE8: u8 = 0x8d;

/// CPython's `_FRAME_SIZE_TARGET`: frames are committed once they reach this size.
const FRAME_SIZE_TARGET: usize = 64 * 1024;
/// CPython's `FRAME_SIZE_MIN`: smaller frames are written without a header.
const FRAME_SIZE_MIN: usize = 4;
/// `FRAME` opcode plus its little-endian u64 length.
const FRAME_HEADER_SIZE: usize = 9;

struct Pickler<'o> {
    out: &'o mut Vec<u8>,
    framing: bool,
    frame_start: Option<usize>,
    memo_len: u32,
    /// Memo indices of the shared tag strings written so far.
    tags: Vec<(&'static str, u32)>,
}

/// Appends `pickle.dumps(obj, protocol=5)` to `out` (which is cleared first).
pub(crate) fn dumps_into(obj: &Obj<'_>, out: &mut Vec<u8>) {
    out.clear();
    let mut p = Pickler {
        out,
        framing: false,
        frame_start: None,
        memo_len: 0,
        tags: Vec::new(),
    };
    p.write(&[PROTO, 5]);
    p.framing = true;
    p.save(obj);
    p.write(&[STOP]);
    p.commit_frame();
}

impl Pickler<'_> {
    fn write(&mut self, data: &[u8]) {
        if self.framing && self.frame_start.is_none() {
            self.frame_start = Some(self.out.len());
            self.out.extend_from_slice(&[0; FRAME_HEADER_SIZE]);
        }
        self.out.extend_from_slice(data);
    }

    fn commit_frame(&mut self) {
        let Some(start) = self.frame_start.take() else {
            return;
        };
        let frame_len = self.out.len() - start - FRAME_HEADER_SIZE;
        if frame_len >= FRAME_SIZE_MIN {
            self.out[start] = FRAME;
            self.out[start + 1..start + FRAME_HEADER_SIZE].copy_from_slice(&(frame_len as u64).to_le_bytes());
        } else {
            self.out.drain(start..start + FRAME_HEADER_SIZE);
        }
    }

    /// CPython's `_Pickler_OpcodeBoundary`, run at the start of every `save`.
    fn opcode_boundary(&mut self) {
        if let Some(start) = self.frame_start
            && self.out.len() - start - FRAME_HEADER_SIZE >= FRAME_SIZE_TARGET
        {
            self.commit_frame();
        }
    }

    /// Writes an opcode header and its payload; large payloads go outside any frame.
    fn write_payload(&mut self, header: &[u8], data: &[u8]) {
        if data.len() >= FRAME_SIZE_TARGET {
            self.commit_frame();
            self.framing = false;
            self.write(header);
            self.write(data);
            self.framing = true;
        } else {
            self.write(header);
            self.write(data);
        }
    }

    fn memoize(&mut self, tag: Option<&'static str>) {
        if let Some(tag) = tag {
            self.tags.push((tag, self.memo_len));
        }
        self.write(&[MEMOIZE]);
        self.memo_len += 1;
    }

    /// Writes a memo reference if `tag` is already memoized; returns whether it did.
    fn try_get(&mut self, tag: &str) -> bool {
        let Some(&(_, idx)) = self.tags.iter().find(|(t, _)| *t == tag) else {
            return false;
        };
        if let Ok(small) = u8::try_from(idx) {
            self.write(&[BINGET, small]);
        } else {
            let mut op = [LONG_BINGET, 0, 0, 0, 0];
            op[1..].copy_from_slice(&idx.to_le_bytes());
            self.write(&op);
        }
        true
    }

    fn save(&mut self, obj: &Obj<'_>) {
        self.opcode_boundary();
        match obj {
            Obj::None => self.write(&[NONE]),
            Obj::Int(v) => self.save_int(*v),
            Obj::Str(s) => self.save_str(s, None),
            Obj::Tag(tag) => {
                if !self.try_get(tag) {
                    self.save_str(tag, Some(tag));
                }
            }
            Obj::Bytes(b) => self.save_bytes(b),
            Obj::Tokens(tokens) => self.save_tuple(tokens.len(), |p, i| {
                p.opcode_boundary();
                p.save_int(i64::from(tokens[i]));
            }),
            Obj::Tuple(items) => self.save_tuple(items.len(), |p, i| p.save(&items[i])),
        }
    }

    fn save_int(&mut self, v: i64) {
        if let Ok(v32) = i32::try_from(v) {
            let b = v32.to_le_bytes();
            if b[2] != 0 || b[3] != 0 {
                self.write(&[BININT, b[0], b[1], b[2], b[3]]);
            } else if b[1] != 0 {
                self.write(&[BININT2, b[0], b[1]]);
            } else {
                self.write(&[BININT1, b[0]]);
            }
            return;
        }
        // LONG1: one byte more than the magnitude's bit length needs (room for the sign),
        // minus one for negatives whose top byte is pure sign extension.
        let nbits = 64 - v.unsigned_abs().leading_zeros() as usize;
        let mut n = nbits / 8 + 1;
        let bytes = i128::from(v).to_le_bytes();
        if v < 0 && n > 1 && bytes[n - 1] == 0xff && bytes[n - 2] & 0x80 != 0 {
            n -= 1;
        }
        let mut op = Vec::with_capacity(2 + n);
        op.extend_from_slice(&[LONG1, n as u8]);
        op.extend_from_slice(&bytes[..n]);
        self.write(&op);
    }

    fn save_str(&mut self, s: &str, tag: Option<&'static str>) {
        let data = s.as_bytes();
        let mut header = [0u8; 9];
        let header_len = sized_header(&mut header, data.len(), SHORT_BINUNICODE, BINUNICODE, BINUNICODE8);
        self.write_payload(&header[..header_len], data);
        self.memoize(tag);
    }

    fn save_bytes(&mut self, b: &[u8]) {
        let mut header = [0u8; 9];
        let header_len = sized_header(&mut header, b.len(), SHORT_BINBYTES, BINBYTES, BINBYTES8);
        self.write_payload(&header[..header_len], b);
        self.memoize(None);
    }

    fn save_tuple(&mut self, len: usize, mut save_item: impl FnMut(&mut Self, usize)) {
        if len == 0 {
            self.write(&[EMPTY_TUPLE]);
            return;
        }
        if len <= 3 {
            for i in 0..len {
                save_item(self, i);
            }
            self.write(&[TUPLE_N[len - 1]]);
        } else {
            self.write(&[MARK]);
            for i in 0..len {
                save_item(self, i);
            }
            self.write(&[TUPLE]);
        }
        // A tuple is never shared across vLLM hash inputs, so it never needs BINGET later.
        self.memoize(None);
    }
}

/// Fills `header` with the 1-, 4- or 8-byte length form of a `str`/`bytes` opcode.
fn sized_header(header: &mut [u8; 9], len: usize, short: u8, long4: u8, long8: u8) -> usize {
    if let Ok(len8) = u8::try_from(len) {
        header[0] = short;
        header[1] = len8;
        2
    } else if let Ok(len32) = u32::try_from(len) {
        header[0] = long4;
        header[1..5].copy_from_slice(&len32.to_le_bytes());
        5
    } else {
        header[0] = long8;
        header[1..9].copy_from_slice(&(len as u64).to_le_bytes());
        9
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dumps_hex(obj: &Obj<'_>) -> String {
        use std::fmt::Write;
        let mut out = Vec::new();
        dumps_into(obj, &mut out);
        out.iter().fold(String::new(), |mut s, x| {
            let _ = write!(s, "{x:02x}");
            s
        })
    }

    // Every expected string below is CPython 3.11's `pickle.dumps(obj, 5).hex()`.

    #[test]
    fn none_hash_seed() {
        assert_eq!(
            dumps_hex(&Obj::Str("vllm-none-hash")),
            "80059512000000000000008c0e766c6c6d2d6e6f6e652d68617368942e"
        );
    }

    #[test]
    fn payloads_under_four_bytes_are_unframed() {
        assert_eq!(dumps_hex(&Obj::None), "80054e2e");
        assert_eq!(dumps_hex(&Obj::Int(255)), "80054bff2e");
        assert_eq!(dumps_hex(&Obj::Tuple(vec![])), "8005292e");
    }

    #[test]
    fn int_opcodes() {
        let cases: [(i64, &str); 14] = [
            (0, "80054b002e"),
            (256, "80059504000000000000004d00012e"),
            (65535, "80059504000000000000004dffff2e"),
            (65536, "80059506000000000000004a000001002e"),
            (-1, "80059506000000000000004affffffff2e"),
            (-128, "80059506000000000000004a80ffffff2e"),
            (0x7fff_ffff, "80059506000000000000004affffff7f2e"),
            (-0x8000_0000, "80059506000000000000004a000000802e"),
            (0x8000_0000, "80059508000000000000008a0500000080002e"),
            (0xffff_ffff, "80059508000000000000008a05ffffffff002e"),
            (-0x8000_0001, "80059508000000000000008a05ffffff7fff2e"),
            (-0x80_0000_0000, "80059508000000000000008a0500000000802e"),
            (i64::MIN, "8005950b000000000000008a0800000000000000802e"),
            (i64::MAX, "8005950b000000000000008a08ffffffffffffff7f2e"),
        ];
        for (v, expected) in cases {
            assert_eq!(dumps_hex(&Obj::Int(v)), expected, "int {v}");
        }
    }

    #[test]
    fn repeated_tag_is_a_memo_reference() {
        let obj = Obj::Tuple(vec![
            Obj::Tuple(vec![Obj::Tag("mm"), Obj::Str("id1"), Obj::Int(0)]),
            Obj::Tuple(vec![Obj::Tag("mm"), Obj::Str("id2"), Obj::Int(4)]),
        ]);
        assert_eq!(
            dumps_hex(&obj),
            "8005951e000000000000008c026d6d948c03696431944b00879468008c03696432944b04879486942e"
        );
    }

    #[test]
    fn equal_runtime_strings_are_distinct_objects() {
        let obj = Obj::Tuple(vec![Obj::Str("ab"), Obj::Str("ab")]);
        assert_eq!(dumps_hex(&obj), "8005950d000000000000008c026162948c0261629486942e");
    }

    #[test]
    fn empty_tuple_is_not_memoized() {
        assert_eq!(
            dumps_hex(&Obj::Tuple(vec![Obj::Tuple(vec![])])),
            "80059504000000000000002985942e"
        );
    }

    #[test]
    fn large_payload_is_written_outside_frames() {
        let big = vec![7u8; FRAME_SIZE_TARGET];
        let mut out = Vec::new();
        dumps_into(&Obj::Tuple(vec![Obj::Bytes(&big), Obj::None]), &mut out);
        // PROTO, unframed BINBYTES header and payload, then a fresh 5-byte frame.
        assert_eq!(&out[..7], &[0x80, 5, b'B', 0, 0, 1, 0]);
        assert_eq!(
            &out[7 + FRAME_SIZE_TARGET..],
            &[0x95, 5, 0, 0, 0, 0, 0, 0, 0, 0x94, b'N', 0x86, 0x94, b'.']
        );
    }
}
