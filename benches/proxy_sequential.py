"""The proxy's own path time: requests sent one at a time (no queueing), direct and through
``smetric serve`` from two source trees, so a change's latency can be told from the host's.

One ``smetric fake-engine`` (CPU 0 where ``taskset`` exists, with this client); each proxy as
:func:`proxy_ab.start_proxy` starts it (CPU 1, ``--tokens ids``, no engine-load scraping, no KV
events). Per kind (plain: to the last
byte; streamed: to the first byte), ``--requests`` requests of a 32K-token id prompt, the two
trees alternating over ``--rounds`` rounds after 20 unrecorded warm-up requests each; printed:
the medians per round, direct and per tree. Bounded: loopback only, fixed counts, every process
stopped at the end. An old tree needs its own extension (see :mod:`proxy_ab`).

    .venv/bin/python benches/proxy_sequential.py --before /tmp/base/python --after python
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

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
import proxy_data_plane as bench
from proxy_ab import start_proxy


async def one_at_a_time(url: str, body: bytes, n: int, stream: bool) -> float:
    """The median (ms) of ``n`` requests, each sent when the previous one is done: to the first
    byte of a stream, to the last byte of a whole answer (:func:`proxy_data_plane.one`)."""
    async with aiohttp.ClientSession() as session:
        times = [await bench.one(session, url + "/v1/completions", body, stream) for _ in range(n)]
    return statistics.median(first if stream else last for first, last in times) * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--before", required=True, help="the python/ directory of the baseline tree")
    p.add_argument("--after", required=True, help="the python/ directory of the changed tree")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--requests", type=int, default=150)
    p.add_argument("--prompt-tokens", type=int, default=32_768)
    args = p.parse_args()
    trees = {"before": args.before, "after": args.after}
    engine_proc, engine = bench.start_engine(1e6)
    procs: list[subprocess.Popen[Any]] = []
    try:
        if bench.pinned(0):
            subprocess.run(["taskset", "-p", "-c", "0", str(os.getpid())], check=False, capture_output=True)
        prompt = list(range(1000, 1000 + args.prompt_tokens))
        for stream in (False, True):
            body = json.dumps({"model": bench.MODEL, "prompt": prompt, "max_tokens": 16, "stream": stream}).encode()
            direct = [asyncio.run(one_at_a_time(engine, body, args.requests, stream)) for _ in range(2)]
            out: dict[str, list[float]] = {name: [] for name in trees}
            for rnd in range(args.rounds):
                for name in trees if rnd % 2 == 0 else reversed(list(trees)):
                    proc, url = start_proxy(trees[name], sys.executable, [engine])
                    procs.append(proc)
                    asyncio.run(one_at_a_time(url, body, 20, stream))
                    out[name].append(asyncio.run(one_at_a_time(url, body, args.requests, stream)))
                    proc.kill()
                    proc.wait()
            kind = "stream first byte" if stream else "plain"
            print(f"{kind} p50 (ms): direct {[round(x, 2) for x in direct]}", end="")
            for name, medians in out.items():
                print(f"; {name} {[round(x, 2) for x in medians]}", end="")
            print()
    finally:
        bench.stop([engine_proc, *procs])


if __name__ == "__main__":
    main()
