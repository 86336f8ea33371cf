"""hexsearch: train LLM search agents with fully asynchronous RL.

This package is the front door (CLI, config loading). It sits above every other package; the
utilities they share (logging, run folders, progress bars, registries) live in `core/`.
"""

__version__ = "0.1.0"
