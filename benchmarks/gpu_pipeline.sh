#!/usr/bin/env bash
# The 3-stage GPU pipeline (sample t+2 in a background thread, copy + gather t+1 on a side CUDA stream, train t)
# against the same training run done one stage after another: docs/BENCHMARKS.md "GPU pipeline". Run from the
# repo root on a 2-GPU machine:  bash benchmarks/gpu_pipeline.sh
# Installs carried wheels (.whl/), installs the tree editable, builds the CUDA gather extension, runs the
# pipeline / cache / gather tests (CUDA ones included), then one training run per variant; logs go to $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/distgnn-gpu-pipeline}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-cache-dir --no-compile --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
if ! python3 -c "import distgnn.partition, distgnn.launch" 2>/dev/null; then
  python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . 2>&1 | tail -5
fi
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader | tee "$OUT/device.txt"
nproc | tee -a "$OUT/device.txt"
status=0
python3 -c 'import time; t = time.perf_counter()
from distgnn.native.cuda import gather_kernels; gather_kernels()
print(f"extension ready in {time.perf_counter() - t:.1f} s")' 2>&1 | tee "$OUT/build.log" || status=1
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_cache_pipeline.py tests/test_cache_dist_feature.py \
  tests/test_gather_cuda.py 2>&1 | tail -15 | tee "$OUT/pytest.log" || status=1
NODES=${NODES:-2000000}
run() {  # name, extra flags...
  local name=$1
  shift
  timeout 200 python3 examples/graphsage/train_dist.py --local --device cuda --cache-gb "${CACHE_GB:-1}" \
    --dataset synthetic --num-nodes "$NODES" --avg-degree 10 --feat-dim 128 --part-method random \
    --num-parts 2 --trainers-per-machine 1 --fanouts 15,10,5 --hidden 256 --batch-size 1024 \
    --epochs "${EPOCHS:-3}" --max-batches "${MAX_BATCHES:-20}" --no-eval --quiet \
    --workdir /tmp/gpu-train-work "$@" 2>&1 | tee "$OUT/train-$name.log" || status=1
}
run sequential --prefetch 0
run sample-ahead --prefetch 2
run pipeline --prefetch 2 --pipeline
run sample-ahead-w2 --num-workers 2
run pipeline-w2 --num-workers 2 --pipeline
exit $status
