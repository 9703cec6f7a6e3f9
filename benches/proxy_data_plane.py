"""Which data plane for ``smetric serve``: added latency and maximum rate of candidate proxies.

Issue 11 asks to choose the proxy's data plane by measurement. This measures, in one run, on
loopback, in front of the same four ``smetric fake-engine`` instances (a speed-up so large that
the engines answer at once):

* ``direct`` — the client spreads requests over the engines itself (the baseline);
* ``tcp-relay`` — one ``socat`` byte relay per engine (Debian's ``socat``; skipped when absent),
  the client spreading over them as over the engines: one more loopback hop and one more
  process to wake, no HTTP at all. The floor under any proxy's added latency on this host;
* ``vllm-router`` — the compiled Rust gateway from PyPI (``pip install vllm-router``), policy
  ``round_robin`` (its cheapest);
* ``python-aiohttp`` — a minimal Python streaming proxy on aiohttp that does what smetric's proxy
  must do per request: parse the JSON body, route the prompt's token ids with the Rust core
  (``smetric.Router.route``, GIL released), forward the body, stream the answer back chunk by
  chunk, and report the lifecycle (``on_prefilled`` at the first chunk, ``on_finished``). It is
  the measuring instrument for "a Python data plane", not the product;
* ``python-protocol`` — the same minimal proxy without an HTTP framework
  (``benches/protocol_proxy.py``: uvloop protocols and httptools on both sides, kept-alive engine
  connections): the floor of a Python data plane, in the ``--apis`` rows only; and
  ``python-protocol+adapters``, the same with ``smetric serve``'s own per-request Python (the API
  adapter's parse, approximate routing tokens and prepare, the backend's ``decide``, the
  attempt's header and lifecycle, the stream scan) in place of the JSON parse and route;
* ``dataplane-probe`` — the same minimal proxy compiled (``benches/dataplane``: hyper on one
  tokio thread, the proxy's own Rust body parser, ``smetric_core::Router`` on a completions
  body's ids and on a chat body's plain-ChatML byte-chunk ids rendered in Rust; built with ``cargo
  build --release --manifest-path benches/dataplane/Cargo.toml``, given with
  ``--dataplane-probe``): what a data plane that is not Python would add on this host;
* ``smetric-serve`` — the product: ``smetric serve --tokens ids`` with its defaults (failover,
  metrics, decision header, engine-load scraping of the engines' ``/metrics``): the compiled
  gateway in front of the app, its one data plane (until 2026-12-05 the ``--apis`` rows also had
  the Python app alone, ``smetric-serve`` then, and the gateway as ``smetric-serve-compiled``).
  ``--only`` runs the named ``--apis`` candidates alone. Each ``--apis`` row of a proxy with one
  address also has its maximum rate on that API (``wrk``, a short streaming conversation of
  ``--max-rate-prompt-tokens`` in the API's shape), when ``wrk`` is installed.

After an unrecorded warm-up, for each: an open loop at ``--rate`` requests/s for ``--requests``
requests (32K-token prompts as token ids, ``max_tokens`` 16), streaming and not, recording each
request's time to its first byte and to its last; then a closed loop of ``--concurrency``
clients for ``--seconds`` (the maximum rate): ``wrk`` (compiled; Debian's ``wrk``) when it is
installed, else the Python client. Where ``taskset`` exists the engines run on CPU 0,
and the client and the proxy share CPU 1: the direct baseline's client is not starved by the
engines, and a proxy's added latency includes its contention with the client (an upper bound).
``--client-cpu 0`` puts the client with the engines instead, so the proxy has CPU 1 to itself
as a deployed proxy has its own cores (the other end of the bracket: the direct side's client
then shares a core with the engines, which both sides pay).

``--apis`` measures only the per-API rows (chat, Anthropic Messages, OpenAI Responses; 32K-token
conversations; ``smetric serve --tokens approximate``): direct and proxied requests are sent
interleaved in pairs, ``--rate`` a second on each side, so the machine's drift hits both and the
difference is the proxy's; the proxy's own CPU per request (``/proc``) is printed beside it. The
same pairs are run for ``python-aiohttp`` and ``python-protocol`` (round robin: they have no
renderer for these bodies),
``dataplane-probe`` (with ``--dataplane-probe``; chat routed, the others round robin), ``tcp-relay`` and
``vllm-router`` (with ``--vllm-router``), each in turn, so every proxy is read against the direct
requests sent beside its own.
``--apis --pd`` runs the same rows in PD mode: two prefill and two decode fake engines,
``smetric serve --prefill … --decode …`` on both planes and vllm-router's PD mode
(``--vllm-pd-disaggregation``, with ``--vllm-router``); the direct side speaks the
disaggregated-prefill protocol by hand (:func:`pd_by_hand`).
Bounded: loopback only, fixed counts and durations, every server stopped at the end.

    .venv/bin/python benches/proxy_data_plane.py --vllm-router /tmp/vr-venv/bin/vllm-router
    .venv/bin/python benches/proxy_data_plane.py --apis    # chat, Messages, Responses side by side, approximate tokens
    cargo build --release --manifest-path benches/dataplane/Cargo.toml
    .venv/bin/python benches/proxy_data_plane.py --apis \
        --dataplane-probe benches/dataplane/target/release/smetric-dataplane-probe \
        --vllm-router /tmp/vr-venv/bin/vllm-router
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts" / "vllm_cpu"))
from fleet import free_port  # noqa: E402  (the one loopback port picker: below the ephemeral range)

ENGINES = 4
MODEL = "fake-model"
"""The fake engine's default served model name."""


def pinned(cpu: int) -> list[str]:
    return ["taskset", "-c", str(cpu)] if shutil.which("taskset") else []


def start_engine(speedup: float, role: str = "both") -> tuple[subprocess.Popen[str], str]:
    cmd = [*pinned(0), sys.executable, "-m", "smetric", "fake-engine", "--port", "0", "--speedup", str(speedup)]
    cmd += ["--role", role]
    cmd += ["--max-num-seqs", "1024", "--num-gpu-blocks", "200000", "--max-model-len", "65536"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    match = re.search(r"http://[\d.]+:(\d+)", proc.stdout.readline())
    if not match:
        proc.kill()
        raise RuntimeError("the fake engine did not start")
    return proc, f"http://127.0.0.1:{match.group(1)}"


def start_engines(count: int, procs: list[subprocess.Popen[Any]], speedup: float = 1e6) -> list[str]:
    """``count`` fake engines (:func:`start_engine`), their processes added to ``procs``; their URLs."""
    urls = []
    for _ in range(count):
        proc, url = start_engine(speedup)
        procs.append(proc)
        urls.append(url)
    return urls


def wait_http(url: str, timeout: float = 30.0) -> None:
    async def probe() -> bool:
        try:
            async with aiohttp.ClientSession() as s, s.get(url, timeout=aiohttp.ClientTimeout(total=1)) as r:
                return r.status < 500
        except (aiohttp.ClientError, TimeoutError):
            return False

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if asyncio.run(probe()):
            return
        time.sleep(0.2)
    raise RuntimeError(f"{url} did not come up")


def stop(procs: Sequence[subprocess.Popen[Any]], timeout: float = 10.0) -> None:
    """SIGTERM to every process, then wait for each (``timeout`` seconds) and kill what is left."""
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# --- the Python candidate ------------------------------------------------------------------------


@dataclass(frozen=True)
class Candidate:
    """A proxy of the per-API rows: its URLs (the client takes them in turn) and the process
    whose CPU is its own (``None``: not measured, e.g. a relay that forks per connection)."""

    name: str
    urls: list[str]
    proc: subprocess.Popen[Any] | None


def python_proxy_main(port: int, engines: Sequence[str]) -> None:
    """The ``python-aiohttp`` candidate (run in its own process, on uvloop as ``smetric serve``
    is): any ``POST`` path; the body parsed with :func:`json.loads`; a body with token ids
    (``prompt``) routed on them, any other (chat, Messages, Responses: no tokens without a
    renderer) sent to the engines in turn — the HTTP stack and the JSON parse of a Python data
    plane, without a gateway's features."""
    import uvloop

    from smetric import Router

    router = Router(list(engines), policy="smetric")
    turn = itertools.cycle(engines)
    session: aiohttp.ClientSession | None = None

    async def on_startup(_: web.Application) -> None:
        nonlocal session
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))

    async def forward(request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        body = json.loads(raw)
        prompt = body.get("prompt")
        decision = router.route(prompt) if isinstance(prompt, list) else None
        instance = decision.instance if decision is not None else next(turn)
        assert session is not None
        async with session.post(
            f"{instance}{request.path}", data=raw, headers={"content-type": "application/json"}
        ) as up:
            if not body.get("stream"):
                data = await up.read()
                if decision is not None:
                    router.on_finished(decision.request_id)
                return web.Response(body=data, status=up.status, content_type="application/json")
            out = web.StreamResponse(status=up.status, headers={"content-type": "text/event-stream"})
            await out.prepare(request)
            first = True
            async for chunk in up.content.iter_any():
                if first and decision is not None:
                    router.on_prefilled(decision.request_id)
                first = False
                await out.write(chunk)
            if decision is not None:
                router.on_finished(decision.request_id)
            await out.write_eof()
            return out

    async def on_cleanup(_: web.Application) -> None:
        if session is not None:
            await session.close()

    app = web.Application(client_max_size=64 << 20)
    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    app.router.add_post("/{path:.*}", forward)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None, loop=uvloop.new_event_loop())


def launch(
    name: str,
    cmd: Sequence[str],
    procs: list[subprocess.Popen[Any]],
    port: int,
    *,
    ready: str = "/",
    quiet: bool = False,
) -> Candidate:
    """Starts a candidate proxy (``cmd``, listening on ``port``) pinned to CPU 1, waits until
    ``ready`` answers, and returns it; ``quiet`` drops its output."""
    out = subprocess.DEVNULL if quiet else None
    proc = subprocess.Popen([*pinned(1), *cmd], stdout=out, stderr=out)
    procs.append(proc)
    wait_http(f"http://127.0.0.1:{port}{ready}")
    return Candidate(name, [f"http://127.0.0.1:{port}"], proc)


def start_smetric_serve(
    engines: Sequence[str],
    procs: list[subprocess.Popen[Any]],
    tokenizer: str | None = None,
    pd: tuple[Sequence[str], Sequence[str]] | None = None,
    extra: Sequence[str] = (),
) -> Candidate:
    """``smetric serve --tokens approximate`` (with ``tokenizer``: ``--tokens tokenizer`` on that
    ``tokenizer.json``): the compiled gateway in front of the app, its one data plane; with
    ``pd``, over those prefill and decode instances; ``extra``: more flags."""
    port = free_port()
    tokens = ["--tokens", "approximate"] if tokenizer is None else ["--tokens", "tokenizer", "--tokenizer", tokenizer]
    cmd = [sys.executable, "-m", "smetric", "serve", "--port", str(port), *tokens]
    cmd += ["--kv-events", "off", "--log-level", "WARNING", *extra]
    if pd is not None:
        for flag, pool in zip(("--prefill", "--decode"), pd, strict=True):
            for url in pool:
                cmd += [flag, url]
    for url in engines if pd is None else ():
        cmd += ["--instance", url]
    return launch("smetric-serve", cmd, procs, port, ready="/health")


def start_protocol_proxy(
    engines: Sequence[str], procs: list[subprocess.Popen[Any]], *, adapters: bool = False
) -> Candidate:
    """``benches/protocol_proxy.py`` (the framework-free Python candidate; ``adapters``: with
    ``smetric serve``'s per-request Python)."""
    port = free_port()
    script = str(Path(__file__).with_name("protocol_proxy.py"))
    cmd = [sys.executable, script, *(["--adapters"] if adapters else []), str(port), *engines]
    return launch("python-protocol+adapters" if adapters else "python-protocol", cmd, procs, port)


def start_python_proxy(engines: Sequence[str], procs: list[subprocess.Popen[Any]]) -> Candidate:
    """:func:`python_proxy_main` in its own process."""
    port = free_port()
    here = str(Path(__file__).resolve().parent)
    code = f"import sys; sys.path.insert(0, {here!r}); import proxy_data_plane as m; "
    code += f"m.python_proxy_main({port}, {list(engines)!r})"
    return launch("python-aiohttp", [sys.executable, "-c", code], procs, port)


# --- the load ------------------------------------------------------------------------------------


async def one(
    session: aiohttp.ClientSession, url: str, body: bytes, stream: bool, start: float | None = None
) -> tuple[float, float]:
    """One request: its time to the first byte and to the last, from ``start`` (default: now)."""
    start = time.perf_counter() if start is None else start
    first = None
    async with session.post(url, data=body, headers={"content-type": "application/json"}) as resp:
        if stream:
            async for _ in resp.content.iter_any():
                if first is None:
                    first = time.perf_counter()
        else:
            await resp.read()
        resp.raise_for_status()
    end = time.perf_counter()
    return (first or end) - start, end - start


async def open_loop(
    urls: Sequence[str], body: bytes | Sequence[bytes], stream: bool, rate: float, n: int, path: str = "/v1/completions"
) -> list[tuple[float, float]]:
    """``n`` requests at ``rate``/s; ``body`` is one body, or one per request (cycled)."""
    targets = itertools.cycle(urls)
    bodies = itertools.cycle([body] if isinstance(body, bytes) else body)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        t0 = time.perf_counter()
        tasks = []
        for i in range(n):
            delay = t0 + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(session, f"{next(targets)}{path}", next(bodies), stream)))
        return await asyncio.gather(*tasks)


async def closed_loop(urls: Sequence[str], body: bytes, concurrency: int, seconds: float) -> float:
    targets = itertools.cycle(urls)
    done = 0
    stop = time.perf_counter() + seconds
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def worker() -> None:
            nonlocal done
            while time.perf_counter() < stop:
                await one(session, f"{next(targets)}/v1/completions", body, True)
                done += 1

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return done / (time.perf_counter() - start)


WRK_SCRIPT = """
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local f = io.open(os.getenv("SMETRIC_WRK_BODY"), "rb")
wrk.body = f:read("*a")
f:close()
"""


def wrk_rate(url: str, body: bytes, concurrency: int, seconds: float) -> float:
    """Requests/s of ``wrk`` (one thread, pinned with the engines on CPU 0) against ``url``."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        script, data = os.path.join(d, "post.lua"), os.path.join(d, "body.json")
        with open(script, "w") as f:
            f.write(WRK_SCRIPT)
        with open(data, "wb") as f:
            f.write(body)
        cmd = [*pinned(0), "wrk", "-t1", f"-c{concurrency}", f"-d{seconds:g}s", "-s", script, url]
        out = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "SMETRIC_WRK_BODY": data})
    match = re.search(r"Requests/sec:\s+([\d.]+)", out.stdout)
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)|Socket errors:", out.stdout)
    if not match or errors:
        raise RuntimeError(f"wrk failed: {out.stdout}{out.stderr}")
    return float(match.group(1))


def chat_bodies(n: int, history_tokens: int, stream: bool) -> list[bytes]:
    """``n`` chat requests of one agent session's next turn: the same history of about
    ``history_tokens`` tokens (the repository's docs as text) and a distinct short user message
    each, as a session's follow-ups are (a proxy's tokenizer cache holds the history, the new
    message is new work)."""
    text = "\n\n".join(p.read_text(encoding="utf-8") for p in sorted((ROOT / "docs").glob("*.md")))
    chars = int(history_tokens * 2.9)  # the test tokenizer's characters per token on these docs
    text = (text * (1 + chars // max(1, len(text))))[:chars]
    step = 4000
    history: list[dict[str, Any]] = [{"role": "system", "content": text[:6000]}]
    for i, start in enumerate(range(6000, len(text), step)):
        history.append({"role": "user" if i % 2 == 0 else "assistant", "content": text[start : start + step]})
    if history[-1]["role"] == "user":
        history.append({"role": "assistant", "content": "Done."})
    return [
        json.dumps(
            {
                "model": MODEL,
                "messages": [*history, {"role": "user", "content": f"Request {i}: now run the tests for step {i}."}],
                "max_tokens": 16,
                "stream": stream,
            }
        ).encode()
        for i in range(n)
    ]


def messages_bodies(chats: list[bytes]) -> list[bytes]:
    """The chat bodies as Anthropic Messages bodies (``POST /v1/messages``): the system message
    as ``system``, the rest as text messages, ``max_tokens`` kept."""
    out = []
    for raw in chats:
        chat = json.loads(raw)
        system, *rest = chat["messages"]
        body = {"model": MODEL, "system": system["content"], "messages": rest, "max_tokens": chat["max_tokens"]}
        out.append(json.dumps({**body, "stream": chat["stream"]}).encode())
    return out


def responses_bodies(chats: list[bytes]) -> list[bytes]:
    """The chat bodies as OpenAI Responses bodies (``POST /v1/responses``): the system message
    as ``instructions``, the rest as message items (``input_text`` / ``output_text`` parts),
    ``max_tokens`` as ``max_output_tokens``, nothing stored."""
    out = []
    for raw in chats:
        chat = json.loads(raw)
        system, *rest = chat["messages"]
        items = [
            {
                "type": "message",
                "role": m["role"],
                "content": [{"type": "input_text" if m["role"] == "user" else "output_text", "text": m["content"]}],
            }
            for m in rest
        ]
        body = {"model": MODEL, "instructions": system["content"], "input": items, "store": False}
        out.append(json.dumps({**body, "max_output_tokens": chat["max_tokens"], "stream": chat["stream"]}).encode())
    return out


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1] * 1e3 if len(values) > 1 else 0.0


def put_percentiles(row: dict[str, Any], kind: str, res: Sequence[tuple[float, float]]) -> None:
    """``row``'s p50 and p99 (ms) of ``res``'s (first byte, last byte) times, keys prefixed ``kind``."""
    ttfb, total = [r[0] for r in res], [r[1] for r in res]
    row[f"{kind}_ttfb_p50_ms"], row[f"{kind}_ttfb_p99_ms"] = pct(ttfb, 50), pct(ttfb, 99)
    row[f"{kind}_p50_ms"], row[f"{kind}_p99_ms"] = pct(total, 50), pct(total, 99)


def measure(
    name: str,
    urls: Sequence[str],
    args: argparse.Namespace,
    bodies: dict[bool, Any],
    short: bytes | None,
    path: str = "/v1/completions",
) -> dict[str, Any]:
    row: dict[str, Any] = {"target": name}
    for stream in (False, True):
        res = asyncio.run(open_loop(urls, bodies[stream], stream, args.rate, args.requests, path))
        put_percentiles(row, "stream" if stream else "plain", res)
    if short is None:
        row["max_rate"], row["max_rate_by"] = float("nan"), "-"
    elif shutil.which("wrk") and len(urls) == 1:
        row["max_rate"] = wrk_rate(f"{urls[0]}/v1/completions", short, args.concurrency, args.seconds)
        row["max_rate_by"] = "wrk"
    else:
        row["max_rate"] = asyncio.run(closed_loop(urls, short, args.concurrency, args.seconds))
        row["max_rate_by"] = "python"
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--vllm-router", help="the vllm-router executable (skipped when absent)")
    p.add_argument(
        "--dataplane-probe",
        help="the compiled probe's executable, benches/dataplane/target/release/smetric-dataplane-probe (none: no row)",
    )
    p.add_argument("--rate", type=float, default=200.0)
    p.add_argument("--requests", type=int, default=1000)
    p.add_argument("--prompt-tokens", type=int, default=32_768)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument(
        "--max-rate-prompt-tokens",
        type=int,
        default=256,
        help="prompt of the closed loop (short, so the engines and the client are not what limits it)",
    )
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument(
        "--client-cpu",
        type=int,
        choices=(0, 1),
        default=1,
        help="where the load generator runs: 1 with the proxies (their added latency includes contention "
        "with it: an upper bound), 0 with the engines (the proxy has a core to itself)",
    )
    p.add_argument("--speedup", type=float, default=1e6)
    p.add_argument("--out", help="write the rows as JSON here")
    p.add_argument(
        "--tokenizer",
        default=str(ROOT / "tests" / "data" / "serve" / "tokenizer.json"),
        help="chat rows: smetric serve routes on this tokenizer.json (empty: no chat rows)",
    )
    p.add_argument(
        "--apis",
        action="store_true",
        help="only the per-API rows: chat, Anthropic Messages and OpenAI Responses, direct and through "
        "smetric serve with approximate tokens (the engines' own tokenizer), side by side",
    )
    p.add_argument(
        "--apis-tokens",
        choices=("approximate", "tokenizer"),
        default="approximate",
        help="--apis: smetric serve's routing tokens (tokenizer: --tokenizer's ids; a session's history is "
        "in the piece cache after the warm-up, each request's new message is new work)",
    )
    p.add_argument(
        "--pd",
        action="store_true",
        help="--apis in PD mode: two prefill and two decode fake engines; the direct side speaks the "
        "disaggregated-prefill protocol by hand; smetric serve --prefill/--decode",
    )
    p.add_argument(
        "--only",
        help="--apis: these candidates only, comma-separated (smetric-serve, python-aiohttp, "
        "python-protocol, python-protocol+adapters, dataplane-probe, tcp-relay, vllm-router)",
    )
    args = p.parse_args()
    prompt = list(range(1000, 1000 + args.prompt_tokens))
    bodies = {
        s: json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": 16, "stream": s}).encode() for s in (False, True)
    }
    short = json.dumps(
        {"model": MODEL, "prompt": list(range(7, 7 + args.max_rate_prompt_tokens)), "max_tokens": 16, "stream": True}
    ).encode()
    procs: list[subprocess.Popen[Any]] = []
    try:
        engines = []
        roles = ["prefill"] * (ENGINES // 2) + ["decode"] * (ENGINES - ENGINES // 2) if args.pd else ["both"] * ENGINES
        for role in roles:
            proc, url = start_engine(args.speedup, role)
            procs.append(proc)
            engines.append(url)
        if shutil.which("taskset"):
            cpu = str(args.client_cpu)
            subprocess.run(["taskset", "-p", "-c", cpu, str(os.getpid())], check=False, capture_output=True)
        # Warm-up, not recorded: the engines' first requests fill their prefix caches and allocate.
        for stream in (False, True) if not args.pd else ():
            asyncio.run(open_loop(engines, bodies[stream], stream, args.rate, min(args.requests, 400)))
        if args.apis or args.pd:
            report(args, api_rows(args, engines, procs))
            return
        rows = [measure("direct", engines, args, bodies, short)]
        if shutil.which("socat"):
            rows.append(measure("tcp-relay", start_relays(engines, procs), args, bodies, short))
        router_url: str | None = None
        if args.vllm_router and shutil.which(args.vllm_router):
            router_url = start_vllm_router(args.vllm_router, engines, procs).urls[0]
            rows.append(measure("vllm-router", [router_url], args, bodies, short))
        rows.append(measure("python-aiohttp", start_python_proxy(engines, procs).urls, args, bodies, short))
        if args.dataplane_probe:
            rows.append(
                measure("dataplane-probe", start_probe(args.dataplane_probe, engines, procs).urls, args, bodies, short)
            )
        port = free_port()
        cmd = [*pinned(1), sys.executable, "-m", "smetric", "serve", "--port", str(port), "--tokens", "ids"]
        cmd += ["--kv-events", "off", "--log-level", "WARNING"]
        for url in engines:
            cmd += ["--instance", url]
        procs.append(subprocess.Popen(cmd))
        wait_http(f"http://127.0.0.1:{port}/health")
        rows.append(measure("smetric-serve", [f"http://127.0.0.1:{port}"], args, bodies, short))
        if args.tokenizer:
            # Chat rows: the same engines (their own cheap tokenizer), 32K-token conversations; the
            # proxy routes on the local tokenizer's ids, a follow-up's new message being new work.
            chats = {st: chat_bodies(args.requests, args.prompt_tokens, st) for st in (False, True)}
            chat_path = "/v1/chat/completions"
            rows.append(measure("direct chat", engines, args, chats, None, chat_path))
            if router_url is not None:
                rows.append(measure("vllm-router chat", [router_url], args, chats, None, chat_path))
            port = free_port()
            cmd = [*pinned(1), sys.executable, "-m", "smetric", "serve", "--port", str(port), "--tokens", "tokenizer"]
            cmd += ["--tokenizer", args.tokenizer, "--kv-events", "off", "--log-level", "WARNING"]
            for url in engines:
                cmd += ["--instance", url]
            procs.append(subprocess.Popen(cmd))
            wait_http(f"http://127.0.0.1:{port}/health")
            serve_url = f"http://127.0.0.1:{port}"
            # Warm-up, not recorded: the first request of the session tokenizes its whole history.
            asyncio.run(open_loop([serve_url], chats[False][:20], False, 20.0, 20, chat_path))
            rows.append(measure("smetric-serve chat (tokenizer)", [serve_url], args, chats, None, chat_path))
    finally:
        stop(procs)
    report(args, rows)


DirectCall = Callable[[aiohttp.ClientSession, bytes, bool], Awaitable[tuple[float, float]]]


async def interleaved(
    direct: Sequence[str],
    proxy: Sequence[str],
    bodies: Sequence[bytes],
    stream: bool,
    rate: float,
    n: int,
    path: str,
    direct_call: DirectCall | None = None,
) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    """``n`` requests straight to the engines and ``n`` through ``proxy`` (its URLs in turn), in
    pairs (the same body; which side goes first alternates), ``rate`` requests/s on each side:
    drift in the machine's load hits both sides alike, so their difference is the proxy's.
    ``direct_call`` makes the direct side's request instead (PD: both legs by hand)."""
    engines, proxies = itertools.cycle(direct), itertools.cycle(proxy)
    sides: tuple[list[asyncio.Task[tuple[float, float]]], list[asyncio.Task[tuple[float, float]]]] = ([], [])
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        t0 = time.perf_counter()
        for i in range(2 * n):
            delay = t0 + i / (2 * rate) - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            pair, second = divmod(i, 2)
            via_proxy = bool(second) != bool(pair % 2)
            body = bodies[pair % len(bodies)]
            if direct_call is not None and not via_proxy:
                sides[0].append(asyncio.create_task(direct_call(session, body, stream)))
                continue
            url = next(proxies) if via_proxy else next(engines)
            sides[via_proxy].append(asyncio.create_task(one(session, f"{url}{path}", body, stream)))
        return list(await asyncio.gather(*sides[0])), list(await asyncio.gather(*sides[1]))


def cpu_seconds(pid: int) -> tuple[float, float, int]:
    """User and system CPU time of a process, every thread's, and its minor page faults (Linux
    ``/proc``)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick, int(fields[7])


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (:func:`cpu_seconds`)."""
    user, system, _ = cpu_seconds(pid)
    return user + system


def start_relays(engines: Sequence[str], procs: list[subprocess.Popen[Any]]) -> list[str]:
    """One ``socat`` byte relay per engine (the host's floor for one more hop); their URLs."""
    relays = []
    for url in engines:
        port = free_port()
        cmd = [
            *pinned(1),
            "socat",
            f"TCP-LISTEN:{port},bind=127.0.0.1,reuseaddr,fork",
            f"TCP:{url.removeprefix('http://')}",
        ]
        procs.append(subprocess.Popen(cmd))
        relays.append(f"http://127.0.0.1:{port}")
    for relay in relays:
        wait_http(f"{relay}/health")
    return relays


def pd_by_hand(prefill: Sequence[str], decode: Sequence[str], path: str, bodies: Sequence[bytes]) -> DirectCall:
    """The direct side of a PD row: the client speaks vLLM's disaggregated-prefill protocol
    itself (the prefill leg whole, then the decode leg with the prefill's ``kv_transfer_params``),
    over the pools in turn. The prefill bodies are rendered before the run, and the decode body
    is the client's with the params spliced in, so the client's own JSON work is not counted."""
    from smetric.serve.apis.responses import PREFILL_OVERRIDES
    from smetric.serve.backends.pd import prefill_body

    overrides = PREFILL_OVERRIDES if path == "/v1/responses" else None
    prefills = {body: prefill_body(json.loads(body), overrides) for body in bodies}
    prefill_urls, decode_urls = itertools.cycle(prefill), itertools.cycle(decode)
    headers = {"content-type": "application/json"}

    async def call(session: aiohttp.ClientSession, body: bytes, stream: bool) -> tuple[float, float]:
        start = time.perf_counter()
        async with session.post(f"{next(prefill_urls)}{path}", data=prefills[body], headers=headers) as resp:
            answer = await resp.read()
            resp.raise_for_status()
        params = json.dumps(json.loads(answer)["kv_transfer_params"]).encode()
        decode_body = body.rstrip()[:-1] + b', "kv_transfer_params": ' + params + b"}"
        return await one(session, f"{next(decode_urls)}{path}", decode_body, stream, start)

    return call


def start_vllm_router(executable: str, engines: Sequence[str], procs: list[subprocess.Popen[Any]]) -> Candidate:
    """vllm-router (``round_robin``, its cheapest policy) in front of ``engines``."""
    port = free_port()
    cmd = [executable, "--host", "127.0.0.1", "--port", str(port), "--policy", "round_robin"]
    cmd += ["--worker-urls", *engines, "--max-payload-size", str(64 << 20), "--log-level", "error"]
    return launch("vllm-router", cmd, procs, port, ready="/health", quiet=True)


def start_vllm_router_pd(
    executable: str, prefill: Sequence[str], decode: Sequence[str], procs: list[subprocess.Popen[Any]]
) -> Candidate:
    """vllm-router in its vLLM PD mode (``--vllm-pd-disaggregation``, ``round_robin`` on both
    pools) in front of the prefill and decode engines."""
    port = free_port()
    cmd = [executable, "--host", "127.0.0.1", "--port", str(port), "--vllm-pd-disaggregation"]
    cmd += ["--policy", "round_robin", "--max-payload-size", str(64 << 20), "--log-level", "error"]
    for url in prefill:
        cmd += ["--prefill", url]
    for url in decode:
        cmd += ["--decode", url]
    return launch("vllm-router", cmd, procs, port, ready="/health", quiet=True)


def start_probe(executable: str, engines: Sequence[str], procs: list[subprocess.Popen[Any]]) -> Candidate:
    """The compiled probe (``benches/dataplane``) in front of ``engines``."""
    port = free_port()
    return launch("dataplane-probe", [executable, str(port), *engines], procs, port, quiet=True)


def api_rows(args: argparse.Namespace, engines: list[str], procs: list[subprocess.Popen[Any]]) -> list[dict[str, Any]]:
    """Chat, Messages and Responses, 32K-token conversations, direct and through ``smetric serve
    --tokens approximate`` (no BPE: the added latency of each API's adapter, beside the others';
    ``--apis-tokens tokenizer``: on the test tokenizer's ids, its piece cache warm with the history),
    the two sides interleaved (:func:`interleaved`); the proxy's CPU per request beside them.
    With ``socat`` installed, and with ``--vllm-router``, the same for a byte relay (the host's
    floor for one more hop) and for the compiled peer, on every API they forward."""
    tokenizer = args.tokenizer if args.apis_tokens == "tokenizer" else None
    # --pd: the first half of the engines prefill, the second half decode.
    pools = (engines[: len(engines) // 2], engines[len(engines) // 2 :]) if args.pd else None
    starters: dict[str, Callable[[], Candidate | None]] = {
        "smetric-serve": lambda: start_smetric_serve(engines, procs, tokenizer, pools),
        "python-aiohttp": lambda: start_python_proxy(engines, procs),
        "python-protocol": lambda: start_protocol_proxy(engines, procs),
        "python-protocol+adapters": lambda: start_protocol_proxy(engines, procs, adapters=True),
        "dataplane-probe": lambda: start_probe(args.dataplane_probe, engines, procs) if args.dataplane_probe else None,
        "tcp-relay": lambda: (
            Candidate("tcp-relay", start_relays(engines, procs), None) if shutil.which("socat") else None
        ),
        "vllm-router": lambda: (
            (
                start_vllm_router_pd(args.vllm_router, *pools, procs)
                if pools
                else start_vllm_router(args.vllm_router, engines, procs)
            )
            if args.vllm_router and shutil.which(args.vllm_router)
            else None
        ),
    }
    default = ["smetric-serve", "vllm-router"] if pools else list(starters)
    chosen = args.only.split(",") if args.only else default
    unknown = set(chosen) - set(starters)
    if unknown:
        raise SystemExit(f"--only: unknown candidates {sorted(unknown)}; known: {', '.join(starters)}")
    candidates = [c for c in (starters[name]() for name in chosen) if c is not None]
    smetric_procs = {c.proc for c in candidates if c.name.startswith("smetric-serve")}
    chats = {st: chat_bodies(args.requests, args.prompt_tokens, st) for st in (False, True)}
    apis = {"chat": ("/v1/chat/completions", chats)}
    apis["messages"] = ("/v1/messages", {st: messages_bodies(chats[st]) for st in (False, True)})
    apis["responses"] = ("/v1/responses", {st: responses_bodies(chats[st]) for st in (False, True)})
    # The maximum rate's bodies: each API's shape of a short streaming conversation (as the
    # default mode's 256-token prompts), so the rate is the proxy's per-request work, not bytes.
    short_chat = chat_bodies(1, args.max_rate_prompt_tokens, True)
    short = {
        "chat": short_chat[0],
        "messages": messages_bodies(short_chat)[0],
        "responses": responses_bodies(short_chat)[0],
    }
    rows = []
    for name, (path, bodies) in apis.items():
        for candidate in candidates:
            by_hand = {st: pd_by_hand(*pools, path, bodies[st]) for st in (False, True)} if pools else None
            try:  # warm-up, not recorded: the engines' caches, the proxy's index
                for url in candidate.urls if pools else [*engines, *candidate.urls]:
                    asyncio.run(open_loop([url], bodies[False][:20], False, 50.0, 20, path))
            except aiohttp.ClientResponseError as e:
                print(f"{candidate.name} does not serve {path} ({e.status}): no row")
                continue
            mode = f"{args.apis_tokens}, PD" if pools else args.apis_tokens
            label = f"{candidate.name} {name}" + (f" ({mode})" if candidate.proc in smetric_procs else "")
            direct: dict[str, Any] = {"target": f"direct {name}", "max_rate": float("nan"), "max_rate_by": "-"}
            served: dict[str, Any] = {**direct, "target": label}
            cpu = 0.0
            for stream in (False, True):
                before = process_cpu_s(candidate.proc.pid) if candidate.proc else 0.0
                direct_call = by_hand[stream] if by_hand else None
                sides = asyncio.run(
                    interleaved(
                        engines, candidate.urls, bodies[stream], stream, args.rate, args.requests, path, direct_call
                    )
                )
                cpu += (process_cpu_s(candidate.proc.pid) - before) if candidate.proc else 0.0
                for row, res in zip((direct, served), sides, strict=True):
                    put_percentiles(row, "stream" if stream else "plain", res)
            if candidate.proc is not None:
                served["cpu_us_per_req"] = cpu / (2 * args.requests) * 1e6
            if shutil.which("wrk") and len(candidate.urls) == 1:
                served["max_rate"] = wrk_rate(candidate.urls[0] + path, short[name], args.concurrency, args.seconds)
                served["max_rate_by"] = "wrk"
            rows += [direct, served]
    return rows


def report(args: argparse.Namespace, rows: list[dict[str, Any]]) -> None:
    print(f"{args.requests} requests at {args.rate:g}/s, {args.prompt_tokens}-token prompts (ms; added = minus direct)")
    by = sorted({r["max_rate_by"] for r in rows if not r["target"].startswith("direct")} - {"-"}) or ["-"]
    print(
        f"max req/s: a closed loop of {args.concurrency} streaming clients ({', '.join(by)} for proxies),"
        f" {args.max_rate_prompt_tokens}-token prompts"
    )
    print(f"{'target':<38} {'plain p50':>10} {'p99':>8} {'stream ttfb p50':>16} {'p99':>8} {'max req/s':>10}")
    base = rows[0]
    for r in rows:
        added = ""
        if r["target"].startswith("direct"):
            base = r  # the chat rows' baseline is direct chat
        else:
            d = {
                k: r[k] - base[k] for k in ("plain_p50_ms", "plain_p99_ms", "stream_ttfb_p50_ms", "stream_ttfb_p99_ms")
            }
            added = (
                f"  added: plain {d['plain_p50_ms']:+.2f}/{d['plain_p99_ms']:+.2f},"
                f" stream ttfb {d['stream_ttfb_p50_ms']:+.2f}/{d['stream_ttfb_p99_ms']:+.2f}"
            )
            if "cpu_us_per_req" in r:
                added += f"; proxy CPU {r['cpu_us_per_req']:.0f} µs/request"
        print(
            f"{r['target']:<38} {r['plain_p50_ms']:>10.2f} {r['plain_p99_ms']:>8.2f} "
            f"{r['stream_ttfb_p50_ms']:>16.2f} {r['stream_ttfb_p99_ms']:>8.2f} {r['max_rate']:>10.0f}{added}"
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
