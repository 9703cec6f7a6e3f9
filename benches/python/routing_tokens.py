"""What it costs to turn a request body into routing token ids (``smetric.serve``, issue 11).

Usage: ``python benches/python/routing_tokens.py [--tokens 32768] [--repeat 30]``.

Builds an agent session — a system prompt, a tool definition, then rounds of user message,
assistant tool call and long tool result — until the conversation holds about ``--tokens`` tokens
of the test tokenizer (``tests/data/serve/tokenizer.json``, a 2,000-id byte-level BPE, so
about 3 bytes a token; a production vocabulary packs 3.5-4.5), and times, as the median of
``--repeat`` runs:

* ``parse_request`` of the chat body, and of a completions body with the same number of ids
  (against ``json.loads`` plus ``array('I', list)``, the plain-Python way);
* the chat template's render (Jinja, vLLM's steps);
* tokenizer mode, first turn (empty piece cache) and follow-up (the same history plus one new
  tool result of about 1K tokens), against one whole-text ``Tokenizer.encode``;
* approximate mode (render with plain ChatML + 4-byte chunks);
* the same conversation as an Anthropic Messages body (``POST /v1/messages``: system, tool_use
  and tool_result blocks): its parse and conversion to vLLM's chat request, the render of the
  converted request (the issue-19 budget: conversion + render ≤ 0.5 ms, BPE excluded), and
  approximate mode end to end;
* the compiled data plane's native path, from the body's bytes to the approximate ids, for the
  chat and the Messages body (``smetric._core.gateway_routing_ids``, Rust).

No assertion: it prints figures (docs/routing-tokens.md quotes them).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from array import array
from collections.abc import Callable
from pathlib import Path
from typing import Any

from smetric._core import gateway_routing_ids
from smetric.anthropic import to_chat
from smetric.serve.apis.messages import MessagesApi
from smetric.serve.request import OpenAIRequest, parse_request
from smetric.serve.tokens import TokenConfig, TokenSource

ROOT = Path(__file__).resolve().parents[2]
TOKENIZER = ROOT / "tests" / "data" / "serve" / "tokenizer.json"
TOOL = {
    "type": "function",
    "function": {
        "name": "run_shell",
        "description": "Run a shell command in the repository and return its output.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
    },
}


def corpus() -> list[str]:
    """Paragraphs of the repository's docs: realistic text for the test vocabulary."""
    text = "\n".join(p.read_text(encoding="utf-8") for p in sorted((ROOT / "docs").glob("*.md")))
    return [p for p in text.split("\n\n") if p.strip()]


def session(target_tokens: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """A conversation of about ``target_tokens`` tokens, and the next tool result to append."""
    paragraphs = corpus()
    cursor = 0

    def take(chars: int) -> str:
        nonlocal cursor
        out = []
        while sum(map(len, out)) < chars:
            out.append(paragraphs[cursor % len(paragraphs)])
            cursor += 1
        return "\n\n".join(out)

    messages: list[dict[str, Any]] = [{"role": "system", "content": take(6000)}]
    turn = 0
    while sum(len(str(m.get("content", ""))) for m in messages) < target_tokens * 2.55:
        messages.append({"role": "user", "content": f"Step {turn}: " + take(300)})
        call = {
            "id": f"call_{turn}",
            "type": "function",
            "function": {"name": "run_shell", "arguments": json.dumps({"command": f"grep -n step{turn} docs/*.md"})},
        }
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"call_{turn}", "content": take(4000)})
        turn += 1
    next_result = {"role": "tool", "tool_call_id": "call_next", "content": take(3000)}
    return messages, next_result


def as_messages(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The chat session as the Anthropic Messages body Claude Code would send for it: each tool
    call a ``tool_use`` block, each tool result a ``tool_result`` block of a user message."""
    out: list[dict[str, Any]] = []
    for m in messages[1:]:
        if m["role"] == "assistant":
            call = m["tool_calls"][0]
            arguments = json.loads(call["function"]["arguments"])
            block = {"type": "tool_use", "id": call["id"], "name": "run_shell", "input": arguments}
            out.append({"role": "assistant", "content": [block]})
        elif m["role"] == "tool":
            result = {"type": "tool_result", "tool_use_id": m["tool_call_id"], "content": m["content"]}
            out.append({"role": "user", "content": [result]})
        else:
            out.append({"role": "user", "content": [{"type": "text", "text": m["content"]}]})
    function = TOOL["function"]
    assert isinstance(function, dict)
    tool = {"name": "run_shell", "description": function["description"], "input_schema": function["parameters"]}
    return {"model": "m", "max_tokens": 256, "system": messages[0]["content"], "messages": out, "tools": [tool]}


CHAT_PATH = "/v1/chat/completions"
MESSAGES_PATH = "/v1/messages"


def native(path: str, raw: bytes) -> tuple[bytes, bool | None]:
    """The compiled data plane's routing ids of a body, as bytes (asserting that it routes it)."""
    planned = gateway_routing_ids(path, raw)
    assert planned is not None, f"the native path hands this {path} body to the app"
    return planned


def median_us(fn: Callable[[], object], repeat: int) -> float:
    fn()
    samples = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=32_768)
    parser.add_argument("--repeat", type=int, default=30)
    args = parser.parse_args()

    messages, next_result = session(args.tokens)
    body = json.dumps({"model": "m", "messages": messages, "tools": [TOOL], "stream": True}).encode()
    follow_body = json.dumps({"model": "m", "messages": [*messages, next_result], "tools": [TOOL]}).encode()
    first = parse_request(body, "chat")
    follow = parse_request(follow_body, "chat")
    short = [*messages, {"role": "user", "content": "Go on with the next step, please."}]
    short_follow = parse_request(json.dumps({"model": "m", "messages": short, "tools": [TOOL]}).encode(), "chat")

    def fresh_source() -> TokenSource:
        return TokenSource(TokenConfig(tokenizer=str(TOKENIZER)))

    source = fresh_source()
    assert source.encoder is not None and source.encoder.exact_pieces
    n_tokens = source.routing_tokens(first).count
    rows: list[tuple[str, float]] = []

    rows.append(
        (
            f"parse_request, chat body ({len(body) / 1e3:.0f} KB)",
            median_us(lambda: parse_request(body, "chat"), args.repeat),
        )
    )
    ids_body = json.dumps({"model": "m", "prompt": list(range(1000, 1000 + n_tokens))}).encode()
    rows.append(
        (
            f"parse_request, completions body of {n_tokens} ids ({len(ids_body) / 1e3:.0f} KB)",
            median_us(lambda: parse_request(ids_body, "completions"), args.repeat),
        )
    )
    rows.append(
        (
            "  json.loads + array('I', list), same body",
            median_us(lambda: array("I", json.loads(ids_body)["prompt"]), args.repeat),
        )
    )
    rows.append(("render (chat template, vLLM's steps)", median_us(lambda: source.render(first), args.repeat)))

    def first_turn() -> None:
        cold = fresh_source()
        cold.routing_tokens(first)

    build = median_us(fresh_source, max(3, args.repeat // 5))
    rows.append(
        ("tokenizer mode, first turn (cold piece cache)", median_us(first_turn, max(3, args.repeat // 5)) - build)
    )

    def follow_up(req: OpenAIRequest) -> float:
        timings = []
        for _ in range(max(3, args.repeat // 3)):
            warm = fresh_source()
            warm.routing_tokens(first)
            t = time.perf_counter()
            warm.routing_tokens(req)
            timings.append(time.perf_counter() - t)
        return statistics.median(timings) * 1e6

    rows.append(("tokenizer mode, follow-up (+1 tool result, warm cache)", follow_up(follow)))
    rows.append(("tokenizer mode, follow-up (+1 short user message, warm cache)", follow_up(short_follow)))
    rows.append(
        (
            "tokenizer mode, same request again (all cached)",
            median_us(lambda: source.routing_tokens(first), args.repeat),
        )
    )
    text = source.render(first)
    assert source.encoder is not None
    encoder = source.encoder
    rows.append(
        (
            "  one whole-text Tokenizer.encode of the render",
            median_us(lambda: encoder.encode_whole(text), max(3, args.repeat // 5)),
        )
    )
    approx = TokenSource(TokenConfig(mode="approximate"))
    rows.append(
        (
            "approximate mode (ChatML render + 4-byte chunks)",
            median_us(lambda: approx.routing_tokens(first), args.repeat),
        )
    )
    approx8 = TokenSource(TokenConfig(mode="approximate", approx_chunk_bytes=8))
    rows.append(
        ("approximate mode, 8-byte chunks (CRC-32 loop)", median_us(lambda: approx8.routing_tokens(first), args.repeat))
    )
    api = MessagesApi()
    anthropic_body = json.dumps(as_messages(messages)).encode()
    parsed = api.parse(anthropic_body)
    rows.append(
        (
            f"messages: parse + convert to vLLM's chat request ({len(anthropic_body) / 1e3:.0f} KB)",
            median_us(lambda: api.parse(anthropic_body), args.repeat),
        )
    )
    decoded = json.loads(anthropic_body)
    rows.append(("messages: convert only (to_chat, body decoded)", median_us(lambda: to_chat(decoded), args.repeat)))
    rows.append(
        (
            "messages: render of the converted request (chat template)",
            median_us(lambda: source.render(parsed.chat), args.repeat),
        )
    )
    rows.append(
        (
            "messages: parse + convert + render, total (budget 500 µs)",
            median_us(lambda: source.render(api.parse(anthropic_body).chat), args.repeat),
        )
    )
    rows.append(
        (
            "messages: approximate mode, parse to ids",
            median_us(lambda: api.routing_tokens(approx, api.parse(anthropic_body)), args.repeat),
        )
    )
    # The compiled data plane's native path, body bytes to ids (Rust; `smetric._core` call included).
    rows.append(
        ("chat: compiled data plane, body to approximate ids", median_us(lambda: native(CHAT_PATH, body), args.repeat))
    )
    rows.append(
        (
            "messages: compiled data plane, body to approximate ids",
            median_us(lambda: native(MESSAGES_PATH, anthropic_body), args.repeat),
        )
    )
    by_name = dict(rows)
    total = by_name[rows[0][0]] + by_name["tokenizer mode, follow-up (+1 tool result, warm cache)"]
    rows.append(("parse_request + tokenizer follow-up, total", total))

    def end_to_end(req: OpenAIRequest) -> float:
        return source.routing_tokens(req).count

    print(
        f"conversation: {len(messages)} messages, {n_tokens} tokens (test tokenizer),"
        f" {len(text) / 1e3:.0f} K chars rendered"
    )
    print(f"follow-up adds {end_to_end(follow) - n_tokens:.0f} tokens")
    for name, us in rows:
        print(f"{name:<68} {us:>10.0f} µs")


if __name__ == "__main__":
    main()
