"""How right is the router's predicted hit? Agent sessions replayed through ``smetric serve``, and
the engines' own ``cached_tokens`` read back from the proxy's outcome metrics.

Four ``smetric fake-engine`` instances in process (KV events on, ``--speedup 4``), the shipped
Weka excerpt's agent sessions (``tests/serve/agent_replay.py``: ``--copies`` × 27 sessions of at
most ``--turns`` turns, arrivals compressed into ``--span`` seconds, streaming every other
request, an ``x-session-id`` each), through one proxy with its defaults. Printed: requests
measured, the predicted − realized histogram (``smetric_proxy_hit_error_tokens``), predicted and
realized hit tokens, and the follow-ups under half their predicted hit (the wrong-instance rate).
Bounded: loopback, fixed sessions, a 120 s client deadline, every server stopped at the end.

    .venv/bin/python benches/serve_realized_hit.py --copies 2 --turns 4
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import urllib.request
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "serve"))
from agent_replay import Session, sessions  # noqa: E402
from proxy_util import metric  # noqa: E402

from smetric.fake_engine import FakeEngine  # noqa: E402
from smetric.serve.config import load_config  # noqa: E402
from smetric.serve.proxy import ProxyServer  # noqa: E402


async def replay(base: str, plan: list[Session]) -> None:
    t0 = time.monotonic()

    async def one(client: aiohttp.ClientSession, s: Session, index: int) -> None:
        for k, turn in enumerate(s.turns):
            delay = t0 + turn.at_s - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            body = {
                "model": "fake-model",
                "messages": turn.messages,
                "max_tokens": turn.max_tokens,
                "stream": (index + k) % 2 == 1,
            }
            async with client.post(f"{base}/v1/chat/completions", json=body, headers={"x-session-id": s.key}) as r:
                await r.read()
                if r.status != 200:
                    raise RuntimeError(f"{s.key} turn {k + 1}: {r.status}")

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as client:
        await asyncio.gather(*(one(client, s, i) for i, s in enumerate(plan)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--copies", type=int, default=2)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--span", type=float, default=10.0)
    args = p.parse_args()
    engines = [
        FakeEngine(port=0, kv_events_port=0, kv_replay_port=0, speedup=4, num_gpu_blocks=8192).start() for _ in range(4)
    ]
    try:
        config = load_config(instances=[e.url for e in engines], port=0)
        plan = sessions(copies=args.copies, max_turns=args.turns, span_s=args.span)
        with ProxyServer(config) as proxy:
            asyncio.run(replay(proxy.url, plan))
            with urllib.request.urlopen(proxy.url + "/metrics", timeout=10) as r:
                text = r.read().decode()
    finally:
        for e in engines:
            e.stop()

    def m(name: str, **labels: str) -> float:
        return metric(text, f"smetric_proxy_{name}", **labels)

    measured = m("hit_error_tokens_count")
    exact = m("hit_error_tokens_bucket", le="0") - m("hit_error_tokens_bucket", le="-1")
    print(f"requests {sum(len(s.turns) for s in plan)}, measured {measured:.0f}, predicted == realized {exact:.0f}")
    print(f"predicted − realized: sum {m('hit_error_tokens_sum'):.0f} tokens")
    for line in text.splitlines():
        if line.startswith("smetric_proxy_hit_error_tokens_bucket"):
            print("  " + line)
    print(f"predicted local hit tokens {m('hit_tokens_total', tier='local'):.0f}")
    print(f"realized hit tokens        {m('realized_hit_tokens_total'):.0f}")
    short, followups = m("followups_short_hit_total"), m("followups_measured_total")
    print(f"follow-ups under half their predicted hit: {short:.0f} of {followups:.0f}")


if __name__ == "__main__":
    main()
