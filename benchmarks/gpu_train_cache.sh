#!/usr/bin/env bash
# GraphSAGE on 2 GPUs of one host (2 simulated machines x 1 trainer, NCCL DDP) with the feature cache off
# and on: the figures of docs/BENCHMARKS.md "GPU training (cache)". Run from the repo root on the GPU machine:
#   bash benchmarks/gpu_train_cache.sh [cache GB values...]    (default: 0 0.25 1)
# Installs carried wheels (.whl/), installs the tree editable (C++ sampler), builds the CUDA gather extension,
# runs the CachedFeature tests (CUDA ones included), then one training run per cache size; logs go to $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/distgnn-gpu-train}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
if ! python3 -c "import distgnn.partition, distgnn.launch" 2>/dev/null; then
  python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . 2>&1 | tail -5
fi
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader | tee "$OUT/device.txt"
status=0
python3 -c 'import time; t = time.perf_counter()
from distgnn.native.cuda import gather_kernels; gather_kernels()
print(f"extension ready in {time.perf_counter() - t:.1f} s")' 2>&1 | tee "$OUT/build.log" || status=1
python3 -m pytest -q -p no:cacheprovider tests/test_cache_dist_feature.py 2>&1 | tee "$OUT/pytest.log" || status=1
NODES=${NODES:-2000000}
for gb in "${@:-0 0.25 1}"; do
  for g in $gb; do
    timeout 240 python3 examples/graphsage/train_dist.py --local --device cuda --cache-gb "$g" \
      --dataset synthetic --num-nodes "$NODES" --avg-degree 10 --feat-dim 128 --part-method random \
      --num-parts 2 --trainers-per-machine 1 --fanouts 15,10,5 --hidden 256 --batch-size 1024 \
      --epochs "${EPOCHS:-3}" --max-batches "${MAX_BATCHES:-20}" --no-eval --quiet \
      --workdir /tmp/gpu-train-work 2>&1 | tee "$OUT/train-cache-$g.log" || status=1
  done
done
exit $status
