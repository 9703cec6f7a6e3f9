"""Engines behind TLS (``https://`` instance URLs) are served by the compiled gateway natively:
its engines' client speaks TLS (rustls) and verifies the engine against the system's roots as the
app's client does (``SSL_CERT_FILE`` here: a CA made for the test). The engine is a fake vLLM
engine behind a TLS terminator on loopback. Negative control: without the CA trusted the gateway
refuses the engine's certificate and the request does not reach it natively. Bounded: a few
requests, each under a second.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import json
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from proxy_util import metric, proxy_for, request

from smetric.fake_engine import FakeEngine

MODEL = "fake-model"


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def make_certificates(folder: Path) -> tuple[Path, Path, Path]:
    """A CA, and a certificate for 127.0.0.1 signed by it: (CA file, certificate, key)."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name("smetric test CA"))
        .issuer_name(_name("smetric test CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = (
        x509.CertificateBuilder()
        .subject_name(_name("127.0.0.1"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    paths = folder / "ca.pem", folder / "engine.pem", folder / "engine.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return paths


class TlsTerminator:
    """TLS on a loopback port, the bytes piped to a plain-HTTP engine (as a TLS proxy in front of
    vLLM would), on a thread and loop of its own."""

    def __init__(self, upstream_port: int, certificate: Path, key: Path) -> None:
        self.upstream_port = upstream_port
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.load_cert_chain(certificate, key)
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(1 << 16):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

    def start(self) -> TlsTerminator:
        self._thread.start()

        async def up() -> None:
            self._server = await asyncio.start_server(self._client, "127.0.0.1", 0, ssl=self.context)
            self.port = self._server.sockets[0].getsockname()[1]

        asyncio.run_coroutine_threadsafe(up(), self._loop).result(10)
        return self

    def stop(self) -> None:
        async def down() -> None:
            if self._server is not None:
                self._server.close()
                await self._server.wait_closed()

        asyncio.run_coroutine_threadsafe(down(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


@pytest.fixture
def tls_engine(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """An https engine's URL and the CA that signed its certificate."""
    ca, certificate, key = make_certificates(tmp_path)
    engine = FakeEngine(port=0, speedup=1000).start()
    terminator = TlsTerminator(int(engine.url.rsplit(":", 1)[1]), certificate, key).start()
    try:
        yield f"https://127.0.0.1:{terminator.port}", ca
    finally:
        terminator.stop()
        engine.stop()


def chat(url: str) -> tuple[int, bytes]:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "over TLS"}], "max_tokens": 2}
    status, _, raw = request(url, "/v1/chat/completions", body)
    return status, raw


@pytest.mark.parametrize("trusted", [True, False])
def test_an_https_engine_is_served_natively_when_its_certificate_verifies(
    tls_engine: tuple[str, Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path, trusted: bool
) -> None:
    url, ca = tls_engine
    if trusted:
        monkeypatch.setenv("SSL_CERT_FILE", str(ca))
    else:  # a CA file that does not hold the engine's CA: nothing verifies it
        (tmp_path / "other").mkdir()
        other, _, _ = make_certificates(tmp_path / "other")
        monkeypatch.setenv("SSL_CERT_FILE", str(other))
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    p = proxy_for([{"url": url, "kv_events": "off"}], tokens={"mode": "approximate"}, engine_load=False)
    try:
        status, raw = chat(p.url)
        text = request(p.url, "/metrics", method="GET")[2].decode()
    finally:
        p.stop()
    native = metric(text, "smetric_proxy_native_requests_total", api="chat")
    if trusted:
        assert status == 200, raw
        assert native == 1, "served by the gateway over TLS"
    else:
        # The handshake fails: the gateway's failover finds no other instance and answers 503.
        assert status == 503, "an engine whose certificate does not verify is not served"
        assert "no instance could serve the request (1 attempts" in json.loads(raw)["error"]["message"]
        assert native == 1, "the gateway answered the failure itself"
