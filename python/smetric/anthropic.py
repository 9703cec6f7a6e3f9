"""Anthropic Messages requests as vLLM serves them: validation, the conversion to a chat request,
and Anthropic's error body — shared by ``smetric serve`` (its routing tokens) and the fake engine
(its prompt), so that both render a Messages request the way vLLM does.

vLLM (0.32–0.33, ``vllm/entrypoints/anthropic/serving.py``) answers ``POST /v1/messages`` by
converting the request into a chat-completion request and rendering that with the model's chat
template like any chat request. :func:`to_chat` reproduces the conversion's rendering-relevant
part (the sampling fields are not needed to route):

* ``system`` (a string, or text blocks joined with no separator, a block that starts with
  ``x-anthropic-billing-header`` skipped — Claude Code's per-request attribution) becomes one
  leading system message; a ``system``-role message inside ``messages`` stays where it is (its
  text extracted the same way), or is merged into the leading one when the template requires
  system-first ordering (``merge_inline_system``: vLLM probes the template for it);
* a string content stays a string; blocks become: ``text`` (non-empty) → a text part,
  ``image`` → an ``image_url`` part (base64 sources as a ``data:`` URI), ``thinking`` → the
  message's ``reasoning``, ``redacted_thinking`` → nothing, ``tool_use`` → an OpenAI tool call
  (``arguments`` = ``json.dumps(input)``), ``tool_result`` in a user message → a ``tool``
  message (text items joined with ``"\\n"``) appended *before* the user message, plus a user
  message of its images; in an assistant message → a text part ``"Tool result: …"``. A single
  text part collapses to a string; a user message left without content is dropped;
* ``tools`` → OpenAI function tools (``input_schema`` as ``parameters``, ``type: object``
  added when missing; ``strict`` and ``defer_loading`` only when set, as vLLM dumps them);
* ``thinking: {type: disabled}`` → ``reasoning_effort`` ``"none"``, ``output_config.effort`` →
  ``reasoning_effort``, passed to the template over the request's ``chat_template_kwargs``; it
  also sets the template's ``enable_thinking`` unless those kwargs do. vLLM may map "disabled" to ``"low"`` for a model
  whose template ignores ``"none"`` (it probes); the conversion here always says ``"none"``.

Validation follows vLLM's pydantic models for what is converted: ``model`` a string,
``messages`` a non-empty list of objects with ``role`` ``user`` / ``assistant`` / ``system`` and a
content that is a string or a list of blocks with a string ``type``; ``max_tokens`` an integer ≥ 1
(``/v1/messages`` only); ``stream`` a boolean; ``system`` a string or a list of blocks;
``tools`` objects with a string ``name`` and an object ``input_schema``; ``tool_choice`` an
object whose ``type`` is ``auto``, ``any``, ``tool`` (with a ``name``) or ``none``; ``thinking``
an object whose ``type`` is ``enabled`` (``budget_tokens`` ≥ 1024), ``disabled`` or ``adaptive``.
Every failure is a :class:`MessagesRequestError` (status 400, ``invalid_request_error``).

:func:`anthropic_error` is the one builder of Anthropic's error body,
``{"type": "error", "error": {"type", "message"}}``, and :func:`error_type` names the type of an
HTTP status as Anthropic does. Complexity: O(conversation length). May import: the standard
library and :mod:`smetric.errors`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from smetric._core import SHARED_BILLING_HEADER_PREFIX
from smetric.errors import SmetricError

__all__ = [
    "BILLING_HEADER_PREFIX",
    "ChatConversion",
    "MessagesRequestError",
    "anthropic_error",
    "error_type",
    "to_chat",
]

BILLING_HEADER_PREFIX: str = SHARED_BILLING_HEADER_PREFIX
"""A system text block that starts with it is dropped (it changes on every request; defined
once, in the gateway's ``shared`` constants)."""

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}
_ROLES = ("user", "assistant", "system")
_TOOL_CHOICES = ("auto", "any", "tool", "none")


def error_type(status: int) -> str:
    """Anthropic's error type for an HTTP status (``api_error`` for any other 5xx,
    ``invalid_request_error`` for any other 4xx)."""
    return _ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")


def anthropic_error(message: str, *, type: str) -> dict[str, Any]:
    """Anthropic's error body: ``{"type": "error", "error": {"type", "message"}}``."""
    return {"type": "error", "error": {"type": type, "message": message}}


class MessagesRequestError(SmetricError):
    """A Messages request that fails validation: a 400 ``invalid_request_error``."""

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


@dataclass(frozen=True, slots=True)
class ChatConversion:
    """A Messages request as the chat request vLLM renders (see the module docs)."""

    model: str
    stream: bool
    max_tokens: int | None
    """None for ``count_tokens`` (which has no such field)."""
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    chat_template_kwargs: dict[str, Any] | None
    """The request's own, with ``reasoning_effort`` / ``enable_thinking`` merged as vLLM does."""
    cache_salt: str | None


def to_chat(body: object, *, count_tokens: bool = False, merge_inline_system: bool = False) -> ChatConversion:
    """Validates a ``/v1/messages`` (or ``count_tokens``) body and converts it.

    Raises:
        MessagesRequestError: the body does not validate.
    """
    if not isinstance(body, dict):
        raise MessagesRequestError("the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str):
        raise MessagesRequestError("model: a string is required", param="model")
    max_tokens = None
    if not count_tokens:
        max_tokens = body.get("max_tokens")
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise MessagesRequestError("max_tokens: an integer of at least 1 is required", param="max_tokens")
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise MessagesRequestError("stream must be a boolean", param="stream")
    raw_messages = body.get("messages")
    if not isinstance(raw_messages, list) or not raw_messages:
        raise MessagesRequestError("messages: a non-empty list is required", param="messages")
    for i, m in enumerate(raw_messages):
        _check_message(m, f"messages.{i}")
    system = body.get("system")
    if system is not None and not isinstance(system, str):
        _check_blocks(system, "system")
    tools = _tools(body.get("tools"))
    _check_tool_choice(body.get("tool_choice"))
    effort = _reasoning_effort(body.get("thinking"), body.get("output_config"))
    kwargs = body.get("chat_template_kwargs")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise MessagesRequestError("chat_template_kwargs must be an object", param="chat_template_kwargs")
    if effort is not None:
        # vLLM merges its own ``reasoning_effort`` over the request's kwargs (``merge_kwargs``:
        # the non-null overrides win), and ``enable_thinking`` only where the request is silent.
        kwargs = {"enable_thinking": effort != "none", **(kwargs or {}), "reasoning_effort": effort}
    salt = body.get("cache_salt")
    if salt is not None and (not isinstance(salt, str) or not salt):
        raise MessagesRequestError("cache_salt must be a non-empty string", param="cache_salt")
    messages = _system_messages(system, raw_messages, merge_inline_system)
    _convert_messages(raw_messages, messages, merge_inline_system)
    return ChatConversion(model, bool(stream), max_tokens, messages, tools, kwargs, salt)


# -- validation --------------------------------------------------------------------------------


def _check_blocks(blocks: object, where: str) -> None:
    if not isinstance(blocks, list):
        raise MessagesRequestError(f"{where}: a string or a list of content blocks is required", param=where)
    for j, block in enumerate(blocks):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise MessagesRequestError(f"{where}.{j}: a content block needs a string type", param=where)
        for key in ("text", "thinking"):
            if block.get(key) is not None and not isinstance(block[key], str):
                raise MessagesRequestError(f"{where}.{j}.{key} must be a string", param=where)
        if block["type"] == "tool_use" and block.get("input") is not None and not isinstance(block["input"], dict):
            raise MessagesRequestError(f"{where}.{j}.input must be an object", param=where)


def _check_message(message: object, where: str) -> None:
    if not isinstance(message, dict):
        raise MessagesRequestError(f"{where}: a message must be an object", param="messages")
    if message.get("role") not in _ROLES:
        raise MessagesRequestError(f"{where}.role must be one of user, assistant, system", param="messages")
    content = message.get("content")
    if not isinstance(content, str):
        _check_blocks(content, f"{where}.content")


def _tools(tools: object) -> list[dict[str, Any]] | None:
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise MessagesRequestError("tools must be a list", param="tools")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            raise MessagesRequestError(f"tools.{i}: a tool needs a string name", param="tools")
        schema = tool.get("input_schema")
        if not isinstance(schema, dict):
            raise MessagesRequestError(f"tools.{i}.input_schema must be an object", param="tools")
        if "type" not in schema:
            schema = {**schema, "type": "object"}
        function = {"name": tool["name"], "description": tool.get("description"), "parameters": schema}
        # vLLM's FunctionDefinition dumps these two only when set: a null would print in the
        # template's tojson and change the prompt.
        for key in ("strict", "defer_loading"):
            if tool.get(key) is not None:
                function[key] = tool[key]
        out.append({"type": "function", "function": function})
    return out


def _check_tool_choice(choice: object) -> None:
    if choice is None:
        return
    if not isinstance(choice, dict) or choice.get("type") not in _TOOL_CHOICES:
        raise MessagesRequestError("tool_choice.type must be one of auto, any, tool, none", param="tool_choice")
    if choice["type"] == "tool" and not isinstance(choice.get("name"), str):
        raise MessagesRequestError("tool_choice of type tool needs a name", param="tool_choice")


def _reasoning_effort(thinking: object, output_config: object) -> str | None:
    """The chat request's ``reasoning_effort`` (``output_config.effort`` is applied after
    ``thinking``, as vLLM applies them)."""
    effort = None
    if thinking is not None:
        kind = thinking.get("type") if isinstance(thinking, dict) else None
        if kind not in ("enabled", "disabled", "adaptive"):
            raise MessagesRequestError("thinking.type must be enabled, disabled or adaptive", param="thinking")
        assert isinstance(thinking, dict)
        budget = thinking.get("budget_tokens")
        if kind == "enabled" and (not isinstance(budget, int) or isinstance(budget, bool) or budget < 1024):
            raise MessagesRequestError(
                "thinking.budget_tokens: an integer of at least 1024 is required", param="thinking"
            )
        if kind == "disabled":
            effort = "none"
    if output_config is not None:
        if not isinstance(output_config, dict):
            raise MessagesRequestError("output_config must be an object", param="output_config")
        given = output_config.get("effort")
        if given is not None:
            if not isinstance(given, str):
                raise MessagesRequestError("output_config.effort must be a string", param="output_config")
            effort = given
    return effort


# -- conversion --------------------------------------------------------------------------------


def _system_text(content: str | list[dict[str, Any]]) -> str | None:
    """A system message's text (billing blocks dropped), None when empty."""
    if isinstance(content, str):
        return None if content.startswith(BILLING_HEADER_PREFIX) else content
    parts = [
        b["text"]
        for b in content
        if b.get("type") == "text" and b.get("text") and not b["text"].startswith(BILLING_HEADER_PREFIX)
    ]
    return "".join(parts) if parts else None


def _system_messages(system: object, messages: list[Any], merge_inline: bool) -> list[dict[str, Any]]:
    parts: list[str] = []
    if isinstance(system, str):
        if system:
            parts.append(system)
    elif isinstance(system, list) and system:
        text = _system_text(system)
        if text:
            parts.append(text)
    if merge_inline:
        parts += [t for m in messages if m["role"] == "system" and (t := _system_text(m["content"]))]
    return [{"role": "system", "content": "".join(parts)}] if parts else []


def _image_url(source: object) -> str:
    source = source if isinstance(source, dict) else {}
    if source.get("type") == "url":
        return str(source.get("url", ""))
    return f"data:{source.get('media_type', 'image/jpeg')};base64,{source.get('data', '')}"


def _convert_messages(messages: list[Any], out: list[dict[str, Any]], merge_inline: bool) -> None:
    for message in messages:
        role, content = message["role"], message["content"]
        if role == "system":
            if not merge_inline and (text := _system_text(content)):
                out.append({"role": "system", "content": text})
            continue
        converted: dict[str, Any] = {"role": role}
        if isinstance(content, str):
            converted["content"] = content
        else:
            _convert_blocks(role, content, converted, out)
        if not (role == "user" and "content" not in converted):
            out.append(converted)


def _convert_blocks(role: str, blocks: list[Any], message: dict[str, Any], out: list[dict[str, Any]]) -> None:
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    reasoning: list[str] = []
    for block in blocks:
        kind = block["type"]
        if kind == "text" and block.get("text"):
            parts.append({"type": "text", "text": block["text"]})
        elif kind == "image" and block.get("source"):
            parts.append({"type": "image_url", "image_url": {"url": _image_url(block["source"])}})
        elif kind == "thinking" and block.get("thinking") is not None:
            reasoning.append(block["thinking"])
        elif kind == "tool_use":
            arguments = json.dumps(block.get("input") or {})
            function = {"name": block.get("name") or "", "arguments": arguments}
            calls.append({"id": block.get("id") or "", "type": "function", "function": function})
        elif kind == "tool_result":
            if role == "user":
                _tool_result(block, out)
            else:
                parts.append({"type": "text", "text": f"Tool result: {block.get('content') or ''}"})
    if reasoning:
        message["reasoning"] = "".join(reasoning)
    if calls:
        message["tool_calls"] = calls
    if parts:
        message["content"] = parts[0]["text"] if len(parts) == 1 and parts[0]["type"] == "text" else parts


def _tool_result(block: Mapping[str, Any], out: list[dict[str, Any]]) -> None:
    content = block.get("content")
    text = ""
    images: list[str] = []
    references: list[dict[str, Any]] = []
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        texts = []
        for item in content:
            if not isinstance(item, dict):
                continue
            if item.get("type") == "text":
                texts.append(str(item.get("text", "")))
            elif item.get("type") == "image":
                images.append(_image_url(item.get("source", {})))
            elif item.get("type") == "tool_reference" and (name := item.get("tool_name") or item.get("name")):
                references.append({"type": "tool_reference", "name": name})
        text = "\n".join(texts)
    call_id = block.get("tool_use_id") or ""
    out.append({"role": "tool", "tool_call_id": call_id, "content": text})
    if images:
        out.append({"role": "user", "content": [{"type": "image_url", "image_url": {"url": u}} for u in images]})
    if references:
        out.append({"role": "tool", "tool_call_id": call_id, "content": references})
