"""HTTP servers on loopback: the engine server (our protocol and an OpenAI-compatible API over any engine),
the retrieval server, the OpenAI chat client the judge and datagen roles use, and the request guard they
share (Host/Origin checks, bearer token)."""
