"""Helpers of the real-engine tests: HTTP with a deadline, the decision header, ``smetric serve``
as a subprocess, and waiting on a condition."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts" / "vllm_cpu"))

import fleet  # noqa: E402

TOKENIZER = ROOT / "tests" / "data" / "serve" / "tokenizer.json"
TIMEOUT_S = 60.0


@dataclass
class Fleet:
    engines: list[fleet.Engine]
    model: Path
    start_s: list[float]
    """Seconds each engine took to answer /health 200 at the session's start."""

    @property
    def urls(self) -> list[str]:
        return [e.url for e in self.engines]


def http_json(url: str, body: Any = None, *, headers: dict[str, str] | None = None) -> tuple[dict[str, Any], Any]:
    """POSTs ``body`` (GET when None); returns the response headers and the decoded JSON."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json", **(headers or {})})
    with urllib.request.urlopen(req, timeout=TIMEOUT_S) as r:
        return dict(r.headers), json.loads(r.read())


def decision(header: str) -> dict[str, str]:
    """``x-smetric-decision`` as a dict."""
    return {k: v.strip('"') for k, _, v in (p.partition("=") for p in header.split("; "))}


class Serve:
    """``smetric serve`` as a subprocess in front of the fleet, with the test tokenizer and block size 32."""

    def __init__(self, urls: list[str], *extra: str, log: Path) -> None:
        self.port = fleet.free_port()
        self.log = log
        argv = [sys.executable, "-m", "smetric", "serve", "--port", str(self.port), "--tokenizer", str(TOKENIZER)]
        argv += ["--block-size", str(fleet.BLOCK_SIZE), *extra]
        for u in urls:
            argv += ["--instance", u]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        with log.open("w") as err:  # a file, not a pipe: nobody reads the log while the proxy runs
            self.proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=err)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout: float = 60.0) -> Serve:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=1) as r:
                    if r.status == 200:
                        return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise AssertionError(f"smetric serve did not come up (exit {self.proc.returncode}):\n{self.stderr}")

    def metrics(self) -> str:
        with urllib.request.urlopen(self.url + "/metrics", timeout=TIMEOUT_S) as r:
            text: str = r.read().decode()
            return text

    @property
    def stderr(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> str:
        """SIGTERM (SIGKILL after 60 s); returns the proxy's stderr."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        return self.stderr


def wait_until(condition: Any, timeout: float, interval: float = 0.01) -> bool:
    """Polls ``condition()`` until it is true or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while True:
        if condition():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def metric_sum(text: str, family: str, **labels: str) -> float:
    """The sum of ``family``'s samples in Prometheus ``text`` whose labels include ``labels``."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(family) or line[len(family) : len(family) + 1] not in ("{", " "):
            continue
        head, _, value = line.rpartition(" ")
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
    return total
