"""Assembling and running a fake engine: :class:`FakeEngineConfig`, :func:`serve` (the CLI's
foreground server, stopped by SIGINT/SIGTERM) and :class:`FakeEngine` (a server on a background
thread, for tests and benchmarks)."""

from __future__ import annotations

from . import _deps  # noqa: F401  (names the extra when a package is missing)

# isort: split

import asyncio
import re
import signal
import threading
from dataclasses import dataclass
from typing import Any, Self

from aiohttp import web

from smetric._core import DEFAULT_BLOCK_SIZE, PerfModel

from .cache import PrefixCache
from .engine import Engine
from .kv_publisher import KvEventPublisher
from .pd import DecodeSide, PrefillSide
from .server import FakeEngineApp, ServerConfig
from .tokens import ByteChunkTokenizer, HfTokenizer, Tokenizer


@dataclass(frozen=True, slots=True)
class FakeEngineConfig:
    """Every setting of a fake engine; the CLI flags map one to one."""

    host: str = "127.0.0.1"
    port: int = 8000
    """HTTP port (0: ephemeral)."""
    model: str = "fake-model"
    block_size: int = DEFAULT_BLOCK_SIZE
    prefix_caching_hash_algo: str = "sha256"
    hash_seed: str | None = None
    """vLLM's ``PYTHONHASHSEED`` (needed by the xxhash algorithms)."""
    num_gpu_blocks: int = 4096
    kv_offloading_blocks: int = 0
    """vLLM's ``--kv-offloading-size``, in blocks of host memory (0: no offloading): every block
    the engine caches is also written to a host LRU of this many blocks, announced with
    ``CPU``-medium KV events and on ``/metrics`` (``vllm:cache_config_info``'s
    ``kv_offloading_size``), as vLLM's ``OffloadingConnector`` does."""
    speedup: float = 100.0
    profile: str = "h20-qwen3-coder-30b-a3b"
    max_model_len: int = 32768
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    kv_events_port: int | None = None
    """PUB port (0: ephemeral); None: no KV events."""
    kv_replay_port: int | None = None
    """ROUTER replay port (0: ephemeral); None: no replay socket."""
    kv_events_host: str = "127.0.0.1"
    tokenizer: str | None = None
    """A ``tokenizer.json``; None: the byte-chunk tokenizer."""
    role: str = "both"
    """``both``; ``prefill`` or ``decode`` for vLLM's disaggregated prefill (:mod:`.pd`)."""
    kv_peers: tuple[str, ...] | None = None
    """Decode role: the prefill engines (``host:port``) it may pull from; None: any."""
    kv_lease_s: float = 30.0
    """Prefill role: how long held KV waits for its pull (vLLM's ``kv_lease_duration``)."""
    api_key: str | None = None
    """vLLM's ``--api-key``: the ``/v1`` paths need ``Authorization: Bearer <key>``."""
    lora_modules: tuple[str, ...] = ()
    """Served LoRA adapters, ``name=path`` each (vLLM's ``--lora-modules``; a bare name gets the
    path ``/fake-lora/<name>``): a request whose ``model`` is one is cached under it."""

    def adapters(self) -> dict[str, str]:
        """``lora_modules`` as name → path.

        Raises:
            ValueError: an empty name, or a name given twice.
        """
        out: dict[str, str] = {}
        for module in self.lora_modules:
            name, _, path = module.partition("=")
            if not name or name in out:
                raise ValueError(f"lora module {module!r}: a non-empty name, once")
            out[name] = path or f"/fake-lora/{name}"
        return out


class _Stack:
    """The engine, its publisher and its HTTP app, built on the running event loop."""

    def __init__(self, config: FakeEngineConfig) -> None:
        self.config = config
        self.publisher: KvEventPublisher | None = None
        if config.kv_events_port is not None:
            host = config.kv_events_host
            replay = None if config.kv_replay_port is None else f"tcp://{host}:{config.kv_replay_port}"
            self.publisher = KvEventPublisher(f"tcp://{host}:{config.kv_events_port}", replay)
        cache = PrefixCache(
            config.num_gpu_blocks,
            config.block_size,
            config.prefix_caching_hash_algo,
            config.hash_seed,
            host_blocks=config.kv_offloading_blocks,
        )
        perf = PerfModel(config.profile)
        self.engine = Engine(
            cache,
            perf,
            speedup=config.speedup,
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            publisher=self.publisher,
        )
        tokenizer: Tokenizer = ByteChunkTokenizer() if config.tokenizer is None else HfTokenizer(config.tokenizer)
        if config.role not in ("both", "prefill", "decode"):
            raise ValueError(f"role must be both, prefill or decode, got {config.role!r}")
        self.prefill = (
            PrefillSide(cache, host=config.host, port=config.port, lease_s=config.kv_lease_s)
            if config.role == "prefill"
            else None
        )
        self.decode = (
            DecodeSide(cache, perf, speedup=config.speedup, peers=config.kv_peers) if config.role == "decode" else None
        )
        server = ServerConfig(
            config.model,
            config.max_model_len,
            self.kv_event_sources(),
            prefill=self.prefill,
            decode=self.decode,
            lora_modules=config.adapters(),
            api_key=config.api_key,
        )
        self.app = FakeEngineApp(self.engine, tokenizer, server).build()
        self.runner = web.AppRunner(self.app, handle_signals=False, access_log=None)
        self.port = config.port

    def kv_event_sources(self) -> dict[str, dict[str, Any]]:
        p = self.publisher

        def wildcard(endpoint: str | None) -> str | None:
            # vLLM's form: a bound endpoint has a wildcard host, which consumers replace with the
            # engine's host (and read as "the engine binds": a concrete host would mean it connects).
            return None if endpoint is None else re.sub(r"^tcp://[^:]+:", "tcp://*:", endpoint)

        cfg: dict[str, Any] = {
            "enable_kv_cache_events": p is not None,
            "publisher": "zmq" if p is not None else "null",
            "endpoint": wildcard(p.pub_endpoint) if p is not None else "tcp://*:5557",
            "replay_endpoint": wildcard(p.replay_endpoint) if p is not None else None,
            "buffer_steps": 10_000,
            "hwm": 100_000,
            "max_queue_size": 100_000,
            "topic": "",
        }
        return {"0": cfg}

    async def start(self) -> None:
        self.engine.start()
        await self.runner.setup()
        site = web.TCPSite(self.runner, self.config.host, self.config.port)
        await site.start()
        server = site._server
        sockets = getattr(server, "sockets", None) or []
        if sockets:
            self.port = sockets[0].getsockname()[1]
        if self.prefill is not None:
            self.prefill.port = self.port  # the pull address it hands out

    async def stop(self) -> None:
        await self.engine.stop()
        await self.runner.cleanup()
        if self.decode is not None:
            await self.decode.close()
        if self.publisher is not None:
            self.publisher.close()


async def _serve(config: FakeEngineConfig, ready: threading.Event | None = None) -> None:
    stack = _Stack(config)
    await stack.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    print(f"fake engine {config.model!r} on http://{config.host}:{stack.port}", flush=True)
    if stack.publisher is not None:
        print(f"KV events on {stack.publisher.pub_endpoint}, replay {stack.publisher.replay_endpoint}", flush=True)
    try:
        await stop.wait()
    finally:
        await stack.stop()


def serve(config: FakeEngineConfig) -> None:
    """Runs a fake engine in the foreground until SIGINT or SIGTERM, then shuts down cleanly."""
    asyncio.run(_serve(config))


class FakeEngine:
    """A fake engine on a background thread with its own event loop.

    Use as a context manager; :attr:`url` and :attr:`stack` are set once :meth:`start` returns.
    """

    def __init__(self, config: FakeEngineConfig | None = None, **overrides: Any) -> None:
        base = config or FakeEngineConfig(port=0)
        self.config = FakeEngineConfig(**{**{f: getattr(base, f) for f in base.__dataclass_fields__}, **overrides})
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="smetric-fake-engine", daemon=True)
        self.stack: _Stack | None = None

    @property
    def url(self) -> str:
        """The HTTP base URL."""
        assert self.stack is not None, "not started"
        return f"http://{self.config.host}:{self.stack.port}"

    def start(self, timeout: float = 10.0) -> Self:
        """Starts the thread and the server; returns once the port is bound."""
        self._thread.start()

        async def build() -> _Stack:
            stack = _Stack(self.config)
            await stack.start()
            return stack

        self.stack = asyncio.run_coroutine_threadsafe(build(), self._loop).result(timeout)
        return self

    def call(self, fn: Any, timeout: float = 10.0) -> Any:
        """Runs ``fn()`` on the engine's loop (to read its state consistently) and returns its result."""

        async def run() -> Any:
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout)

    def stop(self, timeout: float = 10.0) -> None:
        """Stops the server and the engine, closes the sockets and joins the thread."""
        if self.stack is not None:
            asyncio.run_coroutine_threadsafe(self.stack.stop(), self._loop).result(timeout)
            self.stack = None
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout)
        self._loop.close()

    def __enter__(self) -> Self:
        return self if self.stack is not None else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
