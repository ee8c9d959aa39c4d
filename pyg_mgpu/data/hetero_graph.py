"""A heterogeneous graph as the CLI trains it: PyG's ``HeteroData`` plus the labelled node type.

The ``HeteroData`` itself is what the ranks sample from (:class:`pyg_mgpu.NeighborLoader` with
``input_nodes=(target, nodes)``); this wrapper adds what the trainer reads of any graph (the
splits as node ids of the target type, sizes for the logs and metrics) and shares the data,
one CSC per edge type included, before the ranks start.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor
from torch_geometric.data import HeteroData

from pyg_mgpu.data.csc import attach_csc, edge_type_csc, share_data
from pyg_mgpu.data.protocol import TrainingGraph
from pyg_mgpu.data.sharing import check_shm_room
from pyg_mgpu.data.validation import DatasetError, ids_outside


@dataclass
class HeteroGraph(TrainingGraph):
    """``data``'s node type ``target`` carries the labels ``y`` and the boolean ``train_mask``,
    ``val_mask`` and ``test_mask``; every node type carries features ``x``.

    Raises:
        DatasetError: when the target type lacks labels or masks, or a node type lacks
            features (the message names them).
    """

    is_hetero = True
    name: str
    data: HeteroData
    target: str
    num_classes: int
    splits: dict = field(init=False, repr=False)

    def __post_init__(self) -> None:
        store = self.data[self.target]
        missing = [key for key in ("y", "train_mask", "val_mask", "test_mask")
                   if key not in store]
        if missing:
            raise DatasetError(f"{self.name}: node type {self.target!r} has no "
                               f"{', '.join(missing)}; the labelled type needs labels y and "
                               "boolean train_mask, val_mask and test_mask.")
        featureless = [t for t in self.data.node_types if "x" not in self.data[t]]
        if featureless:
            raise DatasetError(f"{self.name}: node types {', '.join(featureless)} have no "
                               "features x; give every node type features (ogbn-mag's loader "
                               "fills them with their neighbours' mean).")
        self._check_labels()
        self.splits = {split: store[split.replace("_idx", "_mask")].nonzero().view(-1)
                       for split in ("train_idx", "val_idx", "test_idx")}

    def _check_labels(self) -> None:
        """The target's labels and masks as training reads them: one label per node, three
        non-empty, disjoint boolean masks of its nodes, and labels in ``[0, num_classes)`` on
        the nodes they hold (a stray label would fail mid-epoch, in the loss)."""
        store, where = self.data[self.target], f"{self.name}: node type {self.target!r}"
        n, y = store.num_nodes, store.y
        if y.dim() != 1 or y.numel() != n:
            raise DatasetError(f"{where} has {n} nodes but labels y of shape {tuple(y.shape)}; "
                               "give it one label per node.")
        seen = torch.zeros(n, dtype=torch.bool)
        for key in ("train_mask", "val_mask", "test_mask"):
            mask = store[key]
            if mask.dtype != torch.bool or tuple(mask.shape) != (n,):
                raise DatasetError(f"{where}: {key} must be a boolean mask of its {n} nodes, "
                                   f"got {mask.dtype} of shape {tuple(mask.shape)}.")
            if not bool(mask.any()):
                raise DatasetError(f"{where}: {key} is empty; every split needs nodes.")
            if bool((seen & mask).any()):
                raise DatasetError(f"{where}: {key} overlaps an earlier split in "
                                   f"{int((seen & mask).sum())} node(s); splits must be "
                                   "disjoint.")
            seen |= mask
        labels = y[seen]
        low, high = labels.min().item(), labels.max().item()
        fractional = labels.is_floating_point() and not bool((labels == labels.round()).all())
        if fractional or not 0 <= low <= high < self.num_classes:
            raise DatasetError(f"{where}: the nodes in the splits need integer labels in "
                               f"[0, {self.num_classes}), got labels from {low} to {high}; fix "
                               "them, or keep unlabelled nodes out of every split.")

    @property
    def train_idx(self) -> Tensor:
        return self.splits["train_idx"]

    @property
    def val_idx(self) -> Tensor:
        return self.splits["val_idx"]

    @property
    def test_idx(self) -> Tensor:
        return self.splits["test_idx"]

    @property
    def num_nodes(self) -> int:
        return sum(self.data[t].num_nodes for t in self.data.node_types)

    @property
    def num_edges(self) -> int:
        return sum(self.data[t].num_edges for t in self.data.edge_types)

    @property
    def num_features(self) -> dict[str, int]:
        """Feature width per node type."""
        return {t: self.data[t].x.size(-1) for t in self.data.node_types}

    def tensors(self) -> dict[str, Tensor]:
        """The graph's tensors by name (``paper.x``, ``paper__cites__paper.edge_index``) and its
        splits; not its CSCs."""
        named = {f"{'__'.join(store._key) if isinstance(store._key, tuple) else store._key}"
                 f".{key}": value
                 for store in self.data.stores if store._key is not None
                 for key, value in store.items() if isinstance(value, Tensor)}
        return {**named, **self.splits}

    def nbytes(self) -> int:
        """Bytes held by the graph's tensors (its CSCs not counted)."""
        return sum(t.numel() * t.element_size() for t in self.tensors().values())

    def share_memory_(self, shm_dir: str = "/dev/shm") -> "HeteroGraph":
        """Builds every edge type's CSC and moves the graph, CSCs and splits to shared memory."""
        check_shm_room(self.name, 2 * self.nbytes(), shm_dir)  # the CSCs about double it
        share_data(self.data)
        for t in self.splits.values():
            t.share_memory_()
        return self

    def summary(self) -> str:
        types = ", ".join(f"{t} {self.data[t].num_nodes:,}" for t in self.data.node_types)
        return (f"{self.name}: {self.num_nodes:,} nodes ({types}), {self.num_edges:,} edges of "
                f"{len(self.data.edge_types)} types, {self.num_classes} classes of "
                f"{self.target}, train/val/test {self.train_idx.numel():,}/"
                f"{self.val_idx.numel():,}/{self.test_idx.numel():,}")

    def loader_data(self, with_features: bool = True) -> HeteroData:
        """What a batch needs (every type's features, the target's labels, the edges), with
        every edge type's shared CSC attached: batches then slice no split masks."""
        data = HeteroData()
        for t in self.data.node_types:
            data[t].x = self.data[t].x
        data[self.target].y = self.data[self.target].y
        for et in self.data.edge_types:
            data[et].edge_index = self.data[et].edge_index
            attach_csc(data[et], edge_type_csc(self.data, et))
        return data

    def loader_nodes(self, nodes: Tensor) -> tuple[str, Tensor]:
        return self.target, nodes


def check_edges(name: str, data: HeteroData) -> None:
    """Raises :class:`DatasetError` where an edge type names nodes its end types do not have."""
    for src, rel, dst in data.edge_types:
        edge_index = data[src, rel, dst].edge_index
        for row, node_type in ((0, src), (1, dst)):
            outside = ids_outside(edge_index[row], data[node_type].num_nodes)
            if outside:
                raise DatasetError(f"{name}: edges ({src}, {rel}, {dst}) name {node_type} "
                                   f"nodes {outside}; fix the edge list.")
