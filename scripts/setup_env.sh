#!/usr/bin/env bash
# Creates (or reuses) the project's virtual environment and installs distgnn
# into it (building its C++ extension). Used by scripts/main.sh and .ci/run;
# prints the venv's python on stdout, everything else on stderr.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${DISTGNN_VENV:-$ROOT/.venv}"
if [ ! -x "$VENV/bin/python" ]; then
    echo "setup: creating $VENV" >&2
    python3 -m venv "$VENV" >&2
fi
PY="$VENV/bin/python"

pip_quiet() {
    # pip's output only when it fails: the local index mirror prints many harmless warnings.
    local log
    log="$(mktemp)"
    if ! "$PY" -m pip "$@" >"$log" 2>&1; then
        grep -v "^WARNING: Location" "$log" >&2
        rm -f "$log"
        echo "setup: pip $* failed" >&2
        return 1
    fi
    rm -f "$log"
}

# torch first and pinned: an open range would pull a multi-gigabyte CUDA build.
if ! "$PY" -c "import torch" >/dev/null 2>&1; then
    echo "setup: installing torch==2.13.0 (CPU)" >&2
    pip_quiet install -q torch==2.13.0
fi
echo "setup: installing distgnn (editable) and its test tools" >&2
pip_quiet install -q -e "$ROOT[test]"
echo "$PY"
