"""A stand-in LMCache worker, built from lmcache 0.5.6's own classes, for tests/integrations/test_lmcache.py.

Runs under the Python that has lmcache (``.venv-lmcache``, scripts/integrations/lmcache_venv.sh), never
under the dev venv. It speaks to a real ``lmcache_controller`` exactly as an LMCache engine's worker does:
``RegisterMsg`` over a DEALER to the controller's reply (ROUTER) socket, then ``BatchedKVOperationMsg``
with ``KVOpEvent(ADMIT|EVICT)`` over a PUSH to its pull socket, msgpack-encoded by msgspec. The chunk keys
come from LMCache's own ``ChunkedTokenDatabase`` (the controller's hashing: builtin ``hash``, 256-token
chunks), so the test can compare them with smetric's byte for byte.

Commands are JSON lines on stdin, one JSON reply line each on stdout:

* ``{"op": "keys", "tokens": [...], "chunk_size": 256, "full_chunks_only": false}`` → ``{"keys": [...]}``
* ``{"op": "register", "instance": "inst-A", "worker": 0, "ip": "127.0.0.1", "port": 1}`` → ``{"ok": true}``
* ``{"op": "admit" | "evict", "instance", "worker", "location", "tokens", "chunk_size"}`` → ``{"keys": [...]}``
  (full chunks only, as an engine stores them; pushed in one batch); with ``"keys": [...]`` instead of
  ``"tokens"``, those keys are pushed as given
* ``{"op": "lookup_in_process", "tokens": [...], "repeat": 200, "pull_port", "worker_port"}`` → smetric's
  ``lookup_in_process`` on a ``LMCacheControllerManager`` this peer embeds, after admitting the prompt's full
  chunks on ``inst-A``: ``{"us": [per-call µs], "holders": [[instance, location, end], ...],
  "router_global_hit_tokens": n}`` (a router fed with the answer by ``GlobalTierFeed.record``). Needs
  ``--smetric-path`` (the repo's ``python/`` with the built abi3 extension), since smetric is not installed here.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

import msgspec
import zmq
from lmcache.v1.cache_controller.controller_manager import LMCacheControllerManager
from lmcache.v1.cache_controller.message import (
    BatchedKVOperationMsg,
    KVOpEvent,
    Msg,
    OpType,
    RegisterMsg,
)
from lmcache.v1.token_database import ChunkedTokenDatabase


def _keys(tokens: list[int], chunk_size: int, full_chunks_only: bool) -> list[int]:
    db = ChunkedTokenDatabase()
    db.chunk_size = chunk_size
    if full_chunks_only:
        tokens = tokens[: len(tokens) - len(tokens) % chunk_size]
    return [key for _, _, key in db.process_tokens(tokens, make_key=False)]


class Peer:
    def __init__(self, pull: str, reply: str) -> None:
        self.context = zmq.Context()
        self.push = self.context.socket(zmq.PUSH)
        self.push.connect(f"tcp://{pull}")
        self.dealer = self.context.socket(zmq.DEALER)
        self.dealer.setsockopt(zmq.RCVTIMEO, 10_000)
        self.dealer.connect(f"tcp://{reply}")
        self.seq: dict[tuple[str, int, str], int] = {}

    def register(self, cmd: dict[str, Any]) -> dict[str, Any]:
        msg = RegisterMsg(
            instance_id=cmd["instance"], worker_id=cmd["worker"], ip=cmd["ip"], port=cmd["port"], peer_init_url=None
        )
        self.dealer.send_multipart([b"", msgspec.msgpack.encode(msg)])
        reply = msgspec.msgpack.decode(self.dealer.recv_multipart()[-1], type=Msg)
        return {"ok": True, "reply": type(reply).__name__}

    def operate(self, cmd: dict[str, Any], op: OpType) -> dict[str, Any]:
        # Explicit "keys" (computed by smetric) go to the controller as they are; else LMCache's own.
        keys = cmd["keys"] if "keys" in cmd else _keys(cmd["tokens"], cmd.get("chunk_size", 256), full_chunks_only=True)
        stream = (cmd["instance"], cmd["worker"], cmd["location"])
        events = []
        for key in keys:
            seq = self.seq.get(stream, 0)
            self.seq[stream] = seq + 1
            events.append(KVOpEvent(op_type=op, key=key, seq_num=seq))
        msg = BatchedKVOperationMsg(
            instance_id=cmd["instance"], worker_id=cmd["worker"], location=cmd["location"], operations=events
        )
        self.push.send(msgspec.msgpack.encode(msg))
        return {"keys": keys}


async def _lookup_in_process(cmd: dict[str, Any]) -> dict[str, Any]:
    """Latency of the in-process lookup an embedding router would make (production-stack's kvaware)."""
    manager = LMCacheControllerManager(
        {"pull": f"127.0.0.1:{cmd['pull_port']}", "reply": None, "heartbeat": None},
        health_check_interval=-1,
        lmcache_worker_timeout=300,
    )
    tokens: list[int] = cmd["tokens"]
    keys = _keys(tokens, 256, full_chunks_only=True)
    await manager.reg_controller.register(
        RegisterMsg(instance_id="inst-A", worker_id=0, ip="127.0.0.1", port=cmd["worker_port"], peer_init_url=None)
    )
    ops = [KVOpEvent(op_type=OpType.ADMIT, key=k, seq_num=i) for i, k in enumerate(keys)]
    await manager.kv_controller.handle_batched_kv_operations(
        BatchedKVOperationMsg(instance_id="inst-A", worker_id=0, location="LocalCPUBackend", operations=ops)
    )
    from smetric import Router, RouterConfig
    from smetric.integrations.lmcache import GlobalTierFeed, lookup_in_process

    samples = []
    found: Any = None
    for i in range(cmd.get("repeat", 200)):
        start = time.perf_counter()
        found = await lookup_in_process(manager, tokens, event_id=str(i))
        samples.append((time.perf_counter() - start) * 1e6)
    router = Router(["a"], block_size=16, config=RouterConfig(index_mode="exact"))
    GlobalTierFeed(router).record(tokens, found)  # the asynchronous caller's pattern
    return {
        "us": samples,
        "holders": [[h.instance_id, h.location, h.end] for h in found.holders],
        "router_global_hit_tokens": router.query(tokens).global_hit_tokens,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pull", help="host:port of the controller's pull socket")
    parser.add_argument("--reply", help="host:port of the controller's reply socket")
    parser.add_argument("--smetric-path", help="a directory to import smetric from")
    args = parser.parse_args()
    if args.smetric_path:
        sys.path.insert(0, args.smetric_path)
    peer = Peer(args.pull, args.reply) if args.pull else None
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        if op == "keys":
            out: dict[str, Any] = {
                "keys": _keys(cmd["tokens"], cmd.get("chunk_size", 256), cmd.get("full_chunks_only", False))
            }
        elif op == "lookup_in_process":
            out = asyncio.run(_lookup_in_process(cmd))
        elif peer is None:
            out = {"error": "no controller given (--pull/--reply)"}
        elif op == "register":
            out = peer.register(cmd)
        elif op in ("admit", "evict"):
            out = peer.operate(cmd, OpType.ADMIT if op == "admit" else OpType.EVICT)
        else:
            out = {"error": f"unknown op {op!r}"}
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
