#!/usr/bin/env bash
# The GPU sampling run for a lent GPU machine, from the repo root there:
#   bash benchmarks/gpu_sampling_run.sh [benchmarks/sampling_gpu.py arguments...]
# Installs carried wheels (.whl/: pybind11 for the C++ CPU sampler), builds the CUDA sampling extension and
# the C++ CPU sampler side by side (timed), runs the GPU sampler tests and the CPU kernel tests, then the SEPS
# benchmark; logs under $OUT (device.txt, build_*.log, pytest.log, bench.log, sampling_gpu.json).
set -uo pipefail
OUT=${OUT:-/tmp/distgnn-gpu-sampling}
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || exit 1
  export PYTHONPATH=/tmp/site
fi
# The repo copy is not installed there: import distgnn from the working tree (the C++ sampler then builds
# itself once into its cache, see distgnn/native/cpu.py).
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
status=0

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; echo "cpus $(nproc)";
  python3 -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)'; } \
  | tee "$OUT/device.txt"

python3 - >"$OUT/build_gpu.log" 2>&1 <<'PY' &
import time
start = time.perf_counter()
from distgnn.native.cuda import build_directory, graph_kernels
graph_kernels()
print(f"CUDA graph extension ready in {time.perf_counter() - start:.1f} s ({build_directory('graph')})")
PY
gpu_build=$!
python3 - >"$OUT/build_cpu.log" 2>&1 <<'PY' &
import time
start = time.perf_counter()
from distgnn.sampling import kernels
kernels.extension()
print(f"C++ CPU sampler ready in {time.perf_counter() - start:.1f} s")
PY
cpu_build=$!
wait $gpu_build || status=1
wait $cpu_build || status=1
cat "$OUT/build_gpu.log" "$OUT/build_cpu.log" | tail -20

python3 -m pytest -q -p no:cacheprovider --durations=5 tests/test_sampling_gpu.py tests/test_sampling_kernels.py 2>&1 \
  | tee "$OUT/pytest.log" | tail -30 || status=1
python3 benchmarks/sampling_gpu.py --json "$OUT/sampling_gpu.json" "$@" 2>&1 | tee "$OUT/bench.log" || status=1
exit $status
