"""What actually happened (:mod:`smetric.serve.decision_log`): request ids accepted, minted,
forwarded and returned; the realized hit read from the engine's usage beside the predicted one;
the decision log's lines; the outcome metrics. Upstreams: a fake engine in process, or a stub that
records what reached it. Bounded: a handful of requests."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from aiohttp import web
from proxy_util import Stub, events, metric, request

from smetric.fake_engine import FakeEngine
from smetric.serve.config import load_config
from smetric.serve.decision_log import Outcome, Outcomes, request_id
from smetric.serve.proxy import ProxyServer

SYSTEM = {"role": "system", "content": "You are a careful coding agent. " * 40}


def test_a_safe_client_id_is_kept_and_anything_else_is_replaced_by_a_minted_one() -> None:
    assert request_id("req-42.a:b_C") == "req-42.a:b_C"
    for bad in (None, "", "x" * 129, "has space", "semi;colon", "newline\n", "ünï"):
        minted = request_id(bad)
        assert len(minted) == 32 and int(minted, 16) >= 0, bad
    assert request_id(None) != request_id(None)


def test_request_ids_are_forwarded_to_the_engine_and_returned() -> None:
    async def engine(req: web.Request) -> web.StreamResponse:
        if req.path == "/v1/models":
            return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})
        await req.read()
        message = {"role": "assistant", "content": "ok"}
        return web.json_response({"id": "x", "choices": [{"index": 0, "message": message, "finish_reason": "stop"}]})

    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    with Stub(engine) as stub, ProxyServer(load_config(instances=[stub.url], port=0, engine_load=False)) as p:
        status, headers, _ = request(p.url, "/v1/chat/completions", body, headers={"X-Request-Id": "client-7"})
        assert status == 200 and headers["x-request-id"] == "client-7"
        _, headers2, _ = request(p.url, "/v1/chat/completions", body, headers={"X-Request-Id": "bad id;"})
        _, headers3, _ = request(p.url, "/v1/chat/completions", body)
        minted = [headers2["x-request-id"], headers3["x-request-id"]]
        assert all(len(m) == 32 for m in minted) and minted[0] != minted[1]
        status, headers4, _ = request(p.url, "/v1/chat/completions", raw=b"{not json", headers={"X-Request-Id": "r4"})
        assert status == 400 and headers4["x-request-id"] == "r4", "a refused request has its id too"
    forwarded = [
        [v for k, v in s["headers"].items() if k.lower() == "x-request-id"]
        for s in stub.seen
        if s["path"] == "/v1/chat/completions"
    ]
    assert forwarded == [["client-7"], [minted[0]], [minted[1]]], "exactly one id per call, the proxy's"


def conversation(turns: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [SYSTEM]
    for i in range(turns):
        messages.append({"role": "user", "content": f"question {i}: " + "details " * 30})
        if i < turns - 1:
            messages.append({"role": "assistant", "content": f"answer {i}"})
    return messages


def test_the_realized_hit_beside_the_predicted_one_in_the_log_and_the_metrics(tmp_path: Path) -> None:
    log_path = tmp_path / "decisions.jsonl"
    engine = FakeEngine(port=0, speedup=1000).start()
    url = engine.url
    try:
        config = load_config(instances=[url], port=0, engine_load=False, decision_log=str(log_path))
        with ProxyServer(config) as p:
            first = {"model": "fake-model", "messages": conversation(1), "max_tokens": 3}
            status, h1, raw1 = request(p.url, "/v1/chat/completions", first, headers={"x-session-id": "s1"})
            assert status == 200
            follow = {
                "model": "fake-model",
                "messages": conversation(2),
                "max_tokens": 5,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            status, h2, raw2 = request(p.url, "/v1/chat/completions", follow, headers={"x-session-id": "s1"})
            assert status == 200
            usage = [e for e in events(raw2) if isinstance(e, dict) and e.get("usage")][-1]["usage"]
            engine_cached = usage["prompt_tokens_details"]["cached_tokens"]
            assert engine_cached > 0, "the follow-up shares the first turn's prefix on the one engine"
            text = request(p.url, "/metrics", method="GET")[2].decode()
        lines = [json.loads(line) for line in log_path.read_text().splitlines()]
    finally:
        engine.stop()
    assert [r["request_id"] for r in lines] == [h1["x-request-id"], h2["x-request-id"]]
    one, two = lines
    assert one["first_turn"] is True and two["first_turn"] is False
    assert one["session"] == two["session"] == "s1" and one["api"] == "chat"
    assert one["instance"] == two["instance"] == url and one["status"] == two["status"] == 200
    assert one["cached_tokens"] == json.loads(raw1)["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert two["cached_tokens"] == engine_cached
    assert two["predicted_local_hit"] > 0 and two["reason"] and two["prompt_tokens"] > 0
    assert one["ttft_s"] is None and two["ttft_s"] > 0 and two["itl_s"] > 0 and two["output_tokens"] == 5
    assert metric(text, "smetric_proxy_hit_error_tokens_count") == 2
    assert metric(text, "smetric_proxy_realized_hit_tokens_total") == one["cached_tokens"] + engine_cached
    assert metric(text, "smetric_proxy_ttft_seconds_count", model="fake-model") == 1
    assert metric(text, "smetric_proxy_inter_token_seconds_count", model="fake-model") == 1
    predicted = max(two["predicted_local_hit"], two["predicted_global_hit"])
    assert metric(text, "smetric_proxy_followups_measured_total") == 1
    assert metric(text, "smetric_proxy_followups_short_hit_total") == (1 if 2 * engine_cached < predicted else 0)


def test_a_follow_up_under_half_its_predicted_hit_counts_as_a_wrong_instance() -> None:
    outcomes = Outcomes()

    def finish(first_turn: bool, predicted: int, cached: int | None) -> None:
        o = Outcome("r", "chat", None, None, time.perf_counter(), model="m", first_turn=first_turn)
        o.predicted_local_hit, o.predicted_global_hit, o.cached_tokens = predicted, 0, cached
        outcomes.finish(o, 200)

    finish(False, 1000, 400)  # short
    finish(False, 1000, 500)  # exactly half: not short
    finish(True, 1000, 0)  # a first turn is not a follow-up
    finish(False, 0, 0)  # nothing predicted: nothing to miss
    finish(False, 1000, None)  # the engine did not say: not measured
    assert (outcomes.followups_measured, outcomes.followups_short) == (2, 1)
    assert sum(outcomes.hit_error.counts) == 4 and outcomes.hit_error.sum == 600 + 500 + 1000 + 0
    text = "\n".join(outcomes.render())
    assert metric(text, "smetric_proxy_followups_short_hit_total") == 1
    assert metric(text, "smetric_proxy_hit_error_tokens_bucket", le="0") == 1


def test_streams_ask_the_engine_for_usage_and_the_client_sees_it_only_when_it_asked(tmp_path: Path) -> None:
    log_path = tmp_path / "decisions.jsonl"
    engine = FakeEngine(port=0, speedup=1000).start()
    try:
        direct_base = engine.url
        config = load_config(instances=[direct_base], port=0, engine_load=False, decision_log=str(log_path))
        base = {"model": "fake-model", "messages": conversation(2), "max_tokens": 4, "stream": True}
        asked_not = [base, {**base, "stream_options": {"include_usage": False}}]
        with ProxyServer(config) as p:
            bodies = [request(p.url, "/v1/chat/completions", b)[2] for b in asked_not]
            asked = request(p.url, "/v1/chat/completions", {**base, "stream_options": {"include_usage": True}})[2]
            completions = {"model": "fake-model", "prompt": "hello " * 40, "max_tokens": 3, "stream": True}
            plain = request(p.url, "/v1/completions", completions)[2]
        direct = request(direct_base, "/v1/chat/completions", base)[2]
        lines = [json.loads(line) for line in log_path.read_text().splitlines()]
    finally:
        engine.stop()

    def usage_events(body: bytes) -> list[Any]:
        return [e for e in events(body) if isinstance(e, dict) and "usage" in e and not e.get("choices")]

    for body in [*bodies, plain]:
        assert usage_events(body) == [], "the usage the client did not ask for is hidden"
        assert events(body)[-1] == "[DONE]"
    assert usage_events(direct) == [], "the engine itself sends none unasked (the control)"
    assert len(usage_events(asked)) == 1, "a client that asked gets its usage"
    texts = {
        "".join(
            e["choices"][0]["delta"].get("content") or "" for e in events(b) if isinstance(e, dict) and e["choices"]
        )
        for b in (*bodies, direct)
    }
    assert len(texts) == 1, "the same answer, with or without the usage asked of the engine"
    assert [line["cached_tokens"] is not None for line in lines] == [True] * 4
    assert all(line["output_tokens"] in (3, 4) for line in lines)


def test_a_pd_answers_usage_is_logged_but_not_compared_with_the_prefill_prediction() -> None:
    outcomes = Outcomes()
    o = Outcome("r", "chat", None, None, time.perf_counter(), model="m", first_turn=False)
    o.predicted_local_hit, o.predicted_global_hit, o.cached_tokens = 1000, 0, 4000
    o.prefill_instance = "http://prefill:8000"
    outcomes.finish(o, 200)
    assert sum(outcomes.hit_error.counts) == 0 and outcomes.followups_measured == 0
    assert json.loads(o.line())["prefill_instance"] == "http://prefill:8000"


def test_messages_and_responses_report_their_realized_hit_from_their_own_usage(tmp_path: Path) -> None:
    # Each API reports cached prompt tokens in its own usage field: Anthropic's
    # `cache_read_input_tokens` (in `message_start` when streamed), Responses'
    # `input_tokens_details.cached_tokens` (in the terminal event).
    def sse(raw: bytes) -> list[dict[str, Any]]:  # Anthropic and Responses events: `event:` then `data:`
        return [json.loads(line[6:]) for line in raw.decode().splitlines() if line.startswith("data: {")]

    log_path = tmp_path / "decisions.jsonl"
    engine = FakeEngine(port=0, speedup=1000).start()
    try:
        config = load_config(instances=[engine.url], port=0, engine_load=False, decision_log=str(log_path))
        with ProxyServer(config) as p:
            reported: list[int] = []
            for stream in (False, True):
                history: list[dict[str, Any]] = []
                for turn in range(2):
                    history.append({"role": "user", "content": f"step {turn} of {stream}: " + "inspect the diff " * 40})
                    body = {"model": "fake-model", "max_tokens": 3, "stream": stream, "messages": history}
                    status, _, raw = request(p.url, "/v1/messages", body)
                    assert status == 200, raw[:300]
                    if stream:
                        start = next(e for e in sse(raw) if e.get("type") == "message_start")
                        reported.append(start["message"]["usage"]["cache_read_input_tokens"])
                    else:
                        reported.append(json.loads(raw)["usage"]["cache_read_input_tokens"])
                    history.append({"role": "assistant", "content": f"done {turn}"})
                items: list[dict[str, Any]] = []
                for turn in range(2):
                    items.append({"role": "user", "content": f"task {turn} of {stream}: " + "run the tests " * 40})
                    body = {"model": "fake-model", "max_output_tokens": 3, "stream": stream, "input": items}
                    status, _, raw = request(p.url, "/v1/responses", body)
                    assert status == 200, raw[:300]
                    if stream:
                        done = [e for e in sse(raw) if e.get("type") in ("response.completed", "response.incomplete")]
                        usage = done[-1]["response"]["usage"]
                    else:
                        usage = json.loads(raw)["usage"]
                    reported.append(usage["input_tokens_details"]["cached_tokens"])
                    items.append({"role": "assistant", "content": f"ok {turn}"})
        lines = [json.loads(line) for line in log_path.read_text().splitlines()]
    finally:
        engine.stop()
    assert [r["api"] for r in lines] == ["messages", "messages", "responses", "responses"] * 2
    assert [r["cached_tokens"] for r in lines] == reported
    follow_ups = reported[1::2]
    assert all(n > 0 for n in follow_ups), "every follow-up re-sent its first turn to the one engine"
