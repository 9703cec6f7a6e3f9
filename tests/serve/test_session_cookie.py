"""llm-d's session cookie at the proxy (``--policy llmd_session_affinity``): the answer names its
instance in ``llm-d-session`` (base64, as llm-d's scorer sets it), a request's cookie brings its
session back to that instance, and a cookie that names nothing usable is ignored. Other policies
set no cookie. Bounded: a few requests to two fake engines in process."""

from __future__ import annotations

import base64
from http.cookies import SimpleCookie
from typing import Any

from proxy_util import request

from smetric.fake_engine import FakeEngine
from smetric.serve.config import load_config
from smetric.serve.proxy import ProxyServer
from smetric.serve.session import AFFINITY_COOKIE, affinity_cookie, affinity_instance


def decision(headers: dict[str, str]) -> dict[str, str]:
    return {k: v.strip('"') for k, _, v in (p.partition("=") for p in headers["x-smetric-decision"].split("; "))}


def test_the_cookie_round_trips_as_llm_d_writes_it() -> None:
    value = affinity_cookie("http://10.0.0.7:8000")
    cookie = SimpleCookie()
    cookie.load(value)
    morsel = cookie[AFFINITY_COOKIE]
    assert base64.b64decode(morsel.value).decode() == "http://10.0.0.7:8000"
    assert (morsel["path"], morsel["httponly"], morsel["samesite"]) == ("/", True, "Lax")
    sent = f"theme=dark; {AFFINITY_COOKIE}={morsel.value}; other=1"
    assert affinity_instance({"cookie": sent}) == "http://10.0.0.7:8000"
    for bad in (f"{AFFINITY_COOKIE}=not base64!", f"{AFFINITY_COOKIE}=//79", "theme=dark", ""):
        assert affinity_instance({"cookie": bad}) is None, bad  # //79 is base64 of bytes that are not UTF-8
    assert affinity_instance({}) is None


def test_the_proxy_sets_and_follows_the_session_cookie() -> None:
    engines = [FakeEngine(port=0, speedup=1000).start() for _ in range(2)]
    urls = [e.url for e in engines]
    try:

        def ask(p: ProxyServer, text: str, cookie: str | None = None) -> tuple[dict[str, str], dict[str, str]]:
            body: dict[str, Any] = {
                "model": "fake-model",
                "messages": [{"role": "user", "content": text}],
                "max_tokens": 2,
            }
            headers = {"Cookie": cookie} if cookie is not None else {}
            status, h, raw = request(p.url, "/v1/chat/completions", body, headers=headers)
            assert status == 200, raw
            return decision(h), h

        config = load_config(instances=urls, port=0, engine_load=False, policy="llmd_session_affinity")
        with ProxyServer(config) as p:
            first, headers = ask(p, "session one")
            home = first["instance"]
            set_cookie = headers.get("set-cookie")
            assert set_cookie is not None and set_cookie.startswith(f"{AFFINITY_COOKIE}=")
            token = SimpleCookie(set_cookie)[AFFINITY_COOKIE].value
            assert base64.b64decode(token).decode() == home
            # Back with its cookie: the same instance, whatever the prompt, and no new cookie.
            for text in ("another prompt entirely", "and a third"):
                again, h = ask(p, text, cookie=f"{AFFINITY_COOKIE}={token}")
                assert again["instance"] == home and "set-cookie" not in h
            # A cookie naming the other instance moves the session there (and says so).
            other = next(u for u in urls if u != home)
            moved, h = ask(p, "session one", cookie=affinity_cookie(other).split(";")[0])
            assert moved["instance"] == other and "set-cookie" not in h
            # A cookie that names nothing usable is ignored: routed, and given a cookie.
            for junk in (f"{AFFINITY_COOKIE}=%%%", f"{AFFINITY_COOKIE}={base64.b64encode(b'gone').decode()}"):
                d, h = ask(p, "fresh", cookie=junk)
                assert d["instance"] in urls and h.get("set-cookie", "").startswith(f"{AFFINITY_COOKIE}=")
        with ProxyServer(load_config(instances=urls, port=0, engine_load=False)) as p:
            _, h = ask(p, "session one")
            assert "set-cookie" not in h, "only llm-d's policy sets its cookie"
    finally:
        for e in engines:
            e.stop()


def test_in_pd_mode_the_cookie_names_the_prefill_instance() -> None:
    ps = [FakeEngine(port=0, role="prefill", speedup=1000).start() for _ in range(2)]
    ds = [FakeEngine(port=0, role="decode", speedup=1000).start() for _ in range(2)]
    prefills = [e.url for e in ps]
    cfg = load_config(
        prefill=prefills, decode=[e.url for e in ds], port=0, engine_load=False, policy="llmd_session_affinity"
    )
    try:
        with ProxyServer(cfg) as p:
            body = {"messages": [{"role": "user", "content": "a task " * 40}], "max_tokens": 2}
            status, h, raw = request(p.url, "/v1/chat/completions", body)
            assert status == 200, raw
            first = decision(h)
            token = SimpleCookie(h["set-cookie"])[AFFINITY_COOKIE].value
            assert base64.b64decode(token).decode() == first["prefill"]
            other = next(u for u in prefills if u != first["prefill"])
            cookie = affinity_cookie(other).split(";")[0]
            status, h, raw = request(p.url, "/v1/chat/completions", body, headers={"Cookie": cookie})
            assert status == 200, raw
            assert decision(h)["prefill"] == other and "set-cookie" not in h
    finally:
        for e in [*ps, *ds]:
            e.stop()
