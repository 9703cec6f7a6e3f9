"""The door's details (issue 32 item 5): a wrong method on an API path is a 405 with ``Allow`` in
the API's error shape; a request head over the engines' limit is a 431 before it is forwarded;
a header value with a bare CR or LF is a 400; the stored-response key comes from a flag, the
environment or the file. Raw sockets where a client library would refuse to send the bytes.
Loopback only, bounded in requests and time."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hostile_util import assert_healthy, error_of, hostile_proxy, parse_raw, raw_exchange
from proxy_util import request

from smetric.cli import main
from smetric.errors import InvalidConfigError
from smetric.fake_engine import FakeEngine
from smetric.serve.apis import ResponsesApi
from smetric.serve.config import MIN_RESPONSE_ID_KEY_BYTES, RESPONSE_ID_KEY_ENV, load_config
from smetric.serve.pinning import ResponseIds
from smetric.serve.proxy import ProxyServer

API_POSTS = ("/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/responses")


@pytest.fixture
def engine() -> Iterator[FakeEngine]:
    e = FakeEngine(port=0, speedup=1000).start()
    yield e
    e.stop()


@pytest.fixture
def proxy(engine: FakeEngine) -> Iterator[ProxyServer]:
    p = hostile_proxy([engine.url])
    yield p
    p.stop()


def api_error(path: str, status: int, body: bytes) -> dict[str, Any]:
    """The error object of an answer in ``path``'s API shape: Anthropic's for Messages
    (``{"type": "error", "error": {...}}``), OpenAI's for the rest."""
    if path.startswith("/v1/messages"):
        obj = json.loads(body)
        assert obj.get("type") == "error" and isinstance(obj.get("error"), dict), (status, body[:200])
        err: dict[str, Any] = obj["error"]
        assert isinstance(err.get("type"), str) and isinstance(err.get("message"), str), body[:200]
        return err
    return error_of(status, body)


@pytest.mark.parametrize("path", API_POSTS)
@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE", "PATCH"])
def test_a_wrong_method_on_an_api_path_is_a_405_with_allow_in_the_apis_shape(
    proxy: ProxyServer, path: str, method: str
) -> None:
    status, headers, body = request(proxy.url, path, method=method, raw=b"{}" if method != "GET" else None)
    assert status == 405, (method, path, status, body[:200])
    assert headers.get("allow") == "POST", headers
    api_error(path, status, body)
    assert headers["server"] == "smetric"


def test_allow_names_every_method_of_the_path_and_other_get_routes_still_answer(
    proxy: ProxyServer, caplog: pytest.LogCaptureFixture
) -> None:
    status, headers, body = request(proxy.url, "/v1/responses/resp_x-0000-00", method="PUT", raw=b"{}")
    assert status == 405 and {m.strip() for m in headers["allow"].split(",")} == {"DELETE", "GET"}, (status, headers)
    error_of(status, body)
    status, headers, body = request(proxy.url, "/v1/models", method="POST", raw=b"{}")
    assert status == 405 and "GET" in headers["allow"].split(","), (status, headers)
    status, _, body = request(proxy.url, "/v1/responses/resp_unknown", method="GET")
    assert status == 404 and "not found" in error_of(status, body)["message"]  # the route, not a 405
    assert request(proxy.url, "/v1/models", method="GET")[0] == 200
    assert request(proxy.url, "/health", method="GET")[0] == 200
    status, headers, body = request(proxy.url, "/v1/nothing", method="GET")
    assert status == 404 and "allow" not in headers, (status, headers)
    assert_healthy(proxy, caplog)


KEY = "replicas-share-this-key"


def test_the_response_id_key_comes_from_the_flag_then_the_environment_then_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    file = tmp_path / "serve.toml"
    file.write_text(f'response_id_key = "{KEY}-from-the-file"\ninstances = ["http://127.0.0.1:9"]\n')
    monkeypatch.delenv(RESPONSE_ID_KEY_ENV, raising=False)
    assert load_config(instances=["http://127.0.0.1:9"]).response_id_key is None  # random per process
    assert load_config(file).response_id_key == f"{KEY}-from-the-file"
    monkeypatch.setenv(RESPONSE_ID_KEY_ENV, f"{KEY}-from-the-env")
    assert load_config(file).response_id_key == f"{KEY}-from-the-env"
    config = load_config(file, response_id_key=f"{KEY}-from-the-flag")
    assert config.response_id_key == f"{KEY}-from-the-flag"
    assert KEY not in repr(config), "the key is never shown"
    ids = ResponsesApi().bind(config).ids
    assert ids.open(ResponseIds(f"{KEY}-from-the-flag").issue("resp_1", "http://127.0.0.1:9")) is not None


@pytest.mark.parametrize("key", ["", "short-secret", "ü" * 7])
def test_an_empty_or_short_response_id_key_is_a_config_error_that_never_shows_it(
    key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(RESPONSE_ID_KEY_ENV, raising=False)
    with pytest.raises(InvalidConfigError, match=f"at least {MIN_RESPONSE_ID_KEY_BYTES} bytes") as raised:
        load_config(instances=["http://127.0.0.1:9"], response_id_key=key)
    assert raised.value.field == "response_id_key"
    assert not key or key not in str(raised.value)
    monkeypatch.setenv(RESPONSE_ID_KEY_ENV, key)
    with pytest.raises(InvalidConfigError, match="response_id_key"):
        load_config(instances=["http://127.0.0.1:9"])
    assert load_config(instances=["http://127.0.0.1:9"], response_id_key="x" * MIN_RESPONSE_ID_KEY_BYTES)


def test_the_serve_command_takes_the_key_as_a_flag_and_refuses_a_short_one_without_printing_it(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(RESPONSE_ID_KEY_ENV, raising=False)
    assert main(["serve", "--instance", "http://127.0.0.1:9", "--response-id-key", "tiny-key"]) == 2
    err = capsys.readouterr().err
    assert "response_id_key" in err and "tiny-key" not in err, err
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    assert f"at least {MIN_RESPONSE_ID_KEY_BYTES} bytes" in " ".join(capsys.readouterr().out.split())


def raw_post(port: int, path: str, fields: bytes) -> tuple[int, dict[str, str], bytes]:
    """A raw POST of a small valid body to ``path`` with ``fields`` (each line ending as given)."""
    body = json.dumps(BODIES[path]).encode()
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n".encode() + fields
    tail = f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
    return parse_raw(raw_exchange(port, head + tail + body))


BODIES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {"model": "fake-model", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]},
    "/v1/messages": {"model": "fake-model", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]},
}


@pytest.mark.parametrize("path", list(BODIES))
@pytest.mark.parametrize(
    "fields",
    [b"x-session-id: a\nb\r\n", b"x-session-id: a\rb\r\n", b"x-session-id: a\nx-other: b\r\n", b"x-session-id: a\n"],
    ids=["LF in a value", "CR in a value", "LF ends a line", "LF ends the last field"],
)
def test_a_bare_cr_or_lf_in_a_header_is_a_400_in_the_apis_shape(
    proxy: ProxyServer, path: str, fields: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    assert proxy.port is not None
    status, headers, body = raw_post(proxy.port, path, fields)
    assert status == 400, (fields, status, body[:200])
    assert headers["content-type"].startswith("application/json") and headers["server"] == "smetric"
    api_error(path, status, body)
    assert raw_post(proxy.port, path, b"x-session-id: a b\r\n")[0] == 200
    assert_healthy(proxy, caplog)


@pytest.mark.parametrize("path", list(BODIES))
def test_a_head_over_the_engines_limit_is_a_431_in_the_apis_shape_not_the_engines_answer(
    proxy: ProxyServer, path: str, caplog: pytest.LogCaptureFixture
) -> None:
    assert proxy.port is not None
    config = proxy.proxy.config if proxy.proxy is not None else None
    assert config is not None and (config.max_head_bytes, config.max_header_bytes) == (16384, 8190)
    each = b"a" * 6000  # every field under the field limit, the three over h11's 16 KiB head
    over_head = b"".join(b"x-pad-%d: %s\r\n" % (i, each) for i in range(3))
    over_field = b"x-session-id: " + b"s" * 9000 + b"\r\n"  # one field over aiohttp's 8190 B
    for fields in (over_head, over_field):
        status, headers, body = raw_post(proxy.port, path, fields)
        assert status == 431, (len(fields), status, body[:200])
        assert headers["content-type"].startswith("application/json") and headers["server"] == "smetric"
        assert b"aaaa" not in body and b"ssss" not in body, "never the client's bytes"
        api_error(path, status, body)
    under = b"".join(b"x-pad-%d: %s\r\n" % (i, each) for i in range(2))  # 12 KB: the engine reads it
    status, _, body = raw_post(proxy.port, path, under)
    assert status == 200, body[:200]
    assert_healthy(proxy, caplog)


def test_a_head_limit_under_the_gateways_buffer_is_a_config_error() -> None:
    with pytest.raises(InvalidConfigError, match="max_head_bytes"):
        load_config(instances=["http://127.0.0.1:9"], max_head_bytes=4096)
