"""A ``tokenizer.json`` encoder that re-encodes only what it has not seen: the piece cache.

**Why it is exact.** The ``tokenizers`` library encodes a text in this order
(``tokenizer/added_vocabulary.rs::extract_and_normalize``, then the pre-tokenizer and the
model): it first splits the raw text on its *added tokens* (the special tokens such as
``<|im_start|>`` and the other added tokens), then normalises, pre-tokenises and runs the model
on each piece between them separately. So the ids of a text are the concatenation of the ids of
its pieces and of the added tokens between them, and a piece encodes the same on its own as
inside the whole text. A chat rendered by a ChatML-like template is a chain of such pieces, one
or two per message; an agent's follow-up turn re-sends the same history, so all its pieces but
the newest are already cached.

**When it is not exact, and the fallback.** The split-then-concatenate identity needs every
added token to match as plain text: an added token with ``lstrip``, ``rstrip`` (they swallow the
neighbouring whitespace), ``single_word`` (matched only between non-word characters) or
``normalized`` (matched after normalisation) makes the pieces depend on their neighbours, and
so does a ``Metaspace`` pre-tokenizer with ``prepend_scheme: "first"`` (it marks only the piece
at offset 0 of the whole text). :class:`PiecewiseEncoder` inspects the ``tokenizer.json`` for
those, and for any of them encodes the whole text every time (:attr:`PiecewiseEncoder.exact_pieces`
is False). It also checks the identity on a probe text when it loads.

**The cache.** Piece text → ids as an ``array('I')``, in an LRU bounded by bytes: a piece is
charged its length in characters (what CPython stores for ASCII text; non-ASCII text takes up
to 4 bytes a character, so the bound is approximate for it), plus 4 bytes per id, plus
:data:`ENTRY_OVERHEAD_BYTES`. The least recently used pieces go first once the total passes
``cache_bytes``. The proxy's default, ``smetric.serve.tokens.DEFAULT_PIECE_CACHE_BYTES``, is
256 MiB: a 32K-token history is about 128 KB of text and 128 KB of ids, so the default holds the
histories of about a thousand such sessions. A piece larger than the whole budget is encoded but
not kept.

Complexity: a text of n characters in k pieces costs one regex split (O(n)) and a hash of each
piece (O(n)); only the pieces not cached are encoded, in one ``encode_batch`` call.
May import: ``tokenizers`` (the ``serve`` extra), nothing of :mod:`smetric.serve`.
"""

from __future__ import annotations

import json
import re
import threading
from array import array
from collections import OrderedDict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from smetric.errors import MissingExtraError

try:
    from tokenizers import Tokenizer
except ModuleNotFoundError as e:
    raise MissingExtraError(__name__, "tokenizers", "serve", name=e.name) from e

__all__ = ["ENTRY_OVERHEAD_BYTES", "PiecewiseEncoder", "piecewise_blockers"]

ENTRY_OVERHEAD_BYTES = 200
"""Bytes charged per cached piece besides its text and ids (dict slot, str and array headers)."""

_PROBE = (
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
    "Hello  world!\n\n  indented\tcode() {}<|im_end|>\n<|im_start|>assistant\n"
)


def piecewise_blockers(config: dict[str, Any]) -> list[str]:
    """Why a ``tokenizer.json`` (parsed) cannot be encoded piece by piece; empty if it can."""
    reasons = []
    for token in config.get("added_tokens") or []:
        for flag in ("lstrip", "rstrip", "single_word", "normalized"):
            if token.get(flag):
                reasons.append(f"added token {token.get('content')!r} has {flag}=true")
    stack = [config.get("pre_tokenizer")]
    while stack:
        node = stack.pop()
        if not isinstance(node, dict):
            continue
        if node.get("type") == "Metaspace" and node.get("prepend_scheme") == "first":
            reasons.append("a Metaspace pre-tokenizer with prepend_scheme 'first'")
        stack.extend(node.get("pretokenizers") or [])
    return reasons


class PiecewiseEncoder:
    """Encodes texts with a ``tokenizer.json``, caching the ids of the pieces between added tokens.

    Arguments:
        path: the ``tokenizer.json``.
        cache_bytes: the cache's bound (see the module docs); 0 disables it.
    """

    def __init__(self, path: str | Path, *, cache_bytes: int) -> None:
        self.path = Path(path)
        config = json.loads(self.path.read_text(encoding="utf-8"))
        self._tok = Tokenizer.from_file(str(self.path))
        # vLLM's HF tokenizer truncates or pads only when a call asks for it; a tokenizer.json
        # may carry settings for either, which plain `encode` would apply.
        self._tok.no_truncation()
        self._tok.no_padding()
        self.blockers = piecewise_blockers(config)
        added = {t["content"]: int(t["id"]) for t in config.get("added_tokens") or []}
        self._added = added
        # Longest first: at one position the longest added token wins, as the library's
        # leftmost-longest matcher picks it.
        alternatives = sorted(added, key=len, reverse=True)
        self._split = re.compile("(" + "|".join(map(re.escape, alternatives)) + ")") if alternatives else None
        self.cache_bytes = cache_bytes
        self._cache: OrderedDict[str, array[int]] = OrderedDict()
        self._cached_bytes = 0
        # The cache's lookups and evictions are several dict operations each; a proxy may encode
        # from worker threads (the library releases the GIL while it encodes), so they are locked.
        # The encode itself runs outside the lock.
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self.exact_pieces = False  # until the probe says otherwise
        self.exact_pieces = not self.blockers and self._probe_agrees()

    def _probe_agrees(self) -> bool:
        return self.encode(_PROBE, _cache=False).tolist() == self._tok.encode(_PROBE, add_special_tokens=False).ids

    @property
    def cached_bytes(self) -> int:
        """Bytes the cache holds, as charged (see the module docs)."""
        return self._cached_bytes

    @property
    def cached_pieces(self) -> int:
        """Pieces the cache holds."""
        return len(self._cache)

    def special_affixes(self) -> tuple[array[int], array[int]] | None:
        """The ids ``add_special_tokens=True`` puts before and after a text (a BOS, say), or
        None when they are not a fixed prefix and suffix."""
        with_special = self._tok.encode(_PROBE, add_special_tokens=True).ids
        plain = self._tok.encode(_PROBE, add_special_tokens=False).ids
        for start in range(len(with_special) - len(plain) + 1):
            if with_special[start : start + len(plain)] == plain:
                return array("I", with_special[:start]), array("I", with_special[start + len(plain) :])
        return None

    def encode_whole(self, text: str, *, add_special_tokens: bool = False) -> array[int]:
        """The whole text through the library, no cache."""
        return array("I", self._tok.encode(text, add_special_tokens=add_special_tokens).ids)

    def encode(self, text: str, *, _cache: bool = True) -> array[int]:
        """The ids of ``text`` as ``Tokenizer.encode(text, add_special_tokens=False)`` gives them."""
        if _cache and not self.exact_pieces:
            return self.encode_whole(text)
        pieces: Iterable[str] = self._split.split(text) if self._split is not None else (text,)
        parts: list[array[int] | int] = []
        missing: dict[str, int] = {}
        with self._lock:
            for piece in pieces:
                if not piece:
                    continue
                added = self._added.get(piece)
                if added is not None:
                    parts.append(added)
                    continue
                ids = self._cache.get(piece) if _cache else None
                if ids is None:
                    missing.setdefault(piece, len(missing))
                    parts.append(-1 - missing[piece])
                else:
                    self._cache.move_to_end(piece)
                    self.hits += 1
                    parts.append(ids)
            if _cache:
                self.misses += len(missing)
        encoded: list[array[int]] = []
        if missing:
            batch = self._tok.encode_batch_fast(list(missing), add_special_tokens=False)
            encoded = [array("I", e.ids) for e in batch]
            if _cache:
                with self._lock:
                    for piece, ids in zip(missing, encoded, strict=True):
                        self._keep(piece, ids)
        out = array("I")
        for part in parts:
            if isinstance(part, int):
                if part >= 0:
                    out.append(part)
                else:
                    out += encoded[-1 - part]
            else:
                out += part
        return out

    def _keep(self, piece: str, ids: array[int]) -> None:
        cost = len(piece) + 4 * len(ids) + ENTRY_OVERHEAD_BYTES
        if cost > self.cache_bytes or piece in self._cache:  # another thread kept it meanwhile
            return
        self._cache[piece] = ids
        self._cached_bytes += cost
        while self._cached_bytes > self.cache_bytes:
            old, old_ids = self._cache.popitem(last=False)
            self._cached_bytes -= len(old) + 4 * len(old_ids) + ENTRY_OVERHEAD_BYTES
