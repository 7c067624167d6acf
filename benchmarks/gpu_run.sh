#!/usr/bin/env bash
# The one script for the lent GPU machine, run from the repo root there:
#   bash benchmarks/gpu_run.sh [all|tests|bench] [benchmarks/gather.py arguments...]
# Installs carried wheels (.whl/, if any), builds the CUDA gather extension (timed), runs the gather/cache
# tests (kernel and reference) and the gather benchmark, and writes logs and figures under $OUT.
set -uo pipefail
mode=${1:-all}
shift || true
OUT=${OUT:-/tmp/distgnn-gpu}
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || exit 1
  export PYTHONPATH=/tmp/site
fi
# Installed editable (no index, no build isolation: pybind11 comes from the carried wheels), so the
# partition/launch packages resolve and the C++ CPU extension is built once.
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >"$OUT/install.log" 2>&1 || {
  cat "$OUT/install.log"
  exit 1
}
# The repo copy is not installed there: import distgnn from the working tree.
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
status=0

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/device.txt"
python3 -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)' \
  | tee -a "$OUT/device.txt"
python3 - <<'PY' 2>&1 | tee "$OUT/build.log" || status=1
import logging, time
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
start = time.perf_counter()
from distgnn.native.cuda import build_directory, gather_kernels
gather_kernels()
print(f"extension ready in {time.perf_counter() - start:.1f} s ({build_directory()})")
PY

if [[ $mode == all || $mode == tests ]]; then
  python3 -m pytest -q -p no:cacheprovider --durations=5 tests/test_gather_*.py tests/test_cache_*.py 2>&1 \
    | tee "$OUT/pytest.log" || status=1
fi
if [[ $mode == all || $mode == bench ]]; then
  python3 benchmarks/gather.py --json "$OUT/gather.json" "$@" 2>&1 | tee "$OUT/bench.log" || status=1
fi
exit $status
