#!/usr/bin/env python3
"""Write the ``/metrics`` text of vLLM 0.33's own Prometheus logger, for smetric.engine_load's tests.

Runs inside the vLLM venv (no model, no GPU): ``vllm.v1.metrics.loggers.PrometheusStatLogger`` is
built for two data-parallel engines over a stub ``VllmConfig`` that carries only the attributes the
logger reads, is fed one ``SchedulerStats`` per engine, and ``prometheus_client.generate_latest()``
renders the registry, as the API server's ``/metrics`` does. The metric names, labels, HELP/TYPE
lines and the ``_total``/``_created`` series are therefore vLLM's. Engine 0: 3 running, 2 waiting,
KV usage 0.4375, prefix cache 2048/4096 tokens hit; engine 1: 1 running, 0 waiting, 0.0625, 0/512.

    /tmp/vllm-venv/bin/python scripts/vllm_golden/metrics_text.py > tests/data/vllm/metrics_0.33.0.txt
"""

from __future__ import annotations

from typing import Any

import prometheus_client
from vllm.v1.metrics.loggers import PrometheusStatLogger
from vllm.v1.metrics.stats import PrefixCacheStats, SchedulerStats


class _Stub:
    """Attributes given at construction; every other one reads as None."""

    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(fields)

    def __getattr__(self, name: str) -> Any:
        return None


def main() -> None:
    config = _Stub(
        observability_config=_Stub(show_hidden_metrics=False, kv_cache_metrics=False),
        model_config=_Stub(served_model_name="Qwen/Qwen3-0.6B", max_model_len=4096, is_diffusion=False),
        cache_config=_Stub(num_gpu_blocks=17920, block_size=16, enable_prefix_caching=True),
        parallel_config=_Stub(data_parallel_size=2, data_parallel_rank=0),
        scheduler_config=_Stub(max_num_seqs=256),
    )
    logger = PrometheusStatLogger(config, engine_indexes=[0, 1])
    engines = [(3, 2, 0.4375, 4096, 2048), (1, 0, 0.0625, 512, 0)]
    for engine, (running, waiting, usage, queries, hits) in enumerate(engines):
        prefix = PrefixCacheStats()
        prefix.requests, prefix.queries, prefix.hits = 3, queries, hits
        stats = SchedulerStats(
            num_running_reqs=running, num_waiting_reqs=waiting, kv_cache_usage=usage, prefix_cache_stats=prefix
        )
        logger.record(scheduler_stats=stats, iteration_stats=None, engine_idx=engine)
    print(prometheus_client.generate_latest().decode(), end="")


if __name__ == "__main__":
    main()
