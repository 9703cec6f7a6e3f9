"""``smetric fake-engine``'s Anthropic Messages surface with vLLM's semantics: the conversion to a
chat request and its rendering (a Messages conversation shares its cached prefix with the same
conversation sent as chat), ``cache_read_input_tokens``, the event stream, a forced tool,
``count_tokens``, Anthropic's error bodies and the PD roles. Loopback, bounded in requests."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("aiohttp")

from fake_engine_util import post

from smetric.fake_engine import FakeEngine
from smetric.fake_engine.tokens import byte_chunk_ids, render_chat

MODEL = "fake-model"
SYSTEM = "You are a careful coding agent. Follow the repository's rules. " * 8


@pytest.fixture(scope="module")
def engine() -> Iterator[FakeEngine]:
    with FakeEngine(speedup=1000.0) as fe:
        yield fe


def _events(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for block in raw.decode().split("\n\n"):
        if block:
            name, _, data = block.partition("\n")
            out.append((name.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return out


def test_a_messages_request_renders_as_its_chat_conversion_and_shares_its_cache(engine: FakeEngine) -> None:
    user = "Session one: fix the failing parser test. " * 6
    status, raw = post(
        engine.url,
        "/v1/chat/completions",
        {
            "model": MODEL,
            "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}],
            "max_tokens": 2,
        },
    )
    assert status == 200
    chat_prompt = json.loads(raw)["usage"]["prompt_tokens"]
    system = [{"type": "text", "text": "x-anthropic-billing-header: cch=1;"}, {"type": "text", "text": SYSTEM}]
    body = {"model": MODEL, "max_tokens": 3, "system": system, "messages": [{"role": "user", "content": user}]}
    status, raw = post(engine.url, "/v1/messages", body)
    doc = json.loads(raw)
    assert status == 200 and doc["type"] == "message" and doc["role"] == "assistant" and doc["id"].startswith("msg_")
    assert doc["content"] == [{"type": "text", "text": "lorem ipsum dolor "}] and doc["stop_reason"] == "max_tokens"
    usage = doc["usage"]
    prompt = byte_chunk_ids(render_chat([{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]))
    assert usage["input_tokens"] + usage["cache_read_input_tokens"] == len(prompt) == chat_prompt
    assert usage["cache_read_input_tokens"] == len(prompt) // 16 * 16, "the chat request's blocks, billing dropped"
    status, raw = post(engine.url, "/v1/messages/count_tokens", {k: v for k, v in body.items() if k != "max_tokens"})
    assert status == 200 and json.loads(raw) == {
        "input_tokens": len(prompt),
        "context_management": {"original_input_tokens": len(prompt)},
    }


def test_a_stream_has_anthropics_events_and_a_forced_tool_streams_its_input(engine: FakeEngine) -> None:
    body = {"model": MODEL, "max_tokens": 4, "stream": True, "messages": [{"role": "user", "content": "stream"}]}
    status, raw = post(engine.url, "/v1/messages", body)
    events = _events(raw)
    assert status == 200 and [n for n, _ in events] == [
        "message_start",
        "content_block_start",
        *["content_block_delta"] * 4,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert events[0][1]["message"]["usage"]["output_tokens"] == 0
    assert events[-2][1]["delta"]["stop_reason"] == "max_tokens" and events[-2][1]["usage"]["output_tokens"] == 4
    tools = [{"name": "read_file", "input_schema": {"type": "object"}}]
    body |= {"tools": tools, "tool_choice": {"type": "any"}, "max_tokens": 3}
    events = _events(post(engine.url, "/v1/messages", body)[1])
    start = events[1][1]["content_block"]
    assert start["type"] == "tool_use" and start["name"] == "read_file" and start["input"] == {}
    partial = "".join(e["delta"]["partial_json"] for n, e in events if n == "content_block_delta")
    assert json.loads(partial) == {"text": "lorem ipsum dolor "}


def test_errors_are_anthropics(engine: FakeEngine) -> None:
    for body, status, kind in [
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}]}, 400, "invalid_request_error"),
        ({"model": "other", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}]}, 404, "not_found_error"),
        (
            {"model": MODEL, "max_tokens": 10**6, "messages": [{"role": "user", "content": "x"}]},
            400,
            "invalid_request_error",
        ),
    ]:
        got, raw = post(engine.url, "/v1/messages", body)
        doc = json.loads(raw)
        assert got == status and doc["type"] == "error" and doc["error"]["type"] == kind and doc["error"]["message"]


def test_a_messages_request_follows_vllms_pd_protocol() -> None:
    with FakeEngine(speedup=1000.0, role="prefill") as p, FakeEngine(speedup=1000.0, role="decode") as d:
        body = {"model": MODEL, "max_tokens": 3, "messages": [{"role": "user", "content": "pd " * 200}]}
        prefill = body | {"max_tokens": 1, "kv_transfer_params": {"do_remote_decode": True}}
        status, raw = post(p.url, "/v1/messages", prefill)
        params = json.loads(raw)["kv_transfer_params"]
        assert status == 200 and params
        status, raw = post(d.url, "/v1/messages", body | {"kv_transfer_params": params})
        usage = json.loads(raw)["usage"]
        assert status == 200 and usage["cache_read_input_tokens"] > 0, "the decode engine pulled the prefill's KV"
