#!/usr/bin/env bash
# The lent GPU machine's session: benchmarks/gpu_session.py holds the stages (a table of name, time limit and bash
# body; `python3 benchmarks/gpu_session.py --list` shows them). `bash benchmarks/gpu_session.sh [STAGES]` runs it.
exec python3 "$(dirname "${BASH_SOURCE[0]}")/gpu_session.py" "$@"
