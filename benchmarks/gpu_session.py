"""One call of the lent GPU machine: named stages, each a bash body with a time limit, run from the repo root there.

    python3 benchmarks/gpu_session.py [STAGES]     # comma-separated; default tests,gather,sampling,scaling
    python3 benchmarks/gpu_session.py --list       # every stage: its time limit and what it runs

First it installs the carried wheels (``.whl/*.whl``, into /tmp/site) and distgnn (editable: it maps
``partition/`` and ``launch/`` to ``distgnn.partition`` and ``distgnn.launch``, so nothing puts the checkout on
PYTHONPATH), and sets the NCCL variables the lent machines need (NVLink multicast off). Each stage then runs in
bash with ``OUT`` (the log folder: ``$OUT``, else /tmp/distgnn-gpu-session), ``site_path`` (the wheels' folder),
``here_cache`` (the extension cache) and the ``train1`` helper (one ``scaling.py --gpus 1`` run of a checkout) set;
a stage fails when its body exits non-zero (``status=1`` in it) or runs past its limit (its processes are then
killed). Stages run in the order named; the exit status is 1 when any failed. Keep one call under 10 minutes.
Environment knobs some stages read: SCALING_VARIANTS, SCALING_EPOCHS, SCALING_REPEATS, SCALING_WORKDIR,
SCALING_FLAGS, BASE, BASE_FILES, REPEATS, TIMELINE, TGN_SEEDS, TGN_EPOCHS, TGN_VARIANTS, TGN_DEADLINE, DATA,
DATA_ROOT, STAB_SETS, STAB_SEEDS, STAB_PERTURB (each stage's text says which).
"""

from __future__ import annotations

import argparse
import glob
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = "tests,gather,sampling,scaling"
# NVLink multicast off in NCCL, torch and NVSHMEM: the lent machines' GPUs are shared (see the device notes).
NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}

# What every stage's body may use: the train1 helper (name, checkout, extension cache, more scaling.py flags).
PRELUDE = r"""
set -uo pipefail
status=0
here_cache=${XDG_CACHE_HOME:-$HOME/.cache}
tests_to() {  # LOG SECONDS PYTEST-ARGS...: pytest into $OUT/LOG (status=1 when it fails); its failures and tally shown
  local log=$1 limit=$2
  shift 2
  timeout "$limit" python3 -m pytest -q -p no:cacheprovider --durations=5 "$@" >"$OUT/$log" 2>&1 || status=1
  grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/$log" | tail -15
}
train1() {
  (cd "$2" && XDG_CACHE_HOME="$3" PYTHONPATH="$2${site_path:+:$site_path}" timeout 240 python3 benchmarks/scaling.py \
    --gpus 1 --workdir /tmp/distgnn-train1 --json "$OUT/train1_$1.json" "${@:4}") >"$OUT/train1_$1.log" 2>&1 || status=1
  echo "train1 $1: $(grep -E '^ +1 ' "$OUT/train1_$1.log" | tail -1)"
  grep -E "^timeline" "$OUT/train1_$1.log"
}
"""


@dataclass(frozen=True)
class Stage:
    """A stage: its name, its time limit in seconds, what it runs (for --list) and its bash body."""

    name: str
    limit_s: int
    about: str
    body: str


STAGES = [
    Stage(
        "tests",
        330,
        "the CUDA tests (pytest -m cuda) of the gather and cache, the extensions, the samplers and relabel, the "
        "layers' kernels, the loader and the captured step (clique and steps over 2 GPUs where there are two)",
        r"""
tests_to pytest.log 300 -m cuda tests/cache tests/native tests/sampling tests/nn tests/loader tests/train/test_step.py
""",
    ),
    Stage(
        "typed",
        570,
        "the CUDA tests of the typed and nn paths: the typed GPU sampler, the CUDA aggregation (mean, "
        "weighted sums, GAT against the CPU), GPU layer-wise inference (GraphSAGE and GAT); then "
        "examples/rgcn on synthetic-mag (--local: one server and one trainer, --sample-device cuda)",
        r"""
tests_to pytest_typed.log 300 tests/sampling/test_hetero_sampling.py tests/nn/test_aggregate_cuda.py \
  tests/train/test_inference_gpu.py tests/nn/test_layers.py tests/nn/test_hetero_layers.py
timeout 240 python3 examples/rgcn/train_dist.py --dataset synthetic-mag --num-papers 20000 --local --num-parts 1 \
  --trainers-per-machine 1 --device cuda --sample-device cuda --epochs 3 --quiet --workdir /tmp/distgnn-rgcn \
  >"$OUT/rgcn_cuda.log" 2>&1 || status=1
grep -E "^RESULT|Error" "$OUT/rgcn_cuda.log" | tail -3
""",
    ),
    Stage(
        "link",
        590,
        "examples/link_prediction on Cora with --device cuda (--local 1x1 and --single; DATA=planetoid dir)",
        r"""
for mode in "--local --num-parts 1 --trainers-per-machine 1" "--single"; do
  # shellcheck disable=SC2086
  timeout 200 python3 examples/link_prediction/train_dist.py --dataset cora --data-dir "${DATA:?set DATA to a directory with the Cora files: the GPU machine has no network}" $mode \
    --device cuda --workdir /tmp/distgnn-link >"$OUT/link_cuda${mode%% *}.log" 2>&1 || status=1
  echo "link $mode: $(grep -E '^RESULT|Error' "$OUT/link_cuda${mode%% *}.log" | tail -1)"
done
""",
    ),
    Stage(
        "tgngpus",
        590,
        "TGN memory copies on two GPUs: the memory replay's cost (benchmarks/tgn_replay.py), then "
        "benchmarks/scaling_tgn.py on CollegeMsg (one GPU vs two memory copies on "
        "two GPUs, captured and eager DDP), TGN_SEEDS (default 0), TGN_EPOCHS (default 10), TGN_VARIANTS, "
        "TGN_REPLAY=0 (no replay benchmark); data from DATA_ROOT (default ../shared/data); the CUDA tests are stage "
        "tgncuda",
        r"""
if [[ ${TGN_REPLAY:-1} == 1 ]]; then
  timeout 60 python3 benchmarks/tgn_replay.py --device cuda --repeats 20 \
    --dataset "events:${DATA_ROOT:-../shared/data}/snap/CollegeMsg.txt" 2>&1 | tee "$OUT/tgn_replay.log" || status=1
fi
seeds=${TGN_SEEDS:-0}
timeout 520 python3 benchmarks/scaling_tgn.py --dataset "events:${DATA_ROOT:-../shared/data}/snap/CollegeMsg.txt" \
  --seeds "${seeds// /,}" --epochs "${TGN_EPOCHS:-10}" --variants "${TGN_VARIANTS:-single,graph,eager}" \
  --json "$OUT/scaling_tgn.json" 2>&1 | tee "$OUT/scaling_tgn.log" || status=1
""",
    ),
    Stage(
        "tgncuda",
        300,
        "the temporal CUDA tests (pytest -m cuda tests/temporal: the captured TGN step on one and two GPUs, the "
        "captured memory replay, the CUDA sampler, shared streams on a GPU); TGN_CUDA_TESTS: other test paths",
        r"""
# shellcheck disable=SC2086
tests_to pytest_tgncuda.log 290 -m cuda ${TGN_CUDA_TESTS:-tests/temporal}
""",
    ),
    Stage(
        "tgnpyg",
        590,
        "benchmarks/train_tgn.py --device cuda (distgnn vs PyG's TGN, one GPU, same process) on CollegeMsg and on "
        "Bitcoin OTC, one seed a run, every run at once (CollegeMsg's on GPU 0, Bitcoin OTC's on GPU 1 where "
        "there are two): "
        "TGN_PYG_SEEDS (default TGN_SEEDS, else 0), TGN_EPOCHS (default 10); every run stops at TGN_DEADLINE (UNIX "
        "seconds; default 560 s after the stage starts); data from DATA_ROOT (default ../shared/data)",
        r"""
deadline=${TGN_DEADLINE:-$(($(date +%s) + 560))}
snap=${DATA_ROOT:-../shared/data}/snap
run_one() {  # GPU, log name, seed, train_tgn.py flags: one run, stopped at the deadline
  local gpu=$1 name=$2 seed=$3 left
  shift 3
  left=$((deadline - $(date +%s)))
  if ((left < 20)); then echo "tgnpyg $name: no time left for seed $seed"; return 1; fi
  CUDA_VISIBLE_DEVICES=$gpu timeout "$left" python3 benchmarks/train_tgn.py --device cuda \
    --epochs "${TGN_EPOCHS:-10}" --seeds "$seed" "$@" >"$OUT/tgn_pyg_${name}_$seed.log" 2>&1
}
second_gpu=$(($(nvidia-smi -L | wc -l) > 1 ? 1 : 0))
pids=()
for seed in ${TGN_PYG_SEEDS:-${TGN_SEEDS:-0}}; do
  run_one 0 collegemsg "$seed" --dataset "events:$snap/CollegeMsg.txt" & pids+=($!)
  run_one "$second_gpu" bitcoinotc "$seed" --dataset "events:$snap/soc-sign-bitcoinotc.csv" \
    --columns src,dst,rating,time & pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid" || status=1; done
grep -hE "^(stream|system|distgnn|PyG)" "$OUT"/tgn_pyg_*.log
""",
    ),
    Stage(
        "dynamic",
        590,
        "the temporal tests (CUDA sampler vs reference) and the recurrent cells' CUDA test, then "
        "benchmarks/train_tgn.py (vs PyG's TGN) and benchmarks/train_snapshot.py --part peer (vs PyTorch "
        "Geometric Temporal: carry its wheel with decorator and networkx in .whl/) on the GPU; the data "
        "is read from ../shared/data, copied there from DATA_ROOT when set (the GPU machine has no "
        "network)",
        r"""
if [[ -n "${DATA_ROOT:-}" && ! -d ../shared/data ]]; then mkdir -p ../shared && cp -r "$DATA_ROOT" ../shared/data; fi
tests_to pytest_dynamic.log 240 tests/temporal tests/snapshot/test_recurrent.py \
  tests/train/test_timeline.py
for seed in ${TGN_SEEDS:-0}; do  # TGN_SEEDS="0 1 2": one comparison per seed (test AP moves with the seed)
  timeout 200 python3 benchmarks/train_tgn.py --device cuda --epochs 3 --seed "$seed" >>"$OUT/tgn_cuda.log" 2>&1 \
    || status=1
done
grep -E "^(stream|system|distgnn|PyG)" "$OUT/tgn_cuda.log"
timeout 200 python3 benchmarks/train_snapshot.py --part peer --device cuda --epochs 50 --seeds 0 \
  >"$OUT/snapshot_cuda.log" 2>&1 || status=1
tail -14 "$OUT/snapshot_cuda.log"
""",
    ),
    Stage(
        "stability",
        590,
        "benchmarks/tgn_stability.py on the host's cores (CPU step, one thread a process): one process "
        'per set and seed, STAB_SETS (system:time-encoding words, default "distgnn:fixed distgnn:learned '
        'pyg:fixed"; pyg ignores the encoding), STAB_SEEDS (default 0 1 2 3 4), STAB_PERTURB (default '
        "0,1,2,3); the collapse counts per set",
        r"""
if [[ -n "${DATA_ROOT:-}" && ! -d ../shared/data ]]; then mkdir -p ../shared && cp -r "$DATA_ROOT" ../shared/data; fi
export OUT STAB_PERTURB=${STAB_PERTURB:-0,1,2,3}
sets=${STAB_SETS:-distgnn:fixed distgnn:learned pyg:fixed}
for set in $sets; do
  for seed in ${STAB_SEEDS:-0 1 2 3 4}; do echo "$set $seed"; done
done | xargs -P "$(nproc)" -L 1 bash -c 'system=${0%%:*} encoding=${0#*:}
  OMP_NUM_THREADS=1 timeout 500 python3 benchmarks/tgn_stability.py --system "$system" --time-encoding "$encoding" \
    --seeds "$1" --perturb "$STAB_PERTURB" >"$OUT/stab_${system}_${encoding}_$1.log" 2>&1'
for set in $sets; do  # one summary file: the machine returns few files
  echo "== $set"; cat "$OUT"/stab_"${set%%:*}_${set#*:}"_*.log | grep -E "^ +[0-9]+ +[0-9]+ "
done | tee "$OUT/stability.txt"
rm -f "$OUT"/stab_*.log
""",
    ),
    Stage(
        "tgnscaling",
        590,
        "benchmarks/train_tgn.py --scaling 1,2,4 on the host's CPU cores (memory parallelism, one thread "
        "per trainer: where the development box's 2 cores cannot give 4 trainers a core each), seeds "
        "TGN_SEEDS",
        r"""
if [[ -n "${DATA_ROOT:-}" && ! -d ../shared/data ]]; then mkdir -p ../shared && cp -r "$DATA_ROOT" ../shared/data; fi
for seed in ${TGN_SEEDS:-0}; do
  timeout 280 python3 benchmarks/train_tgn.py --systems '' --scaling 1,2,4 --epochs 3 --evals-per-epoch 4 \
    --seed "$seed" >>"$OUT/tgn_scaling.log" 2>&1 || status=1
done
grep -E "^(stream|scaling|trainers| +[124] )" "$OUT/tgn_scaling.log"
""",
    ),
    Stage(
        "cuda",
        570,
        "every CUDA test of the suite: pytest -m cuda (tests/conftest.py marks the tests that need a GPU); "
        "CUDA_PROCS (default 1): test processes (pytest-xdist, a test file each); the failed tests run once more "
        "alone",
        r"""
procs=${CUDA_PROCS:-1}
timeout 480 python3 -m pytest -q --durations=12 -n "$procs" --dist loadfile -m cuda tests >"$OUT/pytest_cuda.log" 2>&1 \
  || { status=1; timeout 60 python3 -m pytest -q -n 0 -m cuda --lf tests >"$OUT/pytest_cuda_again.log" 2>&1; }
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT"/pytest_cuda*.log | tail -30
""",
    ),
    Stage(
        "accuracy",
        400,
        "benchmarks/accuracy_gpus.py: GraphSAGE's test accuracy trained on 1 and on 2 GPUs of one machine, Cora, "
        "seeds ACC_SEEDS (default 0 1 2 3 4), three runs at once; data from DATA_ROOT (default ../shared/data)",
        r"""
# shellcheck disable=SC2086
timeout 370 python3 benchmarks/accuracy_gpus.py --data-dir "${DATA_ROOT:-../shared/data}/planetoid" \
  --seeds ${ACC_SEEDS:-0 1 2 3 4} --parallel 3 --workdir /tmp/distgnn-accuracy >"$OUT/accuracy.txt" 2>&1 || status=1
tail -16 "$OUT/accuracy.txt"
""",
    ),
    Stage(
        "steptests",
        330,
        "the tests of the step captured across GPUs (tests/train/test_step*.py, test_grad_sync.py; 2 GPUs)",
        r"""
tests_to pytest_steps.log 300 tests/train/test_step.py \
  tests/train/test_step_gpus.py tests/train/test_grad_sync.py
""",
    ),
    Stage(
        "syncscaling",
        590,
        "the R-GCN and link prediction steps on GPUs without DDP (tests/train/test_eager_sync*.py, 2 GPUs), then "
        "benchmarks/scaling.py 1 vs 2 GPUs of each, interleaved repeats: R-GCN on synthetic-mag (RGCN_PAPERS, "
        "default 50000), link prediction on the 1M-node synthetic graph, fanouts 10,10 (LINK_BATCHES per trainer, default 50)",
        r"""
tests_to pytest_sync.log 150 tests/train/test_eager_sync_gpus.py \
  tests/train/test_eager_sync.py
timeout 200 python3 benchmarks/scaling.py --example rgcn --num-papers "${RGCN_PAPERS:-50000}" --epochs 3 --repeats 2 \
  --json "$OUT/scaling_rgcn.json" >"$OUT/scaling_rgcn.log" 2>&1 || status=1
tail -4 "$OUT/scaling_rgcn.log"
timeout 230 python3 benchmarks/scaling.py --example link --num-nodes 1000000 --avg-degree 20 --fanouts 10,10 --hidden 128 \
  --epochs 3 --repeats 2 \
  --max-batches "${LINK_BATCHES:-50}" --json "$OUT/scaling_link.json" >"$OUT/scaling_link.log" 2>&1 || status=1
tail -4 "$OUT/scaling_link.log"
""",
    ),
    Stage(
        "multigpu",
        590,
        'benchmarks/scaling.py, 1 vs 2 GPUs, the variants in SCALING_VARIANTS (default "inline thread '
        "machines\"): inline sampling (the default with GPU sampling; also 2 GPUs with DDP's eager step, "
        "the old path), the sampling thread (--prefetch 1), 2 simulated machines x 1 GPU, and on request: "
        "deep (--prefetch 4), replicate (every GPU caches the whole hot set: no peer reads), timeline "
        "(inline, rank 0's per-batch stage spans and their plots under $OUT), repeats (inline, 1 and 2 "
        "GPUs run 3 times each, interleaved), replicated (2 machines x 1 GPU, partitioned and with the structure "
        "replicated on every trainer, 2 interleaved repeats), threadrepeats (the sampling thread, 1 and 2 GPUs 3 times "
        "each, interleaved), both (inline and the thread, 1 and 2 GPUs each, SCALING_REPEATS interleaved rounds, "
        "default 3); SCALING_EPOCHS epochs a run (default 8), SCALING_WORKDIR the partition's folder "
        "(scaling.py's --workdir; /tmp/distgnn-train1 shares train1's), SCALING_FLAGS more scaling.py flags for "
        "every variant (e.g. --cache-policy replicate)",
        r"""
epochs=${SCALING_EPOCHS:-8}
for variant in "inline:--ddp-rows" "thread:-- --prefetch 1" "machines:--machines many" "deep:-- --prefetch 4" \
  "replicate:--cache-policy replicate" "timeline:--timeline $OUT/tl.json" "repeats:--repeats 3" \
  "replicated:--machines many --replicated-rows --repeats 2" "threadrepeats:--repeats 3 -- --prefetch 1" \
  "both:--thread-rows --repeats ${SCALING_REPEATS:-3}"; do
  name=${variant%%:*}
  [[ " ${SCALING_VARIANTS:-inline thread machines} " == *" $name "* ]] || continue
  # shellcheck disable=SC2086
  timeout 450 python3 benchmarks/scaling.py --epochs "$epochs" --json "$OUT/scaling_$name.json" \
    ${SCALING_WORKDIR:+--workdir "$SCALING_WORKDIR"} ${SCALING_FLAGS:-} ${variant#*:} \
    >"$OUT/scaling_$name.log" 2>&1 || status=1
  echo "scaling $name:"; sed -n '/^ *GPUs/,$p' "$OUT/scaling_$name.log"; grep -E "Error|failed" "$OUT/scaling_$name.log" | tail -3
done
""",
    ),
    Stage(
        "contention",
        590,
        "whether a GPU trainer's host loop slows beside another busy trainer, with no gradient exchange: per round "
        "(CONTENTION_ROUNDS, default 2), benchmarks/scaling.py 1 vs 2 GPUs (the defaults), then two independent "
        "1-GPU jobs at once, one per GPU, each on its half of the CPUs (40 epochs, so that they overlap); each "
        "run's table row and every trainer's period / host wait / GPU step (SCALING_FLAGS: more scaling.py flags)",
        r"""
half=$(( $(nproc) / 2 ))
for r in $(seq 1 "${CONTENTION_ROUNDS:-2}"); do
  # shellcheck disable=SC2086
  timeout 200 python3 benchmarks/scaling.py --epochs 12 --workdir /tmp/distgnn-train1 ${SCALING_FLAGS:-} \
    --timeline "/tmp/contention/r$r/t.json" >"$OUT/contention_$r.log" 2>&1 || status=1
  for gpu in 0 1; do
    cpus=$(( gpu * half ))-$(( gpu * half + half - 1 ))
    # shellcheck disable=SC2086
    CUDA_VISIBLE_DEVICES=$gpu timeout 150 taskset -c "$cpus" python3 benchmarks/scaling.py --gpus 1 --epochs 40 \
      --workdir /tmp/distgnn-train1 ${SCALING_FLAGS:-} --timeline "/tmp/contention/r$r/gpu$gpu.json" \
      >"$OUT/contention_${r}_gpu$gpu.log" 2>&1 &
  done
  wait
  echo "round $r, 1 vs 2 GPUs:"; sed -n '/^ *GPUs/,$p' "$OUT/contention_$r.log"; grep -E "^timeline rank" "$OUT/contention_$r.log"
  for gpu in 0 1; do
    echo "round $r, GPU $gpu beside the other's job: $(grep -E '^ +1 ' "$OUT/contention_${r}_gpu$gpu.log" | tail -1)"
    grep -E "^timeline rank" "$OUT/contention_${r}_gpu$gpu.log"
  done
done
""",
    ),
    Stage(
        "partition16",
        590,
        "benchmarks/partition_dist.py on the host's first 16 CPUs (PART_CPUS, default 0-15): a papers_like graph of "
        "PART_NODES nodes (default 16M, 240M edges) generated under /tmp, random, 8 parts, --workers PART_WORKERS "
        "(default 1,8,1:1: W=1 on its share of the CPUs, W=8, W=1 on one thread) --repeat PART_REPEAT (default 3), "
        "stopped PART_BUDGET s after the stage starts (default 540); first the modules a rank imports are compiled "
        "once (the image keeps no bytecode for torch and sets PYTHONDONTWRITEBYTECODE, so each process would "
        "compile torch again)",
        r"""
start=$SECONDS
python3 - <<'PY'
import py_compile, sys, time
t = time.time()
import torch.distributed  # noqa: F401
files = [m.__file__ for m in list(sys.modules.values()) if str(getattr(m, "__file__", "")).endswith(".py")]
done = 0
for f in files:
    try:
        py_compile.compile(f, doraise=True)
        done += 1
    except (OSError, py_compile.PyCompileError):
        pass
print(f"compiled {done} of {len(files)} imported modules in {time.time() - t:.1f} s")
PY
T="taskset -c ${PART_CPUS:-0-15} python3"
nodes=${PART_NODES:-16000000}
/usr/bin/time -f "generate: wall %e s" $T -m distgnn.data.papers_like --num-nodes "$nodes" --avg-degree 15 \
  --nodes-per-chunk $(( nodes / 32 )) --jobs 16 --out /tmp/part16g 2>&1 | tail -1
left=$(( ${PART_BUDGET:-540} - (SECONDS - start) ))
timeout -s INT "$left" $T benchmarks/partition_dist.py --input /tmp/part16g/metadata.json --parts 8 --no-single \
  --methods random --workers "${PART_WORKERS:-1,8,1:1}" --repeat "${PART_REPEAT:-3}" --work /tmp/part16w \
  >"$OUT/partition16.txt" 2>&1 || status=1
grep -vE "^ +File|^ +\^|^ +[a-z]" "$OUT/partition16.txt" | tail -14
tar czf "$OUT/partition16_logs.tgz" -C /tmp/part16w . 2>/dev/null
rm -rf /tmp/part16g /tmp/part16w
""",
    ),
    Stage(
        "nccl",
        330,
        "examples/graphsage on 2 simulated machines x 1 trainer, one GPU each, DDP over NCCL (2 GPUs): "
        "passes when RESULT reports the nccl backend on cuda:0",
        r"""
timeout 300 python3 examples/graphsage/train_dist.py --local --device cuda --dataset synthetic --num-nodes 200000 \
  --avg-degree 10 --part-method random --num-parts 2 --trainers-per-machine 1 --fanouts 15,10,5 --hidden 256 \
  --batch-size 1024 --epochs 3 --workdir /tmp/distgnn-nccl >"$OUT/nccl.log" 2>&1 || status=1
if grep -q '"backend": "[^"]*nccl' "$OUT/nccl.log" && grep -q '"device": "cuda:0"' "$OUT/nccl.log"; then
  echo "nccl: passed"
else
  echo "nccl: FAILED (see nccl.log)"; status=1
fi
""",
    ),
    Stage(
        "gather",
        590,
        "benchmarks/gather.py on the 12.3 GB table (tiers, cpu_share sweep, mixed path vs table[ids].to)",
        r"""
python3 benchmarks/gather.py --num-nodes 24000000 --dim 128 --json "$OUT/gather.json" >"$OUT/gather.log" 2>&1 || status=1
grep -E "anatomy|A/B|steps|ceiling|host memory|contention|sorted misses|cpu_share|CPU gather|torch table|^ +[0-9]+%" "$OUT/gather.log"
""",
    ),
    Stage(
        "pages",
        270,
        "benchmarks/host_pages.py (zero-copy reads of scattered rows: cudaHostAlloc vs cuMemCreate host memory)",
        r"""
timeout 240 python3 benchmarks/host_pages.py >"$OUT/pages.log" 2>&1 || status=1
cat "$OUT/pages.log"
""",
    ),
    Stage(
        "sampling",
        590,
        "benchmarks/sampling_gpu.py (GPU sampler vs the C++ sampler on this host's cores, merge by "
        "relabel and by unique) and benchmarks/relabel_gpu.py (the relabel kernel vs the torch relabel)",
        r"""
for merge in relabel unique; do
  timeout 180 python3 benchmarks/sampling_gpu.py --merge $merge --json "$OUT/sampling_$merge.json" \
    >"$OUT/sampling_$merge.log" 2>&1 || status=1
  tail -6 "$OUT/sampling_$merge.log"
done
timeout 120 python3 benchmarks/relabel_gpu.py >"$OUT/relabel.log" 2>&1 || status=1
tail -5 "$OUT/relabel.log"
""",
    ),
    Stage(
        "aggregate",
        270,
        "benchmarks/aggregate_cuda.py (CUDA mean aggregation vs the torch path, layer and training step)",
        r"""
timeout 240 python3 benchmarks/aggregate_cuda.py >"$OUT/aggregate.log" 2>&1 || status=1
tail -20 "$OUT/aggregate.log"
""",
    ),
    Stage(
        "train1",
        590,
        "benchmarks/scaling.py --gpus 1 (products-scale GraphSAGE on one GPU): sampling thread or inline, "
        "with and without the gather pipeline",
        r"""
# The first run also generates and partitions the graph and builds the extensions (its epoch 0).
variants=("thread:" "inline:--prefetch 0" "thread_pipeline:--pipeline" "inline_pipeline:--prefetch 0 --pipeline")
for variant in "${variants[@]}"; do
  name=${variant%%:*}
  # shellcheck disable=SC2086
  timeout 240 python3 benchmarks/scaling.py --gpus 1 -- ${variant#*:} \
    >"$OUT/train1_$name.log" 2>&1 || status=1
  echo "train1 $name: $(tail -1 "$OUT/train1_$name.log")"
done
""",
    ),
    Stage(
        "scaling",
        390,
        "benchmarks/scaling.py (products-scale GraphSAGE on 1 and 2 GPUs), sampling thread and inline",
        r"""
timeout 240 python3 benchmarks/scaling.py --json "$OUT/scaling.json" >"$OUT/scaling.log" 2>&1 || status=1
tail -4 "$OUT/scaling.log"
timeout 120 python3 benchmarks/scaling.py --json "$OUT/scaling_inline.json" -- --prefetch 0 >"$OUT/scaling_inline.log" 2>&1 \
  || status=1
tail -4 "$OUT/scaling_inline.log"
""",
    ),
    Stage(
        "e2etests",
        330,
        "the tests of the one-GPU batch path: gather and cache, timeline, the loader's sampling stream",
        r"""
tests_to pytest_e2e.log 300 tests/cache/test_gather_cuda.py tests/cache/test_feature_cache.py \
  tests/cache/test_pipeline.py tests/train/test_timeline.py tests/train/test_epoch.py \
  tests/cache/test_dist_feature.py::test_cuda_ids_through_a_cache_of_every_row_need_no_host_sync \
  "tests/loader/test_node_loader.py::test_gpu_sampling_runs_on_its_own_stream_and_hands_over_finished_batches"
""",
    ),
    Stage(
        "resident",
        230,
        "benchmarks/gather.py --resident (the all-hit gather: all-hit path vs planned path vs index_select)",
        r"""
timeout 200 python3 benchmarks/gather.py --resident --json "$OUT/resident.json" >"$OUT/resident.log" 2>&1 || status=1
sed -n '/^all-hit gather/,$p' "$OUT/resident.log"
grep -E "Error|error" "$OUT/resident.log" | tail -3
""",
    ),
    Stage(
        "train1ab",
        590,
        "benchmarks/scaling.py --gpus 1, inline sampling and the sampling thread, each run against the "
        "checkout in $BASE first when BASE is set (its own extension build; same partition in "
        "/tmp/distgnn-train1); TIMELINE=1: this tree's runs also write their timelines (a few events per "
        "batch)",
        r"""
for variant in "inline:" "thread:--prefetch 1"; do
  name=${variant%%:*}
  # shellcheck disable=SC2086
  if [[ -n "${BASE:-}" ]]; then train1 "base_$name" "$BASE" /tmp/xdg-base -- ${variant#*:}; fi
  # shellcheck disable=SC2086
  train1 "this_$name" "$PWD" "$here_cache" ${TIMELINE:+--timeline "$OUT/$name.json"} -- ${variant#*:}
done
""",
    ),
    Stage(
        "samplespan",
        300,
        "benchmarks/sample_span.py: the host span of a GPU-sampled products-scale batch (one-call vs two-call layers, "
        "GPU idle or busy with a stand-in step, sampling stream of normal or highest priority) and its cProfile; "
        "SPAN_FLAGS: more flags (--kernels: the GPU kernels of a batch instead)",
        r"""
timeout 280 python3 benchmarks/sample_span.py ${SPAN_FLAGS:-} >"$OUT/sample_span.log" 2>&1 || status=1
sed -n '/^graph/,$p' "$OUT/sample_span.log" | grep -v "^ *$" | head -60
""",
    ),
    Stage(
        "sampletests",
        300,
        "the CUDA tests of the GPU sampler, relabel, the loader's sampling stream and the feature path "
        "(tests/sampling/test_gpu.py, test_device.py, tests/loader/test_node_loader.py, tests/cache/test_feature_path.py)",
        r"""
tests_to pytest_sampling.log 280 -m cuda tests/sampling/test_gpu.py tests/sampling/test_device.py \
  tests/loader/test_node_loader.py tests/cache/test_feature_path.py
""",
    ),
    Stage(
        "train1swap",
        590,
        "benchmarks/scaling.py --gpus 1 of this tree against this tree with the files BASE_FILES (paths from the "
        "repository root) taken from the checkout $BASE: one extension build serves both when the files are Python; "
        "inline and with the sampling thread, REPEATS (default 1) interleaved rounds; TIMELINE=1: this tree's "
        "timelines; SCALING_EPOCHS epochs a run (default 4)",
        r"""
saved=$(mktemp -d)
for f in ${BASE_FILES:?name the files to take from BASE}; do mkdir -p "$saved/$(dirname "$f")"; cp "$f" "$saved/$f"; done
restore() { for f in $BASE_FILES; do cp "$saved/$f" "$f"; done; }
trap restore EXIT
for rep in $(seq "${REPEATS:-1}"); do
  for variant in "inline:" "thread:--prefetch 1"; do
    name=${variant%%:*}
    for f in $BASE_FILES; do cp "${BASE:?}/$f" "$f"; done
    # shellcheck disable=SC2086
    train1 "base_${name}_$rep" "$PWD" "$here_cache" --epochs "${SCALING_EPOCHS:-4}" -- ${variant#*:}
    restore
    # shellcheck disable=SC2086
    train1 "this_${name}_$rep" "$PWD" "$here_cache" --epochs "${SCALING_EPOCHS:-4}" \
      ${TIMELINE:+--timeline "$OUT/${name}_$rep.json"} -- ${variant#*:}
  done
done
""",
    ),
    Stage(
        "timeline",
        590,
        "benchmarks/scaling.py --gpus 1 --timeline, inline and with the sampling thread (rank 0's "
        "per-batch stage spans and their plots under $OUT; needs a train_dist.py that takes --timeline)",
        r"""
train1 timeline_inline "$PWD" "$here_cache" --timeline "$OUT/inline.json"
train1 timeline_thread "$PWD" "$here_cache" --timeline "$OUT/thread.json" -- --prefetch 1
""",
    ),
    Stage(
        "step",
        590,
        "the CUDA tests of the graph step (tests/train/test_step.py against the eager step), the fused "
        "ReLU + dropout, the aggregation, the feature path (labels on the GPU, gather into given rows), "
        "timeline and meter; benchmarks/scaling.py --gpus 1 with TF32 products (--matmul-precision high), "
        "inline and with the sampling thread (TIMELINE=1: their timelines), and profiled short runs of "
        "the graph and eager steps; run with train1ab (BASE=main) for the before/after",
        r"""
tests_to pytest_step.log 200 tests/train/test_step.py tests/nn/test_relu_dropout_cuda.py \
  tests/nn/test_aggregate_cuda.py tests/nn/test_layers.py tests/cache/test_feature_path.py tests/train/test_timeline.py \
  tests/train/test_epoch.py "tests/cache/test_dist_feature.py::test_fetch_writes_into_the_given_rows" \
  tests/cache/test_dist_feature.py::test_cuda_ids_through_a_cache_of_every_row_need_no_host_sync
for variant in "tf32_inline:--matmul-precision high" "tf32_thread:--prefetch 1 --matmul-precision high"; do
  name=${variant%%:*}
  # shellcheck disable=SC2086
  train1 "$name" "$PWD" "$here_cache" ${TIMELINE:+--timeline "$OUT/$name.json"} -- ${variant#*:}
done
for mode in graph eager; do  # device activity under the profiler, 30 batches an epoch
  train1 "trace_$mode" "$PWD" "$here_cache" --epochs 2 --timeline "$OUT/short_$mode.json" \
    --trace "$OUT/trace_$mode.json" -- --max-batches 30 --step $mode
  python3 benchmarks/trace_busy.py "$OUT/trace_$mode-1gpu.json" --batches-per-epoch 30 | tail -1
  gzip -f "$OUT/trace_$mode-1gpu.json"
done
""",
    ),
    Stage(
        "trace",
        590,
        "the same for 2 epochs of 12 batches, with a torch.profiler trace",
        r"""
train1 trace "$PWD" "$here_cache" --epochs 2 --timeline "$OUT/short.json" --trace "$OUT/trace.json" -- --max-batches 12
""",
    ),
    Stage(
        "inference",
        590,
        "tests/train/test_inference_gpu.py, benchmarks/inference_gpu.py (layer-wise inference held on the "
        "GPU vs the host-buffer path) and, for scale, one training run with the sampling thread",
        r"""
tests_to pytest_inference.log 120 tests/train/test_inference_gpu.py
timeout 300 python3 benchmarks/inference_gpu.py --json "$OUT/inference.json" >"$OUT/inference.log" 2>&1 || status=1
tail -8 "$OUT/inference.log"
train1 epoch_thread "$PWD" "$here_cache" -- --prefetch 1
""",
    ),
]


def install(out: Path) -> dict[str, str]:
    """The carried wheels and distgnn (editable); returns the environment the stages run in."""
    env = {**os.environ, **NCCL_ENV, "PYTHONUNBUFFERED": "1", "OUT": str(out)}
    wheels = sorted(glob.glob(str(ROOT / ".whl" / "*.whl")))
    if wheels:
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--no-cache-dir"]
            + ["--upgrade", "--target", "/tmp/site", *wheels],
            check=True,
        )
        env["PYTHONPATH"] = "/tmp/site"
    env["site_path"] = env.get("PYTHONPATH", "")
    with open(out / "install.log", "w") as log:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "-q",
                "--no-deps",
                "--no-build-isolation",
                "--no-index",
                "-e",
                ".",
            ],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    if done.returncode != 0:
        sys.exit((out / "install.log").read_text())
    return env


def run_stage(stage: Stage, env: dict[str, str]) -> bool:
    """Runs ``stage``'s body in bash (its own process group, killed at the limit); True when it passed."""
    proc = subprocess.Popen(
        ["bash", "-c", PRELUDE + stage.body + "\nexit $status\n"], cwd=ROOT, env=env, start_new_session=True
    )
    try:
        return proc.wait(stage.limit_s) == 0
    except subprocess.TimeoutExpired:
        print(f"stage {stage.name}: past its {stage.limit_s} s limit, stopped", flush=True)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return False
    except KeyboardInterrupt:
        os.killpg(proc.pid, signal.SIGKILL)
        raise


def main() -> int:
    by_name = {stage.name: stage for stage in STAGES}
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("stages", nargs="?", default=DEFAULT, help=f"comma-separated, of: {', '.join(by_name)}")
    p.add_argument("--list", action="store_true", help="list the stages and exit")
    args = p.parse_args()
    if args.list:
        for stage in STAGES:
            print(f"{stage.name:11} {stage.limit_s:4d} s  {stage.about}")
        return 0
    names = [name for name in args.stages.split(",") if name]
    unknown = [name for name in names if name not in by_name]
    if unknown:
        p.error(f"unknown stage(s) {unknown}; stages: {', '.join(by_name)}")
    out = Path(os.environ.get("OUT", "/tmp/distgnn-gpu-session"))
    out.mkdir(parents=True, exist_ok=True)
    env = install(out)
    gpus = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"], capture_output=True, text=True
    ).stdout
    device = f"{gpus}cpus {os.cpu_count()}\n"
    print(device, end="", flush=True)
    (out / "device.txt").write_text(device)
    failed = [name for name in names if not run_stage(by_name[name], env)]
    if failed:
        print(f"failed: {', '.join(failed)}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
