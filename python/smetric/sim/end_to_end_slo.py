"""The SMetric paper's SLO as the simulator scores it: an end-to-end latency budget.

The paper (arXiv 2607.08565 v2; ``docs/routing-semantics.md`` cites it for the v2 rule) states
its SLO as TTFT ≤ 1 s + 62.5 ms per 1K prompt tokens and TPOT ≤ 20 ms (33 ms for
Qwen3-235B-A22B), and its authors' scorer applies it as one end-to-end budget per request:

    finish − arrival ≤ ttft_base_s + ttft_s_per_token · input + e2e_s_per_output_token · output

(co-located; a PD run's prefill TPS uses the TTFT part alone, ``1 + input/16000``). Requests
whose recorded output exceeds 16,384 tokens are dropped. Here they are left out of the measured
set, so neither the attainment nor the TPS counts them; they still run, and load the cluster, in
the simulation (the workload is replayed whole) — a deviation from the paper, whose replay
skipped them, that matters only where such outputs are common.

Algorithm: one pass over the run's request records (``keep_records``), the same window and
the same sums as the engine's own scorer (``smetric_sim::metrics::evaluate_slo``): a request
is measured when it arrived in ``[window_start_s, window_end_s]`` (and its output is within
``max_output_tokens``); it meets the SLO when it was served and its end-to-end latency is within
the budget. Invariants: attainments in [0, 1]; rejected or unfinished requests never meet it.
Complexity: O(records).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from smetric._types import RequestRecords, SloResult

if TYPE_CHECKING:
    from smetric.sim.config import SLO


def score_end_to_end(records: RequestRecords, slo: SLO, window_start_s: float, window_end_s: float) -> SloResult:
    """How a run did under an end-to-end SLO (``slo.e2e_s_per_output_token`` set).

    ``tpot_attainment`` is the share meeting ``slo.tpot_s`` (informative: the budget does not
    apply it separately); ``tbt_tail_attainment`` the share served.

    Raises:
        ValueError: ``slo`` is not an end-to-end SLO.
    """
    per_output = slo.e2e_s_per_output_token
    if per_output is None:
        raise ValueError(f"not an end-to-end SLO: {slo.label}")
    window = max(window_end_s - window_start_s, 2.2250738585072014e-308)
    measured = met = ttft_met = tpot_met = served_n = 0
    tokens = output = ttft_prompt = 0
    columns = zip(
        records["arrival_s"],
        records["first_token_s"],
        records["finish_s"],
        records["tpot_s"],
        records["input_tokens"],
        records["output_tokens"],
        records["rejected"],
        strict=True,
    )
    for arrival, first_token, finish, tpot, n_in, n_out, rejected in columns:
        if arrival is None or not window_start_s <= arrival <= window_end_s:
            continue
        if slo.max_output_tokens is not None and n_out > slo.max_output_tokens:
            continue
        measured += 1
        ttft_bound = slo.ttft_base_s + slo.ttft_s_per_token * n_in
        if not rejected and first_token is not None and first_token - arrival <= ttft_bound:
            ttft_met += 1
            ttft_prompt += n_in
        served = not rejected and finish is not None
        served_n += served
        tpot_met += served and (tpot is None or tpot <= slo.tpot_s)
        if served and finish is not None and finish - arrival <= ttft_bound + per_output * n_out:
            met += 1
            tokens += n_in + n_out
            output += n_out
    measured = max(measured, 1)
    return {
        "tpot_s": slo.tpot_s,
        "ttft_base_s": slo.ttft_base_s,
        "ttft_s_per_token": slo.ttft_s_per_token,
        "met": met,
        "attainment": met / measured,
        "ttft_attainment": ttft_met / measured,
        "tpot_attainment": tpot_met / measured,
        "tbt_tail_s": None,
        "tbt_tail_attainment": served_n / measured,
        "tps_under_slo": tokens / window,
        "output_tps_under_slo": output / window,
        "prefill_tps_under_slo": ttft_prompt / window,
    }
