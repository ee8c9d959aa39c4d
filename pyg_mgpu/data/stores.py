"""The converted-graph cache through PyG's remote-backend interfaces: a ``(FeatureStore,
GraphStore)`` pair that PyG's loaders, and :class:`pyg_mgpu.NeighborLoader`, sample from.

The graph store hands out the cache's own CSC (``GraphStore.csc()`` converts nothing), and the
feature store gathers rows of the features and labels as batches ask for them. Opened with
``placement="mmap"`` (the default), both stay in the cache's files: the kernel pages in what
batches read, so a graph larger than RAM or ``/dev/shm`` is reachable from a script, as
``--features-on mmap`` makes it for the CLI. Both stores travel to spawned ranks as the files'
paths, which each rank maps again: no copy is pickled.

    graph = pyg_mgpu.data.open_stores("ogbn-products", root="data")
    loader = pyg_mgpu.NeighborLoader(graph.stores, [15, 10], input_nodes=graph.train_idx,
                                     batch_size=1024, shuffle=True)
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from torch import Tensor
from torch_geometric.data import EdgeAttr, FeatureStore, GraphStore, TensorAttr
from torch_geometric.data.graph_store import EdgeLayout

from pyg_mgpu.data.cache import default_cache_dir
from pyg_mgpu.data.datasets import load_graph
from pyg_mgpu.data.graph import ConvertedGraph
from pyg_mgpu.data.synthetic import SyntheticSpec

_READ_ONLY = ("{kind} over the converted-graph cache is read-only; build a {pyg} of your own "
              "(e.g. torch_geometric.testing's in-memory ones) to change the graph.")


class CachedFeatureStore(FeatureStore):
    """Node features ``x`` and labels ``y`` of a converted graph (one node type, no group)."""

    def __init__(self, graph: ConvertedGraph):
        super().__init__()
        self.graph = graph

    def _tensor(self, attr: TensorAttr) -> Optional[Tensor]:
        if attr.attr_name in ("x", "y") and attr.group_name is None:
            return getattr(self.graph, attr.attr_name)
        return None

    def _get_tensor(self, attr: TensorAttr) -> Optional[Tensor]:
        tensor = self._tensor(attr)
        if tensor is None or attr.index is None:
            return tensor
        return tensor[attr.index]  # reads only these rows' pages of a mapped file

    def _get_tensor_size(self, attr: TensorAttr) -> Optional[tuple[int, ...]]:
        tensor = self._tensor(attr)
        return None if tensor is None else tuple(tensor.shape)

    def get_all_tensor_attrs(self) -> list[TensorAttr]:
        return [TensorAttr(group_name=None, attr_name=name) for name in ("x", "y")]

    def _put_tensor(self, tensor, attr: TensorAttr) -> bool:
        raise NotImplementedError(_READ_ONLY.format(kind="CachedFeatureStore", pyg="FeatureStore"))

    def _remove_tensor(self, attr: TensorAttr) -> bool:
        raise NotImplementedError(_READ_ONLY.format(kind="CachedFeatureStore", pyg="FeatureStore"))


class CachedGraphStore(GraphStore):
    """The edges of a converted graph, as the one CSC edge index the cache holds (sorted by
    destination; ``csc()`` returns it without a conversion or an edge permutation)."""

    def __init__(self, graph: ConvertedGraph):
        super().__init__()
        self.graph = graph

    def _attr(self) -> EdgeAttr:
        n = self.graph.num_nodes
        return EdgeAttr(edge_type=None, layout=EdgeLayout.CSC, is_sorted=True, size=(n, n))

    def get_all_edge_attrs(self) -> list[EdgeAttr]:
        return [self._attr()]

    def _get_edge_index(self, edge_attr: EdgeAttr) -> Optional[tuple[Tensor, Tensor]]:
        if edge_attr.edge_type is not None or edge_attr.layout != EdgeLayout.CSC:
            return None  # PyG's csr()/coo() convert from the CSC
        return self.graph.row, self.graph.colptr

    def _put_edge_index(self, edge_index, edge_attr: EdgeAttr) -> bool:
        raise NotImplementedError(_READ_ONLY.format(kind="CachedGraphStore", pyg="GraphStore"))

    def _remove_edge_index(self, edge_attr: EdgeAttr) -> bool:
        raise NotImplementedError(_READ_ONLY.format(kind="CachedGraphStore", pyg="GraphStore"))


class CachedGraph:
    """A converted graph's stores and what a training script needs beside them.

    It pickles as the converted graph, whose mapped tensors travel as their files' paths.
    """

    def __init__(self, graph: ConvertedGraph):
        self.graph = graph
        self.feature_store = CachedFeatureStore(graph)
        self.graph_store = CachedGraphStore(graph)

    @property
    def stores(self) -> tuple[CachedFeatureStore, CachedGraphStore]:
        """The ``(FeatureStore, GraphStore)`` pair PyG's loaders take as ``data``."""
        return self.feature_store, self.graph_store

    @property
    def train_idx(self) -> Tensor:
        return self.graph.train_idx

    @property
    def val_idx(self) -> Tensor:
        return self.graph.val_idx

    @property
    def test_idx(self) -> Tensor:
        return self.graph.test_idx

    @property
    def num_classes(self) -> int:
        return self.graph.num_classes

    def __getstate__(self) -> dict:
        return {"graph": self.graph}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["graph"])


def open_stores(name: str, root: str | Path | None = None, *, seed: int = 0,
                synthetic: Optional[SyntheticSpec] = None,
                cache_dir: str | Path | None = None,
                placement: Optional[str] = "mmap") -> CachedGraph:
    """Opens a dataset's converted graph (converting it into the cache first if needed) as a
    ``(FeatureStore, GraphStore)`` pair.

    Args:
        name, root, seed, synthetic: As for :func:`pyg_mgpu.load_dataset` (homogeneous
            datasets).
        cache_dir: The graph cache (default ``$PYG_MGPU_CACHE/graphs``, else
            ``~/.cache/pyg_mgpu/graphs``).
        placement: ``mmap`` (the cache's files, paged in as read), ``shm`` (a copy in
            ``/dev/shm``), ``tensors`` (shared-memory tensors), or None (``shm`` if it fits).

    Example:
        >>> import tempfile
        >>> from pyg_mgpu.data.stores import open_stores
        >>> from pyg_mgpu.data.synthetic import SyntheticSpec
        >>> graph = open_stores("synthetic", synthetic=SyntheticSpec(
        ...     num_nodes=100, num_edges=1000, num_features=8, num_classes=3),
        ...     cache_dir=tempfile.mkdtemp())
        >>> loader = pyg_mgpu.NeighborLoader(graph.stores, [5, 5], batch_size=10,
        ...                                  input_nodes=graph.train_idx)
        >>> batch = next(iter(loader))
        >>> batch.x.shape[1], batch.batch_size
        (8, 10)
    """
    graph = load_graph(name, root, seed=seed, synthetic=synthetic,
                       cache_dir=cache_dir or default_cache_dir(), placement=placement)
    return CachedGraph(graph)
