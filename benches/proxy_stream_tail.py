"""The streamed first-byte tail of ``smetric serve`` with 32K-token id prompts, in repeated rounds.

``benches/proxy_data_plane.py`` measures each target once (1,000 requests per row), and its
"stream first byte p99" of ``smetric-serve`` with 32K ids was 6.5 ms in one clean run and
38–48 ms in two others. This isolates that row: four fake engines (CPU 0), one ``smetric serve
--tokens ids`` (CPU 1, with the client), a warm-up, then ``--rounds`` × (direct, proxy)
alternately, 1,000 streamed requests at 200/s each, printing p50 / p99 / p99.9 / max of the time
to the first byte, so a tail that belongs to the proxy shows in every round and one that belongs
to the machine does not. Bounded: loopback, fixed counts, every process stopped at the end.

    .venv/bin/python benches/proxy_stream_tail.py --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import proxy_data_plane as bench


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--requests", type=int, default=1000)
    p.add_argument("--rate", type=float, default=200.0)
    p.add_argument("--prompt-tokens", type=int, default=32_768)
    args = p.parse_args()
    procs: list[subprocess.Popen[Any]] = []
    try:
        engines = bench.start_engines(bench.ENGINES, procs)
        subprocess.run(["taskset", "-p", "-c", "1", str(os.getpid())], check=False, capture_output=True)
        port = bench.free_port()
        cmd = [*bench.pinned(1), sys.executable, "-m", "smetric", "serve", "--port", str(port), "--tokens", "ids"]
        cmd += ["--kv-events", "off", "--log-level", "WARNING"]
        for url in engines:
            cmd += ["--instance", url]
        procs.append(subprocess.Popen(cmd))
        proxy = f"http://127.0.0.1:{port}"
        bench.wait_http(f"{proxy}/health")
        prompt = list(range(1000, 1000 + args.prompt_tokens))
        body = json.dumps({"model": bench.MODEL, "prompt": prompt, "max_tokens": 16, "stream": True}).encode()
        for urls in (engines, [proxy]):  # warm-up, not recorded
            asyncio.run(bench.open_loop(urls, body, True, args.rate, 400))
        print("round target  p50    p99    p99.9  max   (ms, time to the first byte)")
        for rnd in range(args.rounds):
            for name, urls in (("direct", engines), ("proxy", [proxy])):
                res = asyncio.run(bench.open_loop(urls, body, True, args.rate, args.requests))
                t = sorted(r[0] * 1e3 for r in res)
                n = len(t)
                print(
                    f"{rnd:>5} {name:<7} {t[n // 2]:6.2f} {t[int(n * 0.99)]:6.2f} {t[int(n * 0.999)]:6.2f} "
                    f"{t[-1]:6.1f}",
                    flush=True,
                )
    finally:
        bench.stop(procs)


if __name__ == "__main__":
    main()
