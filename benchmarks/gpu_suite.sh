#!/usr/bin/env bash
# The GPU suite: every CUDA test and GPU measurement, in four parts that each run on their own;
# every step runs under its own timeout (the second argument of `step` below, in seconds).
#
#   PYTHONPATH=. bash benchmarks/gpu_suite.sh OUT tests     # versions, pytest -m gpu
#   PYTHONPATH=. bash benchmarks/gpu_suite.sh OUT sampler   # GPU sampler on 1M / 2.4M nodes,
#                                                          # per-stage profile and kernel
#                                                          # trace at 2.4M nodes
#   PYTHONPATH=. bash benchmarks/gpu_suite.sh OUT variants  # 10 CLI variants, a stop and resume,
#                                                          # the heterogeneous example
#                                                          # and CLI,
#                                                          # 2 gloo ranks on one GPU
#   PYTHONPATH=. bash benchmarks/gpu_suite.sh OUT full      # products-scale training bench
#                                                          # with nvidia-smi sampling
#   PYTHONPATH=. bash benchmarks/gpu_suite.sh OUT recipe    # PyG's recipe beside pyg_mgpu at
#                                                          # products scale, with the
#                                                          # torch-scatter/torch-sparse wheels
#                                                          # in SUITE_WHEELS (.dev/wheels)
#   PYTHONPATH=. bash benchmarks/gpu_suite.sh OUT lean      # the first call on a fresh GPU
#                                                          # (about 8 minutes): versions,
#                                                          # pytest -m gpu (6 at once), the
#                                                          # products bench of the GPU's modes
#                                                          # (2 epochs), the sampler and the
#                                                          # kernel trace at 2.4M nodes, and
#                                                          # host memory of 2 ranks on one
#                                                          # pinned copy
#   bash benchmarks/gpu_suite.sh OUT quick                  # all but full and recipe (over
#                                                          # one call)
#   bash benchmarks/gpu_suite.sh OUT all                    # all five (over one call)
#   DRY_RUN=1 bash benchmarks/gpu_suite.sh OUT all          # print the commands, run nothing
#
# Each step runs under `timeout`, logs to OUT/<step>.log, and the suite goes on after a
# failure. OUT/summary.md gets one row per step (exit code, seconds, key numbers from its
# metrics.json / bench.json), and OUT/results.tar.gz bundles every log and JSON/CSV file of OUT
# (one file, whatever a machine lets come back); both are rewritten after every step, so a
# cut-off run keeps what ran. SUITE_SYSTEMS="a,b" replaces the products bench's systems (a call
# with a time limit can run them a few at a time).
# SUITE_STEPS="name ..." runs only those steps of the part (e.g. the ones a cut-off call did not
# reach; `resume` needs `graph_gpu` in the same OUT). Overrides: SUITE_DEVICES (default
# cuda:0), SUITE_NODES/SUITE_EDGES (CLI variants, default 200000/4000000), SUITE_EPOCHS
# (default 3), SUITE_GLOO_DEVICES (default cuda:0,0), PYTHON (default python3: the interpreter
# that holds torch).
set -u
OUT=${1:?usage: bash benchmarks/gpu_suite.sh OUT_DIR [tests|sampler|variants|full|quick|all]}
PART=${2:-all}
case "$PART" in
  tests|sampler|variants|full|recipe|lean|quick|all) ;;
  *) echo "part must be tests, sampler, variants, full, recipe, lean, quick or all" >&2; exit 2;;
esac
want() {  # want tests|sampler|variants|full|recipe: whether PART includes it
  case "$PART" in
    all|lean) true;; quick) [ "$1" != full ] && [ "$1" != recipe ];; *) [ "$1" = "$PART" ];;
  esac
}
if [ "$PART" = lean ]; then  # these steps of every part, in the parts' order
  SUITE_STEPS=${SUITE_STEPS:-"env pytest_gpu sampler_2_4m trace_products host_memory products"}
fi
PY=${PYTHON:-python3}
DEV=${SUITE_DEVICES:-cuda:0}
NODES=${SUITE_NODES:-200000}
EDGES=${SUITE_EDGES:-4000000}
EPOCHS=${SUITE_EPOCHS:-3}
DRY=${DRY_RUN:-0}
cd "$(dirname "$0")/.."
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
STEPS="$OUT/steps.tsv"
[ -f "$STEPS" ] || : > "$STEPS"

summarize() {  # OUT/summary.md from steps.tsv and each step's metrics.json / bench.json
  "$PY" - "$OUT" <<'PYEOF'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
rows = ["| step | exit | seconds | key numbers |", "|---|---|---|---|"]
def fmt(v):
    return f"{v:.4g}" if isinstance(v, float) else str(v)
for line in (out / "steps.tsv").read_text().splitlines():
    step, rc, secs = line.split("\t")
    keys = []
    m = out / step / "metrics.json"
    if m.is_file():
        d = json.loads(m.read_text())
        for k in ("test_acc", "test_acc_exact", "best_val_acc", "mean_epoch_time_s",
                  "feature_cache_rows", "backend", "world_size", "peak_mem_mb"):
            if k in d:
                keys.append(f"{k}={fmt(d[k])}")
        # Epoch 1 holds CUDA's warm-up (and, with --compile, the compilation).
        later = [e["epoch_time_s"] for e in d.get("epochs", [])[1:]]
        if later:
            keys.append(f"epoch_time_after_first_s={fmt(sum(later) / len(later))}")
        busy = [e.get("gpu_busy_pct") for e in d.get("epochs", [])[1:]]
        if busy and None not in busy:
            keys.append(f"gpu_busy_after_first_pct={sum(busy) / len(busy):.0f}")
    b = out / step / "bench.json"
    if b.is_file():
        res = json.loads(b.read_text())["results"]
        for name, r in res.items():
            if isinstance(r, dict):
                keys.append(f"{name}: " + (f"{r['epoch_time_s']:.3g} s/epoch, test_acc "
                                           f"{fmt(r.get('test_acc'))}, x{r.get('epoch_time_vs_pyg_mgpu', 0):.2f} vs pyg_mgpu"
                                           + (f", GPU busy {r['gpu_busy_pct']:.0f}%"
                                              if r.get("gpu_busy_pct") is not None else "")
                                           if "epoch_time_s" in r else
                                           str(r.get("skipped") or r.get("failed"))))
            elif isinstance(r, float) and "_vs_" not in name:
                keys.append(f"{name}={r / 1e6:.1f}M edges/s")
    g = out / step / "gpu_usage.csv"
    if g.is_file():
        util, mem = [], []
        for l in g.read_text().splitlines()[1:]:
            try:
                u, m_ = [p.strip().split()[0] for p in l.split(",")[:2]]
                util.append(float(u)); mem.append(float(m_))
            except (ValueError, IndexError):
                pass
        if util:
            keys.append(f"GPU util mean {sum(util) / len(util):.0f}% (max {max(util):.0f}%), "
                        f"peak memory {max(mem):.0f} MiB")
    rows.append(f"| {step} | {rc} | {secs} | {'; '.join(keys)} |")
(out / "summary.md").write_text("\n".join(rows) + "\n")
PYEOF
}

bundle() {  # OUT/results.tar.gz: every log and result file of OUT so far
  (cd "$OUT" && tar czf results.tar.gz --exclude='*.pt' --exclude='*.png' \
    --exclude=results.tar.gz -- *) 2>/dev/null
}

step() {  # step NAME TIMEOUT_S COMMAND...: runs it, logs it, records exit code and seconds
  local name=$1 limit=$2; shift 2
  if [ -n "${SUITE_STEPS:-}" ] && [[ " $SUITE_STEPS " != *" $name "* ]]; then return 0; fi
  echo "== $name (limit ${limit}s): $*"
  if [ "$DRY" = 1 ]; then return 0; fi
  mkdir -p "$OUT/$name"
  local start=$SECONDS
  timeout --kill-after=20 "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  printf '%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - start))" >> "$STEPS"
  echo "   exit $rc after $((SECONDS - start)) s (log: $OUT/$name.log)"
  summarize || echo "   (summary failed)"
  bundle
}

train() {  # train NAME TIMEOUT_S FLAGS...: one CLI run on the moderate synthetic graph
  # (--overwrite on every run of the suite: a step run again into the same OUT starts afresh)
  local name=$1 limit=$2; shift 2
  step "$name" "$limit" "$PY" -m pyg_mgpu.distributed_sampling --num-nodes "$NODES" \
    --num-edges "$EDGES" --num-features 100 --num-classes 47 --fanout 15,10,5 \
    --batch-size 1024 --epochs "$EPOCHS" --out "$OUT/$name" --overwrite "$@"
}

if want tests; then
  step env 60 bash -c "nvidia-smi; $PY -c 'import torch, torch_geometric as g; \
print(\"torch\", torch.__version__, \"cuda\", torch.version.cuda, \"available\", \
torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else \"\"); \
print(\"torch_geometric\", g.__version__)'; git log --oneline -1 2>/dev/null || true"
  # -rfE: every failure's summary even with -q; --timeout (pytest-timeout, on the GPU image)
  # ends a hung test instead of the whole step. One after another the 51 tests outran 480 s
  # on an H100 (most start ranks, each initializing CUDA): pytest-xdist, where installed,
  # runs 6 at once on the one GPU.
  timeout_flag=$("$PY" -c 'import pytest_timeout' 2>/dev/null && echo --timeout=150)
  xdist_flag=$("$PY" -c 'import xdist' 2>/dev/null && echo "-n 6")
  step pytest_gpu 480 "$PY" -m pytest -m gpu -q -rfE --durations=15 -p no:cacheprovider \
    ${timeout_flag:-} ${xdist_flag:-} tests
fi

if want sampler; then
  for size in "1m 1000000 25000000" "2_4m 2400000 62000000"; do
    set -- $size
    step "sampler_$1" 180 "$PY" -m pyg_mgpu.bench --sampler-only --sampler-device cuda \
      --num-nodes "$2" --num-edges "$3" --fanout 15,10,5 --batch-size 1024 --batches 30 \
      --out "$OUT/sampler_$1"
  done
  # Where a products-scale step's time goes: --profile synchronizes the GPU after every stage
  # (sample, gather, forward, backward, optimizer), so each stage's time is its own.
  step profile_products 300 "$PY" -m pyg_mgpu.distributed_sampling --devices "$DEV" \
    --num-nodes 2400000 --num-edges 62000000 --num-features 100 --num-classes 47 \
    --fanout 15,10,5 --batch-size 1024 --epochs 2 --profile --out "$OUT/profile_products" \
    --overwrite
  # Kernel by kernel: 20 steps of the second epoch under torch.profiler (kernels.csv with each
  # op's and kernel's own GPU time per step, trace.json for Perfetto).
  step trace_products 240 "$PY" -m pyg_mgpu.distributed_sampling --devices "$DEV" \
    --num-nodes 2400000 --num-edges 62000000 --num-features 100 --num-classes 47 \
    --fanout 15,10,5 --batch-size 1024 --epochs 2 --trace-steps 20 --out "$OUT/trace_products" \
    --overwrite
fi

if want variants; then
  # The 9 end-to-end variants, 1 rank with NCCL (ranks: cuda:0), same graph and seed:
  # compare test_acc across them in summary.md (bf16/compile may differ by noise only).
  train graph_gpu 240 --devices "$DEV" --graph-on gpu
  # The shared host copy pinned and read in place by the GPU: graph_gpu's losses exactly.
  train graph_host 240 --devices "$DEV" --graph-on host
  # One batch per walk instead of the GPU default (8): seconds per epoch against graph_gpu.
  train walk_1 240 --devices "$DEV" --graph-on gpu --sample-batches 1
  train graph_cpu_cache 240 --devices "$DEV" --graph-on cpu --feature-cache-gb 0.02
  train graph_cpu_mmap 240 --devices "$DEV" --graph-on cpu --features-on mmap \
    --feature-cache-gb 0.02
  train amp_bf16 240 --devices "$DEV" --amp bf16
  train cuda_graph 240 --devices "$DEV" --cuda-graph
  train compile 300 --devices "$DEV" --compile
  train prefetch2 240 --devices "$DEV" --prefetch 2
  train layerwise 240 --devices "$DEV" --inference layerwise
  train eval_all 240 --devices "$DEV" --eval-on all
  # The same placement as graph_gpu: the checkpoint holds the GPU generator's state.
  train resume 240 --devices "$DEV" --graph-on gpu --resume "$OUT/graph_gpu" \
    --epochs $((EPOCHS + 1))
  # SIGTERM in epoch 2 with graph_gpu's flags (the GPU prefetches: the checkpoint holds the
  # sampler's state before the batch drawn ahead), no process left, then --resume: graph_gpu's
  # losses and accuracies exactly.
  step stop_resume 400 "$PY" benchmarks/stop_and_resume.py "$OUT/graph_gpu" "$OUT/stop_resume" \
    -- --num-nodes "$NODES" --num-edges "$EDGES" --num-features 100 --num-classes 47 \
    --fanout 15,10,5 --batch-size 1024 --epochs "$EPOCHS" --devices "$DEV" --graph-on gpu
  # The heterogeneous example (HeteroData loaders, to_hetero, DDP) on the GPU, one NCCL rank:
  # its metrics.json has test_acc against features_only_test_acc.
  step hetero_example 240 "$PY" examples/hetero_node_classification.py --devices "$DEV" \
    --epochs "$EPOCHS" --out "$OUT/hetero_example"
  # The CLI's heterogeneous path on the GPU (graph in host memory, batches prefetched to the
  # GPU), one NCCL rank: test_acc against the CPU runs' (README's synthetic-hetero row).
  step hetero_cli 240 "$PY" -m pyg_mgpu.distributed_sampling --devices "$DEV" \
    --dataset synthetic-hetero --out "$OUT/hetero_cli" --overwrite
  # Multi-rank CUDA logic on one GPU: 2 ranks over gloo (NCCL refuses two ranks on one GPU).
  train gloo_2ranks 300 --devices "${SUITE_GLOO_DEVICES:-cuda:0,0}" --backend gloo --eval-on all \
    --inference layerwise
  # Two ranks reading one pinned host copy: the job's total PSS against the dataset's size
  # (one pinned copy, not one per rank). On the products-sized graph (about 1.5 GB): at 200k
  # nodes a second copy would hide in each rank's 1.1 GB of CUDA runtime.
  step host_memory 300 "$PY" -m pyg_mgpu.memory -- "$PY" -m pyg_mgpu.distributed_sampling \
    --devices "${SUITE_GLOO_DEVICES:-cuda:0,0}" --backend gloo --graph-on host \
    --num-nodes 2400000 --num-edges 62000000 --num-features 100 --num-classes 47 \
    --fanout 15,10,5 --batch-size 1024 --epochs 1 --out "$OUT/host_memory" --overwrite
fi

if want full; then
  # Products scale: 2.4M nodes, 62M edges, 100 features; pyg_recipe is reported as skipped
  # without pyg-lib/torch-sparse: pyg_model_native_sampler is then the PyG-model baseline.
  if [ "$DRY" != 1 ]; then
    mkdir -p "$OUT/products"
    nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv -lms 500 \
      > "$OUT/products/gpu_usage.csv" 2>/dev/null &
    SMI=$!
  fi
  # The lean part: the GPU's own modes only, 2 epochs each (the second is the one reported).
  systems=pyg_mgpu,pyg_mgpu_cuda_graph,pyg_mgpu_graph_on_host,pyg_mgpu_one_batch_per_walk
  systems=$systems,pyg_mgpu_bf16
  epochs=2
  [ "$PART" = lean ] || { systems=$systems,pyg_model_native_sampler,pyg_recipe; epochs=3; }
  systems=${SUITE_SYSTEMS:-$systems}
  step products 600 "$PY" -m pyg_mgpu.bench --devices cuda --nprocs 1 --num-nodes 2400000 \
    --num-edges 62000000 --num-features 100 --num-classes 47 --fanout 15,10,5 \
    --batch-size 1024 --epochs "$epochs" --num-workers 4 --systems "$systems" \
    --out "$OUT/products"
  if [ "$DRY" != 1 ]; then kill "$SMI" 2>/dev/null; wait "$SMI" 2>/dev/null; summarize; fi
fi
if want recipe; then
  # PyG's recipe (NeighborLoader sampling with torch-sparse on the CPU) beside pyg_mgpu on the
  # products-sized graph, one run, 2 epochs each. The wheels must be built for this image's
  # Python and torch (docs/benchmarks.md); they are installed into a folder of their own that
  # only this step puts on the path, so every other step runs without them.
  WHEELS=${SUITE_WHEELS:-.dev/wheels}
  SITE="$OUT/torch_sparse_site"
  step recipe_env 180 bash -c "$PY -m pip install --no-index --no-deps --target '$SITE' \
'$WHEELS'/torch_scatter-*.whl '$WHEELS'/torch_sparse-*.whl && PYTHONPATH='$SITE' $PY -c \
'import torch, torch_sparse; print(torch.__version__, torch_sparse.__version__)'"
  step products_recipe 600 env PYTHONPATH="$SITE:$PYTHONPATH" "$PY" -m pyg_mgpu.bench \
    --devices cuda --nprocs 1 --num-nodes 2400000 --num-edges 62000000 --num-features 100 \
    --num-classes 47 --fanout 15,10,5 --batch-size 1024 --epochs 2 --num-workers 4 \
    --systems pyg_mgpu,pyg_recipe --out "$OUT/products_recipe"
fi
# Every log, metrics.json, bench.json and GPU usage sample in one file, to copy off the machine.
[ "$DRY" = 1 ] || { bundle; echo; cat "$OUT/summary.md"; }
