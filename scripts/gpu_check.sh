#!/usr/bin/env bash
# The GPU check of the scale-out work (docs/scale-out.md): on a machine with NVIDIA GPUs,
#   1. the learner strategies on GPUs: 2 NCCL ranks under ddp and fsdp2 against one learner, the sharded
#      checkpoint resumed on 1 and 2 ranks (tests/test_learner_strategies.py on cuda; needs 2 GPUs)
#   2. a few steps of the quickstart with a managed vLLM engine (started by `hexsearch train` as a Ray actor)
#      and the FSDP2 learner (2 ranks with 3+ GPUs, else 1 rank sharing the GPU with vLLM)
#   3. weight pushes without a checkpoint (serving/remote/weight_transfer.py), 3 steps each: LoRA adapters to the
#      managed vLLM server (train.weight_transfer=adapter); with 2+ GPUs (NCCL refuses two ranks on one GPU)
#      train.weight_transfer=nccl through vLLM's weight-transfer engine (needs vllm importable by $PY: the
#      gpu extra) and through SGLang (when $HEXSEARCH_SGLANG_PYTHON names a Python with SGLang)
#   4. one step of the ASearcher-7B recipe's shape (configs/asearcher-local-7b-1node.yaml: managed vLLM servers,
#      FSDP2 learner ranks, the recipe's loss, packing, precision and checkpointing) with the small model on the
#      world's questions and index, sized to this machine's GPUs; its `--dry-run` first (RESULT gpu_asearcher_shape)
# and prints their RESULT lines (all named RESULT gpu_*). Needs `make setup` and vLLM for GPUs in .venv-vllm (scripts/setup_vllm.sh,
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
echo "RESULT gpu_check_quickstart learners=$LEARNERS gpus=$NGPU $(grep -o 'dev_reward_before=.*' "/tmp/$RUN.log" | tail -1)"
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

# 3. weights pushed without a checkpoint: each run must finish its steps (a push that fails stops the run)
push_check() {  # name, overrides...
  local name=$1; shift
  local run=gpu-check-$name-$(date +%Y%m%d-%H%M%S) t0=$(date +%s) ok=0
  if "$PY" -m hexsearch.cli train configs/quickstart.yaml engine.device=auto train.engine_replicas=1 \
      train.learner_workers=1 train.steps=3 train.eval_questions=8 train.save_every=0 train.time_budget_min=8 \
      run.name="$run" "$@" > "/tmp/$run.log" 2>&1 && grep -q "RESULT train" "/tmp/$run.log"; then ok=1; fi
  echo "RESULT gpu_push_$name passed=$ok seconds=$(( $(date +%s) - t0 )) log=/tmp/$run.log"
  [ "$ok" = 1 ] || tail -20 "/tmp/$run.log"
}
push_check adapter engine.backend=vllm train.lora_rank=16 train.lr=1e-4 train.weight_transfer=adapter
if [ "$NGPU" -lt 2 ]; then
  echo "RESULT gpu_push_nccl skipped=one-gpu (NCCL takes one GPU per rank: learner and server need 2)"
else
  if "$PY" -c "import vllm.distributed.weight_transfer" 2>/dev/null; then
    push_check nccl_vllm engine.backend=vllm train.weight_transfer=nccl
  else
    echo "RESULT gpu_push_nccl_vllm skipped=no-vllm-in-$PY (pip install 'hexsearch[gpu]')"
  fi
  if [ -n "${HEXSEARCH_SGLANG_PYTHON:-}" ]; then
    push_check nccl_sglang engine.backend=sglang train.weight_transfer=nccl
  else
    echo "RESULT gpu_push_nccl_sglang skipped=no-HEXSEARCH_SGLANG_PYTHON"
  fi
fi

# 4. the 7B recipe's shape with the small model: half the GPUs generate, half train (at least one each)
ENGINES=$(( NGPU / 2 > 0 ? NGPU / 2 : 1 )); RANKS=$(( NGPU - ENGINES > 0 ? NGPU - ENGINES : 1 ))
SHAPE=(engine.model=smollm2-135m-instruct engine.max_model_len=4096 agent.max_context_tokens=4096
       agent.max_new_tokens=256 agent.max_turns=4 "train.data=''" train.steps=1 train.batch_size=4 train.group_size=4
       train.max_inflight_trajectories=64 train.worker_concurrency=16 train.micro_batch_tokens=4096
       train.engine_replicas="$ENGINES" train.learner_workers="$RANKS" train.rollout_workers=2
       train.eval_questions=8 train.eval_every=0 train.save_every=1 train.time_budget_min=10)
"$PY" -m hexsearch.cli train configs/asearcher-local-7b-1node.yaml --dry-run "${SHAPE[@]}" | tail -1
run=gpu-check-asearcher-$(date +%Y%m%d-%H%M%S); t0=$(date +%s); ok=0
if "$PY" -m hexsearch.cli train configs/asearcher-local-7b-1node.yaml "${SHAPE[@]}" run.name="$run" \
    > "/tmp/$run.log" 2>&1 && grep -q "RESULT train" "/tmp/$run.log"; then ok=1; fi
echo "RESULT gpu_asearcher_shape passed=$ok engines=$ENGINES learners=$RANKS seconds=$(( $(date +%s) - t0 )) log=/tmp/$run.log"
[ "$ok" = 1 ] || tail -20 "/tmp/$run.log"
