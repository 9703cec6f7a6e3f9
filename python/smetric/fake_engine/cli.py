"""The ``smetric fake-engine`` subcommand. Its flags are :class:`FakeEngineConfig`'s fields; the
server's modules are imported only when the command runs, so ``smetric --help`` needs no extra."""

from __future__ import annotations

import argparse
from typing import Any

from smetric._core import DEFAULT_BLOCK_SIZE


def register(sub: Any) -> None:
    """Adds ``fake-engine`` to the ``smetric`` command's subparsers."""
    p: argparse.ArgumentParser = sub.add_parser(
        "fake-engine", help="run an OpenAI-compatible test double of a vLLM instance (KV events, /metrics)"
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="HTTP port (0: ephemeral)")
    p.add_argument("--model", default="fake-model", help="the served model name")
    p.add_argument("--block-size", type=int, default=DEFAULT_BLOCK_SIZE)
    p.add_argument(
        "--prefix-caching-hash-algo", default="sha256", choices=["sha256", "sha256_cbor", "xxhash", "xxhash_cbor"]
    )
    p.add_argument("--hash-seed", default=None, help="vLLM's PYTHONHASHSEED (required by the xxhash algorithms)")
    p.add_argument("--num-gpu-blocks", type=int, default=4096, help="prefix-cache capacity in blocks")
    p.add_argument(
        "--kv-offloading-blocks",
        type=int,
        default=0,
        help="host-memory KV cache in blocks, as vLLM's --kv-offloading-size (0: none): CPU-medium events",
    )
    p.add_argument("--speedup", type=float, default=100.0, help="run the H20 performance model this many times faster")
    p.add_argument("--profile", default="h20-qwen3-coder-30b-a3b", help="a built-in performance-model profile")
    p.add_argument("--max-model-len", type=int, default=32768)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--kv-events-port", type=int, default=None, help="ZMQ PUB port for KV events (0: ephemeral)")
    p.add_argument("--kv-replay-port", type=int, default=None, help="ZMQ ROUTER port for replay (0: ephemeral)")
    p.add_argument("--kv-events-host", default="127.0.0.1", help="address the ZMQ sockets bind")
    p.add_argument("--tokenizer", default=None, help="a tokenizer.json (default: 4-byte UTF-8 chunks)")
    p.add_argument(
        "--role", default="both", choices=["both", "prefill", "decode"], help="vLLM disaggregated prefill role"
    )
    p.add_argument(
        "--kv-peers",
        default=None,
        type=lambda v: tuple(x for x in v.split(",") if x),
        help="decode role: host:port,... of the prefill engines it may pull from (default: any)",
    )
    p.add_argument("--kv-lease-s", type=float, default=30.0, help="prefill role: how long held KV waits for a pull")
    p.add_argument("--api-key", default=None, help="as vLLM's: the /v1 paths need Authorization: Bearer <key>")
    p.add_argument(
        "--lora-modules",
        nargs="+",
        default=(),
        type=str,
        metavar="NAME=PATH",
        help="LoRA adapters served beside the model (a request naming one is cached under it)",
    )
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from smetric.fake_engine import FakeEngineConfig, serve

    fields = FakeEngineConfig.__dataclass_fields__
    values = {k: v for k, v in vars(args).items() if k in fields}
    values["lora_modules"] = tuple(values.get("lora_modules", ()))
    serve(FakeEngineConfig(**values))
    return 0
