"""A minimal client for OpenAI-compatible chat-completions servers (vLLM, llama.cpp, Ollama, OpenAI).

POST {base_url}/chat/completions with the model, the messages and temperature 0, asking for a
JSON object; the reply's first choice's message content is returned as text (the caller parses
it against its schema). The API key, if any, is read from an environment variable.

A server is untrusted input: every request has a total deadline (a server that drips one byte
at a time cannot hang the command), the reply is bounded in size and in JSON nesting depth
before it is parsed, and a 429 or 5xx answer is retried once after a short backoff.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from typing import Any

from bottleneck_oracle.errors import OracleError

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


class ChatClient:
    def __init__(self, base_url: str, model: str, key_env: str = "OPENAI_API_KEY", timeout_s: float = 120.0) -> None:
        """``timeout_s``: the total deadline of one request (connect, send, every byte of the reply)."""
        if not base_url.startswith(("http://", "https://")):
            raise OracleError(f"--llm-base-url must be an http(s) URL (found {base_url!r})")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.key = os.environ.get(key_env, "")
        self.timeout = timeout_s
        self.calls = 0

    def chat(self, messages: list[dict]) -> str:
        body = {"model": self.model, "messages": messages, "temperature": 0, "response_format": {"type": "json_object"}}
        req = urllib.request.Request(
            f"{self.base_url}/chat/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json", **({"Authorization": f"Bearer {self.key}"} if self.key else {})},
            method="POST",
        )
        self.calls += 1
        for attempt in (1, 2):
            try:
                raw = self._post(req)
                break
            except urllib.error.HTTPError as exc:
                if attempt == 1 and (exc.code == 429 or exc.code >= 500):
                    time.sleep(RETRY_AFTER_S)
                    continue
                raise OracleError(f"{self.base_url}: the LLM server answered HTTP {exc.code} ({exc.reason})") from None
            except (urllib.error.URLError, TimeoutError, OSError) as exc:
                raise OracleError(f"{self.base_url}: cannot reach the LLM server ({getattr(exc, 'reason', exc)})") from None
        if len(raw) > MAX_REPLY_BYTES:
            raise OracleError(f"{self.base_url}: the LLM reply is larger than {MAX_REPLY_BYTES} bytes")
        try:
            doc: Any = loads_bounded(raw)  # JSON: checked by the lookups below
            content = doc["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise OracleError(f"{self.base_url}: not a chat-completions reply") from None
        if not isinstance(content, str):
            raise OracleError(f"{self.base_url}: the reply's message content is not text")
        return content

    def _post(self, req: urllib.request.Request) -> bytes:
        """The reply's bytes (at most MAX_REPLY_BYTES + 1), within the total deadline."""
        deadline = time.monotonic() + self.timeout
        chunks, total = [], 0
        with urllib.request.urlopen(req, timeout=min(self.timeout, 30.0)) as resp:
            while total <= MAX_REPLY_BYTES:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no complete reply within {self.timeout:g} s")
                sock = getattr(getattr(getattr(resp, "fp", None), "raw", None), "_sock", None)
                if sock is not None:
                    sock.settimeout(max(min(left, 30.0), 0.01))
                chunk = resp.read1(_CHUNK) if hasattr(resp, "read1") else resp.read(_CHUNK)
                if not chunk:
                    break
                chunks.append(chunk)
                total += len(chunk)
        return b"".join(chunks)
