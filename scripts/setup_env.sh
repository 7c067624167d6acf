#!/usr/bin/env bash
# Creates (or reuses) the project's virtual environment and installs distgnn
# into it. Sourced by scripts/main.sh and .ci/run; prints the venv's python.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${DISTGNN_VENV:-$ROOT/.venv}"
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV" >&2
fi
PY="$VENV/bin/python"
# torch first and pinned: an open range would pull a multi-gigabyte CUDA build.
if ! "$PY" -c "import torch" >/dev/null 2>&1; then
    "$PY" -m pip install -q torch==2.13.0 >&2
fi
"$PY" -m pip install -q -e "$ROOT[test]" >&2
echo "$PY"
