"""The disaggregated (PD) backend: prefill and decode instances, one :class:`smetric.PdRouter`,
and vLLM's disaggregated-prefill protocol (``docs/pd-and-tier.md`` §A.1).

One attempt, with ``smetric serve --prefill URL … --decode URL …``:

1. ``PdRouter.route`` names both instances (the prefill side by the policy — for ``smetric``:
   first turns balanced, follow-ups to where the session's KV$ lives —, the decode side by free
   KV and batch);
2. **prefill**: a copy of the body with ``kv_transfer_params = {"do_remote_decode": true,
   "do_remote_prefill": false, "remote_engine_id": null, "remote_block_ids": null,
   "remote_host": null, "remote_port": null}``, ``stream: false``, ``max_tokens: 1`` (and
   ``max_completion_tokens: 1`` when present), without ``stream_options``, ``min_tokens`` and
   ``min_completion_tokens``, and an ``X-Request-Id`` header; then ``on_prefilled``;
3. **decode**: the original body with the ``kv_transfer_params`` the prefill instance answered;
   its answer (a stream or whole) is the client's. ``on_transferred`` at its first byte, then
   ``on_finished`` or ``on_aborted``.

A failure before the decode instance's first byte — at either instance — aborts the attempt and
the next attempt routes both sides again without the failed instance (a decode retry needs a new
prefill: the old one's KV lease was for the failed decode instance). A prefill answer without
``kv_transfer_params`` (an engine started without a KV connector) counts as that instance's
failure. A 4xx from the prefill instance is the client's answer.

The router's prefill index is its own (insert on route): no KV-event feed; the engine load of the
prefill pool is scraped into the PD router. Instances cannot be added at run time.
May import: what :mod:`.base` may.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from aiohttp import web

from smetric._core import PdDecision, PdRouter
from smetric.errors import SmetricError
from smetric.metrics import _family
from smetric.serve.apis.base import Prepared
from smetric.serve.attempt import Attempt
from smetric.serve.backends.base import NO_INSTANCE, Answered, Backend, OpenOutcome, decide, open_unrouted
from smetric.serve.fleet import FeedTargets, Fleet
from smetric.serve.labels import reason_label
from smetric.serve.session import AFFINITY_POLICY, HASH_POLICIES, affinity_set_cookie
from smetric.serve.telemetry import ProxyTelemetry
from smetric.serve.upstream import RETRYABLE, Refused, Upstream, answer_headers

__all__ = [
    "REMOTE_DECODE_PARAMS",
    "PdBackend",
    "decode_body",
    "kv_params_of",
    "pd_decision_header",
    "prefill_body",
    "prefill_headers",
]

REMOTE_DECODE_PARAMS: dict[str, Any] = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}
"""What the prefill request carries (vLLM's NIXL proxy)."""


def prefill_body(body: Mapping[str, Any], overrides: Mapping[str, Any] | None = None) -> bytes:
    """The prefill instance's copy of a request body (``overrides``: the API's own fields)."""
    out = dict(body)
    out.update(overrides or {})
    out["kv_transfer_params"] = dict(REMOTE_DECODE_PARAMS)
    out["stream"] = False
    out["max_tokens"] = 1
    if "max_completion_tokens" in out:
        out["max_completion_tokens"] = 1
    for key in ("stream_options", "min_tokens", "min_completion_tokens"):
        out.pop(key, None)
    return json.dumps(out).encode()


def decode_body(body: Mapping[str, Any], kv_transfer_params: Mapping[str, Any]) -> bytes:
    """The decode instance's body: the original with the prefill's ``kv_transfer_params``."""
    return json.dumps({**body, "kv_transfer_params": dict(kv_transfer_params)}).encode()


def prefill_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The forwarded headers plus a fresh ``X-Request-Id`` (the id both sides log)."""
    out = {k: v for k, v in headers.items() if k.lower() != "x-request-id"}
    out["X-Request-Id"] = str(uuid.uuid4())
    return out


def kv_params_of(answer: bytes) -> dict[str, Any] | None:
    """The ``kv_transfer_params`` of a prefill answer, or None (no connector, not JSON)."""
    try:
        doc = json.loads(answer)
    except ValueError:
        return None
    params = doc.get("kv_transfer_params") if isinstance(doc, dict) else None
    return params if isinstance(params, dict) else None


def pd_decision_header(d: PdDecision, *, attempt: int, source: str) -> str:
    """``x-smetric-decision`` of a PD decision: the decode instance as ``instance``, plus ``prefill``."""
    return (
        f"instance={d.decode_instance}; prefill={d.prefill_instance}; reason={reason_label(d.reason)}; "
        f"first_turn={int(d.first_turn)}; local_hit_tokens={d.local_hit_tokens}; "
        f"global_hit_tokens={d.global_hit_tokens}; transfer_tokens={d.transfer_tokens}; "
        f'policy={d.policy}; decode_rule={d.decode_rule}; detail="{d.reason}"; attempt={attempt}; tokens={source}'
    )


class PdBackend(Backend):
    """A PD router over a prefill and a decode pool (see the module docs)."""

    def __init__(
        self,
        pd: PdRouter,
        prefill: frozenset[str],
        decode: frozenset[str],
        fleet: Fleet,
        upstream: Upstream,
        telemetry: ProxyTelemetry,
    ) -> None:
        self.pd = pd
        self.session_cookie = pd.policy == AFFINITY_POLICY
        self.hashes_session = pd.policy in HASH_POLICIES
        self.prefill_pool = prefill
        self.decode_pool = decode
        self.pools = (prefill, decode)
        self._fleet = fleet
        self._upstream = upstream
        self._telemetry = telemetry

    async def open(
        self, prepared: Prepared[Any], headers: Mapping[str, str], attempt_no: int, exclude: list[str]
    ) -> OpenOutcome:
        """One PD attempt: prefill, then open the decode answer."""
        pd, tokens = self.pd, prepared.tokens
        if not prepared.routed or prepared.pin is not None:
            # A pinned request names state only its instance holds (the decode instance that
            # answered): it is served there whole, prefill included, and not disaggregated.
            candidates = [*self.decode_pool, *self.prefill_pool]
            return await open_unrouted(self, self._upstream, candidates, prepared, headers, attempt_no, exclude)
        d = decide(pd.route, prepared, exclude, self._telemetry)
        if d is None:
            return NO_INSTANCE
        rid = d.request_id
        attempt = Attempt(
            d.decode_instance,
            pd_decision_header(d, attempt=attempt_no, source=tokens.source),
            first_byte=lambda: pd.on_transferred(rid),
            finish=lambda n: pd.on_finished(rid, n),
            abort=lambda: pd.on_aborted(rid),
            decision=d,
            # The cookie names the prefill instance: the core's session affinity is to one.
            cookie=(
                affinity_set_cookie(prepared.previous_instance, d.prefill_instance, ended=prepared.ends_session)
                if self.session_cookie
                else None
            ),
        )
        original = json.loads(prepared.body)
        # The prefill leg has no lifecycle of its own: its failure aborts the whole attempt.
        prefill = Attempt(d.prefill_instance, attempt.header, abort=attempt.abort)
        opened = await self._upstream.post(
            prefill, prepared.path, prefill_body(original, prepared.prefill_overrides), prefill_headers(headers)
        )
        if isinstance(opened, Refused):
            return opened
        answer_of_p = opened.upstream
        try:
            answer = await answer_of_p.read()
        except RETRYABLE as e:
            attempt.abort()
            return Refused(d.prefill_instance, type(e).__name__)
        finally:
            answer_of_p.release()
        if 400 <= answer_of_p.status < 500:  # the client's error: its answer
            attempt.finish(0)
            hdrs = answer_headers(answer_of_p.headers, attempt)
            return Answered(web.Response(body=answer, status=answer_of_p.status, headers=hdrs))
        params = kv_params_of(answer)
        if params is None:
            attempt.abort()
            return Refused(d.prefill_instance, "no_kv_transfer_params")
        self._fleet.succeeded(d.prefill_instance)
        pd.on_prefilled(rid)
        return await self._upstream.post(attempt, prepared.path, decode_body(original, params), headers)

    def feed_targets(self) -> FeedTargets:
        return FeedTargets(events=None, load=self.pd, scraped=self.prefill_pool, on_readmitted=lambda _: None)

    def in_flight(self, urls: Iterable[str]) -> dict[str, int]:
        decode = self.pd.stats()["decode"]
        out = {}
        for url in urls:
            try:
                out[url] = self.pd.load(url)["batch_size"] if url in self.prefill_pool else decode[url]["batch_size"]
            except (SmetricError, KeyError):
                continue
        return out

    def metrics_text(self, subscriber: Any, scraper: Any) -> str:
        return ""  # the PD router's counters are in metric_lines

    def metric_lines(self) -> list[str]:
        """The PD router's counters (``PdRouter.stats()``) in the text format."""
        stats: Mapping[str, Any] = self.pd.stats()
        lines: list[str] = []
        for key, kind, help_text in (
            ("routed", "counter", "PD decisions."),
            ("transfer_tokens", "counter", "Prompt tokens the decisions send from prefill to decode instances."),
            ("in_flight", "gauge", "PD requests routed and not finished."),
            ("unknown_request_events", "counter", "PD lifecycle calls for unknown request ids."),
        ):
            name = f"smetric_pd_{key}" + ("_total" if kind == "counter" and not key.endswith("_total") else "")
            lines += _family(name, kind, help_text, [({}, float(stats[key]))])
        for field in ("batch_size", "reserved_blocks", "pulling", "kv_usage"):
            lines += _family(
                f"smetric_pd_decode_{field}",
                "gauge",
                f"Decode instance {field.replace('_', ' ')} (the PD router's view).",
                [({"instance": url}, float(d[field])) for url, d in stats["decode"].items()],
            )
        return lines
