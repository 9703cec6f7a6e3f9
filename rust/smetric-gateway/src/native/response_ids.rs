//! The proxy's response ids (`python/smetric/serve/pinning.py`): the client never sees an
//! engine's response id; every `"id"` / `"previous_response_id"` naming a response (`resp_…`) is
//! rewritten to `{engine id}-{instance tag}-{mac}` — the tag the first 12 hex digits of the
//! SHA-256 of the instance URL, the mac the first 32 of an HMAC-SHA256 over `{engine id}\0{tag}`
//! with the key the app uses — so the app opens them for the follow-ups it pins. Ids already the
//! proxy's (they verify) and items' ids are kept. One HMAC per id; O(bytes) per rewrite.

use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};

/// Hex digits of an instance tag and of a mac.
use crate::shared::{PIN_MAC_HEX as MAC_HEX, PIN_TAG_HEX as TAG_HEX};

fn hex(bytes: &[u8], digits: usize) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    bytes
        .iter()
        .flat_map(|b| [DIGITS[usize::from(b >> 4)], DIGITS[usize::from(b & 15)]])
        .take(digits)
        .map(char::from)
        .collect()
}

/// The proxy's response ids under one key (`pinning.ResponseIds`).
pub(crate) struct ResponseIds {
    key: Vec<u8>,
}

impl ResponseIds {
    pub(crate) fn new(key: &str) -> Self {
        Self {
            key: key.as_bytes().to_vec(),
        }
    }

    /// `pinning.instance_tag`.
    pub(crate) fn tag(instance: &str) -> String {
        hex(&Sha256::digest(instance.trim_end_matches('/').as_bytes()), TAG_HEX)
    }

    fn mac(&self, engine_id: &str, tag: &str) -> String {
        let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(&self.key) else {
            unreachable!("HMAC takes a key of any length")
        };
        mac.update(engine_id.as_bytes());
        mac.update(b"\0");
        mac.update(tag.as_bytes());
        hex(&mac.finalize().into_bytes(), MAC_HEX)
    }

    pub(crate) fn issue(&self, engine_id: &str, tag: &str) -> String {
        format!("{engine_id}-{tag}-{}", self.mac(engine_id, tag))
    }

    /// Whether `id` is one this key issued.
    pub(crate) fn verifies(&self, id: &str) -> bool {
        self.open(id).is_some()
    }

    /// The engine's id and the instance tag of an id this key issued (`pinning.ResponseIds.open`),
    /// else None.
    pub(crate) fn open<'a>(&self, id: &'a str) -> Option<(&'a str, &'a str)> {
        let mut parts = id.rsplitn(3, '-');
        let (Some(mac), Some(tag), Some(engine_id)) = (parts.next(), parts.next(), parts.next()) else {
            return None;
        };
        // Compared in full whatever the input (the mac is not secret once issued, but an
        // early exit would time the comparison).
        let valid = !engine_id.is_empty()
            && tag.len() == TAG_HEX
            && super::secret::same_bytes(self.mac(engine_id, tag).as_bytes(), mac.as_bytes());
        valid.then_some((engine_id, tag))
    }

    /// `data` with each `"id"` / `"previous_response_id"` naming a response of the instance
    /// tagged `tag` as the proxy's id (`responses.rewrite_ids`: the pattern
    /// `"(id|previous_response_id)":\s*"([^"\\]+)"`, left to right).
    pub(crate) fn rewrite(&self, data: &[u8], tag: &str) -> Vec<u8> {
        let mut out = Vec::with_capacity(data.len() + 64);
        let mut copied = 0;
        let mut at = 0;
        while at < data.len() {
            let Some(found) = find_id_field(data, at) else { break };
            let (start, key, value_start, value_end) = found;
            let value = std::str::from_utf8(&data[value_start..value_end]).unwrap_or("");
            let keep = value.is_empty() || (!value.starts_with("resp_") && key == b"id") || self.verifies(value);
            if !keep {
                out.extend_from_slice(&data[copied..start]);
                out.push(b'"');
                out.extend_from_slice(key);
                out.extend_from_slice(b"\":\"");
                out.extend_from_slice(self.issue(value, tag).as_bytes());
                out.push(b'"');
                copied = value_end + 1;
            }
            at = value_end + 1;
        }
        out.extend_from_slice(&data[copied..]);
        out
    }
}

/// The next match of the id pattern at or after `from`: `(start, key, value start, value end)`.
fn find_id_field(data: &[u8], from: usize) -> Option<(usize, &'static [u8], usize, usize)> {
    let mut i = from;
    while i < data.len() {
        let rest = &data[i..];
        let key: &'static [u8] = if rest.starts_with(b"\"id\":") {
            b"id"
        } else if rest.starts_with(b"\"previous_response_id\":") {
            b"previous_response_id"
        } else {
            i += 1;
            continue;
        };
        let mut j = i + key.len() + 3; // the quotes and the colon
        while data.get(j).is_some_and(|b| b" \t\n\r\x0b\x0c".contains(b)) {
            j += 1;
        }
        if data.get(j) == Some(&b'"') {
            let value_start = j + 1;
            let end = data[value_start..]
                .iter()
                .position(|&b| b == b'"' || b == b'\\')
                .map(|p| value_start + p);
            if let Some(end) = end
                && data[end] == b'"'
                && end > value_start
            {
                return Some((i, key, value_start, end));
            }
        }
        i += 1;
    }
    None
}
