"""Which in-edges of each frontier node one hop keeps: PyG's neighbour draws in plain torch.

Every function here is vectorized over the whole frontier (no per-node Python) and runs on the
device of the CSC it reads. All return, per kept edge, the frontier position of its destination
and its CSC position, grouped by destination in frontier order, which is the order PyG's
samplers emit. The draws follow ``pyg-lib``'s rules:

- ``fanout < 0``: every in-edge.
- without replacement: a node with at most ``fanout`` in-edges keeps all of them; a bigger one
  keeps exactly ``fanout`` distinct ones, each ``fanout``-subset equally likely (uniform) or drawn
  one by one with probability proportional to the remaining edges' weights (weighted).
- with replacement: ``fanout`` independent draws for every node that has in-edges, uniform or
  proportional to edge weight.

Weighted draws without replacement live in :mod:`pyg_mgpu.sampling.weighted`.
"""
from __future__ import annotations

import math
from typing import NamedTuple, Optional

import torch
from torch import Tensor

from pyg_mgpu.gpu_path import iota, positions_of, takes_gpu_path
from pyg_mgpu.sampling.weighted import EdgeWeights, weighted_without_replacement


class HopPlan(NamedTuple):
    """One hop's draws over a frontier before any is made: per frontier position its first
    in-edge (``start``), degree, edges to keep (``count``), and whether it draws at random
    (``drawn``: bool, or 0 and 1), and the ``fanout``; :attr:`sizes` are what the draws need the host to know."""

    start: Tensor
    deg: Tensor
    count: Tensor
    drawn: Tensor
    fanout: int

    @property
    def sizes(self) -> Tensor:
        """``[2]``: the edges kept and the nodes that draw, to read with other sizes at once
        (:func:`~pyg_mgpu.gpu_path.host_ints`)."""
        return torch.stack([self.count.sum(), self.drawn.sum()])


def plan_hop(colptr: Tensor, dst: Tensor, fanout: int, *, replace: bool = False,
             runs: Optional[tuple[Tensor, Tensor]] = None,
             active: Optional[Tensor] = None) -> HopPlan:
    """The draws of one hop over the in-edges of every node in ``dst``, before any is made;
    :func:`draw_hop` makes them, given the plan's sizes.

    Args:
        colptr: ``[N + 1]`` CSC pointers.
        dst: ``[M]`` int64 frontier nodes.
        fanout: Edges to draw per node; ``-1`` keeps every in-edge.
        replace: Draw with replacement.
        runs: ``(start, end)`` CSC positions per node of ``dst`` to draw from instead of its
            whole run (temporal sampling: the edges old enough).
        active: The frontier positions that draw, the others keeping nothing (a frontier not
            yet compacted).
    """
    if runs is None:
        start = colptr.index_select(0, dst)  # index_select, not tensor[index]: ~2.5x faster on CPU
        deg = colptr[1:].index_select(0, dst).sub_(start)
    else:
        start, deg = runs[0], runs[1] - runs[0]
    if fanout < 0:
        count = deg
    elif replace:
        count = torch.where(deg > 0, fanout, 0)
    else:
        count = deg.clamp(max=fanout)
    drawn = (deg > 0) if replace else (deg > fanout)
    if active is not None:
        count = count.mul(active)
        drawn = drawn.logical_and_(active)
    return HopPlan(start, deg, count, drawn, fanout)


def draw_hop(plan: HopPlan, num_edges: Optional[int], num_drawing: Optional[int], *,
             replace: bool = False, weights: Optional[EdgeWeights] = None,
             generator: Optional[torch.Generator] = None,
             offset_type: torch.dtype = torch.int64,
             dst: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    """The draws of ``plan``, given its :attr:`~HopPlan.sizes` as host numbers (``num_edges``
    kept, ``num_drawing`` nodes drawing): no further read from the device. None for both:
    the ops find them (the CPU's form, where reading them costs nothing).

    Args:
        weights: The edge weights from :func:`~pyg_mgpu.sampling.weighted.edge_weights`,
            for weighted draws.
        generator: Random generator on the CSC's device.
        offset_type: Integer type of Floyd's offsets (int32 when every degree fits).
        dst: The frontier, for weighted draws' per-node bounds.

    Returns:
        ``(local_dst, edge)``: position of each kept edge's destination in the frontier, and
        the edge's CSC position, both int64.
    """
    start, deg, count, fanout = plan.start, plan.deg, plan.count, plan.fanout
    local_dst = torch.repeat_interleave(count, output_size=num_edges)
    first_slot = torch.cumsum(count, 0).sub_(count)
    # Slot s of node v reads edge start[v] + (s - first_slot[v]): all of v's edges when it keeps
    # them all, else overwritten below by the random draws.
    edge = (start - first_slot).index_select(0, local_dst)
    edge.add_(iota(edge.numel(), start.device))
    if fanout < 0 or num_drawing == 0:
        return local_dst, edge
    big = (plan.drawn.nonzero().squeeze(1) if num_drawing is None else
           positions_of(plan.drawn, num_drawing))
    if big.numel() == 0:
        return local_dst, edge
    # Nodes that draw own exactly `fanout` consecutive slots from their first one.
    big_first, big_start = first_slot.index_select(0, big), start.index_select(0, big)
    big_deg = deg.index_select(0, big)
    slot = iota(fanout, start.device)
    if weights is not None and not replace:  # one row per node: [nodes, fanout]
        big_bound = weights.bound
        if big_bound is not None:
            big_bound = big_bound.index_select(0, dst.index_select(0, big))
        order, drawn = weighted_without_replacement(weights.weight, big_bound, big_start,
                                                    big_deg, fanout, generator)
        slots = big_first.index_select(0, order).unsqueeze(1) + slot
    else:  # one row per draw step: [fanout, nodes]
        if weights is None and replace:
            drawn = _uniform_with_replacement(big_deg, fanout, generator)
        elif weights is None:
            drawn = _floyd(big_deg, fanout, generator, offset_type)
        else:
            drawn = _inverse_cdf(weights, big_start, big_deg, fanout, generator)
        slots = big_first + slot.unsqueeze(1)
        drawn.add_(big_start)
    edge.index_copy_(0, slots.view(-1), drawn.view(-1))
    return local_dst, edge


def _uniform_with_replacement(deg: Tensor, k: int, generator) -> Tensor:
    """``[k, len(deg)]`` independent uniform offsets in ``[0, deg)``."""
    u = torch.rand(k, deg.numel(), dtype=torch.float64, device=deg.device, generator=generator)
    return u.mul_(deg).long().clamp_(max=deg - 1)


def _floyd(deg: Tensor, k: int, generator, offset_type: torch.dtype) -> Tensor:
    """``[k, len(deg)]``: k distinct uniform offsets in ``[0, deg)`` per column (Floyd, 1987).

    Step i draws t uniformly from [0, j] with j = deg - k + i; if t was already chosen, j
    (never chosen before) is taken instead. Every k-subset comes out equally likely.
    """
    # float64 keeps the draw uniform even for degrees in the millions. Steps run along the
    # first axis so that every step reads and writes contiguous rows.
    u = torch.rand(k, deg.numel(), dtype=torch.float64, device=deg.device, generator=generator)
    # All steps' upper bounds j and raw draws t at once; the loop only resolves repeats.
    j = (deg - k).to(offset_type) + iota(k, deg.device, offset_type).unsqueeze(1)
    chosen = u.mul_(j + 1).to(offset_type)
    launches_matter = takes_gpu_path(deg)
    # All steps at once: fewer kernels than the loop's 3 per step, for a [k, k, n] compare of
    # at most 64 MB.
    if launches_matter and k >= 8 and k * k * deg.numel() <= 2**26:
        return torch.where(_floyd_repeats(chosen, j), j, chosen.long())
    for i in range(1, k):
        t = chosen[i]
        if launches_matter:  # a step in three kernels instead of four: the same test
            repeat = (chosen[:i] == t).any(0)
        else:
            # XOR is zero exactly where t repeats an earlier draw. Integer XOR and min ran
            # faster than the bool compare-and-any (see the sampler notes in benchmarks.md).
            repeat = torch.bitwise_xor(chosen[:i], t).amin(0) == 0
        torch.where(repeat, j[i], t, out=t)
    return chosen.long()


def _floyd_repeats(t: Tensor, j: Tensor) -> Tensor:
    """``[k, n]``: whether Floyd's step ``i`` draws a value already chosen (and so takes
    ``j[i]``), for all steps at once, from the raw draws ``t``: the loop in :func:`_floyd`
    gives the same answers in ``3 (k - 1)`` kernels, this in ``9 + 3 ceil(log2 k)``.

    ``t[i]`` is already chosen exactly when an earlier step drew the same value (kept then, or
    already chosen before), or when it equals an earlier step's bound ``j[m]`` (``m = t[i] -
    j[0] < i``) and step ``m`` repeated (so took ``j[m]``). The second case follows a chain of
    earlier steps, resolved by pointer doubling: after ``r`` rounds each step has or-ed the
    first ``2 ** r`` steps of its chain, and a chain is at most ``k`` steps long.
    """
    k = t.size(0)
    step = iota(k, t.device)
    earlier = step.view(1, k) < step.view(k, 1)  # [i, m]: m < i
    repeats = (t.unsqueeze(1) == t.unsqueeze(0)).logical_and_(earlier.unsqueeze(2)).any(1)
    link = t.long() - j[0]
    link = torch.where((link >= 0).logical_and_(t < j), link, step.unsqueeze(1))
    for r in range(math.ceil(math.log2(k))):
        repeats.logical_or_(repeats.gather(0, link))
        if 2 ** (r + 1) < k:
            link = link.gather(0, link)
    return repeats


def _inverse_cdf(weights: EdgeWeights, start: Tensor, deg: Tensor, k: int,
                 generator) -> Tensor:
    """``[k, len(deg)]`` offsets drawn independently, each with probability weight / total.

    Inverse CDF over each node's own running sum of weights
    (:func:`~pyg_mgpu.sampling.weighted.run_cumsum`): a draw ``u * total`` takes the first
    edge whose running sum exceeds it, found by a binary search inside the node's run, all
    draws in step, by halving powers of two (five passes over the draws a step). On a GPU the
    step count covers the graph's longest run (no host read); on the CPU the longest run
    drawn from. ``u < 1`` keeps every draw below the total, so it lands inside the run, and
    never on a weight-0 edge, across which the running sum is flat.
    """
    cum = weights.cum_weight
    end = start + deg - 1
    total = cum.index_select(0, end)
    if bool((total <= 0).any()):
        raise ValueError("weighted sampling met a node whose in-edges all have weight 0; give "
                         "its edges positive weights or drop them.")
    u = torch.rand(k, deg.numel(), dtype=torch.float64, device=deg.device, generator=generator)
    target = u.mul_(total)
    steps = weights.search_steps
    if not takes_gpu_path(deg):
        steps = int(deg.max()).bit_length() if deg.numel() else 0
    # The last position whose running sum is at most the target (start - 1 for none): it
    # moves 2^s ahead wherever the sum there still is. Past the run's end the probe stops at
    # the end, whose sum (the total) exceeds every target, so it never leaves the run.
    last = (start - 1).expand(k, -1)
    end = end.expand(k, -1)
    for s in reversed(range(steps)):
        probe = torch.minimum(last + (1 << s), end)
        last = torch.where(cum.index_select(0, probe.reshape(-1)).view_as(probe) <= target,
                           probe, last)
    return last.sub(start - 1)
