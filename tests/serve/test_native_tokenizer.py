"""The compiled data plane with a chat template routes exactly as the app: for every chat,
completions, Messages and Responses body the gateway's native path would route with the model's
chat template (``smetric._core.GatewayTokenSource``) — encoded with the tokenizer
(``--tokens tokenizer``) or cut into approximate 4-byte ids (``--tokens approximate`` with a
template) — the ids and the turn verdict equal the app's (``smetric.serve.chat_template`` under
jinja2, the ``tokenizers`` package), on every template of the tests — ChatML, the test model's tool template (content
format "openai"), a template exercising namespace, slices, string methods, filters and tojson
options — and it routes no body the app refuses. The piece cache is held to its claims (a
follow-up encodes only its new pieces, the bound holds) and the gateway's encoder to the
library's whole-text encode. The ids equal a real engine's ``/tokenize`` in
``tests/vllm_real/test_native_tokenizer_real.py``.
Bounded: a few thousand bodies, no server.
"""

from __future__ import annotations

import json
import random
from array import array
from pathlib import Path
from typing import Any

import pytest
from bodies import RESPONSE_ID_KEY, app_ids, chat_body, completions_body, messages_body, responses_body, spoiled
from test_tokens import CONVERSATIONS, TOOLS
from test_tokens import FEATURES_TEMPLATE as TOKENS_FEATURES_TEMPLATE

pytest.importorskip("tokenizers")
pytest.importorskip("jinja2")

from smetric import InvalidConfigError
from smetric._core import GatewayTokenSource, gateway_routing_ids
from smetric.serve.apis.chat import ChatApi
from smetric.serve.apis.completions import CompletionsApi
from smetric.serve.apis.messages import MessagesApi
from smetric.serve.apis.responses import ResponsesApi
from smetric.serve.chat_template import CHATML_TEMPLATE
from smetric.serve.compiled import gateway_token_source
from smetric.serve.pinning import ResponseIds
from smetric.serve.tokens import TokenConfig, TokenSource

DATA = Path(__file__).resolve().parents[1] / "data" / "serve"
TOKENIZER = DATA / "tokenizer.json"
SEED = 20261204
BODIES = 400

# test_tokens' template of Jinja features, with a `{% generation %}` block and a template kwarg.
FEATURES_TEMPLATE = (
    TOKENS_FEATURES_TEMPLATE.replace(
        "{%- endfor %}<|im_end|>", "{%- endfor %}{% generation %}<|im_end|>{% endgeneration %}"
    )
    + "{{- reasoning_effort if reasoning_effort is defined else '' -}}\n"
)
assert "{% generation %}" in FEATURES_TEMPLATE

# Qwen's rule: a system message anywhere but first is refused (vLLM's Messages endpoint then
# merges inline system messages into the leading one).
LEADING_SYSTEM_TEMPLATE = """\
{%- for m in messages -%}
    {%- if m.role == 'system' and not loop.first -%}
        {{- raise_exception('System message must be at the beginning.') -}}
    {%- endif -%}
    <|im_start|>{{ m.role }}
{% if m.content is string %}{{ m.content }}{% endif %}
{%- if m.reasoning_content is defined %}<think>{{ m.reasoning_content }}</think>{% endif %}
{%- for call in m.tool_calls | default([]) %}<tool_call>{{ call.function | tojson }}</tool_call>{% endfor %}
{%- if m.tool_call_id is defined %} [{{ m.tool_call_id }}]{% endif %}<|im_end|>
{% endfor -%}
{%- if tools %}{{ tools | tojson }}{% endif -%}
{%- if enable_thinking is defined %}thinking={{ enable_thinking }} {{ reasoning_effort }}{% endif -%}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif -%}
"""

# name → the app's token config (None: the test model's own template, content format "openai").
TEMPLATES: dict[str, str | None] = {
    "model": None,
    "chatml": CHATML_TEMPLATE,
    "tools file": str(DATA / "chatml_tools.jinja"),
    "features": FEATURES_TEMPLATE,
    "leading system": LEADING_SYSTEM_TEMPLATE,
}


# Each template in each mode the gateway renders it in (approximate mode has the test model's own
# template only through its tokenizer's folder, so not that one).
TEMPLATE_MODES = [
    (name, mode)
    for name in sorted(TEMPLATES)
    for mode in ("tokenizer", "approximate")
    if not (mode == "approximate" and TEMPLATES[name] is None)
]


def sources(template: str | None, mode: str = "tokenizer") -> tuple[TokenSource, GatewayTokenSource]:
    """The app's token source and the gateway's, in ``mode`` (``approximate``: 4-byte chunks of the
    rendered template, no tokenizer)."""
    if mode == "approximate":
        app = TokenSource(TokenConfig(mode="approximate", chat_template=template))
    else:
        app = TokenSource(TokenConfig(mode="tokenizer", tokenizer=str(TOKENIZER), chat_template=template))
    native = gateway_token_source(app)
    assert native is not None and native.kind == mode
    return app, native


def agent_extras(rng: random.Random, body: dict[str, Any]) -> dict[str, Any]:
    """What agents add to a chat body: reasoning, tool results as parts, template kwargs,
    argument objects in key order, special tokens for text prompts."""
    for message in body.get("messages") or []:
        if not isinstance(message, dict):
            continue
        if message.get("role") == "assistant" and rng.random() < 0.3:
            message["reasoning"] = "think: " + str(rng.random())
        if message.get("role") == "tool" and rng.random() < 0.3:
            message["tool_call_id"] = "c"
            message["content"] = [{"type": "text", "text": "out"}, {"type": "text", "text": "put ü"}]
        for call in message.get("tool_calls") or []:
            if isinstance(call, dict) and isinstance(call.get("function"), dict) and rng.random() < 0.5:
                call["function"]["arguments"] = json.dumps({"z": 1, "a": [1.5, None, True], "m": {"é": "x"}})
    if rng.random() < 0.2:
        body["chat_template_kwargs"] = rng.choice(
            [{"reasoning_effort": "high"}, {"add_generation_prompt": False}, {"enable_thinking": True}]
        )
    if rng.random() < 0.2:
        body["add_special_tokens"] = rng.random() < 0.5
    if "tools" in body and rng.random() < 0.3:
        body["tools"].append(
            {
                "type": "function",
                "function": {
                    "name": "grep",
                    "description": "search",
                    "strict": True,
                    "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
                },
            }
        )
    return body


def differential(
    path: str, bodies: list[dict[str, Any]], native: GatewayTokenSource, app: Any, rng: random.Random
) -> list[tuple[bool, bool]]:
    """Each body posted to ``path``: whether the gateway routes it and whether the app does. Where
    the gateway routes one, the app must too, with the same ids and turn verdict (``app(raw)``)."""
    out = []
    for body in bodies:
        raw = json.dumps(body, ensure_ascii=rng.random() < 0.5).encode()
        planned = gateway_routing_ids(path, raw, tokens=native)
        expected = app(raw)
        if planned is not None:
            assert expected is not None, ("the native path routes a body the app refuses", body)
            assert (array("I", planned[0]).tolist(), planned[1]) == expected, ("a different rendering", body)
        out.append((planned is not None, expected is not None))
    return out


def generated(make: Any, rng: random.Random) -> list[dict[str, Any]]:
    """``BODIES`` bodies of ``make``, every other one spoiled."""
    return [spoiled(rng, make(rng)) if i % 2 else make(rng) for i in range(BODIES)]


def assert_mostly_served(results: list[tuple[bool, bool]]) -> None:
    """The negative control of the claim: a body the app renders is almost always served natively."""
    served, accepted = sum(r[0] for r in results), sum(r[1] for r in results)
    assert accepted >= len(results) // 3, accepted
    assert served >= accepted * 0.9, (served, accepted)


@pytest.mark.parametrize(("template", "mode"), TEMPLATE_MODES)
def test_chat_is_routed_as_the_app_routes_it_or_handed_over(template: str, mode: str) -> None:
    app, native = sources(TEMPLATES[template], mode)
    rng = random.Random(SEED)
    bodies = generated(lambda r: agent_extras(r, chat_body(r)), rng)
    results = differential("/v1/chat/completions", bodies, native, lambda raw: app_ids(ChatApi(), app, raw), rng)
    assert_mostly_served(results)


@pytest.mark.parametrize("template", sorted(TEMPLATES))
@pytest.mark.parametrize("conversation", sorted(CONVERSATIONS))
def test_the_hand_written_conversations_with_every_option(template: str, conversation: str) -> None:
    app, native = sources(TEMPLATES[template])
    options: list[dict[str, Any]] = [
        {},
        {"tools": TOOLS},
        {"tools": []},
        {"add_generation_prompt": False},
        {"continue_final_message": True, "add_generation_prompt": False},
        {"chat_template_kwargs": {"reasoning_effort": "low", "continue_final_message": True}},
        {"add_special_tokens": True},
    ]
    served = 0
    for extra in options:
        raw = json.dumps({"model": "m", "messages": CONVERSATIONS[conversation]} | extra).encode()
        planned = gateway_routing_ids("/v1/chat/completions", raw, tokens=native)
        expected = app_ids(ChatApi(), app, raw)
        if planned is not None:
            assert expected is not None, extra
            assert (array("I", planned[0]).tolist(), planned[1]) == expected, extra
            served += 1
        else:
            assert expected is None, ("handed over a body the app renders", extra)
    assert served >= 1


CLAUDE_CODE_TURN = {
    "model": "m",
    "max_tokens": 64,
    "system": [
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=2"},
        {"type": "text", "text": "You are Claude Code."},
    ],
    "messages": [
        {"role": "user", "content": "list the files"},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "ls first", "signature": "s"},
                {"type": "text", "text": "Listing."},
                {"type": "tool_use", "id": "t1", "name": "ls", "input": {"path": ".", "all": True, "depth": 1.5}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "a.py"}]},
                {"type": "text", "text": "now open it"},
            ],
        },
        {"role": "system", "content": "inline reminder"},
        {"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "u"}}, "x"][:1]},
    ],
    "tools": [
        {"name": "ls", "description": "list", "input_schema": {"properties": {"path": {"type": "string"}}}},
        {"name": "read", "input_schema": {"type": "object"}, "strict": True},
    ],
    "thinking": {"type": "enabled", "budget_tokens": 2048},
    "output_config": {"effort": "high"},
}


@pytest.mark.parametrize(("template", "mode"), TEMPLATE_MODES)
def test_messages_are_routed_as_the_app_routes_them_or_handed_over(template: str, mode: str) -> None:
    app, native = sources(TEMPLATES[template], mode)
    rng = random.Random(SEED + 3)
    turns = [CLAUDE_CODE_TURN, {**CLAUDE_CODE_TURN, "thinking": {"type": "disabled"}, "output_config": None}]
    results = differential(
        "/v1/messages", turns + generated(messages_body, rng), native, lambda raw: app_ids(MessagesApi(), app, raw), rng
    )
    assert results[:2] == [(True, True)] * 2, template
    assert_mostly_served(results)


CODEX_TURN = {
    "model": "m",
    "instructions": "You are Codex.",
    "input": [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "sandbox: on"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "fix the test"}]},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "look first"}], "content": None},
        {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": '{"cmd": ["ls"], "z": 1}'},
        {"type": "function_call", "call_id": "c2", "name": "shell", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "a.py"},
        {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "b"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Done."}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "thanks"}]},
    ],
    "tools": [
        {
            "type": "function",
            "name": "shell",
            "description": "run",
            "strict": False,
            "parameters": {"type": "object", "properties": {"cmd": {"type": "array"}}},
        },
        {"type": "web_search"},
    ],
    "store": False,
    "stream": True,
}


@pytest.mark.parametrize(("template", "mode"), TEMPLATE_MODES)
def test_responses_are_routed_as_the_app_routes_them_or_handed_over(template: str, mode: str) -> None:
    app, native = sources(TEMPLATES[template], mode)
    rng = random.Random(SEED + 4)
    # A follow-up names a stored response by an id the proxy issued (the native path opens it
    # before it routes, and hands an id it cannot open to the app): its routing ids are the
    # new input's, as the app's.
    api = ResponsesApi(ResponseIds(RESPONSE_ID_KEY))
    bodies = [CODEX_TURN, *generated(responses_body, rng)]
    assert any("previous_response_id" in b for b in bodies), "the corpus has follow-ups"
    results = differential("/v1/responses", bodies, native, lambda raw: app_ids(api, app, raw), rng)
    # The features template refuses Codex's developer message: both refuse it there.
    assert results[0] == ((False, False) if template == "features" else (True, True)), template
    assert_mostly_served(results)


def test_text_prompts_get_the_apps_ids_and_special_tokens() -> None:
    app, native = sources(None)
    api = CompletionsApi()
    rng = random.Random(SEED + 1)
    served = 0
    for _ in range(BODIES):
        body = completions_body(rng)
        if rng.random() < 0.5:
            body["add_special_tokens"] = rng.random() < 0.5
        raw = json.dumps(body).encode()
        planned = gateway_routing_ids("/v1/completions", raw, tokens=native)
        expected = app_ids(api, app, raw)
        if planned is not None:
            assert expected is not None, body
            assert array("I", planned[0]).tolist() == expected[0], body
            served += 1
    assert served >= BODIES // 3, served


def test_a_body_the_template_refuses_is_the_apps() -> None:
    _, native = sources(FEATURES_TEMPLATE)
    raw = json.dumps({"model": "m", "messages": [{"role": "narrator", "content": "x"}]}).encode()
    assert gateway_routing_ids("/v1/chat/completions", raw, tokens=native) is None
    ok = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}]}).encode()
    assert gateway_routing_ids("/v1/chat/completions", ok, tokens=native) is not None


def test_the_encoder_equals_the_library_and_a_follow_up_encodes_only_its_new_pieces() -> None:
    from tokenizers import Tokenizer

    library = Tokenizer.from_file(str(TOKENIZER))
    _, native = sources(None)
    assert native.exact_pieces
    rng = random.Random(SEED + 2)
    history = "<|im_start|>system\nYou route requests.<|im_end|>\n"
    for turn in range(20):
        words = " ".join(rng.choice(["a", "bé", "  x", "\t"]) for _ in range(30))
        history += f"<|im_start|>user\nturn {turn}: {words}<|im_end|>\n"
        before = native.cache_stats()
        ids = array("I", native.encode(history)).tolist()
        after = native.cache_stats()
        assert ids == library.encode(history, add_special_tokens=False).ids
        if turn:
            # Only the new message's piece (and its newline) missed.
            assert after["misses"] - before["misses"] <= 2, (before, after)
    special = array("I", native.encode("hello", add_special_tokens=True)).tolist()
    assert special == library.encode("hello", add_special_tokens=True).ids


def test_the_piece_cache_stays_within_its_bound() -> None:
    app = TokenSource(TokenConfig(mode="tokenizer", tokenizer=str(TOKENIZER), piece_cache_bytes=4_096))
    native = gateway_token_source(app)
    assert native is not None
    for k in range(200):
        native.encode(f"<|im_start|>user\npiece number {k} " + "x" * 50 + "<|im_end|>")
        assert native.cache_stats()["bytes"] <= 4_096
    assert 0 < native.cache_stats()["pieces"] < 200


def test_a_sessions_turns_through_the_message_cache_route_on_the_ids_of_a_fresh_source() -> None:
    """Each turn of a growing chat conversation gets, through the message cache, the ids a source
    that never saw the conversation gives it (the same tokenizer, a fresh source per turn); every
    turn after the first finds its history in the cache and normalises only its new messages."""
    _, native = sources(None)
    rng = random.Random(SEED + 3)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You route requests."}]
    for turn in range(8):
        messages.append(
            {"role": "user", "content": f"turn {turn}: " + " ".join(rng.choice(["a", "bé", "\n x"]) for _ in range(40))}
        )
        raw = json.dumps({"model": "m", "messages": messages}).encode()
        before = native.message_cache_stats()
        cached = gateway_routing_ids("/v1/chat/completions", raw, tokens=native)
        after = native.message_cache_stats()
        _, fresh = sources(None)
        assert cached is not None and cached == gateway_routing_ids("/v1/chat/completions", raw, tokens=fresh)
        assert fresh.message_cache_stats()["hits"] == 0
        if turn:
            assert after["hits"] - before["hits"] == len(messages) - 2, (before, after)
            assert after["misses"] - before["misses"] == 2, (before, after)
        messages.append({"role": "assistant", "content": f"done {turn}"})


def test_the_message_cache_stays_within_its_bound() -> None:
    app = TokenSource(TokenConfig(mode="tokenizer", tokenizer=str(TOKENIZER), piece_cache_bytes=4_096))
    native = gateway_token_source(app)
    assert native is not None
    for k in range(100):
        body = {"model": "m", "messages": [{"role": "user", "content": f"message number {k} " + "x" * 200}]}
        assert gateway_routing_ids("/v1/chat/completions", json.dumps(body).encode(), tokens=native) is not None
        assert native.message_cache_stats()["bytes"] <= 4_096
    assert 0 < native.message_cache_stats()["messages"] < 100


def test_a_bad_tokenizer_or_template_is_a_config_error(tmp_path: Path) -> None:
    broken = tmp_path / "tokenizer.json"
    broken.write_text("{}")
    with pytest.raises(InvalidConfigError) as e:
        GatewayTokenSource(
            str(broken), templates=[("default", CHATML_TEMPLATE, "string")], special_tokens=[], piece_cache_bytes=0
        )
    assert e.value.field == "tokenizer"
    with pytest.raises(InvalidConfigError) as e:
        GatewayTokenSource(
            str(TOKENIZER), templates=[("default", "{% for %}", "string")], special_tokens=[], piece_cache_bytes=0
        )
    assert e.value.field == "chat_template"
    with pytest.raises(InvalidConfigError):
        GatewayTokenSource(
            str(TOKENIZER), templates=[("default", CHATML_TEMPLATE, "html")], special_tokens=[], piece_cache_bytes=0
        )
