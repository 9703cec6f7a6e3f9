//! Comparing secrets (client keys, the MACs of stored-response ids) in time that does not depend
//! on where they differ, so that a client cannot find a key or forge an id byte by byte.

/// Whether two byte strings are equal, compared in time independent of where they differ.
pub(crate) fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |diff, (x, y)| diff | (x ^ y)) == 0
}
