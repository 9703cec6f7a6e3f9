//! The ZMQ multipart framing of vLLM's `ZmqEventPublisher` (socket handling lives elsewhere).
//!
//! # Format
//! * PUB → SUB: `[topic (UTF-8), seq (8 bytes, big-endian, from 0 per publisher process),
//!   payload]`. A sequence number lower than the last one seen means the publisher restarted.
//! * Replay: a DEALER sends [`replay_request`] `[b"", start_seq]` to the publisher's ROUTER and
//!   receives `[b"", topic, seq, payload]` for every buffered batch with `seq >= start_seq`,
//!   then the end marker `[b"", b"", 0xFF×8, b""]`. vLLM ≤0.25 omitted the topic frame:
//!   `[b"", seq, payload]`, ending with `[b"", 0xFF×8, b""]`. Both are accepted.
//!
//! # Complexity
//! O(payload size): the frames are only checked, and the payload is decoded once.

use crate::events::{DecodeError, DecodeOptions, KvEventBatch};

/// The sequence number of the replay end marker (`-1` as a signed 64-bit int).
pub const END_SEQ: u64 = u64::MAX;

/// One published batch with its topic and sequence number.
#[derive(Debug, Clone, PartialEq)]
pub struct KvEventMessage {
    /// The publisher's topic (`""` by default; llm-d uses `kv@<pod-ip>:<port>@<model>`).
    pub topic: String,
    /// Per-publisher sequence number.
    pub seq: u64,
    /// The decoded payload.
    pub batch: KvEventBatch,
}

/// One reply on the replay socket.
#[derive(Debug, Clone, PartialEq)]
pub enum ReplayReply {
    /// A buffered batch.
    Batch(KvEventMessage),
    /// No more buffered batches.
    End,
}

/// The frames a DEALER sends to ask for every buffered batch with `seq >= start_seq`.
pub fn replay_request(start_seq: u64) -> [Vec<u8>; 2] {
    [Vec::new(), start_seq.to_be_bytes().to_vec()]
}

/// Decodes a PUB message with [`DecodeOptions::default`].
pub fn decode_pub_message<F: AsRef<[u8]>>(frames: &[F]) -> Result<KvEventMessage, DecodeError> {
    DecodeOptions::default().decode_pub_message(frames)
}

/// Decodes a replay reply with [`DecodeOptions::default`].
pub fn decode_replay_reply<F: AsRef<[u8]>>(frames: &[F]) -> Result<ReplayReply, DecodeError> {
    DecodeOptions::default().decode_replay_reply(frames)
}

impl DecodeOptions {
    /// Decodes the 3 frames `[topic, seq, payload]` of a PUB message.
    pub fn decode_pub_message<F: AsRef<[u8]>>(&self, frames: &[F]) -> Result<KvEventMessage, DecodeError> {
        let [topic, seq, payload] = frames else {
            return Err(DecodeError::FrameCount {
                expected: "3",
                got: frames.len(),
            });
        };
        self.message(topic.as_ref(), seq.as_ref(), payload.as_ref())
    }

    /// Decodes one reply received on a DEALER connected to the replay ROUTER
    /// (4 frames since vLLM 0.26, 3 before).
    pub fn decode_replay_reply<F: AsRef<[u8]>>(&self, frames: &[F]) -> Result<ReplayReply, DecodeError> {
        Ok(match replay_frames(frames)? {
            ReplayFrames::End => ReplayReply::End,
            ReplayFrames::Batch { topic, seq, payload } => ReplayReply::Batch(KvEventMessage {
                topic: topic.to_owned(),
                seq,
                batch: self.decode_batch(payload)?,
            }),
        })
    }

    fn message(&self, topic: &[u8], seq: &[u8], payload: &[u8]) -> Result<KvEventMessage, DecodeError> {
        let topic = std::str::from_utf8(topic).map_err(|_| DecodeError::InvalidTopic)?;
        Ok(KvEventMessage {
            topic: topic.to_owned(),
            seq: seq_from(seq)?,
            batch: self.decode_batch(payload)?,
        })
    }
}

/// The frames of one replay reply, checked but with the payload not decoded yet.
pub(crate) enum ReplayFrames<'a> {
    /// The end marker.
    End,
    /// A buffered batch.
    Batch {
        topic: &'a str,
        seq: u64,
        payload: &'a [u8],
    },
}

/// Splits a replay reply (either layout) into its parts; errors as
/// [`DecodeOptions::decode_replay_reply`] reports them, in the same order.
pub(crate) fn replay_frames<F: AsRef<[u8]>>(frames: &[F]) -> Result<ReplayFrames<'_>, DecodeError> {
    let (delimiter, topic, seq, payload) = match frames {
        [d, t, s, p] => (d.as_ref(), t.as_ref(), s.as_ref(), p.as_ref()),
        [d, s, p] => (d.as_ref(), &[][..], s.as_ref(), p.as_ref()),
        _ => {
            return Err(DecodeError::FrameCount {
                expected: "3 or 4",
                got: frames.len(),
            });
        }
    };
    if !delimiter.is_empty() {
        return Err(DecodeError::BadDelimiter);
    }
    let seq = seq_from(seq)?;
    if seq == END_SEQ && topic.is_empty() && payload.is_empty() {
        return Ok(ReplayFrames::End);
    }
    let topic = std::str::from_utf8(topic).map_err(|_| DecodeError::InvalidTopic)?;
    Ok(ReplayFrames::Batch { topic, seq, payload })
}

fn seq_from(frame: &[u8]) -> Result<u64, DecodeError> {
    <[u8; 8]>::try_from(frame)
        .map(u64::from_be_bytes)
        .map_err(|_| DecodeError::BadSeqFrame { len: frame.len() })
}

#[cfg(test)]
mod tests {
    use super::*;

    // [ts=1.5, [], 0] as msgspec encodes it.
    const EMPTY_BATCH: [u8; 12] = [0x93, 0xcb, 0x3f, 0xf8, 0, 0, 0, 0, 0, 0, 0x90, 0x00];

    #[test]
    fn pub_message() {
        let frames: [&[u8]; 3] = [b"kv@x", &7u64.to_be_bytes(), &EMPTY_BATCH];
        let msg = decode_pub_message(&frames).unwrap();
        assert_eq!((msg.topic.as_str(), msg.seq), ("kv@x", 7));
        assert_eq!(msg.batch.ts.to_bits(), 1.5f64.to_bits());
        assert_eq!(msg.batch.dp_rank, Some(0));
        assert_eq!(
            decode_pub_message(&frames[..2]),
            Err(DecodeError::FrameCount { expected: "3", got: 2 })
        );
        let bad_seq: [&[u8]; 3] = [b"", &[0; 7], &EMPTY_BATCH];
        assert_eq!(decode_pub_message(&bad_seq), Err(DecodeError::BadSeqFrame { len: 7 }));
        let bad_topic: [&[u8]; 3] = [&[0xff], &[0; 8], &EMPTY_BATCH];
        assert_eq!(decode_pub_message(&bad_topic), Err(DecodeError::InvalidTopic));
    }

    #[test]
    fn replay_replies_in_both_generations() {
        let end = END_SEQ.to_be_bytes();
        let new_end: [&[u8]; 4] = [b"", b"", &end, b""];
        let old_end: [&[u8]; 3] = [b"", &end, b""];
        assert_eq!(decode_replay_reply(&new_end), Ok(ReplayReply::End));
        assert_eq!(decode_replay_reply(&old_end), Ok(ReplayReply::End));
        let seq = 3u64.to_be_bytes();
        let new: [&[u8]; 4] = [b"", b"t", &seq, &EMPTY_BATCH];
        let old: [&[u8]; 3] = [b"", &seq, &EMPTY_BATCH];
        for (frames, topic) in [(&new[..], "t"), (&old[..], "")] {
            let Ok(ReplayReply::Batch(msg)) = decode_replay_reply(frames) else {
                panic!("not a batch");
            };
            assert_eq!((msg.topic.as_str(), msg.seq), (topic, 3));
        }
        let no_delim: [&[u8]; 4] = [b"x", b"", &end, b""];
        assert_eq!(decode_replay_reply(&no_delim), Err(DecodeError::BadDelimiter));
        assert_eq!(replay_request(5), [Vec::new(), vec![0, 0, 0, 0, 0, 0, 0, 5]]);
    }
}
