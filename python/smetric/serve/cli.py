"""The ``smetric serve`` subcommand: flags on top of an optional TOML/YAML file
(:func:`smetric.serve.config.load_config`). The proxy's modules are imported only when the
command runs, so ``smetric --help`` needs no extra. May import: :mod:`.config` and :mod:`.proxy`
(lazily, in the command)."""

from __future__ import annotations

import argparse
import ctypes
import logging
import sys
from typing import Any

from smetric._core import DEFAULT_BLOCK_SIZE


def register(sub: Any) -> None:
    """Adds ``serve`` to the ``smetric`` command's subparsers."""
    p: argparse.ArgumentParser = sub.add_parser(
        "serve", help="run the OpenAI-compatible routing proxy in front of vLLM instances"
    )
    p.add_argument("--config", default=None, help="a TOML or YAML file (docs/serve.md); flags override it")
    p.add_argument("--host", default=None, help="listen address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=None, help="listen port (default 8080; 0: any free port)")
    p.add_argument("--instance", action="append", default=None, metavar="URL", help="a vLLM base URL (repeat for each)")
    p.add_argument("--prefill", action="append", default=None, metavar="URL", help="PD mode: a prefill instance")
    p.add_argument("--decode", action="append", default=None, metavar="URL", help="PD mode: a decode instance")
    p.add_argument("--decode-rule", default=None, help="PD mode: the decode-side rule (smetric.DECODE_RULES)")
    p.add_argument(
        "--kv-events",
        default="discover",
        help="for --instance URLs: discover (GET /kv_event_sources, the default) or off",
    )
    p.add_argument("--policy", default=None, help="a routing policy (default smetric)")
    p.add_argument("--block-size", type=int, default=None, help=f"vLLM's --block-size (default {DEFAULT_BLOCK_SIZE})")
    p.add_argument("--tokens", default=None, choices=["auto", "ids", "tokenizer", "approximate"], help="token mode")
    p.add_argument("--tokenizer", default=None, help="a tokenizer.json (its tokenizer_config.json beside it)")
    p.add_argument("--chat-template", default=None, help="a jinja chat template file")
    p.add_argument("--max-attempts", type=int, default=None)
    p.add_argument("--eject-after", type=int, default=None)
    p.add_argument("--admin-token", default=None, help="enables /admin/instances for this bearer token")
    p.add_argument("--max-in-flight", type=int, default=None, help="admitted requests across the fleet (4096)")
    p.add_argument(
        "--max-in-flight-per-instance", type=int, default=None, help="admitted requests per live instance (256)"
    )
    p.add_argument("--queue-size", type=int, default=None, help="requests that may wait for a slot (1024)")
    p.add_argument("--queue-timeout", type=float, default=None, help="seconds a request may wait for a slot (30)")
    p.add_argument(
        "--session-admission",
        choices=("off", "pause", "smetric"),
        default=None,
        help="hold or move a session's request when its instance cannot keep its sessions' KV (off)",
    )
    p.add_argument(
        "--session-capacity-tokens",
        type=int,
        default=None,
        help="one instance's KV capacity for session admission (default: what the engines publish)",
    )
    p.add_argument("--session-max-held", type=int, default=None, help="requests that may wait for KV room (256)")
    p.add_argument(
        "--session-hold-timeout", type=float, default=None, help="seconds a request may wait for KV room (30)"
    )
    p.add_argument(
        "--session-max-hold",
        type=float,
        default=None,
        help="seconds a request is held before it is admitted where its policy sent it, room or not "
        "(default: the mode's own; pause holds until the timeout)",
    )
    p.add_argument(
        "--parent-affinity-margin",
        type=int,
        default=None,
        help="a sub-agent's first request starts at its parent's instance when that is at most this many "
        "requests busier than the least busy one (4)",
    )
    p.add_argument("--no-parent-affinity", action="store_true", help="place sub-agents as any first request")
    p.add_argument(
        "--api-key", action="append", default=None, help="a client key the proxy accepts (repeat; none: open)"
    )
    p.add_argument("--api-keys-file", default=None, help="a file of client keys, one a line")
    p.add_argument("--upstream-api-key", default=None, help="the key the proxy sends to the engines (vLLM --api-key)")
    p.add_argument(
        "--response-id-key",
        default=None,
        help="the key of stored responses' ids, the same on every replica (at least 16 bytes; "
        "default: $SMETRIC_RESPONSE_ID_KEY, else the file's, else random per process)",
    )
    p.add_argument(
        "--replica-bus",
        default=None,
        help="a NATS server (nats://HOST:PORT) the replicas in front of one fleet share their in-flight work over "
        "(default: $SMETRIC_REPLICA_BUS, else the file's, else off)",
    )
    p.add_argument("--decision-log", default=None, help="append one JSON line per request to this file")
    p.add_argument("--no-engine-load", action="store_true", help="do not scrape the instances' /metrics")
    p.add_argument("--log-level", default="INFO")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from smetric.errors import SmetricError
    from smetric.serve.config import InstanceConfig, load_config
    from smetric.serve.proxy import run, run_forever

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    tokens = {
        k: v
        for k, v in (("mode", args.tokens), ("tokenizer", args.tokenizer), ("chat_template", args.chat_template))
        if v is not None
    }
    try:
        overrides: dict[str, Any] = {
            "host": args.host,
            "port": args.port,
            "policy": args.policy,
            "block_size": args.block_size,
            "max_attempts": args.max_attempts,
            "eject_after": args.eject_after,
            "admin_token": args.admin_token,
            "engine_load": False if args.no_engine_load else None,
            "max_in_flight": args.max_in_flight,
            "max_in_flight_per_instance": args.max_in_flight_per_instance,
            "queue_size": args.queue_size,
            "queue_timeout_s": args.queue_timeout,
            "parent_affinity_margin": args.parent_affinity_margin,
            "session_admission": args.session_admission,
            "session_capacity_tokens": args.session_capacity_tokens,
            "session_max_held": args.session_max_held,
            "session_hold_timeout_s": args.session_hold_timeout,
            "session_max_hold_s": args.session_max_hold,
            "parent_affinity": False if args.no_parent_affinity else None,
            "api_keys": args.api_key,
            "api_keys_file": args.api_keys_file,
            "upstream_api_key": args.upstream_api_key,
            "decision_log": args.decision_log,
            "response_id_key": args.response_id_key,
            "replica_bus": args.replica_bus,
        }
        for flag, key in ((args.instance, "instances"), (args.prefill, "prefill"), (args.decode, "decode")):
            if flag:
                overrides[key] = [InstanceConfig(url=u, kv_events=args.kv_events) for u in flag]
        if args.prefill or args.decode:
            overrides.setdefault("instances", [])
        overrides["decode_rule"] = args.decode_rule
        config = load_config(args.config, **overrides)
        if tokens:
            import dataclasses

            config = dataclasses.replace(config, tokens=dataclasses.replace(config.tokens, **tokens))
    except (SmetricError, OSError) as e:
        print(f"smetric serve: {e}", file=sys.stderr)
        return 2
    keep_freed_heap()
    run_forever(run(config))
    return 0


_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
"""glibc's ``mallopt`` parameters (``malloc.h``)."""


def keep_freed_heap(mmap_threshold: int = 8 << 20, trim_threshold: int = 64 << 20) -> bool:
    """Keeps the memory one request frees for the next (glibc's malloc; elsewhere it does
    nothing and returns False): allocations below ``mmap_threshold`` come from the heap, and
    the heap's free top goes back to the OS only past ``trim_threshold``.

    Why: a request of 32K token ids allocates several 128–220 KB buffers (the body as aiohttp
    reads it, the parsed ids) and frees them at its end. glibc's thresholds are dynamic (raised
    by the largest ``mmap``-ed block freed so far), so whether that memory was kept or handed
    back — to be faulted in again, page by page, by the next request — depended on the heap's
    history: the same tree measured 0 to 75 minor page faults a request from run to run, and
    ``brk`` calls on most requests (BENCHMARKS.md, "The proxy after the agent-gateway work").
    Fixed thresholds: none. The price: up to ``trim_threshold`` of freed heap stays mapped.
    Process-wide, so the command calls it, not :func:`smetric.serve.proxy.run` (which may be
    embedded)."""
    libc = ctypes.CDLL(None)
    if not hasattr(libc, "gnu_get_libc_version"):
        return False
    mallopt = libc.mallopt
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # mallopt returns 1 on success.
    done: list[int] = [mallopt(_M_MMAP_THRESHOLD, mmap_threshold), mallopt(_M_TRIM_THRESHOLD, trim_threshold)]
    return done == [1, 1]
