"""A chat template rendered as vLLM renders it, without vLLM or transformers at run time.

vLLM's OpenAI server (``/v1/chat/completions``) turns a request into prompt text in three steps,
each reproduced here so that a router's token ids, and so its block hashes, equal the engine's:

1. **vLLM's message parse** (``vllm/entrypoints/chat_utils.py::parse_chat_messages``, text
   only): a string content becomes one text part and a null content no part; text parts
   (``text``, ``input_text``, ``output_text``, ``refusal``, ``thinking``, plain strings) are
   kept, with a null text skipped. In the **"string" content format** a message's texts are
   joined with ``"\\n"``; in the **"openai"** format they stay a list of
   ``{"type": "text", "text": ...}`` parts (media parts become ``{"type": "image"}`` etc.). The
   format is detected from the template as vLLM does (:func:`detect_content_format`): a
   template that loops over a message's ``content`` gets "openai", any other "string".
   Assistant ``tool_calls`` are kept (an empty list dropped) with each ``function.arguments``
   JSON string decoded to an object (``{}`` when it is not valid JSON); ``reasoning`` is
   copied to ``reasoning_content``; a tool
   message's all-text parts are joined with ``"\\n"``; ``name`` (a string), ``tool_call_id``
   and a developer message's ``tools`` are carried. ``tools`` are dumped as vLLM's pydantic
   models dump them: ``{"type", "function": {"name", "description", "parameters", ...}}``
   with the absent optional fields as null.
2. **transformers' normalisation** (``apply_chat_template``): keys whose value is null are
   dropped from each message, and a reasoning text is aliased to ``reasoning_content`` and
   ``thinking``.
3. **transformers' Jinja environment** (``utils/chat_template_utils.py``): an
   ``ImmutableSandboxedEnvironment`` with ``trim_blocks`` and ``lstrip_blocks``, the
   ``loopcontrols`` extension and a ``{% generation %}`` block tag, a ``tojson`` filter that
   does not escape HTML (``json.dumps`` with ``ensure_ascii=False``), and the globals
   ``raise_exception``, ``strftime_now``, ``dict`` and a ``namespace`` that refuses
   underscore-prefixed attributes. The template sees ``messages``, ``tools``, ``documents``
   (None), ``add_generation_prompt``, the tokenizer's named special tokens (``bos_token``,
   ``eos_token``, …) and the request's ``chat_template_kwargs``.

``continue_final_message`` follows transformers too: the final message is rendered with a
marker appended and the text is cut at the marker. Multimodal parts are outside this module's
exactness: vLLM expands them into model-specific placeholder tokens.

Checked against transformers' own ``apply_chat_template`` in ``tests/serve/test_tokens.py``.
Complexity: O(conversation length) per render, plus Jinja's constant overhead per message.
May import: ``jinja2`` (the ``serve`` extra), nothing of :mod:`smetric.serve`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Literal

from smetric.errors import MissingExtraError

try:
    import jinja2
    import jinja2.ext
    import jinja2.nodes
    import jinja2.sandbox
    import jinja2.utils
except ModuleNotFoundError as e:
    raise MissingExtraError(__name__, "jinja2", "serve", name=e.name) from e

__all__ = ["CHATML_TEMPLATE", "ChatTemplate", "ContentFormat", "TemplateRenderError", "detect_content_format"]

ContentFormat = Literal["string", "openai"]

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
"""The plain ChatML template (the default when a tokenizer ships none): role, content, no tools."""

_TEXT_KEYS = {"text": "text", "input_text": "text", "output_text": "text", "refusal": "refusal", "thinking": "thinking"}
_MEDIA = {
    "image_url": "image",
    "input_image": "image",
    "image_pil": "image",
    "image_embeds": "image",
    "audio_url": "audio",
    "input_audio": "audio",
    "audio_embeds": "audio",
    "video_url": "video",
}
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


class TemplateRenderError(ValueError):
    """The template refused the conversation (``raise_exception``) or the conversation has a
    part vLLM rejects; vLLM answers both with a 400."""


class _GenerationBlock(jinja2.ext.Extension):
    """``{% generation %}…{% endgeneration %}``: transformers' assistant-mask marker, rendered
    as its body (the mask itself is not needed for routing)."""

    tags = {"generation"}  # noqa: RUF012 - jinja2's Extension API declares it so

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        return str(caller())


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None, sort_keys: bool = False
) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _SafeNamespace(jinja2.utils.Namespace):
    """``namespace(...)`` that, like transformers', refuses attributes starting with ``_``."""

    def __init__(*args: Any, **kwargs: Any) -> None:
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _SafeNamespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _SafeNamespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: object) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"namespace attribute {name!r} starts with an underscore")


class _DictMaker:
    """``dict(...)`` and ``dict.fromkeys(...)`` without exposing the ``dict`` type itself."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


_DICT_ATTRIBUTES = frozenset(dir(dict))


class _Sandbox(jinja2.sandbox.ImmutableSandboxedEnvironment):
    """transformers' sandbox, with a fast path for the commonest lookup of a chat template,
    ``message.role`` on a plain dict. The sandbox tries ``getattr`` first, which fails (with an
    exception, the slow part) for any name that is not a ``dict`` attribute, then the item, then
    gives an undefined; the fast path goes straight to the item for those names, so every
    result, undefined included, is the same."""

    def getattr(self, obj: Any, attribute: str) -> Any:
        if type(obj) is dict and attribute not in _DICT_ATTRIBUTES:
            try:
                return obj[attribute]
            except KeyError:
                return self.undefined(obj=obj, name=attribute)
        return super().getattr(obj, attribute)


def _environment() -> jinja2.Environment:
    env = _Sandbox(trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationBlock, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _DictMaker()
    env.globals["namespace"] = _SafeNamespace
    return env


def detect_content_format(source: str) -> ContentFormat:
    """The content format vLLM picks for a template: ``"openai"`` if it loops over the
    ``content`` of a message, else ``"string"``.

    The walk is vLLM's: the names bound to ``messages`` (``messages`` itself, and names set from
    it or from a slice of it, transitively), the loop variables over those (``for message in
    messages``), then any loop over ``message['content']`` or ``message.content`` (through a
    filter, a test or a slice too). A template that does not parse is "string".
    """
    env = _environment()
    try:
        tree = env.parse(source)
    except jinja2.exceptions.TemplateSyntaxError:
        return "string"
    aliases = ["messages"]
    queue = ["messages"]
    while queue:
        name = queue.pop(0)
        for assign in tree.find_all(jinja2.nodes.Assign):
            target = assign.target
            if _names(assign.node, name) and isinstance(target, jinja2.nodes.Name) and target.name not in aliases:
                aliases.append(target.name)
                queue.append(target.name)
    message_vars = {
        loop.target.name
        for loop in tree.find_all(jinja2.nodes.For)
        if isinstance(loop.target, jinja2.nodes.Name) and any(_names(loop.iter, a) for a in aliases)
    }
    for loop in tree.find_all(jinja2.nodes.For):
        if any(_names(loop.iter, m, key="content") for m in message_vars):
            return "openai"
    return "string"


def _names(node: jinja2.nodes.Node, var: str, key: str | None = None) -> bool:
    """Whether ``node`` is ``var`` (or ``var[key]`` / ``var.key``), possibly filtered, tested or
    sliced: vLLM's ``_is_var_or_elems_access``."""
    while True:
        if isinstance(node, jinja2.nodes.Filter | jinja2.nodes.Test) and node.node is not None:
            node = node.node
            continue
        if not (isinstance(node, jinja2.nodes.Getitem) and isinstance(node.arg, jinja2.nodes.Slice)):
            break
        node = node.node
    if key is None:
        return isinstance(node, jinja2.nodes.Name) and node.name == var
    if isinstance(node, jinja2.nodes.Getitem):
        is_key = isinstance(node.arg, jinja2.nodes.Const) and node.arg.value == key
        return is_key and isinstance(node.node, jinja2.nodes.Name) and node.node.name == var
    if isinstance(node, jinja2.nodes.Getattr):
        return node.attr == key and isinstance(node.node, jinja2.nodes.Name) and node.node.name == var
    return False


class ChatTemplate:
    """One compiled chat template and the special tokens it is rendered with.

    Arguments:
        source: the Jinja text of the template.
        special_tokens: the tokenizer's named special tokens (``{"eos_token": "<|im_end|>"}``).
        content_format: vLLM's ``--chat-template-content-format``; "auto" detects it.
    """

    def __init__(
        self,
        source: str,
        *,
        special_tokens: Mapping[str, str] | None = None,
        content_format: Literal["auto", "string", "openai"] = "auto",
    ) -> None:
        self.source = source
        self.content_format: ContentFormat = (
            detect_content_format(source) if content_format == "auto" else content_format
        )
        self.special_tokens = dict(special_tokens or {})
        self._template = _environment().from_string(source)

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        """The prompt text vLLM renders for this conversation.

        Raises:
            TemplateRenderError: the template raised, or the conversation has a shape the
                template or vLLM's parse cannot take (a content part vLLM rejects, a tool call
                that is not an object, a type error inside the template, …). vLLM answers all of
                them with a 400 (its chat handler turns ``ValueError``, ``TypeError`` and Jinja
                errors of the preprocessing into a bad request), and so does the proxy.
        """
        try:
            return self._render(messages, tools, add_generation_prompt, continue_final_message, chat_template_kwargs)
        except TemplateRenderError:
            raise
        except jinja2.exceptions.TemplateError as e:
            raise TemplateRenderError(f"the chat template rejected the conversation: {e}") from None
        except (TypeError, ValueError, LookupError, AttributeError) as e:
            raise TemplateRenderError(f"the conversation does not fit the chat template: {e!r}") from None

    def _render(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None,
        add_generation_prompt: bool,
        continue_final_message: bool,
        chat_template_kwargs: Mapping[str, Any] | None,
    ) -> str:
        chat = [_template_message(m) for m in vllm_conversation(messages, self.content_format)]
        final: str | None = None
        if continue_final_message:
            if not chat or chat[-1].get("content") is None:
                raise TemplateRenderError("continue_final_message is set but the final message has no content")
            final = _tag_final_message(chat[-1])
        variables: dict[str, Any] = {**self.special_tokens, **(chat_template_kwargs or {})}
        variables.update(
            messages=chat,
            tools=[_tool_dump(t) for t in tools] if tools is not None else None,
            documents=None,
            add_generation_prompt=add_generation_prompt and not continue_final_message,
        )
        text = self._template.render(**variables)
        if final is not None:
            marker = text.rfind(_CONTINUE_TAG.strip())
            if marker < 0:
                raise TemplateRenderError("continue_final_message: the final message is not in the rendered text")
            text = text[:marker] if text.startswith(_CONTINUE_TAG, marker) else text[:marker].rstrip()
        return text


def vllm_conversation(messages: Sequence[Mapping[str, Any]], content_format: ContentFormat) -> list[dict[str, Any]]:
    """Step 1 of the module docs: the conversation as vLLM hands it to the template."""
    out = []
    for message in messages:
        role = message["role"]
        content = message.get("content")
        parts: list[Any] = [] if content is None else [content] if isinstance(content, str) else list(content)
        items = [item for item in (_part(p, content_format) for p in parts) if item is not None]
        result: dict[str, Any] = {"role": role}
        if content_format == "openai":
            result["content"] = items
        else:
            result["content"] = "\n".join(items)
        if role == "assistant":
            if message.get("tool_calls") is not None:
                result["tool_calls"] = [_decoded_call(c) for c in message["tool_calls"]]
                if not result["tool_calls"]:
                    del result["tool_calls"]
            if message.get("reasoning") is not None:
                result["reasoning"] = result["reasoning_content"] = message["reasoning"]
        elif role == "tool":
            if "tool_call_id" in message:
                result["tool_call_id"] = message["tool_call_id"]
            kept = result["content"]
            if isinstance(kept, list) and all(isinstance(i, dict) and i.get("type") == "text" for i in kept):
                result["content"] = "\n".join(i.get("text", "") for i in kept)
        if isinstance(message.get("name"), str):
            result["name"] = message["name"]
        if isinstance(message.get("task"), str):
            result["task"] = message["task"]
        if role == "developer":
            result["tools"] = message.get("tools")
        out.append(result)
    return out


def _part(part: Any, content_format: ContentFormat) -> Any:
    """One content part: text (a str, or a text dict in the "openai" format), a media marker,
    or None (skipped)."""
    if isinstance(part, str):
        return {"type": "text", "text": part} if content_format == "openai" else part
    if not isinstance(part, Mapping):
        raise TemplateRenderError("content parts must be strings or objects")
    kind = part.get("type")
    if kind in _TEXT_KEYS:
        text = part.get(_TEXT_KEYS[kind])
        if text is None:
            return None
        return {"type": "text", "text": text} if content_format == "openai" else text
    media = _MEDIA.get(kind) if isinstance(kind, str) else next((_MEDIA[k] for k in _MEDIA if k in part), None)
    if media is None:
        raise TemplateRenderError(f"unsupported chat content part type: {kind!r}")
    return {"type": media} if content_format == "openai" else None


def _decoded_call(call: Any) -> Any:
    """A tool call with its ``function.arguments`` decoded, as vLLM does before rendering."""
    if not isinstance(call, Mapping) or not isinstance(call.get("function"), Mapping):
        return call
    function = dict(call["function"])
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            function["arguments"] = json.loads(arguments)
        except json.JSONDecodeError:
            function["arguments"] = {}
    elif not isinstance(arguments, dict | list):
        function["arguments"] = {}
    return {**call, "function": function}


def _template_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """Step 2 of the module docs: null keys dropped, reasoning aliased."""
    kept = {k: v for k, v in message.items() if v is not None}
    reasoning = next((kept[k] for k in ("reasoning_content", "thinking", "reasoning") if k in kept), None)
    if reasoning is not None:
        kept = {"thinking": reasoning, **kept, "reasoning_content": reasoning}
    return kept


def _tag_final_message(message: dict[str, Any]) -> str:
    """Appends the continuation marker to the final message's text; returns that text."""
    content = message["content"]
    if isinstance(content, str):
        message["content"] = content + _CONTINUE_TAG
        return content
    for part in reversed(content):
        if isinstance(part, dict) and "text" in part:
            text = str(part["text"])
            part["text"] = text + _CONTINUE_TAG
            return text
    raise TemplateRenderError("continue_final_message is set but the final message has no text")


def _tool_dump(tool: Mapping[str, Any]) -> dict[str, Any]:
    """A tool as vLLM's ``ChatCompletionToolsParam.model_dump()`` gives it to the template."""
    function = tool.get("function")
    if not isinstance(function, Mapping):
        return dict(tool)
    declared = {
        "name": function.get("name"),
        "description": function.get("description"),
        "parameters": function.get("parameters"),
    }
    extra_fn = {k: v for k, v in function.items() if k not in declared}
    extra = {k: v for k, v in tool.items() if k not in ("type", "function")}
    return {"type": tool.get("type", "function"), "function": {**declared, **extra_fn}, **extra}
