"""The fake engine's prefix cache: vLLM block hashes in a bounded LRU of GPU blocks.

A request's full prompt blocks are hashed as vLLM hashes them (:func:`smetric.vllm.block_hashes`
with the engine's block size, hash algorithm and seed) and keyed by the 64-bit int vLLM
publishes in KV events. The pool has ``num_blocks`` blocks; a block is either *cached* (it
holds a hashed prompt block, in LRU order), *private* (a request's partial last prompt block
and its generated tokens, never cached) or free.

Lifecycle, as in vLLM's ``KVCacheManager`` (simplified, see the package docs):

1. :meth:`PrefixCache.admit` finds the longest cached prefix, capped at ``(n - 1) // block_size``
   blocks (vLLM always recomputes the last token), pins those blocks, and reserves every other
   block the request will hold (``ceil((prompt + output) / block_size)`` in all). Reserving
   evicts unpinned cached blocks, least recently used first; each eviction is one
   ``BlockRemoved`` event with one hash, as vLLM emits them. If even that cannot free enough,
   the request is not admitted (it waits).
2. :meth:`PrefixCache.store` runs when the request's prefill completes: its new full prompt
   blocks become cached, published as ``BlockStored`` events (one per contiguous run of new
   blocks, ``parent_block_hash`` the block before the run or None at block 0). A block another
   request stored in the meantime is shared, not stored twice.
3. :meth:`PrefixCache.release` unpins the request's cached blocks (they stay cached, most
   recently used) and frees its private blocks.

**Host offload** (``host_blocks > 0``, vLLM's ``--kv-offloading-size`` with its
``OffloadingConnector``): every block cached on the GPU is also written to a host LRU of
``host_blocks`` blocks, published as one ``BlockStored`` event with medium ``CPU`` and no token
ids (the connector's form: the ids were published with the GPU store), and each block the host LRU
drops as ``BlockRemoved`` with medium ``CPU``. The host copy is announced, not served: a request's
hit is still the GPU's (the fake's timing model has no host loads).

Invariant: ``pinned + unpinned cached + reserved private <= num_blocks``; the host LRU holds at
most ``host_blocks``. Complexity: O(blocks of the request) per call, plus O(1) per eviction.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from smetric.vllm import block_hashes, event_hash

Event = tuple[Any, ...]
"""An event tuple for :func:`smetric._core.encode_kv_batch`."""


@dataclass(slots=True)
class Allocation:
    """The blocks one admitted request holds."""

    hashes: list[int]
    """Event hashes of the prompt's full blocks."""
    tokens: list[int]
    """The prompt's token ids."""
    hit_blocks: int
    """Leading blocks found in the cache."""
    private: int
    """Blocks reserved that are not cached (new prompt blocks until stored, partial and output)."""
    pinned: list[int] = field(default_factory=list)
    """Cached blocks this request holds a reference to."""
    stored: bool = False
    lora_name: str | None = None
    """The request's LoRA adapter (published with its blocks); None: the base model."""


class PrefixCache:
    """A bounded LRU of hashed GPU blocks with vLLM's KV events (see the module docs)."""

    def __init__(
        self, num_blocks: int, block_size: int, algo: str = "sha256", seed: str | None = None, host_blocks: int = 0
    ) -> None:
        if num_blocks <= 0 or block_size <= 0 or host_blocks < 0:
            raise ValueError("num_blocks and block_size must be > 0, host_blocks >= 0")
        self.num_blocks = num_blocks
        self.host_blocks = host_blocks
        self._host: OrderedDict[int, None] = OrderedDict()  # host copies, LRU first
        self.block_size = block_size
        self.algo = algo
        self.seed = seed
        self.hash_prompt([0] * block_size)  # an unknown algorithm or a missing xxhash seed fails here
        self._refs: OrderedDict[int, int] = OrderedDict()  # cached block -> pins; LRU first
        self._unpinned = 0
        self._private = 0
        self.events: list[Event] = []
        """Events since the last :meth:`take_events`, in order."""
        self.queries = 0
        self.hits = 0
        self.evictions = 0

    # -- accounting --------------------------------------------------------------------------

    @property
    def cached_blocks(self) -> int:
        """Blocks holding a hashed prompt block (pinned or not)."""
        return len(self._refs)

    @property
    def used_blocks(self) -> int:
        """Blocks held by running requests (vLLM's ``kv_cache_usage_perc`` numerator)."""
        return len(self._refs) - self._unpinned + self._private

    def cached_hashes(self) -> set[int]:
        """The event hashes of every cached block."""
        return set(self._refs)

    def hash_prompt(self, tokens: list[int], lora: tuple[str, str] | None = None) -> list[int]:
        """Event hashes of the prompt's full blocks; ``lora`` (``(name, path)``) is the request's
        adapter, which vLLM puts into every block's hash, so an adapter shares no block with the
        base model or another adapter."""
        digests = block_hashes(tokens, block_size=self.block_size, algo=self.algo, seed=self.seed, lora=lora)  # type: ignore[arg-type]
        return [event_hash(d) for d in digests]

    # -- lifecycle ---------------------------------------------------------------------------

    def admit(
        self, tokens: list[int], output_tokens: int, hashes: list[int] | None = None, lora_name: str | None = None
    ) -> Allocation | None:
        """Pins the cached prefix and reserves the rest, or returns None if it does not fit.
        ``hashes`` must be the prompt's under its adapter ``lora_name`` (:meth:`hash_prompt`)."""
        hashes = self.hash_prompt(tokens) if hashes is None else hashes
        b = self.block_size
        hit = 0
        for h in hashes[: (len(tokens) - 1) // b]:
            if h not in self._refs:
                break
            hit += 1
        total = -(-(len(tokens) + output_tokens) // b)
        need = total - hit
        pinned_free = sum(1 for h in hashes[:hit] if self._refs[h] == 0)
        free = self.num_blocks - self.used_blocks - pinned_free  # blocks not held once the hits are pinned
        if need > free:
            return None
        for h in hashes[:hit]:
            self._pin(h)
        self._evict(need - (self.num_blocks - len(self._refs) - self._private))
        self._private += need
        self.queries += len(tokens)
        self.hits += hit * b
        return Allocation(
            hashes=hashes, tokens=tokens, hit_blocks=hit, private=need, pinned=list(hashes[:hit]), lora_name=lora_name
        )

    def store(self, a: Allocation) -> None:
        """Caches the request's new full prompt blocks (its prefill completed)."""
        if a.stored:
            return
        a.stored = True
        run_start: int | None = None
        for i in range(a.hit_blocks, len(a.hashes) + 1):
            new = i < len(a.hashes) and a.hashes[i] not in self._refs
            if new and run_start is None:
                run_start = i
            if not new and run_start is not None:
                self._emit_stored(a, run_start, i)
                run_start = None
            if i == len(a.hashes):
                break
            h = a.hashes[i]
            if new:
                self._refs[h] = 1  # the reserved private block becomes this cached block
                self._private -= 1
                a.private -= 1
            else:
                self._pin(h)  # stored by another request meanwhile: share it, free the reservation
                self._private -= 1
                a.private -= 1
            a.pinned.append(h)

    def install(self, tokens: list[int], hashes: list[int]) -> int:
        """Caches ``hashes`` (the prompt's first full blocks) as if computed here — KV pulled from a
        prefill engine. New blocks are unpinned, evicting least recently used ones for room; it
        stops where the cache is full of pinned blocks. Returns the blocks installed."""
        installed = 0
        run_start: int | None = None
        for i, h in enumerate(hashes):
            if h in self._refs:
                self._refs.move_to_end(h)
                if run_start is not None:
                    self._emit_range(hashes, tokens, run_start, i)
                    run_start = None
                continue
            if self.num_blocks - len(self._refs) - self._private <= 0:
                self._evict(1)
                if self.num_blocks - len(self._refs) - self._private <= 0:
                    break
            self._refs[h] = 0
            self._unpinned += 1
            installed += 1
            if run_start is None:
                run_start = i
        else:
            i = len(hashes)
        if run_start is not None:
            self._emit_range(hashes, tokens, run_start, i)
        return installed

    def _emit_range(self, hashes: list[int], tokens: list[int], start: int, end: int) -> None:
        b = self.block_size
        parent = hashes[start - 1] if start > 0 else None
        self.events.append(("BlockStored", hashes[start:end], parent, tokens[start * b : end * b], b, None, "GPU"))
        self._offload(hashes[start:end])

    def _emit_stored(self, a: Allocation, start: int, end: int) -> None:
        b = self.block_size
        parent = a.hashes[start - 1] if start > 0 else None
        stored = ("BlockStored", a.hashes[start:end], parent, a.tokens[start * b : end * b], b, a.lora_name, "GPU")
        self.events.append(stored)
        self._offload(a.hashes[start:end])

    @property
    def host_cached_blocks(self) -> int:
        """Blocks the host offload holds."""
        return len(self._host)

    def _offload(self, hashes: list[int]) -> None:
        """Writes newly cached blocks to the host LRU (see the module docs)."""
        if self.host_blocks == 0:
            return
        new = []
        for h in hashes:
            if h in self._host:
                self._host.move_to_end(h)
                continue
            if len(self._host) >= self.host_blocks:
                dropped, _ = self._host.popitem(last=False)
                self.events.append(("BlockRemoved", [dropped], "CPU"))
            self._host[h] = None
            new.append(h)
        if new:
            self.events.append(("BlockStored", new, None, [], self.block_size, None, "CPU"))

    def release(self, a: Allocation) -> None:
        """Unpins the request's cached blocks and frees its private ones."""
        for h in a.pinned:
            refs = self._refs[h] - 1
            self._refs[h] = refs
            if refs == 0:
                self._unpinned += 1
                self._refs.move_to_end(h)
        a.pinned.clear()
        self._private -= a.private
        a.private = 0

    def clear(self) -> None:
        """Drops every unpinned cached block at once (vLLM's ``reset_prefix_cache``)."""
        if self.used_blocks != self._private:
            raise RuntimeError("cannot reset the prefix cache while requests hold cached blocks")
        self._refs.clear()
        self._unpinned = 0
        self.events.append(("AllBlocksCleared",))

    def take_events(self) -> list[Event]:
        """The events since the last call."""
        events, self.events = self.events, []
        return events

    # -- internals ---------------------------------------------------------------------------

    def _pin(self, h: int) -> None:
        refs = self._refs[h]
        if refs == 0:
            self._unpinned -= 1
        self._refs[h] = refs + 1
        self._refs.move_to_end(h)

    def _evict(self, count: int) -> None:
        """Evicts ``count`` unpinned cached blocks, least recently used first."""
        if count <= 0:
            return
        victims = []
        for h, refs in self._refs.items():
            if refs == 0:
                victims.append(h)
                if len(victims) == count:
                    break
        for h in victims:
            del self._refs[h]
            self._unpinned -= 1
            self.evictions += 1
            self.events.append(("BlockRemoved", [h], "GPU"))
