"""The compiled data plane renders exactly as the app: for every body the gateway's native path
would route (``smetric._core.gateway_routing_ids``), the ids and the turn verdict equal the app's
(``--tokens approximate``, plain ChatML), and it routes no body the app refuses.

The bodies are generated from a fixed seed: agent-shaped conversations (chat with tools and
tool results, completions as text and as ids, Anthropic Messages with system blocks, thinking,
``tool_use`` / ``tool_result`` blocks, images, billing blocks, OpenAI Responses input items as
Codex sends them) and the same bodies with fields of the wrong type, the wrong shape or
missing, so both sides' validation is compared too.
Bounded: a few thousand bodies, no server.
"""

from __future__ import annotations

import json
import random
from array import array
from typing import Any

import pytest
from bodies import RESPONSE_ID_KEY, app_ids, chat_body, completions_body, messages_body, responses_body, spoiled

from smetric._core import gateway_routing_ids
from smetric.serve.apis.chat import ChatApi
from smetric.serve.apis.completions import CompletionsApi
from smetric.serve.apis.messages import MessagesApi
from smetric.serve.apis.responses import ResponsesApi
from smetric.serve.pinning import ResponseIds
from smetric.serve.tokens import TokenConfig, TokenSource

SEED = 20261202
BODIES = 600
SOURCE = TokenSource(TokenConfig(mode="approximate"))
CASES = [
    ("/v1/chat/completions", ChatApi(), chat_body),
    ("/v1/completions", CompletionsApi(), completions_body),
    ("/v1/messages", MessagesApi(), messages_body),
    # Follow-ups name an id issued with the corpus key: the native path opens and pins them.
    ("/v1/responses", ResponsesApi(ResponseIds(RESPONSE_ID_KEY)), responses_body),
]


@pytest.mark.parametrize("chunk", [4, 7], ids=["4-byte chunks", "7-byte chunks (CRC-32)"])
@pytest.mark.parametrize(("path", "api", "make"), CASES, ids=[c[0] for c in CASES])
def test_the_native_path_routes_a_body_exactly_as_the_app_or_hands_it_over(
    path: str, api: Any, make: Any, chunk: int
) -> None:
    source = SOURCE if chunk == 4 else TokenSource(TokenConfig(mode="approximate", approx_chunk_bytes=chunk))
    rng = random.Random(SEED)
    served = refused = 0
    for i in range(BODIES):
        body = make(rng)
        if i % 2:
            body = spoiled(rng, body)
        raw = json.dumps(body, ensure_ascii=rng.random() < 0.5).encode()
        planned = gateway_routing_ids(path, raw, approx_chunk_bytes=chunk)
        native = None if planned is None else (array("I", planned[0]).tolist(), planned[1])
        app = app_ids(api, source, raw)
        if native is not None:
            assert app is not None, ("the native path routes a body the app refuses", body)
            assert native == app, ("a different rendering", body)
            served += 1
        refused += app is None
    # The valid half is served natively almost whole; the spoiled half is mostly refused.
    assert served >= BODIES // 2 * 0.9, served
    assert refused >= BODIES // 10, refused
