"""Regenerates the PD (disaggregated prefill/decode) section of ``docs/results.md``.

    .venv/bin/python scripts/reproduce_pd.py --traces /work/shared/traces --out docs/results-data   # ≈ 20 min, 2 cores
    .venv/bin/python scripts/reproduce_pd.py --tuning-only ...     # the tuning-window scans alone
    .venv/bin/python scripts/reproduce_pd.py --tables docs/results-data                            # tables only
    .venv/bin/python scripts/reproduce_pd.py --diagnose --out /tmp/pd-diagnosis   # PD diagnosis (§12.7)

Two parts, both under the v2 defaults (LMCache tier path, 16 H20 GPUs, insert-on-route index,
turns from the requests):

* **Tuning** (Weka 0476–0549 only): the P:D split (6:10, 8:8, 10:6, 12:4 and co-located, for
  ``smetric`` and ``lmetric``) and smetric's decode rule against the alternatives (``kv_fit``,
  ``least_batch``, ``power_of_two``, ``round_robin``) at the two splits the report uses. The
  splits of the report were read off the first scan: the two with the highest prefill TPS
  under SLO.
* **Report** (Weka 0001–0175, 0176–0400, 0401–0475 and the Mooncake conversation trace): every
  policy of ``smetric.POLICIES`` plus ``cache_first_max_hit``, each in its peer PD form
  (the prefill side its own policy, the decode side vllm-router's ``power_of_two``, round-robin
  for ``round_robin``, ``kv_fit`` for ``smetric``), at the two splits and co-located on the same
  16 GPUs, over a load ladder, three seeds.

Metrics: prefill TPS under SLO (prompt tokens per second of measured requests whose TTFT meets
the headline bound, 2 s + 0.1 ms/token), its peak over the ladder of the mean of the seeds; the
headline TPS under SLO; TTFT p50 / p90 / p99, TPOT p50 and tail TBT at a fixed load; transfer
time and bytes; decode-side KV usage and admission wait.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from smetric import POLICIES
from smetric.sim import SLO, RunResult, RunSpec, SimulationConfig, TraceSpec, Window, run_grid

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reproduce_results import MAX_EVENTS, SEEDS, TRACES, Trace

LABELS = [*POLICIES, "cache_first_max_hit"]
BASELINES = [p for p in LABELS if p != "smetric"]
SPLITS = ((8, 8), (6, 10))
"""The report's P:D splits: the two best by prefill TPS under SLO in the tuning scan."""
TUNING_SPLITS = ((6, 10), (8, 8), (10, 6), (12, 4))
DECODE_RULES = ("kv_fit", "least_batch", "power_of_two", "round_robin")
LOADS = {"weka": (0.01, 0.02, 0.035, 0.05, 0.065, 0.08), "mooncake": (0.5, 1.0, 1.5, 2.0, 3.0, 4.0)}
"""The v2 ladders, with one point below (PD peaks lower than co-located on the tuning window)."""
FIXED_LOAD = {"weka": 0.035, "mooncake": 1.0}
"""Where the latency columns are read: PD's peak on the tuning window; the Mooncake trace at its own speed."""
SLO_HEADLINE = SLO()


def layout_name(split: tuple[int, int] | None) -> str:
    return "co-located" if split is None else f"{split[0]}P:{split[1]}D"


def config_of(split: tuple[int, int] | None, decode_rule: str | None = None) -> SimulationConfig:
    base = SimulationConfig(slos=(SLO_HEADLINE,), max_events=MAX_EVENTS)
    return base if split is None else base.with_pd(split[0], split[1], decode_rule)  # type: ignore[arg-type]


def record(r: RunResult, **cell: Any) -> dict[str, Any]:
    m = r.metrics
    keys = (
        "tps_under_slo",
        "prefill_tps_under_slo",
        "ttft_p50_s",
        "ttft_p90_s",
        "ttft_p99_s",
        "tpot_p50_s",
        "tbt_tail_p90_ms",
        "slo_attainment",
        "local_hit_ratio",
        "follow_up_return",
        "preemptions",
        "transfer_p50_ms",
        "transfer_p99_ms",
        "transfer_bytes",
        "decode_hit_tokens",
        "decode_kv_usage_mean",
        "decode_kv_usage_max",
        "decode_admission_wait_p99_ms",
        "decode_preemptions",
        "decode_rule",
        "measured",
    )
    return {**cell, "wall_s": r.wall_s, **{k: m.get(k) for k in keys}}


def run_cells(cells: list[tuple[dict[str, Any], RunSpec]], jobs: int) -> tuple[list[dict[str, Any]], list[Any]]:
    done = {r.spec: r for r in run_grid([s for _, s in cells], jobs=jobs, progress=True, skip_failures=True)}
    runs = [record(done[s], **c) for c, s in cells if s in done]
    failed = [c for c, s in cells if s not in done]
    return runs, failed


def run_into(path: Path, cells: list[tuple[dict[str, Any], RunSpec]], jobs: int, **fields: Any) -> Path:
    """Runs the cells and writes ``fields``, the wall time, the failed cells and the runs to ``path``."""
    started = time.perf_counter()
    runs, failed = run_cells(cells, jobs)
    payload = {**fields, "wall_s": time.perf_counter() - started, "failed": failed, "runs": runs}
    path.write_text(json.dumps(payload, indent=1) + "\n")
    return path


def spec_of(trace: Trace, traces_dir: Path) -> TraceSpec:
    return TraceSpec(paths=tuple(str(traces_dir / f) for f in trace.files), format=trace.format)


def tuning(traces_dir: Path, out: Path, jobs: int) -> Path:
    trace = next(t for t in TRACES if t.role == "tuning")
    spec = spec_of(trace, traces_dir)
    cells: list[tuple[dict[str, Any], RunSpec]] = []
    for split in (None, *TUNING_SPLITS):
        for label in ("smetric", "lmetric"):
            for load in (0.02, 0.035, 0.05):
                for seed in SEEDS:
                    cell = {"part": "split", "layout": layout_name(split), "label": label, "load": load, "seed": seed}
                    cells.append((cell, RunSpec(spec, config_of(split), Window(), label, load, seed)))
    for split in SPLITS:
        for rule in DECODE_RULES:
            for load in LOADS["weka"][:4]:
                for seed in SEEDS:
                    cell = {"part": "rule", "layout": layout_name(split), "label": rule, "load": load, "seed": seed}
                    cells.append((cell, RunSpec(spec, config_of(split, rule), Window(), "smetric", load, seed)))
    return run_into(out / "pd_tuning.json", cells, jobs, trace=trace.key)


ATTRIBUTION = ("lmetric", "linear", "smetric")
"""Prefill policies also run with the other decode rule: the strongest baselines with smetric's
``kv_fit``, smetric with the baselines' ``power_of_two`` (which half of the PD result is whose)."""


def attribution(traces_dir: Path, out: Path, jobs: int) -> Path:
    cells: list[tuple[dict[str, Any], RunSpec]] = []
    for trace in (t for t in TRACES if t.role == "report"):
        spec = spec_of(trace, traces_dir)
        for split in SPLITS:
            for label in ATTRIBUTION:
                rule = "power_of_two" if label == "smetric" else "kv_fit"
                for load in LOADS[trace.format]:
                    for seed in SEEDS:
                        cell = {"trace": trace.key, "layout": layout_name(split), "label": f"{label}+{rule}"}
                        cell |= {"load": load, "seed": seed}
                        cells.append((cell, RunSpec(spec, config_of(split, rule), Window(), label, load, seed)))
    return run_into(out / "pd_attribution.json", cells, jobs)


def attribution_table(d: dict[str, Any], a: dict[str, Any]) -> str:
    """Peak prefill TPS under SLO of each prefill policy with each decode rule."""
    cells = group(d["runs"] + a["runs"], "trace", "layout", "label")
    combos = [
        ("smetric", "smetric+power_of_two"),
        ("lmetric", "lmetric+kv_fit"),
        ("linear", "linear+kv_fit"),
    ]
    head = " | ".join(f"{x} | {y}" for x, y in combos)
    lines = [
        f"| trace | layout | {head} |",
        "|---|---|" + "---:|" * (2 * len(combos)),
    ]
    traces = sorted({r["trace"] for r in a["runs"]}, key=[t.key for t in TRACES].index)
    for trace in traces:
        for lay in d["splits"]:
            vals = []
            for x, y in combos:
                for lab in (x, y):
                    v, load, _ = peak(cells[(trace, lay, lab)], "prefill_tps_under_slo")
                    vals.append(f"{_fmt(v)} ({load:g})")
            lines.append(f"| {trace} | {lay} | " + " | ".join(vals) + " |")
    return "\n".join(lines)


def report(traces_dir: Path, out: Path, jobs: int) -> Path:
    cells: list[tuple[dict[str, Any], RunSpec]] = []
    for trace in (t for t in TRACES if t.role == "report"):
        spec = spec_of(trace, traces_dir)
        for split in (None, *SPLITS):
            for label in LABELS:
                for load in LOADS[trace.format]:
                    for seed in SEEDS:
                        cell = {"trace": trace.key, "layout": layout_name(split), "label": label, "load": load}
                        cell["seed"] = seed
                        cells.append((cell, RunSpec(spec, config_of(split), Window(), label, load, seed)))
    return run_into(
        out / "pd.json",
        cells,
        jobs,
        slo=SLO_HEADLINE.label,
        splits=[layout_name(s) for s in SPLITS],
        loads=LOADS,
        fixed_load=FIXED_LOAD,
        seeds=list(SEEDS),
    )


def smetric_plus(traces_dir: Path, out: Path, jobs: int) -> Path:
    """The report grid for ``smetric`` alone, with whatever defaults it has now (the smetric+
    defaults, merged after pd.json was recorded: there, ``smetric`` is the paper's form)."""
    cells: list[tuple[dict[str, Any], RunSpec]] = []
    for trace in (t for t in TRACES if t.role == "report"):
        spec = spec_of(trace, traces_dir)
        for split in (None, *SPLITS):
            for load in LOADS[trace.format]:
                for seed in SEEDS:
                    cell = {"trace": trace.key, "layout": layout_name(split), "label": "smetric", "load": load}
                    cell["seed"] = seed
                    cells.append((cell, RunSpec(spec, config_of(split), Window(), "smetric", load, seed)))
    return run_into(out / "pd_smetric_plus.json", cells, jobs)


def stored_labels(d: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The policies and the baselines a stored run holds: pd.json holds those of its day, and
    baselines added since are not in it."""
    stored = {r["label"] for r in d["runs"]}
    return [lab for lab in LABELS if lab in stored], [b for b in BASELINES if b in stored]


def smetric_plus_table(d: dict[str, Any], plus: dict[str, Any]) -> str:
    """smetric with the smetric+ defaults, and in the paper's form (pd.json), ÷ the best baseline."""
    cells = group(d["runs"], "trace", "layout", "label")
    new = group(plus["runs"], "trace", "layout")
    labels, baselines = stored_labels(d)
    lines = [
        "| trace | layout | smetric (smetric+ defaults) ÷ best | paper's form ÷ best | best baseline |",
        "|---|---|---:|---:|---|",
    ]
    traces = sorted({r["trace"] for r in plus["runs"]}, key=[t.key for t in TRACES].index)
    for trace in traces:
        for layout in [lay for lay in ["co-located", *d["splits"]] if (trace, lay) in new]:
            pk = {lab: peak(cells[(trace, layout, lab)], "prefill_tps_under_slo")[0] for lab in labels}
            name = max(baselines, key=lambda b: pk[b])
            now = peak(new[(trace, layout)], "prefill_tps_under_slo")[0]
            lines.append(f"| {trace} | {layout} | ×{now / pk[name]:.3f} | ×{pk['smetric'] / pk[name]:.3f} | {name} |")
    return "\n".join(lines)


DIAGNOSIS: dict[str, dict[str, Any]] = {
    "today": {},
    "kv switch off": {"smetric_kv_bound_share": 0.0},
    "gate": {"smetric_migration": "threshold", "smetric_kv_bound_share": 0.0},
    "fetch 16": {"smetric_migration_margin": 16.0, "smetric_kv_bound_share": 0.0},
}
"""``smetric`` variants of the diagnosis (:func:`diagnosis`): today's default, without the KV-bound
switch, round 1's default (the paper's TTFT gate alone) and the fetch rule at a wider margin."""
DIAGNOSIS_BASELINES = ("lmetric", "linear", "lpwl")
"""The PD report's best baselines (§12): the ratio's denominator is the best of them per cell."""


Arm = tuple[str, str, dict[str, Any]]
"""A label, the policy it runs and its router fields."""


def arm_cells(
    spec: TraceSpec, splits: tuple[tuple[int, int] | None, ...], arms: list[Arm], seeds: tuple[int, ...]
) -> list[tuple[dict[str, Any], RunSpec]]:
    """Each arm at each layout, over the Weka ladder and ``seeds``."""
    cells: list[tuple[dict[str, Any], RunSpec]] = []
    for split in splits:
        for name, policy, fields in arms:
            config = config_of(split)
            config = config.with_router(**fields) if fields else config
            for load in LOADS["weka"]:
                for seed in seeds:
                    cell = {"layout": layout_name(split), "label": name, "load": load, "seed": seed}
                    cells.append((cell, RunSpec(spec, config, Window(), policy, load, seed)))
    return cells


def ratios_to_best(d: dict[str, Any], layouts: list[str], labels: list[str]) -> dict[str, list[float]]:
    """Each label's peak prefill TPS under SLO ÷ the best of :data:`DIAGNOSIS_BASELINES`', per layout."""
    cells = group(d["runs"], "layout", "label")
    best = {lay: max(peak(cells[(lay, b)], "prefill_tps_under_slo")[0] for b in DIAGNOSIS_BASELINES) for lay in layouts}
    return {lab: [peak(cells[(lay, lab)], "prefill_tps_under_slo")[0] / best[lay] for lay in layouts] for lab in labels}


def diagnosis(traces_dir: Path, out: Path, jobs: int) -> Path:
    """Which part of today's default costs the PD cells (results §12.7), on the **tuning** window
    only (Weka 0476–0549; the report grid is not run): :data:`DIAGNOSIS` and
    :data:`DIAGNOSIS_BASELINES` at the report's two splits and co-located, the Weka ladder, three
    seeds; peak prefill TPS under SLO ÷ the best baseline's per cell. It chooses nothing: a
    variant ahead of today's by more than 0.01 in its worst cell names the part to look at, and a
    PD default would then be chosen by its own rule, written before its runs."""
    trace = next(t for t in TRACES if t.role == "tuning")
    arms: list[Arm] = [(v, "smetric", f) for v, f in DIAGNOSIS.items()] + [(b, b, {}) for b in DIAGNOSIS_BASELINES]
    cells = arm_cells(spec_of(trace, traces_dir), (None, *SPLITS), arms, SEEDS)
    return run_into(out / "pd_diagnosis.json", cells, jobs, trace=trace.key)


def ratio_table(head: str, layouts: list[str], ratios: dict[str, list[float]], worst_of: list[str]) -> str:
    """One row per label: its ratios per layout, and the worst for the labels in ``worst_of``."""
    lines = [f"| {head} | " + " | ".join(layouts) + " | worst |", "|---|" + "---:|" * (len(layouts) + 1)]
    for lab, rs in ratios.items():
        worst = f"×{min(rs):.3f}" if lab in worst_of else ""
        lines.append(f"| {lab} | " + " | ".join(f"×{r:.3f}" for r in rs) + f" | {worst} |")
    return "\n".join(lines)


def diagnosis_table(d: dict[str, Any]) -> str:
    layouts = ["co-located", *(layout_name(s) for s in SPLITS)]
    ratios = ratios_to_best(d, layouts, [*DIAGNOSIS, *DIAGNOSIS_BASELINES])
    return ratio_table("variant", layouts, ratios, list(DIAGNOSIS))


# --- tables --------------------------------------------------------------------------------------


def _fmt(x: float | None, digits: int = 0) -> str:
    return "–" if x is None else f"{x:,.{digits}f}"


Runs = list[dict[str, Any]]


def group(runs: Runs, *keys: str) -> dict[tuple[Any, ...], Runs]:
    out: dict[tuple[Any, ...], Runs] = defaultdict(list)
    for r in runs:
        out[tuple(r[k] for k in keys)].append(r)
    return out


def peak(runs: Runs, metric: str) -> tuple[float, float, dict[int, float]]:
    """(peak of the seed-mean curve, its load, each seed's own peak)."""
    by_load = group(runs, "load")
    mean = {load: statistics.fmean(r[metric] for r in rs) for (load,), rs in by_load.items()}
    best = max(mean, key=lambda x: mean[x])
    per_seed = {
        seed: max(r[metric] for r in rs)
        for (seed,), rs in group(runs, "seed").items()  # each seed's own peak over the ladder
    }
    return mean[best], best, per_seed


def at_load(runs: Runs, load: float, metric: str) -> float | None:
    vals = [r[metric] for r in runs if r["load"] == load and r[metric] is not None]
    return statistics.fmean(vals) if vals else None


def headline(d: dict[str, Any]) -> str:
    """Per trace and layout: smetric ÷ the best baseline, prefill TPS and TPS under SLO; TTFT p50."""
    cells = group(d["runs"], "trace", "layout", "label")
    lines = [
        f"Peak over the ladder of the mean of {len(d['seeds'])} seeds, {d['slo']}; TTFT p50 at "
        f"{d['fixed_load']['weka']:g} sessions/s (Weka) / {d['fixed_load']['mooncake']:g}× (Mooncake).\n",
        "| trace | layout | smetric prefill TPS (load) | best baseline | ratio (seeds) | TPS≤SLO ratio | "
        "TTFT p50 smetric | TTFT p50 cache_first (Bailian) | TTFT p50 best baseline |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    traces = sorted({r["trace"] for r in d["runs"]}, key=[t.key for t in TRACES].index)
    layouts = ["co-located", *d["splits"]]
    labels, baselines = stored_labels(d)
    for trace in traces:
        fmt = "weka" if trace.startswith("weka") else "mooncake"
        fixed = d["fixed_load"][fmt]
        for layout in layouts:
            pk = {lab: peak(cells[(trace, layout, lab)], "prefill_tps_under_slo") for lab in labels}
            tp = {lab: peak(cells[(trace, layout, lab)], "tps_under_slo")[0] for lab in labels}
            name = max(baselines, key=lambda b: pk[b][0])
            s, b = pk["smetric"], pk[name]
            seeds = [s[2][k] / max(pk_b[2][k] for pk_b in (pk[x] for x in baselines)) for k in s[2]]
            ttft = {lab: at_load(cells[(trace, layout, lab)], fixed, "ttft_p50_s") for lab in labels}
            tps_best = max(tp[x] for x in baselines)
            lines.append(
                f"| {trace} | {layout} | {_fmt(s[0])} ({s[1]:g}) | {name} {_fmt(b[0])} | "
                f"×{s[0] / b[0]:.3f} ({min(seeds):.2f}–{max(seeds):.2f}) | ×{tp['smetric'] / tps_best:.3f} | "
                f"{_fmt(ttft['smetric'], 2)} s | {_fmt(ttft['cache_first'], 2)} s | {_fmt(ttft[name], 2)} s |"
            )
    return "\n".join(lines)


def per_policy(d: dict[str, Any], trace: str) -> str:
    cells = group(d["runs"], "trace", "layout", "label")
    fmt = "weka" if trace.startswith("weka") else "mooncake"
    fixed = d["fixed_load"][fmt]
    layouts = ["co-located", *d["splits"]]
    head = " | ".join(f"{lay} prefill TPS (load)" for lay in layouts)
    lines = [
        f"| policy | {head} | TTFT p50 / p99 s at {fixed:g} ({' · '.join(layouts)}) | "
        f"TPOT p50 ms ({' · '.join(layouts)}) |",
        "|---|" + "---:|" * len(layouts) + "---|---|",
    ]
    for lab in stored_labels(d)[0]:
        row = [lab]
        for lay in layouts:
            v, load, _ = peak(cells[(trace, lay, lab)], "prefill_tps_under_slo")
            row.append(f"{_fmt(v)} ({load:g})")
        lat = []
        tpot = []
        for lay in layouts:
            rs = cells[(trace, lay, lab)]
            lat.append(f"{_fmt(at_load(rs, fixed, 'ttft_p50_s'), 2)}/{_fmt(at_load(rs, fixed, 'ttft_p99_s'), 1)}")
            t = at_load(rs, fixed, "tpot_p50_s")
            tpot.append(_fmt(None if t is None else 1e3 * t, 1))
        row += [" · ".join(lat), " · ".join(tpot)]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def pd_behaviour(d: dict[str, Any]) -> str:
    """smetric and the best baselines' transfer and decode-side figures at the fixed load."""
    cells = group(d["runs"], "trace", "layout", "label")
    lines = [
        "| trace | layout | policy (decode rule) | transfer p50 / p99 ms | GB pulled | decode-hit share | "
        "decode KV mean / max | admission wait p99 s | decode preemptions |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    traces = sorted({r["trace"] for r in d["runs"]}, key=[t.key for t in TRACES].index)
    for trace in traces:
        fmt = "weka" if trace.startswith("weka") else "mooncake"
        fixed = d["fixed_load"][fmt]
        for lay in d["splits"]:
            for lab in ("smetric", "lmetric", "linear", "cache_first"):
                rs = [r for r in cells[(trace, lay, lab)] if r["load"] == fixed]
                if not rs:
                    continue

                def m(key: str, rs: Runs = rs) -> float:
                    return statistics.fmean(r[key] for r in rs)

                pulled = m("transfer_bytes")
                token_bytes = 98_304.0  # Qwen3-Coder-30B-A3B BF16, KV bytes per token (the profile's)
                hit_share = m("decode_hit_tokens") / (m("decode_hit_tokens") + pulled / token_bytes)
                lines.append(
                    f"| {trace} | {lay} | {lab} ({rs[0]['decode_rule']}) | {m('transfer_p50_ms'):.0f} / "
                    f"{m('transfer_p99_ms'):.0f} | {pulled / 1e9:,.0f} | {100 * hit_share:.0f} % | "
                    f"{m('decode_kv_usage_mean'):.2f} / {m('decode_kv_usage_max'):.2f} | "
                    f"{m('decode_admission_wait_p99_ms') / 1e3:.1f} | {m('decode_preemptions'):.0f} |"
                )
    return "\n".join(lines)


def tuning_tables(t: dict[str, Any]) -> str:
    runs = t["runs"]
    split = [r for r in runs if r["part"] == "split"]
    lines = [
        "Split scan (mean of the seeds; prefill TPS under SLO and TTFT p50):\n",
        "| layout | policy | 0.02 | 0.035 | 0.05 | TTFT p50 at 0.035 |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for (lay, lab), rs in group(split, "layout", "label").items():
        vals = [_fmt(at_load(rs, x, "prefill_tps_under_slo")) for x in (0.02, 0.035, 0.05)]
        lines.append(f"| {lay} | {lab} | {' | '.join(vals)} | {_fmt(at_load(rs, 0.035, 'ttft_p50_s'), 2)} s |")
    rule = [r for r in runs if r["part"] == "rule"]
    lines += [
        "\nsmetric's decode rule (prefill side smetric): peak prefill TPS under SLO (load), TTFT p50 "
        "at 0.035, transfer p50:\n",
        "| layout | decode rule | peak prefill TPS (load) | TTFT p50 | transfer p50 ms | decode KV mean |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for (lay, lab), rs in group(rule, "layout", "label").items():
        v, load, _ = peak(rs, "prefill_tps_under_slo")
        lines.append(
            f"| {lay} | {lab} | {_fmt(v)} ({load:g}) | {_fmt(at_load(rs, 0.035, 'ttft_p50_s'), 2)} s | "
            f"{_fmt(at_load(rs, 0.035, 'transfer_p50_ms'))} | {_fmt(at_load(rs, 0.035, 'decode_kv_usage_mean'), 2)} |"
        )
    return "\n".join(lines)


def tables(data_dir: Path) -> str:
    parts = []
    tuning_path = data_dir / "pd_tuning.json"
    if tuning_path.exists():
        parts += ["### Tuning window (Weka 0476–0549)\n", tuning_tables(json.loads(tuning_path.read_text()))]
    path = data_dir / "pd.json"
    if path.exists():
        d = json.loads(path.read_text())
        parts += ["\n### Headline\n", headline(d), "\n### Transfers and decode-side pressure\n", pd_behaviour(d)]
        for trace in sorted({r["trace"] for r in d["runs"]}, key=[t.key for t in TRACES].index):
            parts += [f"\n### {trace}\n", per_policy(d, trace)]
        if d["failed"]:
            parts.append(f"\nFailed runs: {len(d['failed'])}")
        attribution_path = data_dir / "pd_attribution.json"
        if attribution_path.exists():
            a = json.loads(attribution_path.read_text())
            parts += [
                "\n### Attribution: prefill policy x decode rule (peak prefill TPS under SLO)\n",
                attribution_table(d, a),
            ]
    return "\n".join(parts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--traces", type=Path, default=Path("/work/shared/traces"))
    parser.add_argument("--out", type=Path, default=Path("docs/results-data"))
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--tuning-only", action="store_true", help="only the tuning-window scans")
    parser.add_argument("--report-only", action="store_true", help="only the report grid")
    parser.add_argument("--attribution-only", action="store_true", help="only the policy x decode-rule runs")
    parser.add_argument("--tables", type=Path, help="only print the markdown tables of this data directory")
    parser.add_argument(
        "--smetric-plus",
        action="store_true",
        help="only re-run smetric (its current defaults) on the report grid, against the stored pd.json",
    )
    parser.add_argument(
        "--diagnose",
        action="store_true",
        help="only the diagnosis of today's default in PD, on the tuning window (results §12.7)",
    )
    args = parser.parse_args()
    if args.diagnose:
        args.out.mkdir(parents=True, exist_ok=True)
        print(diagnosis_table(json.loads(diagnosis(args.traces, args.out, args.jobs).read_text())))
        return 0
    if args.tables:
        print(tables(args.tables))
        return 0
    if args.smetric_plus:
        # The stored baselines first: a missing pd.json fails before the runs, not after them.
        d = json.loads((args.out / "pd.json").read_text())
        path = smetric_plus(args.traces, args.out, args.jobs)
        print(smetric_plus_table(d, json.loads(path.read_text())))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    only = args.tuning_only or args.report_only or args.attribution_only
    if args.tuning_only or not only:
        print(f"wrote {tuning(args.traces, args.out, args.jobs)}", file=sys.stderr)
    if args.report_only or not only:
        print(f"wrote {report(args.traces, args.out, args.jobs)}", file=sys.stderr)
    if args.attribution_only or not only:
        print(f"wrote {attribution(args.traces, args.out, args.jobs)}", file=sys.stderr)
    print(tables(args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
