#!/usr/bin/env bash
# The main job end to end on the built-in synthetic graph: generate it, partition it
# (METIS, 2 parts), start a simulated 2-machine cluster on this host, train GraphSAGE
# with DDP, evaluate by layer-wise inference, print accuracy and throughput.
# Extra arguments go to examples/graphsage/train_dist.py (they override the defaults here).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="$(bash "$ROOT/scripts/setup_env.sh")"
WORKDIR="${DISTGNN_WORKDIR:-$ROOT/.work/main}"
exec "$PY" "$ROOT/examples/graphsage/train_dist.py" --local --workdir "$WORKDIR" \
    --dataset synthetic --num-nodes 100000 --avg-degree 15 --num-parts 2 --part-method metis \
    --trainers-per-machine 1 --servers-per-machine 1 --fanouts 10,10 --batch-size 512 --lr 0.01 \
    --epochs 5 "$@"
