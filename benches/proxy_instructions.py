"""Instructions per request of ``smetric serve`` (callgrind): the proxy's CPU, counted, for A/B
of source trees on a machine whose other cores are busy.

:mod:`proxy_ab`'s CPU seconds from ``/proc`` move with the other tenants of a shared machine
(caches, frequency, a sibling hyperthread): two runs of one tree differ by up to 30 %. An
instruction count does not. Here each tree's proxy (``smetric serve --tokens ids``, the
engine-load scraper and the KV-event feed off, as in :mod:`proxy_ab`; ``--api chat``,
``messages`` or ``responses``: their 32K-token conversations with ``--tokens approximate``) runs under
``valgrind --tool=callgrind`` in front of ``smetric fake-engine`` instances that do not;
after a warm-up the counters are zeroed (``callgrind_control -z``), ``--requests`` plain then
``--requests`` streamed requests are sent one at a time, and the counters are dumped
(``callgrind_control -d``): every thread's instructions over those requests, divided by their
number. ``PYTHONHASHSEED`` is fixed; what still varies between runs (request ids, timer wake-ups,
the health probe) moves the figure by about 0.1 %.

What it does not count: the kernel's work for the process (system calls, page faults — which
:mod:`proxy_ab` reports) and memory stalls. A change that copies or first-touches more memory
costs more time than its instructions say; read both.

The dump is kept (``--keep DIR``) for ``callgrind_annotate``: which functions the instructions
went to, CPython's and the Rust extension's alike (Python functions show as the interpreter's C
frames, so read it beside a ``py-spy`` profile).

    .venv/bin/python benches/proxy_instructions.py --tree before=/tmp/old/python --tree after=python
    .venv/bin/python benches/proxy_instructions.py --tree after=python:/other/venv/bin/python --keep /tmp/cg

A tree is ``NAME=PYTHON_DIR`` or ``NAME=PYTHON_DIR:INTERPRETER`` (default: this interpreter); an
old tree needs its own build of the extension in its ``smetric/`` directory.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
import proxy_data_plane as bench


@dataclass(frozen=True)
class Row:
    plain: float
    """Instructions per plain (whole-answer) request."""
    stream: float
    """Instructions per streamed request."""

    @property
    def mean(self) -> float:
        return (self.plain + self.stream) / 2


PATHS = {
    "completions": "/v1/completions",
    "chat": "/v1/chat/completions",
    "messages": "/v1/messages",
    "responses": "/v1/responses",
}


def bodies_of(api: str, n: int, prompt_tokens: int, stream: bool) -> list[bytes]:
    """Completions: one body of ``prompt_tokens`` token ids. The others: ``n`` follow-ups of one
    conversation of about ``prompt_tokens`` tokens (:mod:`proxy_data_plane`'s), in the API's form."""
    if api == "completions":
        prompt = list(range(1000, 1000 + prompt_tokens))
        return [json.dumps({"model": bench.MODEL, "prompt": prompt, "max_tokens": 16, "stream": stream}).encode()]
    chats = bench.chat_bodies(n, prompt_tokens, stream)
    return {"chat": chats, "messages": bench.messages_bodies(chats), "responses": bench.responses_bodies(chats)}[api]


async def sequential(url: str, path: str, bodies: list[bytes], stream: bool, n: int) -> None:
    """``n`` requests (the bodies in turn), one at a time; every answer read to its end and checked."""
    async with aiohttp.ClientSession() as session:
        for i in range(n):
            await bench.one(session, f"{url}{path}", bodies[i % len(bodies)], stream)


def callgrind(pid: int, flag: str) -> None:
    """``callgrind_control FLAG PID``: instrumentation on, zero the counters, or dump them."""
    subprocess.run(["callgrind_control", flag, str(pid)], check=True, capture_output=True, timeout=120)


def total_ir(out_dir: str, pid: int) -> int:
    """The instructions (every thread's) in the last numbered dump of process ``pid``."""
    dumps = {int(f.name.rsplit(".", 1)[1]): f for f in Path(out_dir).glob(f"callgrind.out.{pid}.*")}
    if not dumps:
        raise RuntimeError(f"no callgrind dump of {pid} in {out_dir}")
    text = dumps[max(dumps)].read_text(errors="replace")
    match = re.search(r"^(?:summary|totals):\s+(\d+)", text, re.M)
    if match is None:
        raise RuntimeError(f"no total in {dumps[max(dumps)]}")
    return int(match.group(1))


def one_tree(
    tree: str, python: str, engines: list[str], bodies: dict[bool, list[bytes]], args: argparse.Namespace
) -> Row:
    """Instructions per request of one tree's proxy, plain and streamed."""
    port = bench.free_port()
    tokens = "ids" if args.api == "completions" else "approximate"
    cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={args.out}/callgrind.out.%p"]
    cmd += [python, "-m", "smetric", "serve", "--port", str(port), "--tokens", tokens]
    cmd += ["--kv-events", "off", "--log-level", "WARNING", "--no-engine-load"]
    for url in engines:
        cmd += ["--instance", url]
    env = {**os.environ, "PYTHONPATH": str(Path(tree).resolve()), "PYTHONHASHSEED": "0"}
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        bench.wait_http(f"{url}/health", timeout=300)  # imports under valgrind: tens of seconds
        callgrind(proc.pid, "--instr=on")
        for stream in (False, True):
            asyncio.run(sequential(url, PATHS[args.api], bodies[stream], stream, args.warmup))
        counts = []
        for stream in (False, True):
            callgrind(proc.pid, "-z")
            asyncio.run(sequential(url, PATHS[args.api], bodies[stream], stream, args.requests))
            callgrind(proc.pid, "-d")
            counts.append(total_ir(args.out, proc.pid) / args.requests)
        return Row(*counts)
    finally:
        bench.stop([proc], timeout=120)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--tree", action="append", required=True, help="NAME=PYTHON_DIR[:INTERPRETER], repeated")
    p.add_argument("--requests", type=int, default=100, help="per kind (plain, streamed)")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--prompt-tokens", type=int, default=32_768)
    p.add_argument(
        "--api",
        choices=sorted(PATHS),
        default="completions",
        help="completions: token-id prompts (--tokens ids); the others: a conversation (--tokens approximate)",
    )
    p.add_argument("--keep", help="keep the callgrind dumps in this directory")
    args = p.parse_args()
    if not shutil.which("valgrind"):
        sys.exit("valgrind is required")
    bodies = {stream: bodies_of(args.api, args.requests, args.prompt_tokens, stream) for stream in (False, True)}
    trees = []
    for spec in args.tree:
        name, _, rest = spec.partition("=")
        tree, _, python = rest.partition(":")
        trees.append((name, tree, python or sys.executable))
    keep = args.keep is not None
    args.out = args.keep or tempfile.mkdtemp(prefix="proxy-cg-")
    os.makedirs(args.out, exist_ok=True)
    rows: dict[str, Row] = {}
    engines_procs = []
    try:
        engines = bench.start_engines(2, engines_procs)
        for stream in (False, True):  # the engines' prefix caches fill here
            asyncio.run(bench.open_loop(engines, bodies[stream][:20], stream, 50.0, 20, PATHS[args.api]))
        for name, tree, python in trees:
            rows[name] = one_tree(tree, python, engines, bodies, args)
            print(json.dumps({"tree": name, "plain": rows[name].plain, "stream": rows[name].stream}), flush=True)
    finally:
        bench.stop(engines_procs)
        if not keep:
            shutil.rmtree(args.out, ignore_errors=True)
    base = next(iter(rows.values())).mean
    what = "id prompts" if args.api == "completions" else f"{args.api} conversations, approximate tokens"
    print(f"instructions per request (millions), {args.requests} per kind, {args.prompt_tokens}-token {what}")
    print(f"{'tree':<14} {'plain':>8} {'stream':>8} {'mean':>8} {'vs first':>9}")
    for name, r in rows.items():
        print(f"{name:<14} {r.plain / 1e6:>8.3f} {r.stream / 1e6:>8.3f} {r.mean / 1e6:>8.3f} {r.mean / base:>9.3f}")


if __name__ == "__main__":
    main()
