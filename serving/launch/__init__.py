"""Starting servers as subprocesses (health checks, run-folder records, clean stops) and setting up the
vLLM-CPU virtual environment they run in."""
