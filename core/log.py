"""Logging setup with secret redaction (leaf module).

Secrets come from the environment (SERPER_API_KEY, OPENAI_API_KEY, HF_TOKEN, ...). The filter
below replaces their values wherever they would appear in a log record, so a URL or header that
carries a key never reaches a log file or the console.
"""

from __future__ import annotations

import logging
import os
import re

SECRET_ENV_PATTERN = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD)", re.IGNORECASE)


def secret_values() -> list[str]:
    """Values of environment variables whose names look like secrets (at least 6 chars long)."""
    return [v for k, v in os.environ.items() if SECRET_ENV_PATTERN.search(k) and len(v) >= 6]


def redact(text: str) -> str:
    """Replace every known secret value in `text` with `***`."""
    for value in secret_values():
        text = text.replace(value, "***")
    return text


class RedactSecrets(logging.Filter):
    """Logging filter that redacts secret values from the fully formatted message."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = redact(message)
        if clean != message:
            record.msg, record.args = clean, None
        return True


def get_logger(name: str) -> logging.Logger:
    """A module logger whose records are always redacted."""
    logger = logging.getLogger(name)
    if not any(isinstance(f, RedactSecrets) for f in logger.filters):
        logger.addFilter(RedactSecrets())
    return logger


def setup_logging(level: str = "WARNING", file: str | os.PathLike | None = None) -> None:
    """Configure the root logger once: console (stderr) plus an optional run log file."""
    handlers: list[logging.Handler] = [logging.StreamHandler()]
    if file is not None:
        handlers.append(logging.FileHandler(file))
    for h in handlers:
        h.addFilter(RedactSecrets())
    logging.basicConfig(level=level, handlers=handlers, format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True)
