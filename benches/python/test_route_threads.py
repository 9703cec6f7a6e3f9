"""The thread benchmark (``route_threads.py``, through ``route_latency.py --threads``) still
measures every shape: a tiny run (one run, 0.05 s per configuration; not timed) prints a row for
each shape, loop and thread count and the two controls (``control``, ``apart``), and its shapes
do what they are named for —
move-heavy's follow-ups move, the others' stay. An instrument that broke would measure nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent / "route_latency.py"
SHAPES = ("stay-home", "distinct", "move-heavy", "write-heavy")
LOOPS = ("route", "realistic")


def test_every_shape_loop_and_thread_count_prints_its_row() -> None:
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--threads", "1", "--seconds", "0.05"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    counts = ["1", "2", "4"] if (os.cpu_count() or 1) >= 4 else ["1", "2"]
    rows = {tuple(line.split()[:3]): line.split()[3:] for line in out.splitlines() if line.strip()}
    controls = {(c, "-", t) for c in ("control", "apart") for t in counts}
    expected = {(s, lp, t) for s in SHAPES for lp in LOOPS for t in counts} | controls
    assert expected <= rows.keys(), out
    for key in expected:  # routes/s, ratios, p50, p99, moved
        rate, ratio, p50, p99, moved = rows[key]
        assert all(float(x.replace(",", "")) > 0 for x in (*rate.split("/"), *ratio.split("/"), p50, p99)), out
        if key[0] == "move-heavy" and key[2] == "1":
            assert float(moved.rstrip("%")) >= 30, out
        elif key[0] in ("stay-home", "distinct") and key[2] == "1":
            assert float(moved.rstrip("%")) <= 10, out
        elif key in controls:
            assert moved == "-", out
    assert "timer: two perf_counter_ns reads" in out and "run 1, x(2 threads ÷ 1): " in out
    if "4" not in counts:
        assert "4 threads: skipped" in out
