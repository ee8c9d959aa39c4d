"""Sampled edges per second of ``pyg_mgpu.NeighborSampler`` in each mode, and of the loader:
``python -m pyg_mgpu.bench --sampler-only``.

The samplers take turns on the same batches, in orders that put each after each other one
equally often, each turn starting from cold caches, so that their ratios hold on a noisy machine.
"""
from __future__ import annotations

import itertools
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Optional


def synthetic_graph(args, num_features: Optional[int] = None):
    """The benchmark graph the training systems generate from the same flags."""
    from pyg_mgpu.data.synthetic import SyntheticSpec, make_synthetic
    spec = SyntheticSpec(num_nodes=args.num_nodes, num_edges=args.num_edges,
                         num_features=num_features or args.num_features,
                         num_classes=args.num_classes)
    return make_synthetic(spec, args.seed)


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
    from pyg_mgpu.sampling.sampler_choice import pyg_sampler_available
    from pyg_mgpu.train.loaders import make_loader

    device = torch.device(getattr(args, "sampler_device", "cpu"))
    on_gpu = device.type == "cuda"
    if on_gpu and not torch.cuda.is_available():
        raise SystemExit("error: --sampler-device cuda needs a GPU that CUDA can see.")
    sync = torch.cuda.synchronize if on_gpu else None
    torch.set_num_threads(1)
    fanout = [int(k) for k in args.fanout.split(",")]
    graph = synthetic_graph(args, num_features=1)  # features play no part in sampling
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

    # Walks of 8 batches (the GPU ranks' default): one sampler walk draws 8 batches' trees.
    walk = NeighborSampler(data, fanout, seed=0)
    walks = [list(seeds.split(args.batch_size)[i:i + 8])
             for i in range(0, len(seeds.split(args.batch_size)), 8)]

    def walks_of_8():
        for group in itertools.cycle(walks):
            yield sum(out.row.numel() for out in walk.sample_batches(group))
    results["directional_8_per_walk_1_thread"] = _sampled_edges_per_s(
        walks_of_8, max(1, args.batches // 8), sync)
    results["directional_8_per_walk_vs_directional"] = (
        results["directional_8_per_walk_1_thread"] / results["directional_1_thread"])

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
