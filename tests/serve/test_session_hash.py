"""vllm-router's hash policies at the proxy (``--policy consistent_hash`` / ``rendezvous_hash``):
a request's session header is the router's ``session_key``, so a session keeps its instance
whatever its prompt, and the instance is the one the router picks for that key. Bounded: a few
requests to three fake engines in process."""

from __future__ import annotations

from typing import Any

import pytest
from proxy_util import request

from smetric import Router
from smetric.fake_engine import FakeEngine
from smetric.serve.config import load_config
from smetric.serve.proxy import ProxyServer


def instance(headers: dict[str, str]) -> str:
    fields = dict(p.partition("=")[::2] for p in headers["x-smetric-decision"].split("; "))
    return fields["instance"].strip('"')


@pytest.mark.parametrize("policy", ["consistent_hash", "rendezvous_hash"])
def test_the_session_header_is_the_hash_key(policy: str) -> None:
    engines = [FakeEngine(port=0, speedup=1000).start() for _ in range(3)]
    urls = [e.url for e in engines]
    try:

        def ask(p: ProxyServer, text: str, session: str) -> str:
            body: dict[str, Any] = {
                "model": "fake-model",
                "messages": [{"role": "user", "content": text}],
                "max_tokens": 2,
            }
            status, h, raw = request(p.url, "/v1/chat/completions", body, headers={"x-session-id": session})
            assert status == 200, raw
            return instance(h)

        twin = Router(urls, policy=policy)  # the same names: the same key maps alike
        with ProxyServer(load_config(instances=urls, port=0, engine_load=False, policy=policy)) as p:
            for k in range(6):
                session = f"session-{k}"
                expected = twin.route([1], session_key=session).instance
                for text in ("first prompt", "a different second prompt", f"third {k}"):
                    assert ask(p, text, session) == expected
    finally:
        for e in engines:
            e.stop()
