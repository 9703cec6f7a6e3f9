"""Routes/s and per-call latency of one shared ``Router`` from 1, 2 and 4 threads, per workload
shape (issue 33): the instrument for the concurrent decision path.

Usage: ``python benches/python/route_threads.py [--runs N] [--seconds S] [--tokens N]`` (also
``route_latency.py --threads RUNS [--seconds S]``). The Rust counterpart, the same shapes on the
core without the GIL: ``cargo run --release -p smetric-core --example concurrent_route``.

Every measurement builds a fresh router (``smetric``, today's defaults unless the shape says
otherwise; 32 instances, block 16) and warms it untimed; the threads then share it and send
numpy int32 prompts (a buffer) of ``--tokens`` tokens (32K):

* ``stay-home`` — the shape ``--threads`` measured before: 256 sessions sharing a 4K system
  prompt routed once, then every thread re-sends session 7's follow-up (it stays home: the
  route only renews its blocks);
* ``distinct`` — issue 33's shape under today's defaults: 64 sessions of distinct tokens routed
  as first turns, then each thread cycles through them re-sent as turn 2 (from its own offset).
  Their homes have room and idle queues, so the follow-ups stay home too (the share moved is
  printed);
* ``move-heavy`` — the same sessions on a fleet whose GPU caches hold one such session each
  (``local_capacity_blocks`` = the prompt's blocks: 64 sessions on 32 instances): a follow-up's
  home has mostly been taken by another session since its last turn, so it moves (``migrate
  (local KV$ evicted)``) and its route inserts its whole chain on the new instance and evicts
  the one there — a write of O(prompt blocks) on most routes. (Loading the homes instead moves a
  session once: its new instance then holds the same chain and, idler, becomes its home.);
* ``write-heavy`` — first turns (``turn=1``) of new sessions: each thread's prompt gets a new
  first token every call, so every route adds a whole new chain to the index (and, once the
  instances are full, evicts as much);
* ``control`` — SHA-256 of the prompt's bytes, which runs without the GIL and without any
  smetric lock: its ratio is what the machine gave a second thread then;
* ``gil-calls`` — the realistic loop's pattern of GIL releases without smetric: per iteration
  one SHA-256 of 16 KiB (≈ a 32K route's time without the GIL) and two of 2 KiB (hashlib's
  smallest input it releases the GIL for, standing in for ``on_prefilled`` and ``on_finished``):
  its ratio is what CPython's GIL hand-overs leave a loop of three such calls on this machine;
* ``apart`` — write-heavy's realistic loop with a router of its own per thread (nothing shared
  but the GIL): the most any sharding of the index could give write-heavy from Python here.

Loops: ``route`` is ``route`` + ``on_finished`` (the least that keeps the load board steady),
``realistic`` adds ``on_prefilled`` between them (what an embedding router calls per request).
Every ``route`` call is timed inside its thread with ``time.perf_counter_ns`` (its overhead is
printed). Runs interleave every configuration, rotated by one from run to run so drift hits
them alike; the table gives, over the runs, routes/s (min / median / max), the ratio to 1 thread
of the same shape and loop in the same run, and the p50 / p99 per ``route`` call (medians over
runs). Figures go to BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import threading
import time
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import numpy as np

from smetric import Router, RouterConfig

INSTANCES = [f"gpu-{i}" for i in range(32)]
BLOCK = 16
SHAPES = ("stay-home", "distinct", "move-heavy", "write-heavy")
LOOPS = ("route", "realistic")
CONTROL = "control"
GIL_CALLS = "gil-calls"
APART = "apart"
MIGRATE = "follow-up: migrate"
"""The prefix of every reason a follow-up moved for."""


def thread_counts() -> list[int]:
    return [1, 2, 4] if (os.cpu_count() or 1) >= 4 else [1, 2]


@cache
def stay_home_prompts(tokens: int) -> list[np.ndarray]:
    rng = np.random.default_rng(2)
    system = rng.integers(0, 151_936, min(4_096, tokens // 2), dtype=np.int32)
    return [
        np.concatenate([system, rng.integers(0, 151_936, tokens - len(system), dtype=np.int32)]) for _ in range(256)
    ]


@cache
def sessions(tokens: int) -> list[np.ndarray]:
    rng = np.random.default_rng(5)
    return [rng.integers(0, 151_936, tokens, dtype=np.int32) for _ in range(64)]


@dataclass
class Workload:
    """A warm router and what each thread sends: ``prompts[k]`` cycled by thread ``k``."""

    router: Router
    prompts: list[list[np.ndarray]]
    turn: int | None = None
    fresh: bool = False
    """Whether each call's prompt gets a new first token (a new session)."""


def workload(shape: str, threads: int, tokens: int) -> Workload:
    if shape == "stay-home":
        router = Router(INSTANCES, policy="smetric", block_size=BLOCK)
        prompts = stay_home_prompts(tokens)
        for p in prompts:
            router.on_finished(router.route(p).request_id)
        return Workload(router, [[prompts[7]]] * threads)
    if shape in ("distinct", "move-heavy"):
        config = RouterConfig(local_capacity_blocks=tokens // BLOCK) if shape == "move-heavy" else RouterConfig()
        router = Router(INSTANCES, policy="smetric", block_size=BLOCK, config=config)
        ss = sessions(tokens)
        for p in ss:
            d = router.route(p, turn=1)
            router.on_prefilled(d.request_id)
            router.on_finished(d.request_id)
        offsets = [k * len(ss) // threads for k in range(threads)]
        return Workload(router, [ss[o:] + ss[:o] for o in offsets], turn=2)
    if shape == "write-heavy":
        router = Router(INSTANCES, policy="smetric", block_size=BLOCK)
        rng = np.random.default_rng(11)
        bufs = [rng.integers(0, 151_936, tokens, dtype=np.int32) for _ in range(threads)]
        return Workload(router, [[b] for b in bufs], turn=1, fresh=True)
    raise ValueError(f"unknown shape {shape!r}")


@dataclass
class Sample:
    rate: float
    p50_us: float
    p99_us: float
    moved: float | None = None
    """Share of the measured routes whose follow-up moved (None for the controls)."""

    @classmethod
    def of(cls, elapsed_s: float, lats: list[list[int]], moved: float | None = None) -> Sample:
        """A measurement from its threads' latencies: calls a second, p50 and p99, share moved."""
        all_ns = sorted(x for lat in lats for x in lat)
        return cls(len(all_ns) / elapsed_s, percentile(all_ns, 0.5), percentile(all_ns, 0.99), moved)


@dataclass
class Config:
    shape: str
    loop: str
    threads: int
    samples: list[Sample] = field(default_factory=list)


def percentile(sorted_ns: list[int], q: float) -> float:
    return sorted_ns[int((len(sorted_ns) - 1) * q)] / 1e3


def route_threads(shape: str, loop: str, threads: int, seconds: float, tokens: int, apart: bool = False) -> Sample:
    """One measurement; ``apart``: each thread on a workload (and router) of its own."""
    if apart:
        own = [workload(shape, threads, tokens) for _ in range(threads)]
    else:
        own = [workload(shape, threads, tokens)] * threads
    router, lifecycle, turn, fresh = own[0].router, loop == "realistic", own[0].turn, own[0].fresh
    before = router.stats()
    lats: list[list[int]] = [[] for _ in range(threads)]
    stop = time.perf_counter_ns() + int(seconds * 1e9)

    def work(k: int) -> None:
        r = own[k].router
        ns, route, finished, prefilled = time.perf_counter_ns, r.route, r.on_finished, r.on_prefilled
        prompts, lat = own[k].prompts[k], lats[k]
        n, i = len(prompts), 0
        while True:
            p = prompts[i % n]
            if fresh:
                p[0] = i  # a new first token: a new chain from its first block
            t0 = ns()
            d = route(p, turn=turn)
            t1 = ns()
            if lifecycle:
                prefilled(d.request_id)
            finished(d.request_id)
            lat.append(t1 - t0)
            i += 1
            if t1 >= stop:
                break

    t_start = time.perf_counter_ns()
    run_all(work, threads)
    elapsed = (time.perf_counter_ns() - t_start) / 1e9
    if apart:  # the share moved is one router's, and write-heavy moves nothing
        return Sample.of(elapsed, lats)
    after = router.stats()
    routed = after["routed"] - before["routed"]
    moved = sum(v - before["reasons"].get(r, 0) for r, v in after["reasons"].items() if r.startswith(MIGRATE))
    return Sample.of(elapsed, lats, moved / max(routed, 1))


def control_threads(threads: int, seconds: float, tokens: int, gil_calls: bool = False) -> Sample:
    """``control``, or with ``gil_calls`` the ``gil-calls`` loop (its 16 KiB call timed)."""
    data = sessions(tokens)[0].tobytes()
    big, small = (data[:16_384], data[:2_048]) if gil_calls else (data, b"")
    lats: list[list[int]] = [[] for _ in range(threads)]
    stop = time.perf_counter_ns() + int(seconds * 1e9)

    def work(k: int) -> None:
        ns, sha, lat = time.perf_counter_ns, hashlib.sha256, lats[k]
        while True:
            t0 = ns()
            sha(big)
            t1 = ns()
            lat.append(t1 - t0)
            if gil_calls:
                sha(small)
                sha(small)
            if t1 >= stop:
                break

    t_start = time.perf_counter_ns()
    run_all(work, threads)
    elapsed = (time.perf_counter_ns() - t_start) / 1e9
    return Sample.of(elapsed, lats)


def run_all(work: Any, threads: int) -> None:
    ts = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


def timer_overhead(calls: int = 100_000) -> tuple[float, float]:
    """(p50 ns between two back-to-back ``perf_counter_ns`` reads, ns per iteration of an empty
    timed loop: both reads and the append)."""
    ns, lat = time.perf_counter_ns, []
    t_start = ns()
    for _ in range(calls):
        t0 = ns()
        t1 = ns()
        lat.append(t1 - t0)
    per_iter = (ns() - t_start) / calls
    return float(sorted(lat)[len(lat) // 2]), per_iter


def spread(xs: list[float], fmt: str) -> str:
    return "/".join(format(x, fmt) for x in (min(xs), statistics.median(xs), max(xs)))


def report(runs: int, seconds: float, tokens: int) -> None:
    counts = thread_counts()
    configs = [Config(s, lp, t) for s in SHAPES for lp in LOOPS for t in counts]
    configs += [Config(control, "-", t) for control in (CONTROL, GIL_CALLS, APART) for t in counts]
    cores = os.cpu_count()
    print(
        f"one shared Router: smetric, {len(INSTANCES)} instances, block {BLOCK}, {tokens}-token numpy int32 "
        f"prompts; {runs} interleaved runs of {seconds:g} s per configuration; os.cpu_count() = {cores}"
    )
    if 4 not in counts:
        print(f"4 threads: skipped (os.cpu_count() = {cores} < 4)")
    same, per_iter = timer_overhead()
    print(f"timer: two perf_counter_ns reads {same:.0f} ns apart (p50); timing a call adds ≈ {per_iter:.0f} ns")
    for run in range(runs):
        k = run % len(configs)
        for c in configs[k:] + configs[:k]:
            if c.shape in (CONTROL, GIL_CALLS):
                c.samples.append(control_threads(c.threads, seconds, tokens, gil_calls=c.shape == GIL_CALLS))
            elif c.shape == APART:
                c.samples.append(route_threads("write-heavy", "realistic", c.threads, seconds, tokens, apart=True))
            else:
                c.samples.append(route_threads(c.shape, c.loop, c.threads, seconds, tokens))
        ones = {(c.shape, c.loop): c.samples[-1].rate for c in configs if c.threads == 1}
        print(
            f"run {run + 1}, x(2 threads ÷ 1): "
            + "  ".join(
                f"{c.shape}/{c.loop} {c.samples[-1].rate / ones[c.shape, c.loop]:.2f}"
                for c in configs
                if c.threads == 2
            )
        )
    print(
        f"{'shape':<12} {'loop':<10} {'thr':>3} {'routes/s min/med/max':>26} "
        f"{'x÷1 thread min/med/max':>23} {'p50 µs':>7} {'p99 µs':>7} {'moved':>6}"
    )
    for c in configs:
        ones_c = next(o for o in configs if (o.shape, o.loop, o.threads) == (c.shape, c.loop, 1))
        ratios = [s.rate / o.rate for s, o in zip(c.samples, ones_c.samples, strict=True)]
        moved = [s.moved for s in c.samples if s.moved is not None]
        print(
            f"{c.shape:<12} {c.loop:<10} {c.threads:>3} {spread([s.rate for s in c.samples], ',.0f'):>26} "
            f"{spread(ratios, '.2f'):>23} {statistics.median(s.p50_us for s in c.samples):>7.2f} "
            f"{statistics.median(s.p99_us for s in c.samples):>7.2f} "
            f"{(f'{statistics.median(moved):.0%}' if moved else '-'):>6}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=1.5, help="length of each measurement")
    parser.add_argument("--tokens", type=int, default=32_768, help="prompt length (a multiple of 16)")
    args = parser.parse_args()
    report(args.runs, args.seconds, args.tokens)


if __name__ == "__main__":
    main()
