"""The CLI's loaders: the public :class:`~pyg_mgpu.NeighborLoader` over the graph store, with
GPU placement, the GPU feature cache and DataLoader workers chosen per rank.

Batches are ordinary PyG ``Data`` objects (``x, y, edge_index, batch_size, n_id,
num_sampled_nodes, num_sampled_edges``), as any PyG user's ``NeighborLoader`` gives them; over a
heterogeneous graph (:class:`~pyg_mgpu.data.hetero_graph.HeteroGraph`) they are ``HeteroData``
with the seeds in the labelled type. Where the model reads the feature rows in place
(:func:`fused_aggregation_route` ``"in_place"``) the batches carry no ``x``: the loader's ``feature_table`` and
each batch's ``n_id`` name the rows.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
from typing import Optional, Sequence

import torch
from torch import Tensor
from torch_geometric.data import Data

from pyg_mgpu.data.graph import HALF_FEATURES, ConvertedGraph
from pyg_mgpu.data.pinned import pinned_graph_tensors
from pyg_mgpu.data.protocol import TrainingGraph
from pyg_mgpu.sampling.feature_cache import FeatureCache, out_degree
from pyg_mgpu.sampling.neighbor_loader import NeighborLoader
from pyg_mgpu.seeds import rank_seed
from pyg_mgpu.train.config import TrainConfig


def _pyg_sampler(graph: ConvertedGraph, fanout: Sequence[int]):
    """PyG's own sampler (pyg-lib or torch-sparse), for the PyG-recipe baseline."""
    from torch_geometric.sampler import NeighborSampler as PyGNeighborSampler
    # PyG converts the edge list to its own CSC copy (the price of its sampler).
    data = Data(edge_index=graph.edge_index(), num_nodes=graph.num_nodes)
    return PyGNeighborSampler(data, num_neighbors=list(fanout), is_sorted=False)


def choose_placement(graph: ConvertedGraph, device: torch.device, placement: str,
                     sampler: str = "native", free_bytes: Optional[int] = None) -> str:
    """Where this rank samples from: ``"cpu"`` (the shared host copy, sampled on the CPU),
    ``"gpu"`` (this GPU's own copy) or ``"host"`` (the shared host copy pinned in place and
    read by this GPU's kernels, :mod:`pyg_mgpu.data.pinned`).

    ``"auto"`` takes the GPU copy when it fits in half of ``free_bytes`` (default: this GPU's
    free memory; the trainer passes the least of all ranks', so that every rank chooses alike),
    else the pinned host copy, which the GPU samples faster than the CPU does
    (docs/benchmarks.md). A host copy whose features are a file's pages (``--features-on
    mmap``) stays with the CPU: pinning would hold the file in RAM.
    PyG's sampler (pyg-lib, torch-sparse) and the heterogeneous one sample on the CPU.
    """
    if device.type != "cuda" or placement == "cpu" or sampler == "pyg" or graph.is_hetero:
        return "cpu"
    if placement != "auto":
        return placement
    if free_bytes is None:
        free_bytes, _ = torch.cuda.mem_get_info(device)
    if graph.nbytes() <= free_bytes // 2:  # half the card for activations and the allocator
        return "gpu"
    return "cpu" if features_in_a_file(graph) else "host"


def features_in_a_file(graph: ConvertedGraph) -> bool:
    """Whether the graph's features are the pages of a file in the graph cache (not of
    ``/dev/shm`` or of this process's memory)."""
    mapped = graph.mapped.get("x")
    return mapped is not None and not str(mapped.path).startswith("/dev/shm/")


def place_graph(graph: ConvertedGraph, device: torch.device, placement: str,
                sampler: str = "native", free_bytes: Optional[int] = None) -> ConvertedGraph:
    """The graph this rank samples from, where :func:`choose_placement` puts it: the shared
    host copy itself, this GPU's copy, or CUDA views of the shared host copy, pinned in place,
    which this GPU samples and gathers from without copying the graph."""
    where = choose_placement(graph, device, placement, sampler, free_bytes)
    if where == "cpu":
        return graph
    # The split ids stay on the host, with the pointers' host original: the loader slices its
    # seeds there and the sampler plans their first hop there, without waiting for the GPU.
    splits = {"train_idx", "val_idx", "test_idx"}
    tensors = {name: t for name, t in graph.tensors().items() if name not in splits}
    if where == "host":
        moved = pinned_graph_tensors(tensors, device)
    else:
        moved = {name: t.to(device) for name, t in tensors.items()}
    return ConvertedGraph(name=graph.name, num_classes=graph.num_classes, **moved,
                          **{name: getattr(graph, name) for name in splits},
                          host_colptr=graph.colptr)


def feature_cache_budget(graph: TrainingGraph, device: torch.device,
                         budget_gb: Optional[float], graph_on: str) -> int:
    """Bytes of the GPU cache of the most-sampled feature rows, for a GPU rank whose graph
    stays on the host (``graph_on`` ``"cpu"`` or ``"host"``); 0: no cache.

    ``budget_gb`` caps its size; None takes up to a quarter of the card's free memory (the rest
    is for activations and the allocator), 0 turns the cache off.
    """
    if device.type != "cuda" or graph.is_hetero or graph_on == "gpu" or budget_gb == 0:
        return 0
    if budget_gb is None:
        return torch.cuda.mem_get_info(device)[0] // 4
    return int(budget_gb * 2**30)


def make_feature_cache(graph: ConvertedGraph, device: torch.device,
                       budget_bytes: int) -> Optional[FeatureCache]:
    """The GPU cache of the most-sampled feature rows (:func:`feature_cache_budget`), or None
    for a budget of 0."""
    if budget_bytes <= 0:
        return None
    row_bytes = graph.num_features * graph.x.element_size()
    return FeatureCache(graph.x, out_degree(graph.row, graph.num_nodes), device,
                        max_rows=budget_bytes // row_bytes)


def fused_aggregation_route(cfg: TrainConfig, graph: TrainingGraph, device: torch.device,
                            graph_on: str) -> str:
    """``--fused-aggregation`` as it runs on ``device``: ``"off"``; ``"means"``, the fused
    kernels take the neighbour means of rows the loader gathered (``x[n_id]``); or
    ``"in_place"``, the first layer reads each batch's rows from the feature table itself
    (``model(table, ..., n_id=batch.n_id)``) and the loader gathers none.

    Only pyg_mgpu's GraphSAGE runs the fused kernels, on a GPU where triton imports. Rows are
    read in place only from a table that lives whole on this GPU (``graph_on`` ``"gpu"``, so no
    feature cache): rows in host memory are gathered once per batch, not read by every
    program of the layer. A CUDA graph's padded step copies its input itself, and
    half-precision features need autocast, since the first layer's means keep the table's type.
    """
    from pyg_mgpu.nn.sage import fused_aggregation_runs  # the model's own test of the device
    perf = cfg.performance
    if not (perf.fused_aggregation and cfg.model.recipe == "pyg_mgpu"
            and cfg.model.model == "sage" and not graph.is_hetero
            and fused_aggregation_runs(torch.empty(0, device=device))):
        return "off"
    in_place = (graph_on == "gpu" and not perf.cuda_graph
                and (graph.x.dtype not in HALF_FEATURES or perf.amp == "bf16"))
    return "in_place" if in_place else "means"


def _worker_start_method(num_workers: int) -> Optional[str]:
    """How DataLoader workers start: forked where the platform can.

    A spawned rank would otherwise spawn its workers too, pickling the loader, graph tensors
    included. Those tensors arrived in the rank as shared memory whose file descriptors torch
    closes once mapped, so sharing them again failed ("bad value(s) in fds_to_keep"). Forked
    workers inherit the mappings instead and pickle nothing.
    """
    if num_workers == 0 or "fork" not in mp.get_all_start_methods():
        return None
    return "fork"


def _leave_stops_to_the_rank(worker_id: int) -> None:
    """A DataLoader worker ends when its rank ends it, and on no other stop signal.

    A SIGTERM sent to the whole process group (Slurm, ``kill -- -PGID``) used to kill the
    workers, and their rank then failed instead of stopping cleanly with a checkpoint. Here the
    stop signals are blocked and a thread takes them: one from the rank (DataLoader's shutdown,
    the rank's exit) ends the worker, as torch's own handler does; others are dropped.
    """
    stops = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}
    signal.pthread_sigmask(signal.SIG_BLOCK, stops)  # this thread, and those started later
    rank = os.getppid()

    def take_signals() -> None:
        while True:
            if signal.sigwaitinfo(stops).si_pid == rank:
                os._exit(0)

    threading.Thread(target=take_signals, name="pyg_mgpu-worker-signals", daemon=True).start()


# Batches per walk by default: a walk's kernel launches and host reads are shared by its
# batches. Sampling on a GPU that pays at any batch size; on the CPU only batches of at most
# SMALL_CPU_BATCH seeds gain (their ops cost more to issue than to run), and larger ones lose
# more to the split than they save (docs/benchmarks.md).
BATCHES_PER_WALK = 8
SMALL_CPU_BATCH = 64


def batches_per_walk(requested: Optional[int], graph: TrainingGraph, sampler: str,
                     batch_size: int, on_gpu: bool = False) -> int:
    """``--sample-batches``, or its default for this rank's graph and batch size; ``on_gpu``:
    the sampler runs on the GPU (``--graph-on gpu`` or ``host``). (TrainConfig refuses more
    than one with PyG's sampler or a heterogeneous dataset, and the loader whatever it cannot
    walk.)"""
    if requested is not None:
        return requested
    if graph.is_hetero or sampler != "native":
        return 1
    return BATCHES_PER_WALK if on_gpu or batch_size <= SMALL_CPU_BATCH else 1


def make_loader(graph: TrainingGraph, nodes: Tensor, *, fanout: Sequence[int],
                sampler: str, seed: int, batch_size: int, num_workers: int = 0,
                rank: Optional[int] = None, world_size: Optional[int] = None,
                feature_cache: Optional[FeatureCache] = None,
                device: Optional[torch.device] = None,
                sample_batches: int = 1, features_in_place: bool = False) -> NeighborLoader:
    """A :class:`NeighborLoader` over ``nodes``: this rank's sharded epochs when ``rank`` and
    ``world_size`` are given (call ``set_epoch``), else every node in order.

    Features and labels stay in the graph's (shared) memory; each batch gathers its rows, the
    features through ``feature_cache`` when given (in the consuming thread, never in workers).
    ``device`` is where the batches go: host batches bound for a GPU are pinned. On a
    :class:`HeteroGraph`, ``nodes`` are of its labelled type. ``sample_batches``: batches per
    walk of the sampler (sharded loaders). ``features_in_place``
    (:func:`fused_aggregation_route` ``"in_place"``): batches without ``x``; the loader's ``feature_table`` is
    the table their ``n_id`` index (None otherwise).
    """
    on_gpu = not graph.is_hetero and graph.x.is_cuda
    data = graph.loader_data(with_features=feature_cache is None and not features_in_place)
    nodes = graph.loader_nodes(nodes)
    if on_gpu:
        num_workers = 0  # sampling runs on the GPU in this process; workers cannot use CUDA
    # Workers may not touch CUDA: with the cache, its gather runs in the consuming thread.
    filter_per_worker = num_workers > 0 and feature_cache is None
    distributed = rank is not None
    loader = NeighborLoader(
        data, list(fanout), input_nodes=nodes, batch_size=batch_size,
        neighbor_sampler=_pyg_sampler(graph, fanout) if sampler == "pyg" else None,
        distributed=distributed, rank=rank, world_size=world_size, seed=seed,
        sample_batches=sample_batches, shuffle=distributed, num_workers=num_workers,
        persistent_workers=num_workers > 0,
        multiprocessing_context=_worker_start_method(num_workers),
        worker_init_fn=_leave_stops_to_the_rank if num_workers > 0 else None,
        filter_per_worker=filter_per_worker,
        transform=feature_cache.attach if feature_cache else None,
        # Its own generator: iterating a DataLoader draws a seed, and drawing it from the
        # global RNG would shift the dropout stream of whichever rank happens to evaluate.
        generator=torch.Generator().manual_seed(seed if rank is None else rank_seed(seed, rank)),
        # Host batches bound for a GPU: pinned, so the copy is asynchronous. DataLoader pins
        # what workers return, which is only the finished batch when they also gather its rows
        # (filter_per_worker).
        pin_memory=device is not None and device.type == "cuda" and not on_gpu and
        filter_per_worker)
    loader.feature_table = graph.x if features_in_place else None
    return loader
