"""Request bodies for the differential tests of the compiled data plane
(``test_native_rendering.py``, ``test_native_tokenizer.py``): agent-shaped conversations for
each API from a seeded generator, and the same bodies with one field spoiled (the wrong type,
the wrong shape, or missing), so both sides' validation is compared too; and the app's side of
the comparison (:func:`app_ids`)."""

from __future__ import annotations

import json
import random
from typing import Any

from smetric.serve.pinning import ResponseIds, instance_tag
from smetric.serve.request import RequestError
from smetric.serve.tokens import TokenSource

WORDS = ["ls", "the", "file", "é", "😀", '"q"', "\\n", "x" * 40, "", " ", "<|im_end|>", "0" * 12]


def words(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(0, 6)))


def chat_body(rng: random.Random) -> dict[str, Any]:
    messages: list[dict[str, Any]] = []
    if rng.random() < 0.7:
        messages.append({"role": "system", "content": words(rng)})
    for _ in range(rng.randint(1, 6)):
        role = rng.choice(["user", "assistant", "tool", "user"])
        content: Any = words(rng)
        shape = rng.random()
        if shape < 0.2:
            content = [{"type": "text", "text": words(rng)}, {"type": "image_url", "image_url": {"url": "u"}}]
        elif shape < 0.3:
            content = None
        message: dict[str, Any] = {"role": role, "content": content}
        if role == "assistant" and rng.random() < 0.4:
            message["tool_calls"] = [{"id": "c", "type": "function", "function": {"name": "ls", "arguments": "{}"}}]
        messages.append(message)
    body: dict[str, Any] = {"model": "m", "messages": messages, "max_tokens": rng.randint(1, 9)}
    if rng.random() < 0.5:
        body["tools"] = [{"type": "function", "function": {"name": "ls", "parameters": {}}}]
    if rng.random() < 0.3:
        body["stream"] = True
    if rng.random() < 0.1:
        body["continue_final_message"], body["add_generation_prompt"] = True, False
    return body


def completions_body(rng: random.Random) -> dict[str, Any]:
    prompt: Any = words(rng) if rng.random() < 0.5 else [rng.randint(0, 2**32 - 1) for _ in range(rng.randint(1, 40))]
    if rng.random() < 0.2:
        prompt = [prompt]
    return {"model": "m", "prompt": prompt, "max_tokens": rng.randint(1, 9)}


def block(rng: random.Random, role: str) -> dict[str, Any]:
    kind = rng.choice(["text", "text", "thinking", "tool_use", "tool_result", "image", "redacted_thinking"])
    if kind == "text":
        return {"type": "text", "text": words(rng)}
    if kind == "thinking":
        return {"type": "thinking", "thinking": words(rng), "signature": "s"}
    if kind == "tool_use":
        return {"type": "tool_use", "id": "t1", "name": "ls", "input": {"path": words(rng)}}
    if kind == "image":
        return {"type": "image", "source": rng.choice([{"type": "url", "url": "u"}, {}, None])}
    if kind == "tool_result":
        content: Any = rng.choice(
            [
                words(rng),
                [{"type": "text", "text": words(rng)}, {"type": "text", "text": words(rng)}],
                [{"type": "image", "source": {}}, {"type": "tool_reference", "tool_name": "ls"}],
                None,
                "",
            ]
        )
        result: dict[str, Any] = {"type": "tool_result", "tool_use_id": "t1"}
        if content is not None or rng.random() < 0.5:
            result["content"] = content
        return result
    return {"type": kind, "data": "x"}


def messages_body(rng: random.Random) -> dict[str, Any]:
    messages: list[dict[str, Any]] = []
    for _ in range(rng.randint(1, 6)):
        role = rng.choice(["user", "assistant", "user", "system"])
        content: Any = words(rng) if rng.random() < 0.4 else [block(rng, role) for _ in range(rng.randint(0, 4))]
        messages.append({"role": role, "content": content})
    body: dict[str, Any] = {"model": "m", "max_tokens": rng.randint(1, 99), "messages": messages}
    system = rng.random()
    if system < 0.3:
        body["system"] = words(rng)
    elif system < 0.7:
        body["system"] = [
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=2"},
            {"type": "text", "text": words(rng)},
        ]
    if rng.random() < 0.5:
        body["tools"] = [{"name": "ls", "input_schema": {"type": "object"}, "description": "list"}]
        body["tool_choice"] = rng.choice([{"type": "auto"}, {"type": "tool", "name": "ls"}, {"type": "any"}])
    if rng.random() < 0.3:
        body["thinking"] = rng.choice([{"type": "enabled", "budget_tokens": 2048}, {"type": "disabled"}])
    if rng.random() < 0.3:
        body["stream"] = True
    return body


def responses_body(rng: random.Random) -> dict[str, Any]:
    if rng.random() < 0.2:
        body: dict[str, Any] = {"model": "m", "input": words(rng)}
    else:
        items: list[dict[str, Any]] = []
        for _ in range(rng.randint(0, 7)):
            kind = rng.choice(["user", "assistant", "call", "output", "reasoning", "raw"])
            if kind == "user":
                items.append(
                    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": words(rng)}]}
                )
            elif kind == "assistant":
                content = [{"type": "output_text", "text": words(rng)}] if rng.random() < 0.8 else words(rng)
                items.append({"type": "message", "role": "assistant", "content": content})
            elif kind == "call":
                items.append({"type": "function_call", "call_id": "c", "name": "ls", "arguments": "{}"})
            elif kind == "output":
                output = rng.choice([words(rng), [{"type": "text", "text": words(rng)}], None, 5])
                items.append({"type": "function_call_output", "call_id": "c", "output": output})
            elif kind == "reasoning":
                item: dict[str, Any] = {"type": "reasoning", "summary": [{"type": "summary_text", "text": words(rng)}]}
                if rng.random() < 0.1:
                    item["encrypted_content"] = "x"
                items.append(item)
            else:
                raw_item: dict[str, Any] = {"role": rng.choice(["user", "system", "assistant", "developer"])}
                raw_item["content"] = rng.choice(
                    [words(rng), None, [{"text": words(rng)}], [{"type": "x", "text": "y"}]]
                )
                if rng.random() < 0.3:
                    raw_item["tool_calls"] = rng.choice([[], "x", None])
                items.append(raw_item)
        body = {"model": "m", "input": items, "store": rng.random() < 0.5}
    if rng.random() < 0.6:
        body["instructions"] = words(rng)
    if rng.random() < 0.4:
        body["tools"] = [{"type": "function", "name": "ls", "parameters": {}}]
    if rng.random() < 0.3:
        body["stream"] = True
    if rng.random() < 0.05:
        body["previous_response_id"] = FOLLOW_UP_ID
    return body


RESPONSE_ID_KEY = "bodies-test-key"
"""The key the corpora's Responses adapters issue ids with (``ResponsesApi(ResponseIds(...))``)."""
FOLLOW_UP_ID = ResponseIds(RESPONSE_ID_KEY).issue("resp_1", instance_tag("http://e"))
"""A stored response's id as the proxy issued it: a follow-up the native path opens and pins."""


WRONG = [None, 0, 1.5, True, "s", [], {}, [1], [{"type": 1}], -1, 2**70]


def spoiled(rng: random.Random, body: dict[str, Any]) -> dict[str, Any]:
    """``body`` with one field (top level, or in a message or block) replaced or removed."""
    body = json.loads(json.dumps(body))
    target: dict[str, Any] = body
    messages = body.get("messages", body.get("input"))
    if isinstance(messages, list) and messages and rng.random() < 0.6:
        target = rng.choice(messages)
        content = target.get("content")
        if isinstance(content, list) and content and rng.random() < 0.5 and isinstance(content[0], dict):
            target = rng.choice(content)
    key = rng.choice(sorted(target) or ["model"])
    if rng.random() < 0.2:
        target.pop(key, None)
    else:
        target[key] = rng.choice(WRONG)
    return body


MODEL_ROLES = ("assistant", "tool", "function", "ipython")


def first_turn(roles: list[str]) -> bool:
    """The core's rule (``smetric_core::first_turn_from_roles``)."""
    return not any(r in MODEL_ROLES for r in roles[:-1])


class _NoSessions:
    def next_turn(self, key: str) -> int:
        return 1


def app_ids(api: Any, source: TokenSource, raw: bytes) -> tuple[list[int], bool | None] | None:
    """The app's routing ids and turn verdict (from the messages it prepares: chat's own, a
    conversion's), or None when it refuses the body."""
    try:
        request = api.parse(raw)
        tokens = api.routing_tokens(source, request)
        prepared_messages = api.prepare(request, raw, tokens, {}, _NoSessions()).messages
    except (RequestError, ValueError, TypeError):
        return None
    verdict = None if prepared_messages is None else first_turn([m["role"] for m in prepared_messages])
    return list(tokens.ids), verdict
