//! Server-sent events as the relays split them (`python/smetric/serve/apis`' stream states):
//! an event is the bytes between `\n\n` separators, kept whole across chunk boundaries, and is
//! scanned by byte searches; O(chunk bytes) a chunk.

/// Whether `needle` occurs in `haystack`.
pub(crate) fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// What follows an event's first `data:` (empty when it has none).
pub(crate) fn data_of(event: &[u8]) -> &[u8] {
    event
        .windows(5)
        .position(|w| w == b"data:")
        .map_or(&event[..0], |at| &event[at + 5..])
}

/// The part of a stream not yet split into events.
#[derive(Default)]
pub(crate) struct Pending(Vec<u8>);

impl Pending {
    /// Appends `chunk` and gives each complete event (without its separator) to `each`.
    pub(crate) fn feed(&mut self, chunk: &[u8], mut each: impl FnMut(&[u8])) {
        self.0.extend_from_slice(chunk);
        let mut start = 0;
        while let Some(at) = self.0[start..].windows(2).position(|w| w == b"\n\n") {
            each(&self.0[start..start + at]);
            start += at + 2;
        }
        self.0.drain(..start);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_split_across_chunks() {
        let mut pending = Pending::default();
        let mut events = Vec::new();
        for chunk in [&b"data: a\n"[..], b"\ndata: b\n\nda", b"ta: c", b"\n\n"] {
            pending.feed(chunk, |e| events.push(e.to_vec()));
        }
        assert_eq!(events, [&b"data: a"[..], b"data: b", b"data: c"]);
        assert_eq!(data_of(b"event: x\ndata: {}"), b" {}");
        assert!(contains(b"abc", b"bc") && !contains(b"abc", b"cb"));
    }
}
