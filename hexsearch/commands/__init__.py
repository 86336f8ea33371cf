"""CLI command groups; each module has `register(app)`."""
