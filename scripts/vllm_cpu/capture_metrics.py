"""Captures a real CPU vLLM engine's ``/metrics`` under load, for ``tests/test_engine_load.py``.

Starts one engine of ``fleet.py`` (the venv of ``venv.sh``, the tiny model, block size 32, 1 GiB of
KV), sends one prompt twice (a prefix-cache hit: the engine counts queries and hits), then three
long requests at once, and saves the page the moment the engine reports all three running. The
page is vLLM's own (``vllm:cache_config_info`` included, which an engine sets once it has sized its
cache). Run from the repository root with the dev venv (stdlib only here):

    .venv/bin/python scripts/vllm_cpu/capture_metrics.py tests/data/vllm/metrics_cpu_0.32.0.txt
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
import threading
import urllib.request
from pathlib import Path

import fleet

RUNNING = 3


def _post(url: str, body: dict[str, object]) -> None:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        r.read()


def main(out: Path) -> None:
    model = fleet.make_model(fleet.VENV / "models" / fleet.MODEL_NAME)
    with tempfile.TemporaryDirectory(prefix="vllm-metrics-") as work:
        engine = fleet.Engine(model, Path(work), core=0)
        engine.start()
        try:
            engine.wait_ready()
            prompt = "metrics capture " * 100
            for _ in range(2):
                _post(engine.url + "/v1/completions", {"model": fleet.MODEL_NAME, "prompt": prompt, "max_tokens": 4})
            long = {"model": fleet.MODEL_NAME, "max_tokens": 2000, "ignore_eos": True}
            workers = [
                threading.Thread(target=_post, args=(engine.url + "/v1/completions", {**long, "prompt": f"run {i}"}))
                for i in range(RUNNING)
            ]
            for w in workers:
                w.start()
            for _ in range(2000):
                with urllib.request.urlopen(engine.url + "/metrics", timeout=30) as r:
                    text = r.read().decode()
                running = re.search(r"^vllm:num_requests_running\{[^}]*\} (\S+)$", text, flags=re.M)
                if running and float(running.group(1)) >= RUNNING:
                    out.write_text(text)
                    break
            else:
                raise SystemExit("the engine never reported every request running")
            for w in workers:
                w.join(300)
        finally:
            engine.stop()
    print(f"wrote {out}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: capture_metrics.py OUT")
    main(Path(sys.argv[1]))
