"""The fake engine's disaggregated prefill/decode roles, against vLLM's NIXL proxy protocol."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from fake_engine_util import post

from smetric._core import PerfModel, load_workload, sim_pd_defaults, simulate
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


@pytest.mark.parametrize("profile", ["h20-qwen3-coder-30b-a3b", "h20-qwen3-235b-a22b-fp8-tp4"])
def test_a_pull_takes_the_simulators_time_for_the_same_profile(profile: str, tmp_path: Path) -> None:
    # The simulator: one 4096-token request on 1 prefill + 1 decode instance, nothing else on
    # the link; its pull time is the report's transfer time plus the fixed latency after it.
    prompt_tokens = 4096
    row = {"request_id": 1, "prev_request_id": -1, "session_id": "s", "root_session_id": "s", "turn": 1, "t": 0.0,
           "input_length": prompt_tokens, "output_length": 4, "hash_ids": list(range(1, prompt_tokens // 64 + 1)),
           "think_time": 0.0, "api_time": 0.0, "session_tool_tokens": 0, "session_system_tokens": 0}  # fmt: skip
    trace = tmp_path / "one.jsonl"
    trace.write_text(json.dumps(row) + "\n")
    pd = {**sim_pd_defaults(), "prefill_instances": 1, "decode_instances": 1}
    config = {"profile": profile, "instances": 2, "pd": pd, "global_tier": {"enabled": False}}
    report = simulate(load_workload(str(trace), "weka"), "round_robin", config=config)
    assert report["pd"] is not None and report["pd"]["transfers"] == 1
    simulated = report["pd"]["transfer_time"]["p50"] + pd["transfer_latency_s"]
    # The fake engines, same profile: the decode engine pulls the same 4096 tokens.
    prompt = list(range(10_000, 10_000 + prompt_tokens))
    with (
        FakeEngine(port=0, role="prefill", speedup=1000, profile=profile) as p,
        FakeEngine(port=0, role="decode", speedup=1000, profile=profile) as d,
    ):
        params = json.loads(post(p.url, "/v1/completions", {**prefill_body(), "prompt": prompt})[1])[
            "kv_transfer_params"
        ]
        assert (
            post(d.url, "/v1/completions", {"prompt": prompt, "max_tokens": 2, "kv_transfer_params": params})[0] == 200
        )
        pulled, modelled = d.call(lambda: (d.stack.decode.tokens_pulled, d.stack.decode.modelled_pull_s))
    tokens_simulated = report["pd"]["transfer_bytes"] / PerfModel(profile).kv_bytes_per_token
    assert pulled == prompt_tokens == pytest.approx(tokens_simulated)
    assert modelled == pytest.approx(simulated, rel=1e-9)
    assert modelled == PerfModel(profile).pd_pull_time(prompt_tokens)
