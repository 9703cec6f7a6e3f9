"""Router replicas that route on the whole fleet's in-flight work: load snapshots over NATS.

Each ``smetric serve`` replica builds the same prefix index from the engines' KV events, but its
load board counts only the requests it routed itself. With ``--replica-bus nats://HOST:PORT``
each replica

* **publishes**, every ``period_s`` (50 ms), a snapshot of its own board — per instance, its
  requests in flight (``batch_size``), those not yet prefilled (``waiting``), their queued
  prefill tokens and work, and their prompt tokens (``active``): the totals of the load effects
  its decisions and their lifecycle calls made (routed, prefilled, finished, aborted), whichever
  data plane served them, since both route on the one core ``Router``;
* **applies** its peers' latest snapshots, summed per instance, to its router
  (``Router.set_peer_load``), which adds them to its own counters in every decision.

Why snapshots, not each effect: a snapshot is idempotent, so a lost, repeated or reordered
message or a peer's restart cannot leave a counter wrong; the next one repairs it. The cost is
the period: a peer's decision reaches this replica's board within ``period_s`` plus one NATS hop
(sub-millisecond on a LAN) — the **staleness bound**, ≈ 50 ms by default.

**Ordering**: a snapshot carries its replica's sequence number; an older one than the last
applied is dropped. **A peer that vanishes** (killed, partitioned) stops publishing; its
snapshot is dropped once it is ``expiry_s`` old (2 s), so its in-flight work leaves this board
within ``expiry_s + period_s``. **The bus down** (unreachable at start, or lost): the replica
routes on its own view (peers expire as above), says so once in its log, in ``/health``'s body
and in ``smetric_replica_bus_connected``; it keeps reconnecting and resumes when the bus returns.

Bounds (nothing a peer sends grows memory without bound): at most ``max_peers`` peers (others
are counted and ignored), a message of at most :data:`MAX_MESSAGE_BYTES`, only instances of this
replica's own fleet are kept from it.

Invariants: this replica's own counters never hold a peer's work (``Router.load`` stays its own;
``peer_load`` is the sum set last); every instance's peer load is rewritten on every change, so
an instance a peer stopped naming goes back to zero. Cost: O(instances × peers) per snapshot
received or tick. May import: :mod:`smetric` only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from smetric import Router
from smetric.errors import MissingExtraError

log = logging.getLogger(__name__)

FIELDS = ("batch_size", "waiting", "queued", "queued_work", "active")
"""A snapshot's per-instance counters, in order (``Router.load``'s names)."""
MAX_MESSAGE_BYTES = 1 << 20
"""Largest snapshot taken (NATS's default ``max_payload``)."""
RECONNECT_WAIT_S = 0.5
"""Pause between attempts to reach the bus."""


def default_replica_id() -> str:
    """This process's name on the bus: host, process id and a random suffix (a restarted replica
    is a new peer, so its predecessor's snapshot expires rather than being overwritten)."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


@dataclass
class _Peer:
    seq: int
    received: float
    loads: dict[str, tuple[int, ...]]


class ReplicaBus:
    """This replica's side of the bus (see the module docs). Start with :meth:`start` on the
    proxy's loop; :meth:`close` stops it and clears the peers' load."""

    def __init__(
        self,
        url: str,
        router: Router,
        instances: Callable[[], Sequence[str]],
        *,
        subject: str = "smetric.replicas.load",
        replica_id: str | None = None,
        period_s: float = 0.05,
        expiry_s: float = 2.0,
        max_peers: int = 64,
    ) -> None:
        self.url = url
        self.router = router
        self.instances = instances
        self.subject = subject
        self.replica_id = replica_id or default_replica_id()
        self.period_s = period_s
        self.expiry_s = expiry_s
        self.max_peers = max_peers
        self.peers: dict[str, _Peer] = {}
        self.connected = False
        self.published = 0
        self.received = 0
        self.dropped = 0
        """Messages refused: malformed, oversized, stale, or from a peer over ``max_peers``."""
        self._seq = 0
        self._nc: Any = None
        self._task: asyncio.Task[None] | None = None
        self._warned = False

    async def start(self) -> None:
        """Starts connecting, publishing and expiring in the background (never raises for the
        bus: an unreachable bus is the degraded state)."""
        try:
            import nats  # noqa: F401  # the client, an extra of `serve`
        except ImportError as e:
            raise MissingExtraError(__name__, "nats", "serve", name=e.name) from e
        self._task = asyncio.create_task(self._run(), name="smetric-replica-bus")

    async def close(self) -> None:
        """Stops the background task, leaves the bus and clears every peer's load."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._nc is not None:
            with contextlib.suppress(Exception):
                await self._nc.close()
        self.peers.clear()
        self._apply()

    # -- the background task ------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            if self._nc is None:
                await self._connect()
            if self.connected:
                await self._publish()
            self._expire()
            await asyncio.sleep(self.period_s)

    async def _connect(self) -> None:
        import nats

        async def disconnected() -> None:
            if self.connected:
                log.warning("replica bus %s lost; routing on this replica's own view until it returns", self.url)
            self.connected = False

        async def reconnected() -> None:
            log.info("replica bus %s back; sharing in-flight work again", self.url)
            self.connected = True

        try:
            self._nc = await nats.connect(
                self.url,
                connect_timeout=1,
                allow_reconnect=True,
                max_reconnect_attempts=-1,
                reconnect_time_wait=RECONNECT_WAIT_S,
                disconnected_cb=disconnected,
                reconnected_cb=reconnected,
                error_cb=_quiet,
                name=self.replica_id,
            )
            await self._nc.subscribe(self.subject, cb=self._on_message)
        except Exception as e:  # unreachable, refused, bad URL: the degraded state
            if self._nc is not None:
                with contextlib.suppress(Exception):
                    await self._nc.close()
            self._nc = None
            if not self._warned:
                log.warning(
                    "replica bus %s unreachable (%s); routing on this replica's own view, retrying", self.url, e
                )
                self._warned = True
            await asyncio.sleep(RECONNECT_WAIT_S)
            return
        if self._warned:
            log.info("replica bus %s reached; sharing in-flight work", self.url)
        self._warned = False
        self.connected = True

    async def _publish(self) -> None:
        loads = {}
        for name in self.instances():
            with contextlib.suppress(Exception):  # an instance removed meanwhile
                load = self.router.load(name)
                loads[name] = [int(load[f]) for f in FIELDS]  # type: ignore[literal-required]
        self._seq += 1
        body = json.dumps({"replica": self.replica_id, "seq": self._seq, "instances": loads}).encode()
        try:
            await self._nc.publish(self.subject, body)
            self.published += 1
        except Exception:  # lost meanwhile: the disconnect callback says so
            self.connected = False

    async def _on_message(self, msg: Any) -> None:
        self.on_snapshot(msg.data)

    def on_snapshot(self, data: bytes, now: float | None = None) -> bool:
        """Applies one peer snapshot (the bytes a peer published); returns whether it was taken."""
        now = time.monotonic() if now is None else now
        parsed = _parse(data)
        if parsed is None:
            self.dropped += 1
            return False
        replica, seq, loads = parsed
        if replica == self.replica_id:
            return False
        peer = self.peers.get(replica)
        if peer is None and len(self.peers) >= self.max_peers:
            self.dropped += 1
            return False
        if peer is not None and seq <= peer.seq:
            self.dropped += 1
            return False
        known = set(self.instances())
        self.peers[replica] = _Peer(seq, now, {k: v for k, v in loads.items() if k in known})
        self.received += 1
        self._apply()
        return True

    def _expire(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        gone = [r for r, p in self.peers.items() if now - p.received > self.expiry_s]
        for r in gone:
            del self.peers[r]
            log.info("replica %s silent for %.1f s: its in-flight work leaves this board", r, self.expiry_s)
        if gone:
            self._apply()

    def _apply(self) -> None:
        for name in self.instances():
            total = [0] * len(FIELDS)
            for p in self.peers.values():
                for k, v in enumerate(p.loads.get(name, ())):
                    total[k] += v
            with contextlib.suppress(Exception):  # an instance removed meanwhile
                self.router.set_peer_load(name, **dict(zip(FIELDS, total, strict=True)))

    # -- what the replica reports --------------------------------------------------------------

    def lag_s(self, now: float | None = None) -> float:
        """Age of the oldest live peer's last snapshot, seconds (0 without peers): how stale this
        replica's view of its peers is now."""
        now = time.monotonic() if now is None else now
        return max((now - p.received for p in self.peers.values()), default=0.0)

    def health(self) -> dict[str, Any]:
        """The bus's part of ``/health``'s body."""
        return {
            "state": "connected" if self.connected else "degraded: routing on this replica's own view",
            "url": self.url,
            "replica": self.replica_id,
            "peers": len(self.peers),
        }

    def render(self) -> list[str]:
        """The bus's families in the Prometheus text format."""
        return [
            "# HELP smetric_replica_bus_connected Whether this replica is connected to its replica bus.",
            "# TYPE smetric_replica_bus_connected gauge",
            f"smetric_replica_bus_connected {int(self.connected)}",
            "# HELP smetric_replica_peers Peer router replicas whose snapshots this replica applies now.",
            "# TYPE smetric_replica_peers gauge",
            f"smetric_replica_peers {len(self.peers)}",
            "# HELP smetric_replica_sync_lag_seconds Age of the oldest live peer's last load snapshot.",
            "# TYPE smetric_replica_sync_lag_seconds gauge",
            f"smetric_replica_sync_lag_seconds {self.lag_s():.3f}",
            "# HELP smetric_replica_snapshots_total Load snapshots published and received on the replica bus.",
            "# TYPE smetric_replica_snapshots_total counter",
            f'smetric_replica_snapshots_total{{direction="published"}} {self.published}',
            f'smetric_replica_snapshots_total{{direction="received"}} {self.received}',
            f'smetric_replica_snapshots_total{{direction="dropped"}} {self.dropped}',
        ]


async def _quiet(_: Exception) -> None:
    """nats-py's error callback: the disconnect callback and the degraded state say what matters."""


def _parse(data: bytes) -> tuple[str, int, dict[str, tuple[int, ...]]] | None:
    """A peer snapshot, or None when it is not one (oversized, malformed, negative counts)."""
    if len(data) > MAX_MESSAGE_BYTES:
        return None
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):
        return None
    if not isinstance(doc, dict):
        return None
    replica, seq, instances = doc.get("replica"), doc.get("seq"), doc.get("instances")
    if not isinstance(replica, str) or not 0 < len(replica) <= 256 or type(seq) is not int:
        return None
    if not isinstance(instances, dict):
        return None
    loads = {}
    for name, values in instances.items():
        if (
            not isinstance(values, list)
            or len(values) != len(FIELDS)
            or not all(type(v) is int and 0 <= v < 1 << 62 for v in values)
        ):
            return None
        loads[name] = tuple(values)
    return replica, seq, loads


def fleet_lines(router: Router, instances: Sequence[str]) -> list[str]:
    """``smetric_fleet_in_flight`` and ``smetric_fleet_queued_prefill_tokens`` per instance: the
    fleet view this replica routes on (its own counters plus its peers' last snapshots; its own
    alone without a bus)."""
    lines = [
        "# HELP smetric_fleet_in_flight Requests in flight per instance across every router replica "
        "(this one's and its peers' last snapshots).",
        "# TYPE smetric_fleet_in_flight gauge",
    ]
    queued = [
        "# HELP smetric_fleet_queued_prefill_tokens Uncached prompt tokens queued per instance across "
        "every router replica.",
        "# TYPE smetric_fleet_queued_prefill_tokens gauge",
    ]
    for name in instances:
        try:
            own, peers = router.load(name), router.peer_load(name)
        except Exception:  # removed meanwhile
            continue
        label = name.replace("\\", "\\\\").replace('"', '\\"')
        lines.append(f'smetric_fleet_in_flight{{instance="{label}"}} {own["batch_size"] + peers["batch_size"]}')
        queued.append(f'smetric_fleet_queued_prefill_tokens{{instance="{label}"}} {own["queued"] + peers["queued"]}')
    return lines + queued
