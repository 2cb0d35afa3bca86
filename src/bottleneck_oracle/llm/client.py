"""A minimal client for OpenAI-compatible chat-completions servers (vLLM, llama.cpp, Ollama, OpenAI).

POST {base_url}/chat/completions with the model, the messages and temperature 0, asking for a
JSON object; the reply's first choice's message content is returned as text (the caller parses
it against its schema). The API key, if any, is read from an environment variable.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request

from bottleneck_oracle.errors import OracleError

MAX_REPLY_BYTES = 1_000_000


class ChatClient:
    def __init__(self, base_url: str, model: str, key_env: str = "OPENAI_API_KEY", timeout_s: float = 120.0) -> None:
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
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                raw = resp.read(MAX_REPLY_BYTES + 1)
        except urllib.error.HTTPError as exc:
            raise OracleError(f"{self.base_url}: the LLM server answered HTTP {exc.code} ({exc.reason})") from None
        except (urllib.error.URLError, TimeoutError, OSError) as exc:
            raise OracleError(f"{self.base_url}: cannot reach the LLM server ({getattr(exc, 'reason', exc)})") from None
        if len(raw) > MAX_REPLY_BYTES:
            raise OracleError(f"{self.base_url}: the LLM reply is larger than {MAX_REPLY_BYTES} bytes")
        try:
            doc = json.loads(raw)
            content = doc["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise OracleError(f"{self.base_url}: not a chat-completions reply") from None
        if not isinstance(content, str):
            raise OracleError(f"{self.base_url}: the reply's message content is not text")
        return content
