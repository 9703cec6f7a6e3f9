"""The plain ChatML rendering of a chat conversation and the byte-chunk tokenizer, shared by the
fake engine (its default prompt ids) and ``smetric serve`` (its approximate routing tokens), so
that both see the same text and the same ids.

:func:`render_chat` is the ChatML template (Qwen's, without tools) with
``add_generation_prompt=True``: for each message ``<|im_start|>{role}\\n{content}<|im_end|>\\n``,
then ``<|im_start|>assistant\\n``. :func:`content_text` turns a message's ``content`` into text:
a string as is, a list of parts by joining the ``text`` of its ``text`` parts with no separator
(other parts are dropped), a missing or null content as the empty string. Note that vLLM's own
"string" content format joins text parts with ``"\\n"``; this module is not vLLM's renderer
(``smetric.serve.tokens`` is), only the fixed convention the fake engine and an approximate-mode
proxy share.

:func:`byte_chunk_ids` is the tokenizer without a vocabulary: the text's UTF-8 bytes in chunks of
:data:`BYTE_CHUNK_BYTES` (4), each chunk read as a big-endian unsigned int, the last one padded
with zero bytes (so every id is below ``2**32``); for any other chunk size (a proxy's
``approx_chunk_bytes``) each chunk's id is its CRC-32. It is the fake engine's default tokenizer,
so a proxy routing on it in front of fake engines sees their real prefix hits.

Complexity: O(total length of the conversation), O(bytes) for the ids. Standard library only.
"""

from __future__ import annotations

import sys
import zlib
from array import array
from collections.abc import Mapping, Sequence
from typing import Any

from smetric._core import SHARED_BYTE_CHUNK_BYTES

BYTE_CHUNK_BYTES: int = SHARED_BYTE_CHUNK_BYTES
"""UTF-8 bytes per id of the byte-chunk tokenizer (the fake engine's default; defined once, in
the gateway's ``shared`` constants, which tokenizes the same way)."""


def render_chat(
    messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True, continue_final_message: bool = False
) -> str:
    """The ChatML rendering of ``messages`` (see the module docs).

    ``continue_final_message`` (vLLM's chat field) leaves the final message open, without its
    ``<|im_end|>``, so the model continues it; it excludes ``add_generation_prompt``.

    Raises:
        TypeError: a message is not an object, or its role or content has the wrong type.
        ValueError: both ``add_generation_prompt`` and ``continue_final_message``.
    """
    if add_generation_prompt and continue_final_message:
        raise ValueError("continue_final_message and add_generation_prompt cannot both be true")
    out = []
    for m in messages:
        if not isinstance(m, Mapping):
            raise TypeError("each message must be an object")
        role = m.get("role")
        if not isinstance(role, str):
            raise TypeError("message role must be a string")
        out.append(f"<|im_start|>{role}\n{content_text(m.get('content'))}<|im_end|>\n")
    if continue_final_message and out:
        out[-1] = out[-1].removesuffix("<|im_end|>\n")
    if add_generation_prompt:
        out.append("<|im_start|>assistant\n")
    return "".join(out)


def content_text(content: object) -> str:
    """A message's content as text: a string, or its ``text`` parts joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, Mapping) or not isinstance(part.get("text", ""), str):
                raise TypeError("content parts must be objects with a string 'text'")
            if part.get("type", "text") == "text":
                parts.append(part.get("text", ""))
        return "".join(parts)
    raise TypeError("message content must be a string, a list of parts or null")


def byte_chunk_ids(text: str, chunk_bytes: int = BYTE_CHUNK_BYTES) -> array[int]:
    """``text``'s UTF-8 bytes in chunks of ``chunk_bytes`` as ``array('I')`` (see the module docs):
    big-endian u32s, zero-padded, for 4; the CRC-32 of each chunk otherwise.

    Raises:
        ValueError: ``chunk_bytes`` < 1.
    """
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be at least 1, got {chunk_bytes}")
    data = text.encode()
    if chunk_bytes == BYTE_CHUNK_BYTES:
        pad = -len(data) % BYTE_CHUNK_BYTES
        ids = array("I", data + b"\0" * pad if pad else data)
        if ids.itemsize != BYTE_CHUNK_BYTES:  # pragma: no cover - every CPython platform has 4-byte "I"
            raise RuntimeError("array('I') is not 4 bytes here")
        if sys.byteorder == "little":
            ids.byteswap()
        return ids
    view = memoryview(data)
    return array("I", [zlib.crc32(view[i : i + chunk_bytes]) for i in range(0, len(data), chunk_bytes)])
