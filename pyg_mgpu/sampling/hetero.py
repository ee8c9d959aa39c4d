"""Neighbour sampling over a ``HeteroData``, composed from the homogeneous per-hop draws.

PyG's rules (pyg-lib's ``hetero_neighbor_sample``): at hop ``i``, for every edge type
``(src, rel, dst)`` in the graph's order, each ``dst`` node reached in the previous hop (the seeds,
at the first hop) draws ``num_neighbors[edge_type][i]`` of its in-edges of that type, with
:func:`~pyg_mgpu.sampling.draws.hop_edges`; the sources not yet in the batch join the ``src``
nodes, in order of first appearance across the hop's edge types, and are the ``src`` frontier of
the next hop. Every edge type has its own CSC, built once and cached with its edge store.

The homogeneous sampler's options carry over edge type by edge type: ``disjoint`` (a tree per
seed position, numbered per seed type, with the homogeneous sampler's (tree, node) keys per node
type), temporal sampling (each edge type's CSC sorted by time, the seeds' times bounding every
tree), ``induced`` (every edge of every type among the sampled nodes) and backward sampling
(each edge type walked from its source, as PyG does by reversing the edge types).
"""
from __future__ import annotations

from typing import Optional, Union

import torch
from torch import Tensor
from torch_geometric.data import HeteroData
from torch_geometric.sampler import HeteroSamplerOutput
from torch_geometric.sampler.base import DataType, SubgraphType

from pyg_mgpu.data.csc import edge_type_csc
from pyg_mgpu.sampling import remote, temporal
from pyg_mgpu.sampling.draws import hop_edges
from pyg_mgpu.sampling.neighbor_sampler import (NeighborSampler, _cat, _csc_weights,
                                                _number_new_nodes, _unseen, check_options,
                                                induced_edges)
from pyg_mgpu.sampling.tree_ids import TreeIds


def check_hetero_options(*, disjoint: bool, subgraph_type, time_attr: Optional[str],
                         weight_attr: Optional[str], sample_direction: str,
                         temporal_strategy: str) -> None:
    """PyG's refusals, in PyG's words where it has them."""
    check_options(time_attr, weight_attr, sample_direction, temporal_strategy)
    if SubgraphType(subgraph_type) == SubgraphType.induced and (disjoint or time_attr):
        raise ValueError("'disjoint' sampling (temporal sampling is disjoint) is not supported "
                         "with subgraph_type='induced' (neither is it in PyG); use "
                         "'directional' or 'bidirectional'.")


def _reverse(edge_type: tuple) -> tuple:
    return edge_type[2], edge_type[1], edge_type[0]


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


class _JointIds:
    """Local ids in a joint batch (each node of a type once): a lookup array per node type,
    left clean for the next batch by :meth:`close`."""

    def __init__(self, lookup):
        self.lookup = lookup  # node type -> its scratch array
        self.count: dict[str, int] = {}
        self._entered: list[tuple[str, Tensor]] = []

    def seeds(self, t: str, seed: Tensor) -> None:
        # A repeated seed keeps its first position (as pyg-lib).
        self._entered.append((t, seed))
        self.lookup(t).scatter_reduce_(0, seed, torch.arange(seed.numel(), device=seed.device),
                                       reduce="amin")
        self.count[t] = seed.numel()

    def number(self, t: str, nbr: Tensor, nbr_tree) -> tuple[Tensor, Tensor, None]:
        """(local ids of ``nbr``, the new nodes in order of first appearance, no trees)."""
        self._entered.append((t, nbr))  # offers may be left in these entries on an error
        new = _number_new_nodes(nbr, self.lookup(t), self.count[t])
        self.count[t] += new.numel()
        return self.lookup(t).index_select(0, nbr), new, None

    def close(self) -> None:
        for t, entered in self._entered:
            self.lookup(t).index_fill_(0, entered, _unseen(torch.int64))


class _DisjointIds:
    """Local ids in a disjoint batch: :class:`TreeIds` per node type, its seeds the trees'
    positions among that type's seeds."""

    def __init__(self, num_nodes: dict, num_trees: int):
        self.num_nodes, self.num_trees = num_nodes, num_trees
        self._ids: dict[str, TreeIds] = {}

    @property
    def count(self) -> dict[str, int]:
        return {t: ids.count for t, ids in self._ids.items()}

    def seeds(self, t: str, seed: Tensor) -> Tensor:
        self._ids[t] = TreeIds(seed, self.num_nodes[t], self.num_trees)
        return self._ids[t].seed_trees

    def number(self, t: str, nbr: Tensor, nbr_tree: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(local ids of ``nbr``, the new nodes in order of first appearance, their trees)."""
        return self._ids[t].number(nbr, nbr_tree)

    def close(self) -> None:
        pass


class HeteroDraws:
    """The per-edge-type state of a heterogeneous sampler and its multi-hop walk.

    :attr:`edge_types` are the types as walked: the graph's, or for backward sampling their
    reverses, each with its edge type's transposed CSC. Outputs, :attr:`perm` and the time and
    weight lookups are keyed by the graph's own edge types.
    """

    def __init__(self, data, *, is_sorted: bool, share_memory: bool,
                 weight_attr: Optional[str] = None, replace: bool = False,
                 time_attr: Optional[str] = None, backward: bool = False):
        self.node_time = self.edge_time = None
        if remote.is_remote(data):  # (FeatureStore, GraphStore): the store's own conversion
            if weight_attr is not None:  # as PyG's sampler
                raise NotImplementedError("'weight_attr' is not supported for "
                                          "'(FeatureStore, GraphStore)' inputs.")
            self.node_types, edge_types, self.num_nodes, csc = remote.hetero_graph(data, backward)
            weights = dict.fromkeys(csc)
            if time_attr is not None:
                self.node_time, self.edge_time = remote.hetero_times(data, time_attr)
        else:
            self.node_types, edge_types = data.metadata()
            self.num_nodes = {k: data[k].num_nodes for k in self.node_types}
            csc = {et: edge_type_csc(data, et, is_sorted, transpose=backward)
                   for et in edge_types}
            # Weighted draws on the edge types that hold weight_attr; uniform on the others.
            weights = {et: (_csc_weights(data[et], weight_attr, c, replace)
                            if weight_attr is not None and weight_attr in data[et] else None)
                       for et, c in csc.items()}
            if time_attr is not None:
                self.node_time, self.edge_time = hetero_time(data, time_attr)
        self.edge_types = [_reverse(et) for et in edge_types] if backward else list(edge_types)
        self.original = dict(zip(self.edge_types, edge_types))
        self.backward = backward
        self.csc = {walked: csc[et] for walked, et in self.original.items()}
        self.weights = {walked: weights[et] for walked, et in self.original.items()}
        # Temporal: each edge type whose sources (or edges) have timestamps gets its CSC
        # sorted by time in every run; the others are drawn from without a time bound.
        self.by_time: dict[tuple, temporal.TemporalCSC] = {}
        for walked, et in self.original.items():
            node_time = (self.node_time or {}).get(walked[0])
            edge_time = (self.edge_time or {}).get(et)
            if node_time is not None or edge_time is not None:
                self.by_time[walked] = temporal.sort_by_time(self.csc[walked], node_time,
                                                             edge_time)
        self.row = {walked: (self.by_time[walked].row if walked in self.by_time else c.row)
                    for walked, c in self.csc.items()}
        self.perm = {et: (self.by_time[walked].perm if walked in self.by_time
                          else self.csc[walked].perm) for walked, et in self.original.items()}
        if share_memory:
            for c in [*self.csc.values(), *self.by_time.values()]:
                if not c.row.is_cuda:
                    c.share_memory_()
        self._lookups: dict[str, Tensor] = {}

    @property
    def device(self) -> torch.device:
        return next(iter(self.csc.values())).colptr.device if self.csc else torch.device("cpu")

    @property
    def is_temporal(self) -> bool:
        return self.node_time is not None or self.edge_time is not None

    def __getstate__(self) -> dict:
        # DataLoader workers build their own scratch arrays; never pickle them.
        return {**self.__dict__, "_lookups": {}}

    def _lookup(self, node_type: str) -> Tensor:
        lookup = self._lookups.get(node_type)
        if lookup is None or lookup.device != self.device:
            lookup = torch.full((self.num_nodes[node_type],), _unseen(torch.int64),
                                dtype=torch.int64, device=self.device)
            self._lookups[node_type] = lookup
        return lookup

    def _draw(self, edge_type: tuple, dst: Tensor, dst_tree: Optional[Tensor], fanout: int, *,
              replace: bool, generator: torch.Generator, tree_time: Optional[Tensor],
              strategy: str) -> tuple[Tensor, Tensor]:
        if fanout == 0 or dst.numel() == 0:
            empty = torch.empty(0, dtype=torch.long, device=self.device)
            return empty, empty
        csc, runs = self.csc[edge_type], None
        by_time = self.by_time.get(edge_type)
        if by_time is not None and tree_time is not None:  # no edge later than its tree's time
            runs, fanout = temporal.eligible_runs(csc.colptr, by_time, dst,
                                                  tree_time.index_select(0, dst_tree), fanout,
                                                  strategy)
        return hop_edges(csc.colptr, dst, fanout, replace=replace,
                         weights=self.weights[edge_type], generator=generator, runs=runs)

    def sample(self, seed: dict, fanouts: dict, *, replace: bool, generator: torch.Generator,
               disjoint: bool = False, induced: bool = False,
               tree_time: Optional[Tensor] = None,
               strategy: str = "uniform") -> HeteroSamplerOutput:
        """The batch around ``seed`` (node ids per type). ``tree_time``: the time bounding each
        tree (indexed by a seed's position among its type's seeds), for temporal sampling."""
        num_hops = len(next(iter(fanouts.values()))) if fanouts else 0
        num_trees = max((len(s) for s in seed.values()), default=0)
        ids = _DisjointIds(self.num_nodes, num_trees) if disjoint else _JointIds(self._lookup)
        nodes = {t: [] for t in self.node_types}
        trees = {t: [] for t in self.node_types}
        frontier = {}  # node type -> (its nodes of the previous hop, their trees, first local id)
        num_sampled_nodes = {t: [] for t in self.node_types}
        rows = {et: [] for et in self.edge_types}
        cols = {et: [] for et in self.edge_types}
        edges = {et: [] for et in self.edge_types}
        num_sampled_edges = {et: [] for et in self.edge_types}

        def cat(parts: list) -> Tensor:
            return _cat(parts, self.device)

        try:
            for t in self.node_types:
                s = seed.get(t)
                s = (s.to(self.device, torch.long) if s is not None
                     else torch.empty(0, dtype=torch.long, device=self.device))
                tree = ids.seeds(t, s)
                nodes[t].append(s)
                trees[t].append(tree)
                frontier[t] = (s, tree, 0)
                num_sampled_nodes[t].append(s.numel())
            for hop in range(num_hops):
                start_of_hop = dict(ids.count)
                drawn = {}  # source type -> its edge types' (edge type, neighbours, trees)
                for et in self.edge_types:
                    dst, dst_tree, dst_start = frontier[et[2]]
                    local_dst, edge = self._draw(et, dst, dst_tree, int(fanouts[et][hop]),
                                                 replace=replace, generator=generator,
                                                 tree_time=tree_time, strategy=strategy)
                    nbr = self.row[et].index_select(0, edge).long()
                    nbr_tree = None if dst_tree is None else dst_tree.index_select(0, local_dst)
                    drawn.setdefault(et[0], []).append((et, nbr, nbr_tree))
                    cols[et].append(local_dst + dst_start)
                    edges[et].append(edge)
                    num_sampled_edges[et].append(edge.numel())
                # One numbering per source type: the neighbours of its edge types, in the
                # graph's order, get the ids that numbering them type by type would give.
                # Its new nodes are the type's next frontier; a type no edge type leaves has none.
                frontier = {t: (cat([]), cat([]) if disjoint else None, start_of_hop[t])
                            for t in self.node_types}
                for t, parts in drawn.items():
                    local, new, new_tree = ids.number(
                        t, torch.cat([nbr for _, nbr, _ in parts]),
                        torch.cat([tree for _, _, tree in parts]) if disjoint else None)
                    nodes[t].append(new)
                    trees[t].append(new_tree)
                    frontier[t] = (new, new_tree, start_of_hop[t])
                    sizes = [nbr.numel() for _, nbr, _ in parts]
                    for (et, _, _), part in zip(parts, local.split(sizes)):
                        rows[et].append(part)
                for t in self.node_types:
                    num_sampled_nodes[t].append(ids.count[t] - start_of_hop[t])
            node = {t: cat(nodes[t]) for t in self.node_types}
            if induced:  # every edge among the sampled nodes; no per-hop counts (as PyG's)
                for et in self.edge_types:
                    row, col, edge = induced_edges(self.csc[et].colptr, self.row[et],
                                                   node[et[2]], self._lookup(et[0]))
                    rows[et], cols[et], edges[et] = [row], [col], [edge]
                num_sampled_nodes = num_sampled_edges = None
        finally:
            ids.close()
        row = {et: cat(rows[et]) for et in self.edge_types}
        col = {et: cat(cols[et]) for et in self.edge_types}
        if self.backward:  # each edge back in its own direction, under its own type
            row, col = col, row
        restore = self.original
        return HeteroSamplerOutput(
            node=node,
            row={restore[et]: v for et, v in row.items()},
            col={restore[et]: v for et, v in col.items()},
            edge={restore[et]: cat(edges[et]) for et in self.edge_types},
            batch={t: cat(trees[t]) for t in self.node_types} if disjoint else None,
            num_sampled_nodes=num_sampled_nodes,
            num_sampled_edges=(None if num_sampled_edges is None else
                               {restore[et]: v for et, v in num_sampled_edges.items()}))


class HeteroNeighborSampler(NeighborSampler):
    """``pyg_mgpu.NeighborSampler`` on a ``HeteroData``: ``NeighborSampler(hetero_data, ...)``
    builds one of these, as PyG's class takes both kinds of graph.

    ``num_neighbors`` is a list (every edge type) or a dict per edge type, as in PyG; seeds come
    per node type (PyG's loaders pass ``input_nodes=(node_type, index_or_mask)``). Outputs are
    PyG's ``HeteroSamplerOutput``: per type ``node`` (seeds first, then each hop's new nodes),
    ``row``/``col`` (local ids into the source and destination types' nodes), ``edge`` (CSC
    positions; :attr:`edge_permutation` names the caller's edges), ``batch`` per type when
    disjoint, and per-hop counts that PyG's ``trim_to_layer`` reads.

    Temporal sampling (``time_attr`` on node stores or on edge stores) bounds each tree by its
    seed's time (``input_time``, else the seed's own timestamp) on every edge type whose
    sources (or edges) carry ``time_attr``; edge types without it are drawn from unbounded.
    """

    def __init__(
        self,
        data: HeteroData,
        num_neighbors,
        subgraph_type: Union[SubgraphType, str] = "directional",
        replace: bool = False,
        disjoint: bool = False,
        temporal_strategy: str = "uniform",
        time_attr: Optional[str] = None,
        weight_attr: Optional[str] = None,
        is_sorted: bool = False,
        share_memory: bool = False,
        directed: bool = True,
        sample_direction: str = "forward",
        *,
        seed: Optional[int] = None,
    ):
        if not directed:
            subgraph_type = SubgraphType.induced
        check_hetero_options(disjoint=disjoint, subgraph_type=subgraph_type,
                             time_attr=time_attr, weight_attr=weight_attr,
                             sample_direction=sample_direction,
                             temporal_strategy=temporal_strategy)
        self.data_type = DataType.remote if remote.is_remote(data) else DataType.heterogeneous
        self.sample_direction = sample_direction
        self.draws = HeteroDraws(data, is_sorted=is_sorted, share_memory=share_memory,
                                 weight_attr=weight_attr, replace=replace, time_attr=time_attr,
                                 backward=sample_direction == "backward")
        self.node_types, self.edge_types = self.draws.node_types, self.draws.edge_types
        self.num_nodes = self.draws.num_nodes
        self.node_time, self.edge_time = self.draws.node_time, self.draws.edge_time
        self.perm = self.draws.perm
        self.weights = None
        # PyG's setter reads this map in backward sampling: fanouts given per edge type name
        # the graph's edge types, and are kept under the walked (reversed) ones.
        self.to_backward_edge_type = {et: walked for walked, et in self.draws.original.items()}
        self.num_neighbors = num_neighbors  # PyG's setter: a NumNeighbors
        self.fanouts  # checks the edge types and hop counts
        self.replace = replace
        self.subgraph_type = SubgraphType(subgraph_type)
        self.disjoint = disjoint  # PyG's property: always True when temporal
        self.temporal_strategy = temporal_strategy
        self.keep_orig_edges = False
        self._start_generator(seed)

    @property
    def device(self) -> torch.device:
        return self.draws.device

    @property
    def fanouts(self) -> dict:
        """Neighbours per hop, per edge type (as walked: reversed for backward sampling;
        PyG's ``num_neighbors`` property gives back the caller's own keys)."""
        return self._num_neighbors.get_values(self.edge_types)

    def _tree_times(self, seed: dict, seed_time: Optional[dict]) -> Tensor:
        """The time bounding each tree: ``input_time`` where given, else the seed's own
        timestamp; tree ``i`` is the ``i``-th seed of each seed type."""
        times = None
        for t, s in seed.items():
            given = None if seed_time is None else seed_time.get(t)
            own = (self.node_time or {}).get(t)
            if given is None and own is None:
                raise ValueError(f"temporal sampling needs a time per seed of type {t!r}: pass "
                                 f"input_time, or give {t!r} nodes timestamps (time_attr).")
            seed_times = temporal.seed_times(s.to(self.device), given, own)
            if times is None:
                times = seed_times.new_zeros(max(v.numel() for v in seed.values()))
            times[:s.numel()] = seed_times
        return times

    def _sample(self, seed, seed_time=None, **kwargs) -> HeteroSamplerOutput:
        if not isinstance(seed, dict):
            raise ValueError("a HeteroData sampler takes its seeds per node type: use "
                             "input_nodes=(node_type, index_or_mask).")
        unknown = sorted(set(seed) - set(self.node_types))
        if unknown:
            raise ValueError(f"seeds of node type(s) {unknown}, which the graph does not have; "
                             f"its node types are {self.node_types}.")
        if seed_time is not None and not self.is_temporal:
            raise ValueError("input_time was given, but the sampler has no time_attr; pass "
                             "time_attr (the node or edge timestamps) for temporal sampling.")
        self._reseed_in_worker()
        tree_time = self._tree_times(seed, seed_time) if self.is_temporal else None
        return self.draws.sample(seed, self.fanouts, replace=self.replace,
                                 generator=self.generator, disjoint=self.disjoint,
                                 induced=self.subgraph_type == SubgraphType.induced,
                                 tree_time=tree_time, strategy=self.temporal_strategy)
