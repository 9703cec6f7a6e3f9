"""A Mooncake store written by vLLM's Mooncake store connector, probed as the router's global KV$ tier.

vLLM's ``MooncakeStoreConnector`` (vLLM 0.33) stores every full KV block under a key made of the
deployment's key prefix and the block's own vLLM prefix-cache digest
(``vllm/distributed/kv_transfer/kv_connector/v1/mooncake/store/data.py``, ``PoolKey``)::

    [{cache_prefix}@]{model_name}{store_namespace}@tp_rank:{t}@pcp{p}@dcp{d}@pp_rank:{q}@group:{g}@{digest.hex()}

``model_name`` is the last path component of ``--model``; ``cache_prefix`` comes from
``kv_connector_extra_config["cache_prefix"]`` (empty by default); ``store_namespace`` is empty unless a
Store TP layout is configured. One key per rank namespace: with ``tp_size`` ranks (and no KV-head
replication) every rank writes its own shard, and the connector's lookup counts a block as present
only when the keys of *all* rank namespaces exist. Because the digest is vLLM's own block hash,
:func:`smetric.vllm.block_hashes` gives the keys of any prompt without asking vLLM.

:class:`StoreProbe` builds those keys for a prompt and asks the store with one ``batch_is_exist``
call; the hit is the longest run of leading blocks whose every key exists (the connector's own
rule: a prefix cache cannot load block *i* without blocks 0..i-1). :class:`GlobalTierFeed` records
that prefix into the router's global tier just before routing
(``smetric.integrations._global_tier.record_prefix``).

Not covered: hybrid models (several KV-cache groups, ``block_size`` ≠ ``hash_block_size``), MLA's
or GQA's KV-head replication (fewer key namespaces than ranks: pass ``tp_size`` = the number of
distinct shards), decode context parallelism (``dcp_size > 1``) and the Store TP layouts.

Complexity: O(n) hashing in Rust, O(n / block_size · ranks) key strings and one store round trip.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from smetric import DEFAULT_BLOCK_SIZE, Decision, Router
from smetric import vllm as vllm_hashes
from smetric.errors import InvalidArgumentError
from smetric.integrations._global_tier import record_prefix

if TYPE_CHECKING:
    from smetric._core import _Tokens  # a list of ints or a token buffer (numpy int32/uint32/int64 array)

__all__ = ["GlobalTierFeed", "KeySpace", "StoreProbe", "pool_keys"]


class _Store(Protocol):
    """The part of ``mooncake.store.MooncakeDistributedStore`` the probe uses."""

    def batch_is_exist(self, keys: list[str], /) -> list[int]: ...


@dataclass(frozen=True, slots=True)
class KeySpace:
    """The key prefix(es) one vLLM deployment's Mooncake store connector writes under.

    Arguments:
        model: ``--model`` as given to vLLM (its last path component is used).
        tp_size, pp_size, pcp_size: the deployment's parallel sizes (one key namespace per rank).
        cache_prefix: ``kv_connector_extra_config["cache_prefix"]``.
        store_namespace: the connector's Store layout namespace (empty by default).
        group: the KV-cache group (0 for a model with one group).
    """

    model: str
    tp_size: int = 1
    pp_size: int = 1
    pcp_size: int = 1
    cache_prefix: str = ""
    store_namespace: str = ""
    group: int = 0

    def __post_init__(self) -> None:
        for name in ("tp_size", "pp_size", "pcp_size"):
            if getattr(self, name) < 1:
                raise InvalidArgumentError(f"{name} must be at least 1", argument=name, reason="not positive")

    @property
    def model_name(self) -> str:
        """vLLM's ``model_config.model.rstrip("/").split("/")[-1]``."""
        return self.model.rstrip("/").split("/")[-1]

    def prefixes(self) -> list[str]:
        """Every rank namespace's key prefix, in the connector's lookup order (pcp, tp, pp)."""
        head = f"{self.cache_prefix}@" if self.cache_prefix else ""
        return [
            f"{head}{self.model_name}{self.store_namespace}@tp_rank:{tp}@pcp{pcp}@dcp0@pp_rank:{pp}@group:{self.group}"
            for pcp in range(self.pcp_size)
            for tp in range(self.tp_size)
            for pp in range(self.pp_size)
        ]


def pool_keys(space: KeySpace, digests: Sequence[bytes]) -> list[str]:
    """The store keys of blocks, ``len(space.prefixes())`` per block, block-major (as the connector looks them up)."""
    prefixes = space.prefixes()
    return [f"{prefix}@{digest.hex()}" for digest in digests for prefix in prefixes]


class StoreProbe:
    """How many leading blocks of a prompt a Mooncake store holds, by one ``batch_is_exist`` call.

    Arguments:
        store: a connected ``mooncake.store.MooncakeDistributedStore`` (or anything with ``batch_is_exist``).
        space: the deployment's :class:`KeySpace`.
        block_size: vLLM's ``--block-size``.
        algo, seed: vLLM's ``--prefix-caching-hash-algo`` and ``PYTHONHASHSEED`` (see :mod:`smetric.vllm`).
    """

    def __init__(
        self,
        store: _Store,
        space: KeySpace,
        *,
        block_size: int = DEFAULT_BLOCK_SIZE,
        algo: vllm_hashes.HashAlgo = "sha256",
        seed: str | int | None = None,
    ) -> None:
        self.store = store
        self.space = space
        self.block_size = block_size
        self.algo: vllm_hashes.HashAlgo = algo
        self.seed = seed
        self._namespaces = len(space.prefixes())

    def digests(
        self, tokens: _Tokens, *, lora: tuple[str, str] | None = None, cache_salt: str | None = None
    ) -> list[bytes]:
        """vLLM's block digests of the prompt (the keys' last component)."""
        tolist = getattr(tokens, "tolist", None)  # a numpy buffer: Python ints in one C loop
        return vllm_hashes.block_hashes(
            tokens if tolist is None else tolist(),
            block_size=self.block_size,
            algo=self.algo,
            seed=self.seed,
            lora=lora,
            cache_salt=cache_salt,
        )

    def hit_blocks(self, tokens: _Tokens, *, lora: tuple[str, str] | None = None, cache_salt: str | None = None) -> int:
        """The number of leading full blocks whose keys all exist in the store."""
        digests = self.digests(tokens, lora=lora, cache_salt=cache_salt)
        if not digests:
            return 0
        exists = self.store.batch_is_exist(pool_keys(self.space, digests))
        n = self._namespaces
        for block in range(len(digests)):
            if not all(x == 1 for x in exists[block * n : (block + 1) * n]):
                return block
        return len(digests)

    def hit_tokens(self, tokens: _Tokens, *, lora: tuple[str, str] | None = None, cache_salt: str | None = None) -> int:
        """:meth:`hit_blocks` in tokens."""
        return self.hit_blocks(tokens, lora=lora, cache_salt=cache_salt) * self.block_size


class GlobalTierFeed:
    """Routes each prompt after recording what the Mooncake store holds of it into the router's global tier.

    Attributes:
        last_hit_tokens: the store's hit for the last prompt.
    """

    def __init__(self, router: Router, probe: StoreProbe) -> None:
        self.router = router
        self.probe = probe
        self.last_hit_tokens = 0

    def refresh(
        self,
        tokens: _Tokens,
        *,
        namespace: str | None = None,
        lora: tuple[str, str] | None = None,
        cache_salt: str | None = None,
    ) -> int:
        """Probes the store and records the answer into the router's global tier; returns the hit in tokens."""
        self.last_hit_tokens = self.probe.hit_tokens(tokens, lora=lora, cache_salt=cache_salt)
        record_prefix(self.router, tokens, self.last_hit_tokens, namespace=namespace)
        return self.last_hit_tokens

    def route(
        self,
        tokens: _Tokens,
        *,
        namespace: str | None = None,
        lora: tuple[str, str] | None = None,
        cache_salt: str | None = None,
        **route_kwargs: Any,
    ) -> Decision:
        """:meth:`refresh`, then ``router.route`` on the same hashes (other arguments are passed through)."""
        self.refresh(tokens, namespace=namespace, lora=lora, cache_salt=cache_salt)
        return self.router.route(tokens, namespace=namespace, **route_kwargs)
