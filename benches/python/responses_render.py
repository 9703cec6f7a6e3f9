"""What it costs to turn a ``/v1/responses`` body into what the router renders (issue 19's
performance row: a 32K-token Responses conversation rendered in ≤ 0.5 ms, BPE excluded).

Usage: ``python benches/python/responses_render.py [--tokens 32768] [--repeat 30]``.

The conversation is :mod:`routing_tokens`'s agent session (system prompt, then rounds of user
message, tool call, long tool result) written as Responses input items — ``instructions``, user
messages, ``function_call`` and ``function_call_output`` items, a ``reasoning`` item per round —
and timed, as the median of ``--repeat`` runs, step by step:

* ``ResponsesApi.parse``: ``json.loads`` of the body, its validation, and the items turned into
  chat messages as vLLM turns them (``chat_messages``), against that conversion alone;
* the chat template's render of those messages (Jinja, vLLM's steps; the test tokenizer's
  template), and approximate mode's ChatML render plus 4-byte chunks — the renders the proxy
  routes on, without BPE;
* the compiled data plane's native path, from the body's bytes to the approximate ids
  (``smetric._core.gateway_routing_ids``: the gateway's parse, validation, conversion and
  ChatML render in Rust);
* for scale, the same template render of the chat form of the conversation.

No assertion: it prints figures (BENCHMARKS.md quotes them).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from routing_tokens import TOKENIZER, TOOL, median_us, native, session

from smetric.serve.apis.responses import ResponsesApi, chat_messages
from smetric.serve.tokens import TokenConfig, TokenSource


def as_items(messages: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """The chat session as Responses ``instructions`` and input items (a reasoning item opens
    every assistant turn)."""
    instructions = str(messages[0]["content"])
    items: list[dict[str, Any]] = []
    for m in messages[1:]:
        if m["role"] == "user":
            items.append({"type": "message", "role": "user", "content": [{"type": "input_text", "text": m["content"]}]})
        elif m["role"] == "assistant":
            items.append({"type": "reasoning", "summary": [{"type": "summary_text", "text": "Look it up."}]})
            for call in m["tool_calls"]:
                f = call["function"]
                items.append(
                    {"type": "function_call", "call_id": call["id"], "name": f["name"], "arguments": f["arguments"]}
                )
        else:
            items.append({"type": "function_call_output", "call_id": m["tool_call_id"], "output": m["content"]})
    return instructions, items


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=32_768)
    parser.add_argument("--repeat", type=int, default=30)
    args = parser.parse_args()

    messages, _ = session(args.tokens)
    instructions, items = as_items(messages)
    tool = {"type": "function", **TOOL["function"]}
    body = json.dumps({"model": "m", "instructions": instructions, "input": items, "tools": [tool], "store": False})
    raw = body.encode()
    api = ResponsesApi()
    request = api.parse(raw)
    assert request.chat is not None
    template = TokenSource(TokenConfig(tokenizer=str(TOKENIZER)))
    approximate = TokenSource(TokenConfig(mode="approximate"))
    tokens = template.routing_tokens(request.chat).count
    rows = [
        (
            f"ResponsesApi.parse ({len(raw) / 1e3:.0f} KB, {len(items)} items)",
            median_us(lambda: api.parse(raw), args.repeat),
        ),
        ("  of which items -> chat messages", median_us(lambda: chat_messages(instructions, items), args.repeat)),
        ("chat template render (Jinja, vLLM's steps)", median_us(lambda: template.render(request.chat), args.repeat)),
        (
            "approximate: ChatML render + 4-byte chunks",
            median_us(lambda: approximate.routing_tokens(request.chat), args.repeat),
        ),
        (
            "compiled data plane: body to approximate ids (Rust)",
            median_us(lambda: native("/v1/responses", raw), args.repeat),
        ),
    ]
    print(f"a Responses conversation of {tokens} tokens (test tokenizer), median of {args.repeat} runs")
    for name, us in rows:
        print(f"  {name:<58} {us:>10.1f} µs")


if __name__ == "__main__":
    main()
