"""A synthetic agent fleet driven through :class:`smetric.Router`, with lifecycle calls.

Sessions share one system prompt; each turn re-sends the whole history plus a tool result,
as coding agents do. A session's next turn leaves when its previous one finished plus a
think time. Request durations come from a deliberately simple service model (prefill at a
fixed token rate plus a per-output-token time that grows with the batch), which is enough
to exercise the router's load board; the cluster simulator (``smetric simulate``) models
vLLM instances properly.

Used by ``smetric toy-fleet`` and by the acceptance test of the routing core.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from smetric._core import Decision, Router, RouterConfig
from smetric._types import PolicyName
from smetric.errors import MissingExtraError

try:
    import numpy as np
except ModuleNotFoundError as e:
    raise MissingExtraError(__name__, "numpy", "sim", name=e.name) from e

PREFILL_TOKENS_PER_S = 20_000.0
"""H20 + Qwen3-Coder-30B-A3B prefill rate (perf-model §6: ≈50 µs/token)."""
DECODE_S_PER_TOKEN = 0.007
"""Batch-1 decode step (perf-model §3A: 7.3 ms)."""
DECODE_S_PER_TOKEN_PER_REQUEST = 0.0004
"""Extra decode time per token for every other request in the batch (a coarse slope)."""


@dataclass(frozen=True)
class SessionWorkload:
    """Shape of the synthetic agent traffic."""

    sessions: int = 2_000
    min_turns: int = 5
    max_turns: int = 50
    system_prompt_tokens: int = 4_096
    first_user_tokens: int = 300
    turn_growth_tokens: tuple[int, int] = (100, 600)
    output_tokens: tuple[int, int] = (50, 400)
    think_time_s: tuple[float, float] = (1.0, 20.0)
    session_rate_per_s: float = 0.4
    vocab: int = 150_000


@dataclass
class FleetReport:
    """What happened during a run."""

    policy: str
    requests: int = 0
    first_turns_per_instance: Counter[str] = field(default_factory=Counter)
    requests_per_instance: Counter[str] = field(default_factory=Counter)
    follow_ups: int = 0
    follow_ups_home: int = 0
    """Follow-ups routed to the instance that served the session's previous request."""
    first_turn_correct: int = 0
    """Decisions whose inferred turn matched the generator's ground truth."""
    reasons: Counter[str] = field(default_factory=Counter)
    max_in_flight: dict[str, int] = field(default_factory=dict)
    overloaded_decisions: int = 0
    """Decisions after which some instance ran more than ``1.5 × mean + 4`` requests
    (smetric's default overload test, applied to the fleet's true in-flight counts)."""

    @property
    def first_turn_spread(self) -> float:
        """Busiest over idlest instance by first turns (inf when one got none)."""
        counts = list(self.first_turns_per_instance.values())
        return float("inf") if min(counts) == 0 else max(counts) / min(counts)

    @property
    def follow_up_return(self) -> float:
        """Share of follow-ups that went back to the session's previous instance."""
        return self.follow_ups_home / max(self.follow_ups, 1)

    @property
    def turn_accuracy(self) -> float:
        """Share of decisions whose first-turn verdict was right."""
        return self.first_turn_correct / max(self.requests, 1)


def run_fleet(
    policy: PolicyName,
    *,
    instances: int = 8,
    workload: SessionWorkload | None = None,
    seed: int = 0,
    config: RouterConfig | None = None,
    on_decision: Callable[[int, int, Decision], None] | None = None,
) -> FleetReport:
    """Replays ``workload`` through a :class:`Router` and reports placement statistics."""
    wl = workload or SessionWorkload()
    rng = np.random.default_rng(seed)
    names = [f"gpu-{i}" for i in range(instances)]
    router = Router(names, policy=policy, seed=seed, config=config)
    report = FleetReport(policy=policy, first_turns_per_instance=Counter(dict.fromkeys(names, 0)))
    in_flight = dict.fromkeys(names, 0)
    report.max_in_flight = dict(in_flight)

    system = rng.integers(0, wl.vocab, wl.system_prompt_tokens, dtype=np.uint32)
    histories: list[np.ndarray] = []
    turns_left: list[int] = []
    last_instance: list[str | None] = []
    # Event heap: (time, kind, seq, session, request_id, output_tokens).
    # kind 0 = send the session's next request, 1 = its prefill ends, 2 = it finishes.
    events: list[tuple[float, int, int, int, int | str | None, int]] = []
    seq = 0
    t = 0.0
    for s in range(wl.sessions):
        t += float(rng.exponential(1.0 / wl.session_rate_per_s))
        user = rng.integers(0, wl.vocab, wl.first_user_tokens, dtype=np.uint32)
        histories.append(np.concatenate([system, user]))
        turns_left.append(int(rng.integers(wl.min_turns, wl.max_turns + 1)))
        last_instance.append(None)
        heapq.heappush(events, (t, 0, seq, s, None, 0))
        seq += 1

    while events:
        now, kind, _, s, request_id, out = heapq.heappop(events)
        if kind == 1:
            assert request_id is not None
            router.on_prefilled(request_id, now=now)  # the simulated clock `route` was given
            continue
        if kind == 2:
            assert request_id is not None
            router.on_finished(request_id, out, now=now)  # exact mode credits the answer until now + TTL
            name = last_instance[s]
            assert name is not None
            in_flight[name] -= 1
            turns_left[s] -= 1
            if turns_left[s] > 0:
                growth = int(rng.integers(*wl.turn_growth_tokens))
                histories[s] = np.concatenate([histories[s], rng.integers(0, wl.vocab, out + growth, dtype=np.uint32)])
                think = float(rng.uniform(*wl.think_time_s))
                heapq.heappush(events, (now + think, 0, seq, s, None, 0))
                seq += 1
            continue
        first = last_instance[s] is None
        decision = router.route(histories[s], now=now)
        report.requests += 1
        report.reasons[decision.reason] += 1
        report.requests_per_instance[decision.instance] += 1
        report.first_turn_correct += int(decision.first_turn == first)
        if first:
            report.first_turns_per_instance[decision.instance] += 1
        else:
            report.follow_ups += 1
            report.follow_ups_home += int(decision.instance == last_instance[s])
        if on_decision is not None:
            on_decision(s, report.requests, decision)
        last_instance[s] = decision.instance
        in_flight[decision.instance] += 1
        busiest = max(in_flight.values())
        report.max_in_flight[decision.instance] = max(
            report.max_in_flight[decision.instance], in_flight[decision.instance]
        )
        mean = sum(in_flight.values()) / len(in_flight)
        report.overloaded_decisions += int(busiest > 1.5 * mean + 4)
        output = int(rng.integers(*wl.output_tokens))
        batch = in_flight[decision.instance]
        prefill_s = decision.prefill_tokens / PREFILL_TOKENS_PER_S
        decode_s = output * (DECODE_S_PER_TOKEN + DECODE_S_PER_TOKEN_PER_REQUEST * (batch - 1))
        heapq.heappush(events, (now + prefill_s, 1, seq, s, decision.request_id, output))
        heapq.heappush(events, (now + prefill_s + decode_s, 2, seq + 1, s, decision.request_id, output))
        seq += 2
    return report
