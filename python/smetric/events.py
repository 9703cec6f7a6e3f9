"""vLLM KV-cache events → the router's index.

A :class:`KvEventSubscriber` subscribes to the ``ZmqEventPublisher`` of every engine (one
:class:`KvEventSource` per data-parallel rank), and hands each raw multipart message to the Rust
:class:`smetric._core.KvEventIngestor`, which decodes it, keeps the sequence numbers, maps engine
block hashes to smetric's own through the published token ids, and stores or removes blocks in
the router (GPU → the instance's tier, CPU/STORAGE → the global tier, or the instance's host pool
for a source whose ``offload`` is ``"host"``). A sequence gap is filled by
a replay from the engine's replay endpoint when there is one, otherwise the source is reset.

One thread serves all sources with a ``zmq.Poller``; :meth:`KvEventSubscriber.stop` ends it.
Why the loop is Python (pyzmq) and the logic Rust, with the measurements: ``docs/kv-events.md``.

    >>> from smetric import Router, RouterConfig
    >>> from smetric.events import KvEventSource, KvEventSubscriber
    >>> router = Router(["http://gpu-0:8000"], config=RouterConfig(index_mode="exact"))
    >>> sources = [KvEventSource("http://gpu-0:8000", "tcp://gpu-0:5557", replay_endpoint="tcp://gpu-0:5558")]
    >>> with KvEventSubscriber(router, sources) as sub:  # doctest: +SKIP
    ...     ...  # route; sub.stats() has the counters
"""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

from smetric._core import IngestStep, KvEventIngestor, Router
from smetric._types import IngestSourceStats, IngestStats, Offload
from smetric.errors import KvEventEndpointInUseError, MissingExtraError

try:
    import zmq
except ModuleNotFoundError as e:
    raise MissingExtraError(__name__, "pyzmq", "events", name=e.name) from e

__all__ = [
    "IngestSourceStats",
    "IngestStats",
    "IngestStep",
    "KvEventSource",
    "KvEventSubscriber",
    "SubscriberSourceStats",
    "SubscriberStats",
    "discover_sources",
    "sources_from_config",
]

log = logging.getLogger("smetric.events")


@dataclass(frozen=True, slots=True)
class KvEventSource:
    """One engine's KV-event publisher.

    Attributes:
        instance: the router instance the engine serves (several ranks may share one).
        endpoint: the publisher's PUB address to connect to (``tcp://host:5557``); with
            ``bind=True``, the address the subscriber binds for a publisher configured to connect.
        replay_endpoint: the publisher's replay ROUTER address, or None (gaps then reset the source).
        bind: bind the SUB socket instead of connecting it.
        topic: subscription prefix (vLLM's ``topic``; empty = everything).
        offload: where the engine's CPU/STORAGE blocks live: ``"shared"`` (a store every
            instance reads — Mooncake, a shared LMCache server: the global tier) or ``"host"``
            (the engine's own host memory — vLLM's ``OffloadingConnector``, LMCache's local CPU
            backend — credited to this instance only; docs/routing-semantics.md §2.8).
    """

    instance: str
    endpoint: str
    replay_endpoint: str | None = None
    bind: bool = False
    topic: str = ""
    offload: Offload = "shared"


class SubscriberSourceStats(IngestSourceStats):
    """One source's counters in :meth:`KvEventSubscriber.stats`, with where it comes from."""

    instance: str
    """The router instance the source feeds."""
    endpoint: str
    """The publisher's PUB address."""


class SubscriberStats(IngestStats):
    """:meth:`KvEventSubscriber.stats`: the ingestor's counters summed over sources, and more."""

    sources: list[SubscriberSourceStats]
    """One entry per source, in :attr:`KvEventSubscriber.sources` order."""
    loop_errors: int
    """Messages whose ingestion raised (logged; the thread kept running)."""
    running: bool
    """Whether the thread is alive."""


def _with_host(endpoint: str, host: str) -> str:
    """Replaces a wildcard host (``tcp://*:5557``) with ``host``."""
    if "://*:" in endpoint:
        return endpoint.replace("://*:", f"://{host}:", 1)
    return endpoint


def sources_from_config(instance: str, configs: dict[str, Any], host: str) -> list[KvEventSource]:
    """Sources from vLLM's ``GET /kv_event_sources`` answer (``{dp_rank: KVEventsConfig}``).

    Args:
        instance: the router instance every rank feeds.
        configs: the decoded JSON; ranks whose publisher is not ``"zmq"`` are skipped.
        host: the engine's host, substituted for a wildcard (``*``) in the endpoints.

    Returns:
        One source per rank, in rank order. A PUB endpoint without a wildcard means the engine
        connects to the router, so that source binds.
    """
    out = []
    for _, cfg in sorted(configs.items(), key=lambda kv: int(kv[0])):
        if not cfg.get("enable_kv_cache_events") or cfg.get("publisher") != "zmq":
            continue
        endpoint = str(cfg["endpoint"])
        binds = not ("*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://")))
        replay = cfg.get("replay_endpoint")
        out.append(
            KvEventSource(
                instance=instance,
                endpoint=endpoint if binds else _with_host(endpoint, host),
                replay_endpoint=None if replay is None else _with_host(str(replay), host),
                bind=binds,
                topic=str(cfg.get("topic") or ""),
            )
        )
    return out


def discover_sources(
    instance: str, base_url: str | None = None, *, timeout: float = 2.0, headers: Mapping[str, str] | None = None
) -> list[KvEventSource]:
    """Asks a vLLM API server for its publishers (``GET {base_url}/kv_event_sources``).

    Args:
        instance: the router instance; also the base URL when ``base_url`` is None.
        base_url: the API server, e.g. ``http://gpu-0:8000``.
        timeout: seconds for the HTTP request.
        headers: HTTP headers sent with it (an engine's key).

    Raises:
        OSError: the server could not be reached; ValueError: the answer is not a JSON object.
    """
    url = (base_url or instance).rstrip("/")
    req = urllib.request.Request(f"{url}/kv_event_sources", headers=dict(headers or {}))
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        configs = json.loads(resp.read())
    if not isinstance(configs, dict):
        raise ValueError(f"{url}/kv_event_sources returned {type(configs).__name__}, not an object")
    host = urllib.parse.urlsplit(url).hostname or "127.0.0.1"
    return sources_from_config(instance, configs, host)


def _bind(sock: zmq.Socket[bytes], source: KvEventSource) -> None:
    """Binds ``source.endpoint``; an address in use becomes :class:`KvEventEndpointInUseError`."""
    try:
        sock.bind(source.endpoint)
    except zmq.ZMQError as e:
        if e.errno != zmq.EADDRINUSE:
            raise
        port = source.endpoint.rsplit(":", 1)[-1]
        raise KvEventEndpointInUseError(
            f"KV events of {source.instance}: cannot bind {source.endpoint}, another subscriber holds it. "
            f"The engine connects to a single subscriber when its kv-events endpoint names a host; for "
            f"several routers start it with an endpoint it binds, "
            f'--kv-events-config \'{{"endpoint": "tcp://*:{port}", ...}}\' (or ipc://PATH)',
            instance=source.instance,
            endpoint=source.endpoint,
        ) from None


class _Errors:
    """Logs decode errors per source: the first one, then a summary at most every ``every_s``."""

    def __init__(self, every_s: float = 10.0) -> None:
        self.every_s = every_s
        self.last: dict[int, float] = {}
        self.muted: dict[int, int] = {}

    def report(self, source: int, what: KvEventSource, error: str) -> None:
        now = time.monotonic()
        if now - self.last.get(source, -self.every_s) < self.every_s:
            self.muted[source] = self.muted.get(source, 0) + 1
            return
        muted = self.muted.pop(source, 0)
        more = f" ({muted} more since the last report)" if muted else ""
        log.warning("KV event from %s (%s) dropped: %s%s", what.endpoint, what.instance, error, more)
        self.last[source] = now


class KvEventSubscriber:
    """Feeds a router's index from the KV events of its engines, on one background thread.

    Arguments:
        router: the router whose index is fed (use ``index_mode="exact"`` so only events change it).
        sources: the publishers; see :func:`discover_sources`.
        replay_timeout_s: a replay without a reply for this long is given up (the source is reset).
        poll_interval_s: how often the thread checks for :meth:`stop` when idle.
        max_message_bytes: larger messages are dropped by ZMQ (a bound on memory).
        rcvhwm: messages ZMQ queues per socket before it drops (drops become gaps).
        max_mapped_blocks: engine blocks mapped per source (:class:`KvEventIngestor`).
        max_pending_batches: live batches held back per source while a replay runs.
    """

    def __init__(
        self,
        router: Router,
        sources: Sequence[KvEventSource],
        *,
        replay_timeout_s: float = 5.0,
        poll_interval_s: float = 0.1,
        max_message_bytes: int = 64 << 20,
        rcvhwm: int = 100_000,
        max_mapped_blocks: int = KvEventIngestor.DEFAULT_MAX_MAPPED_BLOCKS,
        max_pending_batches: int = KvEventIngestor.DEFAULT_MAX_PENDING_BATCHES,
    ) -> None:
        if replay_timeout_s <= 0 or poll_interval_s <= 0:
            raise ValueError("replay_timeout_s and poll_interval_s must be > 0")
        self.router = router
        self.sources = list(sources)
        self.ingestor = KvEventIngestor(
            router, max_mapped_blocks=max_mapped_blocks, max_pending_batches=max_pending_batches
        )
        self._ids = [
            self.ingestor.add_source(s.instance, replay=s.replay_endpoint is not None, offload=s.offload)
            for s in self.sources
        ]
        self.replay_timeout_s = replay_timeout_s
        self.poll_interval_s = poll_interval_s
        self.max_message_bytes = max_message_bytes
        self.rcvhwm = rcvhwm
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._startup_error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._loop_errors = 0
        self._errors = _Errors()

    @property
    def source_ids(self) -> list[int]:
        """The ingestor's id of each of :attr:`sources`, in order (for ``ingestor.stats(id)``)."""
        return list(self._ids)

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self, timeout: float = 5.0) -> Self:
        """Starts the thread; returns once every socket is bound or connected.

        Raises:
            RuntimeError: already started, or the sockets could not be set up in ``timeout``.
            KvEventEndpointInUseError: a ``bind=True`` source's address is held by another
                subscriber (an engine in connect mode has room for one router; the message says
                how to configure it for several).
            zmq.ZMQError: any other failure to bind or connect an endpoint.
        """
        if self._thread is not None:
            raise RuntimeError("KvEventSubscriber already started")
        self._thread = threading.Thread(target=self._run, name="smetric-kv-events", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            self.stop()
            raise RuntimeError(f"KV-event sockets not ready after {timeout} s")
        if self._startup_error is not None:
            self._thread.join(timeout)
            raise self._startup_error
        return self

    def stop(self, timeout: float = 5.0, *, clear: bool = False) -> None:
        """Stops the thread and closes the sockets (idempotent).

        Args:
            timeout: seconds to wait for the thread.
            clear: also remove every block the sources put in the index.
        """
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("the KV-event thread did not stop within %s s", timeout)
        if clear:
            for sid in self._ids:
                self.ingestor.reset_source(sid)

    @property
    def running(self) -> bool:
        """Whether the thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    def __enter__(self) -> Self:
        """Starts the subscriber unless it already runs."""
        return self if self._thread is not None else self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def stats(self) -> SubscriberStats:
        """The ingestor's counters summed over sources, plus ``sources`` (one dict per source,
        with its ``instance`` and ``endpoint``), ``loop_errors`` and ``running``."""
        sources: list[SubscriberSourceStats] = [
            {"instance": s.instance, "endpoint": s.endpoint, **self.ingestor.stats(sid)}
            for s, sid in zip(self.sources, self._ids, strict=True)
        ]
        return {**self.ingestor.stats(), "sources": sources, "loop_errors": self._loop_errors, "running": self.running}

    # -- the thread ------------------------------------------------------------------------------

    def _socket(self, ctx: zmq.Context[zmq.Socket[bytes]], kind: int) -> zmq.Socket[bytes]:
        sock = ctx.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, self.max_message_bytes)
        sock.setsockopt(zmq.RCVHWM, self.rcvhwm)
        return sock

    def _dealer(self, ctx: zmq.Context[zmq.Socket[bytes]], index: int) -> zmq.Socket[bytes]:
        sock = self._socket(ctx, zmq.DEALER)
        endpoint = self.sources[index].replay_endpoint
        assert endpoint is not None
        sock.connect(endpoint)
        return sock

    def _run(self) -> None:
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        subs: list[zmq.Socket[bytes]] = []
        dealers: dict[int, zmq.Socket[bytes]] = {}
        poller = zmq.Poller()
        try:
            try:
                for i, source in enumerate(self.sources):
                    sub = self._socket(ctx, zmq.SUB)
                    sub.setsockopt(zmq.SUBSCRIBE, source.topic.encode())
                    if source.bind:
                        _bind(sub, source)
                    else:
                        sub.connect(source.endpoint)
                    subs.append(sub)
                    poller.register(sub, zmq.POLLIN)
                    if source.replay_endpoint is not None:
                        dealers[i] = self._dealer(ctx, i)
                        poller.register(dealers[i], zmq.POLLIN)
            except BaseException as e:
                self._startup_error = e
                return
            finally:
                self._ready.set()
            self._loop(ctx, poller, subs, dealers)
        finally:
            ctx.destroy(linger=0)  # closes every socket of the context, a half-set-up one included

    def _loop(
        self,
        ctx: zmq.Context[zmq.Socket[bytes]],
        poller: zmq.Poller,
        subs: list[zmq.Socket[bytes]],
        dealers: dict[int, zmq.Socket[bytes]],
    ) -> None:
        index_of = {id(s): i for i, s in enumerate(subs)}
        dealer_of = {id(s): i for i, s in dealers.items()}
        deadlines: dict[int, float] = {}
        timeout_ms = max(1, int(self.poll_interval_s * 1000))
        while not self._stop.is_set():
            for sock, _ in poller.poll(timeout_ms):
                # Drain a bounded number per socket and round, so no source starves the others.
                drained: list[list[bytes]] = []
                for _ in range(256):
                    try:
                        drained.append(sock.recv_multipart(zmq.NOBLOCK))
                    except zmq.Again:
                        break
                if id(sock) in index_of:
                    # One call for what was drained: the GIL released once and the index lock taken
                    # without waiting; only the steps that ask for something come back.
                    i = index_of[id(sock)]
                    for _, asked in self._call_batch(i, drained):
                        self._after(i, asked, deadlines, dealers)
                    continue
                i = dealer_of[id(sock)]
                for frames in drained:
                    step = self._call(i, self.ingestor.on_replay_reply, frames)
                    deadlines[i] = time.monotonic() + self.replay_timeout_s
                    self._after(i, step, deadlines, dealers)
            now = time.monotonic()
            for i, deadline in list(deadlines.items()):
                if now >= deadline:
                    log.warning("replay from %s timed out; resetting the source", self.sources[i].replay_endpoint)
                    self._after(i, self.ingestor.on_replay_failed(self._ids[i]), deadlines, dealers)
                    # Replies still queued for the abandoned replay go with the old socket.
                    poller.unregister(dealers[i])
                    dealers[i].close(linger=0)
                    dealers[i] = self._dealer(ctx, i)
                    dealer_of = {id(s): j for j, s in dealers.items()}
                    poller.register(dealers[i], zmq.POLLIN)

    def _call_batch(self, i: int, messages: list[list[bytes]]) -> list[tuple[int, IngestStep]]:
        if not messages:
            return []
        try:
            return self.ingestor.on_messages(self._ids[i], messages)
        except Exception:
            self._loop_errors += 1
            log.exception("KV events from %s could not be ingested", self.sources[i].endpoint)
            return []

    def _call(self, i: int, method: Callable[[int, list[bytes]], IngestStep], frames: list[bytes]) -> IngestStep | None:
        try:
            step = method(self._ids[i], frames)
        except Exception:
            self._loop_errors += 1
            log.exception("KV event from %s could not be ingested", self.sources[i].endpoint)
            return None
        return step

    def _after(
        self,
        i: int,
        step: IngestStep | None,
        deadlines: dict[int, float],
        dealers: dict[int, zmq.Socket[bytes]],
    ) -> None:
        if step is None:
            return
        if step.error is not None:
            self._errors.report(i, self.sources[i], step.error)
        if step.replay_done:
            deadlines.pop(i, None)
        replay_from = step.replay_from
        if replay_from is not None:
            log.info("sequence gap from %s: replaying from %d", self.sources[i].endpoint, replay_from)
            try:
                dealers[i].send_multipart([b"", replay_from.to_bytes(8, "big")], zmq.NOBLOCK)
                deadlines[i] = time.monotonic() + self.replay_timeout_s
            except zmq.ZMQError:
                self._after(i, self.ingestor.on_replay_failed(self._ids[i]), deadlines, dealers)
