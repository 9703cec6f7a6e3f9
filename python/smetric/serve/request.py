"""SCRATCH (lead's dev stand-in; replaced by the tokens branch)."""

from __future__ import annotations

import json
from array import array
from dataclasses import dataclass
from typing import Any, Literal


class RequestError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.type = "invalid_request_error"
        self.code = code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


@dataclass(frozen=True, slots=True)
class OpenAIRequest:
    endpoint: Literal["chat", "completions"]
    model: str | None
    stream: bool
    max_tokens: int | None
    user: str | None
    prompt_cache_key: str | None
    namespace: str | None
    messages: list[dict[str, Any]] | None
    prompt_text: str | None
    prompt_ids: array[int] | None


def parse_request(raw: bytes, endpoint: Literal["chat", "completions"]) -> OpenAIRequest:
    try:
        body = json.loads(raw)
    except ValueError as e:
        raise RequestError(400, f"invalid JSON: {e}") from e
    if not isinstance(body, dict):
        raise RequestError(400, "the body must be a JSON object")
    messages = body.get("messages")
    prompt = body.get("prompt")
    ids = text = None
    if endpoint == "chat":
        if not isinstance(messages, list) or not messages:
            raise RequestError(400, "messages must be a non-empty list", "messages")
    else:
        if isinstance(prompt, str):
            text = prompt
        elif isinstance(prompt, list):
            if not all(type(t) is int and 0 <= t < 2**32 for t in prompt):
                raise RequestError(400, "prompt ids must be ints in [0, 2**32)", "prompt")
            ids = array("I", prompt)
        else:
            raise RequestError(400, "prompt is required", "prompt")
    return OpenAIRequest(
        endpoint=endpoint,
        model=body.get("model"),
        stream=bool(body.get("stream", False)),
        max_tokens=body.get("max_tokens", body.get("max_completion_tokens")),
        user=body.get("user"),
        prompt_cache_key=body.get("prompt_cache_key"),
        namespace=body.get("cache_salt"),
        messages=messages if endpoint == "chat" else None,
        prompt_text=text,
        prompt_ids=ids,
    )
