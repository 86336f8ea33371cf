"""Tools for the search agent: web search, page access and local retrieval.

Modules, from the agent's view inward:
  factory     `build_tools(cfg)` -> {"search": SearchTool, "access": AccessTool}
  search      SearchTool + providers (local index, Search-R1 `/retrieve` URL, Serper)
  page_access AccessTool: local page store, guarded web fetch, numbered chunks
  base, cache BaseTool (timeout, concurrency, retries, cache, accounting) and the SQLite cache
  urlguard    SSRF protection: scheme/credential/host/IP checks, DNS pinning, redirect re-checks
  extract     HTML (trafilatura) / PDF (pypdf) / text -> title + markdown; chunking
  encoder     dense text encoder (packaged MiniLM or any HF/sentence-transformers folder)
  index       `hexsearch index build`, `default_index(world)`
  docstore    on-disk document and page stores (SQLite)
  retriever   Retriever: encode + FAISS search + document fetch, with a query-embedding cache
  batcher     RetrievalBatcher: cross-request micro-batching
  runners     where batches run: worker thread or worker process
See docs/tools.md.
"""
