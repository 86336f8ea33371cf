# hexsearch: `make demo` runs the main job on the CPU default, `make test` runs the suite.
# Both run `setup` first; setup is idempotent and cheap when nothing changed.
VENV ?= .venv
HEX := $(VENV)/bin/hexsearch
PYTEST_ARGS ?=

export TOKENIZERS_PARALLELISM := false

.PHONY: setup demo demo-long test test-slow bench lint clean

setup:
	@scripts/setup.sh

demo: setup
	$(HEX) demo

# The long-horizon recipe: SFT cold start, async RL, per-bucket test evaluation (over an hour on 2 cores)
demo-long: setup
	$(HEX) demo-long

# Two pytest-xdist workers, one test file at a time each, longest files first (tests/conftest.py): the long
# tests wait on Ray, servers and subprocesses often enough that two overlap on 2 cores. TEST_WORKERS=0: serial.
TEST_WORKERS ?= 2
test: setup
	$(VENV)/bin/python -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

test-slow: setup
	$(VENV)/bin/python -m pytest -m slow $(PYTEST_ARGS)

bench: setup
	@set -e; for b in benchmarks/[!_]*.py; do echo "== $$b"; $(VENV)/bin/python $$b; done
	$(VENV)/bin/python benchmarks/_report.py

lint: setup
	$(VENV)/bin/ruff check .

clean:
	rm -rf runs .pytest_cache .ruff_cache
