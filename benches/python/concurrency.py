"""Routing and KV-event ingestion at once, against each alone (issues 5 and 9, concurrency).

Usage: ``python benches/python/concurrency.py [--seconds S]``. One thread routes 32K-token
follow-ups (smetric, 32 instances, exact index as a fleet with KV events runs it); another feeds
the captured vLLM 0.33 event stream (``tests/data/vllm/captured_stream.json``) to a
``KvEventIngestor`` on the same router, a pass of the stream at a time: prebuilt frames with the
source reset after each pass (the binding and the core alone), or with ``--fresh-frames`` new frame
objects and continuing sequence numbers every pass (the Python work of a subscriber that receives a
live stream, all under the GIL). The ingest thread hands each pass in with one ``on_messages`` call, as
``KvEventSubscriber`` hands in what it drained from a socket (``--per-message`` feeds them one
``on_message`` call each, the way the subscriber did before). Prints each rate alone and together.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path

import numpy as np

from smetric import Router, RouterConfig
from smetric._core import KvEventIngestor

STREAM = Path(__file__).parents[2] / "tests" / "data" / "vllm" / "captured_stream.json"


def make_router() -> tuple[Router, np.ndarray]:
    names = [f"gpu-{i}" for i in range(32)]
    router = Router(names, policy="smetric", config=RouterConfig(index_mode="exact"))
    rng = np.random.default_rng(3)
    prompt = rng.integers(0, 151_936, 32_768, dtype=np.int32)
    router.store_blocks("gpu-7", router.hash_tokens(prompt))
    return router, prompt


def frames() -> list[list[bytes]]:
    doc = json.loads(STREAM.read_text())
    return [[bytes.fromhex(f) for f in m] for m in doc["messages"]]


def route_loop(router: Router, prompt: np.ndarray, stop: float, out: list[int]) -> None:
    while time.perf_counter() < stop:
        router.on_finished(router.route(prompt).request_id)
        out[0] += 1


def ingest_loop(
    router: Router, messages: list[list[bytes]], stop: float, out: list[int], per_message: bool, fresh: bool
) -> None:
    ingestor = KvEventIngestor(router)
    source = ingestor.add_source("gpu-3")
    # Prebuilt frames, sequence numbers from 0 in every pass and the source reset after each: the
    # binding and the core only. With `fresh`, every pass builds new frames with continuing sequence
    # numbers, as a socket hands out a live stream: the Python work a subscriber does per message.
    prebuilt = [[topic, seq.to_bytes(8, "big"), payload] for seq, (topic, _, payload) in enumerate(messages)]
    seq = 0
    while time.perf_counter() < stop:
        stream = prebuilt
        if fresh:
            stream = [[topic, (seq + k).to_bytes(8, "big"), payload] for k, (topic, _, payload) in enumerate(messages)]
            seq += len(stream)
        if per_message:
            for frames in stream:
                ingestor.on_message(source, frames)
        else:
            ingestor.on_messages(source, stream)
        out[0] += len(stream)
        if not fresh:
            ingestor.reset_source(source)


def run(
    seconds: float, do_route: bool, do_ingest: bool, per_message: bool = False, fresh: bool = False
) -> tuple[float, float]:
    router, prompt = make_router()
    messages = frames()
    routes, batches = [0], [0]
    stop = time.perf_counter() + seconds
    threads = []
    if do_route:
        threads.append(threading.Thread(target=route_loop, args=(router, prompt, stop, routes)))
    if do_ingest:
        threads.append(threading.Thread(target=ingest_loop, args=(router, messages, stop, batches, per_message, fresh)))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return routes[0] / seconds, batches[0] / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--per-message", action="store_true", help="one on_message call per message")
    parser.add_argument("--fresh-frames", action="store_true", help="new frames every pass, as a live socket")
    args = parser.parse_args()
    route_alone, _ = run(args.seconds, True, False)
    _, ingest_alone = run(args.seconds, False, True, args.per_message, args.fresh_frames)
    route_both, ingest_both = run(args.seconds, True, True, args.per_message, args.fresh_frames)
    print(
        f"routes/s (32K tokens): alone {route_alone:,.0f}, "
        f"with ingestion {route_both:,.0f} ({route_both / route_alone:.2f}x)"
    )
    print(
        f"event batches/s: alone {ingest_alone:,.0f}, "
        f"with routing {ingest_both:,.0f} ({ingest_both / ingest_alone:.2f}x)"
    )


if __name__ == "__main__":
    main()
