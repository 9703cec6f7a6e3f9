"""What actually happened to each request: its id, its routing decision beside what the engine
then reported, and the opt-in JSON-lines decision log.

* **request id**: a client's ``x-request-id`` is kept when it is 1–128 characters of
  ``[A-Za-z0-9._:-]``, else one is minted (32 hex digits); it is forwarded to every engine the
  request reaches (vLLM takes it as its own request id) and returned on the answer;
* **the outcome** of a request (:class:`Outcome`): the decision of the attempt that answered
  (instance, reason, predicted local and global hit, first turn), the **realized hit** — the
  prompt tokens the engine says it served from cache, read by the API's adapter from the usage
  (:meth:`smetric.serve.apis.base.Api.realized_hit`, ``StreamState.cached_tokens``) — TTFT and
  the mean inter-token latency of a stream, the status;
* **metrics** (:class:`Outcomes`): a histogram of predicted − realized hit tokens (predicted: the
  larger of the local and the global hit), the follow-ups measured and those that got less than
  half of their predicted hit (the "wrong instance" rate), TTFT and inter-token latency
  histograms per model;
* **the decision log** (:class:`DecisionLog`, ``decision_log = "path"``): one JSON object a line
  per finished request, appended by a writer thread from a bounded queue — the event loop never
  writes to the file, and when the disk falls behind by ``max_pending`` lines the newest are
  dropped and counted, never the requests.

Invariants: recording is O(1) per request beyond one ``json.dumps`` when the log is on; model
labels are bounded (``MAX_MODELS``, then ``other``). May import: :mod:`smetric.serve.attempt`,
:mod:`smetric.serve.labels`, :mod:`smetric.serve.session`, :mod:`smetric.serve.telemetry`,
:mod:`smetric.metrics`, ``aiohttp.web``.
"""

from __future__ import annotations

import bisect
import json
import logging
import os
import queue
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from smetric.metrics import _family
from smetric.serve.attempt import Attempt
from smetric.serve.labels import reason_label
from smetric.serve.session import PARENT_HEADERS, session_hint
from smetric.serve.telemetry import LATENCY_BUCKETS_S

__all__ = [
    "HIT_ERROR_BUCKETS",
    "OUTCOME_KEY",
    "REQUEST_ID_HEADER",
    "DecisionLog",
    "Outcome",
    "Outcomes",
    "request_id",
    "with_request_id",
]

log = logging.getLogger("smetric.serve")

REQUEST_ID_HEADER = "x-request-id"
_SAFE_ID = re.compile(r"[A-Za-z0-9._:\-]{1,128}")
MAX_MODELS = 64
"""Model labels kept apart in the per-model histograms; later models share ``other``."""
HIT_ERROR_BUCKETS = (-16384, -4096, -1024, -256, -64, -16, -1, 0, 16, 64, 256, 1024, 4096, 16384)
"""Upper bounds (tokens) of the predicted − realized hit histogram: negative when the engine
served more from cache than the router expected."""
ITL_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0)


def request_id(given: str | None) -> str:
    """The client's id when it is safe (1–128 characters of ``[A-Za-z0-9._:-]``), else a new one."""
    if given is not None and _SAFE_ID.fullmatch(given):
        return given
    return os.urandom(16).hex()  # uuid4().hex's randomness, without building a UUID


@dataclass(slots=True)
class Outcome:
    """One request's record (a decision-log line; see the module docs)."""

    request_id: str
    api: str
    session: str | None
    parent: str | None
    """The parent agent's or thread's id when the client names one (the first of
    :data:`smetric.serve.session.PARENT_HEADERS` the request carries)."""
    started: float
    """``time.perf_counter()`` when the request arrived (not logged)."""
    model: str | None = None
    turn: int | None = None
    first_turn: bool | None = None
    instance: str | None = None
    prefill_instance: str | None = None
    """PD mode: the prefill instance (``instance`` is the decode one)."""
    reason: str | None = None
    detail: str | None = None
    predicted_local_hit: int | None = None
    predicted_global_hit: int | None = None
    cached_tokens: int | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    ttft_s: float | None = None
    itl_s: float | None = None
    attempts: int = 0
    status: int | None = None
    refused: str | None = None
    """The admission refusal's reason, when the request was refused."""
    latency_s: float | None = None
    grouping: str | None = None
    """A sub-agent's first request: what the parent rule did (``parent``: started at the
    parent's home; ``overloaded``, ``parent_unavailable``, ``parent_unknown``: placed as any)."""
    session_end: bool = False
    """The request was its session's last (``x-session-end: true``)."""

    def line(self) -> str:
        fields = asdict(self)
        del fields["started"]
        fields["ts"] = round(time.time(), 6)
        return json.dumps(fields, separators=(",", ":")) + "\n"


OUTCOME_KEY = web.RequestKey("smetric.outcome", Outcome)
"""Where a request keeps its :class:`Outcome` on its way through the proxy."""


def with_request_id(headers: dict[str, str], request: web.Request) -> dict[str, str]:
    """``headers`` (forwarded ones: a dict of the caller's own, changed in place) carrying the
    request's id instead of any the client sent."""
    outcome = request.get(OUTCOME_KEY)
    if outcome is None:
        return headers
    if REQUEST_ID_HEADER in request.headers:  # the client sent one (under any spelling): drop it
        for name in [k for k in headers if k.lower() == REQUEST_ID_HEADER]:
            del headers[name]
    headers[REQUEST_ID_HEADER] = outcome.request_id
    return headers


def note_prepared(request: web.Request, model: str | None, turn: int | None, prompt_tokens: int) -> None:
    """Records what the request asks for (called once it is ready to route)."""
    outcome = request.get(OUTCOME_KEY)
    if outcome is not None:
        outcome.model, outcome.turn, outcome.prompt_tokens = model, turn, prompt_tokens


def note_grouping(request: web.Request, grouping: str) -> None:
    """Records what the parent rule did with a sub-agent's first request."""
    outcome = request.get(OUTCOME_KEY)
    if outcome is not None:
        outcome.grouping = grouping


def note_attempt(request: web.Request, attempt: Attempt) -> None:
    """Records an attempt that opened (its decision; the last one is the one that answered)."""
    outcome = request.get(OUTCOME_KEY)
    if outcome is None:
        return
    outcome.attempts += 1
    outcome.instance = attempt.instance
    d: Any = attempt.decision
    if d is not None:
        outcome.first_turn = bool(d.first_turn)
        outcome.reason = reason_label(d.reason)
        outcome.detail = str(d.reason)
        outcome.predicted_local_hit = int(d.local_hit_tokens)
        outcome.predicted_global_hit = int(d.global_hit_tokens)
        outcome.prefill_instance = getattr(d, "prefill_instance", None)


def note_answer(
    request: web.Request, attempt: Attempt, *, cached_tokens: int | None, output_tokens: int | None
) -> None:
    """Records the answer an attempt delivered: the realized hit, and a stream's timing."""
    outcome = request.get(OUTCOME_KEY)
    if outcome is None:
        return
    outcome.cached_tokens = cached_tokens
    outcome.output_tokens = output_tokens
    if output_tokens is None:  # a whole answer: its first byte is its end, no TTFT to speak of
        return
    if attempt.first_byte_at is not None and outcome.ttft_s is None:
        outcome.ttft_s = attempt.first_byte_at - outcome.started
    if attempt.first_byte_at is not None and attempt.finished_at is not None and output_tokens >= 2:
        outcome.itl_s = (attempt.finished_at - attempt.first_byte_at) / (output_tokens - 1)


class _Histogram:
    """A histogram of fixed upper bounds (any sign)."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value

    def render(self, name: str, labels: Mapping[str, str]) -> Iterator[str]:
        inner = "".join(f'{k}="{v}",' for k, v in labels.items())
        running = 0
        for bound, n in zip(self.bounds, self.counts, strict=False):
            running += n
            yield f'{name}_bucket{{{inner}le="{bound!r}"}} {running}'
        total = sum(self.counts)
        yield f'{name}_bucket{{{inner}le="+Inf"}} {total}'
        suffix = "{" + inner.rstrip(",") + "}" if inner else ""
        yield f"{name}_sum{suffix} {self.sum!r}"
        yield f"{name}_count{suffix} {total}"


class DecisionLog:
    """JSON lines appended to a file by a writer thread, from a queue of at most ``max_pending``."""

    def __init__(self, path: str | Path, max_pending: int = 10_000) -> None:
        self.path = Path(path)
        self.dropped = 0
        """Lines dropped because the writer fell ``max_pending`` behind."""
        self._queue: queue.Queue[str | None] = queue.Queue(maxsize=max_pending)
        self._file = self.path.open("a", encoding="utf-8")  # fails early on a bad path
        self._thread = threading.Thread(target=self._write_loop, name="smetric-decision-log", daemon=True)
        self._thread.start()

    def write(self, line: str) -> None:
        """Queues a line (never blocks: a full queue drops it)."""
        try:
            self._queue.put_nowait(line)
        except queue.Full:
            self.dropped += 1

    def _write_loop(self) -> None:
        done = False
        while not done:
            batch = [self._queue.get()]
            while len(batch) < 1024:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            done = None in batch
            try:
                self._file.write("".join(line for line in batch if line is not None))
                self._file.flush()
            except OSError as e:  # a full disk must not take the proxy down: count what is lost
                self.dropped += len(batch) - done
                log.warning("decision log %s: %s", self.path, e)
        self._file.close()

    def close(self, timeout: float = 5.0) -> None:
        """Writes what is queued, then closes the file (blocking at most ``timeout``)."""
        try:
            self._queue.put(None, timeout=timeout)
        except queue.Full:
            log.warning("decision log %s: the writer is stuck; closing without it", self.path)
            return
        self._thread.join(timeout)


class Outcomes:
    """Finishes outcomes: the metrics, and the decision log when one is configured."""

    def __init__(
        self, decision_log: DecisionLog | None = None, served: Callable[[Outcome], None] | None = None
    ) -> None:
        self.log = decision_log
        self.served = served
        """Called with every finished outcome, whichever plane served it (the proxy keeps its
        sessions' homes from them)."""
        self.hit_error = _Histogram(HIT_ERROR_BUCKETS)
        self.realized_hit_tokens = 0
        self.followups_measured = 0
        self.followups_short = 0
        self.ttft: dict[str, _Histogram] = {}
        self.itl: dict[str, _Histogram] = {}

    def begin(self, request: web.Request, api: str) -> Outcome:
        """The request's outcome, kept on it, with its id accepted or minted."""
        hint = session_hint(request.headers)
        outcome = Outcome(
            request_id(request.headers.get(REQUEST_ID_HEADER)),
            api,
            None if hint is None else hint.key,
            next((request.headers[h] for h in PARENT_HEADERS if h in request.headers), None),
            time.perf_counter(),
        )
        request[OUTCOME_KEY] = outcome
        return outcome

    async def stamp(self, request: web.Request, response: web.StreamResponse) -> None:
        """``on_response_prepare``: the request's id on its answer."""
        outcome = request.get(OUTCOME_KEY)
        if outcome is not None:
            response.headers[REQUEST_ID_HEADER] = outcome.request_id

    def finish(
        self,
        outcome: Outcome,
        status: int,
        *,
        refused: str | None = None,
        latency_s: float | None = None,
        placed: bool = False,
    ) -> None:
        """Counts and logs a finished request (``latency_s``: measured elsewhere, else now −
        ``outcome.started``; ``placed``: its plane already kept what ``served`` would)."""
        outcome.status, outcome.refused = status, refused
        outcome.latency_s = time.perf_counter() - outcome.started if latency_s is None else latency_s
        if self.served is not None and not placed:
            self.served(outcome)
        # In PD mode the answer's usage is the decode instance's, which counts the KV it was sent
        # as cached: not the prefill hit the router predicted, so it is logged but not compared.
        compared = outcome.prefill_instance is None and outcome.predicted_local_hit is not None
        if outcome.cached_tokens is not None and compared:
            predicted = max(outcome.predicted_local_hit or 0, outcome.predicted_global_hit or 0)
            self.hit_error.observe(predicted - outcome.cached_tokens)
            self.realized_hit_tokens += outcome.cached_tokens
            if outcome.first_turn is False and predicted > 0:
                self.followups_measured += 1
                if 2 * outcome.cached_tokens < predicted:
                    self.followups_short += 1
        if outcome.ttft_s is not None or outcome.itl_s is not None:
            model = self._model_label(outcome.model)
            if outcome.ttft_s is not None:
                _per_model(self.ttft, model, LATENCY_BUCKETS_S).observe(outcome.ttft_s)
            if outcome.itl_s is not None:
                _per_model(self.itl, model, ITL_BUCKETS_S).observe(outcome.itl_s)
        if self.log is not None:
            self.log.write(outcome.line())

    def _model_label(self, model: str | None) -> str:
        name = model or ""
        if name in self.ttft or name in self.itl or len(self.ttft.keys() | self.itl.keys()) < MAX_MODELS:
            return name
        return "other"

    def close(self) -> None:
        if self.log is not None:
            self.log.close()

    def render(self, prefix: str = "smetric") -> Iterator[str]:
        """The outcome families in Prometheus' text format."""

        def name(n: str) -> str:
            return f"{prefix}_proxy_{n}"

        hist = name("hit_error_tokens")
        yield f"# HELP {hist} Predicted hit tokens (max of local and global) minus the engine's cached tokens."
        yield f"# TYPE {hist} histogram"
        yield from self.hit_error.render(hist, {})
        yield from _family(
            name("realized_hit_tokens_total"),
            "counter",
            "Prompt tokens the engines reported served from their cache (usage cached tokens).",
            [({}, self.realized_hit_tokens)],
        )
        yield from _family(
            name("followups_measured_total"),
            "counter",
            "Follow-ups with a predicted hit whose realized hit the engine reported.",
            [({}, self.followups_measured)],
        )
        yield from _family(
            name("followups_short_hit_total"),
            "counter",
            "Measured follow-ups whose realized hit was under half the predicted one (the wrong-instance rate).",
            [({}, self.followups_short)],
        )
        for family, per_model, help_text in (
            (name("ttft_seconds"), self.ttft, "Time to the first streamed byte, from the request's arrival."),
            (name("inter_token_seconds"), self.itl, "Mean time between a stream's tokens, per request."),
        ):
            if not per_model:
                continue
            yield f"# HELP {family} {help_text}"
            yield f"# TYPE {family} histogram"
            for model, histogram in sorted(per_model.items()):
                yield from histogram.render(family, {"model": _escape(model)})
        if self.log is not None:
            yield from _family(
                name("decision_log_dropped_total"),
                "counter",
                "Decision-log lines dropped because the writer fell behind.",
                [({}, self.log.dropped)],
            )


def _per_model(histograms: dict[str, _Histogram], model: str, bounds: tuple[float, ...]) -> _Histogram:
    """``model``'s histogram, made on its first use (not built on every request to be dropped,
    as ``setdefault`` would)."""
    histogram = histograms.get(model)
    if histogram is None:
        histogram = histograms[model] = _Histogram(bounds)
    return histogram


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
