#!/usr/bin/env bash
# A three-node Ray cluster on this one machine (docs/scale-out.md, "Multi-node"): a head and two worker
# raylets started with `ray start`, each with its own custom resources, so that `hexsearch train` places
# engines, learner ranks and rollout workers on different nodes exactly as on a real cluster:
#   head    engine_node=1  rollout_slot=1
#   node 1  learner_node=1 rollout_slot=1
#   node 2  learner_node=1 rollout_slot=1
# Ray's token authentication stays on (RAY_AUTH_MODE=token, the token in ~/.ray/auth_token: generated once
# with `ray get-auth-token --generate`; on a real cluster every node and the driver need the same token).
# The nodes take this machine's address, as on a real cluster: Ray on Linux turns 127.0.0.1 into it
# (services.resolve_ip_for_localhost), and keeps a node on loopback only with clusters off, where
# `ray start --address` refuses to join. So the token is what guards this cluster, as it guards a real one.
#
#   bash scripts/local_cluster.sh start DIR [PORT]   # prints `address=127.0.0.1:PORT`
#   bash scripts/local_cluster.sh stop DIR           # stops only the processes of this cluster
#   NODES=1 bash scripts/local_cluster.sh start DIR  # one node with all those resources (the baseline)
#
# DIR is the cluster's own Ray temp dir (keep it short: Ray's socket paths must fit 107 bytes); stop kills
# the processes of DIR's Ray session and their children, never other Ray clusters on the machine (no `ray stop`,
# which stops every one).
set -euo pipefail
cd "$(dirname "$0")/.."
RAY=${RAY:-.venv/bin/ray}
PY=${PY:-.venv/bin/python}
cmd=${1:?usage: local_cluster.sh start|stop DIR [PORT]}
dir=${2:?usage: local_cluster.sh start|stop DIR [PORT]}

free_port() { "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

if [ "$cmd" = stop ]; then
  # This cluster's Ray processes name its session folder on their command line (GCS, raylets, monitors); the
  # workers and agents are the raylets' children (their names are rewritten to ray::...). TERM, then KILL.
  for sig in TERM KILL; do
    own=$(pgrep -f -- "$dir/session_" || true)
    pids="$own $(for p in $own; do pgrep -P "$p" || true; done)"
    [ -z "${pids// /}" ] && break
    kill -s "$sig" $pids 2>/dev/null || true
    sleep 3
  done
  exit 0
fi
[ "$cmd" = start ] || { echo "local_cluster.sh: unknown command $cmd (start|stop)" >&2; exit 2; }

mkdir -p "$dir"
port=${3:-$(free_port)}
export RAY_AUTH_MODE=token
[ -s "${RAY_AUTH_TOKEN_PATH:-$HOME/.ray/auth_token}" ] || [ -n "${RAY_AUTH_TOKEN:-}" ] || \
  "$RAY" get-auth-token --generate >/dev/null
# Ports every node would otherwise take at fixed defaults (the dashboard agent's 52365, the client server's
# 10001): fresh ones, so this cluster runs beside others on the machine.
# A small object store per node: the tiny model's weights and the batches are a few MB. No GPUs: three
# raylets on one machine would each claim all of its GPUs.
common=(--temp-dir="$dir" --object-store-memory=500000000 --num-gpus=0 --disable-usage-stats)
if [ "${NODES:-3}" = 1 ]; then   # the same roles on one node: the baseline a multi-node run is timed against
  head='{"engine_node": 1, "learner_node": 2, "rollout_slot": 3}'; cpus=6
else
  head='{"engine_node": 1, "rollout_slot": 1}'; cpus=2
fi
"$RAY" start --head --port="$port" --include-dashboard=false --ray-client-server-port="$(free_port)" \
  --dashboard-agent-listen-port="$(free_port)" --resources="$head" --num-cpus="$cpus" "${common[@]}" \
  >"$dir/head.log" 2>&1 || { cat "$dir/head.log" >&2; exit 1; }
[ "${NODES:-3}" = 1 ] || for i in 1 2; do
  "$RAY" start --address="127.0.0.1:$port" --dashboard-agent-listen-port="$(free_port)" \
    --resources='{"learner_node": 1, "rollout_slot": 1}' --num-cpus=2 "${common[@]}" >"$dir/node$i.log" 2>&1 \
    || { cat "$dir/node$i.log" >&2; exit 1; }
done
echo "address=127.0.0.1:$port"
