"""``POST /v1/completions``: OpenAI's text-completion API as vLLM serves it.

Routing tokens: the prompt's token ids when it is given as ids (exact and free), else the prompt
text; the turn from a session hint (no roles here). Stream: a chunk's text is ``choices[0].text``;
every choice chunk is a token. A stream cut after its first chunk continues with the text so far
appended to a text prompt; a prompt of token ids cannot be continued (the generated ids are not
in the stream). Errors: OpenAI's shape (:mod:`.openai`).
May import: :mod:`smetric.serve.apis.openai` and what it may.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from smetric.serve.apis.openai import OpenAIApi
from smetric.serve.request import OpenAIRequest

__all__ = ["CompletionsApi"]


class CompletionsApi(OpenAIApi):
    name = "completions"
    path = "/v1/completions"
    endpoint = "completions"
    opening_chunks = 0

    def text_of(self, choice: dict[str, Any]) -> object:
        return choice.get("text")

    def _continue(self, request: OpenAIRequest, body: dict[str, Any], text: str) -> OpenAIRequest | None:
        if request.prompt_text is None:
            return None
        body["prompt"] = request.prompt_text + text
        return dataclasses.replace(request, prompt_text=body["prompt"])
