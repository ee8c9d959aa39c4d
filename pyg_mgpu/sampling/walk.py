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

Each hop is named stages over one :class:`~.walk_state.WalkState`: plan the draws
(:func:`plan_draws`), read their sizes with the previous hop's new-node counts
(:func:`read_sizes`; on the CPU the ops find them), settle the previous hop's new nodes
(:meth:`~.walk_state.WalkState.settle`), draw (:func:`draw`), and number the drawn neighbours
(:meth:`~.walk_state.WalkState.number`). The last hop's nodes are settled after the walk's
last read (:func:`read_last`).
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch
from torch import Tensor
from torch_geometric.sampler import HeteroSamplerOutput

from pyg_mgpu.gpu_path import host_ints, host_work, takes_gpu_path, to_device
from pyg_mgpu.sampling import temporal
from pyg_mgpu.sampling.draws import HopPlan, draw_hop, plan_hop
from pyg_mgpu.sampling.numbering import BatchIds, DisjointIds, JointIds
from pyg_mgpu.sampling.sampling_graph import SamplingGraph
from pyg_mgpu.sampling.walk_state import Drawn, Frontier, Numbering, WalkState


def walk(graph: SamplingGraph, seed: dict, fanouts: dict, *, replace: bool,
         generator: torch.Generator, disjoint: bool = False, induced: bool = False,
         tree_time: Optional[Tensor] = None, strategy: str = "uniform",
         seed_batch: Optional[dict] = None, num_batches: int = 1,
         last_read=None, first_hop: Optional[dict] = None) -> HeteroSamplerOutput:
    """The batch around ``seed`` (int64 node ids per type, on the graph's device).

    Args:
        fanouts: Per walked edge type, the neighbours to draw at each hop (``-1``: all).
        disjoint: One tree per seed, numbered over the seed types in turn.
        seed_batch: Several joint batches in one walk (``disjoint`` False): each seed's batch
            per type, ``0 .. num_batches - 1``; the output's ``batch`` says whose each node
            is (:mod:`.batches` splits it).
        tree_time: The time bounding each tree (temporal sampling; implies ``disjoint``).
        strategy: Temporal: ``"uniform"`` among the eligible edges, or ``"last"``.
        last_read: On the GPU's path, sizes the caller wants read with the walk's last read
            (``request(trees, pending, cols, num_sampled_nodes, num_sampled_edges)`` gives
            them as a tensor, before the last hop's new nodes are counted: ``pending`` holds
            a :class:`~.walk_state.PendingHop` per node type; ``receive`` takes their
            values): :class:`~.batches.BatchCounts`.
        first_hop: Per edge type, its first hop's plan and sizes, made by the caller
            (``(plan or None, num_edges, num_drawing)``: :func:`plan_on_host`); the hop then
            reads nothing from the device.

    Returns:
        PyG's ``HeteroSamplerOutput`` keyed by the graph's own edge types: ``row`` int64.
    """
    num_hops = len(next(iter(fanouts.values()))) if fanouts else 0
    gpu = any(takes_gpu_path(s) for s in seed.values())
    state = WalkState(graph, _numbering(graph, seed, disjoint, seed_batch, num_batches),
                      with_trees=disjoint or seed_batch is not None,
                      deferred=gpu and not disjoint)
    try:
        state.add_seeds(seed)
        for hop in range(num_hops):
            given = first_hop if hop == 0 and first_hop is not None else {}
            plans = plan_draws(state, fanouts, hop, given, replace=replace,
                               tree_time=tree_time, strategy=strategy)
            sizes = read_sizes(state, plans, given, gpu)
            state.settle(sizes.new_nodes)
            state.number(draw(state, plans, sizes.draws, replace=replace, generator=generator))
        state.settle(read_last(state, last_read))
        if induced:
            state.induce()
    finally:
        state.ids.close()
    return state.output()


def _numbering(graph: SamplingGraph, seed: dict, disjoint: bool, seed_batch: Optional[dict],
               num_batches: int) -> Numbering:
    """The walk's local ids: a tree per seed, a batch per ``seed_batch`` entry, or one
    batch."""
    if disjoint:
        return DisjointIds(graph.num_nodes, seed)
    if seed_batch is not None:
        return BatchIds(lambda t: graph.lookup(t, copies=num_batches), graph.num_nodes,
                        seed_batch)
    return JointIds(graph.lookup)


class HopSizes(NamedTuple):
    """What a hop's one read of sizes tells the host."""

    draws: dict
    """Edge type -> ``(num_edges, num_drawing)`` for :func:`~.draws.draw_hop` (None: found by
    the draws themselves, on the CPU)."""
    new_nodes: list
    """The pending hop's new-node counts, per type of :attr:`.WalkState.pending`."""


def plan_draws(state: WalkState, fanouts: dict, hop: int, given: dict, *, replace: bool,
               tree_time: Optional[Tensor], strategy: str) -> dict:
    """Edge type -> its draws at ``hop`` from its destination type's frontier, before their
    sizes are read (None: it draws nothing); ``given``'s plans where the caller made them."""
    return {et: given[et][0] if et in given else
            _plan(state.graph, et, state.frontier[et[2]], int(fanouts[et][hop]),
                  replace=replace, tree_time=tree_time, strategy=strategy)
            for et in state.graph.edge_types}


def read_sizes(state: WalkState, plans: dict, given: dict, gpu: bool) -> HopSizes:
    """The GPU's one read per hop: its draws' sizes (unless the caller planned them), and the
    previous hop's new-node counts. (The CPU's ops find the sizes themselves.)"""
    sizes = [plan.sizes for et, plan in plans.items()
             if plan is not None and et not in given] if gpu else []
    sizes += state.pending_counts()
    sizes = host_ints(torch.cat(sizes)) if sizes else []
    draws, read = {}, 0
    for et, plan in plans.items():
        if et in given:
            draws[et] = tuple(given[et][1:])
        elif gpu and plan is not None:
            draws[et] = (sizes[read], sizes[read + 1])
            read += 2
        else:
            draws[et] = (None, None)
    return HopSizes(draws, sizes[read:])


def draw(state: WalkState, plans: dict, sizes: dict, *, replace: bool,
         generator: torch.Generator) -> dict:
    """Makes the planned draws, given their ``sizes`` (:attr:`HopSizes.draws`): each edge type's
    edges join the state's, their sources are returned as source type -> its edge types'
    :class:`~.walk_state.Drawn`, in the graph's order, to be numbered."""
    graph, drawn = state.graph, {}
    for et, plan in plans.items():
        f = state.frontier[et[2]]
        if plan is None:
            local_dst = edge = state.empty
        else:
            local_dst, edge = draw_hop(
                plan, *sizes[et], replace=replace, weights=graph.weights[et],
                generator=generator, offset_type=graph.offset_type[et], dst=f.nodes)
        # int64 from here on: scatter and index_copy take no int32 index.
        nbr = graph.row[et].index_select(0, edge).long()
        nbr_tree = None if f.trees is None else f.trees.index_select(0, local_dst)
        drawn.setdefault(et[0], []).append(Drawn(et, nbr, nbr_tree))
        state.cols[et].append(f.local_ids(local_dst))
        state.edges[et].append(edge)
        state.num_sampled_edges[et].append(edge.numel())
    return drawn


def read_last(state: WalkState, last_read) -> list[int]:
    """The last hop's new-node counts (for :meth:`~.walk_state.WalkState.settle`), read with
    what ``last_read`` requests, whose values its ``receive`` takes: the walk's last read.
    Nothing to read when no hop is pending."""
    if not state.pending:
        return []
    counts = state.pending_counts()
    extra = [] if last_read is None else [last_read.request(
        {t: state.cat(state.trees[t]) for t in state.graph.node_types}, dict(state.pending),
        {et: state.cat(state.cols[et]) for et in state.graph.edge_types},
        state.num_sampled_nodes, state.num_sampled_edges)]
    values = host_ints(torch.cat(counts + extra))
    if last_read is not None:
        last_read.receive(values[len(counts):])
    return values[:len(counts)]


def plan_on_host(host_colptr: Tensor, seed: Tensor, fanout: int, *rows: Tensor,
                 replace: bool, device: torch.device) -> tuple[Tensor, tuple]:
    """The first hop's plan for ``seed`` (host ids), made on the host from the pointers'
    host copy and sent to ``device`` in one copy with ``rows`` (host tensors as long as
    ``seed``): ``(stacked, plan)``, where ``stacked`` holds ``seed`` and ``rows`` on
    ``device`` and ``plan`` is ``walk``'s ``first_hop`` entry. The host knows the hop's sizes
    without waiting for the GPU."""
    with host_work():
        plan = (plan_hop(host_colptr, seed, fanout, replace=replace)
                if fanout != 0 and seed.numel() else None)
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
                                              fanout, strategy, replace)
    return plan_hop(csc.colptr, dst, fanout, replace=replace, runs=runs,
                    active=frontier.active)
