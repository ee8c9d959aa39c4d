"""The one training layout every dataset is converted to, once, in the parent process.

A :class:`ConvertedGraph` holds the graph in CSC form (for every node, the sources of its in-edges,
which is what a neighbour sampler walks), node features, labels and the three split index
tensors. :meth:`ConvertedGraph.share_memory_` moves every tensor to shared memory so spawned ranks
map the parent's pages instead of copying them. :meth:`ConvertedGraph.to_data` hands the same graph
to PyG code as a ``Data``.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Optional

import numpy as np
import torch
from torch import Tensor

from pyg_mgpu.data.csc import CSC, EdgeChunks, attach_csc, csc_from_chunks, edge_chunks
from pyg_mgpu.data.protocol import TrainingGraph
from pyg_mgpu.data.sharing import MappedFile, check_shm_room
from pyg_mgpu.data.validation import SPLITS, DatasetError, as_signed_ids, validate_node_data

if TYPE_CHECKING:  # PyG is imported where a Data is made: a job's parent never needs it
    from torch_geometric.data import Data

NPZ_KEYS = ("edge_index", "x", "y") + SPLITS
HALF_FEATURES = (torch.float16, torch.bfloat16)
"""Feature types kept as stored (half the memory of float32: MAG240M's features are 375 GB in
fp16); every other type becomes float32. Batches are computed on in float32, or in bf16 under
autocast."""


def undirected_edges(src: Tensor, dst: Tensor) -> tuple[Tensor, Tensor]:
    """The edges and their reverses, each (source, destination) pair once, sorted by source,
    then destination: the graph PyG's ``to_undirected`` (``ToUndirected``) and DGL's
    ``to_bidirected`` make of a directed one (an edge given both ways, a duplicate edge and a
    self loop all appear once). Ids of any integer type, returned as int64; any values are
    taken (ids out of range are the conversion's to refuse)."""
    src, dst = torch.cat([src, dst]).long(), torch.cat([dst, src]).long()
    # Two stable sorts, not one on a combined key: the key src * N + dst could overflow (or
    # merge distinct pairs) for ids outside [0, N).
    order = dst.argsort(stable=True)
    order = order[src[order].argsort(stable=True)]
    src, dst = src[order], dst[order]
    first = torch.ones(src.numel(), dtype=torch.bool, device=src.device)
    first[1:] = (src[1:] != src[:-1]) | (dst[1:] != dst[:-1])
    return src[first], dst[first]


def feature_dtype_for(stored: torch.dtype, requested: Optional[torch.dtype] = None) -> torch.dtype:
    """The features' type in memory: ``requested``, or by default the stored half precision
    (:data:`HALF_FEATURES`) kept, anything else float32."""
    if requested is not None:
        return requested
    return stored if stored in HALF_FEATURES else torch.float32


@dataclass
class ConvertedGraph(TrainingGraph):
    """A node-classification graph in the layout the samplers and trainers use.

    Attributes:
        name: Dataset name, for logs and metrics.
        colptr: ``[N + 1]`` int64 CSC pointers: the in-neighbours of node ``v`` are
            ``row[colptr[v]:colptr[v + 1]]``.
        row: ``[E]`` source node of each edge, grouped by destination: int32 whenever node ids
            fit (half the shared memory and bytes read per sampled edge), else int64.
        x: ``[N, F]`` node features: float32, or a half precision kept as stored (fp16 or
            bf16, :data:`HALF_FEATURES`; bf16 for runs with ``--amp bf16``).
        y: ``[N]`` int64 labels in ``[0, num_classes)``.
        train_idx, val_idx, test_idx: int64 node ids of each split (disjoint).
        num_classes: Number of label classes.
        mapped: The tensors that are mapped files of the graph cache, by attribute name (see
            :mod:`pyg_mgpu.data.cache`): ranks map the same files instead of receiving copies.
        host_colptr: On a graph placed on a GPU, ``colptr``'s host original (not one of
            :meth:`tensors`), which the samplers plan their first hop from.
    """

    is_hetero = False
    name: str
    colptr: Tensor
    row: Tensor
    x: Tensor
    y: Tensor
    train_idx: Tensor
    val_idx: Tensor
    test_idx: Tensor
    num_classes: int
    mapped: dict[str, MappedFile] = field(default_factory=dict, repr=False, compare=False)
    host_colptr: Optional[Tensor] = field(default=None, repr=False, compare=False)

    def __getstate__(self) -> dict:
        # A mapped tensor travels to another process as its file, which the receiver maps
        # (torch would copy its pages into a new shared-memory segment instead).
        state = dict(self.__dict__)
        for name, mapped in self.mapped.items():
            state[name] = mapped
        return state

    def __setstate__(self, state: dict) -> None:
        for name, mapped in state["mapped"].items():
            state[name] = mapped.map()
        self.__dict__.update(state)

    @property
    def num_nodes(self) -> int:
        return self.colptr.numel() - 1

    @property
    def num_edges(self) -> int:
        return self.row.numel()

    @property
    def num_features(self) -> int:
        return self.x.size(1)

    def tensors(self) -> dict[str, Tensor]:
        return {f.name: getattr(self, f.name) for f in fields(self)
                if isinstance(getattr(self, f.name), Tensor) and f.name != "host_colptr"}

    def nbytes(self) -> int:
        """Bytes held by all tensors: the size of one copy of the dataset."""
        return sum(t.numel() * t.element_size() for t in self.tensors().values())

    def share_memory_(self, shm_dir: str = "/dev/shm") -> "ConvertedGraph":
        """Moves every tensor to shared memory in place (ranks then map, not copy, them).

        Raises:
            DatasetError: when ``shm_dir`` cannot hold the graph or file descriptors run out,
                with what to change (the torch error alone names neither).
        """
        # Mapped files stay where they are.
        unmapped = [t for name, t in self.tensors().items() if name not in self.mapped]
        check_shm_room(self.name, sum(t.numel() * t.element_size() for t in unmapped), shm_dir)
        try:
            for t in unmapped:
                t.share_memory_()
        except RuntimeError as e:
            if "Too many open files" in str(e):
                raise DatasetError(f"{self.name}: ran out of file descriptors while sharing the "
                                   "graph; raise the limit (ulimit -n 65536).") from e
            if "No space left" in str(e):
                raise DatasetError(f"{self.name}: shared memory ({shm_dir}) ran out while "
                                   "sharing the graph; enlarge /dev/shm.") from e
            raise
        return self

    def is_shared(self) -> bool:
        """Whether other processes receive this graph without a copy (shared memory or
        mapped files)."""
        return all(t.is_shared() or name in self.mapped for name, t in self.tensors().items())

    def in_degree(self) -> Tensor:
        return self.colptr[1:] - self.colptr[:-1]

    def edge_index(self) -> Tensor:
        """``[2, E]`` (source, destination) edge list, in CSC order."""
        dst = torch.repeat_interleave(torch.arange(self.num_nodes, device=self.colptr.device),
                                      self.in_degree())
        return torch.stack([self.row.long(), dst])

    def to_data(self) -> Data:
        """This graph as a PyG ``Data``, with this store's CSC attached for the samplers.

        The ``Data`` holds ``x``, ``y`` (the same tensors, not copies), ``edge_index`` (int64,
        sorted by destination: the CSC order), ``train_mask``, ``val_mask``, ``test_mask`` and
        ``num_classes`` (an int). Samplers given the ``Data`` read the attached CSC
        (:func:`~pyg_mgpu.data.csc.csc_of`) instead of sorting ``edge_index`` again.
        """
        from torch_geometric.data import Data
        from torch_geometric.utils import index_to_mask

        data = Data(x=self.x, y=self.y, edge_index=self.edge_index(),
                    num_classes=self.num_classes)
        for split in SPLITS:  # train_idx -> train_mask
            data[split.replace("_idx", "_mask")] = index_to_mask(getattr(self, split),
                                                                 self.num_nodes)
        # perm=None: edge_index is in CSC order, so an edge's id is its CSC position.
        return attach_csc(data, CSC(self.colptr, self.row, perm=None,
                                    edge_index=data.edge_index))

    def loader_data(self, with_features: bool = True) -> Data:
        """This graph as the ``Data`` that :class:`pyg_mgpu.NeighborLoader` takes, without
        copying.

        The loader samples from the graph's own CSC (attached, so nothing is converted); the
        empty ``edge_index`` is the slot PyG fills with each batch's sampled (row, col), and
        ``e_id`` are positions in :meth:`edge_index`'s order.
        """
        from torch_geometric.data import Data

        slot = torch.empty(2, 0, dtype=torch.long, device=self.row.device)
        data = Data(y=self.y, edge_index=slot, num_nodes=self.num_nodes)
        if with_features:
            data.x = self.x
        return attach_csc(data, CSC(self.colptr, self.row, perm=None, edge_index=slot,
                                    host_colptr=self.host_colptr))

    def loader_nodes(self, nodes: Tensor) -> Tensor:
        return nodes

    def summary(self) -> str:
        return (f"{self.name}: {self.num_nodes:,} nodes, {self.num_edges:,} edges, "
                f"{self.num_features} features, {self.num_classes} classes, "
                f"train/val/test {self.train_idx.numel():,}/{self.val_idx.numel():,}/"
                f"{self.test_idx.numel():,}")

    @classmethod
    def from_edge_index(
        cls,
        name: str,
        edge_index: Tensor,
        x: Tensor,
        y: Tensor,
        train_idx: Tensor,
        val_idx: Tensor,
        test_idx: Tensor,
        num_classes: Optional[int] = None,
        add_reverse: bool = False,
    ) -> "ConvertedGraph":
        """Validates a (source, destination) edge list with node data and converts it to CSC.

        ``add_reverse=True`` makes the graph undirected (for graphs stored one way only) as
        PyG's ``ToUndirected`` does: the edges and their reverses, each pair once
        (:func:`undirected_edges`; a copy of the edge list, so meant for small graphs).

        Raises:
            DatasetError: if any shape, range or split is wrong (the message says which).
        """
        edge_index = torch.as_tensor(edge_index)
        if edge_index.dim() != 2 or edge_index.size(0) != 2:
            raise DatasetError(f"{name}: edge_index must have shape [2, num_edges], got "
                               f"{tuple(edge_index.shape)}.")
        if torch.is_floating_point(edge_index) or edge_index.dtype == torch.bool:
            raise DatasetError(f"{name}: edge_index must hold integer node ids, got "
                               f"{edge_index.dtype}.")
        src, dst = edge_index  # any integer type: converted a chunk at a time
        if add_reverse:
            src, dst = undirected_edges(as_signed_ids(src, "edge_index", name),
                                        as_signed_ids(dst, "edge_index", name))
        return cls.from_edge_chunks(name, edge_chunks(src, dst), x, y, train_idx, val_idx,
                                    test_idx, num_classes)

    @classmethod
    def from_edge_chunks(
        cls,
        name: str,
        edges: EdgeChunks,
        x: Tensor,
        y: Tensor,
        train_idx: Tensor,
        val_idx: Tensor,
        test_idx: Tensor,
        num_classes: Optional[int] = None,
    ) -> "ConvertedGraph":
        """:meth:`from_edge_index` for edges that come in chunks (read from a file, or
        generated): the conversion never holds more than one chunk beyond its output.

        Each node's in-edges keep their input order; the edge order itself is not kept (the
        store's edge ids are CSC positions). Ids of any integer type are taken (int64 where
        another type cannot be read as it is); features keep a stored half precision
        (:data:`HALF_FEATURES`) and become float32 otherwise.
        """
        x = torch.as_tensor(x)
        y = torch.as_tensor(y)
        splits = [torch.as_tensor(s).view(-1) for s in (train_idx, val_idx, test_idx)]
        splits = [as_signed_ids(s, f"split {split}", name) for s, split in zip(splits, SPLITS)]
        if not (torch.is_floating_point(y) or y.dtype == torch.bool):
            y = as_signed_ids(y, "labels y", name)  # min/max exist for every signed type
        validate_node_data(name, x, y, splits)
        if torch.is_floating_point(y):
            # NaN marks an unlabelled node (OGB's convention); checked and clamped while still
            # floats, since int64 conversion wraps labels of 2**63 or more to negative ones.
            y = torch.nan_to_num(y, nan=-1.0).clamp(min=-1)
        top = int(y.max())
        if num_classes is None:
            num_classes = top + 1
        elif top >= num_classes:
            raise DatasetError(f"{name}: label {top} is out of range for "
                               f"{num_classes} classes; labels must lie in [0, {num_classes}).")
        # Unlabeled nodes outside every split may carry any negative label; mark them -1.
        y = y.view(-1).long().clamp(min=-1)
        if num_classes < 2:
            raise DatasetError(f"{name}: every labelled node has label 0, so there is one class "
                               "and nothing to classify; node classification needs labels of "
                               "at least 2 classes (store num_classes if some have no node).")

        def id_chunks() -> Iterator[tuple[Tensor, Tensor]]:
            for src, dst in edges():
                yield (as_signed_ids(src, "edge_index", name),
                       as_signed_ids(dst, "edge_index", name))

        try:
            csc = csc_from_chunks(id_chunks, x.size(0), keep_perm=False,
                                  out_of_range_fix=f"x has {x.size(0)} rows, one per node: fix "
                                  "the ids, or give the missing nodes rows in x and y.")
        except DatasetError:
            raise
        except ValueError as err:
            raise DatasetError(f"{name}: {err}") from None
        return cls(
            name=name,
            colptr=csc.colptr,
            row=csc.row,
            x=x.to(feature_dtype_for(x.dtype)).contiguous(),
            y=y.contiguous(),
            train_idx=splits[0].long().contiguous(),
            val_idx=splits[1].long().contiguous(),
            test_idx=splits[2].long().contiguous(),
            num_classes=int(num_classes),
        )

    def save_npz(self, path: str | Path) -> Path:
        """Exports to the neutral ``.npz`` format (``edge_index, x, y, train_idx, val_idx,
        test_idx``) that ``--dataset path.npz`` and the DGL variant both read."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp.npz")
        # numpy has no bfloat16: features stored so for a bf16 run are written as float32.
        arrays = {k: (v.float() if v.dtype == torch.bfloat16 else v).numpy()
                  for k, v in self.tensors().items() if k in NPZ_KEYS}
        arrays["edge_index"] = self.edge_index().numpy()
        np.savez(tmp, num_classes=np.int64(self.num_classes), **arrays)
        tmp.replace(path)
        return path
