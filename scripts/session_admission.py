"""Session admission against none and against ThunderAgent's per-pod pausing (issue 35 item 2;
``docs/results.md`` §20).

    .venv/bin/python scripts/session_admission.py --out /tmp/session-admission
    .venv/bin/python scripts/session_admission.py --out /tmp/session-admission --table
    .venv/bin/python scripts/session_admission.py --out /tmp/session-admission-report \
        --codex-seeds 100,101,102,103 --regimes bf16-off,bf16-lmcache,fp8-off      # the report set

**The runs.** Every cell is one ``smetric sweep`` (``--session-admission off|pause|smetric``) per
policy, Codex generator seed and regime, with ``--until-collapse``; the headline SLO. Regimes:

* ``bf16-off`` — where KV binds hardest: ``--format codex`` (≈68K-token calls) on 8 instances of
  the default BF16 profile (≈286K KV tokens each: four calls), no tier (a preempted or evicted
  history is recomputed);
* ``bf16-lmcache`` — the same with the default tier (LMCache over Mooncake: evicted histories
  come back from the shared store, the cheap source smetric's form moves to);
* ``fp8-off`` — where KV binds less: the FP8 profile (≈590K KV tokens each), no tier;
* ``weka`` — where it does not bind: the bundled Weka excerpt on 16 instances with the tier, the
  demo's ladder.

Codex generator seeds 4–7 (tuning seeds, 0–9; seed 3 was the probe the stage's move rule was
adjusted on, and is not used here), arrival seeds 0 and 1. Peak = the best rung of the mean over
the eight (Codex seed, arrival seed) pairs (Weka: the two arrival seeds). A first pass on seeds 4
and 5 with rungs 0.012–0.028 (``bf16-off`` only) put every peak on the ladder's top rung, right
under the cliff; the ladders were refined and the seeds extended before the runs reported.

**The report set (2026-12-04, after the form was frozen at form 3):** Codex generator seeds
100–103 (fresh: never run before), the same arrival seeds, the three Codex regimes, the same rule;
looked at once. The Weka excerpt is not in it: it is the report window of the trace, and form 3
was chosen after runs on it (docs/results.md §20 says so).

**The rule, written before the runs (2026-12-04).** Done when, for both policies: in ``bf16-off``
and ``bf16-lmcache`` peak(smetric) > peak(off) and peak(smetric) > peak(pause); in ``fp8-off`` and
``weka`` peak(smetric) ≥ 0.99 × peak(off) and ≥ 0.99 × peak(pause). The table states each ratio
and whether it passes, whatever it shows.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

MODES = ("off", "pause", "smetric")
POLICIES = ("smetric", "llmd_prefix_load")
TUNING_CODEX_SEEDS = (4, 5, 6, 7)
ARRIVAL_SEEDS = "0,1"
# Attainment falls from ≈0.95 to under 0.5 within ×1.25 on Codex (a first pass with rungs
# 0.012–0.028 put every peak on its top rung), so the rungs are ≈×1.07 apart up to the cliff.
BF16_LADDER = "0.02,0.022,0.024,0.026,0.028,0.03,0.032,0.034"
WIDE_LADDER = "0.02,0.024,0.028,0.032,0.036,0.04,0.044,0.048,0.052"
STEP = ("--ladder-step", "1.07")
REGIMES: dict[str, tuple[str, ...]] = {
    "bf16-off": ("--format", "codex", "--instances", "8", "--tier", "off", "--loads", BF16_LADDER, *STEP),
    "bf16-lmcache": ("--format", "codex", "--instances", "8", "--tier", "on", "--loads", WIDE_LADDER, *STEP),
    "fp8-off": (
        "--format",
        "codex",
        "--instances",
        "8",
        "--profile",
        "h20-qwen3-coder-30b-a3b-fp8",
        "--tier",
        "off",
        "--loads",
        WIDE_LADDER,
        *STEP,
    ),
    "weka": ("--loads", "0.025,0.05,0.075,0.1,0.125"),
}
BINDS = ("bf16-off", "bf16-lmcache")


def cells(regime: str, codex_seeds: tuple[int, ...]) -> list[tuple[str, ...]]:
    """The extra arguments of each sweep of ``regime`` (one per Codex seed, one for Weka)."""
    if regime == "weka":
        return [()]
    return [("--codex-seed", str(s)) for s in codex_seeds]


def run(out: Path, regimes: list[str], codex_seeds: tuple[int, ...]) -> None:
    for regime in regimes:
        for extra in cells(regime, codex_seeds):
            for mode in MODES:
                tag = "-".join(extra[1::2]) or "x"
                cell = out / regime / f"{mode}-{tag}"
                if (cell / "sweep.json").exists():
                    continue
                cmd = [
                    sys.executable,
                    "-m",
                    "smetric",
                    "sweep",
                    *REGIMES[regime],
                    *extra,
                    "--policies",
                    ",".join(POLICIES),
                    "--seeds",
                    ARRIVAL_SEEDS,
                    "--until-collapse",
                    "--no-progress",
                    "--session-admission",
                    mode,
                    "--out",
                    str(cell),
                ]
                print(" ".join(cmd[2:]), flush=True)
                subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def table(out: Path, regimes: list[str], codex_seeds: tuple[int, ...]) -> dict[str, object]:
    """Peak TPS under the headline SLO per (regime, policy, mode), with preemptions at the peak."""
    rows: dict[str, object] = {}
    for regime in regimes:
        for policy in POLICIES:
            peaks: dict[str, tuple[float, float, float, float]] = {}
            for mode in MODES:
                tps: dict[float, list[float]] = defaultdict(list)
                pre: dict[float, list[float]] = defaultdict(list)
                for extra in cells(regime, codex_seeds):
                    tag = "-".join(extra[1::2]) or "x"
                    data = json.loads((out / regime / f"{mode}-{tag}" / "sweep.json").read_text())
                    for r in data["runs"]:
                        if r["policy"] == policy:
                            tps[r["load"]].append(r["metrics"]["tps_under_slo"])
                            pre[r["load"]].append(r["metrics"]["preemptions"])
                load = max(tps, key=lambda x: statistics.fmean(tps[x]))
                heavy = max(tps)
                peaks[mode] = (
                    statistics.fmean(tps[load]),
                    load,
                    statistics.fmean(pre[load]),
                    statistics.fmean(pre[heavy]),
                )
            rows[f"{regime}/{policy}"] = peaks
            off, pause, sm = (peaks[m][0] for m in MODES)
            if regime in BINDS:
                verdict = "pass" if sm > off and sm > pause else "FAIL"
            else:
                verdict = "pass" if sm >= 0.99 * off and sm >= 0.99 * pause else "FAIL"
            cols = " | ".join(f"{peaks[m][0]:,.0f} ({peaks[m][1]:g}) / {peaks[m][2]:,.0f}" for m in MODES)
            ratios = f"×{sm / off:.3f} | ×{sm / pause:.3f} | ×{pause / off:.3f}"
            print(f"| {regime} | {policy} | {cols} | {ratios} | {verdict} |")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--regimes", default=",".join(REGIMES))
    ap.add_argument("--table", action="store_true", help="only print the table of what is on disk")
    ap.add_argument(
        "--codex-seeds",
        default=",".join(map(str, TUNING_CODEX_SEEDS)),
        help="Codex generator seeds (default: the tuning seeds 4-7; the report set: 100-103)",
    )
    args = ap.parse_args()
    regimes = args.regimes.split(",")
    codex_seeds = tuple(int(s) for s in args.codex_seeds.split(","))
    if not args.table:
        run(args.out, regimes, codex_seeds)
    rows = table(args.out, regimes, codex_seeds)
    (args.out / "session_admission.json").write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
