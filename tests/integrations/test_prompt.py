"""What a request body tells the router (``smetric.integrations._prompt``), for every integration."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from smetric import Router
from smetric.fake_engine.tokens import byte_chunk_ids, render_chat
from smetric.integrations._prompt import TURN_FIELD, approximate_tokens, prompt_from_body, route

MESSAGES = [{"role": "system", "content": "Be brief. " * 20}, {"role": "user", "content": "Fix the bug."}]


def test_token_ids_win_over_messages() -> None:
    prompt = prompt_from_body({"prompt_token_ids": [1, 2, 3], "messages": MESSAGES})
    assert prompt is not None
    assert prompt.tokens == [1, 2, 3] and prompt.messages == MESSAGES and not prompt.approximate


def test_a_list_prompt_is_token_ids_and_a_text_prompt_is_approximate() -> None:
    ids = prompt_from_body({"prompt": [7, 8, 9]})
    text = prompt_from_body({"prompt": "hello world"})
    assert ids is not None and ids.tokens == [7, 8, 9] and not ids.approximate
    assert text is not None and text.tokens == byte_chunk_ids("hello world") and text.approximate


def test_messages_alone_give_the_fake_engines_own_token_ids() -> None:
    prompt = prompt_from_body({"messages": MESSAGES})
    assert prompt is not None and prompt.approximate
    assert prompt.tokens == approximate_tokens(MESSAGES) == byte_chunk_ids(render_chat(MESSAGES))


def test_a_trace_chain_and_the_turn_hint() -> None:
    prompt = prompt_from_body({"hash_ids": [11, 12], "input_length": 100, TURN_FIELD: 3})
    assert prompt is not None and prompt.hashes == [11, 12] and prompt.num_tokens == 100 and prompt.turn == 3
    router = Router(["a", "b"], block_size=64)
    decision = route(router, prompt, "r1")
    assert decision.num_tokens == 100 and not decision.first_turn and decision.turn_source == "hint"


def test_bad_fields_are_ignored() -> None:
    assert prompt_from_body({"model": "m"}) is None
    assert prompt_from_body(None) is None
    assert prompt_from_body({"prompt_token_ids": [1, True, 3]}) is None  # a bool is not a token id
    prompt = prompt_from_body({"prompt": "x", TURN_FIELD: 0})  # turns start at 1
    assert prompt is not None and prompt.turn is None


def test_objects_with_the_same_attribute_names_are_read_too() -> None:
    @dataclass
    class Message:
        role: str
        content: str

        def model_dump(self) -> dict[str, Any]:
            return {"role": self.role, "content": self.content}

    @dataclass
    class Body:
        messages: list[Message]

    prompt = prompt_from_body(Body([Message(m["role"], m["content"]) for m in MESSAGES]))
    assert prompt is not None and prompt.tokens == approximate_tokens(MESSAGES)
    router = Router(["a", "b"])
    assert route(router, prompt).turn_source == "messages"
