"""vLLM's disaggregated prefill/decode, as the fake engine plays it (``--role prefill|decode``).

The protocol is the one vLLM's NIXL proxy speaks (``docs/pd-and-tier.md`` §A.1):

* **prefill** — a request whose ``kv_transfer_params`` has ``do_remote_decode: true`` runs its
  prefill (the proxy sends ``max_tokens=1``, ``stream=false``); the engine then *holds* its KV
  blocks (vLLM's ``delay_free_blocks``) under a lease of ``kv_lease_s``, and answers with a
  top-level ``kv_transfer_params``: ``do_remote_prefill: true``, ``remote_engine_id``,
  ``remote_request_id``, ``remote_block_ids``, ``remote_host``, ``remote_port``, ``tp_size``,
  ``remote_num_tokens``, ``remote_blocks_expiry_time``, ``transfer_mode: "pull"``.
* **decode** — a request with ``do_remote_prefill: true`` pulls the KV from the prefill engine
  those fields name before it is scheduled. The pull is the fake's transport: ``POST
  {remote}/fake_kv/pull`` on the prefill engine, which checks the lease (engine id, request id),
  frees its blocks (``finished_sending``) and returns the prompt's block hashes; the decode
  engine waits the transfer time and installs the blocks
  in its own prefix cache, so only the last partial block is computed. Parameters that no
  prefill engine of the fleet issued are refused with 400 (a host outside ``--kv-peers``, an
  unknown or expired lease, an engine id that does not match) — nothing is computed for them.

The transfer time is the simulator's, for the engine's ``--profile``
(:meth:`smetric._core.PerfModel.pd_pull_time`: the KV bytes per rank at the per-rank cap or the
rank's share of the node NIC, plus the pull's fixed latency; ``docs/pd-and-tier.md`` §A.3 for the
figures), divided by ``speedup`` like every other wait of the fake engine.

Simplifications against vLLM: the decode engine installs before it allocates (vLLM allocates,
then waits in ``WAITING_FOR_REMOTE_KVS``); blocks the decode engine already caches are pulled
anyway; one transfer per request, whole.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import aiohttp

from smetric._core import PerfModel

from .cache import Allocation, PrefixCache

Role = Literal["both", "prefill", "decode"]


class KvTransferError(Exception):
    """Parameters no prefill engine of the fleet issued, or a pull that failed."""


@dataclass(slots=True)
class Lease:
    """Blocks a prefill engine holds for a decode engine to read."""

    alloc: Allocation
    hashes: list[int]
    num_tokens: int
    expires: float


class PrefillSide:
    """The leases of a prefill engine (one event loop; no locking)."""

    def __init__(self, cache: PrefixCache, *, host: str, port: int, lease_s: float) -> None:
        self.cache = cache
        self.engine_id = uuid.uuid4().hex
        self.host = host
        self.port = port
        self.lease_s = lease_s
        self.leases: dict[str, Lease] = {}
        self.pulled = 0
        self.expired = 0

    def hold(self, request_id: str, alloc: Allocation, tokens: Sequence[int]) -> dict[str, Any]:
        """Keeps ``alloc`` pinned for a pull; returns the ``kv_transfer_params`` to answer with."""
        self._expire()
        expires = time.time() + self.lease_s
        self.leases[request_id] = Lease(alloc, list(alloc.hashes), len(tokens), expires)
        return {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_block_ids": list(range(len(alloc.hashes))),
            "remote_engine_id": self.engine_id,
            "remote_request_id": request_id,
            "remote_host": self.host,
            "remote_port": self.port,
            "tp_size": 1,
            "remote_num_tokens": len(tokens),
            "remote_blocks_expiry_time": expires,
            "transfer_mode": "pull",
        }

    def pull(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """A decode engine reads a lease: its blocks are freed here and their hashes returned."""
        self._expire()
        if body.get("remote_engine_id") != self.engine_id:
            raise KvTransferError("remote_engine_id is not this prefill engine's")
        lease = self.leases.pop(str(body.get("remote_request_id")), None)
        if lease is None:
            raise KvTransferError("no KV held for remote_request_id (never issued, already read or expired)")
        self.cache.release(lease.alloc)
        self.pulled += 1
        return {"block_hashes": lease.hashes, "num_tokens": lease.num_tokens}

    def _expire(self) -> None:
        now = time.time()
        for rid in [rid for rid, lease in self.leases.items() if lease.expires < now]:
            self.cache.release(self.leases.pop(rid).alloc)
            self.expired += 1


class DecodeSide:
    """Pulls KV from prefill engines and installs it in the decode engine's prefix cache."""

    def __init__(self, cache: PrefixCache, perf: PerfModel, *, speedup: float, peers: Sequence[str] | None) -> None:
        self.cache = cache
        self.perf = perf
        self.speedup = speedup
        self.peers = None if peers is None else {p.removeprefix("http://").rstrip("/") for p in peers}
        self.pulls = 0
        self.refused = 0
        self.tokens_pulled = 0
        self.modelled_pull_s = 0.0
        """Sum of the pulls' modelled durations, seconds on the profile's hardware."""
        self._client: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()

    async def pull(self, params: Mapping[str, Any], tokens: list[int]) -> int:
        """Reads the KV ``params`` name; returns the prompt tokens now cached here.

        Raises:
            KvTransferError: the parameters were not issued by a prefill engine of the fleet.
        """
        host, port = params.get("remote_host"), params.get("remote_port")
        if not isinstance(host, str) or not isinstance(port, int) or not params.get("remote_request_id"):
            self.refused += 1
            raise KvTransferError("kv_transfer_params lack remote_host, remote_port or remote_request_id")
        peer = f"{host}:{port}"
        if self.peers is not None and peer not in self.peers:
            self.refused += 1
            raise KvTransferError(f"{peer} is not a prefill engine of this fleet")
        if self._client is None:
            self._client = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
        body = {k: params.get(k) for k in ("remote_engine_id", "remote_request_id")}
        try:
            async with self._client.post(f"http://{peer}/fake_kv/pull", json=body) as r:
                answer = await r.json(content_type=None)
                if r.status != 200:
                    self.refused += 1
                    raise KvTransferError(str(answer.get("error", {}).get("message", f"pull failed: {r.status}")))
        except (TimeoutError, aiohttp.ClientError, ValueError) as e:
            self.refused += 1
            raise KvTransferError(f"the KV pull from {peer} failed: {e}") from None
        hashes: list[int] = answer["block_hashes"]
        mine = self.cache.hash_prompt(tokens)
        if hashes != mine[: len(hashes)]:
            self.refused += 1
            raise KvTransferError("the pulled KV is not this prompt's")
        pulled = len(hashes) * self.cache.block_size
        modelled = self.perf.pd_pull_time(pulled)
        await asyncio.sleep(modelled / self.speedup)
        self.cache.install(tokens, hashes)
        self.pulls += 1
        self.tokens_pulled += pulled
        self.modelled_pull_s += modelled
        return pulled
