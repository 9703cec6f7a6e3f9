//! A minimal, allocation-bounded msgpack reader over a borrowed buffer: the primitives the
//! KV-event decoder (`events`) is built from. It knows msgpack, not events: its errors are its
//! own [`ReadError`], which the decoder turns into `ReadError`s.
//!
//! # Why it is hand-written
//! A msgpack crate (`rmp`, or `rmp-serde` with visitors, as Dynamo decodes the same payload)
//! would parse these payloads too. This reader exists because of what the router needs from
//! its hottest input path, and what that was measured to cost (`docs/kv-events.md` §4):
//! * **zero copies**: strings, `bin` hashes and extra keys are returned as slices of the
//!   payload, and stay byte ranges in the decoder's output until someone asks for them;
//! * **reused buffers**: token ids are appended straight into the ingestor's flat buffers
//!   ([`Reader::u32s_into`]), so a batch decodes without allocating once they have grown;
//! * **bounds on hostile lengths**: a declared length is checked against the bytes left before
//!   anything is allocated, and skipping is iterative (see the invariants);
//! * **cost**: with its fast paths (eight-byte token reads through a per-marker table, fixstr
//!   and `uint64` shortcuts) and the flat buffers, `decode_batch` on the captured vLLM stream
//!   went from 3,109 to 1,748 instructions per event, and the ingestor's reusing decoder runs
//!   at 857 (callgrind). Those figures compare it with the decoder before it, which built owned
//!   events; no decoder built on `rmp` was measured.
//!
//! Property tests check every fast path against the general readers (values, errors and end
//! positions). The encoder (`events/encode.rs`) needs none of this and uses `rmp`'s writers.
//!
//! # Invariants
//! * Never panics and never reads past the buffer: every read checks the remaining length and
//!   reports [`ReadError::Truncated`] instead.
//! * A declared array/map/string length larger than the remaining input is rejected before
//!   anything is allocated (every element takes at least one byte), so a hostile length
//!   prefix cannot trigger a huge allocation; callers add semantic limits on top.
//! * [`Reader::skip`] walks nested values iteratively (a pending-item counter), so deeply
//!   nested input cannot overflow the stack.
//!
//! # Complexity
//! O(1) per header, O(n) for an n-byte string; skipping a value is O(its encoded size).

/// Why a read failed. The KV-event decoder maps each variant to the `ReadError` variant of
/// the same name and fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReadError {
    /// The input ended inside a value, or declared more elements than bytes remain.
    Truncated {
        /// Length of the input.
        offset: usize,
    },
    /// A value had another msgpack type than the read requires.
    WrongType {
        /// What was expected.
        expected: &'static str,
        /// The marker byte found.
        marker: u8,
        /// Byte offset of the value.
        offset: usize,
    },
    /// A string was not valid UTF-8.
    InvalidUtf8 {
        /// Byte offset of the string.
        offset: usize,
    },
    /// An integer did not fit the type asked for.
    OutOfRange {
        /// What the integer is (a field name).
        what: &'static str,
        /// The integer read.
        value: i128,
        /// Byte offset of the integer.
        offset: usize,
    },
}

/// msgpack markers this reader needs by name.
const NIL: u8 = 0xc0;

/// A cursor over one msgpack-encoded buffer.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }

    /// Byte offset of the next unread byte.
    #[inline]
    pub(crate) fn pos(&self) -> usize {
        self.pos
    }

    #[inline]
    pub(crate) fn set_pos(&mut self, pos: usize) {
        self.pos = pos;
    }

    #[inline]
    pub(crate) fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    #[inline]
    fn take(&mut self, n: usize) -> Result<&'a [u8], ReadError> {
        if n > self.remaining() {
            return Err(ReadError::Truncated { offset: self.buf.len() });
        }
        let out = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    #[inline]
    fn take_array<const N: usize>(&mut self) -> Result<[u8; N], ReadError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    #[inline]
    fn byte(&mut self) -> Result<u8, ReadError> {
        Ok(self.take_array::<1>()?[0])
    }

    #[inline]
    pub(crate) fn peek(&self) -> Result<u8, ReadError> {
        self.buf
            .get(self.pos)
            .copied()
            .ok_or(ReadError::Truncated { offset: self.buf.len() })
    }

    /// Reads a big-endian length of `N` bytes.
    fn len_be<const N: usize>(&mut self) -> Result<usize, ReadError> {
        let bytes = self.take_array::<N>()?;
        let v = bytes.iter().fold(0u64, |acc, &b| (acc << 8) | u64::from(b));
        // Lengths are at most u32 in msgpack, so this cannot truncate on 32/64-bit targets.
        Ok(v as usize)
    }

    /// Consumes a `nil` if one is next; returns whether it did.
    #[allow(
        clippy::inline_always,
        reason = "hot in the event decoder; plain `inline` is not taken (measured)"
    )]
    #[inline(always)]
    pub(crate) fn nil(&mut self) -> Result<bool, ReadError> {
        if self.peek()? == NIL {
            self.pos += 1;
            Ok(true)
        } else {
            Ok(false)
        }
    }

    /// Reads a boolean.
    pub(crate) fn bool(&mut self) -> Result<bool, ReadError> {
        let at = self.pos;
        match self.byte()? {
            0xc2 => Ok(false),
            0xc3 => Ok(true),
            m => Err(wrong("bool", m, at)),
        }
    }

    /// Reads an array header and checks the length against the remaining input.
    #[allow(
        clippy::inline_always,
        reason = "hot in the event decoder; plain `inline` is not taken (measured)"
    )]
    #[inline(always)]
    pub(crate) fn array_len(&mut self) -> Result<usize, ReadError> {
        let at = self.pos;
        if let Some(&m @ 0x90..=0x9f) = self.buf.get(at) {
            self.pos += 1;
            let len = usize::from(m & 0x0f);
            self.check_len(len, 1)?;
            return Ok(len);
        }
        let m = self.byte()?;
        let len = match m {
            0x90..=0x9f => usize::from(m & 0x0f),
            0xdc => self.len_be::<2>()?,
            0xdd => self.len_be::<4>()?,
            _ => return Err(wrong("array", m, at)),
        };
        self.check_len(len, 1)?;
        Ok(len)
    }

    /// Reads a map header (number of pairs) and checks it against the remaining input.
    pub(crate) fn map_len(&mut self) -> Result<usize, ReadError> {
        let at = self.pos;
        let m = self.byte()?;
        let len = match m {
            0x80..=0x8f => usize::from(m & 0x0f),
            0xde => self.len_be::<2>()?,
            0xdf => self.len_be::<4>()?,
            _ => return Err(wrong("map", m, at)),
        };
        self.check_len(len, 2)?;
        Ok(len)
    }

    /// `len` items of at least `min_item` bytes each must fit in the remaining input.
    #[inline]
    fn check_len(&self, len: usize, min_item: usize) -> Result<(), ReadError> {
        if len.saturating_mul(min_item) > self.remaining() {
            return Err(ReadError::Truncated { offset: self.buf.len() });
        }
        Ok(())
    }

    fn str_len(&mut self, m: u8) -> Result<Option<usize>, ReadError> {
        Ok(Some(match m {
            0xa0..=0xbf => usize::from(m & 0x1f),
            0xd9 => usize::from(self.byte()?),
            0xda => self.len_be::<2>()?,
            0xdb => self.len_be::<4>()?,
            _ => return Ok(None),
        }))
    }

    fn bin_len(&mut self, m: u8) -> Result<Option<usize>, ReadError> {
        Ok(Some(match m {
            0xc4 => usize::from(self.byte()?),
            0xc5 => self.len_be::<2>()?,
            0xc6 => self.len_be::<4>()?,
            _ => return Ok(None),
        }))
    }

    /// Reads a UTF-8 string.
    pub(crate) fn str(&mut self) -> Result<&'a str, ReadError> {
        let (at, bytes) = self.str_bytes()?;
        std::str::from_utf8(bytes).map_err(|_| ReadError::InvalidUtf8 { offset: at })
    }

    /// Reads a string's bytes without validating them: `(offset of the header, bytes)`. The
    /// caller validates with [`check_utf8`] unless the bytes equal a known ASCII name (then they are
    /// valid UTF-8 anyway), so errors are exactly those of [`Reader::str`].
    #[allow(
        clippy::inline_always,
        reason = "hot in the event decoder; plain `inline` is not taken (measured)"
    )]
    #[inline(always)]
    pub(crate) fn str_bytes(&mut self) -> Result<(usize, &'a [u8]), ReadError> {
        let at = self.pos;
        // Fast path: a fixstr (every key and tag msgspec writes) that fits the input.
        if let [m @ 0xa0..=0xbf, rest @ ..] = &self.buf[at..] {
            let len = usize::from(m & 0x1f);
            if let Some(bytes) = rest.get(..len) {
                self.pos = at + 1 + len;
                return Ok((at, bytes));
            }
        }
        let m = self.byte()?;
        let len = match m {
            0xa0..=0xbf => usize::from(m & 0x1f),
            0xd9 => usize::from(self.byte()?),
            0xda => self.len_be::<2>()?,
            0xdb => self.len_be::<4>()?,
            _ => return Err(wrong("string", m, at)),
        };
        Ok((at, self.take(len)?))
    }

    /// Appends `n` integers that must fit `u32` (`what` names them in errors) to `out`.
    ///
    /// The fast path covers the encodings msgpack writers use for non-negative values below
    /// 2^32 (positive fixint, uint8/16/32) at least 8 bytes before the end of the input; anything else goes
    /// through [`Reader::int_as`], so values and errors are exactly those of `n` calls to it.
    /// On error `out` holds `n` more values, some of them zero.
    pub(crate) fn u32s_into(&mut self, n: usize, out: &mut Vec<u32>, what: &'static str) -> Result<(), ReadError> {
        let base = out.len();
        out.resize(base + n, 0);
        let buf = self.buf;
        let mut pos = self.pos;
        for slot in &mut out[base..] {
            // Eight bytes at once, decoded without a branch on the (unpredictable) width.
            if let Some(chunk) = buf.get(pos..).and_then(<[u8]>::first_chunk::<8>) {
                let word = u64::from_be_bytes(*chunk);
                let Uint { len, shift, mask } = UINT[(word >> 56) as usize];
                if len != 0 {
                    pos += usize::from(len);
                    *slot = (word >> shift) as u32 & mask;
                    continue;
                }
            }
            self.pos = pos;
            *slot = self.int_as(what)?;
            pos = self.pos;
        }
        self.pos = pos;
        Ok(())
    }

    /// Reads a `uint64` (marker 0xcf) if one is next; `Ok(None)` (nothing consumed) for any
    /// other marker.
    #[inline]
    pub(crate) fn uint64(&mut self) -> Result<Option<u64>, ReadError> {
        match &self.buf[self.pos..] {
            [0xcf, rest @ ..] => match rest.first_chunk::<8>() {
                Some(b) => {
                    self.pos += 9;
                    Ok(Some(u64::from_be_bytes(*b)))
                }
                None => Err(ReadError::Truncated { offset: self.buf.len() }),
            },
            _ => Ok(None),
        }
    }

    /// Reads an integer of any msgpack width; `i128` holds every u64 and i64.
    pub(crate) fn int(&mut self) -> Result<i128, ReadError> {
        let at = self.pos;
        if let Some(&m @ 0x00..=0x7f) = self.buf.get(at) {
            self.pos += 1;
            return Ok(i128::from(m));
        }
        let m = self.byte()?;
        Ok(match m {
            0x00..=0x7f => i128::from(m),
            0xe0..=0xff => i128::from(m as i8),
            0xcc => i128::from(self.byte()?),
            0xcd => i128::from(u16::from_be_bytes(self.take_array()?)),
            0xce => i128::from(u32::from_be_bytes(self.take_array()?)),
            0xcf => i128::from(u64::from_be_bytes(self.take_array()?)),
            0xd0 => i128::from(i8::from_be_bytes(self.take_array()?)),
            0xd1 => i128::from(i16::from_be_bytes(self.take_array()?)),
            0xd2 => i128::from(i32::from_be_bytes(self.take_array()?)),
            0xd3 => i128::from(i64::from_be_bytes(self.take_array()?)),
            _ => return Err(wrong("integer", m, at)),
        })
    }

    /// Reads an integer that must fit `T`; `what` names the field in the error.
    pub(crate) fn int_as<T: TryFrom<i128>>(&mut self, what: &'static str) -> Result<T, ReadError> {
        let at = self.pos;
        let v = self.int()?;
        T::try_from(v).map_err(|_| ReadError::OutOfRange {
            what,
            value: v,
            offset: at,
        })
    }

    /// Reads a float (either width) or an integer, as `f64`.
    pub(crate) fn float(&mut self) -> Result<f64, ReadError> {
        match self.peek()? {
            0xca => {
                self.pos += 1;
                Ok(f64::from(f32::from_be_bytes(self.take_array()?)))
            }
            0xcb => {
                self.pos += 1;
                Ok(f64::from_be_bytes(self.take_array()?))
            }
            _ => self.int().map(|v| v as f64).map_err(|e| match e {
                ReadError::WrongType { marker, offset, .. } => ReadError::WrongType {
                    expected: "float",
                    marker,
                    offset,
                },
                other => other,
            }),
        }
    }

    /// Reads a `bin` value if one is next.
    pub(crate) fn bin_opt(&mut self) -> Result<Option<&'a [u8]>, ReadError> {
        let at = self.pos;
        let m = self.byte()?;
        if let Some(len) = self.bin_len(m)? {
            return self.take(len).map(Some);
        }
        self.pos = at;
        Ok(None)
    }

    /// Skips one complete value of any type without recursion.
    pub(crate) fn skip(&mut self) -> Result<(), ReadError> {
        let mut pending: usize = 1;
        while pending > 0 {
            pending -= 1;
            let m = self.byte()?;
            let payload = match m {
                0x00..=0x7f | 0xe0..=0xff | NIL | 0xc2 | 0xc3 => 0,
                0x80..=0x8f | 0xde | 0xdf => {
                    self.pos -= 1;
                    pending = pending.saturating_add(2 * self.map_len()?);
                    0
                }
                0x90..=0x9f | 0xdc | 0xdd => {
                    self.pos -= 1;
                    pending = pending.saturating_add(self.array_len()?);
                    0
                }
                0xcc | 0xd0 => 1,
                // fixext1 is a type byte plus one data byte.
                0xcd | 0xd1 | 0xd4 => 2,
                0xce | 0xd2 | 0xca => 4,
                0xcf | 0xd3 | 0xcb => 8,
                0xd5 => 3,
                0xd6 => 5,
                0xd7 => 9,
                0xd8 => 17,
                0xc7 => usize::from(self.byte()?) + 1,
                0xc8 => self.len_be::<2>()? + 1,
                0xc9 => self.len_be::<4>()? + 1,
                0xc1 => return Err(wrong("a value", m, self.pos - 1)),
                _ => match self.str_len(m)? {
                    Some(len) => len,
                    None => self.bin_len(m)?.unwrap_or(0),
                },
            };
            self.take(payload)?;
        }
        Ok(())
    }
}

/// Validates the bytes of a string read at `at` by [`Reader::str_bytes`] (the error of
/// [`Reader::str`] for invalid UTF-8).
#[inline]
pub(crate) fn check_utf8(at: usize, bytes: &[u8]) -> Result<(), ReadError> {
    // Short ASCII strings (every name and tag vLLM writes) skip the general validator.
    if bytes.is_ascii() || std::str::from_utf8(bytes).is_ok() {
        Ok(())
    } else {
        Err(ReadError::InvalidUtf8 { offset: at })
    }
}

/// How a marker encodes an unsigned integer below 2^32 within the 8 bytes starting at it:
/// bytes used (0: not such a marker), and the shift and mask extracting the value from the
/// big-endian word.
#[derive(Clone, Copy)]
struct Uint {
    len: u8,
    shift: u8,
    mask: u32,
}

/// [`Uint`] of every marker: positive fixint and uint8/16/32.
const UINT: [Uint; 256] = {
    let mut table = [Uint {
        len: 0,
        shift: 0,
        mask: 0,
    }; 256];
    let mut m = 0;
    while m < 0x80 {
        table[m] = Uint {
            len: 1,
            shift: 56,
            mask: 0x7f,
        };
        m += 1;
    }
    table[0xcc] = Uint {
        len: 2,
        shift: 48,
        mask: 0xff,
    };
    table[0xcd] = Uint {
        len: 3,
        shift: 40,
        mask: 0xffff,
    };
    table[0xce] = Uint {
        len: 5,
        shift: 24,
        mask: u32::MAX,
    };
    table
};

fn wrong(expected: &'static str, marker: u8, offset: usize) -> ReadError {
    ReadError::WrongType {
        expected,
        marker,
        offset,
    }
}

/// Bytes rich in msgpack markers, so that random inputs often parse: the input of the property
/// tests here and of the `events` readers built on this one.
#[cfg(test)]
pub(crate) fn marker_rich_bytes() -> impl proptest::strategy::Strategy<Value = Vec<u8>> {
    use proptest::prelude::*;
    let marker = prop::sample::select(vec![
        0x00, 0x05, 0x7f, 0x80, 0x81, 0x90, 0x91, 0x92, 0xa1, 0xa3, 0xc0, 0xc1, 0xc3, 0xc4, 0xca, 0xcc, 0xcd, 0xce,
        0xcf, 0xd0, 0xd3, 0xd4, 0xd9, 0xdc, 0xe0, 0xff,
    ]);
    prop::collection::vec(prop_oneof![any::<u8>(), marker], 0..48)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ints_of_every_width() {
        let cases: [(&[u8], i128); 10] = [
            (&[0x05], 5),
            (&[0xff], -1),
            (&[0xcc, 0xff], 255),
            (&[0xcd, 0x01, 0x00], 256),
            (&[0xce, 0xff, 0xff, 0xff, 0xff], 0xffff_ffff),
            (&[0xcf, 0xff, 0, 0, 0, 0, 0, 0, 1], 0xff00_0000_0000_0001),
            (&[0xd0, 0x80], -128),
            (&[0xd1, 0xff, 0x00], -256),
            (&[0xd2, 0x80, 0, 0, 0], -(1 << 31)),
            (&[0xd3, 0x80, 0, 0, 0, 0, 0, 0, 0], i128::from(i64::MIN)),
        ];
        for (bytes, want) in cases {
            assert_eq!(Reader::new(bytes).int(), Ok(want), "{bytes:02x?}");
        }
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
            assert!(matches!(r.skip(), Err(ReadError::Truncated { .. })));
        }
    }

    #[test]
    fn skip_handles_deep_nesting_without_recursion() {
        let mut deep = vec![0x91; 100_000];
        deep.push(0xc0);
        let mut r = Reader::new(&deep);
        assert_eq!(r.skip(), Ok(()));
        assert_eq!(r.remaining(), 0);
    }

    #[test]
    fn skip_covers_every_marker_family() {
        // fixmap{1: [nil, true, 1.5f32, "ab", bin"x", ext8(type 1, 2 bytes), fixext1]}
        let bytes = [
            0x81, 0x01, 0x97, 0xc0, 0xc3, 0xca, 0x3f, 0xc0, 0x00, 0x00, 0xa2, b'a', b'b', 0xc4, 0x01, b'x', 0xc7, 0x02,
            0x01, 0xaa, 0xbb, 0xd4, 0x01, 0xcc, 0x2a,
        ];
        let mut r = Reader::new(&bytes);
        r.skip().unwrap();
        assert_eq!(r.int(), Ok(42));
        assert_eq!(r.remaining(), 0);
    }

    #[test]
    fn wrong_types_are_reported_with_offsets() {
        let mut r = Reader::new(&[0xa1, b'x']);
        assert_eq!(
            r.int(),
            Err(ReadError::WrongType {
                expected: "integer",
                marker: 0xa1,
                offset: 0
            })
        );
        let mut r = Reader::new(&[0xa2, 0xff, 0xfe]);
        assert_eq!(r.str(), Err(ReadError::InvalidUtf8 { offset: 0 }));
        let mut r = Reader::new(&[0xc1]);
        assert!(matches!(r.skip(), Err(ReadError::WrongType { .. })));
    }

    #[test]
    fn bools_and_nothing_else() {
        let mut r = Reader::new(&[0xc3, 0xc2, 0xc0]);
        assert_eq!((r.bool(), r.bool()), (Ok(true), Ok(false)));
        assert_eq!(
            r.bool(),
            Err(ReadError::WrongType {
                expected: "bool",
                marker: 0xc0,
                offset: 2
            })
        );
    }

    proptest::proptest! {
        #[test]
        fn fast_paths_agree_with_the_general_readers(bytes in marker_rich_bytes(), n in 0usize..10) {
            let (mut a, mut b) = (Reader::new(&bytes), Reader::new(&bytes));
            let mut out = vec![7];
            let fast = a.u32s_into(n, &mut out, "t").map(|()| (out[1..].to_vec(), a.pos()));
            let general: Result<Vec<u32>, _> = (0..n).map(|_| b.int_as("t")).collect();
            proptest::prop_assert_eq!(fast, general.map(|v| (v, b.pos())));

            let (mut a, mut b) = (Reader::new(&bytes), Reader::new(&bytes));
            let fast = a.str_bytes().and_then(|(at, s)| check_utf8(at, s).map(|()| (s, a.pos())));
            let general = b.str().map(|s| (s.as_bytes(), b.pos()));
            proptest::prop_assert_eq!(fast, general);

            let (mut a, mut b) = (Reader::new(&bytes), Reader::new(&bytes));
            let fast = a.uint64().map(|v| v.map(|v| (v, a.pos())));
            match fast {
                Ok(Some((v, pos))) => proptest::prop_assert_eq!((b.int(), b.pos()), (Ok(i128::from(v)), pos)),
                Ok(None) => proptest::prop_assert_eq!(a.pos(), 0),
                Err(e) => proptest::prop_assert_eq!(b.int(), Err(e)),
            }
        }
    }
}
