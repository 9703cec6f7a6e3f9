"""The proxy's own Prometheus families, beside the router's (:class:`smetric.metrics.MetricsExporter`).

The router already counts decisions by reason, first turns and in-flight requests; what only the
proxy sees is counted here: per decision its labels (policy, short reason, first turn) and hit
tokens, the decision latency, upstream latency (first byte and whole request), retries,
ejections and re-admissions, stream resumptions, and responses by status. Histograms have fixed
buckets (seconds); one observation is a bisect and two increments, O(log buckets).

Families (``smetric_`` prefix): ``proxy_decisions_total{policy,reason,first_turn}``,
``proxy_hit_tokens_total{tier}``, ``proxy_prompt_tokens_total{source}``,
``proxy_decision_seconds``, ``proxy_upstream_first_byte_seconds``, ``proxy_request_seconds``,
``proxy_retries_total{cause}``, ``proxy_ejections_total{instance}``,
``proxy_readmissions_total{instance}``, ``proxy_resumed_streams_total``, ``proxy_unresumed_streams_total``,
``proxy_native_requests_total{api}``,
``proxy_responses_total{code}``, ``proxy_instance_in_flight{instance}``,
``proxy_instance_ejected{instance}``, ``proxy_client_errors_total{kind}`` (client garbage the
proxy refused — malformed HTTP, slow heads, unparseable bodies — counted instead of logged),
``proxy_session_ends_total{via,held}`` (session-end signals: ``via`` the endpoint or the header,
``held`` whether this proxy held state for the session), ``proxy_sessions`` (entries of the
session table), ``proxy_parent_placements_total{outcome}`` (sub-agents' first requests: placed at
the parent's home, or not and why).

May import: :mod:`smetric.metrics` only.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING

from smetric.metrics import _family

if TYPE_CHECKING:
    from smetric._core import Decision, PdDecision

DECISION_BUCKETS_S = (10e-6, 20e-6, 50e-6, 100e-6, 200e-6, 500e-6, 1e-3, 2e-3, 5e-3, 10e-3)
LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
_DOOR_ANSWERS = {"http_405": 405}
"""The gateway's client-error kinds that are whole answers the app would have counted as
responses had it answered them (the door's 400s and 431s end a connection before any request,
as the app's HTTP layer does, and neither plane counts them as responses)."""


class Histogram:
    """A Prometheus histogram with fixed upper bounds."""

    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def render(self, name: str, help_text: str) -> Iterator[str]:
        yield f"# HELP {name} {help_text}"
        yield f"# TYPE {name} histogram"
        running = 0
        for bound, n in zip(self.buckets, self.counts, strict=False):
            running += n
            yield f'{name}_bucket{{le="{bound!r}"}} {running}'
        yield f'{name}_bucket{{le="+Inf"}} {self.count}'
        yield f"{name}_sum {self.sum!r}"
        yield f"{name}_count {self.count}"


class ProxyTelemetry:
    """Counters and histograms of one proxy process (its event loop only: no locking)."""

    def __init__(self, prefix: str = "smetric") -> None:
        self.prefix = prefix
        self.decisions: Counter[tuple[str, str, str]] = Counter()
        self.hit_tokens: Counter[str] = Counter()
        self.prompt_tokens: Counter[str] = Counter()
        self.retries: Counter[str] = Counter()
        self.ejections: Counter[str] = Counter()
        self.readmissions: Counter[str] = Counter()
        self.responses: Counter[int] = Counter()
        self.resumed_streams = 0
        self.unresumed_streams = 0
        self.native: Counter[str] = Counter()
        """Requests the compiled data plane served itself, by API (the rest reach the app)."""
        self.client_errors: Counter[str] = Counter()
        """Refused client input by kind (a bounded set of names the proxy chooses)."""
        self.door_client_errors: Callable[[], Iterable[tuple[str, int]]] | None = None
        """The compiled data plane's own tallies of the same kinds (``Gateway.client_errors``),
        when a gateway serves the port: what it refuses never reaches the app."""
        self.session_ends: Counter[tuple[str, bool]] = Counter()
        """Session-end signals by ``(via, held)``: ``endpoint`` or ``header``, and whether the
        session table held an entry for the session."""
        self.parent_placements: Counter[str] = Counter()
        """Sub-agents' first requests by what the parent rule did (``parent``, ``overloaded``,
        ``parent_unavailable``, ``parent_unknown``)."""
        self.session_count: Callable[[], int] | None = None
        """The session table's size (set by the proxy that owns the table)."""
        self.decision_s = Histogram(DECISION_BUCKETS_S)
        self.first_byte_s = Histogram(LATENCY_BUCKETS_S)
        self.request_s = Histogram(LATENCY_BUCKETS_S)

    def record_decision(
        self, d: Decision | PdDecision, label: str, source: str, prompt_tokens: int, seconds: float
    ) -> None:
        """Counts one routing decision (a ``Decision`` or a ``PdDecision``) and its latency."""
        self.count_decision(
            d.policy, label, d.first_turn, d.local_hit_tokens, d.global_hit_tokens, source, prompt_tokens, seconds
        )

    def count_decision(
        self,
        policy: str,
        label: str,
        first_turn: bool,
        local_hit: int,
        global_hit: int,
        source: str,
        prompt_tokens: int,
        seconds: float,
    ) -> None:
        """Counts one routing decision given by its parts (the compiled data plane's records)."""
        self.decision_s.observe(seconds)
        self.decisions[(policy, label, str(first_turn).lower())] += 1
        self.hit_tokens["local"] += local_hit
        self.hit_tokens["global"] += global_hit
        self.prompt_tokens[source] += prompt_tokens

    def client_error_counts(self) -> Counter[str]:
        """Refused client input by kind: the app's and, behind a gateway, the gateway's."""
        counts = Counter(self.client_errors)
        if self.door_client_errors is not None:
            for kind, n in self.door_client_errors():
                counts[kind] += n
        return +counts

    def response_counts(self) -> Counter[int]:
        """Responses by status: the app's and, behind a gateway, the door's whole answers that
        never reach it (a wrong method's 405, counted as its ``http_405`` kind)."""
        counts = Counter(self.responses)
        if self.door_client_errors is not None:
            for kind, n in self.door_client_errors():
                if kind in _DOOR_ANSWERS:
                    counts[_DOOR_ANSWERS[kind]] += n
        return +counts

    def render(self, in_flight: Mapping[str, int], ejected: Callable[[str], bool]) -> Iterator[str]:
        """The families in the text format; ``in_flight`` is the router's count per instance."""

        def name(n: str) -> str:
            return f"{self.prefix}_proxy_{n}"

        yield from _family(
            name("decisions_total"),
            "counter",
            "Routing decisions by policy, reason label and first-turn verdict.",
            [({"policy": p, "reason": r, "first_turn": f}, n) for (p, r, f), n in sorted(self.decisions.items())],
        )
        yield from _family(
            name("hit_tokens_total"),
            "counter",
            "Prompt tokens the chosen instance had cached (local) or the global tier held.",
            [({"tier": t}, n) for t, n in sorted(self.hit_tokens.items())],
        )
        yield from _family(
            name("prompt_tokens_total"),
            "counter",
            "Prompt tokens routed, by where the ids came from (ids, tokenizer, approximate).",
            [({"source": s}, n) for s, n in sorted(self.prompt_tokens.items())],
        )
        yield from self.decision_s.render(name("decision_seconds"), "Time of one routing decision.")
        yield from self.first_byte_s.render(
            name("upstream_first_byte_seconds"), "Upstream time to the first body byte (non-streamed: the answer)."
        )
        yield from self.request_s.render(name("request_seconds"), "Whole request time in the proxy.")
        yield from _family(
            name("retries_total"),
            "counter",
            "Attempts that failed before the first byte and were retried elsewhere, by cause.",
            [({"cause": c}, n) for c, n in sorted(self.retries.items())],
        )
        yield from _family(
            name("ejections_total"),
            "counter",
            "Instances ejected after consecutive failures.",
            [({"instance": i}, n) for i, n in sorted(self.ejections.items())],
        )
        yield from _family(
            name("readmissions_total"),
            "counter",
            "Ejected instances re-admitted by a /health probe.",
            [({"instance": i}, n) for i, n in sorted(self.readmissions.items())],
        )
        yield from _family(
            name("resumed_streams_total"),
            "counter",
            "Streams cut after their first chunk and continued on another instance.",
            [({}, self.resumed_streams)],
        )
        yield from _family(
            name("unresumed_streams_total"),
            "counter",
            "Streams cut after their first chunk that could not be continued (ended with the API's error event).",
            [({}, self.unresumed_streams)],
        )
        yield from _family(
            name("native_requests_total"),
            "counter",
            "Requests the compiled data plane (--data-plane compiled) served without the app, by API.",
            [({"api": a}, n) for a, n in sorted(self.native.items())],
        )
        yield from _family(
            name("responses_total"),
            "counter",
            "Responses sent to clients, by HTTP status.",
            [({"code": str(c)}, n) for c, n in sorted(self.response_counts().items())],
        )
        yield from _family(
            name("client_errors_total"),
            "counter",
            "Client input the proxy refused (malformed HTTP or body, slow head or body, connection limit), by kind.",
            [({"kind": k}, n) for k, n in sorted(self.client_error_counts().items())],
        )
        yield from _family(
            name("session_ends_total"),
            "counter",
            "Session-end signals (the endpoint or the header), by whether this proxy held state for the session.",
            [({"via": v, "held": str(h).lower()}, n) for (v, h), n in sorted(self.session_ends.items())],
        )
        if self.session_count is not None:
            yield from _family(
                name("sessions"),
                "gauge",
                "Sessions in the proxy's session table (turns and homes; bounded LRU with an idle TTL).",
                [({}, self.session_count())],
            )
        yield from _family(
            name("parent_placements_total"),
            "counter",
            "Sub-agents' first requests by the parent rule's outcome (parent: placed at the parent's home).",
            [({"outcome": o}, n) for o, n in sorted(self.parent_placements.items())],
        )
        yield from _family(
            name("instance_in_flight"),
            "gauge",
            "Requests routed to the instance and not finished (the router's load board).",
            [({"instance": i}, n) for i, n in in_flight.items()],
        )
        yield from _family(
            name("instance_ejected"),
            "gauge",
            "1 while the instance is ejected.",
            [({"instance": i}, float(ejected(i))) for i in in_flight],
        )
