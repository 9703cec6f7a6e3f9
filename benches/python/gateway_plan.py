"""What the compiled gateway's plan of a body costs in process, per API and token mode (issue 32).

Usage: ``python benches/python/gateway_plan.py [--bodies 400] [--repeat 5]``.

The bodies are ``benches/proxy_data_plane.py``'s: one agent session's 32K-token history and a
distinct short user message each, as chat, Anthropic Messages and OpenAI Responses bodies. For
each API and mode (approximate ids; tokenizer mode on ``tests/data/serve/tokenizer.json``, its
piece cache warm with the history after the first body) it prints, from
``smetric._core.gateway_routing_ids`` (the native path's plan, from the body's bytes to the ids):

* **best**: the best of ``--repeat`` passes over all bodies, µs a body (every piece cached from the
  second pass on);
* **once**: each body planned once after one warm-up body, as the server sees a session's next
  turns: the p50 and p90 µs (the new message is a piece the cache lacks).

No assertion: it prints figures (BENCHMARKS.md quotes them). ``--against PATH`` compares builds in
one process instead: PATH is another build's ``_core.abi3.so`` (e.g. copied before a rebuild),
loaded beside the installed one; chat's plan is timed by both, batch by batch, alternated
(``--repeat`` pairs of batches), for each mode — the pairs tell apart what separate runs, on a
noisy machine, do not (the same build against a copy of itself reads within 3 %). It checks first
that both builds give the same ids. ``--gap-ms G`` with ``--against`` plans each body once per build,
the builds alternated body by body, each plan after G ms awake: at a server's pace (requests tens
of ms apart) this host evicts the plan's data meanwhile, and a plan then costs 2–3× its
back-to-back figure.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import smetric._core
from smetric._core import gateway_routing_ids
from smetric.serve.compiled import gateway_token_source
from smetric.serve.tokens import TokenConfig, TokenSource

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benches"))
import other_build  # noqa: E402
import proxy_data_plane as bench  # noqa: E402

TOKENIZER = ROOT / "tests" / "data" / "serve" / "tokenizer.json"


def tokenizer_source(core: ModuleType) -> Any:
    """``gateway_token_source`` of tokenizer mode, built by ``core``'s own class."""
    return gateway_token_source(
        TokenSource(TokenConfig(mode="tokenizer", tokenizer=str(TOKENIZER))), core.GatewayTokenSource
    )


def idle(seconds: float) -> None:
    """Waits ``seconds`` awake (a sleep's wake-up would be timed too on this VM)."""
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        pass


def timed(core: ModuleType, source: Any, path: str, batch: list[bytes]) -> float:
    """µs a body of ``core``'s plans of ``batch``."""
    plan = core.gateway_routing_ids
    start = time.perf_counter()
    for raw in batch:
        plan(path, raw, tokens=source)
    return (time.perf_counter() - start) / len(batch) * 1e6


def against(other_path: str, bodies: list[bytes], pairs: int, gap_s: float = 0.0) -> None:
    """Chat's plan by the installed build and by the one at ``other_path``, batch by batch; with
    ``gap_s``, body by body instead, each planned once by each build after ``gap_s`` awake."""
    other = other_build.load(other_path)
    installed = smetric._core
    builds = {"other": other, "installed": installed}
    path = "/v1/chat/completions"
    print(f"{'mode':<12} {'other µs':>9} {'installed µs':>13} {'ratio':>6} {'installed faster':>17}")
    for mode in ("approximate", "tokenizer"):
        sources = {k: tokenizer_source(core) if mode == "tokenizer" else None for k, core in builds.items()}
        want = installed.gateway_routing_ids(path, bodies[0], tokens=sources["installed"])
        assert other.gateway_routing_ids(path, bodies[0], tokens=sources["other"]) == want, "the builds disagree"
        times: dict[str, list[float]] = {k: [] for k in builds}
        # Body by body after a gap (each body once per build), else batch by batch.
        rounds = [([raw], gap_s) for raw in bodies[1:]] if gap_s > 0 else [(bodies[1:], 0.0)] * pairs
        for i, (batch, gap) in enumerate(rounds):
            for k in other_build.order(i):
                idle(gap)
                times[k].append(timed(builds[k], sources[k], path, batch))
        o, n, wins = other_build.compare(times["other"], times["installed"])
        print(f"{mode:<12} {o:9.1f} {n:13.1f} {n / o:6.3f} {wins:>12}/{len(rounds)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bodies", type=int, default=400)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--against", default=None, metavar="PATH", help="another build's _core.abi3.so")
    parser.add_argument(
        "--gap-ms",
        type=float,
        default=0.0,
        help="with --against: each body once per build, after this long awake (a server's pace)",
    )
    args = parser.parse_args()
    chats = bench.chat_bodies(args.bodies + 1, 32_768, True)
    if args.against:
        against(args.against, chats, args.repeat, args.gap_ms / 1e3)
        return
    apis = {
        "chat": ("/v1/chat/completions", chats),
        "messages": ("/v1/messages", bench.messages_bodies(chats)),
        "responses": ("/v1/responses", bench.responses_bodies(chats)),
    }
    print(f"{'API':<10} {'mode':<12} {'best µs':>8} {'once p50':>9} {'once p90':>9}")
    for api, (path, bodies) in apis.items():
        for mode in ("approximate", "tokenizer"):
            # A fresh source per row: the once column starts from a cache holding one body.
            source = tokenizer_source(smetric._core) if mode == "tokenizer" else None
            gateway_routing_ids(path, bodies[0], tokens=source)
            once = []
            for raw in bodies[1:]:
                start = time.perf_counter()
                gateway_routing_ids(path, raw, tokens=source)
                once.append(time.perf_counter() - start)
            best = float("inf")
            for _ in range(args.repeat):
                start = time.perf_counter()
                for raw in bodies[1:]:
                    gateway_routing_ids(path, raw, tokens=source)
                best = min(best, (time.perf_counter() - start) / len(bodies[1:]))
            once.sort()
            p50, p90 = once[len(once) // 2], once[int(len(once) * 0.9)]
            print(f"{api:<10} {mode:<12} {best * 1e6:8.1f} {p50 * 1e6:9.1f} {p90 * 1e6:9.1f}")


if __name__ == "__main__":
    main()
