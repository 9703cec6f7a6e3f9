"""The fake engine's disaggregated prefill/decode roles, against vLLM's NIXL proxy protocol."""

from __future__ import annotations

import json
import time
from typing import Any

from fake_engine_util import post

from smetric.fake_engine import FakeEngine

PROMPT = list(range(1, 1000))


def prefill_body(**extra: Any) -> dict[str, Any]:
    params = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None}
    params |= {"remote_block_ids": None, "remote_host": None, "remote_port": None}
    return {"prompt": PROMPT, "max_tokens": 1, "stream": False, "kv_transfer_params": params, **extra}


def test_prefill_holds_its_blocks_until_the_decode_engine_pulls_them() -> None:
    with (
        FakeEngine(port=0, role="prefill", speedup=1000) as p,
        FakeEngine(port=0, role="decode", speedup=1000) as d,
    ):
        status, body = post(p.url, "/v1/completions", prefill_body())
        assert status == 200
        answer = json.loads(body)
        params = answer["kv_transfer_params"]
        assert params["do_remote_prefill"] is True and params["do_remote_decode"] is False
        assert params["remote_num_tokens"] == len(PROMPT) and params["transfer_mode"] == "pull"
        assert (params["remote_host"], params["remote_port"]) == ("127.0.0.1", p.stack.port if p.stack else None)
        held = p.call(lambda: p.stack.engine.cache.used_blocks if p.stack else -1)
        assert held == -(-(len(PROMPT) + 1) // 16), "P holds every block of the request (its partial one too)"

        status, body = post(d.url, "/v1/completions", {"prompt": PROMPT, "max_tokens": 8, "kv_transfer_params": params})
        assert status == 200, body
        usage = json.loads(body)["usage"]
        assert usage["completion_tokens"] == 8
        assert usage["prompt_tokens_details"]["cached_tokens"] == len(PROMPT) // 16 * 16, "D computed only the tail"
        assert p.call(lambda: p.stack.engine.cache.used_blocks if p.stack else -1) == 0, "freed once read"

        again = post(d.url, "/v1/completions", {"prompt": PROMPT, "max_tokens": 8, "kv_transfer_params": params})
        assert again[0] == 400 and "kv_transfer_params refused" in json.loads(again[1])["error"]["message"]
        forged = {**params, "remote_engine_id": "someone-else"}
        assert post(d.url, "/v1/completions", {"prompt": PROMPT, "kv_transfer_params": forged})[0] == 400


def test_a_decode_engine_refuses_peers_outside_its_fleet_and_expired_leases() -> None:
    with (
        FakeEngine(port=0, role="prefill", speedup=1000, kv_lease_s=0.2) as p,
        FakeEngine(port=0, role="decode", speedup=1000, kv_peers=("127.0.0.1:1",)) as outsider,
        FakeEngine(port=0, role="decode", speedup=1000) as d,
    ):
        params = json.loads(post(p.url, "/v1/completions", prefill_body())[1])["kv_transfer_params"]
        status, body = post(outsider.url, "/v1/completions", {"prompt": PROMPT, "kv_transfer_params": params})
        assert status == 400 and "not a prefill engine of this fleet" in json.loads(body)["error"]["message"]
        # Wait for the condition itself: the lease's own expiry time (wall clock, as vLLM's) has passed.
        expiry = params["remote_blocks_expiry_time"]
        assert expiry - time.time() <= 0.2 + 1.0, "the lease is kv_lease_s long"
        while time.time() <= expiry:
            time.sleep(min(0.01, max(0.0, expiry - time.time())))
        assert post(d.url, "/v1/completions", {"prompt": PROMPT, "kv_transfer_params": params})[0] == 400, "expired"
        assert p.call(lambda: p.stack.engine.cache.used_blocks if p.stack else -1) == 0
        other = post(d.url, "/v1/completions", {"prompt": PROMPT, "max_tokens": 2})
        assert other[0] == 200, "without kv_transfer_params a decode engine serves the request itself"


def test_a_streamed_prefill_for_remote_decode_is_refused() -> None:
    with FakeEngine(port=0, role="prefill", speedup=1000) as p:
        assert post(p.url, "/v1/completions", prefill_body(stream=True))[0] == 400
