"""Measures the route-time cost of asking the global tier (LMCache controller, Mooncake store) about a prompt.

Starts the real peers on loopback the way the integration tests do (tests/integrations/), stores a whole
prompt of ``--tokens`` tokens in each, and times, per call (µs; p50/p90/p99 over ``--repeat`` calls):

* ``route()`` alone (the decision budget everything else is compared with);
* LMCache: smetric's HTTP ``POST /lookup`` client, smetric's in-process ``lookup_in_process`` on an
  embedded ``LMCacheControllerManager`` (in the LMCache venv), :func:`chunk_keys` (what mirroring the
  controller's ADMIT/EVICT would cost per routed prompt), and the whole feed (lookup + record + route);
* Mooncake: vLLM block hashes, key strings, one ``batch_is_exist``, and the whole feed.

    .venv/bin/python scripts/integrations/measure_global_tier.py --tokens 32768 --repeat 200
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from smetric import DEFAULT_BLOCK_SIZE, Router, RouterConfig
from smetric import vllm as vllm_hashes
from smetric.integrations import lmcache, mooncake
from smetric.integrations._global_tier import record_prefix

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts" / "vllm_cpu"))
from fleet import free_port  # noqa: E402  (the one loopback port picker)

PEER = ROOT / "tests" / "integrations" / "lmcache_peer.py"
OFFLINE = {**os.environ, "LMCACHE_TRACK_USAGE": "false", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1"}


def timed(fn: Callable[[], Any], repeat: int) -> list[float]:
    fn()  # warm-up
    out = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        out.append((time.perf_counter() - start) * 1e6)
    return out


def row(name: str, us: list[float]) -> None:
    q = statistics.quantiles(us, n=100)
    print(f"{name:<52} p50 {q[49]:>9.1f}  p90 {q[89]:>9.1f}  p99 {q[98]:>9.1f} µs", flush=True)


def peer_call(proc: subprocess.Popen[str], **cmd: Any) -> dict[str, Any]:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(json.dumps(cmd) + "\n")
    proc.stdin.flush()
    doc: dict[str, Any] = json.loads(proc.stdout.readline())
    return doc


def measure_lmcache(python: str, tokens: npt.NDArray[np.int32], repeat: int) -> None:
    http, pull, reply = free_port(), free_port(), free_port()
    ports = json.dumps({"pull": pull, "reply": reply})
    ctl = subprocess.Popen(
        [
            str(Path(python).parent / "lmcache_controller"),
            "--host=127.0.0.1",
            f"--port={http}",
            f"--monitor-ports={ports}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=OFFLINE,
    )
    peer = subprocess.Popen(
        [
            python,
            str(PEER),
            f"--pull=127.0.0.1:{pull}",
            f"--reply=127.0.0.1:{reply}",
            f"--smetric-path={ROOT / 'python'}",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=OFFLINE,
    )
    try:
        assert peer.stdout is not None and json.loads(peer.stdout.readline()) == {"ready": True}
        url = f"http://127.0.0.1:{http}"
        for _ in range(600):
            try:
                urllib.request.urlopen(f"{url}/health", timeout=1).close()
                break
            except urllib.error.HTTPError:
                break
            except OSError:
                time.sleep(0.2)
        peer_call(peer, op="register", instance="inst-A", worker=0, ip="127.0.0.1", port=free_port())
        as_list = tokens.tolist()
        peer_call(peer, op="admit", instance="inst-A", worker=0, location="LocalCPUBackend", tokens=as_list)
        client = lmcache.ControllerClient(url, timeout=10)
        while client.lookup(tokens).prefix_tokens < len(tokens) // 256 * 256:
            time.sleep(0.05)
        row("lmcache: HTTP POST /lookup (smetric client)", timed(lambda: client.lookup(tokens), repeat))
        inproc = peer_call(
            peer, op="lookup_in_process", tokens=as_list, repeat=repeat, pull_port=free_port(), worker_port=free_port()
        )
        row("lmcache: in-process lookup_in_process (LookupMsg)", inproc["us"][1:])
        row("lmcache: chunk_keys (option b's per-prompt hashing)", timed(lambda: lmcache.chunk_keys(tokens), repeat))
        mirror = Router(
            [f"i{k}" for k in range(16)], block_size=DEFAULT_BLOCK_SIZE, config=RouterConfig(index_mode="exact")
        )
        key_map: dict[int, tuple[int | None, list[int]]] = {}
        row(
            "lmcache: (b) remember a prompt (keys + hashes + map)",
            timed(lambda: _remember(mirror, tokens, key_map), repeat),
        )
        admits = lmcache.chunk_keys(tokens, full_chunks_only=True)
        row(
            f"lmcache: (b) apply {len(admits)} ADMITs to the router",
            timed(lambda: _admit(mirror, admits, key_map), repeat),
        )
        router = Router(
            [f"i{k}" for k in range(16)], block_size=DEFAULT_BLOCK_SIZE, config=RouterConfig(index_mode="exact")
        )
        feed = lmcache.GlobalTierFeed(router, client.lookup)
        assert feed.route(tokens, turn=1).global_hit_tokens == len(tokens) - 1
        row("lmcache: feed.route (HTTP lookup + record + route)", timed(lambda: feed.route(tokens, turn=1), repeat))
        client.close()
    finally:
        assert peer.stdin is not None
        peer.stdin.close()
        peer.wait(timeout=30)
        ctl.terminate()
        ctl.wait(timeout=30)


def measure_mooncake(tokens: npt.NDArray[np.int32], repeat: int) -> None:
    from mooncake.store import MooncakeDistributedStore

    master_bin = shutil.which("mooncake_master", path=str(Path(sys.executable).parent))
    assert master_bin, "mooncake_master not found"
    rpc, http, metrics = free_port(), free_port(), free_port()
    master = subprocess.Popen(
        [
            master_bin,
            f"-rpc_port={rpc}",
            "-rpc_address=127.0.0.1",
            "-enable_http_metadata_server=true",
            "-http_metadata_server_host=127.0.0.1",
            f"-http_metadata_server_port={http}",
            f"-metrics_port={metrics}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    store = MooncakeDistributedStore()
    try:
        for _ in range(100):
            rc = store.setup(
                "127.0.0.1", f"http://127.0.0.1:{http}/metadata", 256 << 20, 16 << 20, "tcp", "", f"127.0.0.1:{rpc}"
            )
            if rc == 0:
                break
            time.sleep(0.3)
        space = mooncake.KeySpace("Qwen3-8B")
        digests = vllm_hashes.block_hashes(tokens.tolist())
        keys = mooncake.pool_keys(space, digests)
        for key in keys:
            store.put(key, b"x")
        probe = mooncake.StoreProbe(store, space)
        assert probe.hit_blocks(tokens) == len(digests)
        row("mooncake: vLLM sha256 block hashes (Rust)", timed(lambda: probe.digests(tokens), repeat))
        row("mooncake: key strings", timed(lambda: mooncake.pool_keys(space, digests), repeat))
        row(f"mooncake: batch_is_exist({len(keys)} keys)", timed(lambda: store.batch_is_exist(keys), repeat))
        router = Router(
            [f"i{k}" for k in range(16)], block_size=DEFAULT_BLOCK_SIZE, config=RouterConfig(index_mode="exact")
        )
        feed = mooncake.GlobalTierFeed(router, probe)
        row("mooncake: feed.route (probe + record + route)", timed(lambda: feed.route(tokens, turn=1), repeat))
    finally:
        store.close()
        master.terminate()
        master.wait(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=32_768)
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--lmcache-python", default=str(ROOT / ".venv-lmcache" / "bin" / "python"))
    parser.add_argument("--skip", choices=["lmcache", "mooncake"], action="append", default=[])
    args = parser.parse_args()
    # A proxy holds the prompt as a token buffer (an int32 array): the router reads it without conversion.
    tokens = np.array([(i * 2_654_435_761) % 151_000 for i in range(args.tokens)], dtype=np.int32)
    router = Router([f"i{k}" for k in range(16)], block_size=DEFAULT_BLOCK_SIZE)
    row(f"route() alone, {args.tokens} tokens, 16 instances", timed(lambda: router.route(tokens, turn=1), args.repeat))
    row("record_prefix (hash + store + remove, half held)", timed(lambda: _record(router, tokens), args.repeat))
    if "lmcache" not in args.skip:
        measure_lmcache(args.lmcache_python, tokens, args.repeat)
    if "mooncake" not in args.skip:
        measure_mooncake(tokens, args.repeat)


def _remember(router: Router, tokens: npt.NDArray[np.int32], key_map: dict[int, tuple[int | None, list[int]]]) -> None:
    """Option (b)'s bookkeeping per routed prompt: LMCache chunk key → (parent block, the chunk's router blocks)."""
    keys = lmcache.chunk_keys(tokens, full_chunks_only=True)
    hashes = router.hash_tokens(tokens)
    per_chunk = 256 // router.block_size
    for i, key in enumerate(keys):
        key_map[key] = (hashes[i * per_chunk - 1] if i else None, hashes[i * per_chunk : (i + 1) * per_chunk])


def _admit(router: Router, keys: list[int], key_map: dict[int, tuple[int | None, list[int]]]) -> None:
    for key in keys:
        parent, blocks = key_map[key]
        router.store_blocks(None, blocks, tier="global", parent=parent)


def _record(router: Router, tokens: npt.NDArray[np.int32]) -> None:
    record_prefix(router, tokens, len(tokens) // 2)


if __name__ == "__main__":
    main()
