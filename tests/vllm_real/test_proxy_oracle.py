"""``smetric serve`` in front of two real CPU vLLM engines, the engines' own numbers as the oracle.

The proxy runs as a subprocess with the repository's test tokenizer and block size 32 (the
engines'), discovers each engine's KV-event publisher (``GET /kv_event_sources``: an ``ipc://``
PUB the engine binds, a TCP replay ROUTER) and routes chat and text completions, streamed and
not, with and without tools. For every follow-up the predicted local hit in ``x-smetric-decision``
must equal the ``usage.prompt_tokens_details.cached_tokens`` the engine reports for that request.

* paced: each follow-up waits until the proxy's feed has counted the blocks the engine stored for
  its predecessor (``sessions._wait_for_blocks``) — what the index can know, it must know exactly;
* back to back: ≥ 500 follow-ups, each sent the moment its predecessor's answer is in, as an agent
  sends the next turn when a tool returns. vLLM publishes KV events after the step that stored the
  blocks (here p99 ≈ 0.25 s), so the answer can arrive before the proxy's index has its blocks.
  Until the index counts blocks it has sent as present (issue 20 item 3), such a follow-up is
  under-predicted, or decided "migrate (local KV$ evicted)" and moved off its cache.
"""

from __future__ import annotations

import asyncio
import statistics
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from conversations import SHAPES, Conversation
from real_util import Fleet, Serve, fleet
from sessions import Record, mark_stored, run_session

pytestmark = pytest.mark.vllm_real

BS = fleet.BLOCK_SIZE
# (endpoint, stream) of the sessions, round-robin with the shapes.
MODES = (("chat", False), ("chat", True), ("completions", False), ("completions", True))


@pytest.fixture(scope="module")
def serve(vllm_fleet: Fleet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    log = Path(tmp_path_factory.mktemp("serve")) / "serve.log"
    proxy = Serve(vllm_fleet.urls, log=log).wait_ready()
    try:
        yield proxy
    finally:
        err = proxy.stop()
    assert "Traceback" not in err, err[-3000:]


def _summary(name: str, records: list[Record]) -> str:
    follow = [r for r in records if r.turn > 1]
    exact = sum(r.predicted == r.cached for r in follow)
    under = sum(r.predicted < r.cached for r in follow)
    over = sum(r.predicted > r.cached for r in follow)
    reasons = Counter(r.reason for r in follow)
    by_turn = {(r.session, r.turn): r for r in records}
    moved = sum(r.instance != by_turn[(r.session, r.turn - 1)].instance for r in follow)
    # Under-predicted by the predecessor's answer only: the index had every full block of the
    # predecessor's prompt (what the router sent), not yet the blocks the engine filled while decoding.
    answer_only = sum(
        r.predicted < r.cached and r.predicted >= by_turn[(r.session, r.turn - 1)].prompt_tokens // BS * BS
        for r in follow
    )
    gaps = sorted(r.gap_ms for r in follow)
    within_1ms = sum(g <= 1.0 for g in gaps)
    return (
        f"{name}: {len(follow)} follow-ups, exact {exact} ({exact / len(follow):.1%}), under {under} "
        f"(of which only the predecessor's answer blocks {answer_only}), over {over}; "
        f"reasons {dict(reasons)}, moved off their instance {moved}; "
        f"gap p50 {statistics.median(gaps):.2f} ms, max {gaps[-1]:.2f} ms, ≤ 1 ms: {within_1ms}"
    )


def test_paced_follow_ups_predict_the_engines_cached_tokens(serve: Serve, vllm_fleet: Fleet) -> None:
    async def main() -> list[Record]:
        out: list[Record] = []
        timeout = aiohttp.ClientTimeout(total=120)
        async with aiohttp.ClientSession(timeout=timeout) as client:
            await mark_stored(client, serve.url, vllm_fleet.urls)
            for i in range(2 * len(SHAPES) * len(MODES) // 2):
                shape = SHAPES[i % len(SHAPES)]
                endpoint, stream = MODES[(i // len(SHAPES) + i) % len(MODES)]
                conv = Conversation(shape, seed=1000 + i)
                out += await run_session(client, serve.url, conv, turns=4, endpoint=endpoint, stream=stream, paced=True)
        return out

    records = asyncio.run(main())
    print(_summary("paced", records))
    follow = [r for r in records if r.turn > 1]
    assert {(r.endpoint, r.stream) for r in records} == set(MODES)
    assert {r.instance for r in records if r.turn == 1} == set(vllm_fleet.urls), "first turns on one engine"
    wrong = [r for r in follow if r.predicted != r.cached]
    assert len(wrong) <= len(follow) // 100, wrong
    assert all(r.reason == "sticky" for r in follow), Counter(r.reason for r in follow)
    assert all(r.cached > 0 for r in follow)


def test_back_to_back_follow_ups_keep_their_cache(serve: Serve, vllm_fleet: Fleet) -> None:
    # One output token: the answer leaves right after the prefill step, whose KV events race it (a tool
    # call's turn is short too), and the engine computes no KV for the sampled token, so the follow-up's
    # cached prefix is exactly the blocks the router sent with its predecessor.
    sessions, turns, concurrency = 100, 6, 8

    async def main() -> list[Record]:
        out: list[Record] = []
        gate = asyncio.Semaphore(concurrency)
        timeout = aiohttp.ClientTimeout(total=300)
        async with aiohttp.ClientSession(timeout=timeout) as client:

            async def one(i: int) -> None:
                endpoint, stream = MODES[i % len(MODES)]
                conv = Conversation(SHAPES[(i // len(MODES)) % len(SHAPES)], seed=5000 + i)
                async with gate:
                    out.extend(
                        await run_session(
                            client, serve.url, conv, turns=turns, endpoint=endpoint, stream=stream, max_tokens=1
                        )
                    )

            await asyncio.gather(*(one(i) for i in range(sessions)))
        return out

    records = asyncio.run(main())
    summary = _summary("back to back", records)
    print(summary)
    follow = [r for r in records if r.turn > 1]
    assert len(follow) >= 500
    mis_migrated = [r for r in follow if r.reason == "migrated-evicted"]
    exact = sum(r.predicted == r.cached for r in follow)
    assert not mis_migrated, summary
    assert exact >= 0.99 * len(follow), summary
