"""Utilities every package uses, below all of them: logging with secret redaction (core.log), progress
bars (core.progress), the run folder (core.rundir) and component registries (core.registry).
Nothing here imports another hexsearch package."""
