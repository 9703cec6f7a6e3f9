"""``POST /v1/completions``: OpenAI's text-completion API as vLLM serves it.

Routing tokens: the prompt's token ids when it is given as ids (exact and free), else the prompt
text; the turn from a session hint (no roles here). Stream: a chunk's text is ``choices[0].text``;
every choice chunk is a token. This API has no reasoning or tool-call parts: a model's thinking
and its calls are plain text here, and are continued as such. A stream cut after text reached
the client continues with the text so far appended to a text prompt (the model then reads what
it wrote, as vLLM would have fed it back). Not continued (the stream ends with the error event):
a prompt of token ids (the generated ids are not in the stream), ``echo`` (the continuation
would echo the longer prompt: the client's text twice), structured output (:mod:`.openai`).
Errors: OpenAI's shape (:mod:`.openai`).
May import: :mod:`smetric.serve.apis.openai` and what it may.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from smetric.serve.apis.openai import OpenAIApi, Received
from smetric.serve.request import OpenAIRequest

__all__ = ["CompletionsApi"]


class CompletionsApi(OpenAIApi):
    name = "completions"
    path = "/v1/completions"
    endpoint = "completions"
    opening_chunks = 0

    def text_of(self, choice: dict[str, Any]) -> object:
        return choice.get("text")

    def continuable(self, body: Mapping[str, Any], got: Received) -> bool:
        return not body.get("echo")

    def _continue(self, request: OpenAIRequest, body: dict[str, Any], got: Received) -> OpenAIRequest | None:
        if request.prompt_text is None:
            return None
        body["prompt"] = request.prompt_text + got.text
        return dataclasses.replace(request, prompt_text=body["prompt"])
