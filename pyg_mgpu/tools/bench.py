"""Side-by-side benchmark: ``python -m pyg_mgpu.bench`` (see docs/benchmarks.md).

Training mode runs every system on the same synthetic graph with the same model size, fanout,
batch size and rank count, one fresh job after another in this one command, and prints epoch
times, seeds per second and each system's epoch-time ratio to pyg_mgpu and to DGL. Ratios from
the same run are the numbers to trust: these machines are noisy, absolute seconds are not.

Systems:
- ``pyg_mgpu``: this project (native sampler, trimmed layers, embedding-bag mean aggregation,
  byte dropout).
- ``pyg_mgpu_bf16``: the same with ``--amp bf16``.
- ``pyg_mgpu_ckpt_every_step``, ``pyg_mgpu_ckpt_every_10_steps``: the same, also writing a step
  checkpoint every step or every 10 steps (``--checkpoint-every-steps``): their cost. Every run
  also reports its ``checkpoint`` stage, the ranks' per-step agreement on stopping included.
- ``pyg_model_native_sampler``: PyG's multi-GPU example model as written (every layer on every
  sampled node) fed by our sampler, run like the recipe (glibc's default allocator): the
  recipe's cost without PyG's sampler. Always available.
- ``pyg_recipe``: PyG's example as written, ``NeighborLoader`` sampling included; needs pyg-lib
  or torch-sparse (see docs/benchmarks.md for building torch-sparse).
- ``dgl``: DGL's recipe (benchmarks/dgl_variant.py) in its own environment, when built.

``--sampler-only`` measures sampled edges per second for ``pyg_mgpu.NeighborSampler`` in each mode
(directional, bidirectional, induced, weighted, disjoint, replace; one thread), through the loader
with DataLoader workers, and for PyG's ``NeighborLoader`` when pyg-lib or torch-sparse is there.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Optional, Sequence

from pyg_mgpu.distributed.devices import resolve_devices
from pyg_mgpu.tools.compare_dgl import DGL_SCRIPT
from pyg_mgpu.train.config import in_flags

SYSTEMS = ("pyg_mgpu", "pyg_mgpu_bf16", "pyg_mgpu_ckpt_every_step",
           "pyg_mgpu_ckpt_every_10_steps", "pyg_model_native_sampler", "pyg_recipe", "dgl")
SYSTEM_FLAGS = {
    "pyg_mgpu": ["--recipe", "pyg_mgpu", "--sampler", "native"],
    "pyg_mgpu_bf16": ["--recipe", "pyg_mgpu", "--sampler", "native", "--amp", "bf16"],
    "pyg_mgpu_ckpt_every_step": ["--recipe", "pyg_mgpu", "--sampler", "native",
                                 "--checkpoint-every-steps", "1"],
    "pyg_mgpu_ckpt_every_10_steps": ["--recipe", "pyg_mgpu", "--sampler", "native",
                                     "--checkpoint-every-steps", "10"],
    "pyg_model_native_sampler": ["--recipe", "pyg", "--sampler", "native"],
    "pyg_recipe": ["--recipe", "pyg", "--sampler", "pyg"],
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m pyg_mgpu.bench", description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--num-nodes", type=int, default=100_000)
    p.add_argument("--num-edges", type=int, default=2_000_000)
    p.add_argument("--num-features", type=int, default=128)
    p.add_argument("--num-classes", type=int, default=32)
    p.add_argument("--fanout", default="25,10")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--devices", default="cpu")
    p.add_argument("--nprocs", type=int, default=None,
                   help="ranks per system (default: 2 on CPU, every visible GPU on CUDA)")
    p.add_argument("--epochs", type=int, default=3,
                   help="epochs per system; the first is a warm-up when there are several")
    p.add_argument("--num-workers", type=int, default=0)
    p.add_argument("--systems", default="pyg_mgpu,pyg_model_native_sampler,pyg_recipe,dgl",
                   help=f"comma-separated, from {', '.join(SYSTEMS)}; unavailable ones are "
                        "reported as skipped")
    p.add_argument("--dgl-python", default=None,
                   help="python of an environment with DGL (default: the one "
                        "benchmarks/dgl_env.sh builds, if present)")
    p.add_argument("--sampler-only", action="store_true",
                   help="measure sampled edges/s instead of training")
    p.add_argument("--batches", type=int, default=30,
                   help="batches per sampler measurement (--sampler-only: a multiple of 6 "
                        "gives every mode every place in the turns equally often)")
    p.add_argument("--sampler-device", choices=["cpu", "cuda"], default="cpu",
                   help="--sampler-only: where the graph and seeds live and sampling runs; cuda "
                        "times with torch.cuda.synchronize and skips the worker and PyG lines")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="folder for bench.json and each system's run")
    return p


def _graph_flags(args) -> list[str]:
    return ["--num-nodes", str(args.num_nodes), "--num-edges", str(args.num_edges),
            "--num-features", str(args.num_features), "--num-classes", str(args.num_classes)]


def _steady_epoch_time(metrics: dict) -> float:
    times = [e["epoch_time_s"] for e in metrics["epochs"]]
    steady = times[1:] if len(times) > 1 else times
    return sum(steady) / len(steady)


def _run_pyg_mgpu(system: str, args, out: Path) -> dict:
    cmd = [sys.executable, "-m", "pyg_mgpu.distributed_sampling", *_graph_flags(args),
           "--fanout", args.fanout, "--batch-size", str(args.batch_size),
           "--hidden", str(args.hidden), "--devices", args.devices, "--nprocs", str(args.nprocs),
           "--epochs", str(args.epochs), "--num-workers", str(args.num_workers),
           "--seed", str(args.seed), "--out", str(out), *SYSTEM_FLAGS[system]]
    return _run(cmd, out)


def _run_dgl(args, out: Path) -> dict:
    env = Path(os.environ.get("PYG_MGPU_DGL_ENV", Path.home() / ".cache/pyg_mgpu/dgl-env"))
    python = args.dgl_python or str(env / "bin" / "python")
    if not Path(python).is_file():
        return {"skipped": "no DGL environment: run bash benchmarks/dgl_env.sh or pass "
                           "--dgl-python"}
    npz = out / "graph.npz"
    out.mkdir(parents=True, exist_ok=True)
    graph = _synthetic_graph(args)
    graph.save_npz(npz)
    train_nodes = graph.train_idx.numel()
    del graph
    cmd = [python, str(DGL_SCRIPT), "--npz", str(npz), "--nprocs", str(args.nprocs),
           "--epochs", str(args.epochs), "--batch-size", str(args.batch_size),
           "--fanout", args.fanout, "--hidden", str(args.hidden), "--seed", str(args.seed),
           "--devices", "cpu" if args.devices == "cpu" else "auto", "--out", str(out)]
    result = _run(cmd, out, train_nodes)
    npz.unlink(missing_ok=True)
    return result


def _synthetic_graph(args, num_features: Optional[int] = None):
    """The benchmark graph the training systems generate from the same flags."""
    from pyg_mgpu.data.synthetic import SyntheticSpec, make_synthetic
    spec = SyntheticSpec(num_nodes=args.num_nodes, num_edges=args.num_edges,
                         num_features=num_features or args.num_features,
                         num_classes=args.num_classes)
    return make_synthetic(spec, args.seed)


def _run(cmd: list[str], out: Path, train_nodes: Optional[int] = None) -> dict:
    print("+ " + " ".join(cmd), flush=True)
    start = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        return {"failed": f"exit code {proc.returncode}", "log_tail": proc.stdout[-2000:]}
    metrics = json.loads((out / "metrics.json").read_text())
    epoch_time = _steady_epoch_time(metrics)
    return {"epoch_time_s": epoch_time,
            "seeds_per_s": (train_nodes or metrics.get("train_nodes", 0)) / epoch_time,
            "test_acc": metrics.get("test_acc"), "best_val_acc": metrics.get("best_val_acc"),
            "peak_mem_mb": metrics.get("peak_mem_mb"),
            "stage_times_s": metrics.get("stage_times_s"),
            "job_wall_s": time.perf_counter() - start}


def run_training_bench(args, out: Path) -> dict:
    from pyg_mgpu.train.loaders import pyg_sampler_available
    results: dict = {}
    for system in [s.strip() for s in args.systems.split(",") if s.strip()]:
        if system not in SYSTEMS:
            raise SystemExit(f"error: unknown system {system!r}; choose from {', '.join(SYSTEMS)}")
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


def _sampled_edges_per_s(make_batches, batches: int, sync=None) -> float:
    """``sync`` (e.g. ``torch.cuda.synchronize``) runs before each clock read."""
    sync = sync or (lambda: None)
    iterator = iter(make_batches())
    next(iterator)  # warm-up: lazy buffers, worker start
    sync()
    edges, start = 0, time.perf_counter()
    for _, batch in zip(range(batches), iterator):
        edges += batch
    sync()
    return edges / (time.perf_counter() - start)


def _interleaved_edges_per_s(samplers: dict, batches, count: int, sync=None,
                             evict=None) -> dict:
    """Sampled edges/s of each sampler, timing them in turn on each of the same ``count``
    batches (after one warm-up batch each): a slower or faster spell of a noisy machine then
    hits every sampler alike, so their ratios hold even when the absolute rates drift.

    The order of the turns changes from batch to batch (:func:`balanced_orders`) so that
    each sampler comes right after each other one equally often: in a fixed order, a turn
    right after the induced sampler's runs slower (after its tens of MB of freed
    temporaries), and always the same sampler would pay it. Each batch opens with an
    untimed turn of its first sampler, so that what the previous batch's last turn leaves
    behind is never timed either. Over a multiple of ``len(balanced_orders(n))`` batches
    (30 for the bench's 6 modes) every sampler takes every place equally often. ``evict``
    (see :func:`_cache_evictor`) runs, untimed, before each turn."""
    sync, evict = sync or (lambda: None), evict or (lambda: None)
    batches = list(batches)[:count + 1]
    edges, seconds = dict.fromkeys(samplers, 0), dict.fromkeys(samplers, 0.0)
    for sampler in samplers.values():
        sampler.sample(batches[0])
    names = list(samplers)
    orders = balanced_orders(len(names))
    for i, batch in enumerate(batches[1:]):
        order = [names[j] for j in orders[i % len(orders)]]
        evict()
        samplers[order[0]].sample(batch)  # untimed: the lead-in
        for name in order:
            evict()
            sync()
            start = time.perf_counter()
            edges[name] += samplers[name].sample(batch).row.numel()
            sync()
            seconds[name] += time.perf_counter() - start
    return {name: edges[name] / seconds[name] for name in samplers}


def balanced_orders(n: int) -> list[list[int]]:
    """Orders of ``0 .. n-1`` in which every ordered pair of neighbours ``(a, b)``, ``a != b``,
    occurs equally often: a Williams design (n orders for even n, 2n for odd n)."""
    first, low, high = [0], 1, n - 1
    while len(first) < n:  # 0, 1, n-1, 2, n-2, ...
        first.append(low)
        low += 1
        if len(first) < n:
            first.append(high)
            high -= 1
    orders = [[(j + shift) % n for j in first] for shift in range(n)]
    return orders if n % 2 == 0 else orders + [order[::-1] for order in orders]


def _cache_evictor(device):
    """A call that overwrites :func:`_eviction_bytes` of memory on ``device``, so that each
    sampler's turn starts from cold caches.

    In training a model step runs between two batches and leaves little of the graph in
    cache; without this, a sampler's turn would start with whatever the turn before it left
    in cache. The slowdown of a turn right after the induced sampler's is not a cache
    effect and stays: the order of the turns spreads it (:func:`_interleaved_edges_per_s`).
    """
    import torch

    buffer = torch.empty(_eviction_bytes(device), dtype=torch.uint8, device=device)
    return lambda: buffer.fill_(1)


def _eviction_bytes(device) -> int:
    """Twice ``device``'s last-level cache (the GPU's L2 on CUDA), and at least 64 MiB."""
    import torch

    if device.type == "cuda":
        cache = torch.cuda.get_device_properties(device).L2_cache_size
    else:
        cache = _cpu_last_level_cache_bytes()
    return max(64 << 20, 2 * cache)


def _cpu_last_level_cache_bytes(caches: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> int:
    """Size of CPU 0's largest cache level from Linux's sysfs, or 0 where it is not there."""
    sizes = {}
    for index in caches.glob("index*"):
        try:
            level = int((index / "level").read_text())
            size = (index / "size").read_text().strip()
        except (OSError, ValueError):
            continue
        scale = {"K": 1 << 10, "M": 1 << 20}.get(size[-1:], 1)
        sizes[level] = int(size.rstrip("KM")) * scale if size.rstrip("KM").isdigit() else 0
    return sizes[max(sizes)] if sizes else 0


SAMPLER_MODES = {  # name: pyg_mgpu.NeighborSampler options
    "directional": {},
    "bidirectional": {"subgraph_type": "bidirectional"},
    "induced": {"subgraph_type": "induced"},
    "weighted": {"weight_attr": "weight"},
    "disjoint": {"disjoint": True},
    "replace": {"replace": True},
}


class _OneTypeHetero:
    """A heterogeneous sampler over ``data`` recast as a ``HeteroData`` (one node type, the
    edges dealt into ``num_edge_types`` types), with the homogeneous samplers' ``sample``."""

    def __init__(self, data, fanout, num_edge_types: int, **options):
        from torch_geometric.data import HeteroData

        from pyg_mgpu.sampling.neighbor_sampler import NeighborSampler
        hetero = HeteroData()
        hetero["v"].num_nodes = data.num_nodes
        hetero["v"].time = data.time
        for k in range(num_edge_types):
            hetero["v", f"r{k}", "v"].edge_index = data.edge_index[:, k::num_edge_types]
        self.sampler = NeighborSampler(hetero, fanout, seed=0, **options)

    def sample(self, seeds):
        from torch_geometric.sampler import NodeSamplerInput
        out = self.sampler.sample_from_nodes(NodeSamplerInput(None, seeds, input_type="v"))
        count = sum(row.numel() for row in out.row.values())
        return SimpleNamespace(row=SimpleNamespace(numel=lambda: count))  # what the bench reads


def run_sampler_bench(args) -> dict:
    """Sampled edges/s of the drop-in ``NeighborSampler`` in every mode (one thread, the modes
    timed in turn on each batch), through
    the loader with 0, 1 and all-core workers, and of PyG's own sampler where installed.

    Edges are the sampler's output edges: for ``bidirectional`` the sampled edges plus their
    reverses, for ``induced`` every edge among the sampled nodes.
    """
    import torch
    from torch_geometric.data import Data

    from pyg_mgpu.distributed.host import usable_cores
    from pyg_mgpu.sampling.neighbor_sampler import NeighborSampler
    from pyg_mgpu.train.loaders import make_loader, pyg_sampler_available

    device = torch.device(getattr(args, "sampler_device", "cpu"))
    on_gpu = device.type == "cuda"
    if on_gpu and not torch.cuda.is_available():
        raise SystemExit("error: --sampler-device cuda needs a GPU that CUDA can see.")
    sync = torch.cuda.synchronize if on_gpu else None
    torch.set_num_threads(1)
    fanout = [int(k) for k in args.fanout.split(",")]
    graph = _synthetic_graph(args, num_features=1)  # features play no part in sampling
    seeds = torch.randperm(graph.num_nodes, generator=torch.Generator().manual_seed(0))
    needed = (args.batches + 1) * args.batch_size
    seeds = seeds[:needed] if needed <= seeds.numel() else seeds
    results: dict = {"graph": graph.summary(), "fanout": fanout, "batch_size": args.batch_size,
                     "device": str(device)}
    # A PyG user's graph: an edge list with an edge attribute, converted to CSC once.
    data = Data(edge_index=graph.edge_index(), num_nodes=graph.num_nodes,
                weight=torch.rand(graph.num_edges, generator=torch.Generator().manual_seed(0)),
                time=torch.randint(1000, (graph.num_nodes,),
                                   generator=torch.Generator().manual_seed(1)))
    if on_gpu:  # graph, weights and seeds on the GPU: the samplers run there
        data, seeds = data.to(device), seeds.to(device)

    samplers = {mode: NeighborSampler(data, fanout, seed=0, **options)
                for mode, options in SAMPLER_MODES.items()}
    for mode, rate in _interleaved_edges_per_s(samplers, seeds.split(args.batch_size),
                                               args.batches, sync,
                                               _cache_evictor(device)).items():
        results[f"{mode}_1_thread"] = rate
    for mode in SAMPLER_MODES:
        results[f"{mode}_vs_directional"] = (results[f"{mode}_1_thread"]
                                             / results["directional_1_thread"])
    # Temporal sampling (random node timestamps; each seed's own as its time) grows a tree
    # per seed, as PyG's does: timed in turn with directional and disjoint. Then the same
    # graph as a HeteroData: one node type, its edges dealt round-robin into three edge types,
    # each with the full fanout (so a hop draws up to three times the edges). A failure of
    # either is reported in its entry, so the modes above still reach bench.json.
    # The heterogeneous temporal line: the temporal graph recast the same way.
    extra = {"temporal": lambda: NeighborSampler(data, fanout, seed=0, time_attr="time"),
             "hetero": lambda: _OneTypeHetero(data, fanout, num_edge_types=3),
             "hetero_temporal": lambda: _OneTypeHetero(data, fanout, num_edge_types=3,
                                                       time_attr="time")}
    for name, build in extra.items():
        try:
            timed = {"directional": samplers["directional"], "disjoint": samplers["disjoint"],
                     name: build()}
            rates = _interleaved_edges_per_s(timed, seeds.split(args.batch_size), args.batches,
                                             sync, _cache_evictor(device))
        except Exception as err:  # noqa: BLE001 - reported, not hidden
            results[f"{name}_1_thread"] = f"failed: {type(err).__name__}: {err}"
            continue
        results[f"{name}_1_thread"] = rates[name]
        results[f"{name}_vs_directional"] = rates[name] / rates["directional"]
        results[f"{name}_vs_disjoint"] = rates[name] / rates["disjoint"]

    if on_gpu:  # keys keep their CPU names ("_1_thread"); "device" says where they ran
        def ours_on_gpu():
            from pyg_mgpu.sampling.neighbor_loader import NeighborLoader
            loader = NeighborLoader(data, fanout, input_nodes=seeds, batch_size=args.batch_size,
                                    seed=0)
            for batch in loader:
                yield batch.edge_index.size(1)
        results["directional_pyg_mgpu_loader_1_thread"] = _sampled_edges_per_s(
            ours_on_gpu, args.batches, sync)
        results["pyg_loader_1_thread"] = "skipped: PyG's sampler runs on the CPU"
        return results
    for workers in sorted({0, 1, usable_cores()}):
        def via_loader(workers=workers):
            loader = make_loader(graph, seeds, fanout=fanout, sampler="native", seed=0,
                                 batch_size=args.batch_size, num_workers=workers)
            for batch in loader:
                yield batch.edge_index.size(1)
        results[f"directional_loader_{workers}_workers"] = _sampled_edges_per_s(via_loader,
                                                                                args.batches)
    if pyg_sampler_available():
        from torch_geometric.loader import NeighborLoader as PyGNeighborLoader

        def pyg_loader():
            loader = PyGNeighborLoader(data, fanout, input_nodes=seeds,
                                       batch_size=args.batch_size)
            for batch in loader:
                yield batch.edge_index.size(1)
        results["pyg_loader_1_thread"] = _sampled_edges_per_s(pyg_loader, args.batches)

        def ours_loader():
            from pyg_mgpu.sampling.neighbor_loader import NeighborLoader
            loader = NeighborLoader(data, fanout, input_nodes=seeds, batch_size=args.batch_size,
                                    seed=0)
            for batch in loader:
                yield batch.edge_index.size(1)
        results["directional_pyg_mgpu_loader_1_thread"] = _sampled_edges_per_s(ours_loader,
                                                                               args.batches)
        results["pyg_mgpu_vs_pyg_loader"] = (results["directional_pyg_mgpu_loader_1_thread"]
                                             / results["pyg_loader_1_thread"])
    else:
        results["pyg_loader_1_thread"] = "skipped: needs pyg-lib or torch-sparse"
    return results


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
        lines.append(f"{name:26s} {r['epoch_time_s']:9.2f} {r['seeds_per_s']:9.0f} {ratios} "
                     f"{r['test_acc']:9.4f}")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:  # one rank count for every system, DGL's included
        args.nprocs = len(resolve_devices(args.devices, args.nprocs))
    except ValueError as err:
        print(f"error: {in_flags(err)}", file=sys.stderr)
        return 2
    out = Path(args.out or Path("runs") / f"bench-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
    if args.sampler_only:
        results = run_sampler_bench(args)
        for key, value in results.items():
            shown = f"{value / 1e6:.2f}M edges/s" if isinstance(value, float) and \
                "_vs_" not in key else value
            print(f"{key:28s} {shown}")
    else:
        results = run_training_bench(args, out)
        print(format_training(results))
    report = {"mode": "sampler" if args.sampler_only else "training",
              "args": vars(args), "results": results}
    (out / "bench.json").write_text(json.dumps(report, indent=2))
    print(f"written {out / 'bench.json'}")
    failed = [n for n, r in results.items() if isinstance(r, dict) and "failed" in r]
    for name in failed:
        print(f"error: {name} failed:\n{results[name]['log_tail']}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
