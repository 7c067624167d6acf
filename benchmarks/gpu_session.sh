#!/usr/bin/env bash
# Everything issue 6 measures, for one call of the lent GPU machine, from the repo root there:
#   bash benchmarks/gpu_session.sh [stages]      # stages: comma-separated, default tests,gather,sampling,scaling
# tests    the CUDA tests of the gather, cache, sampler, relabel, aggregation and loader (kernel vs reference,
#          clique over 2 GPUs where there are two)
# cuda     every CUDA test of the suite: pytest -m cuda (tests/conftest.py marks the tests that need a GPU)
# cachetests  the gather and cache tests alone (after a change to the gather)
# gather   benchmarks/gather.py on the 12.3 GB table (tiers, cpu_share sweep, mixed path vs table[ids].to)
# pages    benchmarks/host_pages.py (zero-copy reads of scattered rows: cudaHostAlloc vs cuMemCreate host memory)
# sampling benchmarks/sampling_gpu.py (GPU sampler vs the C++ sampler on this host's cores, merge by relabel
#          and by unique) and benchmarks/relabel_gpu.py (the relabel kernel vs the torch relabel)
# aggregate benchmarks/aggregate_cuda.py (CUDA mean aggregation vs the torch path, layer and training step)
# train1   benchmarks/scaling.py --gpus 1 (products-scale GraphSAGE on one GPU): sampling thread or inline, with
#          and without the gather pipeline
# scaling  benchmarks/scaling.py (products-scale GraphSAGE on 1 and 2 GPUs), sampling thread and inline
# e2etests  the tests of issue 18's one-GPU work: gather and cache, timeline, the loader's sampling stream
# resident benchmarks/gather.py --resident (the all-hit gather: all-hit path vs planned path vs index_select)
# train1ab benchmarks/scaling.py --gpus 1, inline sampling and the sampling thread, each run against the checkout
#          in $BASE first when BASE is set (its own extension build; same partition in /tmp/distgnn-train1);
#          TIMELINE=1: this tree's runs also write their timelines (a few events per batch)
# timeline benchmarks/scaling.py --gpus 1 --timeline, inline and with the sampling thread (rank 0's per-batch
#          stage spans and their plots under $OUT; needs a train_dist.py that takes --timeline)
# trace    the same for 2 epochs of 12 batches, with a torch.profiler trace
# step     issue 25: the CUDA tests of the graph step (tests/train/test_step.py against the eager step), the fused
#          ReLU + dropout, the aggregation, the feature path (labels on the GPU, gather into given rows), timeline
#          and meter; benchmarks/scaling.py --gpus 1 with TF32 products (--matmul-precision high), inline and with the
#          sampling thread (TIMELINE=1: their timelines); run with train1ab (BASE=main) for the before/after
# inference  tests/train/test_inference_gpu.py, benchmarks/inference_gpu.py (layer-wise inference held on the GPU vs the
#          host-buffer path) and, for scale, one training run with the sampling thread
# typed    the CUDA tests of issue 15/16's typed and nn paths: the typed GPU sampler, the CUDA aggregation (mean,
#          weighted sums, GAT against the CPU), GPU layer-wise inference (GraphSAGE and GAT); then
#          examples/rgcn on synthetic-mag (--local: one server and one trainer, since --local starts one trainer per GPU; --sample-device cuda)
# suite    every test file that touches CUDA, and the embedding, typed-model and link tests (the whole suite
#          runs past one call's 10 minutes there)
# dynamic  issues 23/24: the temporal tests (CUDA sampler vs reference) and the recurrent cells' CUDA test, then
#          benchmarks/train_tgn.py (vs PyG's TGN) and benchmarks/train_snapshot.py --part peer (vs PyTorch Geometric
#          Temporal: carry its wheel with decorator and networkx in .whl/) on the GPU; the data is read from
#          ../shared/data, copied there from DATA_ROOT when set (the GPU machine has no network)
# stability  benchmarks/tgn_stability.py on the host's cores (CPU step, one thread a process): one process per
#          set and seed, STAB_SETS (system:time-encoding words, default "distgnn:fixed distgnn:learned pyg:fixed"; pyg ignores the encoding), STAB_SEEDS
#          (default 0 1 2 3 4), STAB_PERTURB (default 0,1,2,3); the collapse counts per set
# tgnscaling  benchmarks/train_tgn.py --scaling 1,2,4 on the host's CPU cores (memory parallelism, one thread per
#          trainer: where the development box's 2 cores cannot give 4 trainers a core each), seeds TGN_SEEDS
# steptests  the tests of the step captured across GPUs (tests/train/test_step*.py, test_grad_sync.py; 2 GPUs)
# multigpu benchmarks/scaling.py, 1 vs 2 GPUs, the variants in SCALING_VARIANTS (default "inline thread machines"):
#          inline sampling (the default with GPU sampling; also 2 GPUs with DDP's eager step, the old path), the
#          sampling thread (--prefetch 1), 2 simulated machines x 1 GPU, and on request: deep (--prefetch 4),
#          replicate (every GPU caches the whole hot set: no peer reads), timeline (inline, rank 0's per-batch
#          stage spans and their plots under $OUT), repeats (inline, 1 and 2 GPUs run 3 times each, interleaved);
#          SCALING_EPOCHS epochs a run (default 8)
# nccl     examples/graphsage on 2 simulated machines x 1 trainer, one GPU each, DDP over NCCL (2 GPUs): passes when
#          RESULT reports the nccl backend on cuda:0
# link     examples/link_prediction on Cora with --device cuda (--local 1x1 and --single; DATA=planetoid dir)
# Installs carried wheels (.whl/) and distgnn (editable), sets the NCCL variables the lent machines need, and
# writes every log under $OUT. Budget: tests ~2.5 min (with the extension builds), gather ~1.5 min, sampling
# ~1 min, scaling ~3.5 min (2 GPUs needed for the clique and scaling parts); keep one call under 10 minutes.
set -uo pipefail
stages=${1:-tests,gather,sampling,scaling}
OUT=${OUT:-/tmp/distgnn-gpu-session}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || exit 1
  export PYTHONPATH=/tmp/site
fi
site_path=${PYTHONPATH:-}
# An editable install (it maps partition/ and launch/ to distgnn.partition and distgnn.launch): no $PWD on the path,
# which would shadow that mapping with the bare distgnn/ folder.
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >"$OUT/install.log" 2>&1 || {
  cat "$OUT/install.log"
  exit 1
}
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; echo "cpus $(nproc)"; } | tee "$OUT/device.txt"
status=0
has() { [[ ",$stages," == *",$1,"* ]]; }
if has tests; then
  timeout 300 python3 -m pytest -q -p no:cacheprovider --durations=5 tests/cache tests/native/test_cuda_extensions.py \
    tests/sampling/test_gpu.py tests/sampling/test_device.py tests/sampling/test_kernels.py tests/nn/test_aggregate_cuda.py \
    tests/nn/test_relu_dropout_cuda.py tests/train/test_step.py \
    tests/nn/test_layers.py >"$OUT/pytest.log" 2>&1 || status=1
  grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/pytest.log" | tail -15
fi
if has suite; then
  # shellcheck disable=SC2046
  timeout 540 python3 -m pytest -q -p no:cacheprovider --durations=5 $(grep -rl -i cuda tests --include='test_*.py') \
    tests/client/test_embedding*.py tests/nn/test_hetero_layers.py tests/loader/test_edge_loader_hetero.py tests/examples/test_rgcn.py >"$OUT/pytest_suite.log" 2>&1 || status=1
  grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/pytest_suite.log" | tail -25
fi
if has typed; then
  timeout 300 python3 -m pytest -q -p no:cacheprovider tests/sampling/test_hetero_sampling.py tests/nn/test_aggregate_cuda.py \
    tests/train/test_inference_gpu.py tests/nn/test_layers.py tests/nn/test_hetero_layers.py >"$OUT/pytest_typed.log" 2>&1 || status=1
  grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/pytest_typed.log" | tail -15
  timeout 240 python3 examples/rgcn/train_dist.py --dataset synthetic-mag --num-papers 20000 --local --num-parts 1 \
    --trainers-per-machine 1 --device cuda --sample-device cuda --epochs 3 --quiet --workdir /tmp/distgnn-rgcn \
    >"$OUT/rgcn_cuda.log" 2>&1 || status=1
  grep -E "^RESULT|Error" "$OUT/rgcn_cuda.log" | tail -3
fi
if has link; then
  for mode in "--local --num-parts 1 --trainers-per-machine 1" "--single"; do
    # shellcheck disable=SC2086
    timeout 200 python3 examples/link_prediction/train_dist.py --dataset cora --data-dir "${DATA:?set DATA to a directory with the Cora files: the GPU machine has no network}" $mode \
      --device cuda --workdir /tmp/distgnn-link >"$OUT/link_cuda${mode%% *}.log" 2>&1 || status=1
    echo "link $mode: $(grep -E '^RESULT|Error' "$OUT/link_cuda${mode%% *}.log" | tail -1)"
  done
fi
if has dynamic; then
  if [[ -n "${DATA_ROOT:-}" && ! -d ../shared/data ]]; then mkdir -p ../shared && cp -r "$DATA_ROOT" ../shared/data; fi
  timeout 240 python3 -m pytest -q -p no:cacheprovider tests/temporal tests/snapshot/test_recurrent.py \
    tests/train/test_timeline.py >"$OUT/pytest_dynamic.log" 2>&1 || status=1
  grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/pytest_dynamic.log" | tail -15
  for seed in ${TGN_SEEDS:-0}; do  # TGN_SEEDS="0 1 2": one comparison per seed (test AP moves with the seed)
    timeout 200 python3 benchmarks/train_tgn.py --device cuda --epochs 3 --seed "$seed" >>"$OUT/tgn_cuda.log" 2>&1 \
      || status=1
  done
  grep -E "^(stream|system|distgnn|PyG)" "$OUT/tgn_cuda.log"
  timeout 200 python3 benchmarks/train_snapshot.py --part peer --device cuda --epochs 50 --seeds 0 \
    >"$OUT/snapshot_cuda.log" 2>&1 || status=1
  tail -14 "$OUT/snapshot_cuda.log"
fi
if has stability; then
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
fi
if has tgnscaling; then
  if [[ -n "${DATA_ROOT:-}" && ! -d ../shared/data ]]; then mkdir -p ../shared && cp -r "$DATA_ROOT" ../shared/data; fi
  for seed in ${TGN_SEEDS:-0}; do
    timeout 280 python3 benchmarks/train_tgn.py --systems '' --scaling 1,2,4 --epochs 3 --evals-per-epoch 4 \
      --seed "$seed" >>"$OUT/tgn_scaling.log" 2>&1 || status=1
  done
  grep -E "^(stream|scaling|trainers| +[124] )" "$OUT/tgn_scaling.log"
fi
if has cuda; then
  timeout 540 python3 -m pytest -q -p no:cacheprovider --durations=8 -m cuda tests >"$OUT/pytest_cuda.log" 2>&1 || status=1
  grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/pytest_cuda.log" | tail -25
fi
if has steptests; then
  timeout 300 python3 -m pytest -q -p no:cacheprovider --durations=5 tests/train/test_step.py \
    tests/train/test_step_gpus.py tests/train/test_grad_sync.py >"$OUT/pytest_steps.log" 2>&1 || status=1
  grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/pytest_steps.log" | tail -8
fi
if has multigpu; then
  epochs=${SCALING_EPOCHS:-8}
  for variant in "inline:--ddp-rows" "thread:-- --prefetch 1" "machines:--machines many" "deep:-- --prefetch 4" \
    "replicate:--cache-policy replicate" "timeline:--timeline $OUT/tl.json" "repeats:--repeats 3"; do
    name=${variant%%:*}
    [[ " ${SCALING_VARIANTS:-inline thread machines} " == *" $name "* ]] || continue
    # shellcheck disable=SC2086
    timeout 300 python3 benchmarks/scaling.py --epochs "$epochs" --json "$OUT/scaling_$name.json" ${variant#*:} \
      >"$OUT/scaling_$name.log" 2>&1 || status=1
    echo "scaling $name:"; sed -n '/^ *GPUs/,$p' "$OUT/scaling_$name.log"; grep -E "Error|failed" "$OUT/scaling_$name.log" | tail -3
  done
fi
if has nccl; then
  timeout 300 python3 examples/graphsage/train_dist.py --local --device cuda --dataset synthetic --num-nodes 200000 \
    --avg-degree 10 --part-method random --num-parts 2 --trainers-per-machine 1 --fanouts 15,10,5 --hidden 256 \
    --batch-size 1024 --epochs 3 --workdir /tmp/distgnn-nccl >"$OUT/nccl.log" 2>&1 || status=1
  if grep -q '"backend": "[^"]*nccl' "$OUT/nccl.log" && grep -q '"device": "cuda:0"' "$OUT/nccl.log"; then
    echo "nccl: passed"
  else
    echo "nccl: FAILED (see nccl.log)"; status=1
  fi
fi
if has cachetests; then
  timeout 200 python3 -m pytest -q -p no:cacheprovider tests/cache \
    >"$OUT/pytest_cache.log" 2>&1 || status=1
  grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/pytest_cache.log" | tail -15
fi
if has gather; then
  python3 benchmarks/gather.py --num-nodes 24000000 --dim 128 --json "$OUT/gather.json" >"$OUT/gather.log" 2>&1 || status=1
  grep -E "anatomy|A/B|steps|ceiling|host memory|contention|sorted misses|cpu_share|CPU gather|torch table|^ +[0-9]+%" "$OUT/gather.log"
fi
if has pages; then
  timeout 240 python3 benchmarks/host_pages.py >"$OUT/pages.log" 2>&1 || status=1
  cat "$OUT/pages.log"
fi
if has sampling; then
  for merge in relabel unique; do
    timeout 180 python3 benchmarks/sampling_gpu.py --merge $merge --json "$OUT/sampling_$merge.json" \
      >"$OUT/sampling_$merge.log" 2>&1 || status=1
    tail -6 "$OUT/sampling_$merge.log"
  done
  timeout 120 python3 benchmarks/relabel_gpu.py >"$OUT/relabel.log" 2>&1 || status=1
  tail -5 "$OUT/relabel.log"
fi
if has aggregate; then
  timeout 240 python3 benchmarks/aggregate_cuda.py >"$OUT/aggregate.log" 2>&1 || status=1
  tail -20 "$OUT/aggregate.log"
fi
if has train1; then
  # The first run also generates and partitions the graph and builds the extensions (its epoch 0).
  variants=("thread:" "inline:--prefetch 0" "thread_pipeline:--pipeline" "inline_pipeline:--prefetch 0 --pipeline")
  for variant in "${variants[@]}"; do
    name=${variant%%:*}
    # shellcheck disable=SC2086
    timeout 240 python3 benchmarks/scaling.py --gpus 1 -- ${variant#*:} \
      >"$OUT/train1_$name.log" 2>&1 || status=1
    echo "train1 $name: $(tail -1 "$OUT/train1_$name.log")"
  done
fi
if has scaling; then
  timeout 240 python3 benchmarks/scaling.py --json "$OUT/scaling.json" >"$OUT/scaling.log" 2>&1 || status=1
  tail -4 "$OUT/scaling.log"
  timeout 120 python3 benchmarks/scaling.py --json "$OUT/scaling_inline.json" -- --prefetch 0 >"$OUT/scaling_inline.log" 2>&1 \
    || status=1
  tail -4 "$OUT/scaling_inline.log"
fi
if has e2etests; then
  timeout 300 python3 -m pytest -q -p no:cacheprovider tests/cache/test_gather_cuda.py tests/cache/test_feature_cache.py \
    tests/cache/test_pipeline.py tests/train/test_timeline.py tests/train/test_epoch.py \
    tests/cache/test_dist_feature.py::test_cuda_ids_through_a_cache_of_every_row_need_no_host_sync \
    "tests/loader/test_node_loader.py::test_gpu_sampling_runs_on_its_own_stream_and_hands_over_finished_batches" \
    >"$OUT/pytest_e2e.log" 2>&1 || status=1
  grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/pytest_e2e.log" | tail -15
fi
if has resident; then
  timeout 200 python3 benchmarks/gather.py --resident --json "$OUT/resident.json" >"$OUT/resident.log" 2>&1 || status=1
  sed -n '/^all-hit gather/,$p' "$OUT/resident.log"
  grep -E "Error|error" "$OUT/resident.log" | tail -3
fi
train1() {  # name, directory, extension cache, more scaling.py flags
  (cd "$2" && XDG_CACHE_HOME="$3" PYTHONPATH="$2${site_path:+:$site_path}" timeout 240 python3 benchmarks/scaling.py \
    --gpus 1 --workdir /tmp/distgnn-train1 --json "$OUT/train1_$1.json" "${@:4}") >"$OUT/train1_$1.log" 2>&1 || status=1
  echo "train1 $1: $(grep -E '^ +1 ' "$OUT/train1_$1.log" | tail -1)"
  grep -E "^timeline" "$OUT/train1_$1.log"
}
here_cache=${XDG_CACHE_HOME:-$HOME/.cache}
if has train1ab; then
  for variant in "inline:" "thread:--prefetch 1"; do
    name=${variant%%:*}
    # shellcheck disable=SC2086
    if [[ -n "${BASE:-}" ]]; then train1 "base_$name" "$BASE" /tmp/xdg-base -- ${variant#*:}; fi
    # shellcheck disable=SC2086
    train1 "this_$name" "$PWD" "$here_cache" ${TIMELINE:+--timeline "$OUT/$name.json"} -- ${variant#*:}
  done
fi
if has timeline; then
  train1 timeline_inline "$PWD" "$here_cache" --timeline "$OUT/inline.json"
  train1 timeline_thread "$PWD" "$here_cache" --timeline "$OUT/thread.json" -- --prefetch 1
fi
if has step; then  # issue 25: the training step replayed from a CUDA graph (this tree; BASE / train1ab for the eager one)
  timeout 200 python3 -m pytest -q -p no:cacheprovider tests/train/test_step.py tests/nn/test_relu_dropout_cuda.py \
    tests/nn/test_aggregate_cuda.py tests/nn/test_layers.py tests/cache/test_feature_path.py tests/train/test_timeline.py \
    tests/train/test_epoch.py "tests/cache/test_dist_feature.py::test_fetch_writes_into_the_given_rows" \
    tests/cache/test_dist_feature.py::test_cuda_ids_through_a_cache_of_every_row_need_no_host_sync \
    >"$OUT/pytest_step.log" 2>&1 || status=1
  grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/pytest_step.log" | tail -8
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
fi
if has trace; then  # a short run: the trace of a whole products-scale run is too large to bring back
  train1 trace "$PWD" "$here_cache" --epochs 2 --timeline "$OUT/short.json" --trace "$OUT/trace.json" -- --max-batches 12
fi
if has inference; then
  timeout 120 python3 -m pytest -q -p no:cacheprovider tests/train/test_inference_gpu.py >"$OUT/pytest_inference.log" 2>&1 \
    || status=1
  grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/pytest_inference.log" | tail -5
  timeout 300 python3 benchmarks/inference_gpu.py --json "$OUT/inference.json" >"$OUT/inference.log" 2>&1 || status=1
  tail -8 "$OUT/inference.log"
  train1 epoch_thread "$PWD" "$here_cache" -- --prefetch 1
fi
exit $status
