"""Block hashing and request-id mapping.

Mirrors docs/routing-semantics.md §1 (block hash chain) and the request-id rule of §8.
Written for obviousness, not speed: every block is packed and hashed on its own.
"""

from __future__ import annotations

import operator
import struct
from collections.abc import Iterable
from typing import SupportsIndex

try:
    import xxhash
except ModuleNotFoundError as e:
    # The reference imports nothing of smetric (so not smetric.errors.MissingExtraError).
    message = "smetric.reference needs xxhash, which is not installed: pip install 'smetric-router[dev]'"
    raise ImportError(message, name=e.name) from e

U32_LIMIT = 1 << 32
U64_LIMIT = 1 << 64
U64_MASK = U64_LIMIT - 1


class InvalidInputError(ValueError):
    """An argument outside the domain the spec allows (token id, hash, seed, block size)."""


def check_u64(value: int, what: str) -> int:
    """Return `value` if it fits an unsigned 64-bit integer; the Rust core stores all hashes as u64."""
    if not 0 <= value < U64_LIMIT:
        raise InvalidInputError(f"{what} must be in [0, 2^64), got {value}")
    return value


def token_list(tokens: Iterable[SupportsIndex]) -> list[int]:
    """Turn lists, tuples or numpy integer arrays into plain ints, checking 0 <= t < 2^32 (§1).

    `operator.index` accepts Python and numpy integers but rejects floats, so a float array is an
    error rather than a silent truncation.
    """
    out = [operator.index(t) for t in tokens]
    for t in out:
        if not 0 <= t < U32_LIMIT:
            raise InvalidInputError(f"token ids must be in [0, 2^32), got {t}")
    return out


def chain_root(hash_seed: int, namespace: str | None) -> int:
    """The parent of block 0: the seed itself, or the namespace hashed with the seed (§1)."""
    check_u64(hash_seed, "hash_seed")
    if namespace is None:
        return hash_seed
    return xxhash.xxh3_64_intdigest(namespace.encode("utf-8"), seed=hash_seed)


CHAIN_MUL = 0xFF51AFD7ED558CCD
"""The chain step's odd multiplier (§1)."""


def chain_step(parent: int, content: int) -> int:
    """The hash of a prefix ending in a block whose content hash is `content`, under `parent` (§1)."""
    m = ((parent ^ content) * CHAIN_MUL) & U64_MASK
    return m ^ (m >> 32)


def block_content_hash(block: list[int]) -> int:
    """xxh3-64, seed 0, of the block's ids packed as little-endian u32s (§1)."""
    return xxhash.xxh3_64_intdigest(struct.pack(f"<{len(block)}I", *block))


def hash_blocks(tokens: list[int], block_size: int, root: int) -> list[int]:
    """Chain-hash the full blocks of `tokens`; the partial tail block is not hashed (§1).

    Each block's content is hashed on its own and chained onto its parent's hash with
    `chain_step`, so every hash covers its entire prefix.
    """
    if block_size < 1:
        raise InvalidInputError(f"block_size must be >= 1, got {block_size}")
    hashes: list[int] = []
    parent = root
    for i in range(len(tokens) // block_size):
        parent = chain_step(parent, block_content_hash(tokens[i * block_size : (i + 1) * block_size]))
        hashes.append(parent)
    return hashes


def ref_hash_tokens(
    tokens: Iterable[SupportsIndex], block_size: int, hash_seed: int = 0, namespace: str | None = None
) -> list[int]:
    """The block-hash chain of a prompt, exactly as §1 defines it."""
    return hash_blocks(token_list(tokens), block_size, chain_root(hash_seed, namespace))


def name_hash(name: str) -> int:
    """An instance's identity to the hash policies (§6 item 15): xxh3_64 of its UTF-8 name, seed 0."""
    return xxhash.xxh3_64_intdigest(name.encode("utf-8"), seed=0)


def request_id_value(request_id: int | str) -> int:
    """Map a caller's request id to the u64 the router keys on (§8).

    Ints are used as is (they must fit a u64); strings are hashed as UTF-8 with xxh3, seed 0
    (deliberately *not* `hash_seed`: request ids are not part of the shared KV$ index).
    """
    if isinstance(request_id, str):
        return xxhash.xxh3_64_intdigest(request_id.encode("utf-8"), seed=0)
    return check_u64(operator.index(request_id), "request_id")
