"""Hints the proxy reads from the fleet and the agents: a LoRA adapter's requests get their own
cache namespace (the adapters read from the fleet's ``/v1/models``), and Codex's per-thread
``thread-id`` is the session key, its parent thread recorded. Bounded: a few requests to one fake
engine in process."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from proxy_util import metric, request

from smetric.fake_engine import FakeEngine
from smetric.serve.config import load_config
from smetric.serve.proxy import ProxyServer
from smetric.serve.session import session_hint
from smetric.vllm import cache_namespace

SYSTEM = {"role": "system", "content": "You are a careful SQL agent. " * 40}


def decision(headers: dict[str, str]) -> dict[str, str]:
    return {k: v.strip('"') for k, _, v in (p.partition("=") for p in headers["x-smetric-decision"].split("; "))}


def test_codex_threads_are_sessions_of_their_own() -> None:
    tree = {"session-id": "tree-1"}
    assert session_hint(tree) is not None and session_hint(tree).key == "tree-1"  # type: ignore[union-attr]
    one = session_hint({**tree, "thread-id": "thread-a"})
    two = session_hint({**tree, "thread-id": "thread-b", "x-codex-parent-thread-id": "thread-a"})
    assert one is not None and two is not None
    assert (one.key, one.source, two.key) == ("thread-a", "thread-id", "thread-b"), "sub-agents do not merge"


def test_a_lora_adapters_requests_are_routed_in_its_own_namespace(tmp_path: Path) -> None:
    engine = FakeEngine(port=0, speedup=1000, lora_modules=("sql=/adapters/sql",)).start()
    url = engine.url
    log_path = tmp_path / "decisions.jsonl"
    try:
        config = load_config(
            instances=[{"url": url, "kv_events": "off"}],
            port=0,
            engine_load=False,
            decision_log=str(log_path),
        )
        messages = [SYSTEM, {"role": "user", "content": "list the tables " * 20}]

        def ask(model: str, **headers: str) -> tuple[dict[str, str], int]:
            body: dict[str, Any] = {"model": model, "messages": messages, "max_tokens": 2}
            status, h, raw = request(p.url, "/v1/chat/completions", body, headers=headers)
            assert status == 200, raw
            return decision(h), json.loads(raw)["usage"]["prompt_tokens_details"]["cached_tokens"]

        with ProxyServer(config) as p:
            assert p.proxy is not None and p.proxy.fleet.adapters == {"sql"}
            assert p.proxy.fleet.namespace("sql", "salt") == cache_namespace("sql", "salt")
            assert p.proxy.fleet.namespace("fake-model", "salt") == "salt"
            _, base_cached = ask("fake-model")
            adapter, adapter_cached = ask("sql", **{"thread-id": "t-2", "x-codex-parent-thread-id": "t-1"})
            again, again_cached = ask("sql")
            native = metric(
                request(p.url, "/metrics", method="GET")[2].decode(), "smetric_proxy_native_requests_total", api="chat"
            )
            assert native == 3, "the adapter's requests are the gateway's too"
        lines = [json.loads(line) for line in log_path.read_text().splitlines()]
    finally:
        engine.stop()
    assert base_cached == 0 and adapter_cached == 0, "the engine caches the adapter apart from the base model"
    assert int(adapter["local_hit_tokens"]) == 0, "no hit predicted from the base model's blocks"
    assert int(again["local_hit_tokens"]) > 0 and again_cached > 0, "the adapter's own blocks are found"
    assert lines[1]["session"] == "t-2" and lines[1]["parent"] == "t-1"
    assert lines[1]["predicted_local_hit"] == 0 and lines[1]["cached_tokens"] == 0
