"""Side-by-side benchmark: ``python -m pyg_mgpu.bench`` (see docs/benchmarks.md).

Training mode runs every system on the same synthetic graph with the same model size, fanout,
batch size and rank count, one fresh job after another in this one command, and prints epoch
times, seeds per second and each system's epoch-time ratio to pyg_mgpu and to DGL. Ratios from
the same run are the numbers to trust: these machines are noisy, absolute seconds are not.

Systems:
- ``pyg_mgpu``: this project (native sampler, trimmed layers, embedding-bag mean aggregation,
  byte dropout).
- ``pyg_mgpu_bf16``: the same with ``--amp bf16``.
- ``pyg_mgpu_cuda_graph``: the same with ``--cuda-graph`` (forward and backward replayed from a
  CUDA graph at padded sizes; on CPU ranks the padded step runs without one).
- ``pyg_mgpu_graph_on_host`` (GPUs): the same with ``--graph-on host``, the graph pinned once in
  host memory and read in place by every GPU.
- ``pyg_mgpu_one_batch_per_walk``: the same with ``--sample-batches 1`` (against the default,
  8 batches per walk on GPUs).
- ``pyg_mgpu_ckpt_every_step``, ``pyg_mgpu_ckpt_every_10_steps``: the same, also writing a step
  checkpoint every step or every 10 steps (``--checkpoint-every-steps``): their cost. Every run
  also reports its ``checkpoint`` stage, the ranks' per-step agreement on stopping included.
- ``pyg_model_native_sampler``: PyG's multi-GPU example model as written (every layer on every
  sampled node) fed by our sampler, run like the recipe (glibc's default allocator): the
  recipe's cost without PyG's sampler. Always available.
- ``pyg_recipe``: PyG's example as written, ``NeighborLoader`` sampling included; needs pyg-lib
  or torch-sparse (see docs/benchmarks.md for building torch-sparse).
- ``dgl``: DGL's recipe (benchmarks/dgl_variant.py) in its own environment, when built.
- ``pyg_mgpu@REV`` (``--baseline REV``): ``pyg_mgpu`` as of a git revision of this checkout,
  run from its own copy of the package: a change's speed-up against the code before it, in the
  same run.

``--sampler-only`` measures sampled edges per second for ``pyg_mgpu.NeighborSampler`` in each mode
(directional, bidirectional, induced, weighted, disjoint, replace; one thread), through the loader
with DataLoader workers, and for PyG's ``NeighborLoader`` when pyg-lib or torch-sparse is there.

``--predict`` times every node's outputs through ``pyg_mgpu.predict`` against PyG's
``model.inference`` over an all-neighbour loader, in rounds (``tools/predict_bench.py``).
"""
from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import shutil
import sys
import tarfile
import time
from pathlib import Path
from typing import Optional, Sequence

from pyg_mgpu.distributed.devices import RANKS_PER_CORE_LIMIT, resolve_devices
from pyg_mgpu.files import cannot_write
from pyg_mgpu.tools.cli import Parser
from pyg_mgpu.tools.compare_dgl import DGL_SCRIPT
from pyg_mgpu.tools.predict_bench import format_predict, run_predict_bench
from pyg_mgpu.tools.sampler_bench import run_sampler_bench, synthetic_graph
from pyg_mgpu.tools.step_costs import batches_needed, count_steps, format_step_costs
from pyg_mgpu.train.loaders import BATCHES_PER_WALK
from pyg_mgpu.train.config import TrainConfig, in_flags

SYSTEMS = ("pyg_mgpu", "pyg_mgpu_bf16", "pyg_mgpu_cuda_graph", "pyg_mgpu_graph_on_host",
           "pyg_mgpu_one_batch_per_walk",
           "pyg_mgpu_ckpt_every_step", "pyg_mgpu_ckpt_every_10_steps",
           "pyg_model_native_sampler", "pyg_recipe", "dgl")
SYSTEM_FLAGS = {
    "pyg_mgpu": ["--recipe", "pyg_mgpu", "--sampler", "native"],
    "pyg_mgpu_bf16": ["--recipe", "pyg_mgpu", "--sampler", "native", "--amp", "bf16"],
    "pyg_mgpu_cuda_graph": ["--recipe", "pyg_mgpu", "--sampler", "native", "--cuda-graph"],
    "pyg_mgpu_graph_on_host": ["--recipe", "pyg_mgpu", "--sampler", "native",
                               "--graph-on", "host"],
    "pyg_mgpu_one_batch_per_walk": ["--recipe", "pyg_mgpu", "--sampler", "native",
                                    "--sample-batches", "1"],
    "pyg_mgpu_ckpt_every_step": ["--recipe", "pyg_mgpu", "--sampler", "native",
                                 "--checkpoint-every-steps", "1"],
    "pyg_mgpu_ckpt_every_10_steps": ["--recipe", "pyg_mgpu", "--sampler", "native",
                                     "--checkpoint-every-steps", "10"],
    "pyg_model_native_sampler": ["--recipe", "pyg", "--sampler", "native"],
    "pyg_recipe": ["--recipe", "pyg", "--sampler", "pyg"],
}


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="python -m pyg_mgpu.bench", description=__doc__.split("\n")[0])
    p.add_argument("--num-nodes", type=int, default=100_000,
                   help="nodes of the synthetic graph every system trains on")
    p.add_argument("--num-edges", type=int, default=2_000_000, help="its edges")
    p.add_argument("--num-features", type=int, default=128, help="its feature width")
    p.add_argument("--num-classes", type=int, default=32, help="its label classes")
    p.add_argument("--fanout", default="25,10", help="neighbours sampled per hop, e.g. 15,10,5")
    p.add_argument("--batch-size", type=int, default=1024, help="seed nodes per batch")
    p.add_argument("--hidden", type=int, default=256, help="the model's hidden width")
    p.add_argument("--devices", default="cpu",
                   help="cpu, cuda or cuda:0,1 (as the training command's --devices)")
    p.add_argument("--nprocs", type=int, default=None,
                   help="ranks per system (default: 2 on CPU, every visible GPU on CUDA)")
    p.add_argument("--epochs", type=int, default=3,
                   help="epochs per system; the first is a warm-up when there are several")
    p.add_argument("--num-workers", type=int, default=0,
                   help="DataLoader worker processes per rank")
    p.add_argument("--systems", default="pyg_mgpu,pyg_model_native_sampler,pyg_recipe,dgl",
                   help=f"comma-separated, from {', '.join(SYSTEMS)}; unavailable ones are "
                        "reported as skipped")
    p.add_argument("--baseline", default=None, metavar="REV",
                   help="also run pyg_mgpu as of this git revision of the checkout (system "
                        "pyg_mgpu@REV, run right after pyg_mgpu)")
    p.add_argument("--dgl-python", default=None,
                   help="python of an environment with DGL (default: the one "
                        "benchmarks/dgl_env.sh builds, if present)")
    p.add_argument("--sampler-only", action="store_true",
                   help="measure sampled edges/s instead of training")
    p.add_argument("--step-costs", action="store_true",
                   help="count the kernel ops and host syncs of one training step, per stage "
                        "(the GPU's path, counted on the CPU) instead of training")
    p.add_argument("--sample-batches", type=int, default=BATCHES_PER_WALK, metavar="K",
                   help="--step-costs: also count steps whose batches are sampled K per walk "
                        "(the default on GPUs), per batch; 1 skips that count")
    p.add_argument("--predict", action="store_true",
                   help="time pyg_mgpu.predict against PyG's model.inference (one process, "
                        "--batch-size nodes a step, a layer per --fanout hop) instead")
    p.add_argument("--repeats", type=int, default=4,
                   help="--predict: rounds of both, alternating which goes first")
    p.add_argument("--batches", type=int, default=30,
                   help="batches per sampler measurement (--sampler-only: a multiple of 6 "
                        "gives every mode every place in the turns equally often)")
    p.add_argument("--sampler-device", choices=["cpu", "cuda"], default="cpu",
                   help="--sampler-only: where the graph and seeds live and sampling runs; cuda "
                        "times with torch.cuda.synchronize and skips the worker and PyG lines")
    p.add_argument("--seed", type=int, default=0, help="seed of the graph and the runs")
    p.add_argument("--out", default=None, help="folder for bench.json and each system's run")
    return p


def check_args(args) -> None:
    """Every flag, before anything is generated or run, in the training command's words where
    it has the same flag; sets ``args.nprocs`` to the rank count every system gets.

    Raises:
        ValueError: naming the flag and what it takes.
    """
    import torch

    from pyg_mgpu.data.synthetic import SyntheticSpec

    if args.baseline and (args.step_costs or args.sampler_only or args.predict):
        raise ValueError("--baseline compares training runs; drop it with --step-costs, "
                         "--sampler-only or --predict.")
    args.baseline_commit = resolve_revision(args.baseline) if args.baseline else None
    if args.repeats < 1:
        raise ValueError(f"--repeats must be a positive number of rounds, got {args.repeats}.")
    try:
        fanout = tuple(int(k) for k in args.fanout.split(","))
    except ValueError:
        raise ValueError(f"--fanout takes comma-separated integers such as 25,10, got "
                         f"{args.fanout!r}.") from None
    TrainConfig.from_flags(num_nodes=args.num_nodes, num_edges=args.num_edges,
                           num_features=args.num_features, num_classes=args.num_classes,
                           fanout=fanout, batch_size=args.batch_size, hidden=args.hidden,
                           epochs=args.epochs, num_workers=args.num_workers,
                           sample_batches=args.sample_batches, seed=args.seed)
    spec = SyntheticSpec(num_nodes=args.num_nodes, num_edges=args.num_edges,
                         num_features=args.num_features, num_classes=args.num_classes)
    if args.batches < 1:
        raise ValueError(f"--batches must be a positive number of batches, got {args.batches}.")
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown or not systems:
        what = f"unknown system {unknown[0]!r}" if unknown else "no system named"
        raise ValueError(f"--systems {args.systems}: {what}; choose from {', '.join(SYSTEMS)}.")
    if args.sampler_only and args.sampler_device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--sampler-device cuda needs a GPU that CUDA can see.")
    if args.sampler_only and args.num_nodes <= args.batch_size:
        raise ValueError(f"--sampler-only times the batches after a warm-up one: --num-nodes "
                         f"{args.num_nodes} make one batch of --batch-size {args.batch_size}; "
                         "use more nodes than --batch-size.")
    if args.step_costs:
        # The training split of the synthetic graph, as make_synthetic draws it.
        batches = -(-max(1, int(spec.train_fraction * args.num_nodes)) // args.batch_size)
        needed = batches_needed(args.sample_batches)
        if batches < needed:
            raise ValueError(f"--step-costs measures {needed} batches (with --sample-batches "
                             f"{args.sample_batches}), but the {args.num_nodes} nodes' training "
                             f"half makes {batches} of --batch-size {args.batch_size}; use more "
                             "--num-nodes, or a smaller --batch-size or --sample-batches.")
    # One rank count for every system, DGL's included.
    args.nprocs = len(resolve_devices(args.devices, args.nprocs,
                                      max_per_core=RANKS_PER_CORE_LIMIT))


def _graph_flags(args) -> list[str]:
    return ["--num-nodes", str(args.num_nodes), "--num-edges", str(args.num_edges),
            "--num-features", str(args.num_features), "--num-classes", str(args.num_classes)]


def _steady_epochs(metrics: dict) -> list[dict]:
    """The epochs after the first (its warm-up), or the only one."""
    epochs = metrics["epochs"]
    return epochs[1:] if len(epochs) > 1 else epochs


def _steady_epoch_time(metrics: dict) -> float:
    times = [e["epoch_time_s"] for e in _steady_epochs(metrics)]
    return sum(times) / len(times)


def _steady_gpu_busy(metrics: dict) -> Optional[float]:
    """The GPU's mean busy percent over those epochs' training, where NVML read it."""
    shares = [e.get("gpu_busy_pct") for e in _steady_epochs(metrics)]
    return None if None in shares else sum(shares) / len(shares)


def _run_pyg_mgpu(system: str, args, out: Path, package_root: Optional[Path] = None) -> dict:
    # A bench repeated in the same --out runs each system afresh (also a revision's package
    # from before --overwrite, which this removal serves as well).
    (out / "checkpoint.pt").unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "pyg_mgpu.distributed_sampling", *_graph_flags(args),
           "--fanout", args.fanout, "--batch-size", str(args.batch_size),
           "--hidden", str(args.hidden), "--devices", args.devices, "--nprocs", str(args.nprocs),
           "--epochs", str(args.epochs), "--num-workers", str(args.num_workers),
           "--seed", str(args.seed), "--out", str(out.resolve()), *SYSTEM_FLAGS[system]]
    env = cwd = None
    if package_root is not None:  # ahead of the installed package and the checkout on sys.path
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(package_root), *filter(None, [os.environ.get("PYTHONPATH")])])}
        cwd = package_root  # python -m puts the working folder first
    return _run(cmd, out, env=env, cwd=cwd)


def resolve_revision(rev: str) -> str:
    """The commit ``rev`` names in this checkout (what ``bench.json`` records: a name such as
    ``HEAD~3`` moves on).

    Raises:
        ValueError: no git checkout, or no such commit.
    """
    repo = Path(__file__).resolve().parents[2]
    found = subprocess.run(["git", "-C", str(repo), "rev-parse", "--verify", "--quiet",
                            f"{rev}^{{commit}}"], capture_output=True, text=True)
    if found.returncode != 0:
        raise ValueError(f"--baseline {rev}: no such commit in {repo} (a commit, branch or tag "
                         "of this git checkout).")
    return found.stdout.strip()


def checkout_revision(rev: str, into: Path) -> Path:
    """The package as of git revision ``rev`` of this checkout, extracted under ``into``;
    raises SystemExit when there is no such revision or no git checkout."""
    repo = Path(__file__).resolve().parents[2]
    archive = subprocess.run(["git", "-C", str(repo), "archive", "--format=tar", rev, "pyg_mgpu"],
                             capture_output=True)
    if archive.returncode != 0:
        raise SystemExit(f"error: --baseline {rev}: git archive failed in {repo}: "
                         f"{archive.stderr.decode(errors='replace').strip()}")
    into = into.resolve()
    shutil.rmtree(into, ignore_errors=True)  # no files left from another revision
    into.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(into, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    imported = subprocess.run([sys.executable, "-c", "import pyg_mgpu; print(pyg_mgpu.__file__)"],
                              capture_output=True, text=True, cwd=into,
                              env={**os.environ, "PYTHONPATH": str(into)})
    if not imported.stdout.strip().startswith(str(into)):
        raise SystemExit(f"error: --baseline {rev}: python imports pyg_mgpu from "
                         f"{imported.stdout.strip() or imported.stderr.strip()!r}, not from "
                         f"the revision's copy in {into}")
    return into


def _run_dgl(args, out: Path) -> dict:
    env = Path(os.environ.get("PYG_MGPU_DGL_ENV", Path.home() / ".cache/pyg_mgpu/dgl-env"))
    python = args.dgl_python or str(env / "bin" / "python")
    if not Path(python).is_file():
        return {"skipped": "no DGL environment: run bash benchmarks/dgl_env.sh or pass "
                           "--dgl-python"}
    npz = out / "graph.npz"
    out.mkdir(parents=True, exist_ok=True)
    graph = synthetic_graph(args)
    graph.save_npz(npz)
    train_nodes = graph.train_idx.numel()
    del graph
    cmd = [python, str(DGL_SCRIPT), "--npz", str(npz), "--nprocs", str(args.nprocs),
           "--epochs", str(args.epochs), "--batch-size", str(args.batch_size),
           "--fanout", args.fanout, "--hidden", str(args.hidden), "--seed", str(args.seed),
           "--num-workers", str(args.num_workers),
           "--devices", "cpu" if args.devices == "cpu" else "auto", "--out", str(out)]
    result = _run(cmd, out, train_nodes)
    npz.unlink(missing_ok=True)
    return result


def _run(cmd: list[str], out: Path, train_nodes: Optional[int] = None,
         env: Optional[dict] = None, cwd: Optional[Path] = None) -> dict:
    where = f"(in {cwd}) PYTHONPATH={env['PYTHONPATH']} " if env else ""
    print(f"+ {where}{' '.join(cmd)}", flush=True)
    start = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env=env, cwd=cwd)
    if proc.returncode != 0:
        return {"failed": f"exit code {proc.returncode}", "log_tail": proc.stdout[-2000:]}
    metrics = json.loads((out / "metrics.json").read_text())
    epoch_time = _steady_epoch_time(metrics)
    return {"epoch_time_s": epoch_time,
            "seeds_per_s": (train_nodes or metrics.get("train_nodes", 0)) / epoch_time,
            "test_acc": metrics.get("test_acc"), "best_val_acc": metrics.get("best_val_acc"),
            "peak_mem_mb": metrics.get("peak_mem_mb"),
            "gpu_busy_pct": _steady_gpu_busy(metrics),
            "stage_times_s": metrics.get("stage_times_s"),
            "job_wall_s": time.perf_counter() - start}


def run_training_bench(args, out: Path) -> dict:
    from pyg_mgpu.sampling.sampler_choice import pyg_sampler_available
    results: dict = {}
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    if args.baseline:
        baseline = f"pyg_mgpu@{args.baseline}"
        place = systems.index("pyg_mgpu") + 1 if "pyg_mgpu" in systems else 0
        systems.insert(place, baseline)
        source = checkout_revision(args.baseline_commit, out / "baseline_source")
    for system in systems:
        if args.baseline and system == baseline:
            results[system] = _run_pyg_mgpu("pyg_mgpu", args, out / "baseline", source)
            continue
        if system == "pyg_recipe" and not pyg_sampler_available():
            results[system] = {"skipped": "needs pyg-lib or torch-sparse (docs/benchmarks.md)"}
        elif system == "dgl":
            results[system] = _run_dgl(args, out / system)
        else:
            results[system] = _run_pyg_mgpu(system, args, out / system)
    add_ratios(results)
    return results


def add_ratios(results: dict) -> None:
    """Every system's epoch time over pyg_mgpu's and over DGL's, where those ran."""
    for reference in ("pyg_mgpu", "dgl"):
        base = results.get(reference, {}).get("epoch_time_s")
        for r in results.values():
            if base and r.get("epoch_time_s"):
                r[f"epoch_time_vs_{reference}"] = r["epoch_time_s"] / base


def format_training(results: dict) -> str:
    """A table of the systems; ratio columns are epoch-time ratios (below 1: faster)."""
    references = [ref for ref in ("pyg_mgpu", "dgl")
                  if results.get(ref, {}).get("epoch_time_s")]
    lines = [f"{'system':26s} {'epoch s':>9s} {'seeds/s':>9s} "
             + "".join(f"{'vs ' + ref:>13s}" for ref in references) + f" {'test acc':>9s}"]
    for name, r in results.items():
        if "epoch_time_s" not in r:
            lines.append(f"{name:26s} {r.get('skipped') or r.get('failed')}")
            continue
        ratios = "".join(f"{r[f'epoch_time_vs_{ref}']:12.2f}x" for ref in references)
        busy = "" if r.get("gpu_busy_pct") is None else f" GPU busy {r['gpu_busy_pct']:.0f}%"
        lines.append(f"{name:26s} {r['epoch_time_s']:9.2f} {r['seeds_per_s']:9.0f} {ratios} "
                     f"{r['test_acc']:9.4f}{busy}")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    out = Path(args.out or Path("runs") / f"bench-{time.strftime('%Y%m%d-%H%M%S')}")
    try:
        check_args(args)
        out.mkdir(parents=True, exist_ok=True)
    except ValueError as err:
        print(f"error: {in_flags(err)}", file=sys.stderr)
        return 2
    except OSError as err:
        print(f"error: {cannot_write(out, err)}", file=sys.stderr)
        return 2
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
    if args.step_costs:
        graph = synthetic_graph(args)
        fanout = tuple(int(k) for k in args.fanout.split(","))
        results = count_steps(graph, fanout=fanout, batch_size=args.batch_size,
                              hidden=args.hidden, seed=args.seed)
        print(format_step_costs(results), end="")
        if args.sample_batches > 1:  # and with several batches per walk, per batch
            walked = count_steps(graph, fanout=fanout, batch_size=args.batch_size,
                                 hidden=args.hidden, seed=args.seed,
                                 sample_batches=args.sample_batches)
            print(f"\nwith {args.sample_batches} batches per walk, per batch:")
            print(format_step_costs(walked), end="")
            results = {**results, "walked": walked}
        graphed = count_steps(graph, fanout=fanout, batch_size=args.batch_size,
                              hidden=args.hidden, seed=args.seed,
                              sample_batches=args.sample_batches, cuda_graph=True)
        print(f"\nwith --cuda-graph and {args.sample_batches} batch(es) per walk, per batch:")
        print(format_step_costs(graphed), end="")
        results = {**results, "cuda_graph": graphed}
    elif args.predict:
        results = run_predict_bench(args, out)
        print(format_predict(results))
    elif args.sampler_only:
        results = run_sampler_bench(args)
        for key, value in results.items():
            shown = (f"{value / 1e6:.2f}M edges/s"
                     if isinstance(value, float) and "_vs_" not in key else value)
            print(f"{key:28s} {shown}")
    else:
        results = run_training_bench(args, out)
        print(format_training(results))
    mode = ("step_costs" if args.step_costs else "sampler" if args.sampler_only
            else "predict" if args.predict else "training")
    report = {"mode": mode,
              "args": vars(args), "results": results}
    (out / "bench.json").write_text(json.dumps(report, indent=2))
    print(f"written {out / 'bench.json'}")
    failed = [n for n, r in results.items() if isinstance(r, dict) and "failed" in r]
    for name in failed:
        print(f"error: {name} failed:\n{results[name]['log_tail']}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
