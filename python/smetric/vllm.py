"""vLLM wire compatibility: prefix-cache block hashes identical to vLLM 0.33's.

vLLM hashes every *full* block of ``block_size`` prompt tokens as
``hash_fn((parent_digest, tuple(block_tokens), extra_keys))``, chained from a root digest
``NONE_HASH = hash_fn(seed)``. :func:`block_hashes` reproduces those digests byte for byte for
the four ``--prefix-caching-hash-algo`` values, so a router can tell which engine holds a
prompt's prefix before sending it. :func:`event_hash` turns a digest into the 64-bit int that
vLLM publishes in its KV-cache events (``BlockStored.block_hashes``) by default.

    >>> from smetric import vllm
    >>> digests = vllm.block_hashes(list(range(1000, 1016)))
    >>> vllm.event_hash(digests[0])
    7322446309363477352

Matching an engine requires the same tokenization (chat template included), the engine's
``block_size``, hash algorithm, ``PYTHONHASHSEED`` (if set), LoRA adapter and cache salt, and no
speculative-decoding lookahead hashing (EAGLE/MTP). Multimodal prompts are not covered here.

:func:`cache_namespace` is the router-side counterpart: the ``namespace`` a request is routed
(and its chain hashed) under, so that requests vLLM caches apart are indexed apart. vLLM 0.33
puts a LoRA adapter into the extra keys of *every* block (``("lora", name, path)``) and the cache
salt into the first block's, so an adapter's chain and a salted chain share no block with the
base model's chain of the same tokens; smetric mixes the namespace into the chain's root, which
separates them the same way. The KV-event ingestor roots an event's chain at its ``lora_name``,
so an adapter request routed under ``cache_namespace(adapter, None)`` finds the adapter's blocks
and only them.
"""

from __future__ import annotations

from collections.abc import Iterable

from smetric import _core
from smetric._types import VllmHashAlgo as HashAlgo

__all__ = ["DEFAULT_NONE_HASH_SEED", "HASH_ALGOS", "HashAlgo", "block_hashes", "cache_namespace", "event_hash"]

HASH_ALGOS: tuple[HashAlgo, ...] = ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")
"""Every algorithm :func:`block_hashes` accepts; vLLM's default is ``"sha256"``."""

DEFAULT_NONE_HASH_SEED = "vllm-none-hash"
"""The seed vLLM derives ``NONE_HASH`` from when ``PYTHONHASHSEED`` is unset (sha256 algorithms)."""


def block_hashes(
    tokens: Iterable[int],
    *,
    block_size: int = _core.DEFAULT_BLOCK_SIZE,
    algo: HashAlgo = "sha256",
    seed: str | int | None = None,
    lora: tuple[str, str] | None = None,
    cache_salt: str | None = None,
) -> list[bytes]:
    """The vLLM prefix-cache block digests of a prompt, one per full block.

    Args:
        tokens: the prompt's token ids, each in ``[0, 2**32)``.
        block_size: tokens per block; read the engine's value from ``BlockStored.block_size``.
        algo: the engine's ``--prefix-caching-hash-algo``.
        seed: the engine's ``PYTHONHASHSEED`` (an int is used as its decimal string), or None if it
            is unset. The xxhash algorithms draw a random root seed when it is unset, so they need it.
        lora: ``(lora_name, lora_path)`` of the request's LoRA adapter, or None.
        cache_salt: the request's ``cache_salt`` (mixed into the first block only), or None.

    Returns:
        32-byte (sha256, sha256_cbor) or 16-byte (xxhash, xxhash_cbor) digests, equal to vLLM's
        ``Request.block_hashes``; a trailing partial block has no digest.

    Raises:
        InvalidBlockSizeError: ``block_size`` is not positive.
        InvalidTokenError: a token id outside ``[0, 2**32)``.
        InvalidArgumentError: an unknown ``algo``, or an xxhash ``algo`` without ``seed``.
    """
    return _core.vllm_block_hashes(tokens, block_size, algo, None if seed is None else str(seed), lora, cache_salt)


def event_hash(digest: bytes) -> int:
    """The 64-bit block hash vLLM publishes in KV events for ``digest``.

    vLLM (with its default ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1``) publishes
    ``int.from_bytes(digest, "big") & (2**64 - 1)``: the digest's last 8 bytes, big-endian.

    Args:
        digest: a block digest, e.g. from :func:`block_hashes`.

    Returns:
        The event hash, in ``[0, 2**64)``.
    """
    return _core.vllm_event_hash(digest)


def cache_namespace(lora_name: str | None = None, cache_salt: str | None = None) -> str | None:
    """The router ``namespace`` of a request for LoRA adapter ``lora_name`` (``None``: the base
    model) with vLLM's ``cache_salt``: ``None`` for neither, the adapter's name alone (what the
    KV-event ingestor roots an adapter's chain at), the salt alone, or both joined by a unit
    separator (``\x1f``), which no adapter name or salt a client sends in JSON text contains.

    Raises:
        ValueError: an empty adapter name or salt (vLLM refuses both).
    """
    # Defined once, in Rust (`smetric-vllm`'s `cache_namespace`), which the gateway uses too.
    return _core.vllm_cache_namespace(lora_name, cache_salt)
