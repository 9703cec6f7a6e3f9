"""Prompt token ids and generated text of the fake engine, reproducible by a router.

Two tokenizers, both deterministic:

* :class:`ByteChunkTokenizer` (the default, no file): the text's UTF-8 bytes in chunks of
  :data:`BYTES_PER_TOKEN` (4); a chunk's id is the chunk read as a big-endian unsigned int, the
  last chunk padded with zero bytes (so every id is below ``2**32``). A router reproduces the
  engine's ids, and so its block hashes, with :func:`byte_chunk_ids` on the same rendered text.
* :class:`HfTokenizer` (``--tokenizer tokenizer.json``): the ``tokenizers`` library's
  ``Tokenizer.from_file``. Chat prompts are encoded with ``add_special_tokens=False`` (vLLM
  renders the chat template to text, which already holds the special tokens, then encodes it
  without adding any); a text ``prompt`` of ``/v1/completions`` with ``add_special_tokens=True``
  (vLLM's default there).

Chat messages are rendered with :func:`smetric.chat.render_chat` (re-exported here), the ChatML
template (Qwen's, without tools) with ``add_generation_prompt=True``: for each message
``<|im_start|>{role}\\n{content}<|im_end|>\\n``, then ``<|im_start|>assistant\\n``. A message's
``content`` is a string, or a list of parts of which the ``text`` parts are joined with no
separator; a missing or null content is the empty string. ``smetric serve`` in approximate mode
renders with the same function, so its routing ids equal this engine's.

Generated text is filler: output token ``i`` of a request is the word
``FILLER[i % len(FILLER)]`` followed by a space. When ``max_tokens`` is not given, the output
length is drawn deterministically from the prompt (:func:`default_output_tokens`): uniform in
``[DEFAULT_OUTPUT_MIN, DEFAULT_OUTPUT_MAX]`` by the CRC-32 of the prompt ids, and the request
finishes with ``"stop"``; a request stopped by ``max_tokens`` finishes with ``"length"``. With
vLLM's ``ignore_eos`` (chat and completions) the output runs to ``max_tokens``.
"""

from __future__ import annotations

import zlib
from array import array
from collections.abc import Sequence
from typing import Protocol

from smetric.chat import BYTE_CHUNK_BYTES as BYTES_PER_TOKEN
from smetric.chat import byte_chunk_ids as chat_ids
from smetric.chat import content_text, render_chat

__all__ = [
    "BYTES_PER_TOKEN",
    "ByteChunkTokenizer",
    "HfTokenizer",
    "Tokenizer",
    "byte_chunk_ids",
    "content_text",
    "default_output_tokens",
    "filler",
    "render_chat",
]

DEFAULT_OUTPUT_MIN = 16
"""Shortest natural output (tokens) when ``max_tokens`` is absent."""
DEFAULT_OUTPUT_MAX = 128
"""Longest natural output (tokens) when ``max_tokens`` is absent."""
FILLER = ("lorem", "ipsum", "dolor", "sit", "amet", "consectetur", "adipiscing", "elit")
"""The words of the generated text, one per output token."""


def byte_chunk_ids(text: str) -> list[int]:
    """The default tokenizer's ids as a list: :func:`smetric.chat.byte_chunk_ids` in chunks of 4."""
    return chat_ids(text).tolist()


class Tokenizer(Protocol):
    """What the engine needs of a tokenizer."""

    def encode_chat(self, text: str) -> list[int]:
        """Ids of a rendered chat prompt."""
        ...

    def encode_prompt(self, text: str) -> list[int]:
        """Ids of a ``/v1/completions`` text prompt."""
        ...


class ByteChunkTokenizer:
    """The default tokenizer (no file): :func:`byte_chunk_ids` for chat and text prompts alike."""

    def encode_chat(self, text: str) -> list[int]:
        """Ids of a rendered chat prompt."""
        return byte_chunk_ids(text)

    def encode_prompt(self, text: str) -> list[int]:
        """Ids of a text prompt."""
        return byte_chunk_ids(text)


class HfTokenizer:
    """A ``tokenizer.json`` loaded with the ``tokenizers`` library."""

    def __init__(self, path: str) -> None:
        try:
            from tokenizers import Tokenizer as _Tokenizer
        except ModuleNotFoundError as e:
            from smetric.errors import MissingExtraError

            raise MissingExtraError(__name__, "tokenizers", "fake-engine", name=e.name) from e
        self._tok = _Tokenizer.from_file(path)

    def encode_chat(self, text: str) -> list[int]:
        """Ids of a rendered chat prompt (no special tokens added)."""
        ids: list[int] = self._tok.encode(text, add_special_tokens=False).ids
        return ids

    def encode_prompt(self, text: str) -> list[int]:
        """Ids of a text prompt (special tokens added, as vLLM's completions endpoint does)."""
        ids: list[int] = self._tok.encode(text, add_special_tokens=True).ids
        return ids


def default_output_tokens(prompt: Sequence[int]) -> int:
    """The natural output length of a prompt (uniform in [16, 128] by the prompt's CRC-32)."""
    digest = zlib.crc32(array("I", prompt).tobytes())
    return DEFAULT_OUTPUT_MIN + digest % (DEFAULT_OUTPUT_MAX - DEFAULT_OUTPUT_MIN + 1)


def filler(index: int) -> str:
    """The text of output token ``index``."""
    return FILLER[index % len(FILLER)] + " "
