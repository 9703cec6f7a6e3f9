"""A/B of two source trees of ``smetric serve`` on the same fake engines: did a change to the
proxy add latency or CPU?

Four ``smetric fake-engine`` instances (CPU 0 where ``taskset`` exists) serve every round; each
round starts the ``before`` proxy and the ``after`` proxy in turn (``PYTHONPATH`` set to each
tree's ``python/`` directory, the order alternating between rounds so drift hits both alike),
``smetric serve --tokens ids`` with the rows of :mod:`proxy_data_plane` (32K-token id prompts,
``max_tokens`` 16). Per proxy and round:

* **CPU per request**: the proxy process's user + system CPU time over a fixed open loop of
  ``--cpu-requests`` requests, plain then streamed (read from ``/proc/PID/stat``; the engine-load
  scraper is off, so this is the data plane's own work), and its minor page faults per request.
  Less sensitive to other tenants of the machine than latency is, but they still move it by
  ±30 %: for a repeatable count, :mod:`proxy_instructions` (callgrind);
* **latency** (unless ``--cpu-only``): :func:`proxy_data_plane.measure` — p50/p99 of the plain
  answer and of a stream's first byte at ``--rate``, and a closed loop's maximum rate.

The medians over rounds of each figure are printed for both trees, with their ratio
(after / before). Bounded: loopback only, fixed counts, every process stopped at the end.

An old tree needs the extension built from its own Rust (the Python and the bindings change
together): build BASE's wheel and put its ``_core.abi3.so`` in BASE's ``python/smetric/``, then

    git worktree add /tmp/base BASE && (cd /tmp/base && maturin build --release -o /tmp/base-wheel)
    unzip -j /tmp/base-wheel/*.whl 'smetric/_core.abi3.so' -d /tmp/base/python/smetric/
    .venv/bin/python benches/proxy_ab.py --before /tmp/base/python --after python --rounds 6

Each side runs on this interpreter (its packages: aiohttp, uvloop) unless ``--before-python`` /
``--after-python`` name another.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import proxy_data_plane as bench

LATENCY_KEYS = ("plain_p50_ms", "plain_p99_ms", "stream_ttfb_p50_ms", "stream_ttfb_p99_ms", "max_rate")


def start_proxy(tree: str, python: str, engines: list[str]) -> tuple[subprocess.Popen[bytes], str]:
    """``tree``'s ``smetric serve --tokens ids`` (CPU 1, no engine-load scraping, no KV events)
    in front of ``engines``, once it answers ``/health``: the process and its URL."""
    port = bench.free_port()
    cmd = [*bench.pinned(1), python, "-m", "smetric", "serve", "--port", str(port), "--tokens", "ids"]
    cmd += ["--kv-events", "off", "--log-level", "WARNING", "--no-engine-load"]
    for url in engines:
        cmd += ["--instance", url]
    proc = subprocess.Popen(cmd, env={**os.environ, "PYTHONPATH": str(Path(tree).resolve())})
    url = f"http://127.0.0.1:{port}"
    try:
        bench.wait_http(f"{url}/health")
    except BaseException:
        proc.kill()
        raise
    return proc, url


def one_proxy(
    tree: str, python: str, engines: list[str], args: argparse.Namespace, bodies: dict[bool, bytes], short: bytes
) -> dict[str, Any]:
    proc, url = start_proxy(tree, python, engines)
    try:
        asyncio.run(bench.open_loop([url], bodies[True], True, args.rate, 40))  # warm-up
        before = bench.cpu_seconds(proc.pid)
        for stream in (False, True):
            asyncio.run(bench.open_loop([url], bodies[stream], stream, args.cpu_rate, args.cpu_requests))
        after = bench.cpu_seconds(proc.pid)
        user, system, faults = ((a - b) / (2 * args.cpu_requests) for a, b in zip(after, before, strict=True))
        row: dict[str, Any] = {
            "cpu_us_per_req": (user + system) * 1e6,
            "cpu_user_us": user * 1e6,
            "cpu_sys_us": system * 1e6,
            "minflt_per_req": faults,
        }
        if not args.cpu_only:
            row |= bench.measure("proxy", [url], args, bodies, short)
        return row
    finally:
        bench.stop([proc], timeout=30)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--before", required=True, help="the python/ directory of the baseline tree")
    p.add_argument("--after", required=True, help="the python/ directory of the changed tree")
    p.add_argument("--before-python", default=sys.executable, help="the baseline proxy's interpreter (default: this)")
    p.add_argument("--after-python", default=sys.executable, help="the changed proxy's interpreter (default: this)")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--rate", type=float, default=20.0, help="latency rows: requests/s")
    p.add_argument("--requests", type=int, default=200, help="latency rows: requests per row")
    p.add_argument("--cpu-rate", type=float, default=80.0)
    p.add_argument("--cpu-requests", type=int, default=400, help="per kind (plain, streamed)")
    p.add_argument("--cpu-only", action="store_true", help="skip the latency rows")
    p.add_argument("--prompt-tokens", type=int, default=32_768)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--out", help="write every row as JSON here")
    args = p.parse_args()
    args.max_rate_prompt_tokens = 256
    prompt = list(range(1000, 1000 + args.prompt_tokens))
    bodies = {
        s: json.dumps({"model": bench.MODEL, "prompt": prompt, "max_tokens": 16, "stream": s}).encode()
        for s in (False, True)
    }
    short = json.dumps({"model": bench.MODEL, "prompt": list(range(7, 263)), "max_tokens": 16, "stream": True}).encode()
    trees = {"before": (args.before, args.before_python), "after": (args.after, args.after_python)}
    rows: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
    engines_procs: list[subprocess.Popen[str]] = []
    try:
        engines = bench.start_engines(bench.ENGINES, engines_procs)
        subprocess.run(["taskset", "-p", "-c", "1", str(os.getpid())], check=False, capture_output=True)
        for stream in (False, True):  # the engines' prefix caches fill here, unrecorded
            asyncio.run(bench.open_loop(engines, bodies[stream], stream, args.rate, 200))
        for r in range(args.rounds):
            order = ("before", "after") if r % 2 == 0 else ("after", "before")
            for name in order:
                row = one_proxy(*trees[name], engines, args, bodies, short)
                rows[name].append(row)
                print(json.dumps({"round": r, "tree": name, **row}), flush=True)
    finally:
        bench.stop(engines_procs)
    keys = ["cpu_us_per_req", "cpu_user_us", "cpu_sys_us", "minflt_per_req", *([] if args.cpu_only else LATENCY_KEYS)]
    print(
        f"medians of {args.rounds} rounds; {args.prompt_tokens}-token id prompts;"
        f" CPU: {2 * args.cpu_requests} requests per round; latency: {args.requests} per row at {args.rate:g}/s"
    )
    print(f"{'figure':<22} {'before':>10} {'after':>10} {'after/before':>13}")
    for key in keys:
        b, a = (statistics.median(r[key] for r in rows[n]) for n in ("before", "after"))
        print(f"{key:<22} {b:>10.2f} {a:>10.2f} {a / b if b else float('nan'):>13.3f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
