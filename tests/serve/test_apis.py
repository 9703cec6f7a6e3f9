"""The API adapters on their own (no network): stream scanning, continuation of a cut stream,
error shapes — for chat completions and text completions."""

from __future__ import annotations

import json
from typing import Any

from smetric._core import SessionTable
from smetric.serve.apis import APIS, ChatApi, CompletionsApi
from smetric.serve.apis.openai import OpenAIApi, OpenAIStream, Received
from smetric.serve.errors import ProxyError
from smetric.serve.tokens import TokenConfig, TokenSource

SOURCE = TokenSource(TokenConfig(mode="approximate"))


def sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def chat_chunk(content: str | None = None, *, role: str | None = None, finish: str | None = None) -> bytes:
    delta = {k: v for k, v in (("role", role), ("content", content)) if v is not None}
    return sse({"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})


def text_chunk(text: str, finish: str | None = None) -> bytes:
    return sse({"choices": [{"index": 0, "text": text, "finish_reason": finish}]})


def prepared(api: ChatApi | CompletionsApi, body: dict[str, Any]) -> Any:
    raw = json.dumps(body).encode()
    req = api.parse(raw)
    return api.prepare(req, raw, api.routing_tokens(SOURCE, req), {}, SessionTable())


def test_every_api_has_its_own_path() -> None:
    paths = [api.path for api in APIS]
    assert paths == ["/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages", "/v1/embeddings"]


def test_a_chat_stream_counts_tokens_without_its_role_chunk_and_sees_its_end() -> None:
    state = ChatApi().stream(keep=True)
    events = state.feed(chat_chunk(role="assistant", content="") + chat_chunk("a") + chat_chunk("b")[:10])
    assert len(events) == 2 and state.tokens == 1 and not state.finished
    state.feed(chat_chunk("b")[10:] + chat_chunk(finish="stop"))
    assert state.tokens == 3 and state.finished and not state.done  # a, b and the finish chunk
    state.feed(b"data: [DONE]\n\n")
    assert state.done
    assert isinstance(state, OpenAIStream) and state.received() == Received("ab", "", False, 2)


def test_a_usage_chunk_is_the_token_count() -> None:
    state = CompletionsApi().stream(keep=False)
    state.feed(text_chunk("x") + text_chunk("y") + sse({"choices": [], "usage": {"completion_tokens": 7}}))
    assert state.tokens == 7


def test_only_a_chat_continuations_opening_role_chunk_is_dropped() -> None:
    chat, completions = ChatApi().stream(keep=True), CompletionsApi().stream(keep=True)
    role = chat_chunk(role="assistant", content="").rstrip(b"\n")
    assert chat.drops_on_continuation(role)
    assert not chat.drops_on_continuation(chat_chunk("hi").rstrip(b"\n"))
    assert not completions.drops_on_continuation(text_chunk("").rstrip(b"\n"))


def test_a_cut_chat_stream_continues_with_the_text_so_far() -> None:
    api = ChatApi()
    first = prepared(api, {"messages": [{"role": "user", "content": "q"}], "max_tokens": 10, "stream": True})
    state = api.stream(keep=True)
    state.feed(chat_chunk(role="assistant", content="") + chat_chunk("hel") + chat_chunk("lo"))
    cont = api.continuation(first, state, SOURCE)
    assert cont is not None and cont.turn is None and cont.path == "/v1/chat/completions"
    body = json.loads(cont.body)
    assert body["messages"][-1] == {"role": "assistant", "content": "hello"} and body["max_tokens"] == 8
    assert body["continue_final_message"] is True and body["add_generation_prompt"] is False
    assert cont.request.continue_final_message and cont.messages == body["messages"]
    assert cont.tokens.ids != first.tokens.ids


def test_a_cut_completion_continues_a_text_prompt_but_not_token_ids_nor_several_choices() -> None:
    api = CompletionsApi()
    state = api.stream(keep=True)
    state.feed(text_chunk("wor") + text_chunk("ld"))
    cont = api.continuation(prepared(api, {"prompt": "hello ", "max_tokens": 5}), state, SOURCE)
    assert cont is not None and json.loads(cont.body) == {"prompt": "hello world", "max_tokens": 3}
    assert cont.request.prompt_text == "hello world"
    for refused in ({"prompt": [1, 2, 3]}, {"prompt": "a", "n": 2}):
        fresh = api.stream(keep=True)  # a stream is continued from its own first request
        fresh.feed(text_chunk("wor") + text_chunk("ld"))
        assert api.continuation(prepared(api, refused), fresh, SOURCE) is None


def test_a_completion_turn_comes_from_a_session_hint() -> None:
    api, sessions = CompletionsApi(), SessionTable()
    raw = json.dumps({"prompt": "x", "user": "u1"}).encode()
    req = api.parse(raw)
    turns = [api.prepare(req, raw, api.routing_tokens(SOURCE, req), {}, sessions).turn for _ in range(2)]
    assert turns == [1, 2]
    assert prepared(ChatApi(), {"messages": [{"role": "user", "content": "x"}], "user": "u1"}).turn is None


def test_errors_are_in_openais_shape_and_a_stream_ends_with_done() -> None:
    error = ProxyError.unavailable("gone")
    for api in (a for a in APIS if isinstance(a, OpenAIApi)):  # Anthropic's shape: test_messages.py
        response = api.fail(error)
        assert response.status == 503
        assert response.body is not None and json.loads(bytes(response.body))["error"] == {
            "message": "gone",
            "type": "ServiceUnavailableError",
            "param": None,
            "code": 503,
        }
        if api.name in ("chat", "completions"):  # Responses' own event: tests/serve/test_responses.py
            assert api.stream_failure(error) == b"data: " + json.dumps(error.body()).encode() + b"\n\ndata: [DONE]\n\n"
