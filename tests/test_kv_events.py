"""KV events → index, without vLLM: the committed captures of vLLM 0.33.0's publisher, decoded and
ingested in process and through smetric.events.KvEventSubscriber over loopback sockets.

The truth of ``captured_stream.json`` is vLLM's own block pool at the end of the captured workload;
the index fed by the events must match it probe for probe (``kv_truth.mismatches``).
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

zmq = pytest.importorskip("zmq")

from kv_truth import exact_router, frames, load, mismatches, wait_for  # noqa: E402

from smetric import InvalidArgumentError, Router  # noqa: E402
from smetric._core import IngestStep, KvEventIngestor  # noqa: E402
from smetric.errors import KvEventEndpointInUseError  # noqa: E402
from smetric.events import KvEventSource, KvEventSubscriber, discover_sources, sources_from_config  # noqa: E402

STREAM = load("captured_stream.json")
TRUTH = STREAM["truth"]
MESSAGES = [frames(m) for m in STREAM["messages"]]
REPLAY = [frames(m) for m in STREAM["replay_from_0"]]
END_SEQ = b"\xff" * 8


# -- in process ----------------------------------------------------------------------------------


def as_tuple(step: IngestStep) -> tuple[int | None, bool, str | None]:
    """``(replay_from, replay_done, error)`` of a step."""
    return (step.replay_from, step.replay_done, step.error)


def test_captured_vllm_stream_ends_as_vllms_block_pool() -> None:
    router = exact_router(["a"])
    ing = KvEventIngestor(router)
    src = ing.add_source("a")
    for m in MESSAGES:
        assert as_tuple(ing.on_message(src, m)) == (None, False, None)
    assert mismatches(router, "a", TRUTH) == []
    stats = ing.stats()
    assert stats["batches"] == TRUTH["messages"] and stats["cleared"] == 1
    assert stats["removed_blocks"] > 100, "the workload evicts blocks"
    assert (stats["held_local_blocks"], stats["held_global_blocks"]) == (TRUTH["cached_blocks_total"], 0)
    assert ing.stats(src)["messages"] == len(MESSAGES)


def test_on_messages_is_on_message_for_each() -> None:
    one, many = exact_router(["a"]), exact_router(["a"])
    ing_one, ing_many = KvEventIngestor(one), KvEventIngestor(many)
    src_one, src_many = ing_one.add_source("a", replay=True), ing_many.add_source("a", replay=True)
    # Batches of uneven sizes, a gap (the last message first, which asks for a replay) included.
    stream = [MESSAGES[-1], *MESSAGES]
    steps = [as_tuple(ing_one.on_message(src_one, m)) for m in stream]
    expected = [(i, s) for i, s in enumerate(steps) if s != (None, False, None)]
    got: list[tuple[int, tuple[int | None, bool, str | None]]] = []
    for start, size in ((0, 1), (1, 7), (8, 0), (8, len(stream))):
        got += [(start + i, as_tuple(s)) for i, s in ing_many.on_messages(src_many, stream[start : start + size])]
    assert got == expected and expected[0] == (0, (0, False, None))
    assert ing_many.stats() == ing_one.stats()
    assert mismatches(many, "a", TRUTH) == mismatches(one, "a", TRUTH)
    with pytest.raises(InvalidArgumentError):
        ing_many.on_messages(99, [MESSAGES[0]])


def test_late_join_replays_the_captured_replay_and_matches() -> None:
    router = exact_router(["a"])
    ing = KvEventIngestor(router)
    src = ing.add_source("a", replay=True)
    assert as_tuple(ing.on_message(src, MESSAGES[-1])) == (0, False, None)
    steps = [as_tuple(ing.on_replay_reply(src, r)) for r in REPLAY]
    assert steps[-1] == (None, True, None) and all(s == (None, False, None) for s in steps[:-1])
    assert mismatches(router, "a", TRUTH) == []
    assert ing.stats()["replays"] == 1


def test_every_captured_publisher_stream_is_consistent() -> None:
    doc = load("captured_events.json")
    for stream in doc["streams"]:
        if stream["socket"] != "SUB":
            continue
        router = exact_router(["a"])
        ing = KvEventIngestor(router)
        src = ing.add_source("a")
        for m in stream["messages"]:
            assert ing.on_message(src, frames(m["frames"])).error is None, stream["name"]
        stats, index = ing.stats(), router.stats()
        assert stats["held_local_blocks"] == index["index_local_blocks"]["a"], stream["name"]
        assert stats["held_global_blocks"] == index["index_global_blocks"], stream["name"]
        assert stats["unmapped_hashes"] == 0 and stats["decode_errors"] == 0


def test_binding_errors() -> None:
    ing = KvEventIngestor(exact_router(["a"]))
    with pytest.raises(InvalidArgumentError):
        ing.on_message(7, MESSAGES[0])
    with pytest.raises(InvalidArgumentError):
        KvEventIngestor(exact_router(["a"]), max_mapped_blocks=-1)
    with pytest.raises(TypeError):
        ing.on_message(ing.add_source("a"), ["not", "bytes", "frames"])  # type: ignore[list-item]
    src = ing.add_source("a")
    ing.remove_source(src)
    with pytest.raises(InvalidArgumentError):
        ing.stats(src)


# -- over loopback sockets -----------------------------------------------------------------------


class FakePublisher:
    """vLLM's publisher protocol on 127.0.0.1: an XPUB (it sees the subscription arrive) and a
    ROUTER serving replays from its buffer in the ≥0.26 or the ≤0.25 reply layout. ``publish``
    buffers every batch and may leave one off the wire, which makes a gap."""

    def __init__(self, *, replay: bool = True, old_layout: bool = False) -> None:
        self.ctx = zmq.Context()
        self.pub = self.ctx.socket(zmq.XPUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.setsockopt(zmq.XPUB_VERBOSE, 1)  # report every subscriber's subscription
        self.pub.bind("tcp://127.0.0.1:*")
        self.endpoint: str = self.pub.getsockopt_string(zmq.LAST_ENDPOINT)
        self.buffer: dict[int, bytes] = {}
        self.lock = threading.Lock()
        self.old_layout = old_layout
        self.replay_requests: list[int] = []
        self.replayed = 0
        """Batches sent in replies to replays: what the buffer held from the first asked on when
        the request came (publishing may still be under way then)."""
        self.replay_endpoint: str | None = None
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None
        if replay:
            ready = threading.Event()
            self.thread = threading.Thread(target=self._serve, args=(ready,), daemon=True)
            self.thread.start()
            assert ready.wait(5)

    def _serve(self, ready: threading.Event) -> None:
        sock = self.ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.bind("tcp://127.0.0.1:*")
        self.replay_endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        ready.set()
        while not self.stop.is_set():
            if not sock.poll(50):
                continue
            identity, _, start = sock.recv_multipart()
            first = int.from_bytes(start, "big")
            self.replay_requests.append(first)
            with self.lock:
                batches = sorted((s, p) for s, p in self.buffer.items() if s >= first)
            for seq, payload in batches:
                head = [identity, b""] if self.old_layout else [identity, b"", b""]
                sock.send_multipart([*head, seq.to_bytes(8, "big"), payload])
            self.replayed += len(batches)
            sock.send_multipart(
                [identity, b"", END_SEQ, b""] if self.old_layout else [identity, b"", b"", END_SEQ, b""]
            )
        sock.close(linger=0)

    def wait_subscribed(self, timeout: float = 5.0) -> None:
        assert self.pub.poll(int(timeout * 1000)), "no subscription arrived"
        assert self.pub.recv()[:1] == b"\x01"

    def publish(self, seq: int, payload: bytes, *, wire: bool = True, topic: bytes = b"") -> None:
        with self.lock:
            self.buffer[seq] = payload
        if wire:
            self.pub.send_multipart([topic, seq.to_bytes(8, "big"), payload])

    def send_raw(self, frames: list[bytes]) -> None:
        self.pub.send_multipart(frames)

    def close(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(5)
        self.pub.close(linger=0)
        self.ctx.term()


@pytest.fixture
def publisher(request: pytest.FixtureRequest) -> Iterator[FakePublisher]:
    params: dict[str, Any] = getattr(request, "param", {})
    pub = FakePublisher(**params)
    yield pub
    pub.close()


def subscribe(router: Router, pub: FakePublisher, **kw: Any) -> KvEventSubscriber:
    source = KvEventSource("a", pub.endpoint, replay_endpoint=pub.replay_endpoint)
    sub = KvEventSubscriber(router, [source], **kw).start()
    pub.wait_subscribed()
    return sub


@pytest.mark.parametrize("publisher", [{"old_layout": False}, {"old_layout": True}], indirect=True)
def test_a_gap_is_filled_by_a_replay(publisher: FakePublisher) -> None:
    router = exact_router(["a"])
    with subscribe(router, publisher) as sub:
        for seq, m in enumerate(MESSAGES):
            publisher.publish(seq, m[2], wire=not 10 <= seq < 20)
        assert wait_for(lambda: not mismatches(router, "a", TRUTH)), mismatches(router, "a", TRUTH)
        # Then every message has arrived: the live ones (all but 10-19) and the replay's (10 on, as
        # far as the publisher had got when the request came: the gap shows at 20, so at least
        # 10-20), each batch applied once and the replayed copies of live ones dropped as stale.
        live = len(MESSAGES) - 10
        assert wait_for(lambda: sub.stats()["messages"] == live + publisher.replayed), sub.stats()
        stats = sub.stats()
        assert publisher.replayed >= 11, publisher.replayed
        assert (stats["batches"], stats["stale_messages"]) == (len(MESSAGES), publisher.replayed - 10)
        assert mismatches(router, "a", TRUTH) == []
        stats = sub.stats()
    assert publisher.replay_requests == [10]
    assert (stats["gaps"], stats["replays"], stats["replay_failures"], stats["resets"]) == (1, 1, 0, 0)
    assert stats["sources"][0]["endpoint"] == publisher.endpoint and not sub.running


@pytest.mark.parametrize("publisher", [{"replay": False}], indirect=True)
def test_without_replay_a_gap_resets_and_a_restart_resets(publisher: FakePublisher) -> None:
    router = exact_router(["a"])
    # The reference: the stream's first 20 batches alone.
    ref = exact_router(["a"])
    ref_ing = KvEventIngestor(ref)
    ref_src = ref_ing.add_source("a")
    for m in MESSAGES[:20]:
        ref_ing.on_message(ref_src, m)
    with subscribe(router, publisher) as sub:
        for seq, m in enumerate(MESSAGES):
            publisher.publish(seq, m[2], wire=seq != 30)
        assert wait_for(lambda: sub.stats()["messages"] == len(MESSAGES) - 1)
        stats = sub.stats()
        assert (stats["gaps"], stats["resets"], stats["replays"]) == (1, 1, 0)
        assert stats["held_local_blocks"] == router.stats()["index_local_blocks"]["a"]
        # The publisher restarts: its sequence starts again at 0.
        for seq, m in enumerate(MESSAGES[:20]):
            publisher.publish(seq, m[2])
        assert wait_for(lambda: sub.stats()["restarts"] == 1 and sub.stats()["messages"] == len(MESSAGES) + 19)
    probes = [p["tokens"] for p in TRUTH["probes"]]
    assert [router.query(p).local["a"] for p in probes] == [ref.query(p).local["a"] for p in probes]
    assert router.stats()["index_local_blocks"] == ref.stats()["index_local_blocks"]


def test_bad_input_is_counted_never_fatal(publisher: FakePublisher) -> None:
    router = exact_router(["a"])
    truncated = MESSAGES[0][2][:-3]
    huge_array = bytes([0x93, 0xCB]) + bytes(8) + bytes([0xDD, 0x7F, 0xFF, 0xFF, 0xFF])
    ts = bytes([0xCB]) + bytes(8)
    unknown_type = bytes([0x93]) + ts + bytes([0x91, 0x81, 0xA4]) + b"type" + bytes([0xA9]) + b"BlockMove" + b"\x00"
    wrong_type = bytes([0x93]) + ts + bytes([0x91, 0x82, 0xA4]) + b"type" + bytes([0xAB]) + b"BlockStored"
    wrong_type += bytes([0xAC]) + b"block_hashes" + bytes([0xA3]) + b"abc" + b"\x00"
    sources = [
        KvEventSource("a", publisher.endpoint, replay_endpoint=publisher.replay_endpoint),
        KvEventSource("not-in-the-router", publisher.endpoint),
    ]
    with KvEventSubscriber(router, sources) as sub:
        publisher.wait_subscribed()
        publisher.wait_subscribed()
        publisher.send_raw([b"", b"\x00" * 8])  # two frames
        publisher.send_raw([b"", b"\x00" * 9, MESSAGES[0][2]])  # a 9-byte sequence number
        for seq, payload in enumerate([truncated, huge_array, unknown_type, wrong_type]):
            publisher.publish(seq, payload)
        for seq, m in enumerate(MESSAGES, start=4):
            publisher.publish(seq, m[2])
        assert wait_for(lambda: sub.stats()["messages"] == 2 * (len(MESSAGES) + 6))
        stats = sub.stats()
        assert sub.running and stats["loop_errors"] == 0
    kinds = stats["decode_errors_by_kind"]
    assert kinds == {"frame_count": 2, "bad_seq_frame": 2, "truncated": 4, "wrong_type": 2}, kinds
    assert stats["unknown_event_types"] == 2 and stats["unknown_instances"] > 0
    assert (stats["gaps"], stats["resets"]) == (0, 0), "bad payloads consume their sequence numbers"
    assert mismatches(router, "a", TRUTH) == []


def test_replay_timeout_resets_and_resumes() -> None:
    router = exact_router(["a"])
    pub = FakePublisher(replay=False)
    # A replay endpoint nobody serves: the request times out.
    source = KvEventSource("a", pub.endpoint, replay_endpoint="tcp://127.0.0.1:9")
    try:
        with KvEventSubscriber(router, [source], replay_timeout_s=0.3) as sub:
            pub.wait_subscribed()
            for seq, m in enumerate(MESSAGES):
                pub.publish(seq, m[2], wire=seq != 5)
            assert wait_for(lambda: sub.stats()["replay_failures"] == 1)
            assert wait_for(lambda: sub.stats()["messages"] == len(MESSAGES) - 1)
            stats = sub.stats()
    finally:
        pub.close()
    assert (stats["replays"], stats["resets"]) == (1, 1)
    assert stats["held_local_blocks"] == router.stats()["index_local_blocks"]["a"]


def test_lifecycle() -> None:
    router = exact_router(["a"])
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        endpoint = f"tcp://127.0.0.1:{taken.getsockname()[1]}"
        sub = KvEventSubscriber(router, [KvEventSource("a", endpoint, bind=True)])
        with pytest.raises(KvEventEndpointInUseError, match=r"tcp://\*:"):
            sub.start()  # the port is taken: the typed error says how to configure the engine
    finally:
        taken.close()
    assert not sub.running
    ok = KvEventSubscriber(router, [KvEventSource("a", "tcp://127.0.0.1:*", bind=True)])
    with pytest.raises(ValueError, match="replay_timeout_s"):
        KvEventSubscriber(router, [], replay_timeout_s=0)
    ok.start()
    with pytest.raises(RuntimeError):
        ok.start()
    t = time.monotonic()
    ok.stop()
    ok.stop(clear=True)
    assert time.monotonic() - t < 2 and not ok.running


# -- discovery -----------------------------------------------------------------------------------

VLLM_SOURCES = {
    "0": {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": "tcp://*:5557",
        "replay_endpoint": "tcp://*:5560",
        "buffer_steps": 10000,
        "hwm": 100000,
        "max_queue_size": 100000,
        "topic": "kv@10.0.0.1:8000@m",
    },
    "1": {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": "tcp://*:5558", "replay_endpoint": None},
    "2": {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": "tcp://router-host:6000"},
    "3": {"enable_kv_cache_events": False, "publisher": "null", "endpoint": "tcp://*:5560"},
}


def test_sources_from_vllm_config() -> None:
    s = sources_from_config("gpu-0", VLLM_SOURCES, "gpu-0.local")
    assert s == [
        KvEventSource("gpu-0", "tcp://gpu-0.local:5557", "tcp://gpu-0.local:5560", False, "kv@10.0.0.1:8000@m"),
        KvEventSource("gpu-0", "tcp://gpu-0.local:5558", None, False, ""),
        KvEventSource("gpu-0", "tcp://router-host:6000", None, True, ""),
    ]


def test_discover_sources_over_http() -> None:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps(VLLM_SOURCES if self.path == "/kv_event_sources" else []).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        sources = discover_sources(url)
        assert [s.endpoint for s in sources][:2] == ["tcp://127.0.0.1:5557", "tcp://127.0.0.1:5558"]
        assert all(s.instance == url for s in sources)
        with pytest.raises(ValueError, match="not an object"):
            discover_sources("x", url + "/list")
    finally:
        server.shutdown()
        server.server_close()
