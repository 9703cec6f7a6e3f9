"""Ids the proxy issues for state that lives on one engine (vLLM's stored responses), so that a
request naming that state reaches the instance holding it — with no state shared between proxy
replicas.

vLLM keeps a stored response (``store: true`` with ``VLLM_ENABLE_RESPONSES_API_STORE=1``) in a
dict of the one API process that produced it; ``previous_response_id``, ``GET`` and ``cancel``
work only there. The proxy therefore never shows the engine's id to the client: it issues

    ``{engine id}-{instance tag}-{mac}``

where the instance tag is :func:`instance_tag` of the instance's configured URL (a short hash:
the URL itself never leaves the proxy) and the mac an HMAC-SHA256 over the engine id and the tag
with the key the replicas share (``response_id_key``). Any replica holding the key and the same
fleet opens the id (:meth:`ResponseIds.open`) back into the engine id and the tag, and finds the
instance among its **configured** instances (:func:`resolve`) — never a URL taken from the
request. A client cannot forge a target: changing the tag breaks the mac.

Invariants: :meth:`ResponseIds.issue` and :meth:`ResponseIds.open` are inverse for ids of this
key; an id that does not verify opens to None. O(len(id)) per call.
May import: the standard library only.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Iterable
from dataclasses import dataclass

from smetric._core import SHARED_PIN_MAC_HEX, SHARED_PIN_TAG_HEX

__all__ = ["OpenedId", "ResponseIds", "instance_tag", "resolve"]

_TAG_HEX = SHARED_PIN_TAG_HEX
"""48 bits of the URL's hash: a collision within one fleet is out of reach (the gateway's
``shared`` constant: the gateway and the app read and write these ids)."""
_MAC_HEX = SHARED_PIN_MAC_HEX
"""128 bits of HMAC-SHA256."""


def instance_tag(url: str) -> str:
    """The short, stable name of an instance in the ids the proxy issues."""
    return hashlib.sha256(url.rstrip("/").encode()).hexdigest()[:_TAG_HEX]


def resolve(tag: str, instances: Iterable[str]) -> str | None:
    """The configured instance whose tag is ``tag``, or None (it left the fleet)."""
    for url in instances:
        if instance_tag(url) == tag:
            return url
    return None


@dataclass(frozen=True, slots=True)
class OpenedId:
    """A verified proxy id: the engine's own id and the tag of the instance that issued it."""

    engine_id: str
    tag: str


class ResponseIds:
    """Issues and opens proxy ids (see the module docs). ``key``: shared by the replicas;
    None draws a random one, which only this process can open."""

    def __init__(self, key: str | None) -> None:
        self._key = (key if key is not None else secrets.token_hex(32)).encode()

    @property
    def key(self) -> str:
        """The key (the compiled data plane issues the same ids with it)."""
        return self._key.decode()

    def _mac(self, engine_id: str, tag: str) -> str:
        digest = hmac.new(self._key, f"{engine_id}\x00{tag}".encode(), hashlib.sha256)
        return digest.hexdigest()[:_MAC_HEX]

    def issue(self, engine_id: str, instance: str) -> str:
        """The id the client sees for ``engine_id`` stored on ``instance``."""
        tag = instance_tag(instance)
        return f"{engine_id}-{tag}-{self._mac(engine_id, tag)}"

    def open(self, proxy_id: str) -> OpenedId | None:
        """The engine id and instance tag of an id this key issued, else None."""
        parts = proxy_id.rsplit("-", 2)
        if len(parts) != 3:
            return None
        engine_id, tag, mac = parts
        if not engine_id or len(tag) != _TAG_HEX or not hmac.compare_digest(mac, self._mac(engine_id, tag)):
            return None
        return OpenedId(engine_id, tag)
