"""Helpers of the proxy tests: stub upstreams on a background loop, a bounded HTTP client, the
proxy's own metrics read back, free loopback ports, and ``python -m smetric`` children (fake
engines, a proxy) that say why they did not come up."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Self

from aiohttp import web

from smetric import PdRouter, Router
from smetric.serve.backends import ColocatedBackend, PdBackend
from smetric.serve.config import load_config
from smetric.serve.proxy import ProxyServer

TIMEOUT_S = 15.0
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts" / "vllm_cpu"))
from fleet import free_port  # noqa: E402  (the one loopback port picker: below the ephemeral range)


class ReservedPort:
    """A loopback port held bound, never listening, until ``release``: a connection to it is
    refused, as to a dead engine's, and no other socket can take the port meanwhile (``free_port``
    only picks one: a clean-clone CI once saw a "dead" instance answer 200 from a picked port, when
    picks were ports the kernel hands to sockets bound to port 0)."""

    def __init__(self) -> None:
        self.port = free_port()
        self._socket = socket.socket()
        self._socket.bind(("127.0.0.1", self.port))

    def release(self) -> None:
        """Frees the port (for a server to start on it); idempotent."""
        self._socket.close()


def free_ports(count: int) -> list[int]:
    """``count`` distinct free loopback ports (``free_port`` never hands one out twice)."""
    return [free_port() for _ in range(count)]


class SmetricProcess:
    """``python -m smetric <argv>`` as a child process serving HTTP on a loopback port.

    Its stderr goes to ``log`` so a child that did not come up says why, and an early exit is
    seen at once rather than after the whole wait. ``start_up`` starts it and waits; a child
    that exits before it is up (another process took one of its ports between the choice and
    the bind) is started again on fresh ports, at most ``START_ATTEMPTS`` times."""

    UP_TIMEOUT_S = 60.0
    START_ATTEMPTS = 3

    def __init__(self, log: Path) -> None:
        self.log = log
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def argv(self) -> list[str]:
        raise NotImplementedError

    def pick_ports(self) -> None:
        self.port = free_port()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> Self:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        with self.log.open("ab") as out:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "smetric", *self.argv()],
                cwd=ROOT,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=out,
            )
        return self

    def wait_up(self, timeout: float = UP_TIMEOUT_S) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ChildExited(f"{self.url} exited with {self.proc.returncode}: {self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"{self.url} did not come up in {timeout:.0f} s: {self.log_tail()}")

    def start_up(self) -> Self:
        for attempt in range(self.START_ATTEMPTS):
            try:
                self.start().wait_up()
                return self
            except ChildExited:
                if attempt + 1 == self.START_ATTEMPTS:
                    raise
                self.pick_ports()
        return self

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-2000:] if self.log.exists() else "(no log)"

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class ChildExited(RuntimeError):
    """A child process exited before it served ``/health``."""


class FakeEngineProcess(SmetricProcess):
    """``smetric fake-engine`` in its own process (so it can be SIGKILLed mid-run), with its
    KV-event publisher and replay ports when ``kv_events``."""

    def __init__(self, log_dir: Path, *options: str, kv_events: bool = False) -> None:
        self.options = list(options)
        self.kv_events = kv_events
        self.pub = self.replay = 0
        super().__init__(log_dir / f"engine-{id(self):x}.log")
        self.pick_ports()

    def pick_ports(self) -> None:
        self.port, self.pub, self.replay = free_ports(3)

    def argv(self) -> list[str]:
        argv = ["fake-engine", "--port", str(self.port), *self.options]
        if self.kv_events:
            argv += ["--kv-events-port", str(self.pub), "--kv-replay-port", str(self.replay)]
        return argv


class ServeProcess(SmetricProcess):
    """``smetric serve`` in its own process (its memory measured from outside)."""

    def __init__(self, log: Path, *options: str) -> None:
        self.options = list(options)
        super().__init__(log)

    def argv(self) -> list[str]:
        return ["serve", "--port", str(self.port), *self.options]


class Stub:
    """An aiohttp app on its own thread and loop (a misbehaving upstream for the proxy)."""

    def __init__(self, handler: Callable[[web.Request], Awaitable[web.StreamResponse]], port: int = 0) -> None:
        self.handler = handler
        self.port = port
        self.seen: list[dict[str, Any]] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Self:
        self._thread.start()

        async def up() -> None:
            async def record(request: web.Request) -> web.StreamResponse:
                self.seen.append({"path": request.path, "headers": dict(request.headers)})
                return await self.handler(request)

            app = web.Application()
            app.router.add_route("*", "/{tail:.*}", record)
            self._runner = web.AppRunner(app)
            await self._runner.setup()
            site = web.TCPSite(self._runner, "127.0.0.1", self.port)
            await site.start()
            self.port = self._runner.addresses[0][1]

        asyncio.run_coroutine_threadsafe(up(), self._loop).result(TIMEOUT_S)
        return self

    def stop(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(TIMEOUT_S)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(TIMEOUT_S)
        self._loop.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def request(
    base: str,
    path: str,
    body: object = None,
    *,
    raw: bytes | None = None,
    method: str = "POST",
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, str], bytes]:
    """One HTTP request to a loopback server: status, headers (lower-case names), body."""
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    req = urllib.request.Request(
        base + path, data=data, method=method, headers={"Content-Type": "application/json", **(headers or {})}
    )
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT_S) as resp:
            return resp.status, {k.lower(): v for k, v in resp.headers.items()}, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()


def metric(text: str, name: str, **labels: str) -> float:
    """The value of one sample of a Prometheus text page (0 when absent)."""
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        if key == name if not labels else key == f"{name}{{{want}}}":
            return float(value)
    return 0.0


def events(body: bytes) -> list[Any]:
    """The ``data:`` payloads of an SSE body (``[DONE]`` stays a string)."""
    out: list[Any] = []
    for block in body.decode().split("\n\n"):
        if block.startswith("data: "):
            data = block[len("data: ") :]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def chat_text(body: bytes) -> str:
    """The assistant text of a streamed chat answer."""
    return "".join(
        (e["choices"][0].get("delta") or {}).get("content") or ""
        for e in events(body)
        if isinstance(e, dict) and e.get("choices")
    )


def colocated_router(server: ProxyServer) -> Router:
    """The router of a running co-located proxy."""
    assert server.proxy is not None and isinstance(server.proxy.backend, ColocatedBackend)
    return server.proxy.backend.router


def pd_router(server: ProxyServer) -> PdRouter:
    """The PD router of a running disaggregated proxy."""
    assert server.proxy is not None and isinstance(server.proxy.backend, PdBackend)
    return server.proxy.backend.pd


def proxy_for(urls: list[str], **overrides: Any) -> ProxyServer:
    """A started proxy in front of ``urls`` (fast probes, no engine-load scraping unless asked)."""
    overrides.setdefault("probe_interval_s", 0.1)
    overrides.setdefault("engine_load", False)
    return ProxyServer(load_config(instances=urls, port=0, **overrides)).start()


def app_request(
    server: ProxyServer, path: str, body: object = None, *, headers: dict[str, str] | None = None, **options: Any
) -> tuple[int, dict[str, str], bytes]:
    """What the app behind ``server``'s gateway answers a request the gateway admitted and handed
    on (its loopback port, the gateway's fields; ``options`` as :func:`request` takes them): the
    reference the native path's answers are compared with, for the bodies and routes both still
    serve."""
    assert server.proxy is not None and server.proxy.compiled is not None
    plane = server.proxy.compiled
    app = f"http://127.0.0.1:{plane.app_port}"
    return request(app, path, body, headers={**(headers or {}), **plane.delegation_headers()}, **options)


def sender(server: ProxyServer, plane: str) -> Callable[..., tuple[int, dict[str, str], bytes]]:
    """:func:`request`'s signature, sent through the gateway (``plane`` ``"compiled"``) or handed
    straight to the app behind it (``"app"``, :func:`app_request`; the base URL is ignored)."""
    if plane == "compiled":
        return request

    def to_app(_base: str, *args: Any, **kwargs: Any) -> tuple[int, dict[str, str], bytes]:
        return app_request(server, *args, **kwargs)

    return to_app
