#!/usr/bin/env bash
# NCCL path of examples/graphsage/train_dist.py on one host with 2 GPUs: 2 simulated machines x 1
# trainer, one GPU each (trainer rank r uses cuda:r), DDP over NCCL. Run from the repo root:
#   bash benchmarks/nccl_check.sh [extra train_dist.py flags]
# Needs torch with CUDA, numpy, pyzmq, msgpack, setuptools and pybind11 + a C++ compiler (distgnn is
# installed editable from this tree, which builds the C++ sampler);
# wheels placed in .whl/ are installed first (for machines without a package index). Partitions
# with the random method, so pymetis is not needed. Passes when the RESULT line reports
# "backend": "nccl" and "device": "cuda:0" and the job exits 0.
set -euo pipefail
OUT=${OUT:-/tmp/distgnn-nccl}
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-cache-dir --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site
fi
export PYTHONUNBUFFERED=1
# distgnn.partition and distgnn.launch live outside distgnn/ (package-dir mapping): install the tree.
if ! python3 -c "import distgnn.partition, distgnn.launch" 2>/dev/null; then
  python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . 2>&1 | tail -5
fi
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader | tee "$OUT/device.txt"
python3 examples/graphsage/train_dist.py --local --device cuda \
  --dataset synthetic --num-nodes 200000 --avg-degree 10 --part-method random \
  --num-parts 2 --trainers-per-machine 1 --fanouts 15,10,5 --hidden 256 --batch-size 1024 \
  --epochs 3 --workdir "$OUT/work" "$@" 2>&1 | tee "$OUT/nccl.log"
grep -q '"backend": "[^"]*nccl' "$OUT/nccl.log" && grep -q '"device": "cuda:0"' "$OUT/nccl.log" \
  && echo "NCCL check passed" | tee -a "$OUT/nccl.log"
