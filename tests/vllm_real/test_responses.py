"""``/v1/responses`` through ``smetric serve`` in front of two real CPU vLLM engines.

* Codex's mode (``store: false``, the whole history every turn, tools, function-call items):
  each follow-up is routed to its session's home and the proxy's predicted local hit equals the
  engine's own ``input_tokens_details.cached_tokens`` — the check that the proxy renders input
  items as vLLM does (paced: a follow-up waits until the proxy's feed holds its predecessor's
  blocks, as in ``test_proxy_oracle.py``).
* Stored responses (the engines run with ``VLLM_ENABLE_RESPONSES_API_STORE=1``): a
  ``previous_response_id`` chain, streamed and not, stays on the instance that stored it, and
  ``GET`` finds the stored response through the proxy.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from real_util import Fleet, Serve, decision, fleet
from sessions import Record, _wait_for_blocks, mark_stored

pytestmark = pytest.mark.vllm_real

TOOLS = [
    {
        "type": "function",
        "name": "run_shell",
        "description": "Run a shell command.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
    }
]


async def _create(client: aiohttp.ClientSession, base: str, body: dict[str, Any]) -> tuple[dict[str, str], Any]:
    async with client.post(base + "/v1/responses", json={"model": fleet.MODEL_NAME, **body}) as r:
        raw = await r.read()
        assert r.status == 200, raw[:500]
        return decision(r.headers["x-smetric-decision"]), json.loads(raw)


def _text(answer: dict[str, Any]) -> str:
    return "".join(c.get("text", "") for item in answer["output"] if item["type"] == "message" for c in item["content"])


def test_codex_mode_follow_ups_are_sticky_and_predicted_exactly(vllm_fleet: Fleet, tmp_path: Path) -> None:
    serve = Serve(vllm_fleet.urls, log=tmp_path / "serve.log").wait_ready()
    records: list[tuple[dict[str, str], int]] = []
    try:

        async def main() -> None:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as client:
                await mark_stored(client, serve.url, vllm_fleet.urls)
                for s in range(4):
                    items: list[dict[str, Any]] = [
                        {"role": "user", "content": f"Session {s}: fix the parser. " + "context line. " * (40 + 9 * s)}
                    ]
                    home = None
                    for turn in range(3):
                        body = {
                            "instructions": "You are a coding agent.",
                            "input": items,
                            "tools": TOOLS,
                            "store": False,
                            "max_output_tokens": 8,
                        }
                        d, answer = await _create(client, serve.url, body)
                        usage = answer["usage"]
                        records.append((d, usage["input_tokens_details"]["cached_tokens"]))
                        if turn == 0:
                            home = d["instance"]
                        else:
                            assert d["instance"] == home, d
                        rec = Record(
                            f"s{s}", turn + 1, "responses", False, d["instance"], d["reason"],
                            int(d["local_hit_tokens"]), usage["input_tokens_details"]["cached_tokens"],
                            usage["input_tokens"], usage["output_tokens"], 0.0,
                        )  # fmt: skip
                        await _wait_for_blocks(client, serve.url, rec)
                        call = {"call_id": f"call_{s}_{turn}", "name": "run_shell"}
                        said = [{"type": "output_text", "text": _text(answer)}]
                        items += [
                            {"type": "message", "role": "assistant", "content": said},
                            {"type": "function_call", **call, "arguments": '{"command": "ls"}'},
                            {"type": "function_call_output", "call_id": call["call_id"], "output": "parser.py " * 5},
                            {"role": "user", "content": f"Now step {turn + 2}."},
                        ]

        asyncio.run(main())
    finally:
        err = serve.stop()
    assert "Traceback" not in err, err[-3000:]
    follow = [(d, cached) for d, cached in records if d["first_turn"] == "0"]
    assert len(follow) == 8
    assert all(d["reason"] == "sticky" for d, _ in follow), follow
    assert all(int(d["local_hit_tokens"]) == cached > 0 for d, cached in follow), follow
    assert {d["instance"] for d, _ in records if d["first_turn"] == "1"} == set(vllm_fleet.urls)


def test_a_stored_chain_stays_on_the_instance_that_stored_it(vllm_fleet: Fleet, tmp_path: Path) -> None:
    serve = Serve(vllm_fleet.urls, log=tmp_path / "serve.log").wait_ready()
    try:

        async def main() -> None:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as client:
                for s in range(2):
                    d, first = await _create(client, serve.url, {"input": f"chain {s} " * 60, "max_output_tokens": 4})
                    home, previous = d["instance"], first["id"]
                    for turn in range(3):
                        body = {"input": f"turn {turn}", "previous_response_id": previous, "max_output_tokens": 4}
                        if turn == 1:  # streamed: the events carry the proxy's ids too
                            async with client.post(
                                serve.url + "/v1/responses", json={"model": fleet.MODEL_NAME, **body, "stream": True}
                            ) as r:
                                raw = (await r.read()).decode()
                                assert r.status == 200, raw[:500]
                                assert decision(r.headers["x-smetric-decision"])["instance"] == home
                            last = json.loads(raw.strip().split("\n\n")[-1].partition("data: ")[2])
                            assert last["type"] in ("response.completed", "response.incomplete"), last
                            previous = last["response"]["id"]
                        else:
                            d, answer = await _create(client, serve.url, body)
                            assert d["instance"] == home and answer["previous_response_id"] == previous
                            assert answer["usage"]["input_tokens_details"]["cached_tokens"] > 0
                            previous = answer["id"]
                    async with client.get(f"{serve.url}/v1/responses/{previous}") as r:
                        assert r.status == 200 and (await r.json())["id"] == previous

        asyncio.run(main())
    finally:
        err = serve.stop()
    assert "Traceback" not in err, err[-3000:]
