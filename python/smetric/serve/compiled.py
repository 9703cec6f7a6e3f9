"""The control plane's side of the compiled data plane (``rust/smetric-gateway``,
``docs/proxy-data-plane.md``): what arms the gateway's native path, what the app learns from it.

* :func:`native_settings` arms the native path for the APIs it can serve exactly as this
  proxy would: chat, Anthropic Messages and OpenAI Responses (a stored response's follow-ups
  pinned to their instance) when routing ids are the approximate ids (``--tokens approximate``, any chunk size) of plain
  ChatML or of a chat template, or the tokenizer's (``--tokens tokenizer``) — a template the
  gateway renders itself (:func:`gateway_token_source`: the same files the app resolved) —
  completions when text prompts are routed that way too (token-id prompts always are; in ids
  mode, ``--tokens ids``, only those, the gateway refusing the rest as the app words it);
  co-located instances, or a PD fleet (the gateway speaks vLLM's disaggregated-prefill protocol as
  :mod:`smetric.serve.backends.pd` does; without session admission, whose stage is co-located),
  over HTTP or TLS (the gateway verifies https engines against the system's roots, as the app's
  client does; vllm-router's hash policies get the header session hint and llm-d's
  session-affinity policy its cookie as the app gives them, and its answers set the cookie as the
  app's do). The gateway admits every request and delegates to the app what its native path
  does not answer (the control plane's endpoints, and the few bodies listed in
  ``docs/proxy-data-plane.md``, stage 6).
* :class:`CompiledPlane` keeps the gateway and the app in step: the fleet's view (instances,
  ejections, models, adapters) is pushed to the gateway whenever the fleet changes, and the
  gateway's records — one per request it served natively — are taken into the app's
  telemetry, the fleet's health and the decision log, as the app's own requests are: when the
  gateway rings (:meth:`Gateway.records_fd` turns readable; no wake-up while it serves
  nothing), at most once per :data:`DRAIN_INTERVAL_S`, and before ``/metrics`` renders.

The app trusts what the gateway's headers say (admitted, refused, a cut stream to continue
and the instance that cut it) only with the gateway's per-process secret (:meth:`CompiledPlane.vouches`).

Cost: O(records) per drain on the app's loop, none on the request path; an idle gateway costs
the loop nothing (the 20 Hz timer it replaces cost ≈ 5 ms of CPU a second on this VM). May import:
:mod:`smetric.serve.admission`, ``.backends``, ``.decision_log``, ``.fleet``, ``.labels``,
``.telemetry``, ``.tokens``, ``.upstream``, ``.config``.
"""

from __future__ import annotations

import asyncio
import hmac
import os
from collections.abc import Iterator, Mapping

from smetric._core import (
    GATEWAY_ADMITTED_HEADER,
    GATEWAY_HEADER,
    GATEWAY_REFUSED_HEADER,
    GATEWAY_SESSION_END_RECORD,
    GATEWAY_TURN_HEADER,
    Gateway,
    GatewayNative,
    GatewayRecord,
    GatewayTokenSource,
    PdRouter,
    Router,
    SessionTable,
)
from smetric.metrics import _family
from smetric.serve.admission import WAIT_BUCKETS_S, render_admission
from smetric.serve.config import ServeConfig
from smetric.serve.decision_log import Outcome, Outcomes
from smetric.serve.fleet import Fleet
from smetric.serve.labels import core_reasons, reason_label
from smetric.serve.telemetry import Histogram, ProxyTelemetry
from smetric.serve.tokens import TokenSource

__all__ = [
    "DRAIN_INTERVAL_S",
    "MAX_RECORDS",
    "CompiledPlane",
    "DoorAdmission",
    "gateway_token_source",
    "native_settings",
    "new_secret",
    "plane_summary",
]

DRAIN_INTERVAL_S = 0.25
"""How often at most the app takes the gateway's records (a busy gateway rings on every
request: the takes are paced, the records batched)."""

MAX_RECORDS = 65_536
"""Records the gateway keeps for the app at most (a stalled app: the oldest are dropped)."""


def new_secret() -> str:
    """A per-process secret the gateway sends the app on every request."""
    return os.urandom(16).hex()


def native_settings(
    config: ServeConfig,
    router: Router | PdRouter,
    tokens: TokenSource,
    secret: str,
    client_keys: list[str],
    response_id_key: str,
    sessions: SessionTable,
) -> GatewayNative:
    """What arms the native path for this proxy (see the module docs); ``router`` is the
    backend's (co-located or PD); ``response_id_key`` the key the app's Responses adapter issues
    its ids with; ``sessions`` the app's session table, which the native path reads and writes
    too. Every token mode has one: the tokenizer's (``tokens.kind == "tokenizer"`` always names
    a tokenizer file), the approximate ids (with or without a template), token ids."""
    source = gateway_token_source(tokens)
    ids_only = tokens.kind == "ids"
    # In ids mode only completions with token-id prompts are routed; the gateway refuses the rest
    # (the conversation APIs' requests always: they carry no ids).
    chat = ids_only or source is not None or tokens.renders_plain_chatml
    return GatewayNative(
        router,
        secret=secret,
        client_keys=client_keys,
        upstream_key=config.upstream_api_key,
        max_body_bytes=config.max_body_bytes,
        body_timeout_s=config.body_timeout_s,
        connect_timeout_s=config.connect_timeout_s,
        first_byte_timeout_s=config.first_byte_timeout_s,
        idle_timeout_s=config.idle_timeout_s,
        client_timeout_s=config.client_timeout_s,
        max_in_flight=config.max_in_flight,
        max_in_flight_per_instance=config.max_in_flight_per_instance,
        queue_size=config.queue_size,
        queue_timeout_s=config.queue_timeout_s,
        chat=chat,
        completions=True,
        messages=chat,
        responses=chat,
        response_id_key=response_id_key,
        resume_streams=config.resume_streams,
        max_attempts=config.max_attempts,
        eject_after=config.eject_after,
        labels={reason: reason_label(reason) for reason in core_reasons()},
        max_records=MAX_RECORDS,
        session_admission=config.session_admission,
        session_capacity_tokens=config.session_capacity_tokens or 0,
        session_max_held=config.session_max_held,
        session_hold_timeout_s=config.session_hold_timeout_s,
        session_max_hold_s=config.session_max_hold_s,
        tokens=source,
        ids_only=ids_only,
        sessions=sessions,
        parent_affinity_margin=config.parent_affinity_margin if config.parent_affinity else None,
        approx_chunk_bytes=tokens.config.approx_chunk_bytes,
    )


def plane_summary(native: GatewayNative) -> str:
    """The start-up log's words for the data plane: the APIs the gateway serves natively
    (``compiled (native: chat, completions, messages, responses)``)."""
    return f"compiled (native: {', '.join(native.apis)})"


def gateway_token_source(
    tokens: TokenSource, build: type[GatewayTokenSource] = GatewayTokenSource
) -> GatewayTokenSource | None:
    """The gateway's source of a chat template's routing ids — the same tokenizer, templates and
    special tokens the app resolved: in tokenizer mode, or in approximate mode (any chunk size)
    with a chat template; None otherwise (plain ChatML and token ids need none). ``build``: the
    class made (a benchmark passes another build's, ``benches/python/other_build.py``)."""
    templates = tokens.templates
    if tokens.kind == "tokenizer" and tokens.config.tokenizer is not None:
        tokenizer: str | None = tokens.config.tokenizer
    elif tokens.kind == "approximate" and templates:
        tokenizer = None
    else:
        return None
    special = next(iter(templates.values())).special_tokens if templates else {}
    return build(
        tokenizer,
        templates=[(name, t.source, t.content_format) for name, t in templates.items()],
        special_tokens=list(special.items()),
        piece_cache_bytes=tokens.config.piece_cache_bytes,
        approx_chunk_bytes=tokens.config.approx_chunk_bytes,
    )


class DoorAdmission:
    """The gateway's admission as the app reads it: the slots held and the requests queued at the door."""

    def __init__(self, gateway: Gateway) -> None:
        self._gateway = gateway

    @property
    def admitted(self) -> int:
        return int(self._gateway.admitted())

    @property
    def queued(self) -> int:
        return int(self._gateway.admission()["queued"])


class CompiledPlane:
    """The app's link to its gateway (see the module docs)."""

    def __init__(
        self,
        gateway: Gateway,
        secret: str,
        *,
        app_port: int,
        fleet: Fleet,
        telemetry: ProxyTelemetry,
        outcomes: Outcomes,
    ) -> None:
        self.gateway = gateway
        self.app_port = app_port
        """The app's loopback port, which only the gateway addresses."""
        self._secret = secret
        self._fleet = fleet
        self._telemetry = telemetry
        self._outcomes = outcomes
        self._loop: asyncio.AbstractEventLoop | None = None
        self._paced: asyncio.TimerHandle | None = None
        self._records_fd = -1
        self.admission = DoorAdmission(gateway)

    def start(self) -> None:
        self._fleet.on_change = self.sync_fleet
        self.sync_fleet()
        self._loop = asyncio.get_running_loop()
        self._records_fd = self.gateway.records_fd()
        self._loop.add_reader(self._records_fd, self._rung)

    async def close(self) -> None:
        if self._loop is not None:
            self._loop.remove_reader(self._records_fd)
            self._loop = None
        if self._paced is not None:
            self._paced.cancel()
        self.drain()

    def vouches(self, headers: Mapping[str, str]) -> bool:
        """Whether a request came from the gateway (its secret, compared in constant time)."""
        given = headers.get(GATEWAY_HEADER)
        return given is not None and hmac.compare_digest(given, self._secret)

    def delegation_headers(self) -> dict[str, str]:
        """The fields the gateway puts on a request it hands to the app after admitting it (its
        secret among them): what a test sends the app to see what it answers a delegated body."""
        return {GATEWAY_HEADER: self._secret, GATEWAY_ADMITTED_HEADER: "1"}

    @staticmethod
    def admitted(headers: Mapping[str, str]) -> bool:
        return GATEWAY_ADMITTED_HEADER in headers

    @staticmethod
    def refused(headers: Mapping[str, str]) -> str | None:
        return headers.get(GATEWAY_REFUSED_HEADER)

    @staticmethod
    def counted_turn(headers: Mapping[str, str]) -> int | None:
        """The turn the gateway counted in the shared session table for a request it handed on
        (None: it counted none; the app counts as usual)."""
        value = headers.get(GATEWAY_TURN_HEADER)
        return int(value) if value is not None and value.isdigit() else None

    def sync_fleet(self) -> None:
        """Pushes the fleet's current view to the gateway."""
        fleet = self._fleet
        self.gateway.set_fleet(
            list(fleet.instances),
            {url for url, health in fleet.health.items() if health.ejected},
            {model: set(urls) for model, urls in fleet.models.items()},
            set(fleet.adapters),
        )

    def _rung(self) -> None:
        """The gateway rang: take its records, then stop listening until the pace allows
        another take (:data:`DRAIN_INTERVAL_S`); a ring meanwhile waits on the descriptor."""
        loop = self._loop
        if loop is None:
            return
        self.drain()
        loop.remove_reader(self._records_fd)
        self._paced = loop.call_later(DRAIN_INTERVAL_S, self._listen)

    def _listen(self) -> None:
        self._paced = None
        if self._loop is not None:
            self._loop.add_reader(self._records_fd, self._rung)

    def drain(self) -> None:
        """Takes the gateway's records into the app's telemetry, fleet and decision log."""
        for record in self.gateway.take_records():
            self._apply(record)

    def _apply(self, r: GatewayRecord) -> None:
        telemetry, fleet = self._telemetry, self._fleet
        if r.api == GATEWAY_SESSION_END_RECORD:  # an end endpoint the gateway answered: no request to log
            telemetry.session_ends[("endpoint", bool(r.session_end_held))] += 1
            telemetry.native[r.api] += 1
            return
        reason = r.reason
        label = None if reason is None else reason_label(reason)
        if reason is not None:
            telemetry.count_decision(
                r.policy or "",
                label or "",
                bool(r.first_turn),
                r.predicted_local_hit or 0,
                r.predicted_global_hit or 0,
                r.tokens_source or "",
                r.prompt_tokens or 0,
                r.decision_s or 0.0,
            )
        if r.prefill_instance is not None:  # PD: the prefill leg was answered
            fleet.succeeded(r.prefill_instance)
        if r.grouping is not None:
            telemetry.parent_placements[r.grouping] += 1
        if r.session_end_held is not None:  # the gateway released the session's state
            telemetry.session_ends[("header", r.session_end_held)] += 1
        # The gateway's failover (attempts before the client's first byte): counted as retries,
        # charged where it charged them, its ejections mirrored (the probes re-admit).
        for url, cause, charged in r.failures:
            fleet.retried(cause)
            if charged:
                fleet.charge(url, cause)
        for url in r.ejected:
            fleet.eject(url)
        instance = r.instance
        if r.unresumed:
            telemetry.unresumed_streams += 1
        telemetry.resumed_streams += r.resumed
        if r.succeeded and instance is not None:
            fleet.succeeded(instance)
        if r.first_byte_s is not None:
            telemetry.first_byte_s.observe(r.first_byte_s)
        status = r.status
        if r.refused is None:  # a refusal at the door is answered there, not served
            telemetry.native[r.api] += 1
        telemetry.responses[status] += 1
        telemetry.request_s.observe(r.latency_s)
        outcome = Outcome(
            r.request_id,
            r.api,
            r.session,
            r.parent,
            0.0,
            model=r.model,
            turn=r.turn,
            first_turn=r.first_turn,
            instance=instance,
            reason=label,
            detail=reason,
            predicted_local_hit=r.predicted_local_hit,
            predicted_global_hit=r.predicted_global_hit,
            cached_tokens=r.cached_tokens,
            prompt_tokens=r.prompt_tokens,
            output_tokens=r.output_tokens,
            ttft_s=r.ttft_s,
            itl_s=r.itl_s,
            attempts=r.attempts,
            grouping=r.grouping,
            session_end=r.session_end_held is not None,
        )
        # The gateway placed the session's home as it answered (the table is shared).
        self._outcomes.finish(outcome, status, refused=r.refused, latency_s=r.latency_s, placed=True)

    def end_session(self, key: str) -> None:
        """Releases session ``key`` at the gateway's session gate (the table is shared)."""
        self.gateway.end_session(key)

    def render_admission(self, prefix: str = "smetric") -> Iterator[str]:
        """The door's admission families (the app's own admission then admits nothing)."""
        a = self.gateway.admission()
        wait = Histogram(WAIT_BUCKETS_S)
        wait.counts = list(a["wait_counts"])
        wait.sum = float(a["wait_sum_s"])
        yield from render_admission(a["admitted"], a["capacity"], a["queued"], wait, a["rejections"], prefix)
        yield from self.render_session_admission(prefix)

    def render_session_admission(self, prefix: str = "smetric") -> Iterator[str]:
        """The session admission's families (nothing when it is off)."""
        s = self.gateway.session_admission()
        if s is None:
            return

        def name(n: str) -> str:
            return f"{prefix}_proxy_session_admission_{n}"

        yield from _family(
            name("decisions_total"),
            "counter",
            "The session-admission stage's answers: admitted where the policy sent it, moved to another"
            " instance with room, held (a request held n times counts n).",
            [({"verdict": v}, s[v]) for v in ("admitted", "moved", "held")],
        )
        yield from _family(
            name("released_total"),
            "counter",
            "Requests admitted where the policy sent them without KV room, once their longest hold ran out.",
            [({}, s["released"])],
        )
        yield from _family(
            name("paused_total"), "counter", "Idle sessions paused to make KV room.", [({}, s["paused"])]
        )
        yield from _family(name("held"), "gauge", "Requests waiting for KV room now.", [({}, s["holding"])])
        yield from _family(
            name("rejections_total"),
            "counter",
            "Requests session admission refused (held_full: 429; hold_timeout: 503).",
            [({"reason": r}, s[r]) for r in ("held_full", "hold_timeout")],
        )
