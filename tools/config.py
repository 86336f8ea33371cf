"""Tool configuration (section `tools`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from core.ranges import ranged

SearchBackend = Literal["local", "url", "serper"]
RetrievalWorker = Literal["thread", "process"]


@dataclass
class MCPServerConfig:
    """One Model Context Protocol server whose tools become agent tools (stdio `command` or HTTP `url`)."""

    name: str = ""
    """Server name (in messages, metrics and `hexsearch tools list`)."""
    command: str = ""
    """stdio transport: the program that runs the server (e.g. `python`, `npx`)."""
    args: list[str] = field(default_factory=list)
    """stdio transport: its arguments."""
    env: dict[str, str] = field(default_factory=dict)
    """stdio transport: extra environment variables (plain values; secrets go in `env_passthrough`)."""
    env_passthrough: list[str] = field(default_factory=list)
    """Names of environment variables copied into the server's environment when it starts (API keys):
    their values never appear in configs, run folders or logs."""
    url: str = ""
    """Streamable HTTP transport: the server's MCP endpoint, e.g. http://127.0.0.1:8000/mcp."""
    bearer_token_env: str = ""
    """HTTP transport: environment variable holding a bearer token sent as `Authorization` (only over https://, or
    plain http:// to a loopback host: a plain-HTTP URL elsewhere is refused, the token would cross in clear)."""
    tools: list[str] = field(default_factory=list)
    """Only these of the server's tools (empty: all of them)."""
    prefix: str = ""
    """Prepended to the server's tool names (avoids clashes between servers)."""
    connect_timeout_s: float = 30.0
    """Seconds to start/connect to the server and list its tools."""


@dataclass
class ToolsConfig:
    builtin: list[str] = field(default_factory=lambda: ["search", "access"])
    """Built-in tools the agent gets: names in tools.builtin.BUILTIN_TOOLS (`search`, `access`) or a builder
    `pkg.mod:fn`; [] for only `components` and MCP tools."""
    components: list[dict[str, Any]] = field(default_factory=list)
    """User tools by import path: `{_component_: "pkg.mod:Class", **kwargs}` builds `Class(**kwargs)`, an object
    with the Tool protocol (`name`, `schema`, `async __call__(args) -> Observation`). Each gets the built-in
    guarantees (timeout, concurrency limit, errors as observations, latency accounting); see docs/extending.md."""
    mcp_servers: list[MCPServerConfig] = field(default_factory=list)
    """MCP servers whose tools become agent tools (see MCPServerConfig)."""
    search_backend: SearchBackend = "local"
    """Web search provider: `local` (FAISS index), `serper` (Google via Serper) or `url` (a Search-R1 `/retrieve` URL)."""
    index_dir: str = ""
    """Local retrieval index folder (`hexsearch index build`). Empty: the default world's index."""
    retrieval_url: str = ""
    """Base URL of a Search-R1-compatible retrieval service, for the `url` backend."""
    topk: int = ranged(5, ge=1)
    """Search results returned per query."""
    snippet_chars: int = ranged(1000, ge=1)
    """Longest snippet shown per search result (local and `url` backends return whole passages)."""
    search_show_urls: bool = True
    """Show each search result's URL line (the agent needs it to `access` a page; a search-only agent on
    short passages saves ~20 tokens per result without it, which on CPU is a fifth of a long episode)."""
    serper_url: str = "https://google.serper.dev/search"
    """Serper endpoint (overridable for a proxy or a test server)."""
    serper_api_key_env: str = "SERPER_API_KEY"
    """Environment variable holding the Serper API key (keys never go in config files or logs)."""
    serper_cost_per_query: float = 0.001
    """Dollars per Serper query, for cost accounting."""
    allow_hosts: list[str] = field(default_factory=list)
    """Hosts or CIDRs page access may fetch even though they are private/loopback (e.g. a test fixture server)."""
    allow_ports: list[int] = field(default_factory=lambda: [80, 443])
    """Ports page access may fetch on hosts that are not in `allow_hosts`."""
    web_access: bool = True
    """Let `access` fetch URLs that are not in the local page store (through the URL guard)."""
    pages_path: str = ""
    """Page store for local-world URLs: pages.jsonl or pages.sqlite. Empty: the index folder's pages.sqlite."""
    timeout_s: float = ranged(30.0, gt=0)
    """Per-call timeout of every tool, in seconds."""
    latency_median_s: float = 0.0
    """Simulated extra latency per tool call, log-normal with this median (0: off): web-API latency on local
    tools, for measuring what asynchrony buys (tools/latency.py; draws fixed by run seed, tool, episode, call)."""
    latency_p99_s: float = 5.0
    """99th percentile of the simulated tool latency."""
    max_concurrency: int = ranged(32, ge=1)
    """Concurrent calls per tool (a semaphore)."""
    retries: int = 3
    """Retries with exponential backoff on transient errors (timeouts, 429, 5xx)."""
    backoff_initial_s: float = 0.5
    """First retry delay; doubles per retry (with jitter) up to `backoff_max_s`."""
    backoff_max_s: float = 8.0
    """Longest delay between retries, unless the server's Retry-After asks for more."""
    max_retry_after_s: float = 30.0
    """Longest Retry-After (429/503) honoured; longer requests are capped to this."""
    cache_enabled: bool = True
    """Keep a persistent cache of successful tool results."""
    cache_path: str = ""
    """SQLite cache of tool results. Empty: `<cache dir>/tools.sqlite`."""
    cache_ttl_s: float = 7 * 24 * 3600.0
    """Seconds a cached tool result stays valid."""
    max_page_bytes: int = ranged(5_000_000, ge=1)
    """Largest page body page access downloads."""
    max_redirects: int = 5
    """Redirect hops page access follows (each one re-checked by the URL guard)."""
    content_types: list[str] = field(default_factory=lambda: [
        "text/html", "application/xhtml+xml", "text/plain", "text/markdown", "application/pdf"])
    """Content types page access reads; anything else is refused."""
    page_chunk_chars: int = ranged(4000, ge=1)
    """Characters per numbered page chunk shown to the agent."""
    max_page_chunks: int = ranged(10, ge=1)
    """Most chunks kept per page."""
    retrieval_max_batch: int = ranged(64, ge=1)
    """Most queries batched together: encoded at once (`local`) or sent in one request (`url`)."""
    retrieval_max_wait_ms: float = 2.0
    """How long a retrieval batch waits for more queries after the first one arrives (`local` and `url`)."""
    query_cache_size: int = 10_000
    """Query embeddings kept in the retriever's LRU cache."""
    threads: int = 0
    """Torch/FAISS threads for the local retriever (0: leave the library defaults)."""
    retrieval_worker: RetrievalWorker = "thread"
    """Where the `local` backend encodes: `thread` (in this process) or `process` (a worker process; no GIL contention with the agent)."""
