"""Replays agent sessions through Ray Serve with smetric's request router, on a local Ray cluster.

A deployment of ``--replicas`` CPU-only replicas stands in for vLLM instances: each replica keeps
the block hashes of the prompts it served (a prefix cache without eviction), sleeps for the
prefill of the tokens it does not hold plus the decode of the output (``--speedup`` times faster
than an H20: 20,000 prompt tokens/s, 7 ms per output token), and answers what it served. The
driver replays the Weka Claude Code excerpt shipped with smetric (``smetric/data``: sessions
and their sub-agents, each request's prompt as a chain of 64-token block hashes) closed-loop:
a session's next turn leaves when its previous one came back, after its think time divided by
``--speedup`` (at most ``--max-think-s``). Every request goes through a ``DeploymentHandle``, so
Ray Serve calls ``SMetricRequestRouter.choose_replicas`` for it.

It prints, from what the replicas recorded: the first turns per replica (spread); the share of
the follow-ups that extend their previous turn served where it was (stickiness, see
:class:`Report`), of those that extend the session's first turn served by its replica, and of all
follow-ups on the first-turn replica; and the prompt tokens served from the replicas' caches.
``--router ray`` runs Ray Serve's default router on the same replay, for comparison.

    python examples/ray_serve_agents.py --replicas 4 --max-turns 12
    python examples/ray_serve_agents.py --router ray      # Ray Serve's power-of-two-choices
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from importlib import resources
from typing import Any

import ray
from ray import serve
from ray.serve.config import RequestRouterConfig

from smetric.integrations._prompt import TURN_FIELD
from smetric.integrations.ray_serve import SMetricRequestRouter

BLOCK_TOKENS = 64
"""Tokens per hash id of the Weka excerpt."""
PREFILL_TOKENS_PER_S = 20_000.0
DECODE_S_PER_TOKEN = 0.007


def load_sessions(max_turns: int, max_sessions: int | None = None) -> list[list[dict[str, Any]]]:
    """The excerpt's sessions (sub-agents are sessions of their own), each cut to ``max_turns``."""
    path = resources.files("smetric") / "data" / "weka_excerpt.jsonl.gz"
    sessions: dict[str, list[dict[str, Any]]] = defaultdict(list)
    with path.open("rb") as raw, gzip.open(raw, "rt") as f:
        for line in f:
            row = json.loads(line)
            sessions[row["session_id"]].append(row)
    ordered = sorted(sessions.values(), key=lambda rows: (rows[0]["t"], rows[0]["session_id"]))
    return [sorted(rows, key=lambda r: r["turn"])[:max_turns] for rows in ordered[:max_sessions]]


@serve.deployment
class AgentReplica:
    """A CPU-only stand-in for one vLLM instance (see the module docs)."""

    def __init__(self, speedup: float) -> None:
        self.name = serve.get_replica_context().replica_id.unique_id
        self.speedup = speedup
        self.cached: set[int] = set()  # a trace's hash id names its block and everything before it

    async def __call__(self, body: dict[str, Any]) -> dict[str, Any]:
        hashes = body["hash_ids"]
        hit = 0
        while hit < len(hashes) and hashes[hit] in self.cached:
            hit += 1
        hit_tokens = min(hit * BLOCK_TOKENS, max(body["input_length"] - 1, 0))
        self.cached.update(hashes)
        new_tokens = body["input_length"] - hit_tokens
        await asyncio.sleep(
            (new_tokens / PREFILL_TOKENS_PER_S + body["output_length"] * DECODE_S_PER_TOKEN) / self.speedup
        )
        return {"replica": self.name, "session": body["session"], "turn": body["turn"], "hit_tokens": hit_tokens}


@dataclass
class Report:
    """What the replicas served.

    A follow-up *extends* its previous turn when at least half of its prompt's blocks are the
    previous turn's prompt blocks (the prefix the previous turn left in its replica's cache).
    In the Weka excerpt a session's turn 1 is often a short request that turn 2 does not extend
    (only the system prompt is shared), so the session's KV$ starts at turn 2: stickiness is
    measured turn to turn, on the follow-ups that extend their previous turn.
    """

    router: str
    replicas: int
    requests: int = 0
    sessions: int = 0
    seconds: float = 0.0
    first_turns_per_replica: dict[str, int] = field(default_factory=dict)
    follow_ups: int = 0
    extending: int = 0
    """Follow-ups that extend their previous turn."""
    extending_sticky: int = 0
    """Of those, served by the replica that served the previous turn."""
    on_first_turn_replica: int = 0
    """Follow-ups served by their session's first-turn replica."""
    extending_first: int = 0
    """Follow-ups that extend their session's first turn."""
    extending_first_home: int = 0
    """Of those, served by the session's first-turn replica."""
    prompt_tokens: int = 0
    hit_tokens: int = 0

    @property
    def stickiness(self) -> float:
        """Share of extending follow-ups served where their previous turn was."""
        return self.extending_sticky / max(self.extending, 1)

    @property
    def first_turn_stickiness(self) -> float:
        """Share of the follow-ups that extend their session's first turn served by its replica."""
        return self.extending_first_home / max(self.extending_first, 1)

    @property
    def first_turn_replica_share(self) -> float:
        """Share of all follow-ups served by their session's first-turn replica."""
        return self.on_first_turn_replica / max(self.follow_ups, 1)

    @property
    def max_first_turn_share(self) -> float:
        """The busiest replica's share of first turns (1 / replicas is a perfect spread)."""
        return max(self.first_turns_per_replica.values(), default=0) / max(self.sessions, 1)

    @property
    def hit_ratio(self) -> float:
        """Prompt tokens served from the replicas' caches."""
        return self.hit_tokens / max(self.prompt_tokens, 1)

    def to_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "stickiness": self.stickiness,
            "first_turn_replica_share": self.first_turn_replica_share,
            "first_turn_stickiness": self.first_turn_stickiness,
            "max_first_turn_share": self.max_first_turn_share,
            "hit_ratio": self.hit_ratio,
        }


def extends(previous: list[int], current: list[int]) -> bool:
    """Whether ``current`` starts with at least half of its blocks from ``previous``."""
    shared = 0
    for a, b in zip(previous, current, strict=False):
        if a != b:
            break
        shared += 1
    return 2 * shared >= len(current)


def summarize(router: str, replicas: int, served: list[dict[str, Any]], sessions: list[list[dict[str, Any]]]) -> Report:
    """Counts, from what the replicas answered, where each session's turns went."""
    where = {(r["session"], r["turn"]): r for r in served}
    report = Report(router=router, replicas=replicas, requests=len(served), sessions=len(sessions))
    first = Counter[str]()
    for rows in sessions:
        home = where[(rows[0]["session_id"], rows[0]["turn"])]["replica"]
        first[home] += 1
        for i, row in enumerate(rows):
            got = where[(row["session_id"], row["turn"])]
            report.prompt_tokens += row["input_length"]
            report.hit_tokens += got["hit_tokens"]
            if i == 0:
                continue
            report.follow_ups += 1
            report.on_first_turn_replica += got["replica"] == home
            if extends(rows[0]["hash_ids"], row["hash_ids"]):
                report.extending_first += 1
                report.extending_first_home += got["replica"] == home
            previous = rows[i - 1]
            if extends(previous["hash_ids"], row["hash_ids"]):
                report.extending += 1
                report.extending_sticky += (
                    got["replica"] == where[(previous["session_id"], previous["turn"])]["replica"]
                )
    report.first_turns_per_replica = dict(sorted(first.items()))
    return report


def deployment(router: str, replicas: int, speedup: float) -> serve.Application:
    options: dict[str, Any] = {
        "name": f"agents-{router}",
        "num_replicas": replicas,
        "max_ongoing_requests": 64,
        "ray_actor_options": {"num_cpus": 0},
    }
    if router == "smetric":
        options["request_router_config"] = RequestRouterConfig(
            request_router_class=SMetricRequestRouter,
            request_router_kwargs={"block_size": BLOCK_TOKENS, "seed": 0},
        )
    return AgentReplica.options(**options).bind(speedup)


async def replay(
    handle: serve.handle.DeploymentHandle,
    sessions: list[list[dict[str, Any]]],
    *,
    speedup: float,
    max_think_s: float,
) -> list[dict[str, Any]]:
    """Runs every session closed-loop; returns what the replicas answered, in completion order."""
    served: list[dict[str, Any]] = []

    async def session(rows: list[dict[str, Any]]) -> None:
        await asyncio.sleep(min(rows[0]["t"] / speedup, max_think_s))
        for row in rows:
            body = {
                "hash_ids": row["hash_ids"],
                "input_length": row["input_length"],
                "output_length": row["output_length"],
                "session": row["session_id"],
                "turn": row["turn"],
                # A real request carries its chat history, from which the router reads whether it
                # is a first turn; a trace carries hashes only, so its turn number stands in.
                TURN_FIELD: row["turn"],
            }
            served.append(await handle.remote(body))
            await asyncio.sleep(min((row.get("think_time") or 0.0) / speedup, max_think_s))

    await asyncio.gather(*(session(rows) for rows in sessions))
    return served


def run(
    router: str = "smetric",
    *,
    replicas: int = 4,
    max_turns: int = 12,
    max_sessions: int | None = None,
    speedup: float = 20.0,
    max_think_s: float = 0.05,
) -> Report:
    """Deploys, replays and reports; needs a running ``ray.init`` (see :func:`main`)."""
    sessions = load_sessions(max_turns, max_sessions)
    handle = serve.run(deployment(router, replicas, speedup), name=f"agents-{router}", route_prefix=None)
    try:
        start = time.monotonic()
        served = asyncio.run(replay(handle, sessions, speedup=speedup, max_think_s=max_think_s))
        report = summarize(router, replicas, served, sessions)
        report.seconds = time.monotonic() - start
    finally:
        serve.delete(f"agents-{router}")
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--router", choices=["smetric", "ray"], default="smetric")
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--max-turns", type=int, default=12, help="turns replayed per session")
    parser.add_argument("--max-sessions", type=int, default=None)
    parser.add_argument("--speedup", type=float, default=20.0)
    parser.add_argument("--max-think-s", type=float, default=0.05)
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args()
    ray.init(num_cpus=4, include_dashboard=False, object_store_memory=100 << 20, log_to_driver=False)
    try:
        report = run(
            args.router,
            replicas=args.replicas,
            max_turns=args.max_turns,
            max_sessions=args.max_sessions,
            speedup=args.speedup,
            max_think_s=args.max_think_s,
        )
    finally:
        serve.shutdown()
        ray.shutdown()
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
        return
    print(f"{report.router}: {report.requests} requests, {report.sessions} sessions, {report.seconds:.1f} s")
    print(f"first turns per replica: {report.first_turns_per_replica} (max share {report.max_first_turn_share:.2f})")
    print(
        f"follow-ups that extend their previous turn, served where it was: {report.extending_sticky}/"
        f"{report.extending} ({report.stickiness:.1%})"
    )
    print(
        f"follow-ups that extend their session's first turn, on its replica: {report.extending_first_home}/"
        f"{report.extending_first} ({report.first_turn_stickiness:.1%})"
    )
    print(
        f"all follow-ups on their session's first-turn replica: {report.on_first_turn_replica}/{report.follow_ups}"
        f" ({report.first_turn_replica_share:.1%})"
    )
    print(f"prompt tokens served from the replicas' caches: {report.hit_ratio:.1%}")


if __name__ == "__main__":
    main()
