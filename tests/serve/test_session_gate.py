"""Session admission through ``smetric serve`` (issue 35 item 2; ``docs/serve.md``, "Session
admission"): the compiled gateway holds a session's request while its instance's resident
sessions' KV would overflow, serves it once a request there finishes (pausing the idle
session), and refuses in the API's own error shape with ``Retry-After`` when the hold queue is
full (429) or the wait outlives its timeout (503; Anthropic's 529 for Messages). Clients are the official ``openai`` and
``anthropic`` SDKs; the engine is one fake vLLM engine whose published KV capacity
(``num_gpu_blocks`` × block size on ``/metrics``) sizes the stage. Negative controls: the same
requests with admission off overlap, and a request that names no session is never held.
Bounded: a handful of requests per test, each under a few seconds.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import anthropic
import openai
import pytest
from proxy_util import metric, proxy_for, request

from smetric.errors import InvalidConfigError
from smetric.fake_engine import FakeEngine
from smetric.serve.config import load_config
from smetric.serve.proxy import ProxyServer

MODEL = "fake-model"
GPU_BLOCKS = 150
"""The engine's KV: 150 blocks × 16 tokens = 2,400 tokens. One session's request (≈ 600
prompt tokens + the stage's 1,024-token output reserve) fits; two in flight do not."""
LONG_TOKENS = 250
"""A's output (``ignore_eos``): ≈ 1.7 s at the fake engine's real-time speed (150 tokens measured
1.08 s)."""


@pytest.fixture
def engine() -> Iterator[FakeEngine]:
    e = FakeEngine(port=0, speedup=1, num_gpu_blocks=GPU_BLOCKS).start()
    yield e
    e.stop()


def serve(engine: FakeEngine, **overrides: Any) -> ProxyServer:
    overrides.setdefault("session_admission", "pause")
    return proxy_for(
        [{"url": engine.url, "kv_events": "off"}],
        tokens={"mode": "approximate"},
        **overrides,
    )


def client(p: ProxyServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=p.url + "/v1", api_key="sk-test", max_retries=0, timeout=30)


def turn(p: ProxyServer, session: str | None, word: str, max_tokens: int) -> tuple[float, float]:
    """One chat turn of ``session`` (None: no session header); its start and end times."""
    headers = {"x-session-id": session} if session else {}
    start = time.monotonic()
    with client(p) as c:
        c.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": f"{word} " + "context " * 300}],
            max_tokens=max_tokens,
            extra_headers=headers,
            extra_body={"ignore_eos": True},
        )
    return start, time.monotonic()


def long_then_short(p: ProxyServer, second_session: str | None) -> tuple[tuple[float, float], tuple[float, float]]:
    """Session A's long turn, then (once A is admitted) a short turn of ``second_session``."""
    with ThreadPoolExecutor(2) as pool:
        a: Future[tuple[float, float]] = pool.submit(turn, p, "session-a", "alpha", LONG_TOKENS)
        time.sleep(0.4)
        b = pool.submit(turn, p, second_session, "bravo", 2)
        return a.result(timeout=30), b.result(timeout=30)


def page(p: ProxyServer) -> str:
    return request(p.url, "/metrics", method="GET")[2].decode()


def test_a_request_that_would_overflow_its_instance_waits_for_a_finish(engine: FakeEngine) -> None:
    p = serve(engine)
    try:
        (_, a_end), (_, b_end) = long_then_short(p, "session-b")
        text = page(p)
    finally:
        p.stop()
    # B was held until A finished, then admitted by pausing A (now idle).
    assert b_end >= a_end - 0.05
    assert metric(text, "smetric_proxy_session_admission_decisions_total", verdict="held") >= 1
    assert metric(text, "smetric_proxy_session_admission_decisions_total", verdict="admitted") == 2
    assert metric(text, "smetric_proxy_session_admission_paused_total") == 1
    assert metric(text, "smetric_proxy_session_admission_held") == 0


@pytest.mark.parametrize("end", ["none", "header", "endpoint"])
def test_an_ended_session_leaves_its_instance_at_once(engine: FakeEngine, end: str) -> None:
    """A's long turn leaves A resident (idle, ≈ 850 tokens): B's request (≈ 1,600 with the
    reserve) fits only by pausing A. Ended — by its last request's header or by the endpoint —
    A holds nothing, and B pauses no one. ``none`` is the negative control."""
    p = serve(engine)
    try:
        headers = {"x-session-id": "session-a"}
        if end == "header":
            headers["x-session-end"] = "true"
        with client(p) as c:
            c.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "alpha " + "context " * 300}],
                max_tokens=LONG_TOKENS,
                extra_headers=headers,
                extra_body={"ignore_eos": True},
            )
        if end == "endpoint":
            assert request(p.url, "/v1/sessions/session-a/end", method="POST")[0] == 200
        turn(p, "session-b", "beta", 4)
        text = page(p)
    finally:
        p.stop()
    assert metric(text, "smetric_proxy_session_admission_decisions_total", verdict="admitted") == 2
    assert metric(text, "smetric_proxy_session_admission_paused_total") == (1 if end == "none" else 0)


def test_a_bounded_hold_admits_the_request_where_its_policy_sent_it(engine: FakeEngine) -> None:
    """With ``session_max_hold_s`` B waits that long, not until A finishes, and is counted
    released; the first test above (the hold unbounded) is its negative control."""
    p = serve(engine, session_admission="smetric", session_max_hold_s=0.3)
    try:
        (_, a_end), (b_start, b_end) = long_then_short(p, "session-b")
        text = page(p)
    finally:
        p.stop()
    assert b_end < a_end - 0.5
    assert b_end - b_start >= 0.3
    assert metric(text, "smetric_proxy_session_admission_released_total") == 1
    assert metric(text, "smetric_proxy_session_admission_decisions_total", verdict="held") >= 1
    assert metric(text, "smetric_proxy_session_admission_rejections_total", reason="hold_timeout") == 0


def test_admission_off_overlaps_the_same_requests(engine: FakeEngine) -> None:
    """Negative control: without the stage B does not wait for A."""
    p = serve(engine, session_admission="off")
    try:
        (_, a_end), (_, b_end) = long_then_short(p, "session-b")
        text = page(p)
    finally:
        p.stop()
    assert b_end < a_end - 0.5
    assert "smetric_proxy_session_admission" not in text


def test_a_request_without_a_session_is_never_held(engine: FakeEngine) -> None:
    """Negative control: the stage gates sessions only."""
    p = serve(engine)
    try:
        (_, a_end), (_, b_end) = long_then_short(p, None)
    finally:
        p.stop()
    assert b_end < a_end - 0.5


def test_a_wait_past_the_hold_timeout_is_a_503_in_each_apis_shape_529_for_messages(engine: FakeEngine) -> None:
    p = serve(engine, session_hold_timeout_s=0.3, retry_after_s=7)
    try:
        with ThreadPoolExecutor(1) as pool:
            a = pool.submit(turn, p, "session-a", "alpha", LONG_TOKENS)
            time.sleep(0.4)
            with pytest.raises(openai.APIStatusError) as refused:
                turn(p, "session-b", "bravo", 2)
            with (
                anthropic.Anthropic(base_url=p.url, api_key="sk-test", max_retries=0, timeout=30) as ac,
                pytest.raises(anthropic.APIStatusError) as refused_messages,
            ):
                ac.messages.create(
                    model=MODEL,
                    max_tokens=2,
                    messages=[{"role": "user", "content": "charlie " + "context " * 300}],
                    extra_headers={"x-session-id": "session-c"},
                )
            a.result(timeout=30)
        text = page(p)
    finally:
        p.stop()
    assert refused.value.status_code == 503
    assert refused.value.response.headers["retry-after"] == "7"
    body = refused.value.response.json()
    assert body["error"]["type"] == "ServiceUnavailableError"
    assert "session admission" in body["error"]["message"]
    # Anthropic's own shape of an unavailable service: 529 overloaded_error.
    assert refused_messages.value.status_code == 529
    shaped = refused_messages.value.response.json()
    assert shaped["type"] == "error" and shaped["error"]["type"] == "overloaded_error"
    assert metric(text, "smetric_proxy_session_admission_rejections_total", reason="hold_timeout") == 2


def test_a_full_hold_queue_refuses_at_once_with_429(engine: FakeEngine) -> None:
    p = serve(engine, session_max_held=1, session_hold_timeout_s=5)
    try:
        with ThreadPoolExecutor(2) as pool:
            a = pool.submit(turn, p, "session-a", "alpha", LONG_TOKENS)
            time.sleep(0.4)
            b = pool.submit(turn, p, "session-b", "bravo", 2)
            time.sleep(0.3)
            started = time.monotonic()
            with pytest.raises(openai.RateLimitError) as refused:
                turn(p, "session-c", "charlie", 2)
            waited = time.monotonic() - started
            a.result(timeout=30)
            b.result(timeout=30)  # the held one is still served
        text = page(p)
    finally:
        p.stop()
    assert waited < 1.0
    assert refused.value.response.headers["retry-after"] == "1"
    assert metric(text, "smetric_proxy_session_admission_rejections_total", reason="held_full") == 1


def test_the_capacity_is_the_engines_published_kv_unless_set(engine: FakeEngine) -> None:
    """With the capacity set far above the engine's, the same two sessions overlap: the stage
    reads the published 3,200 tokens only when the setting is unset."""
    p = serve(engine, session_capacity_tokens=1_000_000)
    try:
        (_, a_end), (_, b_end) = long_then_short(p, "session-b")
    finally:
        p.stop()
    assert b_end < a_end - 0.5


def test_session_admission_is_co_located_and_checks_its_settings() -> None:
    with pytest.raises(InvalidConfigError) as pd:
        load_config(prefill=["http://127.0.0.1:9"], decode=["http://127.0.0.1:10"], session_admission="pause")
    assert pd.value.field == "session_admission"
    with pytest.raises(InvalidConfigError) as bad_mode:
        load_config(instances=["http://127.0.0.1:9"], session_admission="sometimes")
    assert bad_mode.value.field == "session_admission"
    with pytest.raises(InvalidConfigError) as bad_timeout:
        load_config(instances=["http://127.0.0.1:9"], session_admission="pause", session_hold_timeout_s=0)
    assert bad_timeout.value.field == "session_hold_timeout_s"
    with pytest.raises(InvalidConfigError) as bad_hold:
        load_config(instances=["http://127.0.0.1:9"], session_admission="smetric", session_max_hold_s=-1)
    assert bad_hold.value.field == "session_max_hold_s"


def test_pd_mode_with_session_admission_is_refused_at_load(engine: FakeEngine) -> None:
    """PD mode: the stage runs in the co-located native path only, so it would never run; the
    configuration is refused rather than run without it."""
    with pytest.raises(InvalidConfigError) as refused:
        load_config(
            prefill=[engine.url],
            decode=["http://127.0.0.1:9"],
            port=0,
            engine_load=False,
            session_admission="pause",
            session_capacity_tokens=100_000,
        )
    assert refused.value.field == "session_admission"
