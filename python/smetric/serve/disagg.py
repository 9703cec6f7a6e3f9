"""Disaggregated prefill/decode in the proxy: vLLM's PD protocol (``docs/pd-and-tier.md`` §A.1).

One attempt of a request, with ``smetric serve --prefill URL … --decode URL …``:

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
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from typing import Any

REMOTE_DECODE_PARAMS: dict[str, Any] = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}
"""What the prefill request carries (vLLM's NIXL proxy)."""


def prefill_body(body: Mapping[str, Any]) -> bytes:
    """The prefill instance's copy of a request body."""
    out = dict(body)
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


def pd_decision_header(d: Any, *, attempt: int, source: str) -> str:
    """``x-smetric-decision`` of a PD decision: the decode instance as ``instance``, plus ``prefill``."""
    from smetric.serve.proxy import reason_label

    return (
        f"instance={d.decode_instance}; prefill={d.prefill_instance}; reason={reason_label(d.reason)}; "
        f"first_turn={int(d.first_turn)}; local_hit_tokens={d.local_hit_tokens}; "
        f"global_hit_tokens={d.global_hit_tokens}; transfer_tokens={d.transfer_tokens}; "
        f'policy={d.policy}; decode_rule={d.decode_rule}; detail="{d.reason}"; attempt={attempt}; tokens={source}'
    )
