"""The sampler's multi-hop walk: one loop for every graph and mode.

PyG's rules (pyg-lib's ``hetero_neighbor_sample``; a homogeneous graph is one node type and one
edge type): at hop ``i``, for every edge type ``(src, rel, dst)`` in the graph's order, each
``dst`` node reached in the previous hop (the seeds, at the first hop) draws
``fanouts[edge_type][i]`` of its in-edges of that type with
:func:`~pyg_mgpu.sampling.draws.hop_edges`; the sources not yet in the batch join the ``src``
nodes, in order of first appearance across the hop's edge types, and are the ``src`` frontier of
the next hop. The modes are parameters of the same loop:

- joint or disjoint trees: the numbering (:mod:`~pyg_mgpu.sampling.numbering`);
- temporal: each tree's time bounds the edges its nodes may draw
  (:func:`~pyg_mgpu.sampling.temporal.eligible_runs`), on the edge types with timestamps;
- induced: every edge among the sampled nodes replaces the drawn ones at the end;
- backward: the graph's transposed CSCs (:class:`~.sampling_graph.SamplingGraph`), each edge
  turned back at the end.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor
from torch_geometric.sampler import HeteroSamplerOutput

from pyg_mgpu.sampling import temporal
from pyg_mgpu.sampling.draws import hop_edges
from pyg_mgpu.sampling.induced import induced_edges
from pyg_mgpu.sampling.numbering import BatchIds, DisjointIds, JointIds
from pyg_mgpu.sampling.sampling_graph import SamplingGraph


def walk(graph: SamplingGraph, seed: dict, fanouts: dict, *, replace: bool,
         generator: torch.Generator, disjoint: bool = False, induced: bool = False,
         tree_time: Optional[Tensor] = None, strategy: str = "uniform",
         seed_batch: Optional[dict] = None, num_batches: int = 1) -> HeteroSamplerOutput:
    """The batch around ``seed`` (int64 node ids per type, on the graph's device).

    Args:
        fanouts: Per walked edge type, the neighbours to draw at each hop (``-1``: all).
        disjoint: One tree per seed position (tree ``i``: the ``i``-th seed of each type).
        seed_batch: Several joint batches in one walk (``disjoint`` False): each seed's batch
            per type, ``0 .. num_batches - 1``; the output's ``batch`` says whose each node
            is (:mod:`.batches` splits it).
        tree_time: The time bounding each tree (temporal sampling; implies ``disjoint``).
        strategy: Temporal: ``"uniform"`` among the eligible edges, or ``"last"``.

    Returns:
        PyG's ``HeteroSamplerOutput`` keyed by the graph's own edge types: ``row`` int64.
    """
    device = graph.device
    num_hops = len(next(iter(fanouts.values()))) if fanouts else 0
    num_trees = max((s.numel() for s in seed.values()), default=0)
    if disjoint:
        ids = DisjointIds(graph.num_nodes, num_trees)
    elif seed_batch is not None:
        ids = BatchIds(lambda t: graph.lookup(t, copies=num_batches), graph.num_nodes,
                       seed_batch)
    else:
        ids = JointIds(graph.lookup)
    # Every node carries its tree (disjoint), or its batch (several in one walk).
    with_trees = disjoint or seed_batch is not None
    node_types, edge_types = graph.node_types, graph.edge_types
    nodes = {t: [] for t in node_types}
    trees = {t: [] for t in node_types}
    frontier = {}  # node type -> (its nodes of the previous hop, their trees, first local id)
    num_sampled_nodes = {t: [] for t in node_types}
    rows = {et: [] for et in edge_types}
    cols = {et: [] for et in edge_types}
    edges = {et: [] for et in edge_types}
    num_sampled_edges = {et: [] for et in edge_types}

    def cat(parts: list) -> Tensor:
        if len(parts) == 1:
            return parts[0]
        return torch.cat(parts) if parts else torch.empty(0, dtype=torch.long, device=device)

    try:
        for t in node_types:
            s = seed.get(t)
            s = s if s is not None else torch.empty(0, dtype=torch.long, device=device)
            tree = ids.seeds(t, s)
            nodes[t].append(s)
            trees[t].append(tree)
            frontier[t] = (s, tree, 0)
            num_sampled_nodes[t].append(s.numel())
        for hop in range(num_hops):
            start_of_hop = dict(ids.count)
            drawn = {}  # source type -> its edge types' (edge type, neighbours, trees)
            for et in edge_types:
                dst, dst_tree, dst_start = frontier[et[2]]
                local_dst, edge = _draw(graph, et, dst, dst_tree, int(fanouts[et][hop]),
                                        replace=replace, generator=generator,
                                        tree_time=tree_time, strategy=strategy)
                # int64 from here on: scatter and index_copy take no int32 index.
                nbr = graph.row[et].index_select(0, edge).long()
                nbr_tree = None if dst_tree is None else dst_tree.index_select(0, local_dst)
                drawn.setdefault(et[0], []).append((et, nbr, nbr_tree))
                cols[et].append(local_dst.add_(dst_start))
                edges[et].append(edge)
                num_sampled_edges[et].append(edge.numel())
            # One numbering per source type: the neighbours of its edge types, in the graph's
            # order, get the ids that numbering them type by type would give. Its new nodes
            # are the type's next frontier; a type no edge type leaves has none.
            frontier = {t: (cat([]), cat([]) if with_trees else None, start_of_hop[t])
                        for t in node_types}
            for t, parts in drawn.items():
                local, new, new_tree = ids.number(
                    t, cat([nbr for _, nbr, _ in parts]),
                    cat([tree for _, _, tree in parts]) if with_trees else None)
                nodes[t].append(new)
                trees[t].append(new_tree)
                frontier[t] = (new, new_tree, start_of_hop[t])
                sizes = [nbr.numel() for _, nbr, _ in parts]
                for (et, _, _), part in zip(parts, local.split(sizes)):
                    rows[et].append(part)
            for t in node_types:
                num_sampled_nodes[t].append(ids.count[t] - start_of_hop[t])
        node = {t: cat(nodes[t]) for t in node_types}
        if induced:  # every edge among the sampled nodes; no per-hop counts (as PyG's)
            for et in edge_types:
                row, col, edge = induced_edges(graph.csc[et].colptr, graph.row[et],
                                               node[et[2]], graph.lookup(et[0]),
                                               graph.offset_type[et])
                rows[et], cols[et], edges[et] = [row], [col], [edge]
            num_sampled_nodes = num_sampled_edges = None
    finally:
        ids.close()
    row = {et: cat(rows[et]).long() for et in edge_types}
    col = {et: cat(cols[et]) for et in edge_types}
    if graph.backward:  # each edge back in its own direction, under its own type
        row, col = col, row
    restore = graph.original
    return HeteroSamplerOutput(
        node=node,
        row={restore[et]: v for et, v in row.items()},
        col={restore[et]: v for et, v in col.items()},
        edge={restore[et]: cat(edges[et]) for et in edge_types},
        batch={t: cat(trees[t]) for t in node_types} if with_trees else None,
        num_sampled_nodes=num_sampled_nodes,
        num_sampled_edges=(None if num_sampled_edges is None else
                           {restore[et]: v for et, v in num_sampled_edges.items()}))


def _draw(graph: SamplingGraph, edge_type: tuple, dst: Tensor, dst_tree: Optional[Tensor],
          fanout: int, *, replace: bool, generator: torch.Generator,
          tree_time: Optional[Tensor], strategy: str) -> tuple[Tensor, Tensor]:
    """One edge type's draws for one hop: (position of each edge's destination in ``dst``,
    the edge's CSC position)."""
    if fanout == 0 or dst.numel() == 0:
        empty = torch.empty(0, dtype=torch.long, device=dst.device)
        return empty, empty
    csc, runs = graph.csc[edge_type], None
    by_time = graph.by_time.get(edge_type)
    if by_time is not None and tree_time is not None:  # no edge later than its tree's time
        runs, fanout = temporal.eligible_runs(csc.colptr, by_time, dst,
                                              tree_time.index_select(0, dst_tree), fanout,
                                              strategy)
    return hop_edges(csc.colptr, dst, fanout, replace=replace, weights=graph.weights[edge_type],
                     generator=generator, offset_type=graph.offset_type[edge_type], runs=runs)
