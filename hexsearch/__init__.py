"""hexsearch: train LLM search agents with fully asynchronous RL.

This package is the front door (CLI, config loading). Its leaf modules `hexsearch.log`,
`hexsearch.rundir` and `hexsearch.progress` import nothing else from the project, so the
lower packages (agent, tools, serving, ...) may use them without creating a cycle.
"""

__version__ = "0.1.0"
