"""The sampler's multi-hop walk: one loop for every graph and mode.

PyG's rules (pyg-lib's ``hetero_neighbor_sample``; a homogeneous graph is one node type and one
edge type): at hop ``i``, for every edge type ``(src, rel, dst)`` in the graph's order, each
``dst`` node reached in the previous hop (the seeds, at the first hop) draws
``fanouts[edge_type][i]`` of its in-edges of that type (:func:`~.draws.plan_hop`, then
:func:`~.draws.draw_hop`); the sources not yet in the batch join the ``src`` nodes, in order of
first appearance across the hop's edge types, and are the ``src`` frontier of the next hop.
The modes are parameters of the same loop:

- joint or disjoint trees: the numbering (:mod:`~pyg_mgpu.sampling.numbering`);
- temporal: each tree's time bounds the edges its nodes may draw
  (:func:`~pyg_mgpu.sampling.temporal.eligible_runs`), on the edge types with timestamps;
- induced: every edge among the sampled nodes replaces the drawn ones at the end;
- backward: the graph's transposed CSCs (:class:`~.sampling_graph.SamplingGraph`), each edge
  turned back at the end.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch
from torch import Tensor
from torch_geometric.sampler import HeteroSamplerOutput

from pyg_mgpu.gpu_path import host_ints, host_work, positions_of, takes_gpu_path, to_device
from pyg_mgpu.sampling import temporal
from pyg_mgpu.sampling.draws import HopPlan, draw_hop, plan_hop
from pyg_mgpu.sampling.induced import induced_edges
from pyg_mgpu.sampling.numbering import BatchIds, DisjointIds, JointIds
from pyg_mgpu.sampling.sampling_graph import SamplingGraph


def walk(graph: SamplingGraph, seed: dict, fanouts: dict, *, replace: bool,
         generator: torch.Generator, disjoint: bool = False, induced: bool = False,
         tree_time: Optional[Tensor] = None, strategy: str = "uniform",
         seed_batch: Optional[dict] = None, num_batches: int = 1,
         last_read=None, first_hop: Optional[dict] = None) -> HeteroSamplerOutput:
    """The batch around ``seed`` (int64 node ids per type, on the graph's device).

    Args:
        fanouts: Per walked edge type, the neighbours to draw at each hop (``-1``: all).
        disjoint: One tree per seed position (tree ``i``: the ``i``-th seed of each type).
        seed_batch: Several joint batches in one walk (``disjoint`` False): each seed's batch
            per type, ``0 .. num_batches - 1``; the output's ``batch`` says whose each node
            is (:mod:`.batches` splits it).
        tree_time: The time bounding each tree (temporal sampling; implies ``disjoint``).
        strategy: Temporal: ``"uniform"`` among the eligible edges, or ``"last"``.
        last_read: On the GPU's path, sizes the caller wants read with the walk's last read
            (``request(trees, pending, cols, num_sampled_nodes, num_sampled_edges)`` gives
            them as a tensor, before the last hop's new nodes are counted; their values land
            in its ``values``): :class:`~.batches.BatchCounts`.
        first_hop: Per edge type, its first hop's plan and sizes, made by the caller
            (``(plan or None, num_edges, num_drawing)``: :func:`plan_on_host`); the hop then
            reads nothing from the device.

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
    # On the GPU's path a hop's new nodes stay where the hop found them, marked, until the next
    # hop's one read of sizes tells how many there are: one wait for the GPU per hop.
    gpu = any(takes_gpu_path(s) for s in seed.values())
    deferred = gpu and not disjoint
    node_types, edge_types = graph.node_types, graph.edge_types
    nodes = {t: [] for t in node_types}
    trees = {t: [] for t in node_types}
    frontier: dict = {}  # node type -> its Frontier
    pending: dict = {}  # node type -> (nbr, trees, first) numbered but not counted (deferred)
    num_sampled_nodes = {t: [] for t in node_types}
    rows = {et: [] for et in edge_types}
    cols = {et: [] for et in edge_types}
    edges = {et: [] for et in edge_types}
    num_sampled_edges = {et: [] for et in edge_types}
    empty = torch.empty(0, dtype=torch.long, device=device)

    def cat(parts: list) -> Tensor:
        if len(parts) == 1:
            return parts[0]
        return torch.cat(parts) if parts else empty

    def settle(counts: list) -> None:
        """The pending hop's new nodes, now that their counts are on the host."""
        new_per_type = dict(zip(pending, counts))
        for t, n in new_per_type.items():
            nbr, tree, first = pending[t]
            picked = positions_of(first, n)
            nodes[t].append(nbr.index_select(0, picked))
            trees[t].append(None if tree is None else tree.index_select(0, picked))
            ids.count[t] += n
        for t in node_types:
            num_sampled_nodes[t].append(new_per_type.get(t, 0))
        pending.clear()

    try:
        for t in node_types:
            s = seed.get(t)
            s = s if s is not None else empty
            tree = ids.seeds(t, s)
            nodes[t].append(s)
            trees[t].append(tree)
            frontier[t] = Frontier(s, tree, 0)
            num_sampled_nodes[t].append(s.numel())
        for hop in range(num_hops):
            given = first_hop if hop == 0 and first_hop is not None else {}
            plans = {et: given[et][0] if et in given else
                     _plan(graph, et, frontier[et[2]], int(fanouts[et][hop]), replace=replace,
                           tree_time=tree_time, strategy=strategy)
                     for et in edge_types}
            # The GPU's one read per hop: its draws' sizes (unless the caller planned them),
            # and the previous hop's new-node counts. (The CPU's ops find the sizes themselves.)
            sizes = [plan.sizes for et, plan in plans.items()
                     if plan is not None and et not in given] if gpu else []
            sizes += [first.sum().view(1) for _, _, first in pending.values()]
            sizes = host_ints(torch.cat(sizes)) if sizes else []
            if pending:
                settle(sizes[len(sizes) - len(pending):])
            start_of_hop = dict(ids.count)
            drawn = {}  # source type -> its edge types' (edge type, neighbours, trees)
            for et, plan in plans.items():
                f = frontier[et[2]]
                if plan is None:
                    local_dst = edge = empty
                else:
                    num_edges = num_drawing = None
                    if et in given:
                        num_edges, num_drawing = given[et][1:]
                    elif gpu:
                        num_edges, num_drawing, sizes = sizes[0], sizes[1], sizes[2:]
                    local_dst, edge = draw_hop(
                        plan, num_edges, num_drawing, replace=replace,
                        weights=graph.weights[et], generator=generator,
                        offset_type=graph.offset_type[et], dst=f.nodes)
                # int64 from here on: scatter and index_copy take no int32 index.
                nbr = graph.row[et].index_select(0, edge).long()
                nbr_tree = None if f.trees is None else f.trees.index_select(0, local_dst)
                drawn.setdefault(et[0], []).append((et, nbr, nbr_tree))
                cols[et].append(local_dst.add_(f.start) if f.local is None
                                else f.local.index_select(0, local_dst))
                edges[et].append(edge)
                num_sampled_edges[et].append(edge.numel())
            # One numbering per source type: the neighbours of its edge types, in the graph's
            # order, get the ids that numbering them type by type would give. Its new nodes
            # are the type's next frontier; a type no edge type leaves has none.
            frontier = {t: Frontier(empty, empty if with_trees else None, start_of_hop[t])
                        for t in node_types}
            for t, parts in drawn.items():
                nbr = cat([nbr for _, nbr, _ in parts])
                tree = cat([tree for _, _, tree in parts]) if with_trees else None
                if deferred:
                    local, first = (ids.number_deferred(t, nbr) if tree is None else
                                    ids.number_deferred(t, nbr, tree))
                    pending[t] = (nbr, tree, first)
                    frontier[t] = Frontier(nbr, tree, start_of_hop[t], local, first)
                else:
                    local, new, new_tree = ids.number(t, nbr, tree)
                    nodes[t].append(new)
                    trees[t].append(new_tree)
                    frontier[t] = Frontier(new, new_tree, start_of_hop[t])
                sizes_of = [nbr.numel() for _, nbr, _ in parts]
                for (et, _, _), part in zip(parts, local.split(sizes_of)):
                    rows[et].append(part)
            if not deferred:
                for t in node_types:
                    num_sampled_nodes[t].append(ids.count[t] - start_of_hop[t])
            elif not pending:  # no type drew a neighbour
                settle([])
        if pending:  # the last hop's new nodes: the walk's last read
            counts = [first.sum().view(1) for _, _, first in pending.values()]
            extra = [] if last_read is None else [last_read.request(
                {t: cat(trees[t]) for t in node_types}, dict(pending),
                {et: cat(cols[et]) for et in edge_types}, num_sampled_nodes,
                num_sampled_edges)]
            values = host_ints(torch.cat(counts + extra))
            if last_read is not None:
                last_read.values = values[len(counts):]
            settle(values[:len(counts)])
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


def plan_on_host(host_colptr: Tensor, seed: Tensor, fanout: int, *rows: Tensor,
                 replace: bool, device: torch.device) -> tuple[Tensor, tuple]:
    """The first hop's plan for ``seed`` (host ids), made on the host from the pointers'
    host copy and sent to ``device`` in one copy with ``rows`` (host tensors as long as
    ``seed``): ``(stacked, plan)``, where ``stacked`` holds ``seed`` and ``rows`` on
    ``device`` and ``plan`` is ``walk``'s ``first_hop`` entry. The host knows the hop's sizes
    without waiting for the GPU."""
    with host_work():
        plan = plan_hop(host_colptr, seed, fanout, replace=replace) \
            if fanout != 0 and seed.numel() else None
        parts = [seed, *rows]
        if plan is not None:
            num_edges, num_drawing = plan.sizes.tolist()
            parts += [plan.start, plan.deg, plan.count, plan.drawn.long()]
        stacked = torch.stack(parts)
    stacked = to_device(stacked, device)
    k = 1 + len(rows)
    if plan is None:
        return stacked, (None, 0, 0)
    start, deg, count, drawn = stacked[k:]
    return stacked[:k], (HopPlan(start, deg, count, drawn, fanout), num_edges, num_drawing)


class Frontier(NamedTuple):
    """The nodes of one type that the next hop draws for: ``nodes`` (global ids), their
    ``trees``, and their local ids, ``start + position``, or on the GPU's path ``local`` per
    position with ``active`` marking the positions that draw (each new node's first one)."""

    nodes: Tensor
    trees: Optional[Tensor]
    start: int
    local: Optional[Tensor] = None
    active: Optional[Tensor] = None


def _plan(graph: SamplingGraph, edge_type: tuple, frontier: Frontier, fanout: int, *,
          replace: bool, tree_time: Optional[Tensor], strategy: str) -> Optional[HopPlan]:
    """One edge type's draws for one hop, before their sizes are read; None if it draws
    nothing."""
    dst = frontier.nodes
    if fanout == 0 or dst.numel() == 0:
        return None
    csc, runs = graph.csc[edge_type], None
    by_time = graph.by_time.get(edge_type)
    if by_time is not None and tree_time is not None:  # no edge later than its tree's time
        runs, fanout = temporal.eligible_runs(csc.colptr, by_time, dst,
                                              tree_time.index_select(0, frontier.trees),
                                              fanout, strategy)
    return plan_hop(csc.colptr, dst, fanout, replace=replace, runs=runs,
                    active=frontier.active)
