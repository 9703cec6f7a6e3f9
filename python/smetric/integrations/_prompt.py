"""What a request body tells the router: its prompt, its history, its turn.

Every integration hands the router the same thing, read from an OpenAI-style request body (a
``dict``, or an object with the same attribute names, such as a pydantic request model):

* ``prompt_token_ids`` (or ``prompt`` given as a list of ints): the engine's token ids, exact;
* ``hash_ids`` (with ``input_length``): a pre-hashed block chain, as agent traces carry it;
* ``messages``: the chat history, for turn inference, and, when no token ids came with it, for
  an approximate prompt (:func:`approximate_tokens`);
* ``prompt`` given as a string: approximate tokens of that text;
* ``smetric_turn`` (optional): the caller's turn number, which overrides every inference.

Approximate mode hashes what the engine would see without its tokenizer: the chat rendered with
the ChatML template, cut into fixed 4-byte chunks. That is exactly the fake engine's default
tokenizer (:func:`smetric.serve.tokens.approximate_ids` of :func:`smetric.chat.render_chat`),
so against the fake engine the router's block
hashes are the engine's; against a real tokenizer they are a stand-in whose prefix structure
(shared system prompt, re-sent history) is the same, which is all the router's index needs in
approximate mode. :func:`approximate_tokens` is the one place that conversion lives.

Complexity: linear in the size of the body (one pass to render, one to chunk).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from smetric._core import Decision, Router
from smetric.chat import render_chat
from smetric.serve.tokens import approximate_ids

TURN_FIELD = "smetric_turn"
"""Optional body field with the caller's turn number (1 = first turn)."""


@dataclass(frozen=True, slots=True)
class Prompt:
    """The routing inputs read from one request (exactly one of ``tokens`` and ``hashes`` is set)."""

    tokens: Sequence[int] | None = None
    hashes: Sequence[int] | None = None
    num_tokens: int | None = None
    messages: Sequence[Mapping[str, Any]] | None = None
    turn: int | None = None
    approximate: bool = False
    """Whether ``tokens`` are the byte-chunk stand-in rather than the engine's own ids."""


def approximate_tokens(messages: Sequence[Mapping[str, Any]]) -> list[int]:
    """Token ids standing in for a chat prompt: its ChatML rendering in 4-byte chunks."""
    return approximate_ids(render_chat(messages)).tolist()


def _field(body: object, name: str) -> Any:
    if isinstance(body, Mapping):
        return body.get(name)
    return getattr(body, name, None)


def _as_message(message: object) -> Mapping[str, Any]:
    if isinstance(message, Mapping):
        return message
    dump = getattr(message, "model_dump", None)  # pydantic request models
    if callable(dump):
        dumped = dump()
        if isinstance(dumped, Mapping):
            return dumped
    return {"role": getattr(message, "role", None), "content": getattr(message, "content", None)}


def _int_list(value: object) -> list[int] | None:
    if (
        isinstance(value, Sequence)
        and not isinstance(value, str | bytes)
        and value
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    ):
        return list(value)
    return None


def prompt_from_body(body: object) -> Prompt | None:
    """Reads a request body (see the module docs); ``None`` when it carries no prompt at all."""
    if body is None:
        return None
    raw_turn = _field(body, TURN_FIELD)
    turn = raw_turn if isinstance(raw_turn, int) and not isinstance(raw_turn, bool) and raw_turn >= 1 else None
    raw_messages = _field(body, "messages")
    messages = (
        [_as_message(m) for m in raw_messages]
        if isinstance(raw_messages, Sequence) and not isinstance(raw_messages, str | bytes)
        else None
    )
    tokens = _int_list(_field(body, "prompt_token_ids"))
    prompt = _field(body, "prompt")
    if tokens is None:
        tokens = _int_list(prompt)
    if tokens is not None:
        return Prompt(tokens=tokens, messages=messages, turn=turn)
    hashes = _int_list(_field(body, "hash_ids"))
    if hashes is not None:
        length = _field(body, "input_length")
        num_tokens = length if isinstance(length, int) and not isinstance(length, bool) and length > 0 else None
        return Prompt(hashes=hashes, num_tokens=num_tokens, messages=messages, turn=turn)
    if messages is not None:
        return Prompt(tokens=approximate_tokens(messages), messages=messages, turn=turn, approximate=True)
    if isinstance(prompt, str):
        return Prompt(tokens=approximate_ids(prompt).tolist(), turn=turn, approximate=True)
    return None


def route(router: Router, prompt: Prompt, request_id: int | str | None = None) -> Decision:
    """``router.route`` with what ``prompt`` carries."""
    if prompt.hashes is not None:
        return router.route(
            hashes=prompt.hashes,
            num_tokens=prompt.num_tokens,
            messages=prompt.messages,
            turn=prompt.turn,
            request_id=request_id,
        )
    return router.route(prompt.tokens, messages=prompt.messages, turn=prompt.turn, request_id=request_id)
