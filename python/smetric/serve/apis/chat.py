"""``POST /v1/chat/completions``: OpenAI's chat API as vLLM serves it.

Routing tokens: the conversation rendered with the model's chat template (or the client's ids —
never, for chat), the turn from the roles. Stream: a chunk's text is ``choices[0].delta.content``,
its reasoning ``delta.reasoning`` (``reasoning_content`` before vLLM 0.11), a tool call's pieces
``delta.tool_calls``; the stream opens with a role chunk (``delta`` with a role and no content)
that carries no token. Errors: OpenAI's shape (:mod:`.openai`).

A stream cut after text reached the client continues with vLLM's ``continue_final_message``: the
text so far becomes the final assistant message — with the reasoning the client received as its
``reasoning``, which the chat template renders closed before the text (as vLLM renders an earlier
turn's), so the engine, finding the reasoning ended in the prompt, streams the rest as text (for
templates that render the final assistant message's reasoning, as Qwen3's do) — and the
continuation's own opening role chunk is dropped (the client already has one). A cut inside
the reasoning (reasoning received, no text after it yet) is not continued: no template renders a
reasoning left open, so the new engine would close it and answer without finishing the thought.
Nor is a stream whose ``tool_choice`` forces a call (``"required"`` or a named function: vLLM
decodes it under a grammar). Tool calls and structured output: :mod:`.openai`.
May import: :mod:`smetric.serve.apis.openai` and what it may.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from smetric.serve.apis.openai import OpenAIApi, Received
from smetric.serve.request import OpenAIRequest

__all__ = ["ChatApi"]


class ChatApi(OpenAIApi):
    name = "chat"
    path = "/v1/chat/completions"
    endpoint = "chat"
    opening_chunks = 1

    def text_of(self, choice: dict[str, Any]) -> object:
        return (choice.get("delta") or {}).get("content")

    def is_opening_chunk(self, event: bytes) -> bool:
        try:
            obj = json.loads(event[5:].strip())
        except ValueError:
            return False
        choices = obj.get("choices") or []
        if len(choices) != 1:
            return False
        delta = choices[0].get("delta") or {}
        return "role" in delta and not delta.get("content") and choices[0].get("finish_reason") is None

    def continuable(self, body: Mapping[str, Any], got: Received) -> bool:
        choice = body.get("tool_choice")  # "required" or a named function: vLLM guides the call
        if choice == "required" or isinstance(choice, dict):
            return False
        return bool(got.text)  # reasoning alone: cut inside it (see the module docs)

    def _continue(self, request: OpenAIRequest, body: dict[str, Any], got: Received) -> OpenAIRequest | None:
        assert request.messages is not None  # a parsed chat request always has them
        final: dict[str, Any] = {"role": "assistant", "content": got.text}
        if got.reasoning:
            final["reasoning"] = got.reasoning
        messages = [*request.messages, final]
        body.update(messages=messages, continue_final_message=True, add_generation_prompt=False)
        return dataclasses.replace(request, messages=messages, continue_final_message=True, add_generation_prompt=False)
