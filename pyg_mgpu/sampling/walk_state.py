"""What the sampler's walk (:mod:`.walk`) carries from stage to stage: one :class:`WalkState`.

Per node type: the nodes sampled so far, hop by hop, their trees, the frontier the next hop
draws for and, on the GPU's path, the hop numbered but not yet counted (:class:`PendingHop`).
Per edge type: the edges drawn so far. :meth:`WalkState.number` and :meth:`WalkState.settle`
are the stages that change them; :meth:`WalkState.output` is the walk's result.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple, Optional, Union

import torch
from torch import Tensor
from torch_geometric.sampler import HeteroSamplerOutput

from pyg_mgpu.gpu_path import positions_of
from pyg_mgpu.sampling.induced import induced_edges
from pyg_mgpu.sampling.numbering import BatchIds, DisjointIds, JointIds
from pyg_mgpu.sampling.sampling_graph import SamplingGraph

Numbering = Union[JointIds, DisjointIds, BatchIds]


class Frontier(NamedTuple):
    """The nodes of one type that the next hop draws for: ``nodes`` (global ids), their
    ``trees``, and their local ids, ``start + position``, or on the GPU's path ``local`` per
    position with ``active`` marking the positions that draw (each new node's first one)."""

    nodes: Tensor
    trees: Optional[Tensor]
    start: int
    local: Optional[Tensor] = None
    active: Optional[Tensor] = None

    def local_ids(self, positions: Tensor) -> Tensor:
        """The local ids of the frontier's ``positions`` (overwritten where that serves)."""
        if self.local is None:
            return positions.add_(self.start)
        return self.local.index_select(0, positions)


class PendingHop(NamedTuple):
    """One node type's neighbours of a hop, numbered but not yet counted (the GPU's path):
    the count waits for the next read of sizes, and the new nodes stay where the hop found
    them until then."""

    nbr: Tensor
    """The hop's neighbours of this type (global ids), in the order they were drawn."""
    trees: Optional[Tensor]
    """Each neighbour's tree or batch; None when the walk keeps none."""
    first: Tensor
    """bool: the positions that introduce a new node (its first appearance)."""


class Drawn(NamedTuple):
    """One edge type's draws of a hop, as its source type's numbering takes them."""

    edge_type: tuple
    nbr: Tensor
    """The drawn edges' sources (global ids, int64)."""
    trees: Optional[Tensor]
    """Their destinations' trees (a source joins the tree it was reached from)."""


@dataclass
class WalkState:
    """A walk over ``graph`` so far. Hop by hop, :attr:`nodes` and :attr:`trees` gain the new
    nodes, :attr:`rows`, :attr:`cols` and :attr:`edges` the drawn edges, and the counts one
    entry per hop."""

    graph: SamplingGraph
    ids: Numbering
    """The batch's local ids per node type (:mod:`.numbering`)."""
    with_trees: bool
    """Whether every node carries its tree (disjoint) or its batch (several in one walk)."""
    deferred: bool
    """Whether a hop's new nodes wait in :attr:`pending` for the next read of sizes (the
    GPU's path, joint numbering): one wait for the GPU per hop."""
    nodes: dict = field(init=False)
    """Node type -> its sampled nodes (global ids), one tensor per hop."""
    trees: dict = field(init=False)
    """Node type -> the trees of :attr:`nodes` (None entries without trees)."""
    num_sampled_nodes: Optional[dict] = field(init=False)
    """Node type -> its new nodes per hop, the seeds first (host ints)."""
    rows: dict = field(init=False)
    """Edge type -> local ids of the drawn edges' sources, one tensor per hop."""
    cols: dict = field(init=False)
    """Edge type -> local ids of the drawn edges' destinations."""
    edges: dict = field(init=False)
    """Edge type -> the drawn edges' CSC positions."""
    num_sampled_edges: Optional[dict] = field(init=False)
    """Edge type -> its drawn edges per hop (host ints)."""
    frontier: dict = field(init=False, default_factory=dict)
    """Node type -> the :class:`Frontier` of the next hop."""
    pending: dict = field(init=False, default_factory=dict)
    """Node type -> its :class:`PendingHop`, until :meth:`settle` counts it."""
    empty: Tensor = field(init=False)
    """int64, no entries, on the graph's device: what a type or hop without nodes holds."""

    def __post_init__(self) -> None:
        node_types, edge_types = self.graph.node_types, self.graph.edge_types
        self.nodes = {t: [] for t in node_types}
        self.trees = {t: [] for t in node_types}
        self.num_sampled_nodes = {t: [] for t in node_types}
        self.rows = {et: [] for et in edge_types}
        self.cols = {et: [] for et in edge_types}
        self.edges = {et: [] for et in edge_types}
        self.num_sampled_edges = {et: [] for et in edge_types}
        self.empty = torch.empty(0, dtype=torch.long, device=self.graph.device)

    def cat(self, parts: list) -> Tensor:
        """``parts`` as one tensor (no copy for one part)."""
        if len(parts) == 1:
            return parts[0]
        return torch.cat(parts) if parts else self.empty

    def add_seeds(self, seed: dict) -> None:
        """The seeds per node type (a type without any has none): the walk's hop 0 and the
        first hop's frontier."""
        for t in self.graph.node_types:
            s = seed.get(t)
            s = s if s is not None else self.empty
            tree = self.ids.seeds(t, s)
            self.nodes[t].append(s)
            self.trees[t].append(tree)
            self.frontier[t] = Frontier(s, tree, 0)
            self.num_sampled_nodes[t].append(s.numel())

    def pending_counts(self) -> list[Tensor]:
        """Per type of :attr:`pending`, its new-node count (``[1]``), to read with other sizes."""
        return [hop.first.sum().view(1) for hop in self.pending.values()]

    def number(self, drawn: dict) -> None:
        """One hop's drawn neighbours (source type -> its edge types' :class:`Drawn`) numbered,
        one numbering per source type: the neighbours of its edge types, in the graph's order,
        get the ids that numbering them type by type would give. Its new nodes are the type's
        next frontier; a type no edge type leaves has none. The hop's new nodes are counted
        here, or wait in :attr:`pending` (:attr:`deferred`)."""
        start_of_hop = dict(self.ids.count)
        self.frontier = {t: Frontier(self.empty, self.empty if self.with_trees else None,
                                     start_of_hop[t]) for t in self.graph.node_types}
        for t, parts in drawn.items():
            nbr = self.cat([part.nbr for part in parts])
            tree = self.cat([part.trees for part in parts]) if self.with_trees else None
            if self.deferred:
                local, first = (self.ids.number_deferred(t, nbr) if tree is None else
                                self.ids.number_deferred(t, nbr, tree))
                self.pending[t] = PendingHop(nbr, tree, first)
                self.frontier[t] = Frontier(nbr, tree, start_of_hop[t], local, first)
            else:
                local, new, new_tree = self.ids.number(t, nbr, tree)
                self.nodes[t].append(new)
                self.trees[t].append(new_tree)
                self.frontier[t] = Frontier(new, new_tree, start_of_hop[t])
            for part, part_local in zip(parts, local.split([p.nbr.numel() for p in parts])):
                self.rows[part.edge_type].append(part_local)
        if not self.pending:  # counted now: not deferred, or nothing drawn to count later
            for t in self.graph.node_types:
                self.num_sampled_nodes[t].append(self.ids.count[t] - start_of_hop[t])

    def settle(self, counts: list[int]) -> None:
        """The pending hop's new nodes, now that their counts (per type of :attr:`pending`, in
        its order) are on the host: they join :attr:`nodes` in order of first appearance, and
        the hop its :attr:`num_sampled_nodes`. Nothing when no hop is pending."""
        if not self.pending:
            return
        new_per_type = dict(zip(self.pending, counts))
        for t, n in new_per_type.items():
            hop = self.pending[t]
            picked = positions_of(hop.first, n)
            self.nodes[t].append(hop.nbr.index_select(0, picked))
            self.trees[t].append(None if hop.trees is None else hop.trees.index_select(0, picked))
            self.ids.count[t] += n
        for t in self.graph.node_types:
            self.num_sampled_nodes[t].append(new_per_type.get(t, 0))
        self.pending = {}

    def induce(self) -> None:
        """Every edge among the sampled nodes in place of the drawn ones, and no per-hop counts
        (as PyG's). Reads the numbering's lookups, so it runs before the numbering closes."""
        for t in self.graph.node_types:
            self.nodes[t] = [self.cat(self.nodes[t])]
        graph = self.graph
        for et in graph.edge_types:
            row, col, edge = induced_edges(graph.csc[et].colptr, graph.row[et],
                                           self.nodes[et[2]][0], graph.lookup(et[0]),
                                           graph.offset_type[et])
            self.rows[et], self.cols[et], self.edges[et] = [row], [col], [edge]
        self.num_sampled_nodes = self.num_sampled_edges = None

    def output(self) -> HeteroSamplerOutput:
        """PyG's ``HeteroSamplerOutput`` of the walk, keyed by the graph's own edge types (each
        edge turned back on a backward walk): ``row`` int64."""
        node_types, edge_types = self.graph.node_types, self.graph.edge_types
        node = {t: self.cat(self.nodes[t]) for t in node_types}
        row = {et: self.cat(self.rows[et]).long() for et in edge_types}
        col = {et: self.cat(self.cols[et]) for et in edge_types}
        if self.graph.backward:  # each edge back in its own direction, under its own type
            row, col = col, row
        restore = self.graph.original
        num_sampled_edges = self.num_sampled_edges
        return HeteroSamplerOutput(
            node=node,
            row={restore[et]: v for et, v in row.items()},
            col={restore[et]: v for et, v in col.items()},
            edge={restore[et]: self.cat(self.edges[et]) for et in edge_types},
            batch={t: self.cat(self.trees[t]) for t in node_types} if self.with_trees else None,
            num_sampled_nodes=self.num_sampled_nodes,
            num_sampled_edges=(None if num_sampled_edges is None else
                               {restore[et]: v for et, v in num_sampled_edges.items()}))
