"""Real peer: the LMCache 0.5.6 controller (``lmcache_controller``, its HTTP API) as the global tier's truth.

lmcache pins packages that clash with the dev venv and imports torch, so it lives in its own venv
(``.venv-lmcache``, scripts/integrations/lmcache_venv.sh, which ``make test`` runs; or the Python named
by ``SMETRIC_LMCACHE_PYTHON``). Two processes run there: the real controller on loopback, and
``lmcache_peer.py``, a worker built from LMCache's own classes that registers instances and pushes
ADMIT/EVICT batches with keys from LMCache's own ``ChunkedTokenDatabase``. This process checks that
smetric's chunk keys equal LMCache's, int for int, and that the lookups smetric makes over HTTP see
exactly what was admitted and evicted, and feed the router's global tier.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from smetric import InvalidArgumentError, Router, RouterConfig
from smetric.integrations.lmcache import ControllerClient, GlobalTierFeed, Holder, Lookup, chunk_keys

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts" / "vllm_cpu"))
from fleet import free_port  # noqa: E402  (the one loopback port picker)

PEER = Path(__file__).with_name("lmcache_peer.py")
# LMCache reports usage to its own server unless told not to; tests reach nothing beyond loopback.
OFFLINE = {**os.environ, "LMCACHE_TRACK_USAGE": "false", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1"}


def _lmcache_python() -> tuple[str | None, str]:
    python = os.environ.get("SMETRIC_LMCACHE_PYTHON") or str(ROOT / ".venv-lmcache" / "bin" / "python")
    if not Path(python).exists():
        return None, f"{python} does not exist (create it with scripts/integrations/lmcache_venv.sh)"
    probe = subprocess.run(
        [python, "-c", "import lmcache.v1.api_server.__main__"],
        capture_output=True,
        text=True,
        timeout=120,
        env=OFFLINE,
    )
    if probe.returncode != 0:
        return None, f"{python} cannot import lmcache's controller: {probe.stderr.strip()[-300:]}"
    return python, ""


LMCACHE_PYTHON, WHY_NOT = _lmcache_python()
needs_lmcache = pytest.mark.skipif(LMCACHE_PYTHON is None, reason=WHY_NOT)


class Peer:
    def __init__(self, args: list[str]) -> None:
        assert LMCACHE_PYTHON is not None
        self.proc = subprocess.Popen(
            [LMCACHE_PYTHON, str(PEER), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=OFFLINE,
        )
        assert self._read(120.0) == {"ready": True}

    def _read(self, timeout: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        assert ready, f"no reply from the LMCache peer in {timeout} s"
        line = self.proc.stdout.readline()
        assert line, f"the LMCache peer exited ({self.proc.poll()})"
        doc: dict[str, Any] = json.loads(line)
        assert "error" not in doc, doc
        return doc

    def __call__(self, op: str, timeout: float = 60.0, **fields: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"op": op, **fields}) + "\n")
        self.proc.stdin.flush()
        return self._read(timeout)

    def close(self) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=30)
        self.proc.stdout.close()


@pytest.fixture(scope="module")
def controller(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Peer]]:
    assert LMCACHE_PYTHON is not None
    http, pull, reply = free_port(), free_port(), free_port()
    log = tmp_path_factory.mktemp("lmcache") / "controller.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [
                str(Path(LMCACHE_PYTHON).parent / "lmcache_controller"),
                "--host=127.0.0.1",
                f"--port={http}",
                f"--monitor-ports={json.dumps({'pull': pull, 'reply': reply})}",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=OFFLINE,
        )
    url = f"http://127.0.0.1:{http}"
    peer = None
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, f"lmcache_controller exited: {log.read_text()[-3000:]}"
            try:
                urllib.request.urlopen(f"{url}/health", timeout=1).close()
                break
            except urllib.error.HTTPError:
                break  # it answers (the route may want another method): the server is up
            except OSError:
                assert time.monotonic() < deadline, f"lmcache_controller did not come up: {log.read_text()[-3000:]}"
                time.sleep(0.25)
        peer = Peer([f"--pull=127.0.0.1:{pull}", f"--reply=127.0.0.1:{reply}"])
        yield url, peer
    finally:
        if peer is not None:
            peer.close()
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def keys_peer() -> Iterator[Peer]:
    peer = Peer([f"--smetric-path={ROOT / 'python'}"])  # the in-process test imports smetric there
    yield peer
    peer.close()


def _eventually(probe: Callable[[], Lookup], expected: Lookup, timeout: float = 10.0) -> Lookup:
    """Pushed ADMIT/EVICT batches are applied asynchronously: poll the lookup until it shows them."""
    deadline = time.monotonic() + timeout
    while True:
        got = probe()
        if got == expected or time.monotonic() > deadline:
            return got
        time.sleep(0.05)


@needs_lmcache
@pytest.mark.parametrize(
    ("n", "chunk_size", "full_chunks_only"),
    [
        *[(n, 256, False) for n in (0, 1, 255, 256, 257, 600, 32_768)],
        (600, 256, True),
        (1000, 16, False),
        (1000, 16, True),
    ],
)
def test_chunk_keys_equal_lmcache_token_database(
    keys_peer: Peer, n: int, chunk_size: int, full_chunks_only: bool
) -> None:
    # Large and small token ids alike (a 151k vocabulary and beyond: ids are up to 2**31 - 1).
    tokens = [(i * 2_654_435_761) % (2**31 - 1) for i in range(n)]
    theirs = keys_peer("keys", tokens=tokens, chunk_size=chunk_size, full_chunks_only=full_chunks_only)["keys"]
    ours = chunk_keys(tokens, chunk_size=chunk_size, full_chunks_only=full_chunks_only)
    assert len(ours) == (n // chunk_size if full_chunks_only else -(-n // chunk_size))
    assert [k.to_bytes(8, "big", signed=True) for k in ours] == [k.to_bytes(8, "big", signed=True) for k in theirs]


@needs_lmcache
def test_register_admit_lookup_evict_through_the_controller(controller: tuple[str, Peer]) -> None:
    url, peer = controller
    client = ControllerClient(url, timeout=10.0)
    try:
        _register_admit_lookup_evict(client, peer)
    finally:
        client.close()


def _register_admit_lookup_evict(client: ControllerClient, peer: Peer) -> None:
    assert peer("register", instance="inst-A", worker=0, ip="127.0.0.1", port=free_port())["ok"]
    assert peer("register", instance="inst-B", worker=0, ip="127.0.0.1", port=free_port())["ok"]
    assert client.query_instance("127.0.0.1") in {"inst-A", "inst-B"}

    p = [10_000 + i for i in range(600)]  # 2 full chunks + 88 tokens
    q = p[:512] + [50_000 + i for i in range(300)]  # shares p's 2 chunks, then 1 full chunk of its own
    assert client.lookup(p) == Lookup(())

    admitted = peer("admit", instance="inst-A", worker=0, location="LocalCPUBackend", tokens=p)["keys"]
    assert admitted == chunk_keys(p, full_chunks_only=True)
    expected_p = Lookup((Holder("inst-A", "LocalCPUBackend", 512),))
    assert _eventually(lambda: client.lookup(p), expected_p) == expected_p
    assert expected_p.prefix_tokens == 512

    admitted = peer("admit", instance="inst-B", worker=0, location="LocalDiskBackend", tokens=q)["keys"]
    assert admitted[:2] == chunk_keys(p, full_chunks_only=True)[:2]
    assert admitted == chunk_keys(q, full_chunks_only=True)
    # The walk attributes each chunk to the first instance holding it: q's shared chunks to inst-A.
    expected_q = Lookup((Holder("inst-A", "LocalCPUBackend", 512), Holder("inst-B", "LocalDiskBackend", 768)))
    assert _eventually(lambda: client.lookup(q), expected_q) == expected_q

    # The feed records the controller's prefix into the router's global tier, prompt by prompt.
    router = Router(["a", "b"], block_size=16, config=RouterConfig(index_mode="exact"))
    feed = GlobalTierFeed(router, client.lookup)
    decision = feed.route(q, turn=1)
    assert feed.last == expected_q
    assert decision.global_hit_tokens == 768
    assert router.query(q).global_hit_tokens == 768
    assert router.query(p).global_hit_tokens == 512  # the shared chunks are the same router blocks

    # inst-B evicts q's chunks: q now hits p's two chunks on inst-A only.
    peer("evict", instance="inst-B", worker=0, location="LocalDiskBackend", tokens=q)
    expected_q = Lookup((Holder("inst-A", "LocalCPUBackend", 512),))
    assert _eventually(lambda: client.lookup(q), expected_q) == expected_q
    feed.refresh(q)
    assert router.query(q).global_hit_tokens == 512

    # inst-A evicts p's chunks: nothing is left, and the router's tier follows.
    peer("evict", instance="inst-A", worker=0, location="LocalCPUBackend", tokens=p)
    assert _eventually(lambda: client.lookup(q), Lookup(())) == Lookup(())
    feed.refresh(q)
    assert router.query(q).global_hit_tokens == 0
    assert router.query(p).global_hit_tokens == 0

    # Keys computed by smetric, admitted as they are: the controller's own hashing of the prompt finds
    # exactly them, chunk by chunk (a 32K prompt, 128 chunks, and a prompt that differs in its last token).
    r = [(i * 40_503) % 151_000 for i in range(32_768)]
    ours = chunk_keys(r, full_chunks_only=True)
    peer("admit", instance="inst-B", worker=0, location="RemoteBackend", keys=ours[:100])
    expected_r = Lookup((Holder("inst-B", "RemoteBackend", 100 * 256),))
    assert _eventually(lambda: client.lookup(r), expected_r) == expected_r
    assert client.lookup([*r[: 99 * 256], *r[99 * 256 : 100 * 256 - 1], 7]) == Lookup(
        (Holder("inst-B", "RemoteBackend", 99 * 256),)
    )
    peer("evict", instance="inst-B", worker=0, location="RemoteBackend", keys=ours[50:100])
    expected_r = Lookup((Holder("inst-B", "RemoteBackend", 50 * 256),))
    assert _eventually(lambda: client.lookup(r), expected_r) == expected_r


@needs_lmcache
def test_lookup_in_process_on_an_embedded_controller(keys_peer: Peer) -> None:
    tokens = list(range(4096 + 100))
    out = keys_peer(
        "lookup_in_process",
        tokens=tokens,
        repeat=3,
        pull_port=free_port(),
        worker_port=free_port(),
    )
    assert out["holders"] == [["inst-A", "LocalCPUBackend", 4096]]
    assert out["router_global_hit_tokens"] == 4096
    assert len(out["us"]) == 3


def test_the_module_needs_nothing_but_lookup_in_process_names_its_extra() -> None:
    # The HTTP client, the keys and the feed use the standard library only; the in-process lookup
    # imports lmcache when called, and says which extra installs it when it is missing.
    code = (
        "import asyncio, sys; sys.modules['lmcache'] = None\n"
        "import smetric.integrations.lmcache as m, smetric.integrations.mooncake\n"
        "loaded = {k.split('.')[0] for k, v in sys.modules.items() if v is not None}\n"
        "assert not {'lmcache', 'torch', 'mooncake', 'numpy', 'zmq'} & loaded, loaded\n"
        "try:\n    asyncio.run(m.lookup_in_process(None, [1]))\n"
        "except ImportError as e:\n    print(type(e).__name__, e.extra)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["MissingExtraError", "lmcache"]


def test_lookup_reads_the_controllers_layout() -> None:
    lookup = Lookup.from_layout({"inst-A": ("LocalCPUBackend", 512), "inst-B": ["RemoteBackend", 768]})
    assert lookup.holders == (Holder("inst-A", "LocalCPUBackend", 512), Holder("inst-B", "RemoteBackend", 768))
    assert lookup.prefix_tokens == 768
    assert Lookup(()).prefix_tokens == 0
    with pytest.raises(InvalidArgumentError):
        chunk_keys([1], chunk_size=0)
    with pytest.raises(InvalidArgumentError):
        ControllerClient("tcp://127.0.0.1:9000")
    with pytest.raises(InvalidArgumentError):
        GlobalTierFeed(Router(["a"])).refresh([1, 2, 3])
