"""The LLM client against hostile or broken servers, over real sockets on loopback: the API key
never leaves for another host, one deadline covers the whole exchange (headers included), and
every malformed reply is one clean OracleError that does not show the key."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest
from tests.conftest import json_headers, loopback_server

from bottleneck_oracle.errors import OracleError
from bottleneck_oracle.llm.client import ChatClient

HI = [{"role": "user", "content": "hi"}]
KEY = "sk-secret-0123456789"


class _Recorder:
    """An HTTP server that records every request it gets (any method) and answers a valid reply."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str | None]] = []

        def respond(h):
            self.requests.append((h.command, h.headers.get("Authorization")))
            data = json.dumps({"choices": [{"message": {"content": '{"suggestions": []}'}}]}).encode()
            json_headers(h, data)
            h.wfile.write(data)

        self.httpd, self.url = loopback_server(respond)
        # GETs too: a client that follows a 302 re-sends as GET
        self.httpd.RequestHandlerClass.do_GET = lambda h: respond(h)  # type: ignore[attr-defined]


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_a_redirect_to_another_host_is_refused_and_the_key_never_reaches_it(monkeypatch, status):
    monkeypatch.setenv("ORACLE_TEST_KEY", KEY)
    elsewhere = _Recorder()
    other = elsewhere.url.replace("127.0.0.1", "localhost")  # another host name, same machine

    def redirect(h):
        h.rfile.read(int(h.headers["Content-Length"]))
        h.send_response(status)
        h.send_header("Location", f"{other}/v1/chat/completions")
        h.send_header("Content-Length", "0")
        h.end_headers()

    httpd, url = loopback_server(redirect)
    try:
        with pytest.raises(OracleError, match=f"HTTP {status}, a redirect") as exc:
            ChatClient(f"{url}/v1", "m", key_env="ORACLE_TEST_KEY", timeout_s=5).chat(HI)
        assert KEY not in str(exc.value)
        assert elsewhere.requests == []  # nothing was sent there, with or without the key
    finally:
        httpd.shutdown()
        elsewhere.httpd.shutdown()


@pytest.mark.parametrize("key", [KEY + "\r", "“" + KEY + "”", KEY + "\nX-Evil: 1", "sk two words"])
def test_a_key_an_http_header_cannot_carry_is_refused_without_showing_it(monkeypatch, key):
    monkeypatch.setenv("ORACLE_TEST_KEY", key)
    with pytest.raises(OracleError, match="cannot carry") as exc:
        ChatClient("http://127.0.0.1:9/v1", "m", key_env="ORACLE_TEST_KEY")
    assert KEY not in str(exc.value) and "sk two" not in str(exc.value)


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:99999/v1", "http://[::1/v1", "http:///v1", "ftp://host/v1", "http://h /v1", "http://u:p@host/v1"]
)
def test_a_malformed_url_is_one_clean_error(url):
    with pytest.raises(OracleError, match="--llm-base-url"):
        ChatClient(url, "m")


def _raw_server(reply) -> tuple[socket.socket, str]:
    """A TCP server on loopback that reads a request and answers with ``reply(conn)`` (raw bytes)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)

    def serve():
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            try:
                conn.recv(65536)
                reply(conn)
            except OSError:
                pass
            finally:
                conn.close()

    threading.Thread(target=serve, daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.getsockname()[1]}/v1"


def _send(data: bytes):
    return lambda conn: conn.sendall(data)


BODY = json.dumps({"choices": [{"message": {"content": "{}"}}]}).encode()


@pytest.mark.parametrize(
    "reply",
    [
        _send(b"NONSENSE\r\n\r\n"),  # BadStatusLine
        _send(b"HTTP/1.1 200 OK\r\nContent-Length: 500\r\n\r\n" + BODY),  # IncompleteRead
        _send(b"HTTP/1.1 200 OK\r\nX-Long: " + b"a" * 70_000 + b"\r\n\r\n"),  # LineTooLong
        _send(b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(200)) + b"\r\n"),  # too many headers
        _send(b""),  # closed without a word (RemoteDisconnected)
        _send(b"HTTP/1.1 200 OK\r\nContent-Length: 99999999999\r\n\r\n"),  # declares more than the bound
    ],
    ids=["bad-status", "incomplete", "line-too-long", "many-headers", "hang-up", "huge-length"],
)
def test_broken_http_is_one_clean_error_without_the_key(monkeypatch, reply):
    monkeypatch.setenv("ORACLE_TEST_KEY", KEY)
    srv, url = _raw_server(reply)
    try:
        with pytest.raises(OracleError) as exc:
            ChatClient(url, "m", key_env="ORACLE_TEST_KEY", timeout_s=5).chat(HI)
        assert KEY not in str(exc.value) and "\n" not in str(exc.value)
    finally:
        srv.close()


def test_headers_dripped_a_byte_at_a_time_hit_the_one_deadline():
    def drip(conn):
        for b in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 1000:
            conn.sendall(bytes([b]))
            time.sleep(0.05)

    srv, url = _raw_server(drip)
    try:
        t = time.monotonic()
        with pytest.raises(OracleError, match="within 1.5 s"):
            ChatClient(url, "m", timeout_s=1.5).chat(HI)
        assert time.monotonic() - t < 6.0  # one deadline for the whole exchange, not per byte
    finally:
        srv.close()
