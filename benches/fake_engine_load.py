"""Streaming request rate one fake engine sustains (the HTTP stack's figure, not a test).

Starts ``smetric fake-engine`` on 127.0.0.1 (pinned to CPU 0 when ``taskset`` exists) with a
speed-up so large that the performance model never waits, then runs a closed loop of
``--concurrency`` streaming ``/v1/completions`` clients (aiohttp, pinned to CPU 1) for
``--seconds`` and reports requests/s, SSE chunks/s and latency percentiles. Bounded: loopback
only, a fixed duration, and the server is stopped with SIGTERM at the end.

    .venv/bin/python benches/fake_engine_load.py --seconds 10 --concurrency 32 --max-tokens 16
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import aiohttp


async def client(url: str, body: dict[str, object], stop_at: float, lat: list[float], chunks: list[int]) -> None:
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < stop_at:
            start = time.monotonic()
            n = 0
            async with session.post(url, json=body) as resp:
                async for line in resp.content:
                    if line.startswith(b"data: "):
                        n += 1
            lat.append(time.monotonic() - start)
            chunks.append(n)


async def load(url: str, args: argparse.Namespace) -> None:
    body = {"prompt": list(range(args.prompt_tokens)), "max_tokens": args.max_tokens, "stream": True}
    lat: list[float] = []
    chunks: list[int] = []
    start = time.monotonic()
    stop_at = start + args.seconds
    await asyncio.gather(*(client(url, body, stop_at, lat, chunks) for _ in range(args.concurrency)))
    wall = time.monotonic() - start
    lat.sort()

    def pct(p: float) -> float:
        return lat[min(len(lat) - 1, int(p * len(lat)))] * 1e3

    print(
        f"{len(lat) / wall:.0f} streaming req/s, {sum(chunks) / wall:.0f} SSE events/s "
        f"(concurrency {args.concurrency}, {args.max_tokens} tokens, {args.prompt_tokens}-token prompts); "
        f"latency p50 {pct(0.5):.1f} ms, p99 {pct(0.99):.1f} ms over {len(lat)} requests"
    )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--prompt-tokens", type=int, default=256)
    p.add_argument("--speedup", type=float, default=1e6)
    args = p.parse_args()
    pin = ["taskset", "-c", "0"] if shutil.which("taskset") else []
    cmd = [*pin, sys.executable, "-m", "smetric", "fake-engine", "--port", "0", "--speedup", str(args.speedup)]
    server = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        match = re.search(r"http://[\d.]+:(\d+)", server.stdout.readline())
        assert match, "the fake engine did not start"
        if shutil.which("taskset"):
            subprocess.run(["taskset", "-p", "-c", "1", str(os.getpid())], check=False, capture_output=True)
        asyncio.run(load(f"http://127.0.0.1:{match.group(1)}/v1/completions", args))
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=10)


if __name__ == "__main__":
    main()
