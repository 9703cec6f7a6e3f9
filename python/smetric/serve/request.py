"""An OpenAI-compatible request body, parsed for routing: :func:`parse_request`.

The JSON is parsed in Rust (``smetric._core.parse_openai_body``, from
``rust/smetric-vllm/src/openai_body.rs``) in one pass over the body: the scalar fields the proxy
reads are type-checked there, a completions ``prompt`` given as token ids is read straight into
a compact buffer (an ``array('I')``; never a Python list of ints, whose conversion alone costs
more than the routing decision), and ``messages`` / ``tools`` / ``chat_template_kwargs`` come back
as the JSON text of their values, decoded here with :func:`json.loads`. Measured against the
alternative, ``serde_json::Value`` turned into Python objects by ``pythonize`` in the binding:
80 µs against 104 µs for the 95 KB of messages of a 32K-token conversation (medians, loaded
2-core machine). The faster path was not taken because it is not exact. ``serde_json``'s maps
sort their keys unless its ``preserve_order`` feature is on, and integers beyond 64 bits become
floats. Either changes what a template's ``tojson`` prints, and so the routing ids.

Validation follows vLLM's OpenAI server for the fields read (every failure is a
:class:`RequestError`, status 400, with the OpenAI error body):

* the body is a JSON object; ``model``, ``user``, ``prompt_cache_key`` are strings;
  ``cache_salt`` a non-empty string; ``stream``, ``add_generation_prompt``,
  ``continue_final_message``, ``add_special_tokens`` booleans; ``max_tokens`` / ``max_completion_tokens`` integers ≥ 1
  (``null`` is absent everywhere);
* chat: ``messages`` is a non-empty list of objects, each with a string ``role`` and a
  ``content`` that is a string, a list of parts (objects) or null; ``tools`` a list of objects;
  ``chat_template_kwargs`` an object;
* completions: ``prompt`` is required: a string, a list of token ids in ``[0, 2**32)`` (the first
  bad id is reported with its position), or a batch of one of either. **A batch of more than one
  prompt is rejected** (400 on ``prompt``): a router places one request on one instance, and
  splitting a batch into several upstream requests would change the response shape the client
  expects. Clients send each prompt as its own request.

The model is not checked here (the proxy knows its models): :meth:`RequestError.unknown_model`
builds vLLM's 404 for it, :meth:`RequestError.too_large` the 413 of an oversized body.

Complexity: O(body length) — one Rust scan, plus ``json.loads`` of ``messages`` for chat.
May import (inside ``smetric.serve``): :mod:`.errors`; never ``aiohttp`` (the integrations load
this module without the ``serve`` extra).
"""

from __future__ import annotations

import json
import re
from array import array
from dataclasses import dataclass
from typing import Any, Literal

from smetric import _core
from smetric.errors import InvalidArgumentError, SmetricError

from .errors import openai_error

__all__ = [
    "MAX_JSON_NESTING",
    "Endpoint",
    "OpenAIRequest",
    "RequestError",
    "decode_json_body",
    "escapes_lone_surrogate",
    "parse_request",
    "refuse_deep_nesting",
]

Endpoint = Literal["chat", "completions"]
"""``"chat"``: ``POST /v1/chat/completions``; ``"completions"``: ``POST /v1/completions``."""


ECHOED_CHARS: int = _core.SHARED_ECHOED_CHARS
"""The most of a client's value an error message repeats (defined once, in the gateway's
``shared.rs``)."""

MAX_JSON_NESTING: int = _core.MAX_JSON_NESTING
"""The deepest nesting of arrays and objects a body may have, on every API (defined in the
core's parser, ``smetric_vllm::openai_body::MAX_NESTING``)."""


class RequestError(SmetricError):
    """A request the proxy answers itself with an OpenAI-style error.

    ``status`` is the HTTP status; :meth:`body` is the JSON body
    ``{"error": {"message", "type", "param", "code"}}``.
    """

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        param: str | None = None,
        type: str = "invalid_request_error",
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.type = type
        self.code = code

    def body(self) -> dict[str, Any]:
        """The OpenAI error body."""
        return openai_error(self.message, type=self.type, param=self.param, code=self.code)

    @classmethod
    def unknown_model(cls, model: str) -> RequestError:
        """404 for a model the proxy does not serve (vLLM's wording; a name longer than
        :data:`ECHOED_CHARS` is cut there, so a 100 KB name does not come back whole)."""
        shown = model if len(model) <= ECHOED_CHARS else model[:ECHOED_CHARS] + "…"
        return cls(f"The model `{shown}` does not exist.", status=404, param="model", code="model_not_found")

    @classmethod
    def too_large(cls, limit_bytes: int) -> RequestError:
        """413 for a body over ``limit_bytes``."""
        return cls(f"the request body exceeds {limit_bytes} bytes", status=413, code="request_too_large")


@dataclass(frozen=True, slots=True)
class OpenAIRequest:
    """What the proxy reads of one request (see the module docs)."""

    endpoint: Endpoint
    model: str | None
    stream: bool
    max_tokens: int | None
    """``max_completion_tokens`` (chat, when given) or ``max_tokens``."""
    user: str | None
    prompt_cache_key: str | None
    """OpenAI's cache-routing hint."""
    namespace: str | None
    """vLLM's ``cache_salt``: requests with different salts share no prefix-cache blocks. (LoRA
    adapters, the other namespace of vLLM's cache, are selected by the model name.)"""
    messages: list[dict[str, Any]] | None
    """Chat: the conversation, as decoded JSON."""
    tools: list[dict[str, Any]] | None
    """Chat: the tool definitions, as decoded JSON."""
    chat_template_kwargs: dict[str, Any] | None
    """Chat: vLLM's extra chat-template variables."""
    add_generation_prompt: bool
    continue_final_message: bool
    add_special_tokens: bool
    """Whether the engine adds the tokenizer's special tokens (a BOS, say) when it encodes the
    prompt text: vLLM's field, false for chat and true for completions unless the request says."""
    prompt_text: str | None
    """Completions: a text prompt."""
    prompt_ids: array[int] | None
    """Completions: a prompt given as token ids (``array('I')``)."""
    stream_options_json: str | None = None
    """The JSON text of the body's ``stream_options`` when it has the field (``null`` included)."""
    kv_transfer_params: bool = False
    """Whether the body has a top-level ``kv_transfer_params`` (a request built from another API's
    body: False)."""


def parse_request(raw: bytes, endpoint: Endpoint) -> OpenAIRequest:
    """Parses and validates a request body posted to ``endpoint``.

    Raises:
        RequestError: status 400, with ``param`` naming the offending field (``None`` for
            malformed JSON or a body that is not an object).
    """
    try:
        body = _core.parse_openai_body(raw, endpoint)
    except InvalidArgumentError as e:
        param = None if e.argument == "body" else e.argument
        raise RequestError(str(e), param=param) from None
    messages = tools = kwargs = None
    # Each read of a text field builds a new str from Rust's (≈ 100 KB of messages): read once.
    messages_json, tools_json, kwargs_json = body.messages_json, body.tools_json, body.chat_template_kwargs_json
    # A field's text is a slice of the body: only a body that escapes a lone surrogate somewhere
    # has a field to look at for one (which one the error names).
    decoded = messages_json is not None or tools_json is not None or kwargs_json is not None
    lone = decoded and _core.escapes_lone_surrogate(raw)
    if messages_json is not None:
        messages = _messages(_decode(messages_json, "messages", lone))
    if tools_json is not None:
        tools = _decode(tools_json, "tools", lone)
        if not all(isinstance(t, dict) for t in tools):
            raise RequestError("tools must be a list of objects", param="tools")
    if kwargs_json is not None:
        kwargs = _decode(kwargs_json, "chat_template_kwargs", lone)
    ids = None
    if body.prompt_ids is not None:
        ids = array("I")
        ids.frombytes(body.prompt_ids)
    return OpenAIRequest(
        endpoint=endpoint,
        model=body.model,
        stream=body.stream,
        max_tokens=body.max_tokens,
        user=body.user,
        prompt_cache_key=body.prompt_cache_key,
        namespace=body.cache_salt,
        messages=messages,
        tools=tools,
        chat_template_kwargs=kwargs,
        add_generation_prompt=body.add_generation_prompt,
        continue_final_message=body.continue_final_message,
        add_special_tokens=body.add_special_tokens,
        prompt_text=body.prompt_text,
        prompt_ids=ids,
        stream_options_json=body.stream_options_json,
        kv_transfer_params=body.kv_transfer_params,
    )


def escapes_lone_surrogate(raw: bytes) -> bool:
    """Whether a JSON body escapes half of a UTF-16 surrogate pair alone (``"\\ud800"``): valid
    JSON, but no Unicode text — an engine that decodes it fails on it later (a 500), so every
    API refuses it up front. An emoji escaped as its pair (``\\ud83d\\ude00``, Python's
    default) passes, and so does ``\\\\ud800`` (an escaped backslash, then text). Cost: one
    vectorized search for ``\\u`` over the body, in Rust (``smetric_vllm::lone_surrogate``):
    ≈ 3 µs for a 220 KB body of token ids."""
    return _core.escapes_lone_surrogate(raw)


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
"""A ``\\uD800``–``\\uDFFF`` escape: half of a UTF-16 pair, or a lone surrogate."""


def _decode(text: str, param: str, lone: bool) -> Any:
    """A field's JSON text (valid JSON: Rust checked it), which CPython may still refuse or
    decode into something no later step can use — each a 400 on ``param``:

    * an integer of more than ``sys.get_int_max_str_digits()`` digits;
    * nesting deeper than CPython's recursion limit (``RecursionError``);
    * a lone surrogate (``"\\ud800"``): valid JSON, but not text; it would fail later, when the
      prompt is encoded (looked for only when ``lone``, the whole body escapes one: no scan of
      the text otherwise).
    """
    try:
        value = json.loads(text)
    except RecursionError:
        raise RequestError(f"{param} is nested too deeply", param=param) from None
    except ValueError as e:
        if "int_max_str_digits" in str(e) or "integer string conversion" in str(e):
            raise RequestError(f"{param} holds an integer with too many digits", param=param) from None
        raise RequestError(f"{param} is not valid JSON", param=param) from None
    if lone and _SURROGATE_ESCAPE.search(text) is not None:
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise RequestError(
                f"{param} must be valid Unicode text (it escapes a lone surrogate)", param=param
            ) from None
        except RecursionError:
            raise RequestError(f"{param} is nested too deeply", param=param) from None
    return value


def _messages(messages: list[Any]) -> list[dict[str, Any]]:
    """``messages`` checked as vLLM's request model checks it."""
    if not messages:
        raise RequestError("messages must be a non-empty list", param="messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise RequestError(f"messages[{i}] must be an object", param="messages")
        if not isinstance(m.get("role"), str):
            raise RequestError(f"messages[{i}].role must be a string", param="messages")
        content = m.get("content")
        if content is not None and not isinstance(content, str | list):
            raise RequestError(f"messages[{i}].content must be a string, a list of parts or null", param="messages")
        if isinstance(content, list) and not all(isinstance(p, dict | str) for p in content):
            raise RequestError(f"messages[{i}].content parts must be objects", param="messages")
    return messages


def refuse_deep_nesting(raw: bytes) -> None:
    """For the APIs whose bodies Python decodes (Messages, Responses): the nesting limit that
    :func:`parse_request` applies to chat and completions bodies in Rust, with the same message.
    CPython's ``json`` would accept about 950 levels; an engine's decoder need not.

    Raises:
        RequestError: 400 when ``raw`` nests deeper than :data:`MAX_JSON_NESTING` levels.
    """
    if _core.nests_too_deep(raw):
        raise RequestError(f"the body nests arrays and objects deeper than {MAX_JSON_NESTING} levels")


def decode_json_body(raw: bytes) -> Any:
    """A Messages or Responses body decoded by CPython's ``json`` after the nesting limit, its
    syntax errors worded as every API (and the gateway) words them (``_core.json_syntax_error``:
    the parser's message), CPython's own words only where that parser reads the body.

    Raises:
        RequestError: 400 when ``raw`` nests too deep or is not JSON.
    """
    refuse_deep_nesting(raw)
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise RequestError(_core.json_syntax_error(raw) or f"malformed JSON body: {e}") from None
