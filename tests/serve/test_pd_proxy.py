"""``smetric serve --prefill … --decode …``: vLLM's disaggregated-prefill protocol through the
proxy, against fake engines in the prefill and decode roles. The end-to-end test replays agent
sessions over 2 prefill + 2 decode engine processes and SIGKILLs one decode engine mid-run."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from agent_replay import sessions
from proxy_util import FakeEngineProcess, pd_router, request

from smetric.fake_engine import FakeEngine
from smetric.serve.backends.pd import REMOTE_DECODE_PARAMS, decode_body, prefill_body
from smetric.serve.config import load_config
from smetric.serve.proxy import ProxyServer


def decision(headers: dict[str, str]) -> dict[str, str]:
    return {k: v.strip('"') for k, _, v in (p.partition("=") for p in headers["x-smetric-decision"].split("; "))}


def test_the_prefill_and_decode_bodies_follow_vllms_proxy() -> None:
    body = {"messages": [], "stream": True, "stream_options": {"include_usage": True}, "max_completion_tokens": 50}
    body |= {"min_tokens": 3}
    p = json.loads(prefill_body(body))
    assert p["kv_transfer_params"] == REMOTE_DECODE_PARAMS
    assert (p["stream"], p["max_tokens"], p["max_completion_tokens"]) == (False, 1, 1)
    assert "stream_options" not in p and "min_tokens" not in p
    d = json.loads(decode_body(body, {"do_remote_prefill": True, "remote_host": "h"}))
    assert d == {**body, "kv_transfer_params": {"do_remote_prefill": True, "remote_host": "h"}}


def test_requests_go_prefill_then_decode_and_follow_ups_return_to_their_prefill_instance() -> None:
    ps = [FakeEngine(port=0, role="prefill", speedup=1000).start() for _ in range(2)]
    ds = [FakeEngine(port=0, role="decode", speedup=1000).start() for _ in range(2)]
    cfg = load_config(prefill=[e.url for e in ps], decode=[e.url for e in ds], port=0, engine_load=False)
    try:
        with ProxyServer(cfg) as proxy:
            homes = {}
            system = {"role": "system", "content": "agent " * 300}
            for s in range(4):
                msgs = [system, {"role": "user", "content": f"task {s} " * 80}]
                status, h, body = request(proxy.url, "/v1/chat/completions", {"messages": msgs, "max_tokens": 4})
                assert status == 200, body
                d = decision(h)
                assert d["instance"] in [e.url for e in ds] and d["prefill"] in [e.url for e in ps]
                assert json.loads(body)["usage"]["prompt_tokens_details"]["cached_tokens"] > 0, "decode pulled KV"
                homes[s] = d["prefill"]
            # smetric's v2 rule sends a first turn to the least queued + own work: on an idle pool
            # the instance that already holds the shared system prompt has the least own work.
            assert len(set(homes.values())) == 1, "idle first turns go where the system prompt is cached"
            for s in range(4):
                msgs = [
                    system,
                    {"role": "user", "content": f"task {s} " * 80},
                    {"role": "assistant", "content": "ok"},
                    {"role": "user", "content": "more " * 40},
                ]
                body = {"messages": msgs, "max_tokens": 4, "stream": True}
                status, h, raw = request(proxy.url, "/v1/chat/completions", body)
                assert status == 200 and raw.rstrip().endswith(b"data: [DONE]")
                d = decision(h)
                assert d["prefill"] == homes[s] and d["reason"] == "sticky" and int(d["local_hit_tokens"]) > 0
            stats = pd_router(proxy).stats()
            assert stats["in_flight"] == 0
            held = [e.call(lambda e=e: e.stack.engine.cache.used_blocks if e.stack else -1) for e in ps]
            assert held == [0, 0], "every prefill's KV lease was read"
    finally:
        for e in ps + ds:
            e.stop()


@pytest.mark.slow
def test_pd_agent_sessions_survive_a_killed_decode_engine(tmp_path: Path) -> None:
    def engine(role: str) -> FakeEngineProcess:
        return FakeEngineProcess(tmp_path, "--role", role, "--speedup", "4", "--num-gpu-blocks", "8192")

    prefill = [engine("prefill") for _ in range(2)]
    decode = [engine("decode") for _ in range(2)]
    try:
        for e in prefill + decode:
            e.start_up()
        cfg = load_config(
            prefill=[e.url for e in prefill],
            decode=[e.url for e in decode],
            port=0,
            probe_interval_s=0.2,
            eject_after=2,
        )
        plan = sessions(copies=4, max_turns=3, span_s=6.0, max_output=24)
        failures: list[str] = []
        results: list[dict[str, Any]] = []

        async def replay(base: str) -> None:
            done = 0
            total = sum(len(s.turns) for s in plan)
            t0 = time.monotonic()

            async def one(client: aiohttp.ClientSession, index: int) -> None:
                nonlocal done
                for k, turn in enumerate(plan[index].turns):
                    delay = t0 + turn.at_s - time.monotonic()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    stream = (index + k) % 2 == 0
                    body = {"messages": turn.messages, "max_tokens": turn.max_tokens, "stream": stream}
                    async with client.post(base + "/v1/chat/completions", json=body) as r:
                        data = await r.read()
                        ok = r.status == 200 and (
                            data.rstrip().endswith(b"data: [DONE]") and b'"error"' not in data
                            if stream
                            else bool(json.loads(data).get("choices"))
                        )
                        if not ok:
                            failures.append(f"{plan[index].key}/{k + 1}: {r.status} {data[-160:]!r}")
                        results.append({"turn": k + 1, **decision(dict(r.headers))} if ok else {})
                    done += 1

            async def chaos() -> None:
                while done < total * 0.3:
                    await asyncio.sleep(0.05)
                decode[1].kill()  # SIGKILL mid-run

            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as client:
                await asyncio.gather(chaos(), *(one(client, i) for i in range(len(plan))))

        with ProxyServer(cfg) as proxy:
            asyncio.run(replay(proxy.url))
            retries = dict(proxy.proxy.telemetry.retries)
            # The prober may eject the dead engine before any request reaches it: then no retry.
            ejected = proxy.proxy.fleet.ejected(decode[1].url)
            deadline = time.monotonic() + 5
            while pd_router(proxy).stats()["in_flight"] and time.monotonic() < deadline:
                time.sleep(0.05)
            in_flight = pd_router(proxy).stats()["in_flight"]
        assert failures == [], f"{len(failures)} lost: {failures[:3]}"
        assert in_flight == 0
        firsts = Counter(r["prefill"] for r in results if r.get("turn") == 1)
        assert len(firsts) == 2 and min(firsts.values()) >= len(plan) // 5, firsts
        assert sum(retries.values()) >= 1 or ejected, "the kill was noticed: a retry, or the prober's ejection"
        print(f"\nPD: {len(results)} requests, 0 lost; first turns per prefill {dict(firsts)}; retries {retries}")
    finally:
        for e in prefill + decode:
            e.stop()
