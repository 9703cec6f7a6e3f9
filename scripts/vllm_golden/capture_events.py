#!/usr/bin/env python3
"""Capture the real ZMQ frames of vLLM 0.33.0's ``ZmqEventPublisher`` for smetric's decoder tests.

Writes ``tests/data/vllm/captured_events.json``. Inside the vLLM venv, a worker process:

1. binds a SUB socket on 127.0.0.1 and starts real ``vllm.distributed.kv_events.ZmqEventPublisher``
   instances (data-parallel ranks 0 and 1; the rank offsets the port, so each connects to its own SUB) with a
   replay ROUTER endpoint on 127.0.0.1;
2. publishes a scripted sequence of real ``KVEventBatch`` objects (``BlockStored`` with token ids,
   ``BlockRemoved``, ``AllBlocksCleared``; GPU, CPU, lower-case ``cpu`` and STORAGE media; int and bytes
   block hashes computed by vLLM's own request block hasher) and records the exact multipart frames the SUB
   receives;
3. asks for replays with a DEALER socket (``[b"", start_seq]``) and records every reply, end marker included;
4. publishes batches built from msgspec structs with ``array_like=True`` that mirror the vLLM <=0.23 event
   layout through a third publisher. Those payloads are synthesized (vLLM 0.33 itself emits the map form).

Each message is stored as hex frames together with the expected decoded content, computed from the Python
objects that were published. Usage (see README.md):
``python3.11 scripts/vllm_golden/capture_events.py --venv /tmp/vllm-venv``
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO / "tests" / "data" / "vllm" / "captured_events.json"

MODEL_TOPIC = "kv@127.0.0.1:8001@Qwen/Qwen3-0.6B"
LORA = {"name": "sql-adapter", "path": "/adapters/sql-lora"}
BLOCK_SIZE = 16
SOURCE = (
    "Map-form streams (names starting with 'map-') and their replays are the exact frames that vLLM 0.33.0's "
    "ZmqEventPublisher sent over TCP on 127.0.0.1, as received by a pyzmq SUB socket (PUB messages) and a "
    "DEALER socket (replay replies). Array-form streams ('array-') carry payloads SYNTHESIZED with msgspec "
    "structs (array_like=True, tag=True, omit_defaults=True) that mirror the vLLM <=0.23 event layout, sent "
    "through the same real ZmqEventPublisher; they were not captured from an old vLLM release. "
    "'array-nil-dp-rank' was encoded directly with msgspec, without a socket. msgspec writes every field of "
    "an array_like struct (omit_defaults only affects the map form), so array-form events carry all their fields "
    "and a batch without a rank still has 3 elements, the third nil."
)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _to_json(value: Any) -> Any:
    """Python event values to JSON: bytes become {"bytes": hex}, tuples become lists."""
    if isinstance(value, bytes):
        return {"bytes": value.hex()}
    if isinstance(value, list | tuple):
        return [_to_json(v) for v in value]
    return value


def _hash_json(h: Any) -> Any:
    return {"bytes": h.hex()} if isinstance(h, bytes) else {"int": h}


STORED_FIELDS = (
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "extra_keys",
    "group_idx",
    "kv_cache_spec_kind",
    "kv_cache_spec_sliding_window",
    "locality",
    "ownership",
    "session_id",
    "lookahead_token_ids",
)
REMOVED_FIELDS = ("block_hashes", "medium", "group_idx", "locality", "ownership")


def _expected_event(event: Any) -> dict[str, Any]:
    kind = type(event).__name__
    fields = {"BlockStored": STORED_FIELDS, "BlockRemoved": REMOVED_FIELDS}.get(kind, ())
    out: dict[str, Any] = {"type": kind}
    for name in fields:
        value = getattr(event, name, None)
        if name == "block_hashes":
            out[name] = [_hash_json(h) for h in value]
        elif name == "parent_block_hash":
            out[name] = None if value is None else _hash_json(value)
        else:
            out[name] = _to_json(value)
    return out


def _expected_batch(batch: Any, dp_rank: int | None) -> dict[str, Any]:
    return {"ts": batch.ts, "dp_rank": dp_rank, "events": [_expected_event(e) for e in batch.events]}


def _worker(out_path: Path) -> None:
    import msgspec
    import vllm
    import zmq
    from vllm.distributed.kv_events import (
        MEDIUM_CPU,
        MEDIUM_GPU,
        MEDIUM_STORAGE,
        AllBlocksCleared,
        BlockRemoved,
        BlockStored,
        KVEventBatch,
        ZmqEventPublisher,
    )
    from vllm.lora.request import LoRARequest
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core import kv_cache_utils as kcu
    from vllm.v1.request import Request
    from zmq.utils.monitor import recv_monitor_message

    assert vllm.__version__ == "0.33.0", vllm.__version__
    hash_fn = get_hash_fn_by_name("sha256")
    kcu.init_none_hash(hash_fn)

    def request(tokens: list[int], lora: dict[str, str] | None = None) -> Any:
        return Request(
            request_id="capture",
            prompt_token_ids=tokens,
            sampling_params=SamplingParams(max_tokens=1),
            pooling_params=None,
            lora_request=None if lora is None else LoRARequest(lora["name"], 1, lora["path"]),
            block_hasher=kcu.get_request_block_hasher(BLOCK_SIZE, hash_fn),
        )

    def ints(hashes: list[bytes]) -> list[int]:
        return [kcu.maybe_convert_block_hash(h) for h in hashes]

    # Prompts; rehash records how a decoder can recompute the published hashes.
    prompt_a = [(i * 7919 + 11) % 151_936 for i in range(48)]
    req_a = request(prompt_a)
    hashes_a = list(req_a.block_hashes)
    prompt_lora = [(i * 104_729 + 3) % 151_936 for i in range(32)]
    req_lora = request(prompt_lora, LORA)
    hashes_lora = list(req_lora.block_hashes)
    lora_extra = [
        kcu.generate_block_hash_extra_keys(req_lora, i * BLOCK_SIZE, (i + 1) * BLOCK_SIZE, 0)[0]
        for i in range(len(hashes_lora))
    ]
    prompt_b = [(i * 65_537 + 5) % 151_936 for i in range(64)]
    hashes_b = list(request(prompt_b).block_hashes)
    rehash = {"algo": "sha256", "seed": None, "block_size": BLOCK_SIZE}

    def stored(hashes: list[Any], parent: Any, tokens: list[int], **kw: Any) -> Any:
        fields: dict[str, Any] = {"lora_id": None, "medium": MEDIUM_GPU, "lora_name": None}
        fields.update(kw)
        return BlockStored(
            block_hashes=hashes, parent_block_hash=parent, token_ids=tokens, block_size=BLOCK_SIZE, **fields
        )

    ia, ib, il = ints(hashes_a), ints(hashes_b), ints(hashes_lora)
    script_a: list[tuple[Any, list[dict[str, Any] | None]]] = [
        (
            KVEventBatch(ts=1764400000.25, events=[stored(ia[:2], None, prompt_a[:32])]),
            [dict(rehash, tokens=prompt_a[:32], lora=None, first_block=0)],
        ),
        (
            KVEventBatch(
                ts=1764400000.5,
                events=[
                    stored([ia[2]], ia[1], prompt_a[32:48], group_idx=0, kv_cache_spec_kind="full_attention"),
                    BlockRemoved(block_hashes=[ia[0]], medium=MEDIUM_GPU),
                ],
            ),
            [dict(rehash, tokens=prompt_a, lora=None, first_block=2), None],
        ),
        (
            KVEventBatch(
                ts=1764400000.75,
                events=[
                    stored(
                        il,
                        None,
                        prompt_lora,
                        lora_id=1,
                        lora_name=LORA["name"],
                        extra_keys=kcu.to_event_extra_keys(lora_extra),
                    )
                ],
            ),
            [dict(rehash, tokens=prompt_lora, lora=LORA, first_block=0)],
        ),
        (
            KVEventBatch(
                ts=1764400001.0,
                events=[
                    # Native offloading placeholder: one hash, no tokens, block_size 0.
                    BlockStored(
                        block_hashes=[ia[1]],
                        parent_block_hash=None,
                        token_ids=[],
                        block_size=0,
                        lora_id=None,
                        medium=MEDIUM_CPU,
                        lora_name=None,
                    ),
                    BlockRemoved(block_hashes=[ia[1]], medium=MEDIUM_CPU, group_idx=0),
                    # Mooncake store connector style: lower-case medium.
                    stored(ia[:1], None, prompt_a[:16], medium="cpu"),
                ],
            ),
            [None, None, dict(rehash, tokens=prompt_a[:16], lora=None, first_block=0)],
        ),
        (KVEventBatch(ts=1764400001.25, events=[AllBlocksCleared()]), [None]),
        (
            KVEventBatch(
                ts=1764400001.5,
                events=[
                    stored(
                        hashes_a[1:3],
                        hashes_a[0],
                        prompt_a[16:48],
                        medium=MEDIUM_STORAGE,
                        kv_cache_spec_sliding_window=4096,
                        locality="REMOTE",
                        ownership="tier-2",
                        session_id="session-1",
                        lookahead_token_ids=[[prompt_a[32]], [1]],
                    ),
                    BlockRemoved(block_hashes=[hashes_a[2]], medium=MEDIUM_STORAGE, locality="LOCAL", ownership="x"),
                ],
            ),
            [dict(rehash, tokens=prompt_a, lora=None, first_block=1), None],
        ),
    ]
    script_b: list[tuple[Any, list[dict[str, Any] | None]]] = [
        (
            KVEventBatch(ts=1764400002.0, events=[stored(ib, None, prompt_b)]),
            [dict(rehash, tokens=prompt_b, lora=None, first_block=0)],
        ),
        (
            KVEventBatch(
                ts=1764400002.5,
                events=[BlockRemoved(block_hashes=[h], medium=MEDIUM_GPU) for h in reversed(ib)] + [AllBlocksCleared()],
            ),
            [None] * (len(ib) + 1),
        ),
    ]
    assert any(h >= 2**63 for h in ia + ib + il), "want at least one uint64 hash on the wire"

    # The <=0.23 layout: positional arrays, tag first, trailing defaults omitted.
    class OldEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):  # type: ignore[call-arg]
        ts: float
        events: list[Any]
        data_parallel_rank: int | None = None

    class OldEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):  # type: ignore[call-arg]
        pass

    # The class name is the msgspec tag, so these are named like vLLM's classes.
    old_stored = msgspec.defstruct(
        "BlockStored",
        [
            ("block_hashes", list[Any]),
            ("parent_block_hash", Any),
            ("token_ids", list[int]),
            ("block_size", int),
            ("lora_id", int | None),
            ("medium", str | None),
            ("lora_name", str | None),
            ("extra_keys", list[Any] | None, None),
            ("group_idx", int | None, None),
        ],
        bases=(OldEvent,),
    )
    old_removed = msgspec.defstruct(
        "BlockRemoved", [("block_hashes", list[Any]), ("medium", str | None)], bases=(OldEvent,)
    )
    old_cleared = msgspec.defstruct("AllBlocksCleared", [], bases=(OldEvent,))
    script_old: list[tuple[Any, list[dict[str, Any] | None]]] = [
        (
            OldEventBatch(
                ts=1764400003.0,
                events=[old_stored(ia[:2], None, prompt_a[:32], BLOCK_SIZE, None, MEDIUM_GPU, None)],
            ),
            [dict(rehash, tokens=prompt_a[:32], lora=None, first_block=0)],
        ),
        (
            OldEventBatch(
                ts=1764400003.5,
                events=[
                    old_stored(
                        il,
                        None,
                        prompt_lora,
                        BLOCK_SIZE,
                        1,
                        "gpu",
                        LORA["name"],
                        kcu.to_event_extra_keys(lora_extra),
                        0,
                    ),
                    old_removed([ia[0]], MEDIUM_GPU),
                    old_removed([ia[1]], None),
                    old_cleared(),
                ],
            ),
            [dict(rehash, tokens=prompt_lora, lora=LORA, first_block=0), None, None, None],
        ),
    ]

    ctx = zmq.Context.instance()
    streams: list[dict[str, Any]] = []

    def capture(name: str, form: str, dp_rank: int, topic: str, script: list[Any], replays: tuple[int, ...]) -> None:
        for attempt in range(3):
            sub = ctx.socket(zmq.SUB)
            sub.setsockopt(zmq.SUBSCRIBE, b"")
            sub.bind("tcp://127.0.0.1:*")
            port = int(sub.getsockopt_string(zmq.LAST_ENDPOINT).rsplit(":", 1)[1])
            monitor = sub.get_monitor_socket()
            replay_port = _free_port()
            # No "*" in the endpoint, so the publisher connects to our SUB; the rank offsets both ports.
            publisher = ZmqEventPublisher(
                data_parallel_rank=dp_rank,
                endpoint=f"tcp://127.0.0.1:{port - dp_rank}",
                replay_endpoint=f"tcp://127.0.0.1:{replay_port - dp_rank}",
                topic=topic,
            )
            # PUB drops messages until our subscription reaches it. The SUB only attaches the accepted
            # connection (and sends its subscription) when its own thread touches it, so wait for the
            # ZMTP handshake, poll the SUB once, then give the subscription time to arrive.
            handshake = False
            while not handshake and monitor.poll(5000):
                handshake = recv_monitor_message(monitor)["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED
            sub.poll(100)
            time.sleep(0.5 + attempt)
            for batch, _ in script:
                publisher.publish(batch)
            received = []
            while len(received) < len(script) and sub.poll(5000):
                received.append(sub.recv_multipart())
            sub.disable_monitor()
            monitor.close(linger=0)
            sub.close(linger=0)
            if len(received) == len(script):
                break
            print(f"{name}: got {len(received)} of {len(script)} (handshake {handshake}), retrying", file=sys.stderr)
            publisher.shutdown()
        else:
            raise RuntimeError(f"{name}: publisher messages were lost three times")

        def expect(seq: int) -> dict[str, Any]:
            batch, rehashes = script[seq]
            exp = _expected_batch(batch, dp_rank)
            for event, rh in zip(exp["events"], rehashes, strict=True):
                event["rehash"] = rh
            return {"end": False, "topic": topic, "seq": seq, "batch": exp}

        messages = [
            {"frames": [f.hex() for f in frames], "expected": expect(seq)} for seq, frames in enumerate(received)
        ]
        streams.append({"name": name, "form": form, "socket": "SUB", "dp_rank": dp_rank, "messages": messages})
        for start in replays:
            dealer = ctx.socket(zmq.DEALER)
            dealer.connect(f"tcp://127.0.0.1:{replay_port}")
            request_frames = [b"", start.to_bytes(8, "big")]
            dealer.send_multipart(request_frames)
            replies = []
            while dealer.poll(5000):
                frames = dealer.recv_multipart()
                end = frames[1:] == [b"", ZmqEventPublisher.END_SEQ, b""]
                seq = int.from_bytes(frames[2], "big")
                replies.append({"frames": [f.hex() for f in frames], "expected": {"end": True} if end else expect(seq)})
                if end:
                    break
            dealer.close(linger=0)
            assert replies and replies[-1]["expected"] == {"end": True}, f"{name}: no replay end marker"
            assert len(replies) == len(script) - start + 1, (name, start, len(replies))
            streams.append(
                {
                    "name": f"{name}-replay-from-{start}",
                    "form": form,
                    "socket": "DEALER",
                    "dp_rank": dp_rank,
                    "replay_request": [f.hex() for f in request_frames],
                    "messages": replies,
                }
            )
        publisher.shutdown()

    capture("map-dp0", "map", 0, "", script_a, (0, 4))
    capture("map-dp1", "map", 1, MODEL_TOPIC, script_b, (0,))
    capture("array-dp0", "array", 0, "", script_old, (1,))

    # A <=0.23 batch whose rank was never filled in (encoded as nil; see SOURCE).
    batch, rehashes = script_old[0]
    bare = OldEventBatch(ts=batch.ts, events=batch.events)
    exp = _expected_batch(bare, None)
    for event, rh in zip(exp["events"], rehashes, strict=True):
        event["rehash"] = rh
    frames = [b"", (0).to_bytes(8, "big"), msgspec.msgpack.encode(bare)]
    streams.append(
        {
            "name": "array-nil-dp-rank",
            "form": "array",
            "socket": "none",
            "dp_rank": None,
            "messages": [
                {"frames": [f.hex() for f in frames], "expected": {"end": False, "topic": "", "seq": 0, "batch": exp}}
            ],
        }
    )
    out_path.write_text(json.dumps({"vllm_version": vllm.__version__, "streams": streams}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--venv", type=Path, help="vLLM venv to create or reuse (e.g. /tmp/vllm-venv)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--worker", type=Path, metavar="OUT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(args.worker)
        return
    if args.venv is None:
        parser.error("--venv is required")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _venv import ensure_venv, package_versions
    from generate import dump_json

    python = ensure_venv(args.venv)
    tmp = args.out.with_suffix(".tmp")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}  # vLLM's default sha256 seed
    subprocess.run([str(python), str(Path(__file__).resolve()), "--worker", str(tmp)], check=True, env=env)
    result = json.loads(tmp.read_text())
    tmp.unlink()
    doc = {
        "source": SOURCE,
        "generator": "scripts/vllm_golden/capture_events.py",
        "vllm_version": result["vllm_version"],
        "packages": package_versions(python, ("vllm", "pyzmq", "msgspec")),
        "rehash_note": (
            "An event's 'rehash' gives the prompt whose vLLM block hashes (algo/seed/block_size/lora) the event "
            "published, starting at block 'first_block'; null when the event carries no recomputable hashes."
        ),
        "streams": result["streams"],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(dump_json(doc))
    counts = {s["name"]: len(s["messages"]) for s in doc["streams"]}
    print(f"wrote {args.out}: {counts}", file=sys.stderr)


if __name__ == "__main__":
    main()
