"""pytest-benchmark of the engine-load scraper's parse: one real vLLM ``/metrics`` page
(``tests/data/vllm/metrics_cpu_0.32.0.txt``, 642 lines, 54 KB) read for the load
(:func:`smetric.engine_load.engine_sample`, which parses only the 7 metrics it reads) against the
whole page parsed into Python dicts. Both are the Rust parse of ``smetric_vllm::load_metrics``; the
scraper itself runs it without the GIL, once per instance per ``engine_load_period_s``.

Run: ``pytest benches/python/test_engine_load_bench.py --benchmark-enable --benchmark-only``
(``make bench``); figures in BENCHMARKS.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from smetric.engine_load import engine_sample, parse_prometheus

PAGE = (Path(__file__).parents[2] / "tests" / "data" / "vllm" / "metrics_cpu_0.32.0.txt").read_text()


def test_engine_sample(benchmark: Any) -> None:
    assert benchmark(engine_sample, PAGE).running == 3


def test_whole_page_parse(benchmark: Any) -> None:
    assert len(benchmark(parse_prometheus, PAGE)) > 30
