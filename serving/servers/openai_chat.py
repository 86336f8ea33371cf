"""A small async client of any OpenAI-compatible chat-completions endpoint (messages in, text out).

    client = OpenAIChatClient("https://api.openai.com/v1", "gpt-4o-mini")        # key from $OPENAI_API_KEY
    text = await client.chat(messages, temperature=0.0, max_tokens=256)
    await client.aclose()

It exists for callers that need an LLM's *text* rather than token ids and log-probs — the LLM judge
(agent.judge) above all — so that they can use hosted APIs (OpenAI, Together, Groq, ...), a vLLM or
SGLang server, or our own engine server (serving.servers.engine_server) without a tokenizer. Training
rollouts never go through it: they need the InferenceEngine protocol (serving.protocol).

Base URL. Give the API base, the part before `/chat/completions`: `https://api.openai.com/v1`,
`http://127.0.0.1:8000/v1`. A URL with no path at all (`http://127.0.0.1:8000`, as vLLM, SGLang and
our server are usually named) gets `/v1` appended; any other path is used as given (providers whose
base is not `/v1`, e.g. `.../v1beta/openai`, work unchanged); a pasted full endpoint ending in
`/chat/completions` is accepted too. A URL without a scheme is taken as `http://`.

Credentials. The API key is read from the environment variable `api_key_env` at every call (never
stored on the object, never put in a config) and sent as `Authorization: Bearer <key>`. An empty
`api_key_env` sends no Authorization header (a local server without a key). Every error message and
log line is scrubbed of the key's value and of every secret-looking environment value
(core.log.redact), and httpx exceptions are not chained, so the key cannot leak through a traceback.

Errors. 408/409/429/5xx replies, connection failures and timeouts are retried up to `max_retries`
times with exponential backoff (jittered, capped at `max_backoff_s`); a `Retry-After` (or
`retry-after-ms`) header is honoured, capped the same way. Other statuses fail at once with one line:
the URL, the status and the server's own error message. A 400 that asks for `max_completion_tokens`
(OpenAI's reasoning models refuse `max_tokens`) switches that parameter once and resends.
"""

from __future__ import annotations

import asyncio
import os
import random
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

from core.log import get_logger, redact
from core.retry import parse_retry_after

log = get_logger(__name__)

RETRYABLE_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})
"""Statuses retried (besides any other 5xx): the request produced no result and may succeed later."""


class OpenAIChatError(RuntimeError):
    """A chat-completions call failed; the message is one redacted line (URL, status, server message)."""

    def __init__(self, message: str, *, status: int | None = None, retryable: bool = False):
        super().__init__(message)
        self.status = status
        self.retryable = retryable


class MissingAPIKey(OpenAIChatError):
    """The environment variable that should hold the API key is unset or empty."""


def api_base(url: str) -> str:
    """The normalised API base of `url` (see module docstring): scheme added, `/v1` added to a bare host."""
    url = url.strip().rstrip("/")
    if not url:
        raise ValueError("an OpenAI-compatible endpoint needs a base URL, e.g. https://api.openai.com/v1")
    if "://" not in url:
        url = "http://" + url
    if url.endswith("/chat/completions"):
        url = url[: -len("/chat/completions")].rstrip("/")
    parts = urlsplit(url)
    if parts.path in ("", "/"):
        url = urlunsplit((parts.scheme, parts.netloc, "/v1", parts.query, parts.fragment))
    return url


def public_url(url: str) -> str:
    """`url` without user:password, query string or fragment, and with secret values redacted (for records)."""
    parts = urlsplit(url)
    host = parts.netloc.rsplit("@", 1)[-1]
    return redact(urlunsplit((parts.scheme, host, parts.path, "", "")))


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit] + "..."


def _server_message(response: httpx.Response) -> str:
    """The server's own error message (OpenAI `{"error": {"message"}}`, FastAPI `{"detail"}`, or the text)."""
    try:
        body = response.json()
    except ValueError:
        return _one_line(response.text) or response.reason_phrase or "no message"
    if isinstance(body, dict):
        err = body.get("error", body.get("detail", body.get("message")))
        if isinstance(err, dict):
            err = err.get("message") or err
        if err:
            return _one_line(err if isinstance(err, str) else str(err))
    return _one_line(response.text)


def _retry_after(response: httpx.Response) -> float | None:
    """Seconds to wait from `retry-after-ms` or `Retry-After` (delta seconds or an HTTP date), else None."""
    ms = response.headers.get("retry-after-ms")
    if ms:
        try:
            return max(0.0, float(ms) / 1000.0)
        except ValueError:
            pass
    return parse_retry_after(response.headers.get("retry-after"))


def _content(data: Any) -> str:
    """The text of the first choice (`content` as a string or as a list of text parts; None -> "")."""
    try:
        message = data["choices"][0]["message"]
    except (KeyError, IndexError, TypeError):
        raise ValueError("reply has no choices[0].message") from None
    content = message.get("content") if isinstance(message, dict) else None
    if content is None:
        return ""
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content)


class OpenAIChatClient:
    """Async client of `POST {base_url}/chat/completions` (see module docstring)."""

    def __init__(self, base_url: str, model: str, *, api_key_env: str | None = "OPENAI_API_KEY",
                 timeout_s: float = 120.0, max_retries: int = 3, backoff_s: float = 1.0, max_backoff_s: float = 30.0,
                 connect_timeout_s: float = 10.0):
        """`timeout_s` bounds one HTTP attempt; `max_retries` extra attempts follow a retryable failure."""
        if not model:
            raise ValueError("an OpenAI-compatible endpoint needs a model name")
        self.base_url = api_base(base_url)
        self.endpoint = self.base_url + "/chat/completions"
        self.model = model
        self.api_key_env = api_key_env or ""
        self.timeout_s = timeout_s
        self.max_retries = max(0, int(max_retries))
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.connect_timeout_s = connect_timeout_s
        self.token_param = "max_tokens"
        """Name of the output-length field; switched to `max_completion_tokens` when the server asks for it."""
        self.stats = {"calls": 0, "retries": 0, "errors": 0}
        self._client: httpx.AsyncClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def __repr__(self) -> str:
        return (f"OpenAIChatClient(base_url={public_url(self.base_url)!r}, model={self.model!r}, "
                f"api_key_env={self.api_key_env!r})")

    # ---- calls ----------------------------------------------------------------------------------

    def _key(self) -> str | None:
        """The API key, read now from the environment (None when no key is configured)."""
        if not self.api_key_env:
            return None
        key = os.environ.get(self.api_key_env, "").strip()
        if not key:
            raise MissingAPIKey(f"the API key of {public_url(self.base_url)} is missing: environment variable "
                                f"{self.api_key_env} is not set or empty (set it, or set api_key_env='' for an "
                                "endpoint without a key)")
        return key

    def _scrub(self, text: str, key: str | None) -> str:
        if key:
            text = text.replace(key, "***")
        return redact(text)

    def _http(self) -> httpx.AsyncClient:
        """The HTTP client of the running event loop (a new one when the loop changed)."""
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop or self._client.is_closed:
            self._client = httpx.AsyncClient(timeout=httpx.Timeout(self.timeout_s, connect=self.connect_timeout_s))
            self._loop = loop
        return self._client

    def _backoff(self, attempt: int) -> float:
        return min(self.max_backoff_s, self.backoff_s * 2 ** attempt * random.uniform(0.5, 1.0))

    async def chat(self, messages: list[dict[str, Any]], *, temperature: float, max_tokens: int,
                   seed: int | None = None, usage: dict[str, Any] | None = None) -> str:
        """The assistant text of one chat completion (retrying transient failures; see module docstring).
        `usage`, when given, receives the reply's token counts (`prompt_tokens`, `completion_tokens`)."""
        key = self._key()
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        client = self._http()
        attempt, switched = 0, False
        while True:
            body: dict[str, Any] = {"model": self.model, "messages": messages, "temperature": temperature,
                                    self.token_param: max_tokens}
            if seed is not None:
                body["seed"] = seed
            self.stats["calls"] += 1
            wait: float | None = None
            try:
                response = await client.post(self.endpoint, json=body, headers=headers)
            except httpx.HTTPError as e:  # connect/read/write failures and timeouts: no reply to read
                error = OpenAIChatError(self._scrub(
                    f"{public_url(self.endpoint)}: {type(e).__name__}: {_one_line(str(e)) or 'no reply'}", key),
                    retryable=True)
            else:
                if response.status_code == 200:
                    try:
                        data = response.json()
                        text = _content(data)
                        if usage is not None and isinstance(data.get("usage"), dict):
                            usage.update(data["usage"])
                        return text
                    except ValueError as e:
                        self.stats["errors"] += 1
                        raise OpenAIChatError(self._scrub(
                            f"{public_url(self.endpoint)}: malformed reply ({e}): {_one_line(response.text)}",
                            key), status=200) from None
                message = self._scrub(_server_message(response), key)
                status = response.status_code
                if (status == 400 and not switched and self.token_param == "max_tokens"
                        and "max_completion_tokens" in message):
                    self.token_param, switched = "max_completion_tokens", True
                    continue
                retryable = status in RETRYABLE_STATUS or status >= 500
                error = OpenAIChatError(f"{public_url(self.endpoint)}: HTTP {status}: {message}", status=status,
                                        retryable=retryable)
                if retryable:
                    wait = _retry_after(response)
            if not error.retryable or attempt >= self.max_retries:
                self.stats["errors"] += 1
                if error.retryable and self.max_retries:
                    raise OpenAIChatError(f"{error} (gave up after {attempt + 1} attempts)", status=error.status,
                                          retryable=True) from None
                raise error
            wait = min(self.max_backoff_s, wait) if wait is not None else self._backoff(attempt)
            attempt += 1
            self.stats["retries"] += 1
            log.warning("%s; retry %d/%d in %.1fs", error, attempt, self.max_retries, wait)
            await asyncio.sleep(wait)

    async def aclose(self) -> None:
        """Close the HTTP connection pool (the client can still be used afterwards: it reopens)."""
        client, self._client = self._client, None
        if client is not None and not client.is_closed:
            try:
                await client.aclose()
            except RuntimeError:  # created on an event loop that has since closed
                pass
