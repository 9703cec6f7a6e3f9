"""``POST /v1/messages`` through ``smetric serve`` in front of two real CPU vLLM engines, with the
engines' own ``cache_read_input_tokens`` as the oracle: for every follow-up the predicted local hit
in ``x-smetric-decision`` must equal what the engine read from its cache, i.e. the proxy renders an
Anthropic request exactly as vLLM converts and renders it.

Claude Code's shape: system blocks led by a per-request ``x-anthropic-billing-header`` block
(vLLM drops it), tools, an assistant turn with a ``tool_use`` block and its ``tool_result``, and
the engine's own answer blocks appended as the next turn's history; streamed and not, paced as
``test_proxy_oracle.py``'s paced sessions (each follow-up waits until the proxy's feed counted
the blocks its predecessor stored).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from real_util import Fleet, Serve, decision, fleet
from sessions import Record, _wait_for_blocks, mark_stored

from smetric.anthropic import to_chat

pytestmark = pytest.mark.vllm_real

TOOLS = [
    {
        "name": "read_file",
        "description": "Reads a file of the repository.",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    }
]


VLLM_CONVERSION = """
import json, sys
from vllm.entrypoints.anthropic.protocol import AnthropicMessagesRequest
from vllm.entrypoints.anthropic.serving import AnthropicServingMessages
out = []
for body, merge in json.load(sys.stdin):
    req = AnthropicServingMessages.to_chat_completion_request(
        AnthropicMessagesRequest.model_validate(body), merge_inline_system=merge
    )
    tools = None if req.tools is None else [t.model_dump() for t in req.tools]
    out.append({"messages": req.messages, "tools": tools, "reasoning_effort": req.reasoning_effort})
json.dump(out, sys.stdout)
"""
"""Runs vLLM's own conversion in the vLLM venv (no engine): body, merge_inline_system → chat request."""


def _bodies() -> list[tuple[dict[str, Any], bool]]:
    """Every block kind, system as a string and as blocks, inline system messages, tools with and
    without their optional fields, thinking disabled and an output effort."""
    history: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": "list"}, {"type": "text", "text": ""}]},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "use ls", "signature": "s"},
                {"type": "redacted_thinking", "data": "x"},
                {"type": "text", "text": "Listing."},
                {"type": "tool_use", "id": "toolu_1", "name": "ls", "input": {"dir": ".", "n": [1, 2]}},
                {"type": "tool_use", "id": "toolu_2", "name": "ls", "input": {}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_1",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                },
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_2",
                    "content": [{"type": "image", "source": {"type": "url", "url": "http://x/i.png"}}],
                },
                {"type": "text", "text": "now read it"},
            ],
        },
        {
            "role": "system",
            "content": [
                {"type": "text", "text": "x-anthropic-billing-header: z"},
                {"type": "text", "text": "be brief"},
            ],
        },
        {"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "odd"}]},
        {"role": "user", "content": "plain"},
    ]
    tools = [
        {"name": "ls", "input_schema": {"properties": {}}},
        {"name": "rm", "description": "removes", "input_schema": {"type": "object"}, "strict": True},
    ]
    base = {"model": "m", "max_tokens": 5, "messages": history, "tools": tools}
    return [
        ({**base, "system": "You are an agent."}, False),
        (
            {
                **base,
                "system": [{"type": "text", "text": "x-anthropic-billing-header: y"}, {"type": "text", "text": "A"}],
            },
            True,
        ),
        ({**base, "thinking": {"type": "disabled"}, "tool_choice": {"type": "any"}}, False),
        ({**base, "output_config": {"effort": "high"}, "tools": None}, False),
    ]


def test_the_conversion_is_vllms_own() -> None:
    venv = Path(os.environ.get("SMETRIC_VLLM_VENV") or fleet.VENV)
    if fleet.why_not_ready(venv) is not None:
        pytest.skip(str(fleet.why_not_ready(venv)))
    bodies = _bodies()
    run = subprocess.run(
        [str(fleet.venv_python(venv)), "-c", VLLM_CONVERSION],
        input=json.dumps(bodies),
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    for (body, merge), theirs in zip(bodies, json.loads(run.stdout), strict=True):
        mine = to_chat(body, merge_inline_system=merge)
        assert mine.messages == theirs["messages"]
        assert mine.tools == theirs["tools"]
        assert (mine.chat_template_kwargs or {}).get("reasoning_effort") == theirs["reasoning_effort"]


@pytest.fixture(scope="module")
def serve(vllm_fleet: Fleet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    log = Path(tmp_path_factory.mktemp("serve_messages")) / "serve.log"
    proxy = Serve(vllm_fleet.urls, log=log).wait_ready()
    try:
        yield proxy
    finally:
        err = proxy.stop()
    assert "Traceback" not in err, err[-3000:]


def _system(i: int) -> list[dict[str, Any]]:
    return [
        {"type": "text", "text": f"x-anthropic-billing-header: cc_version=2.0; cch={i}{time.monotonic_ns()};"},
        {"type": "text", "text": f"You are agent {i}, a careful coding agent. Read before you edit. " * 12},
    ]


async def _post(
    client: aiohttp.ClientSession, base: str, body: dict[str, Any]
) -> tuple[dict[str, str], dict[str, Any]]:
    """The decision and the whole message (a stream's events folded into one)."""
    async with client.post(base + "/v1/messages", json=body, headers={"anthropic-version": "2023-06-01"}) as r:
        raw = await r.read()
        assert r.status == 200, raw[:500]
        d = decision(r.headers["x-smetric-decision"])
    if not body.get("stream"):
        return d, json.loads(raw)
    message: dict[str, Any] = {}
    for block in raw.decode().split("\n\n"):
        if not block.strip():
            continue
        name, _, data = block.partition("\n")
        doc = json.loads(data.removeprefix("data: "))
        kind = name.removeprefix("event: ")
        if kind == "message_start":
            message = doc["message"]
        elif kind == "content_block_start":
            message["content"].append(doc["content_block"])
        elif kind == "content_block_delta":
            delta, target = doc["delta"], message["content"][doc["index"]]
            if delta["type"] == "text_delta":
                target["text"] += delta["text"]
            elif delta["type"] == "thinking_delta":
                target["thinking"] += delta["thinking"]
            elif delta["type"] == "input_json_delta":
                target["partial"] = target.get("partial", "") + delta["partial_json"]
        elif kind == "message_delta":
            message["usage"] = {**message.get("usage", {}), **doc["usage"]}
        assert kind != "error", doc
    for block in message["content"]:
        if "partial" in block:
            block["input"] = json.loads(block.pop("partial") or "{}")
    return d, message


def test_paced_messages_follow_ups_predict_the_engines_cache_read_tokens(serve: Serve, vllm_fleet: Fleet) -> None:
    async def main() -> list[Record]:
        out: list[Record] = []
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as client:
            await mark_stored(client, serve.url, vllm_fleet.urls)
            for i in range(8):
                history: list[dict[str, Any]] = [
                    {"role": "user", "content": f"Session {i}: the parser drops the last token. " * 8},
                    {
                        "role": "assistant",
                        "content": [
                            {"type": "text", "text": "Let me read the parser."},
                            {"type": "tool_use", "id": f"toolu_{i}", "name": "read_file", "input": {"path": "p.py"}},
                        ],
                    },
                    {
                        "role": "user",
                        "content": [
                            {"type": "tool_result", "tool_use_id": f"toolu_{i}", "content": "def parse(s): ...\n" * 10}
                        ],
                    },
                ]
                for turn in range(1, 4):
                    body = {
                        "model": fleet.MODEL_NAME,
                        "max_tokens": 4,
                        "system": _system(i),
                        "messages": history,
                        "tools": TOOLS,
                        "stream": (i + turn) % 2 == 1,
                    }
                    d, message = await _post(client, serve.url, body)
                    usage = message["usage"]
                    cached = usage.get("cache_read_input_tokens") or 0
                    prompt = usage["input_tokens"] + cached + (usage.get("cache_creation_input_tokens") or 0)
                    rec = Record(
                        session=str(i),
                        turn=turn,
                        endpoint="messages",
                        stream=body["stream"],
                        instance=d["instance"],
                        reason=d["reason"],
                        predicted=int(d["local_hit_tokens"]),
                        cached=cached,
                        prompt_tokens=prompt,
                        completion_tokens=usage["output_tokens"],
                        gap_ms=0.0,
                    )
                    out.append(rec)
                    await _wait_for_blocks(client, serve.url, rec)
                    history = [
                        *history,
                        {"role": "assistant", "content": message["content"]},
                        {"role": "user", "content": f"Turn {turn}: now fix it and run the tests. " * 4},
                    ]
        return out

    records = asyncio.run(main())
    follow = [r for r in records if r.turn > 1]
    exact = sum(r.predicted == r.cached for r in follow)
    print(f"messages paced: {len(follow)} follow-ups, exact {exact}; streams {sum(r.stream for r in follow)}")
    assert {r.instance for r in records if r.turn == 1} == set(vllm_fleet.urls), "first turns on one engine"
    assert all(r.reason == "sticky" for r in follow), [(r.session, r.turn, r.reason) for r in follow]
    assert [r for r in follow if r.predicted != r.cached] == []
    assert all(r.cached > 0 for r in follow)
