"""Helpers of the proxy tests: stub upstreams on a background loop, a bounded HTTP client, the
proxy's own metrics read back, and free loopback ports."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable
from typing import Any, Self

from aiohttp import web

from smetric import PdRouter, Router
from smetric.serve.backends import ColocatedBackend, PdBackend
from smetric.serve.config import load_config
from smetric.serve.proxy import ProxyServer

TIMEOUT_S = 15.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
