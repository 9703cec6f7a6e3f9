"""SCRATCH (lead's dev stand-in; replaced by the tokens branch)."""

from __future__ import annotations

from array import array
from typing import Any, Literal, NamedTuple

from smetric.fake_engine.tokens import render_chat
from smetric.serve.request import OpenAIRequest


class RoutingTokens(NamedTuple):
    ids: Any
    num_tokens: int
    source: Literal["ids", "tokenizer", "approximate"]


def _chunks(text: str) -> array[int]:
    data = text.encode()
    data += b"\0" * (-len(data) % 4)
    ids = array("I", data)
    ids.byteswap()
    return ids


class TokenSource:
    def __init__(
        self,
        mode: str = "auto",
        tokenizer: str | None = None,
        chat_template: str | None = None,
        approx_chunk_bytes: int = 4,
    ) -> None:
        self.mode = mode

    def routing_tokens(self, req: OpenAIRequest) -> RoutingTokens:
        if req.prompt_ids is not None:
            return RoutingTokens(req.prompt_ids, len(req.prompt_ids), "ids")
        text = render_chat(req.messages or []) if req.endpoint == "chat" else (req.prompt_text or "")
        ids = _chunks(text)
        return RoutingTokens(ids, len(ids), "approximate")
