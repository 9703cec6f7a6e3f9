"""End to end: four ``smetric fake-engine`` processes behind ``smetric serve`` on loopback replay
a few hundred agent sessions (the shipped Weka excerpt, copied and time-compressed); one engine
is killed mid-run and restarted. Every request must complete, first turns must spread over the
fleet and follow-ups must stick to their session's instance.

Bounded: 216 sessions of at most 4 turns (≤ 864 requests), a 12 s arrival span, engines at 4× the H20
model's speed; ≈10 s in all."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from agent_replay import Session, sessions
from proxy_util import FakeEngineProcess, colocated_router, metric

from smetric.serve.config import load_config
from smetric.serve.proxy import ProxyServer

ENGINES = 4
KILLED = 2


def _decision(value: str) -> dict[str, str]:
    return {k: v.strip('"') for k, _, v in (p.partition("=") for p in value.split("; "))}


async def _replay(base: str, plan: list[Session], engines: list[FakeEngineProcess]) -> dict[str, Any]:
    done = 0
    total = sum(len(s.turns) for s in plan)
    results: list[dict[str, Any]] = []
    failures: list[str] = []
    killed_at: float | None = None
    restarted_at: float | None = None
    t0 = time.monotonic()

    async def one(client: aiohttp.ClientSession, s: Session, index: int) -> None:
        nonlocal done
        for k, turn in enumerate(s.turns):
            delay = t0 + turn.at_s - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            stream = (index + k) % 2 == 1
            body = {"model": "fake-model", "messages": turn.messages, "max_tokens": turn.max_tokens, "stream": stream}
            async with client.post(base + "/v1/chat/completions", json=body) as r:
                data = await r.read()
                ok = r.status == 200
                if ok and stream:
                    ok = data.rstrip().endswith(b"data: [DONE]") and b'"error"' not in data
                elif ok:
                    ok = bool(json.loads(data).get("choices"))
                if not ok:
                    failures.append(f"{s.key} turn {k + 1}: {r.status} {data[-200:]!r}")
                d = _decision(r.headers.get("x-smetric-decision", "instance=?"))
                results.append({"session": s.key, "turn": k + 1, "t": time.monotonic() - t0, **d})
            done += 1

    async def chaos() -> None:
        nonlocal killed_at, restarted_at
        if not engines:
            return
        while done < total * 0.35:
            await asyncio.sleep(0.05)
        engines[KILLED].kill()
        killed_at = time.monotonic() - t0
        await asyncio.sleep(2.0)
        engines[KILLED].start()
        await asyncio.get_running_loop().run_in_executor(None, engines[KILLED].wait_up)
        restarted_at = time.monotonic() - t0

    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(timeout=timeout) as client:
        await asyncio.gather(chaos(), *(one(client, s, i) for i, s in enumerate(plan)))
    return {"results": results, "failures": failures, "killed_at": killed_at, "restarted_at": restarted_at}


@pytest.mark.slow
def test_agent_sessions_through_the_proxy_survive_a_killed_engine(tmp_path: Path) -> None:
    options = ("--speedup", "4", "--num-gpu-blocks", "8192")
    engines = [FakeEngineProcess(tmp_path, *options, kv_events=True) for _ in range(ENGINES)]
    try:
        for e in engines:
            e.start_up()
        config = load_config(
            instances=[e.url for e in engines], port=0, probe_interval_s=0.2, eject_after=2, engine_load_period_s=0.1
        )
        plan = sessions(copies=8, max_turns=4, span_s=12.0, max_output=32)
        assert len(plan) >= 200
        with ProxyServer(config) as p:
            assert p.proxy is not None
            out = asyncio.run(_replay(p.url, plan, engines))
            page = p.proxy.telemetry
            readmit_deadline = time.monotonic() + 10
            while not page.readmissions[engines[KILLED].url] and time.monotonic() < readmit_deadline:
                time.sleep(0.05)
            # After its re-admission the restarted engine takes new sessions again.
            again = sessions(copies=1, max_turns=1, span_s=0.5, first_copy=100)
            out2 = asyncio.run(_replay(p.url, again, []))
            assert out2["failures"] == []
            back = sum(r["instance"] == engines[KILLED].url for r in out2["results"])
            stats = colocated_router(p).stats()
            settle_deadline = time.monotonic() + 5
            while colocated_router(p).stats()["in_flight"] and time.monotonic() < settle_deadline:
                time.sleep(0.05)
            in_flight = colocated_router(p).stats()["in_flight"]
            import urllib.request

            with urllib.request.urlopen(p.url + "/metrics", timeout=5) as r:
                metrics_page = r.read().decode()
        results = out["results"]
        assert out["failures"] == [], f"{len(out['failures'])} requests lost: {out['failures'][:3]}"
        assert len(results) == sum(len(s.turns) for s in plan)
        assert in_flight == 0 and stats["unknown_request_events"] == 0

        firsts = Counter(r["instance"] for r in results if r["turn"] == 1)
        share = {url: firsts[url] / sum(firsts.values()) for url in (e.url for e in engines)}
        assert min(share.values()) >= 0.08, f"first turns spread over the fleet: {share}"
        previous: dict[str, str] = {}
        home = moved = 0
        for r in sorted(results, key=lambda r: (r["session"], r["turn"])):
            if r["turn"] > 1:
                if r["instance"] == previous[r["session"]]:
                    home += 1
                else:
                    moved += 1
            previous[r["session"]] = r["instance"]
        assert home / (home + moved) >= 0.75, f"follow-ups stick: {home} home, {moved} moved"
        assert page.ejections[engines[KILLED].url] >= 1 and page.readmissions[engines[KILLED].url] >= 1
        assert metric(metrics_page, "smetric_proxy_ejections_total", instance=engines[KILLED].url) >= 1
        assert back >= 1, "the re-admitted engine gets first turns again"
        cut = sum(n for cause, n in page.retries.items() if cause != "ClientConnectorError")
        assert cut >= 1, f"the kill hit requests in flight (retries {dict(page.retries)})"
        print(
            f"\n{len(results)} requests, 0 lost; first-turn shares {[round(v, 3) for v in share.values()]}; "
            f"follow-ups home {home}/{home + moved}; retries {dict(page.retries)}; "
            f"resumed streams {page.resumed_streams}; killed at {out['killed_at']:.1f}s, back at "
            f"{out['restarted_at']:.1f}s; after re-admission it took {back}/{len(again)} new sessions"
        )
    finally:
        for e in engines:
            e.stop()
