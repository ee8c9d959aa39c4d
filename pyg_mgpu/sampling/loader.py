"""Mini-batch loaders: PyG's ``NodeLoader`` driven by our sampler and our epoch sharding.

Batches are ordinary PyG ``Data`` objects (``x, y, edge_index, batch_size, n_id,
num_sampled_nodes, num_sampled_edges``), so PyG users see what ``NeighborLoader`` gives them.
"""
from __future__ import annotations

import multiprocessing as mp
from typing import Iterator, Optional, Sequence

import torch
from torch import Tensor
from torch_geometric.data import Data
from torch_geometric.loader import NodeLoader

from pyg_mgpu.data.graph import GraphStore
from pyg_mgpu.sampling.feature_cache import FeatureCache, out_degree
from pyg_mgpu.sampling.sampler import NativeNeighborSampler
from pyg_mgpu.sampling.sharding import epoch_batches, steps_per_epoch


def pyg_sampler_available() -> bool:
    """PyG's own neighbour sampler needs pyg-lib or torch-sparse (neither is on the registry)."""
    from torch_geometric.typing import WITH_PYG_LIB, WITH_TORCH_SPARSE
    return bool(WITH_PYG_LIB or WITH_TORCH_SPARSE)


def resolve_sampler(choice: str) -> str:
    if choice == "pyg" and not pyg_sampler_available():
        raise ValueError("--sampler pyg needs pyg-lib or torch-sparse installed (see "
                         "docs/benchmarks.md); use --sampler native.")
    return "native" if choice == "auto" else choice


class EpochBatchSampler:
    """Yields this rank's batches (positions into the training nodes) for the current epoch.

    Call :meth:`set_epoch` before each epoch; the batches come from
    :func:`pyg_mgpu.sampling.sharding.epoch_batches`, so all ranks run the same number of steps.
    """

    def __init__(self, num_items: int, *, seed: int, rank: int, world_size: int,
                 batch_size: int, shuffle: bool = True):
        self.num_items = num_items
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.batch_size, self.shuffle = batch_size, shuffle
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return steps_per_epoch(self.num_items, self.world_size, self.batch_size)

    def __iter__(self) -> Iterator[list[int]]:
        positions = torch.arange(self.num_items)
        for batch in epoch_batches(positions, seed=self.seed, epoch=self.epoch, rank=self.rank,
                                   world_size=self.world_size, batch_size=self.batch_size,
                                   shuffle=self.shuffle):
            yield batch.tolist()


def _make_sampler(graph: GraphStore, fanout: Sequence[int], kind: str, seed: int):
    if kind == "native":
        return NativeNeighborSampler(graph.colptr, graph.row, fanout, seed=seed)
    from torch_geometric.sampler import NeighborSampler
    # PyG converts the edge list to its own CSC copy (the price of its sampler).
    data = Data(edge_index=graph.edge_index(), num_nodes=graph.num_nodes)
    return NeighborSampler(data, num_neighbors=list(fanout), is_sorted=False)


def place_graph(graph: GraphStore, device: torch.device, placement: str,
                sampler: str = "native", free_bytes: Optional[int] = None) -> GraphStore:
    """The graph this rank samples from: its own GPU copy when asked or when it fits, else
    the shared host copy (features then travel per batch).

    PyG's sampler (pyg-lib, torch-sparse) samples on the CPU, from the host copy. ``free_bytes``
    is the GPU memory the ``auto`` choice goes by (default: this GPU's free memory; the trainer
    passes the least of all ranks', so that every rank chooses alike).
    """
    if device.type != "cuda" or placement == "cpu" or sampler == "pyg":
        return graph
    if placement == "auto":
        if free_bytes is None:
            free_bytes, _ = torch.cuda.mem_get_info(device)
        if graph.nbytes() > free_bytes // 2:  # half the card for activations and the allocator
            return graph
    moved = {name: t.to(device) for name, t in graph.tensors().items()}
    return GraphStore(name=graph.name, num_classes=graph.num_classes, **moved)


def make_feature_cache(graph: GraphStore, device: torch.device,
                       budget_gb: Optional[float]) -> Optional[FeatureCache]:
    """A GPU cache of the most-sampled feature rows for a rank whose graph stayed on the host.

    ``budget_gb`` caps its size; None takes up to a quarter of the card's free memory (the rest
    is for activations and the allocator), 0 turns the cache off.
    """
    if device.type != "cuda" or graph.x.is_cuda or budget_gb == 0:
        return None
    if budget_gb is None:
        budget = torch.cuda.mem_get_info(device)[0] // 4
    else:
        budget = int(budget_gb * 2**30)
    row_bytes = graph.num_features * graph.x.element_size()
    return FeatureCache(graph.x, out_degree(graph.row, graph.num_nodes), device,
                        max_rows=budget // row_bytes)


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


def make_loader(graph: GraphStore, nodes: Tensor, *, fanout: Sequence[int], sampler: str,
                seed: int, batch_size: int, num_workers: int = 0,
                batch_sampler: Optional[EpochBatchSampler] = None,
                feature_cache: Optional[FeatureCache] = None,
                device: Optional[torch.device] = None) -> NodeLoader:
    """A loader over ``nodes``: sharded epochs with ``batch_sampler``, else in order.

    Features and labels stay in the graph's (shared) memory; each batch gathers its rows, the
    features through ``feature_cache`` when given (in the consuming thread, never in workers).
    ``device`` is where the batches go: host batches bound for a GPU are pinned.
    """
    on_gpu = graph.x.is_cuda
    if on_gpu:
        num_workers = 0  # sampling runs on the GPU in this process; workers cannot use CUDA
    # The empty edge_index is a slot: PyG fills it with each batch's sampled (row, col).
    data = Data(y=graph.y, edge_index=torch.empty(2, 0, dtype=torch.long, device=graph.x.device),
                num_nodes=graph.num_nodes)
    if feature_cache is None:
        data.x = graph.x
    # Workers may not touch CUDA: with the cache, its gather runs in the consuming thread.
    filter_per_worker = num_workers > 0 and feature_cache is None
    loader_args: dict = dict(num_workers=num_workers, persistent_workers=num_workers > 0,
                             multiprocessing_context=_worker_start_method(num_workers),
                             filter_per_worker=filter_per_worker,
                             transform=feature_cache.attach if feature_cache else None,
                             # Its own generator: iterating a DataLoader draws a seed, and drawing
                             # it from the global RNG would shift the dropout stream of whichever
                             # rank happens to evaluate.
                             generator=torch.Generator().manual_seed(seed),
                             # Host batches bound for a GPU: pinned, so the copy is asynchronous.
                             # DataLoader pins what workers return, which is only the finished
                             # batch when they also gather its rows (filter_per_worker).
                             pin_memory=device is not None and device.type == "cuda" and
                             not on_gpu and filter_per_worker)
    if batch_sampler is not None:
        loader_args["batch_sampler"] = batch_sampler
    else:
        loader_args.update(batch_size=batch_size, shuffle=False)
    return NodeLoader(data, node_sampler=_make_sampler(graph, fanout, sampler, seed),
                      input_nodes=nodes, **loader_args)
