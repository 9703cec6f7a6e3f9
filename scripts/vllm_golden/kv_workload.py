#!/usr/bin/env python3
"""Drive vLLM 0.33's real KV-cache manager with an agent workload and publish its KV events.

Runs inside the vLLM venv (``scripts/vllm_golden/_venv.py``). A real ``KVCacheManager``
(prefix caching on, KV events on, a 48-block GPU pool so blocks get evicted) serves agent
sessions: every session shares a system prompt, each turn re-sends the history plus the previous
output and a tool result, output tokens are decoded one by one (so blocks fill and are cached
with their parent), one session uses a LoRA adapter, the prefix cache is reset once mid-run,
and twin requests leave two physical copies of the same blocks, one of which is evicted before
the end while the other stays (vLLM does not de-duplicate its block pool). After every engine
step the manager's events go out as one ``KVEventBatch`` through a real ``ZmqEventPublisher`` —
exactly what ``EngineCore`` does.

Ground truth: for every prompt the workload used, how many leading blocks vLLM's block pool
holds at the end, and how many blocks it caches in total. smetric's index, fed only by the
events, must agree (tests/test_kv_events_vllm.py, tests/test_kv_events.py).

Modes:
* ``--endpoint E --replay-endpoint R``: publish (E without ``*``: the publisher connects to a
  SUB bound there), print the truth as one JSON line on stdout, then keep serving replays until
  stdin closes or a line arrives (at most ``--linger`` seconds). ``--pause-after N`` stops after N
  batches the same way (printing ``{"paused": N}``), so a subscriber can join late and catch up
  through the replay endpoint. The rank offsets both ports, as in vLLM.
* ``--capture OUT``: bind a SUB on 127.0.0.1, record every frame the publisher sends, ask for a
  replay from 0 with a DEALER, and write frames + truth to OUT (``tests/data/vllm/captured_stream.json``).
  From the repository root: ``python3.11 scripts/vllm_golden/kv_workload.py --venv /tmp/vllm-venv --capture``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
DEFAULT_CAPTURE = REPO / "tests" / "data" / "vllm" / "captured_stream.json"
BLOCK_SIZE = 16
NUM_GPU_BLOCKS = 48
LORA = ("sql-adapter", 1, "/adapters/sql-lora")
SOURCE = (
    "Frames that vLLM 0.33.0's ZmqEventPublisher sent over TCP on 127.0.0.1 to a pyzmq SUB (messages) and, "
    "asked with [b'', 0] afterwards, to a DEALER (replay). The events are the ones vLLM's own KVCacheManager "
    "(block pool with prefix caching and KV events) produced while serving the scripted agent workload of "
    "scripts/vllm_golden/kv_workload.py; 'truth' is read from that block pool at the end."
)


def _workload(publish: Any) -> dict[str, Any]:
    """Serve the sessions, publishing after every step; return the ground truth."""
    import torch
    from vllm.distributed.kv_events import KVEventBatch
    from vllm.lora.request import LoRARequest
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core import kv_cache_utils as kcu
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.request import Request

    hash_fn = get_hash_fn_by_name("sha256")
    kcu.init_none_hash(hash_fn)
    spec = FullAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=1, head_size=8, dtype=torch.float32)
    config = KVCacheConfig(
        num_blocks=NUM_GPU_BLOCKS, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["attn"], spec)]
    )
    manager = KVCacheManager(
        config,
        max_model_len=4096,
        scheduler_block_size=BLOCK_SIZE,
        hash_block_size=BLOCK_SIZE,
        enable_caching=True,
        enable_kv_cache_events=True,
    )
    rng = random.Random(20261129)
    ids = iter(range(1_000_000))

    def request(tokens: list[int], lora: bool) -> Any:
        return Request(
            request_id=f"r{next(ids)}",
            prompt_token_ids=tokens,
            sampling_params=SamplingParams(max_tokens=64),
            pooling_params=None,
            lora_request=LoRARequest(*LORA) if lora else None,
            block_hasher=kcu.get_request_block_hasher(BLOCK_SIZE, hash_fn),
        )

    def text(n: int) -> list[int]:
        return [rng.randrange(151_936) for _ in range(n)]

    system = text(56)
    sessions = [
        {"history": system + text(rng.randrange(20, 70)), "turns": rng.randrange(2, 5), "lora": i == 3}
        for i in range(10)
    ]
    probes: list[dict[str, Any]] = []
    messages = 0

    def step() -> None:
        nonlocal messages
        events = manager.take_events()
        if events:
            publish(KVEventBatch(ts=time.time(), events=events))
            messages += 1

    def twins() -> dict[str, Any]:
        """Two physical copies of the same blocks: vLLM's block pool does not de-duplicate.

        B hits the blocks A cached for its first chunk and computes the rest itself; then A
        computes the same rest, and each copy is announced by its own ``BlockStored``. A is freed
        at once, so later traffic evicts its copies (each its own ``BlockRemoved``) while B holds
        its own until the end: those blocks stay cached, and an index that dropped them at the
        first removal would disagree with the pool.
        """
        tokens = system + text(4 * BLOCK_SIZE)
        a, b = request(list(tokens), False), request(list(tokens), False)
        blocks, hit = manager.get_computed_blocks(a)[:2]
        chunk = 5 * BLOCK_SIZE - hit
        assert manager.allocate_slots(a, chunk, hit, blocks) is not None
        a.num_computed_tokens = hit + chunk
        step()
        blocks, hit = manager.get_computed_blocks(b)[:2]
        assert hit == 5 * BLOCK_SIZE, hit
        assert manager.allocate_slots(b, b.num_tokens - hit, hit, blocks) is not None
        b.num_computed_tokens = b.num_tokens
        assert manager.allocate_slots(a, a.num_tokens - a.num_computed_tokens) is not None
        a.num_computed_tokens = a.num_tokens
        step()
        # Block ids of A's own copies of the blocks B also computed (positions 5 and 6).
        copies = list(manager.get_block_ids(a.request_id)[0][5:7])
        manager.free(a)
        return {"b": b, "tokens": tokens, "a_copies": copies}

    twin: dict[str, Any] | None = None
    waiting = list(range(len(sessions)))
    running: list[dict[str, Any]] = []
    reset_done = False
    while waiting or running:
        # Admit up to three requests, prefilling each (prefix hits come from the cache).
        while waiting and len(running) < 3:
            s = sessions[waiting[0]]
            req = request(list(s["history"]), s["lora"])
            blocks, hit = manager.get_computed_blocks(req)[:2]
            if manager.allocate_slots(req, req.num_tokens - hit, hit, blocks) is None:
                break
            req.num_computed_tokens = req.num_tokens
            waiting.pop(0)
            running.append({"session": s, "req": req, "left": rng.randrange(6, 30)})
        # One decode step for every running request.
        for r in list(running):
            req = r["req"]
            req.append_output_token_ids(rng.randrange(151_936))
            if manager.allocate_slots(req, 1) is None:
                raise RuntimeError("the pool is sized so that decoding never runs out of blocks")
            req.num_computed_tokens += 1
            r["left"] -= 1
            if r["left"] == 0:
                manager.free(req)
                running.remove(r)
                s = r["session"]
                s["history"] = list(req.all_token_ids)
                probes.append({"tokens": s["history"], "lora": LORA[0] if s["lora"] else None})
                s["turns"] -= 1
                if s["turns"] > 0:
                    s["history"] += text(rng.randrange(5, 90))  # the tool result
                    waiting.append(sessions.index(s))
        step()
        if not running and not reset_done and len(probes) >= 12:
            assert manager.reset_prefix_cache()
            reset_done = True
            step()
            twin = twins()
    assert reset_done

    assert twin is not None
    # Evict A's copies while B still holds its own: allocate exactly the free blocks up to them.
    free = manager.block_pool.free_block_queue.get_all_free_blocks()
    position = {blk.block_id: i for i, blk in enumerate(free)}
    reach = max(position[i] for i in twin["a_copies"]) + 1
    filler = request(text(reach * BLOCK_SIZE), False)
    assert manager.allocate_slots(filler, filler.num_tokens) is not None
    step()
    manager.free(filler)
    manager.free(twin["b"])
    step()
    probes.append({"tokens": twin["tokens"], "lora": None})

    def cached_prefix(tokens: list[int], lora: str | None) -> int:
        req = request(tokens, lora is not None)
        n = 0
        for h in req.block_hashes:
            if manager.block_pool.get_cached_block(h, [0]) is None:
                break
            n += 1
        return n

    for p in probes:
        p["cached_blocks"] = cached_prefix(p["tokens"], p["lora"])
    return {
        "block_size": BLOCK_SIZE,
        "messages": messages,
        "cached_blocks_total": len(manager.block_pool.cached_block_hash_to_block),
        "probes": probes,
    }


def _publish_mode(args: argparse.Namespace) -> None:
    import select

    from vllm.distributed.kv_events import ZmqEventPublisher

    publisher = ZmqEventPublisher(
        data_parallel_rank=args.dp_rank,
        endpoint=args.endpoint,
        replay_endpoint=args.replay_endpoint,
        topic=args.topic,
    )

    def drain() -> None:
        while not publisher._event_queue.empty():
            time.sleep(0.01)
        time.sleep(0.05)  # the last send_multipart

    def wait_for_line() -> None:
        select.select([sys.stdin], [], [], args.linger)
        sys.stdin.readline()

    published = 0

    def publish(batch: Any) -> None:
        nonlocal published
        publisher.publish(batch)
        published += 1
        if published == args.pause_after:
            drain()
            print(json.dumps({"paused": published}), flush=True)
            wait_for_line()

    time.sleep(args.warmup)  # let the subscriber's subscription reach the PUB socket
    truth = _workload(publish)
    drain()
    print(json.dumps(truth), flush=True)
    wait_for_line()  # serve replays until told to stop
    publisher.shutdown()


def _capture_mode(out: Path) -> None:
    import vllm
    import zmq
    from vllm.distributed.kv_events import ZmqEventPublisher
    from zmq.utils.monitor import recv_monitor_message

    assert vllm.__version__ == "0.33.0", vllm.__version__
    ctx = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.bind("tcp://127.0.0.1:*")
    port = int(sub.getsockopt_string(zmq.LAST_ENDPOINT).rsplit(":", 1)[1])
    monitor = sub.get_monitor_socket()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        replay_port = s.getsockname()[1]
    publisher = ZmqEventPublisher(
        data_parallel_rank=0, endpoint=f"tcp://127.0.0.1:{port}", replay_endpoint=f"tcp://127.0.0.1:{replay_port}"
    )
    while monitor.poll(5000):
        if recv_monitor_message(monitor)["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            break
    sub.poll(100)
    time.sleep(0.5)
    truth = _workload(publisher.publish)
    received = []
    while len(received) < truth["messages"] and sub.poll(5000):
        received.append(sub.recv_multipart())
    assert len(received) == truth["messages"], (len(received), truth["messages"])
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(f"tcp://127.0.0.1:{replay_port}")
    dealer.send_multipart([b"", (0).to_bytes(8, "big")])
    replay = []
    while dealer.poll(5000):
        frames = dealer.recv_multipart()
        replay.append(frames)
        if frames[1:] == [b"", ZmqEventPublisher.END_SEQ, b""]:
            break
    assert len(replay) == len(received) + 1, len(replay)
    publisher.shutdown()
    doc = {
        "source": SOURCE,
        "generator": "scripts/vllm_golden/kv_workload.py",
        "vllm_version": vllm.__version__,
        "truth": truth,
        "messages": [[f.hex() for f in m] for m in received],
        "replay_from_0": [[f.hex() for f in m] for m in replay],
    }
    out.write_text(json.dumps(doc, separators=(",", ":")) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--endpoint", help="PUB endpoint (no '*': the publisher connects to it)")
    parser.add_argument("--replay-endpoint", help="replay ROUTER endpoint (bound)")
    parser.add_argument("--dp-rank", type=int, default=0)
    parser.add_argument("--topic", default="")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds to wait before publishing")
    parser.add_argument("--linger", type=float, default=60.0, help="most seconds to wait for a line on stdin")
    parser.add_argument(
        "--pause-after", type=int, default=0, help="after N batches, print {'paused': N} and wait for a line on stdin"
    )
    parser.add_argument("--capture", type=Path, nargs="?", const=DEFAULT_CAPTURE, help="write a capture file")
    parser.add_argument("--venv", type=Path, help="with --capture: the vLLM venv to create or reuse")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.capture is not None and not args.worker:
        if args.venv is None:
            parser.error("--capture needs --venv")
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from _venv import ensure_venv

        python = ensure_venv(args.venv)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
        cmd = [str(python), str(Path(__file__).resolve()), "--worker", "--capture", str(args.capture)]
        subprocess.run(cmd, check=True, env=env)
        return
    if args.capture is not None:
        _capture_mode(args.capture)
    elif args.endpoint:
        _publish_mode(args)
    else:
        parser.error("give --endpoint or --capture")


if __name__ == "__main__":
    main()
