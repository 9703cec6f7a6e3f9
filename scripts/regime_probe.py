"""``smetric`` settings at results §21's three probe points: tuning data only (Codex seed 0,
Bailian seed 0, the Weka tuning window, all with LMCache), arrival seed 0, one run each at the
best baseline's peak load (``--points`` names other tuning points and loads), on the calibrated
instrument of ``scripts/default_rule.py``. Each
setting is ``LABEL=JSON``: ``RouterConfig`` fields over today's default. A probe, not a
selection: nothing is chosen from it.

    .venv/bin/python scripts/regime_probe.py 'default={}' \
        'gate={"smetric_migration": "threshold", "smetric_kv_bound_share": 0}'
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import default_rule as dr

from smetric.sim import run_grid

POINTS = {"codex-0 lmcache": [0.2], "bailian-0 lmcache": [0.7], "weka-0476 lmcache": [0.0805]}
"""§21's probe points and the best baseline's peak load at each."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("settings", nargs="+", help="LABEL=JSON: RouterConfig fields over the default")
    parser.add_argument("--traces", type=Path, default=dr.ROOT.parent / "shared" / "traces")
    parser.add_argument("--points", type=json.loads, default=POINTS, help="JSON: tuning point → its loads")
    args = parser.parse_args()
    if not set(args.points) <= set(dr.POINTS):
        parser.error(f"tuning points only: {sorted(set(args.points) - set(dr.POINTS))}")
    labels = []
    for setting in args.settings:
        label, _, fields = setting.partition("=")
        dr.CANDIDATES[label] = ("smetric", json.loads(fields or "{}"))
        labels.append(label)
    rows = dr.specs("calibrated", args.traces, args.points, labels, (0,))
    results = {r.spec: r for r in run_grid([s for _, s in rows], jobs=2, progress=True, skip_failures=True)}
    print("| point | setting | TPS headline / paper | moves | preemptions | local / tier hit | TTFT p90 | TPOT p90 |")
    print("|---|---|---:|---:|---:|---|---:|---:|")
    for cell, spec in rows:
        r = results.get(spec)
        if r is None:
            print(f"| {cell['point']} | {cell['label']} | failed | | | | |")
            continue
        m = r.metrics
        print(
            f"| {cell['point']} @{cell['load']:g} | {cell['label']} | {r.slos[0]['tps_under_slo'] / 1e3:.0f}K / "
            f"{r.slos[1]['tps_under_slo'] / 1e3:.0f}K | {m['migrations']} | {m['preemptions']} | "
            f"{m['local_hit_ratio']:.2f} / {m['global_hit_ratio']:.2f} | {m['ttft_p90_s']:.1f} s | "
            f"{m['tpot_p90_s'] * 1e3:.1f} ms |"
        )


if __name__ == "__main__":
    main()
