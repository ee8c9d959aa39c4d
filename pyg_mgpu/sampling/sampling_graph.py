"""The graph as the sampler's walk reads it: per edge type, a CSC, the draws' weights and the
edges' time order.

Every input becomes one :class:`SamplingGraph`: a ``HeteroData`` (its node and edge types), a
``Data`` (one node type, :data:`NODE`, and one edge type, :data:`EDGE`) or a
``(FeatureStore, GraphStore)`` pair of either kind. Backward sampling walks each edge type from
its source: the type's transposed CSC under the reversed type (:attr:`SamplingGraph.edge_types`),
with outputs, :attr:`SamplingGraph.perm` and the time and weight inputs keyed by the graph's own
edge types (:attr:`SamplingGraph.original`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
from torch import Tensor
from torch_geometric.data import Data, HeteroData

from pyg_mgpu.data.csc import (CSC, csc_of, edge_type_csc, edit_counts, share_data,
                               stamp_of_copy, stamp_to_copy)
from pyg_mgpu.sampling import remote, temporal
from pyg_mgpu.sampling.numbering import lookup_type, unseen
from pyg_mgpu.sampling.weighted import EdgeWeights, edge_weights

# A homogeneous graph's one node type and one edge type (its own reverse).
NODE = "node"
EDGE = (NODE, "to", NODE)


class SamplingGraph:
    """Per edge type: CSC pointers (:attr:`csc`), sources in draw order (:attr:`row`: by time
    within each run where the type is temporal), CSC position -> caller's edge id
    (:attr:`perm`), draw weights, and per node type the walk's scratch lookup arrays."""

    def __init__(self, node_types: list, edge_types: list, num_nodes: dict, csc: dict,
                 weights: dict, node_time: Optional[dict], edge_time: Optional[dict], *,
                 backward: bool, share_memory: bool, time_attr: Optional[str] = None):
        self.node_types = list(node_types)
        self.num_nodes = num_nodes
        self.node_time, self.edge_time = node_time, edge_time
        self.backward = backward
        self.edge_types = ([_reverse(et) for et in edge_types] if backward
                           else list(edge_types))
        self.original = dict(zip(self.edge_types, edge_types))  # walked -> graph's own
        self.csc = {walked: csc[et] for walked, et in self.original.items()}
        self.weights = {walked: weights.get(et) for walked, et in self.original.items()}
        # Temporal: each edge type whose sources (or edges) have timestamps gets its sources
        # and edge ids sorted by time in every run (built once per CSC and time tensor); the
        # others are drawn from unbounded.
        self.by_time: dict[tuple, temporal.TemporalCSC] = {}
        for walked, et in self.original.items():
            src_time = (node_time or {}).get(walked[0])
            e_time = (edge_time or {}).get(et)
            if src_time is not None or e_time is not None:
                self.by_time[walked] = time_order(self.csc[walked], src_time, e_time,
                                                  time_attr)
        self.row = {walked: (self.by_time[walked].row if walked in self.by_time else c.row)
                    for walked, c in self.csc.items()}
        self.perm = {et: (self.by_time[walked].perm if walked in self.by_time
                          else self.csc[walked].perm) for walked, et in self.original.items()}
        if share_memory:
            for c in [*self.csc.values(), *self.by_time.values(),
                      *(w for w in self.weights.values() if w is not None)]:
                if not c.tensors()[0].is_cuda:
                    c.share_memory_()
        # Floyd's offsets are below a degree: int32 holds them whenever the edge count does.
        self.offset_type = {et: torch.int32 if c.row.numel() < 2**31 else torch.int64
                            for et, c in self.csc.items()}
        self.lookup_type = {t: lookup_type(n) for t, n in num_nodes.items()}
        # The pointers where the host reads them (None where it cannot): on a GPU, the walk's
        # first hop is planned there from seeds on the host (NeighborSampler.first_hop).
        self.host_colptr = {walked: c.colptr if not c.colptr.is_cuda else c.host_colptr
                            for walked, c in self.csc.items()}
        self.lookups: dict = {}  # node type -> scratch; per process, never pickled

    @property
    def device(self) -> torch.device:
        return (next(iter(self.csc.values())).colptr.device if self.csc
                else torch.device("cpu"))

    @property
    def is_temporal(self) -> bool:
        return self.node_time is not None or self.edge_time is not None

    def lookup(self, node_type, copies: int = 1) -> Tensor:
        """The node type's scratch array for :class:`~.numbering.JointIds` (``copies`` of it
        end to end for :class:`~.numbering.BatchIds`): global id -> local id, every entry
        unseen between batches.

        One array per node type, sized for the most copies asked for so far: fewer copies (an
        epoch's last, shorter walk; a one-batch walk) are its first entries, never a second
        array. :func:`~.numbering.max_batches_per_walk` bounds the copies a walk asks for."""
        size = self.num_nodes[node_type] * copies
        lookup = self.lookups.get(node_type)
        if lookup is None or lookup.device != self.device or lookup.numel() < size:
            self.lookups.pop(node_type, None)  # freed before its successor is allocated
            dtype = self.lookup_type[node_type] if copies == 1 else lookup_type(size)
            lookup = torch.full((size,), unseen(dtype), dtype=dtype, device=self.device)
            self.lookups[node_type] = lookup
        return lookup[:size]

    def __getstate__(self) -> dict:
        # DataLoader workers build their own scratch arrays.
        return {**self.__dict__, "lookups": {}}


def _reverse(edge_type: tuple) -> tuple:
    return edge_type[2], edge_type[1], edge_type[0]


def from_data(data: Data, *, is_sorted: bool, share_memory: bool, weight_attr: Optional[str],
              replace: bool, time_attr: Optional[str], backward: bool) -> SamplingGraph:
    """A ``Data`` (or a homogeneous ``(FeatureStore, GraphStore)``) as one node and edge type;
    its CSC is the one cached with ``data`` (:func:`~pyg_mgpu.data.csc.csc_of`)."""
    node_time = edge_time = None
    if remote.is_remote(data):
        num_nodes, csc, node_time, edge_time = remote.homogeneous_graph(
            data, "backward" if backward else "forward", time_attr)
        weights = None
    else:
        num_nodes = data.num_nodes
        if time_attr is not None:
            node_time, edge_time = temporal.time_of(data, time_attr)
        csc = csc_of(data, is_sorted=is_sorted, transpose=backward)
        weights = csc_weights(data, weight_attr, csc, replace)
    return SamplingGraph([NODE], [EDGE], {NODE: num_nodes}, {EDGE: csc}, {EDGE: weights},
                         None if node_time is None else {NODE: node_time},
                         None if edge_time is None else {EDGE: edge_time},
                         backward=backward, share_memory=share_memory, time_attr=time_attr)


def from_hetero(data, *, is_sorted: bool, share_memory: bool, weight_attr: Optional[str],
                replace: bool, time_attr: Optional[str], backward: bool) -> SamplingGraph:
    """A ``HeteroData`` (or a heterogeneous ``(FeatureStore, GraphStore)``): each edge type's
    CSC cached with its edge store; weighted draws on the edge types holding ``weight_attr``,
    uniform on the others."""
    node_time = edge_time = None
    if remote.is_remote(data):  # the store's own conversion
        node_types, edge_types, num_nodes, csc = remote.hetero_graph(data, backward)
        weights = {}
        if time_attr is not None:
            node_time, edge_time = remote.hetero_times(data, time_attr)
    else:
        node_types, edge_types = data.metadata()
        num_nodes = {t: data[t].num_nodes for t in node_types}
        csc = {et: edge_type_csc(data, et, is_sorted, transpose=backward) for et in edge_types}
        weights = {et: csc_weights(data[et], weight_attr, c, replace)
                   for et, c in csc.items()
                   if weight_attr is not None and weight_attr in data[et]}
        if time_attr is not None:
            node_time, edge_time = hetero_time(data, time_attr)
    return SamplingGraph(node_types, edge_types, num_nodes, csc, weights, node_time, edge_time,
                         backward=backward, share_memory=share_memory, time_attr=time_attr)


def share_sampling(data: Data | HeteroData, *, time_attr: Optional[str] = None,
                   weight_attr: Optional[str] = None, replace: bool = False,
                   sample_direction: str = "forward") -> Data | HeteroData:
    """Builds once what samplers over ``data`` with these options read, and moves it, with
    every tensor of ``data``, to shared memory: the CSC (one per edge type), and, with
    ``time_attr``, each run sorted by time, with ``weight_attr``, the weights' forms for
    draws with (``replace``) or without replacement.

    They are kept with ``data`` (:func:`derived`), so every later sampler over it reads these
    copies: call it in the parent before :func:`pyg_mgpu.spawn` (which shares the CSC, and
    what is already built with it, but cannot build these) and every rank maps the same pages
    instead of building its own. A ``NeighborLoader`` built in the parent before ``spawn``
    builds them too.

    Example:
        In the parent, before starting the ranks (``pyg_mgpu.spawn(train, args=(data,))``):

        >>> from torch_geometric.data import Data
        >>> data = Data(edge_index=torch.tensor([[1, 2, 0], [0, 0, 1]]), t=torch.arange(3),
        ...             num_nodes=3)
        >>> data = pyg_mgpu.share_sampling(data, time_attr="t")
        >>> data.t.is_shared()
        True
    """
    if sample_direction not in ("forward", "backward"):
        raise ValueError(f"sample_direction must be 'forward' or 'backward', got "
                         f"{sample_direction!r}.")
    if not isinstance(data, (Data, HeteroData)):
        raise TypeError(f"share_sampling shares a Data or a HeteroData, got "
                        f"{type(data).__name__}.")
    if time_attr is not None and sample_direction == "backward":  # as NeighborSampler
        raise NotImplementedError("Temporal Sampling not yet supported for backward sampling")
    build = from_hetero if isinstance(data, HeteroData) else from_data
    build(data, is_sorted=False, share_memory=True, weight_attr=weight_attr,
          replace=replace, time_attr=time_attr, backward=sample_direction == "backward")
    return share_data(data)


def csc_weights(data, weight_attr: Optional[str], csc: CSC,
                replace: bool) -> Optional[EdgeWeights]:
    """The sampling weights in CSC order, in the forms the draws read (for draws with
    replacement a float64 running sum per run, 8 bytes per edge: only built when needed),
    built once per CSC and weight tensor (:func:`derived`)."""
    if weight_attr is None:
        return None
    if weight_attr not in data or not isinstance(data[weight_attr], Tensor):
        raise ValueError(f"weight_attr={weight_attr!r} is not a tensor attribute of the graph.")
    weight = data[weight_attr]
    if weight.dim() != 1 or weight.numel() != csc.num_edges:
        raise ValueError(f"weight_attr={weight_attr!r} must hold one weight per edge, shape "
                         f"[{csc.num_edges}], got {tuple(weight.shape)}.")
    return derived(csc, ("weights", weight_attr, replace), (weight,),
                   lambda: _edge_weights(weight, weight_attr, csc, replace))


def _edge_weights(weight: Tensor, weight_attr: str, csc: CSC, replace: bool) -> EdgeWeights:
    # float64 weights stay float64, as pyg-lib keeps the caller's type: in float32 a weight
    # below ~1e-45 would be 0 and one above ~3.4e38 infinite. Narrower types are read as
    # float32, the type of the keys' random draws.
    if weight.dtype != torch.float64:
        weight = weight.float()
    if bool((weight < 0).any()) or not bool(torch.isfinite(weight).all()):
        raise ValueError(f"weight_attr={weight_attr!r} holds negative or non-finite weights; "
                         "sampling weights must be finite and >= 0.")
    weight = weight.to(csc.row.device)
    if csc.perm is not None:
        weight = weight.index_select(0, csc.perm)
    return edge_weights(weight, csc.colptr, replace)


def time_order(csc: CSC, node_time: Optional[Tensor], edge_time: Optional[Tensor],
               time_attr: Optional[str] = None) -> temporal.TemporalCSC:
    """``csc``'s runs sorted by the sources' (``node_time``) or the edges' (``edge_time``)
    timestamps (:func:`~.temporal.sort_by_time`), built once per CSC and time tensor
    (:func:`derived`)."""
    kind, time = ("node", node_time) if node_time is not None else ("edge", edge_time)
    return derived(csc, ("time order", time_attr, kind), (time,),
                   lambda: temporal.sort_by_time(csc, node_time, edge_time))


@dataclass
class Derived:
    """A structure built from a CSC and other ``inputs``, kept with the CSC (:func:`derived`),
    with the inputs' edit counts when it was built."""
    inputs: tuple
    value: Any
    stamp: tuple  # the inputs' edit_counts before the build read them

    def __getstate__(self) -> dict:
        return {**self.__dict__, "stamp": stamp_to_copy(self.stamp, self.inputs)}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.stamp = stamp_of_copy(self.stamp, self.inputs)

    def share_memory_(self) -> "Derived":
        """Moves ``value``'s tensors to shared memory (what :func:`~pyg_mgpu.data.csc.share_data`
        calls on each structure in a CSC's ``derived``)."""
        self.value.share_memory_()
        return self


def derived(csc: CSC, key: tuple, inputs: tuple, build: Callable[[], Any]) -> Any:
    """What ``build`` makes from ``csc`` and ``inputs`` (tensors), built once and kept with
    ``csc`` under ``key``, until one of ``inputs`` is replaced.

    Kept with the CSC, it goes wherever the CSC goes: every sampler over the same ``Data``
    (train and evaluation loaders) reads one copy, :func:`~pyg_mgpu.data.csc.share_data`
    moves it to shared memory with the CSC, so spawned ranks map the parent's pages, and
    batches drop it with the CSC. A new ``edge_index`` means a new CSC, and so a new build;
    a time or weight tensor replaced since (compared by identity, as the CSC's
    ``edge_index``), or changed in place (:func:`~pyg_mgpu.data.csc.edit_counts`), is built
    again.
    """
    forms = csc.derived
    entry = forms.get(key)
    if entry is not None and len(entry.inputs) == len(inputs) and all(
            a is b for a, b in zip(entry.inputs, inputs)) and entry.stamp == edit_counts(inputs):
        return entry.value
    forms.pop(key, None)  # the stale one is freed before its successor is built
    stamp = edit_counts(inputs)  # before the build reads them
    value = build()
    forms[key] = Derived(inputs, value, stamp)
    return value


def hetero_time(data: HeteroData, time_attr: str) -> tuple[Optional[dict], Optional[dict]]:
    """``(node_time, edge_time)``: ``time_attr`` per node type or per edge type, where the
    stores hold it (PyG's rule: on node stores or on edge stores, not both)."""
    node_time = {t: data[t][time_attr] for t in data.node_types if time_attr in data[t]}
    edge_time = {et: data[et][time_attr] for et in data.edge_types if time_attr in data[et]}
    if node_time and edge_time:
        raise ValueError(f"The time attribute '{time_attr}' holds both node-level and "
                         "edge-level information")
    if not node_time and not edge_time:
        raise ValueError(f"The time attribute '{time_attr}' is neither a node-level or "
                         "edge-level attribute")
    for key, value in {**node_time, **edge_time}.items():
        size = data[key].num_nodes if key in node_time else data[key].num_edges
        if value.dim() != 1 or value.numel() != size:
            raise ValueError(f"time_attr={time_attr!r} of {key} must hold one timestamp per "
                             f"{'node' if key in node_time else 'edge'} ([{size}]), got "
                             f"{tuple(value.shape)}.")
    return node_time or None, edge_time or None
