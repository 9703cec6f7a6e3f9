"""Real peer: a Mooncake store (``mooncake-transfer-engine-non-cuda`` 0.3.13.post1) probed as the global tier.

A real ``mooncake_master`` runs on loopback with its HTTP metadata server; a real
``MooncakeDistributedStore`` client (TCP transport) puts values under the keys vLLM 0.33's Mooncake
store connector writes (``PoolKey``: the key format is pinned against a literal copy of vLLM's format
below), and smetric's probe must find exactly those blocks, prefix-ordered, and feed the router's
global tier. CI installs the package and the RDMA/NUMA libraries it links
(scripts/integrations/mooncake_deps.sh); elsewhere the module skips and says what is missing.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from smetric import Router, RouterConfig
from smetric import vllm as vllm_hashes
from smetric.integrations.mooncake import GlobalTierFeed, KeySpace, StoreProbe, pool_keys

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts" / "vllm_cpu"))
from fleet import free_port

WHY_NOT = ""
try:
    from mooncake.store import MooncakeDistributedStore
except ImportError as e:  # the package, or a library its extension links (libibverbs, librdmacm, libnuma)
    WHY_NOT = f"mooncake.store is not importable ({e}); run scripts/integrations/mooncake_deps.sh"

MASTER = shutil.which("mooncake_master", path=str(Path(sys.executable).parent)) or shutil.which("mooncake_master")
if MASTER is None and not WHY_NOT:
    WHY_NOT = "the mooncake_master binary is not installed (scripts/integrations/mooncake_deps.sh)"

BLOCK = 16
MODEL = "/models/Qwen/Qwen3-8B/"  # vLLM keys use the last path component


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    if WHY_NOT:
        pytest.skip(WHY_NOT)
    rpc, http, metrics = free_port(), free_port(), free_port()
    log = tmp_path_factory.mktemp("mooncake") / "master.log"
    with log.open("w") as out:
        master = subprocess.Popen(
            [
                str(MASTER),
                f"-rpc_port={rpc}",
                "-rpc_address=127.0.0.1",
                "-enable_http_metadata_server=true",
                "-http_metadata_server_host=127.0.0.1",
                f"-http_metadata_server_port={http}",
                f"-metrics_port={metrics}",
                "-default_kv_lease_ttl=50",  # so that remove() is not refused while a put's lease runs
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    client = MooncakeDistributedStore()
    try:
        deadline = time.monotonic() + 30
        while True:
            rc = client.setup(
                "127.0.0.1", f"http://127.0.0.1:{http}/metadata", 64 << 20, 16 << 20, "tcp", "", f"127.0.0.1:{rpc}"
            )
            if rc == 0:
                break
            assert master.poll() is None, f"mooncake_master exited: {log.read_text()[-2000:]}"
            assert time.monotonic() < deadline, f"store setup failed ({rc}): {log.read_text()[-2000:]}"
            time.sleep(0.3)
        yield client
    finally:
        client.close()
        master.terminate()
        master.wait(timeout=10)


def _put_blocks(store: Any, keys: list[str]) -> None:
    for key in keys:
        assert store.put(key, b"kv" * 64) == 0, key


def _remove(store: Any, keys: list[str]) -> None:
    deadline = time.monotonic() + 5
    for key in keys:
        while store.remove(key) != 0:
            assert time.monotonic() < deadline, f"remove({key}) kept failing"
            time.sleep(0.05)


def test_keys_have_vllm_pool_key_format() -> None:
    # vLLM 0.33 data.py: PoolKey.build_prefix + build_key_string (format copied by hand, Apache-2.0, vLLM authors).
    digest = vllm_hashes.block_hashes(list(range(1000, 1016)))[0]
    hex_ = digest.hex()
    assert hex_.startswith("9d9c413731095d0e")  # vLLM 0.33's golden digest (sha256, default seed)
    assert pool_keys(KeySpace(MODEL), [digest]) == [f"Qwen3-8B@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@{hex_}"]
    space = KeySpace("Qwen3-8B", tp_size=2, pp_size=2, cache_prefix="prod")
    assert pool_keys(space, [digest]) == [
        f"prod@Qwen3-8B@tp_rank:{t}@pcp0@dcp0@pp_rank:{p}@group:0@{hex_}" for t in range(2) for p in range(2)
    ]


def test_probe_finds_exactly_the_stored_prefix(store: Any) -> None:
    space = KeySpace(MODEL, cache_prefix="t1")
    probe = StoreProbe(store, space, block_size=BLOCK)
    tokens = list(range(5000, 5000 + 8 * BLOCK + 5))  # 8 full blocks and a partial one
    digests = vllm_hashes.block_hashes(tokens, block_size=BLOCK)
    assert len(digests) == 8
    assert probe.hit_blocks(tokens) == 0
    _put_blocks(store, pool_keys(space, digests[:5]))
    assert probe.hit_blocks(tokens) == 5
    assert probe.hit_tokens(tokens) == 5 * BLOCK
    # Blocks past a missing one do not count: a prefix cache cannot load them.
    _put_blocks(store, pool_keys(space, digests[6:8]))
    assert probe.hit_blocks(tokens) == 5
    # Another prompt sharing 3 blocks hits those 3 only; a salted one hits nothing.
    other = tokens[: 3 * BLOCK] + list(range(9000, 9000 + 4 * BLOCK))
    assert probe.hit_blocks(other) == 3
    assert probe.hit_blocks(tokens, cache_salt="s") == 0
    # The same blocks under another deployment's key prefix are invisible.
    assert StoreProbe(store, KeySpace(MODEL, cache_prefix="t2"), block_size=BLOCK).hit_blocks(tokens) == 0


def test_probe_needs_every_rank_namespace(store: Any) -> None:
    space = KeySpace(MODEL, tp_size=2, cache_prefix="t3")
    probe = StoreProbe(store, space, block_size=BLOCK)
    tokens = list(range(7000, 7000 + 4 * BLOCK))
    digests = vllm_hashes.block_hashes(tokens, block_size=BLOCK)
    keys = pool_keys(space, digests)  # block-major: rank 0 and rank 1 of block 0, then block 1, ...
    _put_blocks(store, keys[:5])  # blocks 0 and 1 on both ranks, block 2 on rank 0 only
    assert probe.hit_blocks(tokens) == 2
    _put_blocks(store, keys[5:6])
    assert probe.hit_blocks(tokens) == 3


def test_feed_records_the_store_prefix_into_the_global_tier(store: Any) -> None:
    space = KeySpace(MODEL, cache_prefix="t4")
    # Exact mode: only the feed writes the index (approximate mode would also record every routed prompt).
    router = Router(["a", "b"], block_size=BLOCK, config=RouterConfig(index_mode="exact"))
    feed = GlobalTierFeed(router, StoreProbe(store, space, block_size=BLOCK))
    tokens = list(range(20_000, 20_000 + 10 * BLOCK))
    digests = vllm_hashes.block_hashes(tokens, block_size=BLOCK)
    keys = pool_keys(space, digests)
    assert router.query(tokens).global_hit_tokens == 0
    _put_blocks(store, keys[:7])
    decision = feed.route(tokens, turn=1)
    assert feed.last_hit_tokens == 7 * BLOCK
    assert decision.global_hit_tokens == 7 * BLOCK
    assert router.query(tokens).global_hit_tokens == 7 * BLOCK
    # The store lost blocks 4..6 (evicted): the next probe of that prompt shrinks the router's tier too.
    _remove(store, keys[4:7])
    assert feed.probe.hit_blocks(tokens) == 4
    feed.refresh(tokens)
    assert router.query(tokens).global_hit_tokens == 4 * BLOCK
    # A router with another block size maps the store's hit through tokens (64 tokens = 2 blocks of 32).
    coarse = Router(["a"], block_size=32, config=RouterConfig(index_mode="exact"))
    GlobalTierFeed(coarse, feed.probe).refresh(tokens)
    assert coarse.query(tokens).global_hit_tokens == 4 * BLOCK
