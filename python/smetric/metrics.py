"""Prometheus metrics of a router, its KV-event subscriber and its engine-load scraper.

:class:`MetricsExporter` reads the counters smetric already keeps — ``Router.stats()``,
``KvEventSubscriber.stats()``, ``EngineLoadScraper.stats()`` — at scrape time and renders them in
the Prometheus text exposition format (version 0.0.4), the format vLLM's own ``/metrics`` uses.
Nothing is counted twice and nothing runs between scrapes: a scrape costs one ``stats()`` call per
source (the router's takes its index lock once, O(instances)).

Serve them on their own port (``with exporter.serve(port=9400): ...``: ``GET /metrics`` on a
background thread) or append :meth:`MetricsExporter.render` to the ``/metrics`` of the service that
embeds the router. No dependency: the exposition format is a few lines of text.

Families (``smetric_`` prefix; ``_total`` are counters, the rest gauges):

* router: ``routed_total``, ``first_turns_total``, ``decisions_total{reason}``,
  ``unknown_request_events_total``, ``decision_retries_total``, ``in_flight``, ``index_entries``,
  ``index_blocks{instance}``, ``index_global_blocks``, ``index_evictions_total``, ``index_bytes``;
* KV events, per source: ``kv_events_<counter>_total{instance,endpoint}`` for every ingestor
  counter (messages, batches, events, stored/removed blocks, decode errors, unmapped hashes, gaps,
  replays, resets, …), ``kv_events_decode_errors_by_kind_total{instance,endpoint,kind}``,
  ``kv_events_mapped_blocks{instance,endpoint}``, and ``kv_events_loop_errors_total``,
  ``kv_events_running``;
* engine load: ``engine_scrapes_total{instance,outcome="ok"|"error"|"slow"}``,
  ``engine_prefix_cache_hit_rate{instance}`` and ``engine_external_prefix_cache_hit_rate{instance}``
  (absent until the engine reported queries), ``engine_scrape_rounds_total``.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Literal, Protocol, Self

from smetric._core import Router

__all__ = ["CONTENT_TYPE", "MetricsExporter", "MetricsServer"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""The exposition format's content type."""

_GAUGE_INGEST_COUNTERS = frozenset({"mapped_blocks", "held_local_blocks", "held_global_blocks"})
"""Ingestor fields that are levels, not running counts."""

_RouterScalar = Literal[
    "routed",
    "first_turns",
    "unknown_request_events",
    "decision_retries",
    "in_flight",
    "index_entries",
    "index_global_blocks",
    "index_evictions",
    "index_bytes",
]
"""The ``int`` keys of :class:`smetric.RouterStats` exported as one sample each."""

_ROUTER_SCALARS: tuple[tuple[str, str, str, _RouterScalar], ...] = (
    ("routed_total", "counter", "Requests routed.", "routed"),
    ("first_turns_total", "counter", "Requests routed as the first turn of a session.", "first_turns"),
    (
        "unknown_request_events_total",
        "counter",
        "Lifecycle calls for request ids the router did not know.",
        "unknown_request_events",
    ),
    (
        "decision_retries_total",
        "counter",
        "Decisions taken again because another decision committed on the chosen instance first.",
        "decision_retries",
    ),
    ("in_flight", "gauge", "Requests routed and not finished.", "in_flight"),
    ("index_entries", "gauge", "Blocks in the KV$ index.", "index_entries"),
    ("index_global_blocks", "gauge", "Blocks the index holds in the global tier.", "index_global_blocks"),
    ("index_evictions_total", "counter", "Blocks the index dropped for capacity or age.", "index_evictions"),
    ("index_bytes", "gauge", "Memory of the KV$ index, bytes.", "index_bytes"),
)
"""The router's single-valued families: (name, type, help, ``Router.stats()`` key)."""

Labels = Mapping[str, str]
Sample = tuple[Labels, float]


class _Stats(Protocol):
    def stats(self) -> dict[str, Any]: ...


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value)) if not float(value).is_integer() else str(int(value))


def _family(name: str, kind: str, help_text: str, samples: Iterable[Sample]) -> Iterator[str]:
    rows = list(samples)
    if not rows:
        return
    yield f"# HELP {name} {help_text}"
    yield f"# TYPE {name} {kind}"
    for labels, value in rows:
        if labels:
            inner = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
            yield f"{name}{{{inner}}} {_number(value)}"
        else:
            yield f"{name} {_number(value)}"


class MetricsExporter:
    """Renders a router's metrics, and those of its subscriber and scraper, for Prometheus.

    Arguments:
        router: the router.
        events: its :class:`~smetric.events.KvEventSubscriber`, if any.
        load: its :class:`~smetric.engine_load.EngineLoadScraper`, if any.
        prefix: the metric name prefix.
    """

    def __init__(
        self,
        router: Router,
        *,
        events: _Stats | None = None,
        load: _Stats | None = None,
        prefix: str = "smetric",
    ) -> None:
        if not prefix or not prefix.replace("_", "a").isalnum() or prefix[0].isdigit():
            raise ValueError(f"prefix must be a metric-name prefix ([a-zA-Z_][a-zA-Z0-9_]*), got {prefix!r}")
        self.router = router
        self.events = events
        self.load = load
        self.prefix = prefix

    def render(self) -> str:
        """The metrics now, in the text exposition format (ends with a newline)."""
        lines = [*self._router(), *self._events(), *self._load()]
        return "\n".join(lines) + "\n" if lines else ""

    def serve(self, host: str = "127.0.0.1", port: int = 0) -> MetricsServer:
        """Starts ``GET /metrics`` on ``host:port`` (0: any free port) on a background thread."""
        return MetricsServer(self, host, port)

    def _name(self, name: str) -> str:
        return f"{self.prefix}_{name}"

    def _router(self) -> Iterator[str]:
        s = self.router.stats()
        for name, kind, help_text, key in _ROUTER_SCALARS:
            yield from _family(self._name(name), kind, help_text, [({}, s[key])])
        yield from _family(
            self._name("decisions_total"),
            "counter",
            "Routing decisions by reason.",
            [({"reason": reason}, n) for reason, n in s["reasons"].items()],
        )
        yield from _family(
            self._name("index_blocks"),
            "gauge",
            "Blocks the index holds on each instance's GPU.",
            [({"instance": name}, n) for name, n in s["index_local_blocks"].items()],
        )
        # What the router learned of each instance from its first tokens (absent until learned).
        loads = {name: self.router.load(name) for name in self.router.instances}
        yield from _family(
            self._name("instance_drain_rate"),
            "gauge",
            "Prefill work (cold-token equivalents) each instance drains a second, learned from first tokens.",
            [({"instance": name}, ld["drain_rate"]) for name, ld in loads.items() if ld["drain_rate"] is not None],
        )
        yield from _family(
            self._name("instance_fetch_cost"),
            "gauge",
            "Work one token loaded from the shared KV store costs each instance, learned from first tokens "
            "(smetric_learn_fetch_cost).",
            [({"instance": name}, ld["fetch_cost"]) for name, ld in loads.items() if ld["fetch_cost"] is not None],
        )

    def _events(self) -> Iterator[str]:
        if self.events is None:
            return
        s = self.events.stats()
        sources: list[dict[str, Any]] = s["sources"]
        names = sorted(
            {
                k
                for src in sources
                for k, v in src.items()
                if k not in ("instance", "endpoint") and isinstance(v, int | float)
            }
        )
        for field in names:
            counter = field not in _GAUGE_INGEST_COUNTERS
            yield from _family(
                self._name(f"kv_events_{field}" + ("_total" if counter else "")),
                "counter" if counter else "gauge",
                f"KV-event ingestion: {field.replace('_', ' ')}.",
                [({"instance": src["instance"], "endpoint": src["endpoint"]}, src[field]) for src in sources],
            )
        yield from _family(
            self._name("kv_events_decode_errors_by_kind_total"),
            "counter",
            "KV-event payloads dropped as undecodable, by what was wrong.",
            [
                ({"instance": src["instance"], "endpoint": src["endpoint"], "kind": kind}, n)
                for src in sources
                for kind, n in src.get("decode_errors_by_kind", {}).items()
            ],
        )
        yield from _family(
            self._name("kv_events_loop_errors_total"),
            "counter",
            "Unexpected errors of the subscriber's socket loop.",
            [({}, s["loop_errors"])],
        )
        yield from _family(
            self._name("kv_events_running"),
            "gauge",
            "1 while the subscriber's thread runs.",
            [({}, float(bool(s["running"])))],
        )

    def _load(self) -> Iterator[str]:
        if self.load is None:
            return
        s = self.load.stats()
        instances: dict[str, dict[str, Any]] = s["instances"]
        yield from _family(
            self._name("engine_scrape_rounds_total"), "counter", "Engine-load scrape rounds.", [({}, s["rounds"])]
        )
        yield from _family(
            self._name("engine_scrapes_total"),
            "counter",
            "Engine /metrics scrapes by outcome (slow: discarded for exceeding the timeout).",
            [
                ({"instance": name, "outcome": outcome}, st[key])
                for name, st in instances.items()
                for outcome, key in (("ok", "ok"), ("error", "errors"), ("slow", "slow"))
            ],
        )
        for field in ("prefix_cache_hit_rate", "external_prefix_cache_hit_rate"):
            yield from _family(
                self._name(f"engine_{field}"),
                "gauge",
                f"The engine's {field.replace('_', ' ')} over the last scrape interval.",
                [({"instance": name}, st[field]) for name, st in instances.items() if st[field] is not None],
            )


class MetricsServer:
    """``GET /metrics`` of a :class:`MetricsExporter` on a background thread (a context manager).

    ``url`` is the address to scrape; :meth:`close` (or leaving the ``with`` block) stops it.
    """

    def __init__(self, exporter: MetricsExporter, host: str, port: int) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?", 1)[0] != "/metrics":
                    self.send_error(404, "only /metrics is served")
                    return
                body = exporter.render().encode()
                self.send_response(200)
                self.send_header("Content-Type", CONTENT_TYPE)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                del format, args  # scrapes are routine: no log line each

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        bound_host, bound_port = self._server.server_address[:2]
        self.url = f"http://{bound_host!s}:{bound_port}/metrics"
        self._thread = threading.Thread(target=self._server.serve_forever, name="smetric-metrics", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stops serving and closes the socket."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
