"""The token ids a request is routed on: :class:`TokenSource`.

The router hashes a prompt's token ids into blocks and matches them against what each engine
caches, so the ids it routes on decide which hits it can see. Three sources
(``docs/routing-tokens.md`` has the measurements):

* **ids** — the request carries them (``/v1/completions`` with ``prompt`` as token ids). Exact
  and free: they are the engine's ids. Always used when present.
* **tokenizer** — a local ``tokenizer.json`` (the ``tokenizers`` library) and the model's chat
  template rendered as vLLM renders it (:mod:`smetric.serve.chat_template`), encoded with the
  request's ``add_special_tokens`` (vLLM's field: false for chat, true for a text prompt by
  default), as vLLM's server does.
  The ids equal the engine's, so the router's block hashes equal vLLM's and its index can be fed
  by KV events (``index_mode="exact"``). Use it in front of real vLLM. The encoder caches the
  ids of the text pieces between special tokens (:mod:`smetric.serve.piecewise`), so an agent's
  follow-up turn encodes only what is new.
* **approximate** — no tokenizer: the rendered conversation's UTF-8 bytes in fixed chunks of
  ``approx_chunk_bytes``. With the default 4, a chunk's id is the chunk read as a big-endian
  u32, zero-padded — exactly the fake engine's default tokenizer
  (``smetric.fake_engine.tokens.byte_chunk_ids``), so a proxy in front of fake engines sees real
  prefix hits. Any other size hashes each chunk to 32 bits with CRC-32 (``zlib.crc32``; a
  Python loop, slower than the 4-byte path). Conversations are rendered with the configured
  chat template, else with ChatML exactly as the fake engine renders it
  (:func:`smetric.chat.render_chat`). The ids are not the engine's, so hits exist only in the
  router's own approximate index (``index_mode="approximate"``), never from KV events; a shared
  prefix still shares its chunks, which is what routing needs.

``mode``: ``"ids"`` routes only requests that carry ids and rejects the others (400);
``"tokenizer"`` needs ``tokenizer``; ``"approximate"`` never tokenizes; ``"auto"`` takes the
tokenizer when one is configured, else the approximation.

The chat template (tokenizer mode, or approximate mode when one is given): ``chat_template`` as a
file path or Jinja text; by default the ``chat_template.jinja`` next to ``tokenizer.json``, else
the ``chat_template`` of the ``tokenizer_config.json`` there (when it is a list of named
templates: ``"tool_use"`` for a request that carries ``tools``, even an empty list, as
transformers picks it, else ``"default"``), else plain ChatML
(:data:`smetric.serve.chat_template.CHATML_TEMPLATE`). The named special tokens of that
``tokenizer_config.json`` are the template's ``bos_token``, ``eos_token``, ….

Complexity per request: ids O(1) (the buffer is reused); approximate O(prompt bytes);
tokenizer O(conversation length) to render and split, plus encoding the uncached pieces.
May import (inside ``smetric.serve``): :mod:`.request`, and lazily :mod:`.chat_template` and
:mod:`.piecewise` (their extras); never ``aiohttp``.
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal, get_args

from smetric._core import SHARED_IDS_ONLY
from smetric.chat import BYTE_CHUNK_BYTES as DEFAULT_APPROX_CHUNK_BYTES
from smetric.chat import byte_chunk_ids as approximate_ids
from smetric.chat import render_chat
from smetric.errors import InvalidConfigError

from .request import OpenAIRequest, RequestError

if TYPE_CHECKING:
    from .chat_template import ChatTemplate
    from .piecewise import PiecewiseEncoder

__all__ = [
    "DEFAULT_APPROX_CHUNK_BYTES",
    "DEFAULT_PIECE_CACHE_BYTES",
    "TOKEN_MODES",
    "RoutingTokens",
    "TokenConfig",
    "TokenMode",
    "TokenSource",
    "TokenSourceKind",
    "approximate_ids",
]

TokenMode = Literal["auto", "ids", "tokenizer", "approximate"]
TOKEN_MODES: tuple[TokenMode, ...] = get_args(TokenMode)
TokenSourceKind = Literal["ids", "tokenizer", "approximate"]
DEFAULT_PIECE_CACHE_BYTES = 256 << 20
"""Bound of the tokenizer's piece cache (:mod:`smetric.serve.piecewise` gives the accounting)."""
_SPECIAL_TOKEN_NAMES = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenConfig:
    """How a :class:`TokenSource` turns requests into token ids (see the module docs)."""

    mode: TokenMode = "auto"
    tokenizer: str | None = None
    """Path of a ``tokenizer.json``."""
    chat_template: str | None = None
    """Jinja text or a path to it; the default is described in the module docs."""
    approx_chunk_bytes: int = DEFAULT_APPROX_CHUNK_BYTES
    content_format: Literal["auto", "string", "openai"] = "auto"
    """vLLM's ``--chat-template-content-format``."""
    piece_cache_bytes: int = DEFAULT_PIECE_CACHE_BYTES


@dataclass(frozen=True, slots=True)
class RoutingTokens:
    """The ids one request is routed on. (A dataclass, not a NamedTuple: a field named ``count``
    would shadow ``tuple.count``.)"""

    ids: array[int]
    """``array('I')``: pass it to ``Router.route`` as is (a buffer, no per-element conversion)."""
    count: int
    source: TokenSourceKind


class TokenSource:
    """Turns parsed requests into routing token ids, per a :class:`TokenConfig`.

    Raises:
        InvalidConfigError: an unknown mode, ``mode="tokenizer"`` without a tokenizer, a chunk
            size below 1, a chat template path that does not exist.
        MissingExtraError: a tokenizer or a chat template is configured and the ``serve``
            extra (``tokenizers``, ``jinja2``) is not installed.
    """

    def __init__(self, config: TokenConfig | None = None) -> None:
        self.config = config = config or TokenConfig()
        if config.mode not in TOKEN_MODES:
            raise _config_error("mode", f"must be auto, ids, tokenizer or approximate, got {config.mode!r}")
        if config.approx_chunk_bytes < 1:
            raise _config_error("approx_chunk_bytes", f"must be at least 1, got {config.approx_chunk_bytes}")
        if config.mode == "tokenizer" and config.tokenizer is None:
            raise _config_error("tokenizer", "mode 'tokenizer' needs the path of a tokenizer.json")
        self.encoder: PiecewiseEncoder | None = None
        self._affixes: tuple[array[int], array[int]] | None = None
        self._templates: dict[str, ChatTemplate] = {}
        self._leading_system: dict[str, bool] = {}
        """Template name → whether it requires system-first ordering (probed once)."""
        uses_tokenizer = config.tokenizer is not None and config.mode in ("auto", "tokenizer")
        tokenizer_config: dict[str, Any] = {}
        if uses_tokenizer:
            from .piecewise import PiecewiseEncoder

            assert config.tokenizer is not None
            self.encoder = PiecewiseEncoder(config.tokenizer, cache_bytes=config.piece_cache_bytes)
            self._affixes = self.encoder.special_affixes()
            tokenizer_config = _tokenizer_config(Path(config.tokenizer).parent)
        self.kind: TokenSourceKind = "tokenizer" if uses_tokenizer else "ids" if config.mode == "ids" else "approximate"
        directory = Path(config.tokenizer).parent if uses_tokenizer and config.tokenizer is not None else None
        sources = _template_sources(config, tokenizer_config, directory)
        if sources:
            from .chat_template import ChatTemplate

            special = _special_tokens(tokenizer_config)
            self._templates = {
                name: ChatTemplate(text, special_tokens=special, content_format=config.content_format)
                for name, text in sources.items()
            }

    @property
    def templates(self) -> Mapping[str, ChatTemplate]:
        """The chat templates by name (``default``, ``tool_use``); empty for plain ChatML."""
        return MappingProxyType(self._templates)

    @property
    def renders_plain_chatml(self) -> bool:
        """Whether chat is rendered as plain ChatML (no chat template configured or found)."""
        return not self._templates

    def routing_tokens(self, req: OpenAIRequest) -> RoutingTokens:
        """The ids ``req`` is routed on.

        Raises:
            RequestError: 400 when ``mode="ids"`` and the request carries none, or when the chat
                template rejects the conversation.
        """
        if req.prompt_ids is not None:
            return RoutingTokens(req.prompt_ids, len(req.prompt_ids), "ids")
        if self.kind == "ids":
            param = "messages" if req.endpoint == "chat" else "prompt"
            raise RequestError(SHARED_IDS_ONLY, param=param)
        text = self.render(req) if req.endpoint == "chat" else req.prompt_text or ""
        ids = self._encode(text, special=req.add_special_tokens) if self.encoder is not None else None
        if ids is None:
            ids = approximate_ids(text, self.config.approx_chunk_bytes)
        return RoutingTokens(ids, len(ids), self.kind)

    def render(self, req: OpenAIRequest) -> str:
        """The prompt text of a chat request (see the module docs for the template).

        Raises:
            RequestError: 400 when the template rejects the conversation.
        """
        messages = req.messages or []
        if not self._templates:
            try:
                return render_chat(
                    messages,
                    add_generation_prompt=req.add_generation_prompt,
                    continue_final_message=req.continue_final_message,
                )
            except (TypeError, ValueError) as e:  # the fake engine answers these with a 400 too
                raise RequestError(str(e), param="messages") from None
        from .chat_template import TemplateRenderError

        template = self._templates.get("tool_use" if req.tools is not None else "default") or self._templates["default"]
        # vLLM merges the request's chat_template_kwargs over these two, so they win there too.
        kwargs = dict(req.chat_template_kwargs or {})
        generation_prompt = bool(kwargs.pop("add_generation_prompt", req.add_generation_prompt))
        continue_final = bool(kwargs.pop("continue_final_message", req.continue_final_message))
        try:
            return template.render(
                messages,
                tools=req.tools,
                add_generation_prompt=generation_prompt,
                continue_final_message=continue_final,
                chat_template_kwargs=kwargs,
            )
        except TemplateRenderError as e:
            raise RequestError(str(e), param="messages") from None

    def requires_leading_system(self, *, tools: bool) -> bool:
        """Whether the template refuses a system message after the first (Qwen's ``loop.first``
        guard, say): vLLM's Messages endpoint then merges inline system messages into the
        leading one. Probed as vLLM probes it, by rendering system, user, system, user; the
        built-in ChatML accepts any order."""
        name = "tool_use" if tools else "default"
        template = self._templates.get(name) or self._templates.get("default")
        if template is None:
            return False
        if name not in self._leading_system:
            from .chat_template import TemplateRenderError

            probe = [{"role": r, "content": "t"} for r in ("system", "user", "system", "user")]
            try:
                template.render(probe, add_generation_prompt=False)
                self._leading_system[name] = False
            except TemplateRenderError:
                self._leading_system[name] = True
        return self._leading_system[name]

    def _encode(self, text: str, *, special: bool) -> array[int]:
        """``text``'s ids, with the tokenizer's special tokens around them when ``special``."""
        assert self.encoder is not None
        if not special:
            return self.encoder.encode(text)
        if self._affixes is None:
            return self.encoder.encode_whole(text, add_special_tokens=True)
        prefix, suffix = self._affixes
        return prefix + self.encoder.encode(text) + suffix


def _config_error(field: str, reason: str) -> InvalidConfigError:
    return InvalidConfigError(f"{field} {reason}", field=field, reason=reason)


def _tokenizer_config(directory: Path) -> dict[str, Any]:
    path = directory / "tokenizer_config.json"
    if not path.is_file():
        return {}
    config = json.loads(path.read_text(encoding="utf-8"))
    return config if isinstance(config, dict) else {}


def _special_tokens(tokenizer_config: dict[str, Any]) -> dict[str, str]:
    """The named special tokens transformers passes to a template (a token may be an
    ``AddedToken`` dict with a ``content``)."""
    out = {}
    for name in _SPECIAL_TOKEN_NAMES:
        value = tokenizer_config.get(name)
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            out[name] = value
    return out


def _is_file(path: str) -> bool:
    try:
        return Path(path).is_file()
    except OSError:  # a template's text is often too long to be a file name
        return False


def _template_sources(config: TokenConfig, tokenizer_config: dict[str, Any], directory: Path | None) -> dict[str, str]:
    """Template name → Jinja text; empty for the built-in ChatML of :func:`render_chat`."""
    if config.chat_template is not None:
        given = config.chat_template
        if _is_file(given):
            return {"default": Path(given).read_text(encoding="utf-8")}
        if "{" not in given:
            raise _config_error("chat_template", f"is neither a file nor a Jinja template: {given!r}")
        return {"default": given}
    if directory is None:
        return {}
    jinja_file = directory / "chat_template.jinja"
    if jinja_file.is_file():
        return {"default": jinja_file.read_text(encoding="utf-8")}
    shipped = tokenizer_config.get("chat_template")
    if isinstance(shipped, str):
        return {"default": shipped}
    if isinstance(shipped, list):
        named = {t["name"]: t["template"] for t in shipped if isinstance(t, dict) and "name" in t and "template" in t}
        if named:
            named.setdefault("default", next(iter(named.values())))
            return named
    from .chat_template import CHATML_TEMPLATE

    return {"default": CHATML_TEMPLATE}
