"""Per-call latency of ``Router.route()`` from Python, against the plain-Python reference.

Usage: ``python benches/python/route_latency.py [--calls N] [--quick] [--smetric-forms]
[--exact-lag] [--threads RUNS [--seconds S]] [--against PATH]``. Prints p50/p99 per (policy, input kind, prompt
size), the 32K prompt in every input form (numpy int32/int64, ``array.array``, ``memoryview``,
list) beside CPython's own list conversions (the floor of the list path), the speed-up over
``smetric.reference.ReferenceRouter`` on the same calls, and routes/s and per-call latency from
1, 2 (and 4) threads per workload shape, route alone and the realistic loop route +
``on_prefilled`` + ``on_finished``, interleaved over five runs (``route_threads.py``, which
``--threads`` runs alone). Figures go to BENCHMARKS.md.

``--against PATH`` compares two builds in one process instead: PATH is another build's
``_core.abi3.so`` (copied aside before a rebuild), loaded beside the installed one; smetric's
route + ``on_finished`` (numpy ids, 1K and 32K) is timed by both on identically warmed routers in
batches of ``--calls``, the builds alternated batch by batch over 20 pairs: the median of the
batches' p50s per build, their ratio, and how many pairs the installed build won. Separate runs
differ by more than a change worth making on this noisy machine; the pairs do not.

The index is warm: 256 agent sessions (shared 4K system prompt, private histories) are routed
first, then the measured prompt is a follow-up of one of them (a near-full local hit).
"""

from __future__ import annotations

import argparse
import array
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import other_build
import route_threads

from smetric import POLICIES, Router, RouterConfig
from smetric.reference import ReferenceRouter

INSTANCES = [f"gpu-{i}" for i in range(32)]
SIZES = {"1K": 1_024, "8K": 8_192, "32K": 32_768, "128K": 131_072}


def session_prompt(rng: np.random.Generator, system: np.ndarray, n: int) -> np.ndarray:
    return np.concatenate([system, rng.integers(0, 151_936, max(n - len(system), 0), dtype=np.int32)])[:n]


def warm(router: Any, size: int, rng: np.random.Generator) -> np.ndarray:
    system = rng.integers(0, 151_936, min(4_096, size // 2), dtype=np.int32)
    prompts = [session_prompt(rng, system, size) for _ in range(256)]
    for p in prompts:
        d = router.route(p)
        router.on_finished(d.request_id)
    return prompts[7]


def percentiles(samples_ns: Sequence[int]) -> tuple[float, float]:
    qs = statistics.quantiles(samples_ns, n=100, method="inclusive")
    return qs[49] / 1e3, qs[98] / 1e3


def timed_calls(route: Callable[[], Any], calls: int) -> list[int]:
    out = []
    for _ in range(calls):
        t0 = time.perf_counter_ns()
        route()
        out.append(time.perf_counter_ns() - t0)
    return out


def against(other_path: str, calls: int, pairs: int = 20) -> None:
    """Smetric's 1K and 32K route + on_finished by the installed build and the one at
    ``other_path``, alternated batch by batch (module docs)."""
    import smetric._core as installed

    other = other_build.load(other_path)
    builds = {"other": other, "installed": installed}
    print(f"smetric route + on_finished, numpy int32, 32 instances, warm; {pairs} pairs of {calls}-call batches")
    print(f"{'size':>5} {'other p50':>10} {'installed p50':>14} {'ratio':>6} {'installed faster':>17}")
    for size in ("1K", "32K"):
        p50s: dict[str, list[float]] = {name: [] for name in builds}
        for i in range(pairs):
            order = other_build.order(i)
            # Fresh routers each pair, built and timed in the pair's order: where a router's
            # memory lands (which was built first) moved one build's 1K p50 by ~8 % against an
            # identical copy of itself when the two routers were built once.
            calls_of = {}
            for name in order:
                router = builds[name].Router(INSTANCES, policy="smetric")
                prompt = warm(router, SIZES[size], np.random.default_rng(1))

                def one(router: Any = router, prompt: np.ndarray = prompt) -> None:
                    router.on_finished(router.route(prompt).request_id)

                one()
                calls_of[name] = one
            for name in order:
                p50s[name].append(percentiles(timed_calls(calls_of[name], calls))[0])
        o, n, wins = other_build.compare(p50s["other"], p50s["installed"])
        print(f"{size:>5} {o:10.2f} {n:14.2f} {n / o:6.3f} {wins:>12}/{pairs}")


def bench_policy(policy: str, size_label: str, kind: str, calls: int) -> tuple[float, float]:
    rng = np.random.default_rng(1)
    router = Router(INSTANCES, policy=policy)
    prompt = warm(router, SIZES[size_label], rng)
    arg: Any = prompt if kind == "numpy" else prompt.tolist()

    def one() -> None:
        d = router.route(arg)
        router.on_finished(d.request_id)

    one()
    return percentiles(timed_calls(one, calls))


def bench_inputs(calls: int) -> list[tuple[str, float, float]]:
    """The 32K smetric follow-up in every input form, and CPython's own list conversions."""
    rng = np.random.default_rng(1)
    router = Router(INSTANCES, policy="smetric")
    prompt = warm(router, SIZES["32K"], rng)
    ids = prompt.tolist()
    forms: dict[str, Any] = {
        "numpy int32": prompt,
        "numpy int64": prompt.astype(np.int64),
        "numpy int32, strided view": np.repeat(prompt, 2)[::2],
        "array.array('i')": array.array("i", ids),
        "memoryview of array('I')": memoryview(array.array("I", ids)),
        "list of int": ids,
    }
    rows = []
    for label, arg in forms.items():

        def one(arg: Any = arg) -> None:
            router.on_finished(router.route(arg).request_id)

        one()
        n = calls if not isinstance(arg, list) else max(calls // 10, 50)
        rows.append((f"route({label})", *percentiles(timed_calls(one, n))))
    floors: dict[str, Callable[[], Any]] = {
        "CPython: array.array('I', list)": lambda: array.array("I", ids),
        "CPython: sum(list) (reads int internals)": lambda: sum(ids),
    }
    for label, f in floors.items():
        rows.append((label, *percentiles(timed_calls(f, max(calls // 10, 50)))))
    return rows


SMETRIC_FORMS: dict[str, RouterConfig] = {
    "defaults": RouterConfig(),
    "the TTFT gate alone (round 1's default)": RouterConfig(smetric_migration="threshold", smetric_kv_bound_share=0.0),
    "v1 (RouterConfig().v1())": RouterConfig().v1(),
    "v2 (RouterConfig().paper())": RouterConfig().paper(),
}
"""``smetric``'s forms that ``--smetric-forms`` compares."""


def bench_smetric_forms(size_label: str, calls: int, rounds: int = 5, prefilled: bool = False) -> list[float]:
    """p50 of ``smetric`` in each of :data:`SMETRIC_FORMS`, interleaved in rounds on the same
    warm prompt so that a busy machine slows them alike; the median over rounds of each. With
    ``prefilled``, each call also reports ``on_prefilled`` (the v2 drain-rate sample) before
    ``on_finished``."""
    routers = []
    for config in SMETRIC_FORMS.values():
        router = Router(INSTANCES, policy="smetric", config=config)
        routers.append((router, warm(router, SIZES[size_label], np.random.default_rng(1))))
    p50s: list[list[float]] = [[] for _ in routers]
    clock = [0.0]
    for _ in range(rounds):
        for k, (router, prompt) in enumerate(routers):

            def one(router: Any = router, prompt: Any = prompt) -> None:
                clock[0] += 0.01
                rid = router.route(prompt, now=clock[0]).request_id
                if prefilled:
                    router.on_prefilled(rid, now=clock[0] + 0.005)
                router.on_finished(rid)

            one()
            p50s[k].append(percentiles(timed_calls(one, calls))[0])
    return [statistics.median(p) for p in p50s]


def bench_exact_lag(size_label: str, calls: int) -> list[tuple[str, float, float]]:
    """``smetric`` in exact mode (docs/routing-semantics.md §2.7): a warm follow-up whose
    history the engines' events confirmed (only its new tail is recorded as sent), against the
    worst case, a prompt none of whose blocks an event has confirmed yet (every block counted
    from the sent set and recorded again on every call), and ``exact_pending_ttl_s=0``."""
    size = SIZES[size_label]
    rows = []
    # (label, exact_pending_ttl_s, history confirmed, output tokens reported to on_finished,
    # exact_answer_credit). With output tokens, every call's finish credits an answer (§2.7
    # "The answer") that the next call's query looks up and the next finish replaces.
    cases = (
        ("exact, history confirmed", 2.0, True, 0, True),
        ("exact, history confirmed, answers credited", 2.0, True, size // 8, True),
        ("exact, history confirmed, answer credit off", 2.0, True, size // 8, False),
        ("exact, nothing confirmed", 2.0, False, 0, True),
        ("exact, nothing confirmed, answers credited", 2.0, False, size // 8, True),
        ("exact, sent blocks off", 0.0, True, 0, True),
    )
    for label, ttl, confirmed, output, answers in cases:
        config = RouterConfig(index_mode="exact", exact_pending_ttl_s=ttl, exact_answer_credit=answers)
        router = Router(INSTANCES, policy="smetric", config=config)
        rng = np.random.default_rng(1)
        system = rng.integers(0, 151_936, min(4_096, size // 2), dtype=np.int32)
        prompts = [session_prompt(rng, system, size) for _ in range(256)]
        clock = [0.0]
        for p in prompts:
            d = router.route(p, now=clock[0])
            if confirmed:
                router.store_blocks(d.instance, router.hash_tokens(p), now=clock[0])
            router.on_finished(d.request_id, output, now=clock[0])
        # The measured follow-up: session 7's prompt and a new turn of an eighth of it (its last
        # blocks are never confirmed, so each call records them as sent again).
        follow_up = np.concatenate([prompts[7], rng.integers(0, 151_936, size // 8, dtype=np.int32)])

        def one(
            router: Any = router, follow_up: Any = follow_up, clock: list[float] = clock, output: int = output
        ) -> None:
            clock[0] += 1e-4  # 0.1 ms a call: the sent blocks stay within their bound
            router.on_finished(router.route(follow_up, now=clock[0]).request_id, output, now=clock[0])

        one()
        rows.append((label, *percentiles(timed_calls(one, calls))))
    return rows


def bench_reference(policy: str, size_label: str, calls: int) -> tuple[float, float]:
    rng = np.random.default_rng(1)
    router = ReferenceRouter(INSTANCES, policy=policy)
    prompt = warm(router, SIZES[size_label], rng).tolist()

    def one() -> None:
        d = router.route(prompt)
        router.on_finished(d.request_id)

    return percentiles(timed_calls(one, calls))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=5_000)
    parser.add_argument("--quick", action="store_true", help="few calls, smetric only (a smoke run)")
    parser.add_argument(
        "--smetric-forms", action="store_true", help="only smetric's defaults against its paper form, 1K and 32K"
    )
    parser.add_argument(
        "--exact-lag",
        action="store_true",
        help="only smetric in exact mode: confirmed history vs blocks only sent (docs §2.7), 1K and 32K",
    )
    parser.add_argument(
        "--threads",
        type=int,
        metavar="RUNS",
        help="only 1, 2 (and 4) threads per workload shape (route_threads.py), RUNS interleaved runs",
    )
    parser.add_argument("--seconds", type=float, default=2.0, help="length of each --threads run")
    parser.add_argument("--against", metavar="PATH", help="another build's _core.abi3.so, compared in pairs")
    args = parser.parse_args()
    if args.against:
        against(args.against, args.calls)
        return
    if args.threads:
        route_threads.report(args.threads, args.seconds, SIZES["32K"])
        return
    if args.exact_lag:
        print("smetric route() in exact mode, numpy int32, a follow-up 1/8 longer, 32 instances, warm (µs)")
        for size in ("1K", "32K"):
            for label, p50, p99 in bench_exact_lag(size, args.calls):
                print(f"{size:>5} {label:<28} p50 {p50:>7.2f}  p99 {p99:>7.2f}")
        return
    if args.smetric_forms:
        print("smetric p50, numpy int32, 32 instances, warm (µs), per form: " + " | ".join(SMETRIC_FORMS))
        for prefilled in (False, True):
            calls_label = "route+on_prefilled+on_finished" if prefilled else "route+on_finished"
            for size in ("1K", "32K"):
                p50s = bench_smetric_forms(size, args.calls, prefilled=prefilled)
                print(f"{calls_label:<31} {size:>4} " + "  ".join(f"{p:>7.2f}" for p in p50s))
        return
    calls = 50 if args.quick else args.calls
    policies = ["smetric"] if args.quick else list(POLICIES)
    print(f"route() latency, 32 instances, warm index, {calls} calls per row (µs)")
    print(f"{'policy':<12} {'input':<6} {'size':>5} {'p50':>8} {'p99':>8}")
    for policy in policies:
        for size in ("1K", "32K") if args.quick else SIZES:
            for kind in ("numpy", "list"):
                if kind == "list" and size == "128K" and not args.quick:
                    continue
                p50, p99 = bench_policy(policy, size, kind, calls)
                print(f"{policy:<12} {kind:<6} {size:>5} {p50:>8.1f} {p99:>8.1f}")
    print("\n32K-token prompt (smetric) in every input form (µs)")
    for label, p50, p99 in bench_inputs(calls):
        print(f"{label:<45} p50 {p50:>8.1f}  p99 {p99:>8.1f}")
    print("\nplain-Python reference (lists), same calls")
    for policy in ("smetric", "lmetric") if not args.quick else ("smetric",):
        for size in ("1K", "32K"):
            ref50, _ = bench_reference(policy, size, max(calls // 20, 20))
            rust50, _ = bench_policy(policy, size, "numpy", calls)
            print(
                f"{policy:<12} {size:>5} reference p50 {ref50:>9.1f} µs  "
                f"rust p50 {rust50:>7.1f} µs  x{ref50 / rust50:.0f}"
            )
    print()
    route_threads.report(1 if args.quick else 5, 0.5 if args.quick else 2.0, SIZES["32K"])


if __name__ == "__main__":
    main()
