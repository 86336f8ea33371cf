#!/usr/bin/env bash
# The GPU check of the scale-out work (docs/scale-out.md): on a machine with NVIDIA GPUs,
#   1. the learner strategies on GPUs: 2 NCCL ranks under ddp and fsdp2 against one learner, the sharded
#      checkpoint resumed on 1 and 2 ranks (tests/test_learner_strategies.py on cuda; needs 2 GPUs)
#   2. a few steps of the quickstart with a managed vLLM engine (started by `hexsearch train` as a Ray actor)
#      and the FSDP2 learner (2 ranks with 3+ GPUs, else 1 rank sharing the GPU with vLLM)
# and prints their RESULT lines. Needs `make setup` and vLLM for GPUs in .venv-vllm (scripts/setup_vllm.sh,
# run here when it is missing). Exit status 2: no GPU on this machine.
#
#   bash scripts/gpu_check.sh [extra hexsearch train overrides...]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
if ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu_check: no NVIDIA GPU on this machine (nvidia-smi -L failed): nothing to check" >&2
  exit 2
fi
NGPU=$(nvidia-smi -L | wc -l)
echo "gpu_check: $NGPU GPU(s): $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | sort | uniq -c | xargs)"
[ -x .venv-vllm/bin/python ] || bash scripts/setup_vllm.sh

if [ "$NGPU" -ge 2 ]; then
  t0=$(date +%s)
  if HEXSEARCH_TEST_DEVICE=cuda "$PY" -m pytest -q -p no:cacheprovider tests/test_learner_strategies.py; then ok=1; else ok=0; fi
  echo "RESULT gpu_learner_strategies passed=$ok seconds=$(( $(date +%s) - t0 ))"
else
  echo "gpu_check: one GPU: the 2-rank NCCL strategy test needs 2 (NCCL takes one GPU per rank); skipped"
fi

LEARNERS=$([ "$NGPU" -ge 3 ] && echo 2 || echo 1)
RUN=gpu-check-$(date +%Y%m%d-%H%M%S)
"$PY" -m hexsearch.cli train configs/quickstart.yaml engine.backend=vllm engine.device=auto \
  train.learner.strategy=fsdp2 train.learner_workers="$LEARNERS" train.engine_replicas=1 \
  train.steps=5 train.eval_questions=32 train.save_every=2 train.time_budget_min=10 run.name="$RUN" "$@" \
  | tee "/tmp/$RUN.log"
echo "RESULT gpu_check learners=$LEARNERS gpus=$NGPU $(grep -o 'dev_reward_before=.*' "/tmp/$RUN.log" | tail -1)"
"$PY" - "$RUN" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(f"runs/{sys.argv[1]}/metrics.jsonl")]
steps = [r for r in rows if "time/train_s" in r]
if steps:
    med = sorted(r["time/train_s"] for r in steps)[len(steps) // 2]
    sync = sorted(r["time/sync_s"] for r in steps)[len(steps) // 2]
    print(f"RESULT gpu_check_steps steps={len(steps)} train_s_median={med:.2f} sync_s_median={sync:.2f} "
          f"logp_mismatch_last={steps[-1].get('train/logp_mismatch', float('nan')):.4f}")
PY
