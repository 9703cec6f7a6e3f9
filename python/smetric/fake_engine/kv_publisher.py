"""vLLM's ZMQ KV-event publisher, as ``vllm.distributed.kv_events.ZmqEventPublisher`` speaks it.

* **PUB** (``--kv-events-port``): each engine step with cache changes is one message of three
  frames ``[topic, seq (8 bytes big-endian, from 0), payload]``, the payload a ``KVEventBatch``
  in the map form, encoded by :func:`smetric._core.encode_kv_batch` (the Rust encoder the
  simulator uses, pinned to vLLM 0.33's bytes).
* **ROUTER** (``--kv-replay-port``): a DEALER sends ``[b"", start_seq (8 bytes big-endian)]``;
  the reply is ``[b"", topic, seq, payload]`` for every buffered batch with ``seq >= start_seq``,
  then the end marker ``[b"", b"", 0xFF × 8, b""]`` (vLLM ≥0.26's layout). The last
  ``buffer_steps`` batches are kept (vLLM's default 10,000).

The sockets live on one thread of their own; the engine hands batches over an ``inproc`` PUSH
socket, so no ZMQ socket is ever used from two threads.

The PUB socket is an XPUB (vLLM's is a PUB; subscribers see no difference): it reports every
subscription it receives, counted in :attr:`KvEventPublisher.subscriptions`, so that a test can
wait until a subscriber has joined instead of sleeping and hoping it has.
"""

from __future__ import annotations

from . import _deps  # noqa: F401  (names the extra when a package is missing)

# isort: split

import itertools
import struct
import threading
import time
from collections import deque
from collections.abc import Sequence

import zmq

from smetric._core import encode_kv_batch

from .cache import Event

END_SEQ = b"\xff" * 8
"""The replay end marker's sequence frame (-1 as a signed 64-bit int)."""
_ids = itertools.count()


class KvEventPublisher:
    """A PUB socket and, optionally, a replay ROUTER, served by a background thread."""

    def __init__(
        self,
        pub_endpoint: str,
        replay_endpoint: str | None = None,
        *,
        topic: str = "",
        buffer_steps: int = 10_000,
        hwm: int = 100_000,
        dp_rank: int = 0,
    ) -> None:
        self.topic = topic.encode()
        self.dp_rank = dp_rank
        self._ctx = zmq.Context()
        self._inproc = f"inproc://smetric-fake-kv-{next(_ids)}"
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._stop = threading.Event()
        self._pub = self._ctx.socket(zmq.XPUB)
        self._pub.setsockopt(zmq.XPUB_VERBOSE, 1)  # every subscription, not only a topic's first
        self._pub.setsockopt(zmq.SNDHWM, hwm)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._pub.bind(pub_endpoint)
        self.pub_endpoint: str = self._pub.getsockopt_string(zmq.LAST_ENDPOINT)
        self._router: zmq.Socket[bytes] | None = None
        self.replay_endpoint: str | None = None
        if replay_endpoint is not None:
            self._router = self._ctx.socket(zmq.ROUTER)
            self._router.setsockopt(zmq.SNDHWM, 2 * (buffer_steps + 1))
            self._router.setsockopt(zmq.LINGER, 0)
            self._router.bind(replay_endpoint)
            self.replay_endpoint = self._router.getsockopt_string(zmq.LAST_ENDPOINT)
        self._pull = self._ctx.socket(zmq.PULL)
        self._pull.bind(self._inproc)
        self._push = self._ctx.socket(zmq.PUSH)  # used only by the engine's thread
        self._push.connect(self._inproc)
        self.published = 0
        self.subscriptions = 0
        """Subscriptions received so far (a subscriber that joins counts once per topic it asks)."""
        self._thread = threading.Thread(target=self._run, name="smetric-fake-kv", daemon=True)
        self._thread.start()

    def publish(self, events: Sequence[Event], ts: float | None = None) -> None:
        """Queues one batch (call from the engine's thread only)."""
        payload = encode_kv_batch(time.time() if ts is None else ts, list(events), self.dp_rank)
        self._push.send(payload)

    def close(self, timeout: float = 5.0) -> None:
        """Publishes what is queued, stops the thread and closes every socket."""
        if not self._stop.is_set():
            self._push.send(b"")  # wakes the thread; an empty payload is the stop signal
            self._stop.set()
            self._thread.join(timeout)
            self._push.close(0)
            self._ctx.term()

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._pull, zmq.POLLIN)
        poller.register(self._pub, zmq.POLLIN)
        if self._router is not None:
            poller.register(self._router, zmq.POLLIN)
        seq = 0
        try:
            while True:
                ready = dict(poller.poll())
                if self._pull in ready:
                    payload = self._pull.recv()
                    if not payload:
                        return
                    frames = [self.topic, struct.pack(">q", seq), payload]
                    self._pub.send_multipart(frames)
                    self._buffer.append((seq, payload))
                    seq += 1
                    self.published += 1
                if self._pub in ready:
                    message = self._pub.recv()
                    if message[:1] == b"\x01":  # subscribe (b"\x00" + topic is an unsubscribe)
                        self.subscriptions += 1
                if self._router is not None and self._router in ready:
                    self._replay(self._router.recv_multipart())
        finally:
            for sock in (self._pull, self._pub, self._router):
                if sock is not None:
                    sock.close(0)

    def _replay(self, request: list[bytes]) -> None:
        assert self._router is not None
        if len(request) != 3 or len(request[2]) != 8:
            return  # vLLM logs and ignores a malformed request
        identity, start = request[0], struct.unpack(">q", request[2])[0]
        for seq, payload in self._buffer:
            if seq >= start:
                self._router.send_multipart([identity, b"", self.topic, struct.pack(">q", seq), payload])
        self._router.send_multipart([identity, b"", b"", END_SEQ, b""])
