"""The client APIs ``smetric serve`` speaks, one adapter module each (:mod:`.base` is the
interface): :mod:`.chat` (``POST /v1/chat/completions``) and :mod:`.completions`
(``POST /v1/completions``), sharing OpenAI's stream and error shape in :mod:`.openai`;
:mod:`.responses` (``/v1/responses``); :mod:`.messages` (``/v1/messages`` and its
``count_tokens``, Anthropic's); :mod:`.passthrough` (the rest of vLLM's surface, and the
404 of unknown paths: last, its catch-all route must come after every other).

:data:`APIS` is the registry the app's routes table is built from: a new API is a module and a
line here. May import: the adapter modules of this package.
"""

from __future__ import annotations

from typing import Any

from smetric.serve.apis.base import Api
from smetric.serve.apis.chat import ChatApi
from smetric.serve.apis.completions import CompletionsApi
from smetric.serve.apis.messages import MessagesApi
from smetric.serve.apis.passthrough import PassThroughApi
from smetric.serve.apis.responses import ResponsesApi

__all__ = ["APIS", "ChatApi", "CompletionsApi", "MessagesApi", "PassThroughApi", "ResponsesApi"]

APIS: tuple[Api[Any], ...] = (ChatApi(), CompletionsApi(), ResponsesApi(), MessagesApi(), PassThroughApi())
"""Every API the proxy routes, in the order of its routes table."""
