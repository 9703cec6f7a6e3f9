"""``smetric.serve.request.parse_request``: fields, ids as a buffer, OpenAI errors for bad input."""

from __future__ import annotations

import json
import pickle
import random
import re
from array import array
from typing import Any

import pytest

from smetric import Router
from smetric.serve.request import OpenAIRequest, RequestError, escapes_lone_surrogate, parse_request


def chat_body(**extra: Any) -> bytes:
    return json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]} | extra).encode()


def rejected(raw: bytes, endpoint: Any = "chat") -> RequestError:
    with pytest.raises(RequestError) as info:
        parse_request(raw, endpoint)
    return info.value


def test_chat_fields() -> None:
    tools = [{"type": "function", "function": {"name": "f"}}]
    req = parse_request(
        chat_body(
            stream=True,
            max_tokens=5,
            max_completion_tokens=7,
            user="u",
            prompt_cache_key="session-1",
            cache_salt="tenant-a",
            tools=tools,
            chat_template_kwargs={"enable_thinking": False},
            add_generation_prompt=False,
        ),
        "chat",
    )
    assert req == OpenAIRequest(
        endpoint="chat",
        model="m",
        stream=True,
        max_tokens=7,
        user="u",
        prompt_cache_key="session-1",
        namespace="tenant-a",
        messages=[{"role": "user", "content": "hi"}],
        tools=tools,
        chat_template_kwargs={"enable_thinking": False},
        add_generation_prompt=False,
        continue_final_message=False,
        add_special_tokens=False,
        prompt_text=None,
        prompt_ids=None,
    )


def test_defaults() -> None:
    req = parse_request(b'{"messages":[{"role":"user","content":null}]}', "chat")
    assert (req.model, req.stream, req.max_tokens, req.namespace) == (None, False, None, None)
    assert req.add_generation_prompt and not req.continue_final_message and not req.add_special_tokens
    assert parse_request(b'{"prompt":"x"}', "completions").add_special_tokens
    assert not parse_request(b'{"prompt":"x","add_special_tokens":false}', "completions").add_special_tokens


def test_ids_come_back_as_a_buffer_the_router_takes() -> None:
    ids = [0, 7, 2**32 - 1, *range(100, 1100)]
    req = parse_request(json.dumps({"prompt": ids, "max_tokens": 3}).encode(), "completions")
    assert isinstance(req.prompt_ids, array) and req.prompt_ids.typecode == "I"
    assert req.prompt_ids.tolist() == ids
    assert (req.prompt_text, req.max_tokens, req.messages) == (None, 3, None)
    router = Router(["a", "b"], block_size=16)
    assert router.route(req.prompt_ids).prefill_tokens == len(ids)


@pytest.mark.parametrize(
    ("prompt", "text", "ids"),
    [("hello", "hello", None), (["hello"], "hello", None), ([[1, 2, 3]], None, [1, 2, 3]), ("", "", None)],
)
def test_prompt_forms(prompt: Any, text: str | None, ids: list[int] | None) -> None:
    req = parse_request(json.dumps({"prompt": prompt}).encode(), "completions")
    assert req.prompt_text == text
    assert (req.prompt_ids.tolist() if req.prompt_ids is not None else None) == ids


@pytest.mark.parametrize(
    ("raw", "param", "needle"),
    [
        (b"{not json", None, "malformed JSON"),
        (b"", None, "malformed JSON"),
        (b"[1,2]", None, "JSON object"),
        (b'{"model":"\xff"}', None, "malformed JSON"),
        (chat_body(model=3), "model", "model must be a string"),
        (chat_body(stream="yes"), "stream", "stream must be a boolean"),
        (chat_body(max_tokens=0), "max_tokens", "at least 1"),
        (chat_body(max_tokens=2.5), "max_tokens", "integer"),
        (chat_body(cache_salt=""), "cache_salt", "non-empty"),
        (chat_body(tools={}), "tools", "tools must be"),
        (chat_body(tools=[1]), "tools", "list of objects"),
        (chat_body(chat_template_kwargs=[]), "chat_template_kwargs", "object"),
        (b'{"model":"m"}', "messages", "required"),
        (b'{"messages":[]}', "messages", "non-empty"),
        (b'{"messages":"hi"}', "messages", "list"),
        (b'{"messages":[1]}', "messages", "messages[0] must be an object"),
        (b'{"messages":[{"content":"x"}]}', "messages", "messages[0].role must be a string"),
        (b'{"messages":[{"role":"user","content":5}]}', "messages", "content must be"),
        (b'{"messages":[{"role":"user","content":[5]}]}', "messages", "parts must be objects"),
        (
            b'{"messages":[{"role":"user","content":"x","n":' + b"9" * 5000 + b"}]}",
            "messages",
            "an integer with too many digits",
        ),
    ],
)
def test_chat_errors_are_openai_400s(raw: bytes, param: str | None, needle: str) -> None:
    err = rejected(raw)
    assert err.status == 400 and err.param == param and needle in err.message
    expected = {"message": err.message, "type": "invalid_request_error", "param": param, "code": None}
    assert err.body() == {"error": expected}
    json.dumps(err.body())


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({}, "prompt is required"),
        ({"prompt": None}, "prompt is required"),
        ({"prompt": []}, "must not be empty"),
        ({"prompt": [1, -1]}, "prompt[1] is -1"),
        ({"prompt": [2**32]}, "prompt[0] is 4294967296"),
        ({"prompt": [1, 2.0]}, "prompt[1] is 2"),
        ({"prompt": [[1], [2]]}, "batch of 2"),
        ({"prompt": ["a", "b", "c"]}, "batch of 3"),
        ({"prompt": {"x": 1}}, "got an object"),
        ({"prompt": [True]}, "holding a boolean"),
    ],
)
def test_completions_errors(body: dict[str, Any], needle: str) -> None:
    err = rejected(json.dumps(body).encode(), "completions")
    assert err.status == 400 and err.param == "prompt" and needle in err.message, err.message


def test_status_helpers_and_pickling() -> None:
    missing = RequestError.unknown_model("nope")
    assert missing.status == 404 and missing.body()["error"] == {
        "message": "The model `nope` does not exist.",
        "type": "invalid_request_error",
        "param": "model",
        "code": "model_not_found",
    }
    assert RequestError.too_large(1024).status == 413
    copy = pickle.loads(pickle.dumps(missing))
    assert (copy.status, copy.param, copy.body()) == (404, "model", missing.body())


def test_an_unknown_endpoint_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="endpoint"):
        parse_request(chat_body(), "embeddings")  # type: ignore[arg-type]


def test_random_and_mutated_bodies_raise_only_request_errors() -> None:
    rng = random.Random(11)
    statuses = set()
    seeds = [chat_body(stream=True, tools=[{"type": "function"}]), json.dumps({"prompt": list(range(50))}).encode()]
    for i in range(600):
        raw = bytearray(rng.choice(seeds))
        for _ in range(rng.randint(1, 4)):
            raw[rng.randrange(len(raw))] = rng.randrange(256)
        if i % 5 == 0:
            raw = bytearray(rng.randbytes(rng.randint(0, 40)))
        for endpoint in ("chat", "completions"):
            try:
                parse_request(bytes(raw), endpoint)
            except RequestError as e:
                statuses.add(e.status)
    assert statuses == {400}


def test_the_fields_the_proxy_rewrites_are_read_at_the_top_level_only() -> None:
    """``stream_options`` and ``kv_transfer_params``: the proxy rewrites a forwarded body by
    them, so their names inside a string or a nested object must not count."""
    req = parse_request(
        chat_body(stream_options={"include_usage": False}, kv_transfer_params={"do_remote_decode": True}), "chat"
    )
    assert (req.stream_options_json, req.kv_transfer_params) == ('{"include_usage": false}', True)
    null = parse_request(json.dumps({"prompt": [1], "stream_options": None}).encode(), "completions")
    assert (null.stream_options_json, null.kv_transfer_params) == ("null", False)
    inside = chat_body(tools=[{"type": "function", "kv_transfer_params": 1, "stream_options": 2}])
    inside = inside.replace(b'"hi"', b'"\\"stream_options\\" and \\"kv_transfer_params\\""')
    req = parse_request(inside, "chat")
    assert (req.stream_options_json, req.kv_transfer_params) == (None, False)


_ESCAPE = re.compile(rb"\\(?:u([0-9a-fA-F]{4})|.)", re.DOTALL)


def _lone_surrogate_reference(raw: bytes) -> bool:
    """The plain-Python scan the Rust check replaced: every escape, left to right."""
    high_end = -1
    for m in _ESCAPE.finditer(raw):
        digits = m.group(1)
        code = -1 if digits is None else int(digits, 16)
        if high_end >= 0:
            if m.start() != high_end or not 0xDC00 <= code <= 0xDFFF:
                return True
            high_end = -1
        elif 0xD800 <= code <= 0xDBFF:
            high_end = m.end()
        elif 0xDC00 <= code <= 0xDFFF:
            return True
    return high_end >= 0


def test_the_lone_surrogate_check_agrees_with_the_plain_scan() -> None:
    pieces = [
        "a", "u", "d800", " ", "\\\\", "\\n", '\\"', "\\u0041", "\\ud800", "\\uDBFF", "\\udc00", "\\uDFFF",
        "\\ud83d\\ude00", "\\u00e9", "é",
    ]  # fmt: skip
    rng = random.Random(19)
    found = 0
    for _ in range(3000):
        strings = ['"' + "".join(rng.choices(pieces, k=rng.randint(0, 12))) + '"' for _ in range(rng.randint(1, 3))]
        raw = ("[" + ",".join(strings) + "]").encode()
        want = _lone_surrogate_reference(raw)
        assert escapes_lone_surrogate(raw) == want, raw
        found += want
    assert 300 < found < 2700, "both answers are exercised"
    ids = json.dumps({"prompt": list(range(1000, 33768))}).encode()
    assert not escapes_lone_surrogate(ids) and escapes_lone_surrogate(ids[:-1] + b', "x": "\\udfff"}')
