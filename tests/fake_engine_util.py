"""Helpers of the fake-engine tests: a bounded loopback HTTP client and a msgpack shape reader."""

from __future__ import annotations

import json
import struct
import urllib.error
import urllib.request
from typing import Any

TIMEOUT_S = 10.0


def post(base: str, path: str, body: object = None, raw: bytes | None = None) -> tuple[int, bytes]:
    """POSTs JSON (or ``raw`` bytes) to a loopback server; returns status and body."""
    data = raw if raw is not None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT_S) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def get(base: str, path: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(base + path, timeout=TIMEOUT_S) as resp:
        return resp.status, resp.read()


def sse(body: bytes) -> list[Any]:
    """The ``data:`` events of an SSE body; ``[DONE]`` stays a string."""
    out: list[Any] = []
    for block in body.decode().split("\n\n"):
        if not block:
            continue
        assert block.startswith("data: "), block
        data = block[len("data: ") :]
        out.append(data if data == "[DONE]" else json.loads(data))
    return out


class Shape:
    """Reads a msgpack payload into its *shape*: every header's marker byte and every map's keys
    (values other than containers are reduced to their marker), so two encoders can be compared
    on layout without comparing timestamps or hashes."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def _take(self, n: int) -> bytes:
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def read(self) -> Any:
        m = self.data[self.pos]
        self.pos += 1
        if m <= 0x7F or m >= 0xE0 or m in (0xC0, 0xC2, 0xC3):
            return f"{m:02x}"
        if 0xA0 <= m <= 0xBF or m in (0xD9, 0xDA, 0xDB):
            n = m & 0x1F if m <= 0xBF else int.from_bytes(self._take(1 << (m - 0xD9)), "big")
            return self._take(n).decode()
        if m in (0xC4, 0xC5, 0xC6):
            self._take(int.from_bytes(self._take(1 << (m - 0xC4)), "big"))
            return f"{m:02x}"
        sizes = {0xCA: 4, 0xCB: 8, 0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8, 0xD0: 1, 0xD1: 2, 0xD2: 4, 0xD3: 8}
        if m in sizes:
            self._take(sizes[m])
            return f"{m:02x}"
        if 0x90 <= m <= 0x9F or m in (0xDC, 0xDD):
            n = (
                m & 0x0F
                if m <= 0x9F
                else struct.unpack(">H" if m == 0xDC else ">I", self._take(2 if m == 0xDC else 4))[0]
            )
            items = [self.read() for _ in range(n)]
            # Lists of scalars (hashes, token ids) are reduced to their header alone.
            if items and all(isinstance(i, str) and len(i) == 2 for i in items):
                return ("array", "scalars")
            return ("array", [i for i in items])
        if 0x80 <= m <= 0x8F or m in (0xDE, 0xDF):
            n = (
                m & 0x0F
                if m <= 0x8F
                else struct.unpack(">H" if m == 0xDE else ">I", self._take(2 if m == 0xDE else 4))[0]
            )
            keys = {}
            for _ in range(n):
                k = self.read()
                keys[k] = self.read()
            return ("map", f"{m:02x}" if m >= 0xDE else "fixmap", keys)
        raise ValueError(f"unknown marker {m:02x} at {self.pos - 1}")


def event_shapes(payload: bytes) -> list[tuple[str, str, tuple[str, ...]]]:
    """``(type, map header, keys)`` of each event of a ``KVEventBatch`` payload (map form)."""
    batch = Shape(payload).read()
    assert batch[0] == "array" and len(batch[1]) == 3, batch
    ts, events, _rank = batch[1]
    assert ts == "cb", "the batch timestamp is a float64"
    if events == ("array", "scalars"):
        return []
    out = []
    for e in events[1]:
        kind, header, keys = e
        assert kind == "map"
        out.append((keys["type"], header, tuple(keys)))
    return out
