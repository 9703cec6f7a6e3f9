"""Keys (:mod:`smetric.serve.auth`, the upstream key of :mod:`smetric.serve.upstream`): client keys
checked at the proxy, the proxy's own key on every call to an engine started with ``--api-key``
(as vLLM's: it guards ``/v1`` only), and a client's key never forwarded. Bounded: a few requests."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from aiohttp import web
from proxy_util import Stub, metric, request

from smetric.fake_engine import FakeEngine
from smetric.serve.auth import ClientKeys, presented_key
from smetric.serve.config import load_config
from smetric.serve.proxy import ProxyServer

ENGINE_KEY = "engine-secret"
BODY = {"model": "fake-model", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 2}


def test_the_presented_key_is_a_bearer_token_or_x_api_key_and_compared_with_every_key() -> None:
    assert presented_key({"authorization": "Bearer  k1 "}) == "k1"
    assert presented_key({"authorization": "bearer k1"}) == "k1"
    assert presented_key({"authorization": "Basic k1", "x-api-key": "k2"}) == "k2"
    assert presented_key({"authorization": "Bearer "}) is None and presented_key({}) is None
    keys = ClientKeys(["k1", "k2", ""])
    assert keys.enabled and keys.accepts({"x-api-key": "k2"}) and keys.accepts({"authorization": "Bearer k1"})
    assert not keys.accepts({"x-api-key": "k3"}) and not keys.accepts({"x-api-key": "k1 k2"})
    assert not keys.accepts({})
    assert ClientKeys([]).accepts({}), "no key configured: the proxy is open"
    assert ClientKeys.guards("/v1/chat/completions") and ClientKeys.guards("/tokenize")
    assert not ClientKeys.guards("/health") and not ClientKeys.guards("/metrics")
    assert not ClientKeys.guards("/admin/instances"), "the admin token guards its own endpoints"


def test_client_keys_at_the_proxy_and_the_upstream_key_on_an_engine_with_api_key(tmp_path: Path) -> None:
    keys_file = tmp_path / "keys"
    keys_file.write_text("# team b\nclient-b\n\n")
    engine = FakeEngine(port=0, speedup=1000, api_key=ENGINE_KEY).start()
    try:
        assert request(engine.url, "/v1/models", method="GET")[0] == 401, "the engine guards /v1"
        config = load_config(
            instances=[engine.url],
            port=0,
            engine_load=True,
            api_keys=["client-a"],
            api_keys_file=str(keys_file),
            upstream_api_key=ENGINE_KEY,
        )
        with ProxyServer(config) as p:
            status, headers, raw = request(p.url, "/v1/chat/completions", BODY)
            assert status == 401 and headers["www-authenticate"] == "Bearer"
            error = json.loads(raw)["error"]
            assert error["type"] == "AuthenticationError" and error["code"] == 401
            assert request(p.url, "/v1/chat/completions", BODY, headers={"x-api-key": "nope"})[0] == 401
            assert request(p.url, "/v1/models", method="GET")[0] == 401
            # The proxy's own /v1/models call carried the upstream key: the fleet's model is known.
            status, _, raw = request(p.url, "/v1/models", method="GET", headers={"x-api-key": "client-b"})
            assert status == 200 and [m["id"] for m in json.loads(raw)["data"]] == ["fake-model"]
            # A client key is replaced by the upstream key on the way to the engine.
            ok = request(p.url, "/v1/chat/completions", BODY, headers={"Authorization": "Bearer client-a"})
            assert ok[0] == 200, ok[2]
            streamed = {**BODY, "stream": True}
            assert (
                request(p.url, "/v1/completions", {**streamed, "prompt": "x"}, headers={"x-api-key": "client-b"})[0]
                == 200
            )
            assert request(p.url, "/health", method="GET")[0] == 200
            text = request(p.url, "/metrics", method="GET")[2].decode()
            assert metric(text, "smetric_proxy_unauthorized_total") == 3
    finally:
        engine.stop()


def test_without_the_upstream_key_the_engine_refuses_the_proxy() -> None:
    """The negative control: the same engine behind a proxy that has no key for it."""
    engine = FakeEngine(port=0, speedup=1000, api_key=ENGINE_KEY).start()
    try:
        with ProxyServer(load_config(instances=[engine.url], port=0, engine_load=False)) as p:
            assert json.loads(request(p.url, "/v1/models", method="GET")[2])["data"] == []
            assert request(p.url, "/v1/chat/completions", BODY)[0] == 401
    finally:
        engine.stop()


def test_every_call_to_an_engine_carries_the_upstream_key_and_no_client_credential() -> None:
    async def engine(req: web.Request) -> web.StreamResponse:
        if req.path == "/v1/models":
            return web.json_response({"object": "list", "data": [{"id": "fake-model", "object": "model"}]})
        if req.path == "/metrics":
            return web.Response(text="")
        if req.path == "/kv_event_sources":
            return web.json_response({})
        await req.read()
        answer: dict[str, Any] = {"id": "x", "object": "chat.completion", "model": "fake-model"}
        answer["choices"] = [{"index": 0, "message": {"role": "assistant", "content": "k"}, "finish_reason": "stop"}]
        return web.json_response(answer)

    with Stub(engine) as stub:
        config = load_config(instances=[stub.url], port=0, api_keys=["client-a"], upstream_api_key=ENGINE_KEY)
        with ProxyServer(config) as p:
            status, _, _ = request(
                p.url,
                "/v1/chat/completions",
                BODY,
                headers={"Authorization": "Bearer client-a", "x-api-key": "client-a"},
            )
            assert status == 200
            # The capacity probe at start and at least one round of the load scraper.
            deadline = time.monotonic() + 10
            while sum(s["path"] == "/metrics" for s in stub.seen) < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
        paths = {s["path"] for s in stub.seen}
        assert {"/v1/models", "/metrics", "/kv_event_sources", "/v1/chat/completions"} <= paths
        assert sum(s["path"] == "/metrics" for s in stub.seen) >= 2
        for seen in stub.seen:
            assert seen["headers"].get("Authorization") == f"Bearer {ENGINE_KEY}", seen["path"]
            assert "client-a" not in json.dumps(seen["headers"]), f"a client credential reached {seen['path']}"
