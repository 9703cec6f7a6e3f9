"""Engine load from vLLM's ``/metrics`` (or ``/load``), fed into the router.

The router fuses what it knows itself (requests it routed and not yet finished) with the last
engine snapshot, as long as that snapshot is younger than ``RouterConfig.engine_load_staleness_s``
(``docs/routing-semantics.md`` §3). :class:`EngineLoadScraper` provides the snapshots: every
``period_s`` it fetches every instance's ``/metrics`` in parallel, each on one kept-alive
connection, parses the few Prometheus series the load needs and calls
``router.update_load(instance, running=, waiting=, kv_usage=)`` — all of it in Rust, on a runtime
of its own, never holding the GIL the proxy's event loop needs (the Python scraper it replaced
cost ≈ 0.3 ms of CPU per instance and round, under the GIL).

Per instance, over the series of every engine (data-parallel rank) of the served model:
``running`` = Σ ``vllm:num_requests_running``, ``waiting`` = Σ ``vllm:num_requests_waiting``,
``kv_usage`` = max ``vllm:kv_cache_usage_perc`` (the fullest rank, clamped to [0, 1]). The prefix-cache
counters (``vllm:prefix_cache_{queries,hits}_total`` and the ``external_`` pair of KV connectors)
give a hit rate per scrape interval, reported by :meth:`EngineLoadScraper.stats`.

Staleness is explicit: ``period_s`` must be below the router's ``engine_load_staleness_s`` (so a
healthy scraper always has a fresh snapshot), and a response slower than ``timeout_s`` is
discarded, so a snapshot is at most ``timeout_s`` old when it is stamped. A failed or discarded
scrape leaves the old snapshot to age out: the router then uses its own counters only.

With ``endpoint="load"`` the scraper reads ``GET /load`` (``{"server_load": n}``, vLLM's
``--enable-server-load-tracking``) instead and reports ``running=n, waiting=0``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Collection, Mapping, Sequence
from types import TracebackType
from typing import Any, Literal, Self

from smetric import _core
from smetric._core import EngineSample, Router

__all__ = ["EngineLoadScraper", "EngineSample", "engine_sample", "parse_prometheus"]

log = logging.getLogger("smetric.engine_load")

Series = list[tuple[dict[str, str], float]]
"""The samples of one metric name: (labels, value) pairs in text order."""


def parse_prometheus(text: str, names: Collection[str] | None = None) -> dict[str, Series]:
    """Parses the Prometheus text exposition format (version 0.0.4); with ``names``, only the
    samples of those metric names (the others are skipped before they are parsed). The parse is
    the scraper's own, in Rust (``smetric_vllm::load_metrics``).

    Comments (``# HELP``, ``# TYPE``) and blank lines are skipped; a line that does not parse is
    skipped too (a scrape must not fail on one odd line). Label values are unescaped; an
    optional trailing timestamp is ignored.

    Returns:
        metric name → its samples, e.g. ``{"vllm:num_requests_running": [({"engine": "0", ...}, 3.0)]}``.
    """
    return _core.parse_prometheus(text, None if names is None else list(names))


_CACHE_CONFIG = "vllm:cache_config_info"


def kv_capacity_tokens(text: str) -> int | None:
    """An engine's GPU KV capacity in tokens, from vLLM's ``vllm:cache_config_info`` gauge (its
    ``num_gpu_blocks`` × ``block_size`` labels; summed over data-parallel ranks would overstate
    one rank's cache, so the smallest rank counts), or None when the page has no such series."""
    capacities = []
    for labels, _ in parse_prometheus(text, {_CACHE_CONFIG}).get(_CACHE_CONFIG, []):
        try:
            capacities.append(int(labels["num_gpu_blocks"]) * int(labels["block_size"]))
        except (KeyError, ValueError):
            continue
    return min(capacities) if capacities else None


GIB = 1 << 30


def host_offload_tokens(text: str) -> int | None:
    """The host-memory KV cache an engine announces, in tokens, or None when it offloads none.

    vLLM's ``--kv-offloading-size`` (GiB; the ``native`` backend is its ``OffloadingConnector``,
    ``lmcache`` LMCache's local CPU backend — either way the engine's own host memory) shows as the
    ``kv_offloading_size`` label of ``vllm:cache_config_info``; its bytes per token are the GPU
    cache's (``kv_cache_memory_bytes / kv_cache_size_tokens``). An engine that offloads but does
    not publish those two labels counts as offloading an unknown amount: 0 tokens. The smallest
    data-parallel rank counts, as for :func:`kv_capacity_tokens`."""
    sizes = []
    for labels, _ in parse_prometheus(text, {_CACHE_CONFIG}).get(_CACHE_CONFIG, []):
        try:
            gib = float(labels.get("kv_offloading_size", "None"))
        except ValueError:
            continue  # "None": no offloading on this rank
        if not (math.isfinite(gib) and gib > 0):
            continue
        try:
            per_token = int(labels["kv_cache_memory_bytes"]) / int(labels["kv_cache_size_tokens"])
        except (KeyError, ValueError, ZeroDivisionError):
            sizes.append(0)
            continue
        sizes.append(int(gib * GIB / per_token) if per_token > 0 else 0)
    return min(sizes) if sizes else None


def engine_sample(text: str, model_name: str | None = None) -> EngineSample:
    """The load in one ``/metrics`` text; ``model_name`` keeps only that model's series.

    Per instance, over the series of every engine (data-parallel rank): ``running`` and
    ``waiting`` summed (rounded half to even, at least 0), ``kv_usage`` the fullest rank's
    (clamped to [0, 1]), the prefix-cache counters summed; non-finite samples never count."""
    return _core.engine_sample(text, model_name)


class EngineLoadScraper:
    """Periodically scrapes every instance and feeds ``router.update_load``.

    The work runs in Rust (``smetric_gateway::engine_load``), on a runtime of its own: one task
    per instance and round, each on a kept-alive connection, the page parsed and fed to the
    router without the GIL. This class checks the arguments and words the counters.

    Arguments:
        router: the router to feed (a ``PdRouter``: its prefill pool).
        instances: instance name → base URL (``http://gpu-0:8000``); a sequence of names that are
            base URLs themselves; or None for all of the router's instances (their names as URLs).
        period_s: scrape period; must be below ``router.config.engine_load_staleness_s``.
        timeout_s: a response slower than this is discarded and counted ``slow`` (default: half
            the staleness bound, at most 1 s); also the connect timeout.
        endpoint: ``"metrics"`` (``GET /metrics``) or ``"load"`` (``GET /load``).
        model_name: only count series of this ``model_name`` label (None: all).
        max_workers: concurrent requests per round (default: one per instance, at most 32).
        headers: HTTP headers sent with every scrape (an engine's key).

    Raises:
        ValueError: a bad period, timeout, endpoint, header or instance URL.
    """

    def __init__(
        self,
        router: Router,
        instances: Mapping[str, str] | Sequence[str] | None = None,
        *,
        period_s: float = 0.1,
        timeout_s: float | None = None,
        endpoint: Literal["metrics", "load"] = "metrics",
        model_name: str | None = None,
        max_workers: int | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        staleness = router.config.engine_load_staleness_s
        if not 0 < period_s < staleness:
            raise ValueError(f"period_s must be in (0, engine_load_staleness_s={staleness}), got {period_s}")
        timeout = min(staleness / 2, 1.0) if timeout_s is None else timeout_s
        if not 0 < timeout <= staleness:
            raise ValueError(f"timeout_s must be in (0, engine_load_staleness_s={staleness}], got {timeout}")
        if endpoint not in ("metrics", "load"):
            raise ValueError(f'endpoint must be "metrics" or "load", got {endpoint!r}')
        if instances is None:
            instances = router.instances
        urls = dict(instances) if isinstance(instances, Mapping) else {name: name for name in instances}
        self.router = router
        self.period_s = period_s
        self.timeout_s = timeout
        self.endpoint = endpoint
        self.model_name = model_name
        self.headers = dict(headers or {})
        """Sent with every scrape (an engine behind a key: ``Authorization: Bearer …``)."""
        self._names = list(urls)
        self._scrape = _core.EngineLoadScrape(
            router,
            list(urls.items()),
            period_s=period_s,
            timeout_s=timeout,
            endpoint=endpoint,
            model_name=model_name,
            headers=self.headers,
            max_concurrent=max_workers or max(1, min(32, len(urls))),
        )

    def scrape_once(self) -> dict[str, EngineSample | None]:
        """Scrapes every instance now (in parallel) and feeds the router; None marks a failure."""
        return dict(zip(self._names, self._scrape.scrape_once(), strict=True))

    def start(self) -> Self:
        """Starts scraping every ``period_s`` (on the scraper's own thread)."""
        self._scrape.start()
        return self

    def stop(self) -> None:
        """Stops scraping (idempotent); requests in flight are dropped."""
        self._scrape.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def last(self, instance: str) -> EngineSample | None:
        """The last sample fed for ``instance``."""
        for s in self._scrape.stats():
            if s.name == instance:
                return s.last
        raise KeyError(instance)

    def stats(self) -> dict[str, Any]:
        """``rounds`` and, per instance, ``ok``/``errors``/``slow`` counts, ``last_error`` and the
        prefix-cache hit rates of the last interval (``prefix_cache_hit_rate``,
        ``external_prefix_cache_hit_rate``; None until two samples with queries)."""
        return {
            "rounds": self._scrape.rounds,
            "instances": {
                s.name: {
                    "url": s.url,
                    "ok": s.ok,
                    "errors": s.errors,
                    "slow": s.slow,
                    "last_error": s.last_error,
                    "prefix_cache_hit_rate": s.prefix_cache_hit_rate,
                    "external_prefix_cache_hit_rate": s.external_prefix_cache_hit_rate,
                }
                for s in self._scrape.stats()
            },
        }
