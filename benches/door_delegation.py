"""What the compiled data plane's door costs a delegated request (branch `gateway`, stage 1).

Four fake engines, then ``smetric serve --tokens approximate`` twice — ``--data-plane python``
and ``--data-plane compiled`` (the Rust door in front of the same app) — and for each the
interleaved pairs of ``benches/proxy_data_plane.py`` (32K-token chat, 50/s a side, 300 each,
plain and streamed): the added p50 and the process's CPU per request. Bounded: loopback, fixed
counts, every process stopped.

    .venv/bin/python benches/door_delegation.py
"""

from __future__ import annotations

import asyncio
import subprocess
import sys

import proxy_data_plane as bench


def main() -> None:
    procs: list[subprocess.Popen[str]] = []
    try:
        engines = []
        for _ in range(4):
            proc, url = bench.start_engine(1e6)
            procs.append(proc)
            engines.append(url)
        planes = {}
        for plane in ("python", "compiled"):
            port = bench.free_port()
            cmd = [*bench.pinned(1), sys.executable, "-m", "smetric", "serve", "--port", str(port)]
            cmd += ["--tokens", "approximate", "--kv-events", "off", "--log-level", "WARNING", "--data-plane", plane]
            for url in engines:
                cmd += ["--instance", url]
            proc = subprocess.Popen(cmd, text=True)
            procs.append(proc)
            bench.wait_http(f"http://127.0.0.1:{port}/health")
            planes[plane] = (f"http://127.0.0.1:{port}", proc)
        chats = {stream: bench.chat_bodies(300, 32_768, stream) for stream in (False, True)}
        path = "/v1/chat/completions"
        for plane, (url, proc) in planes.items():
            for target in [*engines, url]:
                asyncio.run(bench.open_loop([target], chats[False][:20], False, 50.0, 20, path))
            before = bench.process_cpu_s(proc.pid)
            added = []
            for stream in (False, True):
                direct, proxied = asyncio.run(bench.interleaved(engines, [url], chats[stream], stream, 50.0, 300, path))
                added.append(bench.pct([d[0] for d in proxied], 50) - bench.pct([d[0] for d in direct], 50))
            cpu = (bench.process_cpu_s(proc.pid) - before) / 600 * 1e6
            plain, first_byte = added
            print(f"{plane}: added p50 plain +{plain:.2f} ms, streamed first byte +{first_byte:.2f} ms", end="")
            print(f"; {cpu:.0f} µs of CPU a request")
    finally:
        bench.stop(procs)


if __name__ == "__main__":
    main()
