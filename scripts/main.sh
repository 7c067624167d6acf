#!/usr/bin/env bash
# The main job end to end on the built-in synthetic graph (see README).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="$(bash "$ROOT/scripts/setup_env.sh")"
WORKDIR="${DISTGNN_WORKDIR:-$ROOT/.work/main}"
exec "$PY" -m distgnn.partition.cli --dataset synthetic --num-nodes 20000 --avg-degree 10 \
    --graph-name synthetic --num-parts 2 --method metis --out "$WORKDIR/synthetic" --overwrite "$@"
