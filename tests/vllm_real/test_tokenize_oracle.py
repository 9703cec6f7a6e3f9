"""The proxy's routing tokens equal the engine's prompt ids (vLLM's ``/tokenize`` as the oracle).

``smetric serve`` routes on ids it computes itself from a local ``tokenizer.json`` and the chat
template (``smetric.serve.tokens``); its block hashes equal the engine's only if those ids do. For
every conversation shape the real-engine tests send (``conversations.SHAPES``), over several turns
whose assistant messages are the engine's own (random-model) answers, the ids of a chat request and
of a text completion must equal what the engine's ``/tokenize`` returns for the same request —
the app's ids (``TokenSource``) and the compiled gateway's (``GatewayTokenSource``, its own
``tokenizers`` and minijinja) alike.
"""

from __future__ import annotations

import json
from array import array

import pytest
from conversations import SHAPES, Conversation
from real_util import TOKENIZER, Fleet, fleet, http_json

from smetric._core import gateway_routing_ids
from smetric.serve.compiled import gateway_token_source
from smetric.serve.request import parse_request
from smetric.serve.tokens import TokenConfig, TokenSource

pytestmark = pytest.mark.vllm_real

TURNS = 4


@pytest.mark.parametrize("shape", SHAPES)
def test_chat_routing_tokens_equal_the_engines_prompt_ids(vllm_fleet: Fleet, shape: str) -> None:
    source = TokenSource(TokenConfig(mode="tokenizer", tokenizer=str(TOKENIZER)))
    native = gateway_token_source(source)
    engine = vllm_fleet.urls[0]
    conv = Conversation(shape, seed=7)
    for _ in range(TURNS):
        body = {"model": fleet.MODEL_NAME, "messages": conv.messages, **conv.extra()}
        ours = list(source.routing_tokens(parse_request(json.dumps(body).encode(), "chat")).ids)
        tools = {"tools": body["tools"]} if "tools" in body else {}
        _, theirs = http_json(
            engine + "/tokenize",
            {"model": fleet.MODEL_NAME, "messages": conv.messages, "add_generation_prompt": True, **tools},
        )
        assert ours == theirs["tokens"], f"{shape}: {len(ours)} vs {len(theirs['tokens'])} ids"
        planned = gateway_routing_ids("/v1/chat/completions", json.dumps(body).encode(), tokens=native)
        assert planned is not None, f"{shape}: the gateway hands the body to the app"
        assert array("I", planned[0]).tolist() == theirs["tokens"], f"{shape}: the gateway's ids differ"
        _, answer = http_json(engine + "/v1/chat/completions", {**body, "max_tokens": 12, "ignore_eos": True})
        # The engine's own answer (random tokens decoded) goes back into the history, as a client sends it.
        conv.answer(answer["choices"][0]["message"]["content"] or "")


def test_completion_routing_tokens_equal_the_engines_prompt_ids(vllm_fleet: Fleet) -> None:
    source = TokenSource(TokenConfig(mode="tokenizer", tokenizer=str(TOKENIZER)))
    native = gateway_token_source(source)
    engine = vllm_fleet.urls[1]
    prompt = "def route(request):\n    return policy.decide(request)  # <tool_call> é ✓"
    for _ in range(TURNS):
        body = {"model": fleet.MODEL_NAME, "prompt": prompt}
        ours = list(source.routing_tokens(parse_request(json.dumps(body).encode(), "completions")).ids)
        _, theirs = http_json(engine + "/tokenize", body)
        assert ours == theirs["tokens"]
        planned = gateway_routing_ids("/v1/completions", json.dumps(body).encode(), tokens=native)
        assert planned is not None and array("I", planned[0]).tolist() == theirs["tokens"]
        _, answer = http_json(engine + "/v1/completions", {**body, "max_tokens": 12, "ignore_eos": True})
        prompt += answer["choices"][0]["text"] + "\nnext:"
