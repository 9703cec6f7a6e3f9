"""Where ``smetric serve``'s CPU goes, per thread: the gateway's threads against the Python app's.

Two ``smetric fake-engine`` instances, ``smetric serve --tokens approximate`` in front (the one
data plane; ``--tokenizer``: ``--tokens tokenizer`` on that ``tokenizer.json``), a warm-up, then
``--requests`` 32K-token conversations of one API at ``--rate`` requests/s
(``benches/proxy_data_plane.py``'s bodies and open loop); each thread's CPU from
``/proc/<pid>/task/<tid>/schedstat`` (nanoseconds, not the 10 ms ticks of ``stat``) before and
after, summed by thread name (``smetric-gateway``: the compiled gateway; ``tokio-rt-worker``:
its blocking pool; ``python``: the app's event loop and its workers), per request;
``--vllm-router PATH`` measures vllm-router's threads in the same place. ``--idle S``
instead measures S seconds with no request (the control plane's fixed cost a second). Bounded: loopback, fixed counts.

    .venv/bin/python benches/proxy_cpu.py --api chat --requests 600 --rate 40 [--no-engine-load]
    .venv/bin/python benches/proxy_cpu.py --idle 15
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import proxy_data_plane as bench


def thread_cpu(pid: int) -> dict[str, tuple[str, float]]:
    """Each thread's name and CPU seconds so far."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                out[tid] = (name, int(f.read().split()[0]) / 1e9)
        except FileNotFoundError:  # the thread ended
            pass
    return out


def by_name(before: dict[str, tuple[str, float]], after: dict[str, tuple[str, float]]) -> dict[str, float]:
    """CPU seconds spent between the two readings, summed by thread name."""
    spent: dict[str, float] = {}
    for tid, (name, cpu) in after.items():
        spent[name] = spent.get(name, 0.0) + cpu - before.get(tid, (name, 0.0))[1]
    return spent


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--api", choices=("chat", "messages", "responses"), default="chat")
    p.add_argument("--requests", type=int, default=600)
    p.add_argument("--rate", type=float, default=40.0)
    p.add_argument("--idle", type=float, default=None, help="measure this many seconds with no request instead")
    p.add_argument("--no-engine-load", action="store_true", help="serve without the engine-load scraper")
    p.add_argument(
        "--tokenizer",
        default=None,
        help="serve in tokenizer mode on this tokenizer.json (e.g. tests/data/serve/tokenizer.json)",
    )
    p.add_argument(
        "--vllm-router",
        default=None,
        metavar="PATH",
        help="measure vllm-router (this executable, round robin) in front of the engines instead",
    )
    args = p.parse_args()
    procs: list[subprocess.Popen[Any]] = []
    try:
        engines = bench.start_engines(2, procs)
        extra = ["--no-engine-load"] if args.no_engine_load else []
        if args.vllm_router:
            serve = bench.start_vllm_router(args.vllm_router, engines, procs)
        else:
            serve = bench.start_smetric_serve(engines, procs, args.tokenizer, extra=extra)
        assert serve.proc is not None
        pid = serve.proc.pid
        if args.idle is not None:
            time.sleep(3)
            before = thread_cpu(pid)
            time.sleep(args.idle)
            spent = by_name(before, thread_cpu(pid))
            print(f"idle {args.idle:g} s: {1e3 * sum(spent.values()) / args.idle:.2f} ms of CPU a second")
            for name, cpu in sorted(spent.items(), key=lambda kv: -kv[1]):
                print(f"  {name:20s} {1e3 * cpu / args.idle:7.2f} ms/s")
            return
        chats = bench.chat_bodies(args.requests, 32768, False)
        bodies, path = {
            "chat": (chats, "/v1/chat/completions"),
            "messages": (bench.messages_bodies(chats), "/v1/messages"),
            "responses": (bench.responses_bodies(chats), "/v1/responses"),
        }[args.api]
        url = serve.urls[0]
        asyncio.run(bench.open_loop([url], bodies[:50], False, 25, 50, path))  # warm-up
        before = thread_cpu(pid)
        started = time.perf_counter()
        results = asyncio.run(bench.open_loop([url], bodies, False, args.rate, args.requests, path))
        elapsed = time.perf_counter() - started
        spent = by_name(before, thread_cpu(pid))
        latencies = sorted(r[1] for r in results)
        n = args.requests
        print(
            f"{args.api}: {n} requests in {elapsed:.1f} s, CPU {1e6 * sum(spent.values()) / n:.0f} µs/request, "
            f"p50 {1e3 * latencies[n // 2]:.2f} ms"
        )
        for name, cpu in sorted(spent.items(), key=lambda kv: -kv[1]):
            if cpu > 0:
                print(f"  {name:20s} {1e6 * cpu / n:7.0f} µs/request")
    finally:
        bench.stop(procs)


if __name__ == "__main__":
    main()
