"""``smetric.serve.tokens``: the routing ids of each mode.

* approximate: equal to the fake engine's default tokenizer, and so to what a fake engine caches
  (checked live: the router's predicted hit equals the engine's ``cached_tokens``);
* tokenizer: the chat template rendered as transformers' ``apply_chat_template`` renders the
  conversation vLLM hands it, and ids equal to a whole-text encode (the piece cache's claim),
  with its fallbacks;
* ids: passed through; the config errors.
"""

from __future__ import annotations

import copy
import json
import random
import urllib.request
import zlib
from pathlib import Path
from typing import Any

import pytest

from smetric import InvalidConfigError, Router, RouterConfig
from smetric.chat import render_chat
from smetric.fake_engine.tokens import byte_chunk_ids
from smetric.serve.request import OpenAIRequest, RequestError, parse_request
from smetric.serve.tokens import TokenConfig, TokenSource, approximate_ids

tokenizers = pytest.importorskip("tokenizers")
pytest.importorskip("jinja2")

from smetric.serve.chat_template import (  # noqa: E402
    CHATML_TEMPLATE,
    ChatTemplate,
    _tool_dump,
    detect_content_format,
    vllm_conversation,
)
from smetric.serve.piecewise import PiecewiseEncoder, piecewise_blockers  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "data" / "serve"
TOKENIZER = DATA / "tokenizer.json"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file of the repository.",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
        },
    },
    {"type": "function", "function": {"name": "now", "strict": True}},
]
CONVERSATIONS: dict[str, list[dict[str, Any]]] = {
    "plain": [{"role": "user", "content": "Hello there, route me."}],
    "system and turns": [
        {"role": "system", "content": "You are a careful coding agent."},
        {"role": "user", "content": "Fix the bug in  router.rs\n\twith care é ü 漢字"},
        {"role": "assistant", "content": "Done: see the diff."},
        {"role": "user", "content": "Thanks. <|im_end|> is not a role"},
    ],
    "list content": [
        {"role": "system", "content": [{"type": "text", "text": "Sys A."}, {"type": "text", "text": "Sys B."}]},
        {"role": "user", "content": [{"type": "text", "text": "part one"}, "part two", {"type": "text", "text": None}]},
    ],
    "tool calls": [
        {"role": "system", "content": "Use the tools."},
        {"role": "user", "content": "Read README.md and the time."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "x.md"}'}},
                {"id": "c2", "type": "function", "function": {"name": "now", "arguments": "not json"}},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "# smetric\nroutes requests"},
        {
            "role": "tool",
            "tool_call_id": "c2",
            "content": [{"type": "text", "text": "09:00"}, {"type": "text", "text": "UTC"}],
        },
        {"role": "assistant", "content": "It is 09:00.", "reasoning": "The tool said so.", "tool_calls": []},
        {"role": "user", "content": "Good.", "name": "reviewer"},
    ],
}


@pytest.fixture(scope="module")
def hf() -> Any:
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(str(DATA))


def chat_request(messages: list[dict[str, Any]], **extra: Any) -> OpenAIRequest:
    return parse_request(json.dumps({"model": "m", "messages": messages} | extra).encode(), "chat")


def completions_request(prompt: Any) -> OpenAIRequest:
    return parse_request(json.dumps({"model": "m", "prompt": prompt}).encode(), "completions")


# -- approximate -------------------------------------------------------------------------------


APPROXIMATE_CASES = {
    **{k: v for k, v in CONVERSATIONS.items() if k != "list content"},
    "list content": [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url"}, {"text": "b"}]},
    ],
}


@pytest.mark.parametrize("name", sorted(APPROXIMATE_CASES))
def test_approximate_ids_equal_the_fake_engines(name: str) -> None:
    messages = APPROXIMATE_CASES[name]
    routed = TokenSource(TokenConfig(mode="approximate")).routing_tokens(chat_request(messages))
    assert routed.source == "approximate"
    assert routed.ids.tolist() == byte_chunk_ids(render_chat(messages))
    assert routed.count == len(routed.ids)


def test_approximate_mode_rejects_what_the_fake_engine_rejects() -> None:
    with pytest.raises(RequestError) as info:
        TokenSource().routing_tokens(chat_request([{"role": "user", "content": [{"type": "text", "text": None}]}]))
    assert info.value.status == 400 and info.value.param == "messages"


def test_approximate_text_prompt_and_other_chunk_sizes() -> None:
    text = "abcdefghij é"
    assert TokenSource().routing_tokens(completions_request(text)).ids.tolist() == byte_chunk_ids(text)
    data = text.encode()
    assert approximate_ids(text, 5).tolist() == [zlib.crc32(data[i : i + 5]) for i in range(0, len(data), 5)]
    assert approximate_ids("", 4).tolist() == [] and approximate_ids("", 3).tolist() == []


def test_approximate_mode_sees_the_fake_engines_real_prefix_hits() -> None:
    pytest.importorskip("aiohttp")
    pytest.importorskip("zmq")
    from smetric.fake_engine import FakeEngine

    def post(url: str, body: bytes) -> tuple[int, bytes]:
        req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10.0) as resp:
            return resp.status, resp.read()

    source = TokenSource(TokenConfig(mode="approximate"))
    router = Router(["e0"], block_size=16, config=RouterConfig(index_mode="approximate"))
    history = [{"role": "system", "content": "You are a coding agent. " * 20}, {"role": "user", "content": "step 1"}]
    with FakeEngine(speedup=1000.0) as fe:
        hits = []
        for turn in range(3):
            body = json.dumps({"model": "fake-model", "messages": history, "max_tokens": 2}).encode()
            routed = source.routing_tokens(parse_request(body, "chat"))
            decision = router.route(routed.ids, messages=history)
            status, raw = post(fe.url + "/v1/chat/completions", body)
            assert status == 200, raw
            usage = json.loads(raw)["usage"]
            assert usage["prompt_tokens"] == routed.count
            hits.append((decision.local_hit_tokens, usage["prompt_tokens_details"]["cached_tokens"]))
            router.on_prefilled(decision.request_id)
            router.on_finished(decision.request_id, output_tokens=2)
            reply = json.loads(raw)["choices"][0]["message"]["content"]
            history += [{"role": "assistant", "content": reply}, {"role": "user", "content": f"step {turn + 2}"}]
    assert hits[0] == (0, 0)
    assert all(predicted == served > 0 for predicted, served in hits[1:]), hits


# -- ids, config --------------------------------------------------------------------------------


def test_ids_win_in_every_mode_and_ids_mode_rejects_text() -> None:
    req = completions_request([5, 6, 7])
    for mode in ("auto", "ids", "approximate"):
        routed = TokenSource(TokenConfig(mode=mode)).routing_tokens(req)
        assert routed.source == "ids" and routed.ids is req.prompt_ids and routed.count == 3
    ids_only = TokenSource(TokenConfig(mode="ids"))
    for request, param in ((chat_request(CONVERSATIONS["plain"]), "messages"), (completions_request("text"), "prompt")):
        with pytest.raises(RequestError) as info:
            ids_only.routing_tokens(request)
        assert info.value.status == 400 and info.value.param == param


@pytest.mark.parametrize(
    ("config", "field"),
    [
        (TokenConfig(mode="tokenizer"), "tokenizer"),
        (TokenConfig(approx_chunk_bytes=0), "approx_chunk_bytes"),
        (TokenConfig(mode="bogus"), "mode"),  # type: ignore[arg-type]
        (TokenConfig(mode="approximate", chat_template="no/such/file.jinja"), "chat_template"),
    ],
)
def test_config_errors(config: TokenConfig, field: str) -> None:
    with pytest.raises(InvalidConfigError) as info:
        TokenSource(config)
    assert info.value.field == field


# -- the chat template, against transformers --------------------------------------------------


def hf_render(hf: Any, template: str, messages: list[dict[str, Any]], fmt: str, **kw: Any) -> str:
    """What transformers renders for the conversation vLLM hands it (vLLM's step done by hand)."""
    tools = kw.pop("tools", None)
    dumped = [_tool_dump(t) for t in tools] if tools is not None else None
    text: str = hf.apply_chat_template(
        vllm_conversation(copy.deepcopy(messages), fmt), tools=dumped, chat_template=template, tokenize=False, **kw
    )
    return text


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
@pytest.mark.parametrize("with_tools", [False, True])
def test_render_and_ids_equal_transformers(hf: Any, name: str, with_tools: bool) -> None:
    messages = CONVERSATIONS[name]
    extra: dict[str, Any] = {"tools": TOOLS} if with_tools else {}
    source = TokenSource(TokenConfig(tokenizer=str(TOKENIZER)))
    req = chat_request(messages, **extra)
    template = source._templates["default"]
    expected = hf_render(hf, template.source, messages, template.content_format, add_generation_prompt=True, **extra)
    assert source.render(req) == expected
    routed = source.routing_tokens(req)
    assert routed.source == "tokenizer"
    assert routed.ids.tolist() == hf.encode(expected, add_special_tokens=False)


@pytest.mark.parametrize(
    "extra",
    [
        {"add_generation_prompt": False},
        {"chat_template_kwargs": {"enable_thinking": False}},
        {"continue_final_message": True, "add_generation_prompt": False},
        {"chat_template_kwargs": {"add_generation_prompt": False}},
    ],
)
def test_request_options_reach_the_template(hf: Any, extra: dict[str, Any]) -> None:
    messages = [*CONVERSATIONS["system and turns"], {"role": "assistant", "content": "Partial answer"}]
    source = TokenSource(TokenConfig(tokenizer=str(TOKENIZER)))
    template = source._templates["default"]
    kwargs = dict(extra.get("chat_template_kwargs", {}))
    # vLLM merges chat_template_kwargs over its own add_generation_prompt.
    generation_prompt = kwargs.pop("add_generation_prompt", extra.get("add_generation_prompt", True))
    expected = hf_render(
        hf,
        template.source,
        messages,
        template.content_format,
        add_generation_prompt=generation_prompt,
        continue_final_message=extra.get("continue_final_message", False),
        **kwargs,
    )
    if not kwargs:  # (enable_thinking=False appends an empty think block after the prompt)
        assert expected.endswith("<|im_start|>assistant\n") == generation_prompt
    assert source.render(chat_request(messages, **extra)) == expected


FEATURES_TEMPLATE = """\
{%- set ns = namespace(last_user=-1, tools_seen=0) -%}
{%- for m in messages[::-1] -%}
    {%- if ns.last_user < 0 and m.role == 'user' -%}
        {%- set ns.last_user = messages | length - 1 - loop.index0 -%}
    {%- endif -%}
{%- endfor -%}
{%- if tools -%}<|im_start|>system
{{ tools | map(attribute='function') | map(attribute='name') | join(', ') }}
{{ tools[0] | tojson(indent=2) }}<|im_end|>
{% endif -%}
{%- for m in messages -%}
    {%- if m.role not in ['system', 'user', 'assistant', 'tool'] -%}
        {{- raise_exception('bad role ' + m.role) -}}
    {%- endif -%}
    <|im_start|>{{ m.role }}{% if loop.index0 == ns.last_user %} (last){% endif %}
{% if m.content is string -%}
    {%- if m.content.startswith('Fix') %}[fix] {% endif -%}{{ m.content.strip() | replace('  ', ' ') }}
{%- endif -%}
{%- for call in m.tool_calls | default([]) %}
<tool_call>{{ call.function.name }} {{ call.function.arguments | tojson }}</tool_call>
{%- set ns.tools_seen = ns.tools_seen + 1 -%}
{%- endfor %}<|im_end|>
{% endfor -%}
{%- if add_generation_prompt -%}<|im_start|>assistant ({{ ns.tools_seen }} calls so far)
{% endif -%}
"""


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
def test_template_features_render_as_in_transformers(hf: Any, name: str) -> None:
    # namespace, reversed slices, string methods, filters, tojson options, default, loop vars.
    messages = CONVERSATIONS[name]
    source = TokenSource(TokenConfig(tokenizer=str(TOKENIZER), chat_template=FEATURES_TEMPLATE))
    template = source._templates["default"]
    assert template.content_format == "string"
    expected = hf_render(hf, FEATURES_TEMPLATE, messages, "string", add_generation_prompt=True, tools=TOOLS)
    assert source.render(chat_request(messages, tools=TOOLS)) == expected
    with pytest.raises(RequestError, match="bad role"):
        source.render(chat_request([{"role": "narrator", "content": "x"}]))


def test_string_format_chatml_default_and_template_file(hf: Any, tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_bytes(TOKENIZER.read_bytes())
    source = TokenSource(TokenConfig(tokenizer=str(tmp_path / "tokenizer.json")))
    template = source._templates["default"]
    assert template.source == CHATML_TEMPLATE and template.content_format == "string"
    messages = CONVERSATIONS["list content"]
    expected = hf_render(hf, CHATML_TEMPLATE, messages, "string", add_generation_prompt=True)
    assert "Sys A.\nSys B." in expected, "vLLM's string format joins text parts with newlines"
    assert source.render(chat_request(messages)) == expected
    (tmp_path / "chat_template.jinja").write_text("{{ bos_token }}{% for m in messages %}[{{ m.role }}]{% endfor %}")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"bos_token": {"content": "<|endoftext|>"}}))
    shipped = TokenSource(TokenConfig(tokenizer=str(tmp_path / "tokenizer.json")))
    assert shipped.render(chat_request(messages)) == "<|endoftext|>[system][user]"
    (tmp_path / "chat_template.jinja").unlink()
    named = [{"name": "default", "template": "plain"}, {"name": "tool_use", "template": "{{ tools | length }} tools"}]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": named}))
    chooser = TokenSource(TokenConfig(tokenizer=str(tmp_path / "tokenizer.json")))
    assert chooser.render(chat_request(messages)) == "plain"
    assert chooser.render(chat_request(messages, tools=[])) == "0 tools"
    assert chooser.render(chat_request(messages, tools=TOOLS)) == "2 tools"


def test_vllms_message_steps() -> None:
    conv = vllm_conversation(CONVERSATIONS["tool calls"], "string")
    assert conv[2]["content"] == "" and [c["function"]["arguments"] for c in conv[2]["tool_calls"]] == [
        {"path": "x.md"},
        {},
    ]
    assert conv[4] == {"role": "tool", "content": "09:00\nUTC", "tool_call_id": "c2"}
    assert "tool_calls" not in conv[5] and conv[5]["reasoning_content"] == "The tool said so."
    assert conv[6]["name"] == "reviewer"
    parts = vllm_conversation(CONVERSATIONS["list content"], "openai")[1]["content"]
    assert parts == [{"type": "text", "text": "part one"}, {"type": "text", "text": "part two"}]
    one = vllm_conversation([{"role": "user", "content": "x"}], "openai")[0]["content"]
    assert one == [{"type": "text", "text": "x"}]
    picture = {"type": "image_url", "image_url": {"url": "u"}}
    image = [{"role": "user", "content": [picture, {"type": "text", "text": "t"}]}]
    assert vllm_conversation(image, "openai")[0]["content"] == [{"type": "image"}, {"type": "text", "text": "t"}]
    assert vllm_conversation(image, "string")[0]["content"] == "t"


def test_content_format_detection() -> None:
    assert detect_content_format((DATA / "chatml_tools.jinja").read_text()) == "openai"
    assert detect_content_format(CHATML_TEMPLATE) == "string"
    sliced = "{% set rest = messages[1:] %}{% for m in rest %}{% for p in m.content | list %}x{% endfor %}{% endfor %}"
    assert detect_content_format(sliced) == "openai"
    # vLLM's walk follows names bound to messages, not to a message's content: this is "string".
    via_set = "{% for m in messages %}{% set c = m['content'] %}{% for p in c %}{{ p.text }}{% endfor %}{% endfor %}"
    assert detect_content_format(via_set) == "string"
    assert detect_content_format("{% for t in tools %}{% for p in t.content %}{% endfor %}{% endfor %}") == "string"
    assert detect_content_format("{% for m in messages %") == "string"


def test_template_errors_are_400s() -> None:
    strict = "{% for m in messages %}{% if m.role == 'user' %}{{ raise_exception('no users') }}{% endif %}{% endfor %}"
    source = TokenSource(TokenConfig(mode="approximate", chat_template=strict))
    with pytest.raises(RequestError, match="no users") as info:
        source.routing_tokens(chat_request(CONVERSATIONS["plain"]))
    assert info.value.status == 400 and info.value.param == "messages"
    odd = chat_request([{"role": "user", "content": [{"type": "hologram"}]}])
    with pytest.raises(RequestError, match="hologram"):
        TokenSource(TokenConfig(tokenizer=str(TOKENIZER))).routing_tokens(odd)
    sandboxed = ChatTemplate("{{ messages.append(1) }}")
    with pytest.raises(Exception, match="rejected"):
        sandboxed.render([{"role": "user", "content": "x"}])


# -- the piece cache ----------------------------------------------------------------------------


def random_texts(seed: int, n: int) -> list[str]:
    rng = random.Random(seed)
    atoms = [
        "<|im_start|>",
        "<|im_end|>",
        "<|endoftext|>",
        "<tool_call>",
        "</tool_call>",
        "<tool_response>",
        "<think>",
        "\n",
        " ",
        "  ",
        "\t",
        "user",
        "assistant",
        " the router",
        "é",
        "漢字",
        "def f(x):\n    return x",
        "<|im_",
        "tool_call>",
        "1234567",
    ]
    return ["".join(rng.choice(atoms) for _ in range(rng.randint(0, 40))) for _ in range(n)]


def test_pieces_concatenate_to_the_whole_encoding() -> None:
    whole = tokenizers.Tokenizer.from_file(str(TOKENIZER))
    encoder = PiecewiseEncoder(TOKENIZER, cache_bytes=1 << 20)
    assert encoder.exact_pieces and encoder.blockers == []
    for text in random_texts(5, 300):
        assert encoder.encode(text).tolist() == whole.encode(text, add_special_tokens=False).ids, repr(text)
    assert encoder.hits > 0


def test_a_follow_up_encodes_only_its_new_pieces() -> None:
    source = TokenSource(TokenConfig(tokenizer=str(TOKENIZER)))
    assert source.encoder is not None
    history = CONVERSATIONS["tool calls"]
    source.routing_tokens(chat_request(history, tools=TOOLS))
    misses = source.encoder.misses
    follow = [*history, {"role": "assistant", "content": "Anything else?"}, {"role": "user", "content": "No."}]
    routed = source.routing_tokens(chat_request(follow, tools=TOOLS))
    new_pieces = source.encoder.misses - misses
    assert 1 <= new_pieces <= 3, new_pieces
    expected = source.encoder.encode_whole(source.render(chat_request(follow, tools=TOOLS)))
    assert routed.ids == expected


def test_the_cache_stays_within_its_byte_bound() -> None:
    bound = 4000
    encoder = PiecewiseEncoder(TOKENIZER, cache_bytes=bound)
    whole = tokenizers.Tokenizer.from_file(str(TOKENIZER))
    for text in random_texts(9, 200):
        assert encoder.encode(text).tolist() == whole.encode(text, add_special_tokens=False).ids
        assert encoder.cached_bytes <= bound
    assert encoder.cached_pieces > 0
    big = "x" * (bound + 1)
    encoder.encode(big)
    assert encoder.cached_bytes <= bound


def fixture_config() -> dict[str, Any]:
    config: dict[str, Any] = json.loads(TOKENIZER.read_text())
    return config


@pytest.mark.parametrize("flag", ["lstrip", "rstrip", "single_word", "normalized"])
def test_added_token_options_fall_back_to_whole_text(tmp_path: Path, flag: str) -> None:
    config = fixture_config()
    target = next(t for t in config["added_tokens"] if t["content"] == "<|im_end|>")
    target[flag] = True
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(config))
    encoder = PiecewiseEncoder(path, cache_bytes=1 << 20)
    assert not encoder.exact_pieces and any(flag in b for b in encoder.blockers)
    whole = tokenizers.Tokenizer.from_file(str(path))
    for text in random_texts(3, 50):
        assert encoder.encode(text).tolist() == whole.encode(text, add_special_tokens=False).ids


def test_lstrip_really_breaks_the_piecewise_identity(tmp_path: Path) -> None:
    # The negative control of the fallback: with lstrip, splitting first gives other ids.
    config = fixture_config()
    next(t for t in config["added_tokens"] if t["content"] == "<|im_end|>")["lstrip"] = True
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(config))
    whole = tokenizers.Tokenizer.from_file(str(path))
    text = "hello   <|im_end|>"
    naive = [*whole.encode("hello   ", add_special_tokens=False).ids, whole.token_to_id("<|im_end|>")]
    assert whole.encode(text, add_special_tokens=False).ids != naive


def test_metaspace_first_is_a_blocker() -> None:
    metaspace = {"type": "Metaspace", "prepend_scheme": "first"}
    config = {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [metaspace]}}
    assert piecewise_blockers(config) == ["a Metaspace pre-tokenizer with prepend_scheme 'first'"]
    assert piecewise_blockers({"pre_tokenizer": {"type": "Metaspace", "prepend_scheme": "always"}}) == []


def test_text_prompts_get_the_special_tokens_vllm_adds(tmp_path: Path) -> None:
    tok = tokenizers.Tokenizer.from_file(str(TOKENIZER))
    tok.post_processor = tokenizers.processors.TemplateProcessing(
        single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", tok.token_to_id("<|endoftext|>"))]
    )
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    source = TokenSource(TokenConfig(tokenizer=str(path)))
    for text in ["route this <|im_end|> prompt", "", "plain"]:
        routed = source.routing_tokens(completions_request(text))
        assert routed.ids.tolist() == tok.encode(text, add_special_tokens=True).ids
        assert routed.ids[0] == tok.token_to_id("<|endoftext|>")
    without = parse_request(json.dumps({"prompt": "plain", "add_special_tokens": False}).encode(), "completions")
    assert source.routing_tokens(without).ids.tolist() == tok.encode("plain", add_special_tokens=False).ids
    messages = CONVERSATIONS["plain"]
    with_bos = source.routing_tokens(chat_request(messages, add_special_tokens=True)).ids.tolist()
    assert with_bos == tok.encode(source.render(chat_request(messages)), add_special_tokens=True).ids
    plain = TokenSource(TokenConfig(tokenizer=str(TOKENIZER)))
    assert (
        plain.routing_tokens(completions_request("abc")).ids.tolist()
        == tokenizers.Tokenizer.from_file(str(TOKENIZER)).encode("abc", add_special_tokens=True).ids
    )


def test_the_cache_is_consistent_under_threads() -> None:
    from concurrent.futures import ThreadPoolExecutor

    from smetric.serve.piecewise import ENTRY_OVERHEAD_BYTES

    bound = 20_000
    encoder = PiecewiseEncoder(TOKENIZER, cache_bytes=bound)
    whole = tokenizers.Tokenizer.from_file(str(TOKENIZER))
    texts = random_texts(21, 400)
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda t: encoder.encode(t).tolist(), texts))
    assert results == [whole.encode(t, add_special_tokens=False).ids for t in texts]
    charged = sum(len(p) + 4 * len(ids) + ENTRY_OVERHEAD_BYTES for p, ids in encoder._cache.items())
    assert encoder.cached_bytes == charged <= bound


def test_odd_but_valid_json_conversations_never_crash_a_source() -> None:
    # Whatever passes parse_request, every source either routes it or answers a RequestError.
    rng = random.Random(4)
    values: list[Any] = [None, 1, 2.5, True, "s", "", [], {}, [1], ["x"], {"a": 1}, [{"type": "text", "text": "t"}]]
    keys = ["content", "tool_calls", "name", "tool_call_id", "reasoning", "function", "arguments", "type", "text"]
    roles = ["user", "assistant", "tool", "system", "developer", "other"]

    def odd(depth: int) -> Any:
        if depth == 0 or rng.random() < 0.4:
            return rng.choice(values)
        if rng.random() < 0.5:
            return [odd(depth - 1) for _ in range(rng.randint(0, 3))]
        return {rng.choice(keys): odd(depth - 1) for _ in range(rng.randint(0, 3))}

    sources = [
        TokenSource(TokenConfig(mode="approximate")),
        TokenSource(TokenConfig(tokenizer=str(TOKENIZER))),
        TokenSource(TokenConfig(tokenizer=str(TOKENIZER), chat_template=FEATURES_TEMPLATE)),
    ]
    routed = rejected = 0
    statuses = set()
    for _ in range(300):
        messages = []
        for _ in range(rng.randint(1, 4)):
            message = {"role": rng.choice(roles)} | {rng.choice(keys): odd(3) for _ in range(rng.randint(0, 3))}
            messages.append(message)
        extra = {"tools": [odd(2) for _ in range(rng.randint(0, 2))]} if rng.random() < 0.3 else {}
        try:
            req = chat_request(messages, **extra)
        except RequestError:
            rejected += 1
            continue
        for source in sources:
            try:
                source.routing_tokens(req)
                routed += 1
            except RequestError as e:
                statuses.add(e.status)
                rejected += 1
    assert routed > 100 and rejected > 10, (routed, rejected)
    assert statuses == {400}
