#!/usr/bin/env bash
# Idempotent setup of .venv-trl: Hugging Face TRL in its own virtual environment, for the peer
# benchmark benchmarks/vs_trl.py only (TRL brings its own transformers/accelerate/datasets versions,
# which must not touch the project's .venv). jmespath is what TRL's tool loop asks for; jsonschema is
# what hexsearch's Hermes parser (imported from the checkout by benchmarks/_trl_arm.py) validates
# tool arguments with. Safe to re-run: a stamp file records what was installed, so a second run
# costs ~0.1 s. Called by benchmarks/vs_trl.py itself.
#
# CPU machine: the CPU torch is installed first, alone and pinned, so TRL's `torch>=` requirement is
# already met and pip never pulls the multi-GB CUDA build.
#
# Env: TRL_VENV (default .venv-trl), PYTHON (default python3), HEXSEARCH_CPU_TORCH (2.13.0),
#      HEXSEARCH_TRL (1.16.0).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${TRL_VENV:-.venv-trl}
PY=${PYTHON:-python3}
TORCH_VERSION=${HEXSEARCH_CPU_TORCH:-2.13.0}
TRL_VERSION=${HEXSEARCH_TRL:-1.16.0}
export PIP_DISABLE_PIP_VERSION_CHECK=1

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then
  kind=gpu
  torch_spec="torch"
else
  kind=cpu
  torch_spec="torch==$TORCH_VERSION"
fi
packages="$torch_spec trl==$TRL_VERSION jmespath jsonschema"
want="$kind $packages $(sha256sum scripts/setup_trl.sh | cut -d' ' -f1)"
stamp="$VENV/.hexsearch-trl-setup"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi

echo "[setup-trl] installing $packages into $VENV (one time, ~1 min)"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP="$VENV/bin/python -m pip"
quiet() { grep -v -E "is ignored|does not provide the extra|^\s*$" || true; }
$PIP install -q "$torch_spec" 2>&1 | quiet
$PIP install -q "trl==$TRL_VERSION" jmespath jsonschema 2>&1 | quiet
"$VENV/bin/python" -c "from trl import GRPOConfig, GRPOTrainer" \
  || { echo "[setup-trl] 'from trl import GRPOTrainer' failed in $VENV" >&2; exit 1; }
echo "$want" > "$stamp"
echo "[setup-trl] ready: $VENV"
