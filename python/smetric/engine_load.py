"""Engine load from vLLM's ``/metrics`` (or ``/load``), fed into the router.

The router fuses what it knows itself (requests it routed and not yet finished) with the last
engine snapshot, as long as that snapshot is younger than ``RouterConfig.engine_load_staleness_s``
(``docs/routing-semantics.md`` §3). :class:`EngineLoadScraper` provides the snapshots: every
``period_s`` it fetches every instance's ``/metrics`` in parallel, each on one kept-alive
connection, parses the few Prometheus series the load needs and calls
``router.update_load(instance, running=, waiting=, kv_usage=)``. Its threads hold the GIL while
they parse, so the parse skips every other line of the page (a vLLM page is ~640 lines).

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

import http.client
import json
import logging
import math
import re
import threading
import time
import urllib.parse
from collections.abc import Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal, Self

from smetric._core import Router

__all__ = ["EngineHTTPError", "EngineLoadScraper", "EngineSample", "engine_sample", "parse_prometheus"]

log = logging.getLogger("smetric.engine_load")

Series = list[tuple[dict[str, str], float]]
"""The samples of one metric name: (labels, value) pairs in text order."""

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(,|(?=}))')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


def _float(text: str) -> float:
    value = {"+Inf": math.inf, "-Inf": -math.inf, "NaN": math.nan}.get(text)
    return float(text) if value is None else value


def parse_prometheus(text: str, names: Collection[str] | None = None) -> dict[str, Series]:
    """Parses the Prometheus text exposition format (version 0.0.4); with ``names``, only the
    samples of those metric names (the others are skipped before any regex runs: a vLLM page is
    ~640 lines, mostly histogram buckets, of which the load needs 11 — 2.5 ms parsed whole, on a
    thread that holds the GIL the proxy's event loop needs).

    Comments (``# HELP``, ``# TYPE``) and blank lines are skipped; a line that does not parse is
    skipped too (a scrape must not fail on one odd line). Label values are unescaped; an
    optional trailing timestamp is ignored.

    Returns:
        metric name → its samples, e.g. ``{"vllm:num_requests_running": [({"engine": "0", ...}, 3.0)]}``.
    """
    out: dict[str, Series] = {}
    wanted = tuple(names) if names is not None else None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or (wanted is not None and not line.startswith(wanted)):
            continue
        m = _NAME.match(line)
        if m is None:
            continue
        name, rest = m.group(0), line[m.end() :]
        if names is not None and name not in names:  # a longer name that starts with a wanted one
            continue
        labels: dict[str, str] = {}
        if rest.startswith("{"):
            pos = 1
            while not rest.startswith("}", pos):
                lm = _LABEL.match(rest, pos)
                if lm is None:
                    break
                labels[lm.group(1)] = re.sub(r"\\[\\\"n]", lambda e: _UNESCAPE[e.group(0)], lm.group(2))
                pos = lm.end()
            if not rest.startswith("}", pos):
                continue
            rest = rest[pos + 1 :]
        fields = rest.split()
        if not fields:
            continue
        try:
            value = _float(fields[0])
        except ValueError:
            continue
        out.setdefault(name, []).append((labels, value))
    return out


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


@dataclass(frozen=True, slots=True)
class EngineSample:
    """One instance's load, summed over its engines (data-parallel ranks).

    Every field is None when the metric was absent.
    """

    running: int | None = None
    waiting: int | None = None
    kv_usage: float | None = None
    prefix_cache_queries: float | None = None
    prefix_cache_hits: float | None = None
    external_prefix_cache_queries: float | None = None
    external_prefix_cache_hits: float | None = None


def _values(metrics: Mapping[str, Series], name: str, model_name: str | None) -> list[float]:
    return [
        v
        for labels, v in metrics.get(name, [])
        if math.isfinite(v) and (model_name is None or labels.get("model_name") == model_name)
    ]


_RUNNING, _WAITING = "vllm:num_requests_running", "vllm:num_requests_waiting"
_KV_USAGE = "vllm:kv_cache_usage_perc"
_QUERIES, _HITS = "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"
_EXTERNAL_QUERIES = "vllm:external_prefix_cache_queries_total"
_EXTERNAL_HITS = "vllm:external_prefix_cache_hits_total"
_LOAD_METRICS = frozenset({_RUNNING, _WAITING, _KV_USAGE, _QUERIES, _HITS, _EXTERNAL_QUERIES, _EXTERNAL_HITS})
"""Every metric :func:`engine_sample` reads (the parse skips the page's other lines)."""


def engine_sample(text: str, model_name: str | None = None) -> EngineSample:
    """The load in one ``/metrics`` text; ``model_name`` keeps only that model's series."""
    metrics = parse_prometheus(text, _LOAD_METRICS)

    def total(name: str) -> float | None:
        values = _values(metrics, name, model_name)
        return sum(values) if values else None

    def count(name: str) -> int | None:
        value = total(name)
        return None if value is None else max(0, round(value))

    usage = _values(metrics, _KV_USAGE, model_name)
    return EngineSample(
        running=count(_RUNNING),
        waiting=count(_WAITING),
        kv_usage=min(max(max(usage), 0.0), 1.0) if usage else None,
        prefix_cache_queries=total(_QUERIES),
        prefix_cache_hits=total(_HITS),
        external_prefix_cache_queries=total(_EXTERNAL_QUERIES),
        external_prefix_cache_hits=total(_EXTERNAL_HITS),
    )


def _rate(hits_now: float | None, hits_then: float | None, q_now: float | None, q_then: float | None) -> float | None:
    """Hit rate between two counter readings; None without queries or across a counter reset."""
    if None in (hits_now, hits_then, q_now, q_then):
        return None
    assert hits_now is not None and hits_then is not None and q_now is not None and q_then is not None
    dq, dh = q_now - q_then, hits_now - hits_then
    if dq <= 0 or dh < 0:
        return None
    return min(dh / dq, 1.0)


class EngineHTTPError(Exception):
    """An engine answered a scrape with a status other than 2xx."""


class _KeptConnection:
    """One kept-alive HTTP/1.1 connection to an engine, reused round after round.

    A fresh connection per scrape (``urllib``) cost 0.25 ms of CPU a fetch, on a thread that
    holds the GIL the proxy's event loop needs; a kept one costs 0.11 ms, and the engine sees
    one connection instead of a new one every ``period_s``. A request on a reused connection
    that fails (the engine closed it while it was idle) is sent once more on a new one. One
    request at a time (a lock): ``scrape_once`` may be called beside the thread.
    """

    def __init__(self, url: str, timeout_s: float) -> None:
        parts = urllib.parse.urlsplit(url)
        self._https = parts.scheme == "https"
        self._host = parts.netloc
        self._base = parts.path.rstrip("/")
        self._timeout_s = timeout_s
        self._conn: http.client.HTTPConnection | None = None
        self._lock = threading.Lock()

    def get(self, path: str, headers: Mapping[str, str]) -> bytes:
        """The body of ``GET path``; raises on a transport failure or a status other than 2xx."""
        with self._lock:
            reused = self._conn is not None
            try:
                return self._get(path, headers)
            except TimeoutError:
                raise  # a slow engine, not a stale connection
            except (http.client.HTTPException, OSError):
                if not reused:
                    raise
            return self._get(path, headers)

    def _get(self, path: str, headers: Mapping[str, str]) -> bytes:
        if self._conn is None:
            kind = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
            self._conn = kind(self._host, timeout=self._timeout_s)
        conn = self._conn
        try:
            conn.request("GET", f"{self._base}{path}", headers=dict(headers))
            response = conn.getresponse()
            body = response.read()
        except BaseException:
            self._drop()
            raise
        if response.will_close:
            self._drop()
        if not 200 <= response.status < 300:
            raise EngineHTTPError(f"HTTP {response.status} from {path}")
        return body

    def _drop(self) -> None:
        """Closes the connection (the lock held): the next request opens a new one."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def close(self) -> None:
        with self._lock:
            self._drop()


@dataclass
class _InstanceState:
    url: str
    connection: _KeptConnection
    ok: int = 0
    errors: int = 0
    slow: int = 0
    last_error: str | None = None
    last: EngineSample | None = None
    hit_rate: float | None = None
    external_hit_rate: float | None = None


class EngineLoadScraper:
    """Periodically scrapes every instance and feeds ``router.update_load``.

    Arguments:
        router: the router to feed.
        instances: instance name → base URL (``http://gpu-0:8000``); a sequence of names that are
            base URLs themselves; or None for all of the router's instances (their names as URLs).
        period_s: scrape period; must be below ``router.config.engine_load_staleness_s``.
        timeout_s: slower responses are discarded (default: half the staleness bound, at most 1 s).
        endpoint: ``"metrics"`` (``GET /metrics``) or ``"load"`` (``GET /load``).
        model_name: only count series of this ``model_name`` label (None: all).
        max_workers: concurrent requests per round (default: one per instance, at most 32).
        headers: HTTP headers sent with every scrape (an engine's key).

    Raises:
        ValueError: a bad period, timeout or endpoint.
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
        self._state = {
            name: _InstanceState(url.rstrip("/"), _KeptConnection(url, timeout)) for name, url in urls.items()
        }
        self._lock = threading.Lock()
        self._rounds = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pool = ThreadPoolExecutor(
            max_workers=max_workers or max(1, min(32, len(urls))), thread_name_prefix="smetric-load"
        )

    # -- one round -------------------------------------------------------------------------------

    def _fetch(self, state: _InstanceState) -> EngineSample:
        body = state.connection.get(f"/{self.endpoint}", self.headers).decode("utf-8", errors="replace")
        if self.endpoint == "load":
            load = json.loads(body)["server_load"]
            if not isinstance(load, int) or isinstance(load, bool) or load < 0:
                raise ValueError(f"server_load is not a count: {load!r}")
            return EngineSample(running=load, waiting=0)
        return engine_sample(body, self.model_name)

    def _scrape(self, name: str) -> EngineSample | None:
        state = self._state[name]
        started = time.monotonic()
        try:
            sample = self._fetch(state)
        except Exception as e:  # network errors, HTTP errors, bad bodies: all are a failed scrape
            with self._lock:
                state.errors += 1
                state.last_error = f"{type(e).__name__}: {e}"
            return None
        if time.monotonic() - started > self.timeout_s:
            with self._lock:
                state.slow += 1
            return None
        try:
            self.router.update_load(name, running=sample.running, waiting=sample.waiting, kv_usage=sample.kv_usage)
        except ValueError as e:  # the instance left the router
            with self._lock:
                state.errors += 1
                state.last_error = f"{type(e).__name__}: {e}"
            return None
        with self._lock:
            prev = state.last
            if prev is not None:
                state.hit_rate = _rate(
                    sample.prefix_cache_hits,
                    prev.prefix_cache_hits,
                    sample.prefix_cache_queries,
                    prev.prefix_cache_queries,
                )
                state.external_hit_rate = _rate(
                    sample.external_prefix_cache_hits,
                    prev.external_prefix_cache_hits,
                    sample.external_prefix_cache_queries,
                    prev.external_prefix_cache_queries,
                )
            state.ok += 1
            state.last = sample
        return sample

    def scrape_once(self) -> dict[str, EngineSample | None]:
        """Scrapes every instance now (in parallel) and feeds the router; None marks a failure."""
        names = list(self._state)
        samples = dict(zip(names, self._pool.map(self._scrape, names), strict=True))
        with self._lock:
            self._rounds += 1
        return samples

    # -- the thread ------------------------------------------------------------------------------

    def _run(self) -> None:
        next_round = time.monotonic()
        while not self._stop.is_set():
            try:
                self.scrape_once()
            except Exception:
                log.exception("engine load scrape failed")
            next_round += self.period_s
            delay = next_round - time.monotonic()
            if delay < 0:  # a round overran: skip the missed ticks instead of bursting
                next_round = time.monotonic()
                delay = 0
            self._stop.wait(delay)

    def start(self) -> Self:
        """Starts scraping every ``period_s`` on a background thread."""
        if self._thread is not None:
            raise RuntimeError("EngineLoadScraper already started")
        self._thread = threading.Thread(target=self._run, name="smetric-engine-load", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stops the thread (idempotent); in-flight requests end within ``timeout_s``."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self._pool.shutdown(wait=True, cancel_futures=True)
        for state in self._state.values():
            state.connection.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def last(self, instance: str) -> EngineSample | None:
        """The last sample fed for ``instance``."""
        with self._lock:
            return self._state[instance].last

    def stats(self) -> dict[str, Any]:
        """``rounds`` and, per instance, ``ok``/``errors``/``slow`` counts, ``last_error`` and the
        prefix-cache hit rates of the last interval (``prefix_cache_hit_rate``,
        ``external_prefix_cache_hit_rate``; None until two samples with queries)."""
        with self._lock:
            return {
                "rounds": self._rounds,
                "instances": {
                    name: {
                        "url": s.url,
                        "ok": s.ok,
                        "errors": s.errors,
                        "slow": s.slow,
                        "last_error": s.last_error,
                        "prefix_cache_hit_rate": s.hit_rate,
                        "external_prefix_cache_hit_rate": s.external_hit_rate,
                    }
                    for name, s in self._state.items()
                },
            }
