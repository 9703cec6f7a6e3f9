//! A tiny msgpack writer for the unit tests' hand-made payloads (the decoder's and the
//! ingestor's): each method appends one value with the marker the test names, so a test can
//! build exactly the bytes it needs, well-formed or not.

/// A msgpack byte string under construction.
#[derive(Default)]
pub(crate) struct Mp(pub(crate) Vec<u8>);

impl Mp {
    /// An array or map header: the fix form below 16 entries, else the 32-bit form.
    fn head(mut self, fix: u8, big: u8, n: usize) -> Self {
        if n < 16 {
            self.0.push(fix | n as u8);
        } else {
            self.0.push(big);
            self.0.extend_from_slice(&(n as u32).to_be_bytes());
        }
        self
    }
    pub(crate) fn arr(self, n: usize) -> Self {
        self.head(0x90, 0xdd, n)
    }
    pub(crate) fn map(self, n: usize) -> Self {
        self.head(0x80, 0xdf, n)
    }
    /// A str8.
    pub(crate) fn s(mut self, s: &str) -> Self {
        self.0.push(0xd9);
        self.0
            .push(u8::try_from(s.len()).expect("a test string under 256 bytes"));
        self.0.extend_from_slice(s.as_bytes());
        self
    }
    /// A uint64.
    pub(crate) fn u(mut self, v: u64) -> Self {
        self.0.push(0xcf);
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    /// An int64.
    pub(crate) fn i(mut self, v: i64) -> Self {
        self.0.push(0xd3);
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    pub(crate) fn nil(mut self) -> Self {
        self.0.push(0xc0);
        self
    }
    /// A float64.
    pub(crate) fn f(mut self, v: f64) -> Self {
        self.0.push(0xcb);
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    /// A bin8.
    pub(crate) fn bin(mut self, b: &[u8]) -> Self {
        self.0.push(0xc4);
        self.0.push(u8::try_from(b.len()).expect("test bytes under 256"));
        self.0.extend_from_slice(b);
        self
    }
    /// Bytes as they are.
    pub(crate) fn raw(mut self, b: &[u8]) -> Self {
        self.0.extend_from_slice(b);
        self
    }
}
