#!/usr/bin/env bash
# The GPU floor on the products-sized synthetic graph (2.4M nodes, 62M edges, 100 features,
# 47 classes, 1.2M training seeds, fanout 15,10,5, batch 1024, hidden 256, one rank), in one
# call meant to end within 8 minutes on an H200 (GPU_FLOOR_BUDGET_S below stops it):
#   1. batch_sizes: the training batches' measured sizes (new nodes and sampled edges per hop,
#      feature bytes gathered), from the loader the CLI builds (python -m
#      pyg_mgpu.tools.batch_sizes); its first load converts and caches the graph. Beside it,
#      cache_bf16 converts and caches the graph with bf16 features, the cache --amp bf16 reads
#      (a cache of its own), so that the bf16 run below trains within its limit instead of
#      converting; the two conversions share the wait, and nothing timed runs meanwhile:
#      beside them fused_check runs the fused aggregation's GPU tests (pytest -m gpu
#      tests/test_fused_mean.py: the compiled Triton kernels against embedding_bag);
#   2. trace: one epoch with --trace-steps, turned into the table of the top kernels by GPU
#      time per step, their stage, and the training stream's idle time (python -m
#      pyg_mgpu.tools.kernel_table);
#   3. A/B runs of 2 epochs each, the same graph and seed: strict fp32 (--matmul-precision
#      highest, the baseline), TF32 (--matmul-precision high), --amp bf16, --cuda-graph,
#      --fused-aggregation where the CLI has it (a flag the CLI does not know is skipped),
#      and --prefetch 3 (three batches queued ahead instead of one: does the training stream
#      still wait while the sampler draws the next walk of 8 batches?);
#   4. fused_bench: the fused aggregation's kernels against embedding_bag on a products-shaped
#      batch, per layer and for a whole model step (benchmarks/fused_mean.py).
# The steps write their files (each step's log, steps.tsv, env.txt, batch_sizes.json,
# kernels.md, the trace's kernels.csv, the A/B runs' metrics.json and history.csv,
# fused_mean.json) into
# $GPU_FLOOR_WORK/gpu-floor (default /tmp/gpu-floor-work), beside the run folders and
# trace.json. $OUT (default runs/gpu-floor) gets three files, refreshed after every step so
# that a cut-off call keeps what ran: gpu_floor.md (Markdown for docs/benchmarks.md),
# kernels.md, and gpu-floor.tgz (the whole gpu-floor folder).
#
#   bash benchmarks/gpu_floor.sh                   # on the GPU machine
#   GPU_FLOOR_TINY=1 bash benchmarks/gpu_floor.sh  # the same steps on a tiny graph on one CPU
#                                                  # rank (about 90 s on 2 cores): a dry run
#
# Overrides: OUT, PYTHON (default python3), GPU_FLOOR_DEVICES (default cuda:0),
# GPU_FLOOR_EPOCHS (A/B epochs, default 2), GPU_FLOOR_TRACE_STEPS (default 20),
# GPU_FLOOR_RUN_S (each run's time limit, default 150), GPU_FLOOR_BUDGET_S (the whole call's:
# a step that would start with less than 30 s of it left is skipped; default 450),
# GPU_FLOOR_RUNS ("name ..." of the A/B runs to run; default all), GPU_FLOOR_COMMIT (the
# commit measured, for a copy of the tree without its git history).
# A failed, timed-out or skipped step is recorded and the next one runs; the script exits 0.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-python3}
OUT=${OUT:-runs/gpu-floor}
WORK=${GPU_FLOOR_WORK:-/tmp/gpu-floor-work}
EPOCHS=${GPU_FLOOR_EPOCHS:-2}
RUN_S=${GPU_FLOOR_RUN_S:-150}
BUDGET_S=${GPU_FLOOR_BUDGET_S:-450}
TRACE_STEPS=${GPU_FLOOR_TRACE_STEPS:-20}
if [ "${GPU_FLOOR_TINY:-0}" = 1 ]; then
  GRAPH=(--num-nodes 3000 --num-edges 30000 --num-features 8 --num-classes 4 --hidden 16
         --batch-size 64 --fanout 5,3 --devices cpu --nprocs 1)
  TRACE_STEPS=${GPU_FLOOR_TRACE_STEPS:-3}
  # The kernels on the CPU, through Triton's interpreter
  FUSED=(env TRITON_INTERPRET=1 "$PY" benchmarks/fused_mean.py --device cpu --num-nodes 2000
         --batch-size 8 --hidden 16)
else
  GRAPH=(--num-nodes 2400000 --num-edges 62000000 --num-features 100 --num-classes 47
         --hidden 256 --batch-size 1024 --fanout 15,10,5 --devices "${GPU_FLOOR_DEVICES:-cuda:0}")
  FUSED=("$PY" benchmarks/fused_mean.py)
fi
mkdir -p "$OUT" "$WORK"
OUT=$(cd "$OUT" && pwd)
WORK=$(cd "$WORK" && pwd)
FLOOR="$WORK/gpu-floor"  # every file the steps leave, archived whole into OUT
rm -rf "$FLOOR"
mkdir -p "$FLOOR"
STEPS="$FLOOR/steps.tsv"
: > "$STEPS"
START=$SECONDS
declare -A PIDS=() BEGUN=()  # the steps running, by name
# Whatever this script started ends with it: its own signals reach the running steps, and
# OUT keeps what ran.
stop() {
  local name
  for name in "${!PIDS[@]}"; do kill -TERM "${PIDS[$name]}" 2>/dev/null || true; done
  for name in "${!PIDS[@]}"; do
    wait "${PIDS[$name]}" || true
    printf '%s\tstopped\t%s\t%s\n' "$name" "$((SECONDS - BEGUN[$name]))" "${FLAGS:-}" >> "$STEPS"
    echo "[gpu_floor] $name: stopped by a signal"
  done
  report
  exit 130
}
trap stop INT TERM HUP

# publish FILE NAME: a copy of FILE as OUT/NAME, whole or not at all (a copy then a rename)
publish() {
  cp "$1" "$OUT/.$2.part" && mv -f "$OUT/.$2.part" "$OUT/$2"
}

report() {  # gpu_floor.md from what has run so far; OUT's three files refreshed
  "$PY" benchmarks/gpu_floor.py "$FLOOR" "${GRAPH[*]}" || echo "   (report failed)"
  local name
  for name in gpu_floor.md kernels.md; do
    if [ -f "$FLOOR/$name" ]; then publish "$FLOOR/$name" "$name" || true; fi
  done
  # tar's exit 1: a log grew while it was read (a step beside this one); the copy still stands
  { tar --warning=no-file-changed -czf "$WORK/gpu-floor.tgz" -C "$WORK" gpu-floor || [ $? = 1 ]; } \
    && publish "$WORK/gpu-floor.tgz" gpu-floor.tgz || echo "   (archive failed)"
}

# start NAME LIMIT COMMAND...: runs it in the background under `timeout` (TERM, then KILL 30 s
# later; the CLI's ranks checkpoint and exit on TERM), logging to NAME.log; finish NAME waits
# for it and records its exit code and seconds. A step that would start with less than 30 s of
# the budget left is recorded as skipped instead (and start fails).
start() {
  local name=$1 limit=$2; shift 2
  local left=$((BUDGET_S - (SECONDS - START)))
  if [ "$left" -lt 30 ]; then
    echo "[gpu_floor] $name: skipped, ${left} s of the ${BUDGET_S} s budget left"
    printf '%s\tskipped\t0\t%s\n' "$name" "${FLAGS:-}" >> "$STEPS"
    return 1
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "[gpu_floor] $name (limit ${limit} s, $((SECONDS - START)) s in): $*"
  BEGUN[$name]=$SECONDS
  timeout --kill-after=30 "$limit" "$@" > "$FLOOR/$name.log" 2>&1 &
  PIDS[$name]=$!
}

finish() {
  local name=$1 rc=0
  [ -n "${PIDS[$name]:-}" ] || return 0
  wait "${PIDS[$name]}" || rc=$?
  unset "PIDS[$name]"
  local seconds=$((SECONDS - BEGUN[$name]))
  printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$seconds" "${FLAGS:-}" >> "$STEPS"
  echo "[gpu_floor] $name: exit $rc after $seconds s; $(tail -n 1 "$FLOOR/$name.log")"
  report
}

# step NAME LIMIT COMMAND...: start, then finish
step() {
  if start "$@"; then finish "$1"; else report; fi
}

CLI_HELP=$("$PY" -m pyg_mgpu.distributed_sampling --help 2>/dev/null || true)
cli_knows() {  # cli_knows --flag: whether the training CLI has the flag
  grep -qE -- "(^|[[:space:],])$1([[:space:],=]|$)" <<< "$CLI_HELP"
}

chosen() {  # chosen NAME: whether GPU_FLOOR_RUNS (default all) names the A/B run
  [ -z "${GPU_FLOOR_RUNS:-}" ] || [[ " $GPU_FLOOR_RUNS " == *" $1 "* ]]
}

# ab NAME FLAGS...: one A/B run of EPOCHS epochs (validation once, after the last)
ab() {
  local name=$1; shift
  chosen "$name" || return 0
  local flag
  for flag in "$@"; do
    if [[ "$flag" == --* ]] && ! cli_knows "$flag"; then
      echo "[gpu_floor] $name: skipped, the CLI has no $flag"
      printf '%s\tno %s\t0\t%s\n' "$name" "$flag" "$*" >> "$STEPS"
      report
      return 0
    fi
  done
  FLAGS="$*" step "$name" "$RUN_S" "$PY" -m pyg_mgpu.distributed_sampling "${GRAPH[@]}" \
    --epochs "$EPOCHS" --eval-every "$EPOCHS" --out "$WORK/$name" --overwrite "$@"
  if [ -f "$WORK/$name/metrics.json" ]; then
    mkdir -p "$FLOOR/$name"
    cp "$WORK/$name/metrics.json" "$WORK/$name/history.csv" "$FLOOR/$name/" 2>/dev/null || true
    report
  fi
}

echo "[gpu_floor] output in $OUT, work folder $WORK, budget ${BUDGET_S} s"
{
  "$PY" -c 'import torch, torch_geometric as g
print("torch", torch.__version__, "| CUDA", torch.version.cuda, "|",
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU",
      "| torch_geometric", g.__version__)' || true
  if [ -n "${GPU_FLOOR_COMMIT:-}" ]; then echo "commit $GPU_FLOOR_COMMIT"
  else git log -1 --format='commit %h (%cs)' 2>/dev/null || echo "commit unknown"; fi
  date -u +'measured %Y-%m-%d %H:%M UTC'
} > "$FLOOR/env.txt" 2>&1

if chosen bf16 && cli_knows --amp; then
  start cache_bf16 240 "$PY" -m pyg_mgpu.tools.batch_sizes "${GRAPH[@]}" --amp bf16 \
    --batches 1 || true
fi
if chosen fused; then
  start fused_check 180 "$PY" -m pytest -q -p no:cacheprovider -m gpu tests/test_fused_mean.py \
    || true
fi
step batch_sizes 240 "$PY" -m pyg_mgpu.tools.batch_sizes "${GRAPH[@]}" --batches 16 \
  --json "$FLOOR/batch_sizes.json"
finish cache_bf16
finish fused_check

step trace "$RUN_S" "$PY" -m pyg_mgpu.distributed_sampling "${GRAPH[@]}" --epochs 1 \
  --trace-steps "$TRACE_STEPS" --out "$WORK/trace" --overwrite
if [ -f "$WORK/trace/kernels.csv" ]; then
  mkdir -p "$FLOOR/trace"
  cp "$WORK/trace/kernels.csv" "$WORK/trace/metrics.json" "$FLOOR/trace/" 2>/dev/null || true
fi
step kernel_table 120 "$PY" -m pyg_mgpu.tools.kernel_table "$WORK/trace" --top 25 \
  --out "$FLOOR/kernels.md"

ab fp32 --matmul-precision highest
ab tf32 --matmul-precision high
ab bf16 --amp bf16
ab cuda_graph --cuda-graph
ab fused --fused-aggregation
ab prefetch3 --prefetch 3
if chosen fused; then
  step fused_bench 120 "${FUSED[@]}" --out "$FLOOR/fused_mean.json"
fi

echo "[gpu_floor] done in $((SECONDS - START)) s: $OUT/gpu_floor.md, $OUT/gpu-floor.tgz"
cat "$OUT/gpu_floor.md" 2>/dev/null || true
