//! vLLM-identical prefix-cache block hashes (vLLM 0.33, `--prefix-caching-hash-algo`).
//!
//! # Algorithm
//! vLLM hashes each *full* block of `block_size` tokens as
//! `hash_fn((parent_digest, tuple(block_tokens), extra_keys_or_None))`, where the parent of the
//! first block is `NONE_HASH = hash_fn(seed_str)`. `hash_fn` serializes its argument with pickle
//! protocol 5 (`sha256`, `xxhash`) or canonical CBOR (`sha256_cbor`, `xxhash_cbor`), then digests
//! it with SHA-256 (32 bytes) or XXH3-128 (16 bytes, big-endian). The seed is the engine's
//! `PYTHONHASHSEED` string when set, else `"vllm-none-hash"` for the SHA-256 algorithms; the
//! xxhash algorithms draw a random seed when `PYTHONHASHSEED` is unset, so they can only be
//! reproduced with the engine's explicit seed.
//!
//! Extra keys are tagged tuples, in this order: `("lora", name, path)` on every block,
//! `("mm", identifier, item_offset - block_start)` for each multimodal item overlapping the
//! block, `("cache_salt", salt)` on the first block only (when the salt is non-empty) and
//! `("prompt_embeds", sha256_digest)`. A block without keys hashes `None`.
//!
//! KV events carry the 64-bit form [`event_hash`]: the digest's last 8 bytes read big-endian.
//!
//! # Invariants
//! * Only full blocks are hashed; a trailing partial block gets no digest.
//! * Digest `i` depends on every token before block end `i` and on every earlier key, so a
//!   digest identifies a whole prefix.
//!
//! # Complexity
//! O(n) for n tokens: one serialization (≤ 5 bytes per token) and one digest pass per block,
//! reusing one scratch buffer across blocks.

use std::fmt;
use std::str::FromStr;

use sha2::{Digest as _, Sha256};

use crate::obj::Obj;
use crate::{cbor, pickle};

/// The seed vLLM hashes into `NONE_HASH` when `PYTHONHASHSEED` is unset (SHA-256 algorithms).
pub const DEFAULT_NONE_HASH_SEED: &str = "vllm-none-hash";

/// Errors from configuring a hasher.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HashError {
    /// The algorithm name is not one of vLLM's `--prefix-caching-hash-algo` values.
    #[error("unknown prefix-caching hash algorithm {0:?} (expected sha256, sha256_cbor, xxhash or xxhash_cbor)")]
    UnknownAlgo(String),
    /// `block_size` was zero.
    #[error("block_size must be at least 1")]
    ZeroBlockSize,
    /// The xxhash algorithms have a random `NONE_HASH` unless `PYTHONHASHSEED` is set.
    #[error("{0} seeds NONE_HASH randomly unless PYTHONHASHSEED is set; pass the engine's PYTHONHASHSEED as the seed")]
    SeedRequired(HashAlgo),
    /// A digest given as bytes was empty or longer than 32 bytes.
    #[error("a block digest is 1 to 32 bytes long, got {0}")]
    BadDigestLength(usize),
}

/// A vLLM `--prefix-caching-hash-algo` value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum HashAlgo {
    /// SHA-256 of pickle protocol 5 (vLLM's default); 32-byte digests.
    #[default]
    Sha256,
    /// SHA-256 of canonical CBOR; 32-byte digests.
    Sha256Cbor,
    /// XXH3-128 of pickle protocol 5; 16-byte digests.
    Xxhash,
    /// XXH3-128 of canonical CBOR; 16-byte digests.
    XxhashCbor,
}

impl HashAlgo {
    /// All four algorithms, in vLLM's documentation order.
    pub const ALL: [Self; 4] = [Self::Sha256, Self::Sha256Cbor, Self::Xxhash, Self::XxhashCbor];

    /// The name vLLM uses on its command line.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Sha256 => "sha256",
            Self::Sha256Cbor => "sha256_cbor",
            Self::Xxhash => "xxhash",
            Self::XxhashCbor => "xxhash_cbor",
        }
    }

    /// Digest length in bytes: 32 for SHA-256, 16 for XXH3-128.
    pub const fn digest_len(self) -> usize {
        match self {
            Self::Sha256 | Self::Sha256Cbor => 32,
            Self::Xxhash | Self::XxhashCbor => 16,
        }
    }

    /// Whether vLLM derives a deterministic `NONE_HASH` without `PYTHONHASHSEED`.
    pub const fn has_default_seed(self) -> bool {
        matches!(self, Self::Sha256 | Self::Sha256Cbor)
    }

    /// Serializes `obj` into `buf` and digests it: vLLM's `hash_fn(obj)`.
    fn hash_obj(self, obj: &Obj<'_>, buf: &mut Vec<u8>) -> BlockDigest {
        match self {
            Self::Sha256 | Self::Xxhash => pickle::dumps_into(obj, buf),
            Self::Sha256Cbor | Self::XxhashCbor => cbor::dumps_into(obj, buf),
        }
        match self {
            Self::Sha256 | Self::Sha256Cbor => {
                let mut bytes = [0u8; 32];
                bytes.copy_from_slice(&Sha256::digest(buf.as_slice()));
                BlockDigest { len: 32, bytes }
            }
            Self::Xxhash | Self::XxhashCbor => {
                let mut bytes = [0u8; 32];
                bytes[..16].copy_from_slice(&xxhash_rust::xxh3::xxh3_128(buf).to_be_bytes());
                BlockDigest { len: 16, bytes }
            }
        }
    }
}

impl fmt::Display for HashAlgo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for HashAlgo {
    type Err = HashError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|a| a.as_str() == s)
            .ok_or_else(|| HashError::UnknownAlgo(s.to_owned()))
    }
}

/// A full vLLM block digest (32 bytes for SHA-256, 16 for XXH3-128), stored inline.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct BlockDigest {
    len: u8,
    bytes: [u8; 32],
}

impl BlockDigest {
    /// Wraps raw digest bytes (1 to 32 bytes), e.g. a parent hash received from elsewhere.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, HashError> {
        if bytes.is_empty() || bytes.len() > 32 {
            return Err(HashError::BadDigestLength(bytes.len()));
        }
        let mut inline = [0u8; 32];
        inline[..bytes.len()].copy_from_slice(bytes);
        Ok(Self {
            len: bytes.len() as u8,
            bytes: inline,
        })
    }

    /// The digest bytes, exactly as vLLM's `BlockHash`.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }

    /// The 64-bit form vLLM puts in KV events; see [`event_hash`].
    pub fn event_hash(&self) -> u64 {
        event_hash(self.as_bytes())
    }
}

impl AsRef<[u8]> for BlockDigest {
    fn as_ref(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl fmt::Debug for BlockDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("BlockDigest(")?;
        fmt::LowerHex::fmt(self, f)?;
        f.write_str(")")
    }
}

impl fmt::LowerHex for BlockDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.as_bytes().iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

/// vLLM's integer block hash in KV events: `int.from_bytes(digest, "big") & (2**64 - 1)`,
/// i.e. the last 8 bytes read big-endian (shorter inputs are read whole; empty gives 0).
pub fn event_hash(digest: &[u8]) -> u64 {
    let tail = &digest[digest.len().saturating_sub(8)..];
    tail.iter().fold(0u64, |acc, &b| (acc << 8) | u64::from(b))
}

/// `NONE_HASH` for `algo` derived from `seed`, exactly `hash_fn(seed)` for a Python `str`.
pub fn none_hash(algo: HashAlgo, seed: &str) -> BlockDigest {
    algo.hash_obj(&Obj::Str(seed), &mut Vec::new())
}

/// One tagged extra key of a block, as vLLM ≥0.31 mixes it into the block hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExtraKey<'a> {
    /// `("lora", lora_name, lora_path)`.
    Lora {
        /// `LoRARequest.lora_name`.
        name: &'a str,
        /// `LoRARequest.lora_path`.
        path: &'a str,
    },
    /// `("mm", identifier, offset)`: `offset` is the item's start minus the block's start,
    /// negative when the item began in an earlier block.
    Mm {
        /// The multimodal feature identifier (its content hash).
        identifier: &'a str,
        /// Item offset relative to the block start.
        offset: i64,
    },
    /// `("cache_salt", salt)`; vLLM adds it to the first block only.
    CacheSalt(&'a str),
    /// `("prompt_embeds", digest)`: SHA-256 of the block's prompt-embedding tensor bytes.
    PromptEmbeds(&'a [u8]),
}

impl<'a> ExtraKey<'a> {
    fn to_obj(self) -> Obj<'a> {
        match self {
            Self::Lora { name, path } => Obj::Tuple(vec![Obj::Tag("lora"), Obj::Str(name), Obj::Str(path)]),
            Self::Mm { identifier, offset } => Obj::Tuple(vec![Obj::Tag("mm"), Obj::Str(identifier), Obj::Int(offset)]),
            Self::CacheSalt(salt) => Obj::Tuple(vec![Obj::Tag("cache_salt"), Obj::Str(salt)]),
            Self::PromptEmbeds(digest) => Obj::Tuple(vec![Obj::Tag("prompt_embeds"), Obj::Bytes(digest)]),
        }
    }
}

/// A LoRA adapter as vLLM keys it: `LoRARequest.lora_name` and `.lora_path`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LoraKey {
    /// `LoRARequest.lora_name`.
    pub name: String,
    /// `LoRARequest.lora_path` (vLLM requires it non-empty).
    pub path: String,
}

/// A multimodal item's placeholder span in the prompt (vLLM's `PlaceholderRange`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MmPlaceholder {
    /// `MultiModalFeatureSpec.identifier`.
    pub identifier: String,
    /// First prompt position of the item.
    pub offset: usize,
    /// Number of placeholder tokens.
    pub length: usize,
}

/// The per-request inputs of vLLM's extra keys.
///
/// Prompt-embedding keys are not derived here (they hash the embedding tensor's bytes); pass
/// them to [`BlockHasher::hash_block`] as [`ExtraKey::PromptEmbeds`] instead.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct RequestKeys {
    /// The request's LoRA adapter, if any.
    pub lora: Option<LoraKey>,
    /// The request's `cache_salt`; an empty salt is ignored, as in vLLM.
    pub cache_salt: Option<String>,
    /// Multimodal items, sorted by offset as vLLM's processor emits them.
    pub mm: Vec<MmPlaceholder>,
}

/// Computes vLLM block hashes for one engine configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockHasher {
    algo: HashAlgo,
    block_size: usize,
    none_hash: BlockDigest,
}

impl BlockHasher {
    /// A hasher for `algo` and `block_size` tokens per block.
    ///
    /// `seed` is the engine's `PYTHONHASHSEED` string; `None` means it is unset, which is
    /// only reproducible for the SHA-256 algorithms ([`DEFAULT_NONE_HASH_SEED`]).
    pub fn new(algo: HashAlgo, block_size: usize, seed: Option<&str>) -> Result<Self, HashError> {
        if block_size == 0 {
            return Err(HashError::ZeroBlockSize);
        }
        let seed = match seed {
            Some(seed) => seed,
            None if algo.has_default_seed() => DEFAULT_NONE_HASH_SEED,
            None => return Err(HashError::SeedRequired(algo)),
        };
        Ok(Self {
            algo,
            block_size,
            none_hash: none_hash(algo, seed),
        })
    }

    /// The hash algorithm.
    pub fn algo(&self) -> HashAlgo {
        self.algo
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// The root parent digest (`NONE_HASH`).
    pub fn none_hash(&self) -> &BlockDigest {
        &self.none_hash
    }

    /// vLLM's `hash_block_tokens`: the digest of one block given its parent (`None` for the
    /// first block) and its tagged extra keys (empty means `None`).
    pub fn hash_block(&self, parent: Option<&BlockDigest>, tokens: &[u32], extra_keys: &[ExtraKey<'_>]) -> BlockDigest {
        let extra = (!extra_keys.is_empty()).then(|| Obj::Tuple(extra_keys.iter().map(|k| k.to_obj()).collect()));
        self.hash_block_obj(parent, tokens, extra, &mut Vec::new())
    }

    fn hash_block_obj(
        &self,
        parent: Option<&BlockDigest>,
        tokens: &[u32],
        extra: Option<Obj<'_>>,
        buf: &mut Vec<u8>,
    ) -> BlockDigest {
        let parent = parent.unwrap_or(&self.none_hash);
        let input = Obj::Tuple(vec![
            Obj::Bytes(parent.as_bytes()),
            Obj::Tokens(tokens),
            extra.unwrap_or(Obj::None),
        ]);
        self.algo.hash_obj(&input, buf)
    }

    /// The digests of every full block of a prompt, as vLLM's request block hasher computes
    /// them (no speculative-decoding lookahead).
    pub fn block_hashes(&self, tokens: &[u32], keys: &RequestKeys) -> Vec<BlockDigest> {
        let mut digests = Vec::with_capacity(tokens.len() / self.block_size);
        let mut buf = Vec::new();
        let mut mm_cursor = 0;
        for (i, block) in tokens.chunks_exact(self.block_size).enumerate() {
            let start = i * self.block_size;
            let mut extra = Vec::new();
            if let Some(lora) = &keys.lora {
                extra.push(ExtraKey::Lora {
                    name: &lora.name,
                    path: &lora.path,
                });
            }
            mm_keys(&keys.mm, start, start + self.block_size, &mut mm_cursor, &mut extra);
            match keys.cache_salt.as_deref() {
                Some(salt) if start == 0 && !salt.is_empty() => {
                    extra.push(ExtraKey::CacheSalt(salt));
                }
                _ => {}
            }
            let extra = (!extra.is_empty()).then(|| Obj::Tuple(extra.iter().map(|k| k.to_obj()).collect()));
            let digest = self.hash_block_obj(digests.last(), block, extra, &mut buf);
            digests.push(digest);
        }
        digests
    }

    /// [`BlockHasher::block_hashes`] in the 64-bit event form.
    pub fn event_hashes(&self, tokens: &[u32], keys: &RequestKeys) -> Vec<u64> {
        self.block_hashes(tokens, keys)
            .iter()
            .map(BlockDigest::event_hash)
            .collect()
    }
}

/// Appends the `mm` keys of block `[start, end)`, advancing `cursor` past finished items.
///
/// This walks the items with a cursor exactly like vLLM does (rather than testing every item
/// for overlap), so unsorted or nested items produce the same keys as in vLLM.
fn mm_keys<'a>(items: &'a [MmPlaceholder], start: usize, end: usize, cursor: &mut usize, out: &mut Vec<ExtraKey<'a>>) {
    let Some(last) = items.last() else {
        return;
    };
    if last.offset + last.length <= start {
        return;
    }
    while let Some(item) = items.get(*cursor) {
        if end <= item.offset {
            break;
        }
        if start >= item.offset + item.length {
            *cursor += 1;
            continue;
        }
        out.push(ExtraKey::Mm {
            identifier: &item.identifier,
            offset: item.offset as i64 - start as i64,
        });
        if end >= item.offset + item.length {
            *cursor += 1;
        } else {
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(d: &BlockDigest) -> String {
        format!("{d:x}")
    }

    #[test]
    fn algo_names_round_trip() {
        for algo in HashAlgo::ALL {
            assert_eq!(algo.as_str().parse::<HashAlgo>(), Ok(algo));
        }
        assert_eq!(
            "builtin".parse::<HashAlgo>(),
            Err(HashError::UnknownAlgo("builtin".into()))
        );
    }

    #[test]
    fn reference_values_from_vllm_0_33() {
        // NONE_HASH and block 1 for tokens 1000..1016, sha256, default seed.
        let hasher = BlockHasher::new(HashAlgo::Sha256, 16, None).unwrap();
        assert!(hex(hasher.none_hash()).starts_with("066b1e8987e02713"));
        let tokens: Vec<u32> = (1000..1016).collect();
        let hashes = hasher.block_hashes(&tokens, &RequestKeys::default());
        assert_eq!(hashes.len(), 1);
        assert!(hex(&hashes[0]).starts_with("9d9c413731095d0e"));
        assert_eq!(hashes[0].event_hash(), 7_322_446_309_363_477_352);
    }

    #[test]
    fn only_full_blocks_are_hashed() {
        let hasher = BlockHasher::new(HashAlgo::Sha256Cbor, 4, None).unwrap();
        let keys = RequestKeys::default();
        assert!(hasher.block_hashes(&[1, 2, 3], &keys).is_empty());
        let two = hasher.block_hashes(&[1, 2, 3, 4, 5, 6, 7, 8, 9], &keys);
        assert_eq!(two.len(), 2);
        assert_eq!(two[1], hasher.hash_block(Some(&two[0]), &[5, 6, 7, 8], &[]));
    }

    #[test]
    fn config_errors() {
        assert_eq!(
            BlockHasher::new(HashAlgo::Sha256, 0, None),
            Err(HashError::ZeroBlockSize)
        );
        assert_eq!(
            BlockHasher::new(HashAlgo::Xxhash, 16, None),
            Err(HashError::SeedRequired(HashAlgo::Xxhash))
        );
        assert!(BlockHasher::new(HashAlgo::XxhashCbor, 16, Some("0")).is_ok());
        assert_eq!(BlockDigest::from_bytes(&[]), Err(HashError::BadDigestLength(0)));
        assert_eq!(BlockDigest::from_bytes(&[0; 33]), Err(HashError::BadDigestLength(33)));
    }

    #[test]
    fn digest_lengths_follow_algo() {
        for algo in HashAlgo::ALL {
            let hasher = BlockHasher::new(algo, 2, Some("1")).unwrap();
            let h = hasher.hash_block(None, &[1, 2], &[]);
            assert_eq!(h.as_bytes().len(), algo.digest_len(), "{algo}");
        }
    }

    #[test]
    fn event_hash_is_last_eight_bytes_big_endian() {
        let mut d = [0u8; 32];
        d[24..].copy_from_slice(&0x0102_0304_0506_0708u64.to_be_bytes());
        d[0] = 0xff;
        assert_eq!(event_hash(&d), 0x0102_0304_0506_0708);
        assert_eq!(event_hash(&[0x01, 0x02]), 0x0102);
        assert_eq!(event_hash(&[]), 0);
    }

    #[test]
    fn salt_only_on_first_block_and_empty_salt_ignored() {
        let hasher = BlockHasher::new(HashAlgo::Sha256, 2, None).unwrap();
        let tokens = [1, 2, 3, 4];
        let plain = hasher.block_hashes(&tokens, &RequestKeys::default());
        let salted = hasher.block_hashes(
            &tokens,
            &RequestKeys {
                cache_salt: Some("s".into()),
                ..RequestKeys::default()
            },
        );
        assert_ne!(plain[0], salted[0]);
        assert_eq!(salted[1], hasher.hash_block(Some(&salted[0]), &[3, 4], &[]));
        let empty = hasher.block_hashes(
            &tokens,
            &RequestKeys {
                cache_salt: Some(String::new()),
                ..RequestKeys::default()
            },
        );
        assert_eq!(plain, empty);
    }

    #[test]
    fn mm_keys_follow_item_overlap() {
        let item = |identifier: &str, offset, length| MmPlaceholder {
            identifier: identifier.into(),
            offset,
            length,
        };
        // Block size 4: items [2, 8) and [8, 9).
        let items = [item("a", 2, 6), item("b", 8, 1)];
        let mut cursor = 0;
        let mut per_block = Vec::new();
        for start in (0..12).step_by(4) {
            let mut keys = Vec::new();
            mm_keys(&items, start, start + 4, &mut cursor, &mut keys);
            per_block.push(keys);
        }
        let mm = |identifier, offset| ExtraKey::Mm { identifier, offset };
        assert_eq!(per_block[0], [mm("a", 2)]);
        assert_eq!(per_block[1], [mm("a", -2)]);
        assert_eq!(per_block[2], [mm("b", 0)]);
    }
}

/// An adapter name or cache salt given empty (vLLM refuses both).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("an adapter name and a cache salt must be non-empty when given")]
pub struct EmptyNamespacePart;

/// The router namespace of a request for LoRA adapter `lora_name` (`None`: the base model) with
/// vLLM's `cache_salt`: none for neither, the adapter's name alone (what the KV-event ingestor
/// roots an adapter's chain at), the salt alone, or both joined by a unit separator (`\x1f`),
/// which no adapter name or salt a client sends in JSON text contains. vLLM caches an adapter's
/// blocks and a salted chain apart from the base model's; the namespace, mixed into the chain's
/// root, separates them the same way.
///
/// # Errors
/// [`EmptyNamespacePart`] for an empty adapter name or salt.
pub fn cache_namespace(
    lora_name: Option<&str>,
    cache_salt: Option<&str>,
) -> Result<Option<String>, EmptyNamespacePart> {
    match (lora_name, cache_salt) {
        (Some(""), _) | (_, Some("")) => Err(EmptyNamespacePart),
        (None, salt) => Ok(salt.map(str::to_owned)),
        (Some(lora), None) => Ok(Some(lora.to_owned())),
        (Some(lora), Some(salt)) => Ok(Some(format!("{lora}\x1f{salt}"))),
    }
}

#[cfg(test)]
mod namespace_tests {
    use super::*;

    #[test]
    fn a_namespace_names_the_adapter_the_salt_or_both() {
        assert_eq!(cache_namespace(None, None), Ok(None));
        assert_eq!(cache_namespace(None, Some("s")), Ok(Some("s".to_owned())));
        assert_eq!(cache_namespace(Some("sql"), None), Ok(Some("sql".to_owned())));
        assert_eq!(cache_namespace(Some("sql"), Some("s")), Ok(Some("sql\x1fs".to_owned())));
        assert_eq!(cache_namespace(Some(""), None), Err(EmptyNamespacePart));
        assert_eq!(cache_namespace(None, Some("")), Err(EmptyNamespacePart));
    }
}
