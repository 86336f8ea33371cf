"""Tool configuration (section `tools`)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ToolsConfig:
    search_backend: str = "local"
    """Web search provider: `local` (FAISS index), `serper` (Google via Serper) or `url` (a Search-R1 `/retrieve` URL)."""
    index_dir: str = ""
    """Local retrieval index folder (`hexsearch index build`). Empty: the default world's index."""
    retrieval_url: str = ""
    """Base URL of a Search-R1-compatible retrieval service, for the `url` backend."""
    topk: int = 5
    """Search results returned per query."""
    allow_hosts: list[str] = field(default_factory=list)
    """Hosts or CIDRs page access may fetch even though they are private/loopback (e.g. a test fixture server)."""
    timeout_s: float = 30.0
    """Per-call timeout of every tool, in seconds."""
    max_concurrency: int = 32
    """Concurrent calls per tool (a semaphore)."""
    retries: int = 3
    """Retries with exponential backoff on transient errors (timeouts, 429, 5xx)."""
    cache_path: str = ""
    """SQLite cache of tool results. Empty: `<cache dir>/tools.sqlite`."""
    cache_ttl_s: float = 7 * 24 * 3600.0
    """Seconds a cached tool result stays valid."""
    max_page_bytes: int = 5_000_000
    """Largest page body page access downloads."""
    page_chunk_chars: int = 4000
    """Characters per numbered page chunk shown to the agent."""
    max_page_chunks: int = 10
    """Most chunks kept per page."""
