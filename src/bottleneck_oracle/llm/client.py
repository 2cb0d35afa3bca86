"""A minimal client for OpenAI-compatible chat-completions servers (vLLM, llama.cpp, Ollama, OpenAI).

POST {base_url}/chat/completions with the model, the messages and temperature 0, asking for a
JSON object; the reply's first choice's message content is returned as text (the caller parses
it against its schema). The API key, if any, is read from an environment variable.

A server is untrusted input: every request has one total deadline, headers included (a server
that drips one byte at a time cannot hang the command: a watchdog closes the socket when it
passes), the reply is bounded in size and in JSON nesting depth before it is parsed, and a 429
or 5xx answer is retried once after a short backoff. Redirects are never followed (a 3xx is an
error): the request carries the API key, which must not reach another host. The key is checked
before it is sent and never appears in a message, nor in a reply shown (a server that echoes it
back gets ``***`` printed).
"""

from __future__ import annotations

import http.client
import json
import os
import re
import socket
import ssl
import threading
import time
import urllib.parse
from typing import Any

from bottleneck_oracle.errors import OracleError
from bottleneck_oracle.inert import UNSAFE, plain

MAX_REPLY_BYTES = 1_000_000
MAX_DEPTH = 64  # JSON nesting the parser is given (a 100k-deep reply would exhaust Python's recursion)
RETRY_AFTER_S = 1.0  # backoff before the one retry of a 429 / 5xx answer
_CHUNK = 16_384


def json_depth(text: str | bytes, limit: int = MAX_DEPTH) -> int:
    """The nesting depth of a JSON text (brackets outside strings), counted up to ``limit + 1``."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    depth = best = 0
    in_str = esc = False
    for ch in text:
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "[{":
            depth += 1
            if depth > best:
                best = depth
                if best > limit:
                    return best
        elif ch in "]}":
            depth -= 1
    return best


def loads_bounded(text: str | bytes, limit: int = MAX_DEPTH) -> object:
    """json.loads of untrusted text with its nesting bounded: ValueError beyond ``limit``."""
    if json_depth(text, limit) > limit:
        raise ValueError(f"JSON nested deeper than {limit} levels")
    return json.loads(text)


# An API key is a bearer token: printable ASCII without spaces (RFC 6750's b64token and more).
_KEY = re.compile(r"[\x21-\x7e]+")


class _Retry(Exception):
    """A 429 or 5xx answer, worth one more try."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(status, reason)
        self.status, self.reason = status, reason


class ChatClient:
    def __init__(self, base_url: str, model: str, key_env: str = "OPENAI_API_KEY", timeout_s: float = 120.0) -> None:
        """``timeout_s``: the total deadline of one request (connect, send, headers, every byte of the reply)."""
        shown = plain(base_url)
        try:
            parts = urllib.parse.urlsplit(base_url)
            port = parts.port  # ValueError on a port that is not a number in range
        except ValueError:
            raise OracleError(f"--llm-base-url: not a valid URL ({shown})") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise OracleError(f"--llm-base-url must be an http(s) URL with a host (found {shown})")
        if parts.username or parts.password:
            raise OracleError("--llm-base-url: put the API key in the environment variable (--llm-key-env), not in the URL")
        if any(c.isspace() for c in base_url) or UNSAFE.search(base_url):
            raise OracleError(f"--llm-base-url: the URL holds spaces, control or formatting characters ({shown})")
        self.scheme, self.host = parts.scheme, parts.hostname
        self.port = port or (443 if parts.scheme == "https" else 80)
        self.path = parts.path.rstrip("/") + "/chat/completions"
        self.base_url = base_url.rstrip("/")
        self.model = model
        key = os.environ.get(key_env, "")
        if key and not _KEY.fullmatch(key):
            raise OracleError(
                f"the API key in ${key_env} holds characters an HTTP header cannot carry (spaces, line ends, quotes "
                "outside ASCII); the key is not shown"
            )
        self.key = key
        self.timeout = timeout_s
        self.calls = 0

    def chat(self, messages: list[dict[str, str]]) -> str:
        body = json.dumps(
            {"model": self.model, "messages": messages, "temperature": 0, "response_format": {"type": "json_object"}}
        ).encode()
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.key:
            headers["Authorization"] = f"Bearer {self.key}"
        self.calls += 1
        for attempt in (1, 2):
            try:
                raw = self._post(body, headers)
                break
            except _Retry as exc:
                if attempt == 1:
                    time.sleep(RETRY_AFTER_S)
                    continue
                raise self._error(f"the LLM server answered HTTP {exc.status} ({exc.reason})") from None
        try:
            doc: Any = loads_bounded(raw)  # JSON: checked by the lookups below
            content = doc["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise self._error("not a chat-completions reply") from None
        if not isinstance(content, str):
            raise self._error("the reply's message content is not text")
        return content.replace(self.key, "***") if len(self.key) >= 8 else content  # a server echoing the key back does not get it shown

    def _error(self, problem: str) -> OracleError:
        """One line naming the server; the key never appears in it."""
        msg = f"{plain(self.base_url)}: {problem}"
        return OracleError(msg.replace(self.key, "***") if self.key else msg)

    def _post(self, body: bytes, headers: dict[str, str]) -> bytes:
        """The reply's bytes (at most MAX_REPLY_BYTES), within one total deadline for the whole exchange."""
        conn: http.client.HTTPConnection
        if self.scheme == "https":
            conn = http.client.HTTPSConnection(self.host, self.port, timeout=self.timeout, context=ssl.create_default_context())
        else:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        expired = threading.Event()
        held: list[socket.socket] = []  # the connection's socket: http.client drops conn.sock on a closing reply

        def expire() -> None:  # the deadline passed: whatever read is under way fails at once
            expired.set()
            for sock in held:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

        watchdog = threading.Timer(self.timeout, expire)
        watchdog.daemon = True
        watchdog.start()
        try:
            conn.connect()
            if conn.sock is not None:
                held.append(conn.sock)
            if expired.is_set():
                raise TimeoutError
            conn.request("POST", self.path, body=body, headers=headers)
            resp = conn.getresponse()
            if 300 <= resp.status < 400:
                where = plain(resp.getheader("Location") or "nowhere")[:200]
                raise self._error(
                    f"the LLM server answered HTTP {resp.status}, a redirect to {where}; redirects are not followed "
                    "(the request carries the API key): give the final URL as --llm-base-url"
                )
            if resp.status == 429 or resp.status >= 500:
                raise _Retry(resp.status, plain(resp.reason)[:200])
            if resp.status != 200:
                raise self._error(f"the LLM server answered HTTP {resp.status} ({plain(resp.reason)[:200]})")
            length = resp.getheader("Content-Length")
            if length is not None and length.strip().isdigit() and int(length) > MAX_REPLY_BYTES:
                raise self._error(f"the LLM reply is larger than {MAX_REPLY_BYTES} bytes")
            chunks, total = [], 0
            while True:
                chunk = resp.read1(_CHUNK) if hasattr(resp, "read1") else resp.read(_CHUNK)
                if not chunk:
                    break
                chunks.append(chunk)
                total += len(chunk)
                if total > MAX_REPLY_BYTES:
                    raise self._error(f"the LLM reply is larger than {MAX_REPLY_BYTES} bytes")
            if expired.is_set():
                raise TimeoutError
            declared = int(length) if length is not None and length.strip().isdigit() else None
            if declared is not None and total < declared:  # (read1 can end at the hang-up without saying so)
                raise self._error(f"the LLM reply ended early ({total} of the {declared} bytes it declared)")
            return b"".join(chunks)
        except (OracleError, _Retry):
            raise
        except TimeoutError:
            raise self._error(f"no complete reply within {self.timeout:g} s") from None
        except (http.client.HTTPException, OSError, ValueError, UnicodeError) as exc:
            if expired.is_set():
                raise self._error(f"no complete reply within {self.timeout:g} s") from None
            detail = f"{type(exc).__name__}: {plain(str(exc))[:200]}"
            if isinstance(exc, (http.client.HTTPException, ValueError, UnicodeError)):
                raise self._error(f"the LLM server's reply is not valid HTTP ({detail})") from None
            raise self._error(f"cannot reach the LLM server ({detail})") from None
        finally:
            watchdog.cancel()
            conn.close()
