"""Node features for a GPU rank whose graph stays in host memory: hottest rows cached on the GPU.

When the graph does not fit on the card, every batch would copy all its feature rows over PCIe.
But samplers keep drawing the same nodes: a node appears in a sample about in proportion to its
out-degree (how many nodes list it as an in-neighbour). So the rows of the highest out-degree
nodes are copied to the GPU once, and a batch copies only the rows it misses, gathered into pinned
memory so the copy is asynchronous (on the prefetch thread's side stream when prefetching).
With ``--graph-on host`` the features are a CUDA view of pinned host memory: the batch's ids and
the map are on the GPU, and the misses are read in place by the gather kernel.
"""
from __future__ import annotations

import torch
from torch import Tensor

from pyg_mgpu.gpu_path import host_ints, positions_of

_NOT_CACHED = -1
_CHUNK_ROWS = 1 << 16


class FeatureCache:
    """Serves ``x[n_id]`` on ``device`` from a GPU copy of the hottest rows plus host memory.

    Args:
        x: ``[N, F]`` features in host memory (the shared copy every rank maps).
        hotness: ``[N]`` how often each node is expected in a sample (e.g. out-degree); the
            ``max_rows`` hottest rows are cached.
        device: where the gathered features go (and the cache lives).
        max_rows: rows to cache, at most ``N`` (0 caches nothing: every row is copied).
    """

    def __init__(self, x: Tensor, hotness: Tensor, device: torch.device, max_rows: int):
        if hotness.shape != (x.size(0),):
            raise ValueError(f"hotness needs one value per node ({x.size(0)}), got shape "
                             f"{tuple(hotness.shape)}.")
        self.x = x
        self.device = device
        num_cached = max(0, min(int(max_rows), x.size(0)))
        hottest = torch.topk(hotness, num_cached, sorted=False).indices
        # Host-side map from node to cache row: the batch's node ids are on the host (the
        # sampler runs there), so hits and misses are split before anything is copied.
        self.slot = torch.full((x.size(0),), _NOT_CACHED, dtype=torch.int32)
        self.slot[hottest.cpu()] = torch.arange(num_cached, dtype=torch.int32)
        # Features read in place from pinned host memory (--graph-on host): the sampler runs
        # on the GPU, so the batch's node ids and the map are there.
        self.in_place = x.is_cuda
        if self.in_place:
            self.slot = self.slot.to(device)
        # Copied in chunks: a host copy of the whole cache on every rank at once could be tens
        # of GB.
        self.rows = torch.empty(num_cached, x.size(1), dtype=x.dtype, device=device)
        for start in range(0, num_cached, _CHUNK_ROWS):
            chunk = hottest[start:start + _CHUNK_ROWS]
            self.rows[start:start + chunk.numel()] = x.index_select(0, chunk).to(device)
        self._pin = device.type == "cuda"

    @property
    def num_cached(self) -> int:
        return self.rows.size(0)

    def nbytes(self) -> int:
        return self.rows.numel() * self.rows.element_size()

    def gather(self, n_id: Tensor) -> Tensor:
        """``x[n_id]`` on the cache's device; ``n_id`` is a host tensor of node ids."""
        if self.rows is None:
            raise RuntimeError("FeatureCache.gather on a pickled copy (a DataLoader worker?): "
                               "the cache serves batches in the training process only.")
        if self.in_place:
            return self._gather_in_place(n_id)
        slot = self.slot.index_select(0, n_id)
        hit = slot >= 0
        hit_pos, miss_pos = hit.nonzero().squeeze(1), (~hit).nonzero().squeeze(1)
        miss_id = n_id.index_select(0, miss_pos)
        # Gathered straight into pinned memory: the copy below is then asynchronous.
        missed = torch.empty(miss_id.numel(), self.x.size(1), dtype=self.x.dtype,
                             pin_memory=self._pin)
        torch.index_select(self.x, 0, miss_id, out=missed)
        out = torch.empty(n_id.numel(), self.x.size(1), dtype=self.x.dtype, device=self.device)
        to_device = dict(device=self.device, non_blocking=True)
        hit_slot = slot.index_select(0, hit_pos).to(**to_device, dtype=torch.long)
        out.index_copy_(0, hit_pos.to(**to_device), self.rows.index_select(0, hit_slot))
        out.index_copy_(0, miss_pos.to(**to_device), missed.to(**to_device))
        return out

    def _gather_in_place(self, n_id: Tensor) -> Tensor:
        """``x[n_id]`` for device ``n_id`` with ``x`` a view of pinned host memory: the hits
        from the GPU rows, the misses read over PCIe by the gather kernel itself (one read of
        their count, to size them)."""
        if self.num_cached == 0:
            return self.x.index_select(0, n_id)
        slot = self.slot.index_select(0, n_id)
        if self.num_cached == self.x.size(0):  # every row on the GPU: no miss to count
            return self.rows.index_select(0, slot)
        out = self.rows.index_select(0, slot.clamp(min=0))
        miss = slot < 0
        (num_missed,) = host_ints(miss.sum().view(1))
        if num_missed:
            miss_pos = positions_of(miss, num_missed)
            out.index_copy_(0, miss_pos, self.x.index_select(0, n_id.index_select(0, miss_pos)))
        return out

    def __getstate__(self) -> dict:
        # The cache is the loader's transform, which runs in the training process only; with a
        # non-fork start method DataLoader workers still receive a pickled copy of the loader.
        # Never ship them the GPU rows (CUDA tensors) or the host features: they need neither.
        state = self.__dict__.copy()
        state.update(rows=None, x=None, slot=None)
        return state

    def attach(self, batch):
        """A loader ``transform``: gives a sampled batch its feature rows (``batch.x``)."""
        batch.x = self.gather(batch.n_id)
        return batch


def out_degree(row: Tensor, num_nodes: int) -> Tensor:
    """How many in-edges of other nodes each node is the source of: its chance to be sampled."""
    return torch.bincount(row, minlength=num_nodes)
