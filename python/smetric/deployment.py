"""Router settings for a router in front of real engines (the proxy, Ray Serve, production-stack).

The core's defaults (``RouterConfig()``) describe the simulator's reference cluster, including
the seed's 1.5 TiB global KV$ store. A deployed router takes its sizes from the fleet instead:

* ``global_capacity_blocks`` is **0** unless the deployment declares a global tier (LMCache, a
  Mooncake store: set it to the store's size in blocks and feed it with
  :mod:`smetric.integrations`). A router that assumed a store a fleet does not have would move
  sessions to fetch prefixes that are nowhere (measured in ``tests/serve/test_e2e_fleet.py``:
  follow-ups kept at home fell from 93% to 71%).
* ``local_capacity_blocks`` is the engines' own GPU KV capacity when it is known (vLLM reports it
  as ``vllm:cache_config_info``; :func:`smetric.engine_load.kv_capacity_tokens`).

Fields the caller sets always win. Standard library only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def deployed_fields(
    fields: Mapping[str, Any], *, block_size: int, kv_capacity_tokens: int | None = None
) -> dict[str, Any]:
    """``RouterConfig`` keyword fields: ``fields`` with a deployment's sizes where it sets none."""
    out = dict(fields)
    if kv_capacity_tokens is not None and kv_capacity_tokens >= block_size:
        out.setdefault("local_capacity_blocks", kv_capacity_tokens // block_size)
    out.setdefault("global_capacity_blocks", 0)
    return out
