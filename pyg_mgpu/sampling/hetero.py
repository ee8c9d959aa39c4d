"""Neighbour sampling over a ``HeteroData``, composed from the homogeneous per-hop draws.

PyG's rules (pyg-lib's ``hetero_neighbor_sample``): at hop ``i``, for every edge type
``(src, rel, dst)`` in the graph's order, each ``dst`` node reached in the previous hop (the seeds,
at the first hop) draws ``num_neighbors[edge_type][i]`` of its in-edges of that type, with
:func:`~pyg_mgpu.sampling.draws.hop_edges`; the sources not yet in the batch join the ``src``
nodes, in order of first appearance across the hop's edge types, and are the ``src`` frontier of
the next hop. Every edge type has its own CSC, built once and cached with its edge store.
"""
from __future__ import annotations

from typing import Optional, Union

import torch
from torch import Tensor
from torch_geometric.data import HeteroData
from torch_geometric.sampler import HeteroSamplerOutput
from torch_geometric.sampler.base import DataType, SubgraphType

from pyg_mgpu.data.csc import edge_type_csc
from pyg_mgpu.sampling import remote
from pyg_mgpu.sampling.draws import hop_edges
from pyg_mgpu.sampling.neighbor_sampler import (NeighborSampler, _csc_weights,
                                                _number_new_nodes, _unseen)

_UNSUPPORTED = ("pyg_mgpu samples HeteroData with subgraph_type 'directional' or "
                "'bidirectional', uniform or weighted draws, with or without replacement; "
                "{what} is not supported on heterogeneous graphs yet.")


def check_hetero_options(*, disjoint: bool, subgraph_type, time_attr: Optional[str],
                         sample_direction: str) -> None:
    if time_attr is not None and sample_direction == "backward":  # PyG's own refusal
        raise NotImplementedError("Temporal Sampling not yet supported for backward sampling")
    for flag, what in ((disjoint, "disjoint=True"),
                       (SubgraphType(subgraph_type) == SubgraphType.induced,
                        "subgraph_type='induced'"),
                       (time_attr is not None, "temporal sampling (time_attr)"),
                       (sample_direction != "forward", "sample_direction='backward'")):
        if flag:
            raise ValueError(_UNSUPPORTED.format(what=what))


class HeteroDraws:
    """The per-edge-type state of a heterogeneous sampler and its multi-hop walk."""

    def __init__(self, data, is_sorted: bool, share_memory: bool,
                 weight_attr: Optional[str] = None, replace: bool = False):
        if remote.is_remote(data):  # (FeatureStore, GraphStore): the store's own conversion
            if weight_attr is not None:  # as PyG's sampler
                raise NotImplementedError("'weight_attr' is not supported for "
                                          "'(FeatureStore, GraphStore)' inputs.")
            self.node_types, self.edge_types, self.num_nodes, self.csc = \
                remote.hetero_graph(data)
            self.weights = dict.fromkeys(self.csc)
        else:
            self.node_types, self.edge_types = data.metadata()
            self.num_nodes = {k: data[k].num_nodes for k in self.node_types}
            self.csc = {et: edge_type_csc(data, et, is_sorted) for et in self.edge_types}
            # Weighted draws on the edge types that hold weight_attr; uniform on the others.
            self.weights = {et: (_csc_weights(data[et], weight_attr, csc, replace)
                                 if weight_attr is not None and weight_attr in data[et]
                                 else None) for et, csc in self.csc.items()}
        if share_memory:
            for csc in self.csc.values():
                if not csc.row.is_cuda:
                    csc.share_memory_()
        self.perm = {et: csc.perm for et, csc in self.csc.items()}
        self._lookups: dict[str, Tensor] = {}

    @property
    def device(self) -> torch.device:
        return next(iter(self.csc.values())).colptr.device if self.csc else torch.device("cpu")

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

    def sample(self, seed: dict, fanouts: dict, *, replace: bool,
               generator: torch.Generator) -> HeteroSamplerOutput:
        num_hops = len(next(iter(fanouts.values()))) if fanouts else 0
        nodes = {t: [] for t in self.node_types}
        count = dict.fromkeys(self.node_types, 0)  # nodes of each type in the batch so far
        frontier = {}  # node type -> (its nodes of the previous hop, their first local id)
        num_sampled_nodes = {t: [] for t in self.node_types}
        for t in self.node_types:
            s = seed.get(t)
            s = (s.to(self.device, torch.long) if s is not None
                 else torch.empty(0, dtype=torch.long, device=self.device))
            lookup = self._lookup(t)
            lookup.scatter_reduce_(0, s, torch.arange(s.numel(), device=self.device),
                                   reduce="amin")
            nodes[t].append(s)
            count[t] = s.numel()
            frontier[t] = (s, 0)
            num_sampled_nodes[t].append(s.numel())
        rows = {et: [] for et in self.edge_types}
        cols = {et: [] for et in self.edge_types}
        edges = {et: [] for et in self.edge_types}
        num_sampled_edges = {et: [] for et in self.edge_types}
        touched = None  # (node type, neighbours) whose lookup entries may be mid-update

        def cat(parts: list) -> Tensor:
            return (torch.cat(parts) if parts else
                    torch.empty(0, dtype=torch.long, device=self.device))

        try:
            for hop in range(num_hops):
                added = dict.fromkeys(self.node_types, 0)
                start_of_hop = dict(count)
                parts_before = {t: len(nodes[t]) for t in self.node_types}
                for et in self.edge_types:
                    src_type, _, dst_type = et
                    dst_nodes, dst_start = frontier[dst_type]
                    fanout = int(fanouts[et][hop])
                    csc = self.csc[et]
                    if fanout == 0 or dst_nodes.numel() == 0:
                        local_dst = edge = torch.empty(0, dtype=torch.long, device=self.device)
                    else:
                        local_dst, edge = hop_edges(csc.colptr, dst_nodes, fanout,
                                                    replace=replace, weights=self.weights[et],
                                                    generator=generator)
                    nbr = csc.row.index_select(0, edge).long()
                    lookup = self._lookup(src_type)
                    touched = (src_type, nbr)
                    new = _number_new_nodes(nbr, lookup, count[src_type])
                    touched = None
                    nodes[src_type].append(new)
                    count[src_type] += new.numel()
                    added[src_type] += new.numel()
                    rows[et].append(lookup.index_select(0, nbr))
                    cols[et].append(local_dst + dst_start)
                    edges[et].append(edge)
                    num_sampled_edges[et].append(edge.numel())
                for t in self.node_types:  # this hop's new nodes are the next frontier
                    num_sampled_nodes[t].append(added[t])
                    frontier[t] = (cat(nodes[t][parts_before[t]:]), start_of_hop[t])
        finally:
            for t in self.node_types:  # leave the scratch arrays clean for the next batch
                if nodes[t]:
                    self._lookup(t).index_fill_(0, torch.cat(nodes[t]), _unseen(torch.int64))
            if touched is not None:  # an error mid-hop: those entries may hold offers
                self._lookup(touched[0]).index_fill_(0, touched[1], _unseen(torch.int64))
        return HeteroSamplerOutput(
            node={t: cat(nodes[t]) for t in self.node_types},
            row={et: cat(rows[et]) for et in self.edge_types},
            col={et: cat(cols[et]) for et in self.edge_types},
            edge={et: cat(edges[et]) for et in self.edge_types},
            batch=None,
            num_sampled_nodes=num_sampled_nodes,
            num_sampled_edges=num_sampled_edges)


class HeteroNeighborSampler(NeighborSampler):
    """``pyg_mgpu.NeighborSampler`` on a ``HeteroData``: ``NeighborSampler(hetero_data, ...)``
    builds one of these, as PyG's class takes both kinds of graph.

    ``num_neighbors`` is a list (every edge type) or a dict per edge type, as in PyG; seeds come
    per node type (PyG's loaders pass ``input_nodes=(node_type, index_or_mask)``). Outputs are
    PyG's ``HeteroSamplerOutput``: per type ``node`` (seeds first, then each hop's new nodes),
    ``row``/``col`` (local ids into the source and destination types' nodes), ``edge`` (CSC
    positions; :attr:`edge_permutation` names the caller's edges), and per-hop counts that
    PyG's ``trim_to_layer`` reads.
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
                             time_attr=time_attr, sample_direction=sample_direction)
        self.data_type = DataType.remote if remote.is_remote(data) else DataType.heterogeneous
        self.sample_direction = sample_direction
        self.draws = HeteroDraws(data, is_sorted, share_memory, weight_attr, replace)
        self.node_types, self.edge_types = self.draws.node_types, self.draws.edge_types
        self.num_nodes = self.draws.num_nodes
        self.node_time = self.edge_time = None
        self.perm = self.draws.perm
        self.weights = None
        self.num_neighbors = num_neighbors  # PyG's setter: a NumNeighbors
        self.num_neighbors.get_values(self.edge_types)  # checks the edge types and hop counts
        self.replace = replace
        self.subgraph_type = SubgraphType(subgraph_type)
        self.disjoint = False
        self.temporal_strategy = temporal_strategy
        self.keep_orig_edges = False
        self._start_generator(seed)

    @property
    def device(self) -> torch.device:
        return self.draws.device

    @property
    def fanouts(self) -> dict:
        """Neighbours per hop, per edge type."""
        return self.num_neighbors.get_values(self.edge_types)

    def _sample(self, seed, seed_time=None, **kwargs) -> HeteroSamplerOutput:
        if not isinstance(seed, dict):
            raise ValueError("a HeteroData sampler takes its seeds per node type: use "
                             "input_nodes=(node_type, index_or_mask).")
        if seed_time is not None:
            raise ValueError(_UNSUPPORTED.format(what="temporal sampling (input_time)"))
        self._reseed_in_worker()
        return self.draws.sample(seed, self.fanouts, replace=self.replace,
                                 generator=self.generator)
