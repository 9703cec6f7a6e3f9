"""One real engine SIGKILLed under load behind ``smetric serve``, then restarted.

Sessions run back to back through the proxy, streamed and not; once a third of their requests
are done, engine 1 and its workers are SIGKILLed. Every request must still complete (the proxy
retries what failed before its first byte and continues cut streams on the other engine): 0 lost.
The engine is then restarted on the same ports and publisher: the proxy must re-admit it (its
``/health`` probe) and rebuild its part of the index from the new engine's events — new sessions
land on it again, and their follow-ups' predicted hits equal its ``cached_tokens``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from conversations import SHAPES, Conversation
from real_util import Fleet, Serve, metric_sum, wait_until
from sessions import Record, mark_stored, run_session

pytestmark = pytest.mark.vllm_real

MODES = (("chat", False), ("chat", True), ("completions", False), ("completions", True))


@pytest.fixture
def serve(vllm_fleet: Fleet, tmp_path: Path) -> Iterator[Serve]:
    proxy = Serve(vllm_fleet.urls, log=tmp_path / "serve.log").wait_ready()
    try:
        yield proxy
    finally:
        err = proxy.stop()
    assert "Traceback" not in err, err[-3000:]


def test_a_killed_engine_loses_nothing_and_comes_back(serve: Serve, vllm_fleet: Fleet) -> None:
    victim = vllm_fleet.engines[1]
    sessions, turns = 48, 4
    done = 0

    async def chaos() -> None:
        while done < sessions * turns // 3:
            await asyncio.sleep(0.01)
        await asyncio.to_thread(victim.kill)

    async def load() -> list[Record]:
        nonlocal done
        out: list[Record] = []
        gate = asyncio.Semaphore(8)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as client:

            async def one(i: int) -> None:
                nonlocal done
                endpoint, stream = MODES[i % len(MODES)]
                conv = Conversation(SHAPES[i % len(SHAPES)], seed=9000 + i)
                async with gate:
                    records = await run_session(
                        client, serve.url, conv, turns=turns, endpoint=endpoint, stream=stream, max_tokens=48
                    )
                out.extend(records)
                done += len(records)

            results = await asyncio.gather(chaos(), *(one(i) for i in range(sessions)), return_exceptions=True)
        lost = [r for r in results if isinstance(r, BaseException)]
        assert not lost, lost[:3]
        return out

    records = asyncio.run(load())
    assert len(records) == sessions * turns
    assert victim.proc is not None and victim.proc.returncode is not None, "the engine was not killed"
    assert metric_sum(serve.metrics(), "smetric_proxy_instance_ejected", instance=victim.url) == 1

    victim.start()
    victim.wait_ready()
    assert wait_until(
        lambda: metric_sum(serve.metrics(), "smetric_proxy_instance_ejected", instance=victim.url) == 0,
        timeout=30,
        interval=0.1,
    ), "the restarted engine was not re-admitted"

    async def after() -> list[Record]:
        out: list[Record] = []
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as client:
            await mark_stored(client, serve.url, vllm_fleet.urls)
            for i in range(8):
                conv = Conversation(SHAPES[i % len(SHAPES)], seed=9500 + i)
                out += await run_session(client, serve.url, conv, turns=3, paced=True)
        return out

    again = asyncio.run(after())
    on_victim = [r for r in again if r.instance == victim.url]
    assert any(r.turn == 1 for r in on_victim), "no new session on the restarted engine"
    follow = [r for r in on_victim if r.turn > 1]
    assert follow, on_victim
    wrong = [r for r in follow if not r.predicted == r.cached > 0]
    assert not wrong, wrong
