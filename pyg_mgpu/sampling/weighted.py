"""Weighted draws: the forms of a graph's edge weights that the draws read, and the draws of
``k`` distinct edges per node, one at a time with probability proportional to the remaining
edges' weights (without replacement; with replacement is an inverse CDF in ``draws``).

Two exact routes give that law, both vectorized over the frontier:

- keys (Efraimidis and Spirakis, 2006): one random key per in-edge, the ``k`` best kept;
  cost follows the degree. Every node can take it, on any device.
- rejection: uniform tries kept with probability weight / largest weight, the first ``k``
  distinct ones kept; time follows ``k`` (memory still 2 bytes per in-edge). On the CPU, for
  nodes with many in-edges of comparable weights.
"""
from __future__ import annotations

import sys
from typing import NamedTuple, Optional

import numpy as np
import torch
from torch import Tensor


class EdgeWeights(NamedTuple):
    """A graph's sampling weights in CSC order, in the forms weighted draws read
    (built by :func:`edge_weights`)."""
    weight: Optional[Tensor]  # without replacement: padded by weights_for_row_views
    cum_weight: Optional[Tensor]  # with replacement: [E] float64 run_cumsum
    bound: Optional[Tensor]  # without replacement, on the CPU: [N] rejection_bounds
    search_steps: int = 0  # with replacement: binary-search steps that cover the longest run

    def tensors(self) -> list[Tensor]:
        return [t for t in (self.weight, self.cum_weight, self.bound) if t is not None]

    def share_memory_(self) -> "EdgeWeights":
        for t in self.tensors():
            t.share_memory_()
        return self


def edge_weights(weight: Tensor, colptr: Tensor, replace: bool) -> EdgeWeights:
    """The forms of ``weight`` (non-negative, float32 or float64, CSC order) that weighted
    draws with or without replacement read, in its own type; only what ``replace`` and the
    device need is built."""
    if replace:
        longest = int(colptr.diff().max()) if colptr.numel() > 1 else 0
        cumsum = run_cumsum(weight, colptr)
        if not bool(torch.isfinite(cumsum).all()):
            raise ValueError("a node's sampling weights sum past the largest float64 (each "
                             "weight is finite, their sum is not); scale the weights down.")
        return EdgeWeights(None, cumsum, None, longest.bit_length())
    # Rejection draws are not yet measured on a GPU, where keys are cheap.
    bound = rejection_bounds(weight, colptr) if weight.device.type == "cpu" else None
    return EdgeWeights(weights_for_row_views(weight, colptr), None, bound)


# Cells (edges plus padding) per step of run_cumsum: ~3 MB of temporaries, which stay in the
# CPU's caches (larger steps ran slower).
_RUN_CUMSUM_CELLS = 1 << 17


def run_cumsum(weight: Tensor, colptr: Tensor) -> Tensor:
    """``[E]`` float64: each edge's weight plus the weights before it in its node's run, an
    inclusive running sum that restarts at every node.

    A draw compares it with a fraction of its own node's total, so its precision is relative
    to that total, however heavy the runs before it (a graph-wide running sum keeps only
    ~2e-7 of its total at 1.6B edges: a light node's weights vanish). It is non-decreasing
    along a run, and flat across a weight-0 edge, which no search then lands on.

    Nodes of degree in ``(w/2, w]`` sum their runs as rows of a ``[nodes, w]`` matrix, ~10^5
    cells at a time: the work is at most twice the edges', and temporaries stay small however
    large the graph.
    """
    device = weight.device
    cum = torch.empty(weight.numel(), dtype=torch.float64, device=device)
    deg = colptr.diff()
    nodes = (deg > 0).nonzero().squeeze(1)
    if nodes.numel() == 0:
        return cum
    # The row width of each node with in-edges, 2 ** width_exp: the bit length of deg - 1.
    below = deg.index_select(0, nodes) - 1
    width_exp = torch.zeros_like(below)
    for bit in range(int(below.max()).bit_length()):
        width_exp[below >= (1 << bit)] = bit + 1
    last = weight.numel() - 1
    for exp in torch.unique(width_exp).tolist():
        width = 1 << exp
        column = torch.arange(width, device=device)
        for part in nodes[width_exp == exp].split(max(1, _RUN_CUMSUM_CELLS // width)):
            start, count = colptr.index_select(0, part), deg.index_select(0, part)
            position = (start.unsqueeze(1) + column).clamp_(max=last)
            # Cells past a run hold the next runs' weights: they follow the run's own in the
            # row, so its running sums never read them, and they are not written.
            rows = weight.index_select(0, position.view(-1)).view(-1, width)
            sums = torch.cumsum(rows, 1, dtype=torch.float64)
            inside = column < count.unsqueeze(1)
            cum[position[inside]] = sums[inside]
    return cum


def weights_for_row_views(weight: Tensor, colptr: Tensor) -> Tensor:
    """``weight`` (CSC order) followed by max-in-degree zeros, so that weighted draws can read
    any node's edges as one row of a strided view, even the last node's, padding included."""
    max_degree = int((colptr[1:] - colptr[:-1]).max()) if colptr.numel() > 1 else 0
    return torch.cat([weight, weight.new_zeros(max_degree)])


# Rejection draws (CPU): a node with many in-edges of not too unequal weights takes ~k tries
# for k draws, where keys cost one per in-edge. A try yields a new draw with probability at
# least the node's acceptance (mean weight / largest) minus (k - 1) / degree: the minimum
# acceptance and degree per draw keep that above 1/8, so every node finishes in few rounds.
_REJECTION_MIN_ACCEPTANCE = 0.25
_REJECTION_DEGREE_PER_DRAW = 8
# Below it keys were as fast (one CPU thread, fanouts 25,10 and 5,5: minimums of 16 to 128
# measured alike; for fanouts of 8 and up, 8 * fanout is the higher bound anyway).
_REJECTION_MIN_DEGREE = 64
_REJECTION_TRIES_PER_DRAW = 3  # tries per missing draw in a round
# A safeguard against a stall: a node makes no progress in a round with probability below
# (7/8)^3 < 0.7; beyond `_MAX_TRIES` tries per round, huge fanouts take more rounds.
_REJECTION_MAX_ROUNDS = 1000
_UNCLAIMED = torch.iinfo(torch.int16).max
_MAX_TRIES = _UNCLAIMED - 1  # try numbers are int16


def rejection_bounds(weight: Tensor, colptr: Tensor) -> Tensor:
    """``[N]`` per node: its largest in-edge weight where its in-edges suit rejection draws
    (mean weight at least ``_REJECTION_MIN_ACCEPTANCE`` of the largest), else 0."""
    weight = weight[:int(colptr[-1])]
    largest = torch.segment_reduce(weight, "max", offsets=colptr, initial=0.0)
    total = torch.segment_reduce(weight, "sum", offsets=colptr, initial=0.0)
    acceptance = total / (largest * (colptr[1:] - colptr[:-1]))  # NaN without positive weights
    return torch.where(acceptance >= _REJECTION_MIN_ACCEPTANCE, largest, 0.0)


def weighted_without_replacement(weight: Tensor, bound: Optional[Tensor], start: Tensor,
                                  deg: Tensor, k: int, generator) -> tuple[Tensor, Tensor]:
    """``k`` distinct edges per node, drawn one at a time proportionally to weight: by
    rejection (:func:`_weighted_by_rejection`) for nodes with a positive ``bound`` (on the
    CPU) and enough edges, else by keys (:func:`_weighted_by_keys`).

    Returns:
        ``(order, edge)``: positions in ``deg``, and ``[len(deg), k]`` CSC positions of the
        drawn edges, one row per node in that order, each row in draw order (as pyg-lib emits
        them: it decides the order new nodes are numbered in).
    """
    if bound is None:
        return _weighted_by_keys(weight, start, deg, k, generator)
    min_degree = max(_REJECTION_MIN_DEGREE, _REJECTION_DEGREE_PER_DRAW * k)
    by_rejection = (deg >= min_degree).logical_and_(bound > 0)
    tried = by_rejection.nonzero().squeeze(1)  # positions of the nodes drawn by rejection
    if tried.numel() == 0:
        return _weighted_by_keys(weight, start, deg, k, generator)
    drawn = _weighted_by_rejection(weight, bound.index_select(0, tried),
                                   start.index_select(0, tried),
                                   deg.index_select(0, tried), k, generator)
    keyed = by_rejection.logical_not_().nonzero().squeeze(1)
    if keyed.numel() == 0:
        return tried, drawn
    order, keyed_drawn = _weighted_by_keys(weight, start.index_select(0, keyed),
                                           deg.index_select(0, keyed), k, generator)
    return torch.cat([tried, keyed.index_select(0, order)]), torch.cat([drawn, keyed_drawn])


def _weighted_by_rejection(weight: Tensor, bound: Tensor, start: Tensor, deg: Tensor, k: int,
                           generator) -> Tensor:
    """``[len(deg), k]`` CSC positions: ``k`` distinct edges per node, drawn one at a time
    with probability proportional to the remaining edges' weights.

    A try picks one of a node's edges uniformly and keeps it with probability
    ``weight / bound``: a draw with replacement proportional to weight. The first ``k``
    distinct edges of such a stream follow the same law as drawing proportionally, removing
    the edge and repeating (given the edges taken, the next new one is proportional to the
    weights of the rest). Each round, every node still short of ``k`` makes a row of tries,
    whose first successful try at each edge not drawn before is a new draw, in row order.
    """
    n = deg.numel()
    drawn = torch.empty(n, k, dtype=torch.long)
    # One int16 per (node, edge): 0 once the edge is drawn. A round's successful tries claim
    # their edges by scatter-min of their try numbers (1, 2, ...), so an edge's claim names its
    # first successful try. A node that goes on to another round took every new edge it found,
    # so its claims are all 0 or unclaimed again: the next round starts clean.
    first_cell = torch.cumsum(deg, 0).sub_(deg)
    claim = torch.full((int(deg.sum()),), _UNCLAIMED, dtype=torch.int16)
    row, count = torch.arange(n), torch.zeros(n, dtype=torch.long)
    for _ in range(_REJECTION_MAX_ROUNDS + k // 1000):
        need = k - count
        tries = min(_REJECTION_TRIES_PER_DRAW * int(need.max()), _MAX_TRIES)
        try_no = torch.arange(1, tries + 1, dtype=torch.int16)
        # One uniform u per try: floor(u * deg) picks the edge, and the fraction left over is
        # a fresh uniform (on a grid of deg * 2^-53) that decides the try's success.
        spot = torch.rand(row.numel(), tries, dtype=torch.float64, generator=generator)
        spot.mul_(deg.unsqueeze(1))
        offset = spot.long().clamp_(max=deg.unsqueeze(1) - 1)
        edge = offset + start.unsqueeze(1)
        success = spot.sub_(offset).mul_(bound.unsqueeze(1)) < weight.index_select(
            0, edge.view(-1)).view_as(edge)
        cell = offset.add_(first_cell.unsqueeze(1)).view(-1)
        claim.scatter_reduce_(0, cell, torch.where(success, try_no, _UNCLAIMED).view(-1),
                              "amin")
        # New (in place of `success`): the first successful try at an edge not drawn before.
        new = success.logical_and_(claim.index_select(0, cell).view_as(success) == try_no)
        rank = new.view(torch.uint8).cumsum(1, dtype=torch.int16)
        new.logical_and_(rank <= need.unsqueeze(1))
        # Draw number count + rank of a row goes to its column count + rank - 1.
        hit = new.view(-1).nonzero().squeeze(1)
        slot = (row * k + count - 1).index_select(0, hit.div(tries, rounding_mode="floor"))
        drawn.view(-1).index_copy_(0, slot.add_(rank.view(-1).index_select(0, hit)),
                                   edge.view(-1).index_select(0, hit))
        claim.index_fill_(0, cell.index_select(0, hit), 0)
        count = count + torch.minimum(rank[:, -1], need)
        short = (count < k).nonzero().squeeze(1)
        if short.numel() == 0:
            return drawn
        row, start, deg, bound, first_cell, count = (
            t.index_select(0, short) for t in (row, start, deg, bound, first_cell, count))
    raise RuntimeError("weighted draws by rejection did not finish (a few rounds are "
                       "expected): a pyg_mgpu bug, please report it.")


class _KeyMatrix(NamedTuple):
    """Consecutive nodes (by degree) whose keys share one ``[rows, width]`` matrix."""
    rows: int
    min_degree: int
    width: int  # the largest degree


# Padding a key matrix may grow by (in cells) to save a matrix's fixed cost of ~10 small ops.
# On one CPU thread 600 to 1,000 measured best on the bench graph (300 and 2,000 ~2% slower);
# on a GPU the launches dominate.
_PADDING_BUDGET_CPU = 1000
_PADDING_BUDGET_GPU = 1 << 20


def _key_matrices(degrees: list[int], counts: list[int], budget: int) -> list[_KeyMatrix]:
    """Cuts nodes sorted by degree into key matrices.

    ``degrees`` (ascending, distinct) and ``counts`` describe the nodes. A degree joins the
    current matrix, widening it, when the padding that adds to the rows already there stays
    within ``budget`` cells; otherwise it starts a new matrix.
    """
    groups = []
    rows = min_degree = width = 0
    for degree, count in zip(degrees, counts):
        if rows and rows * (degree - width) > budget:
            groups.append(_KeyMatrix(rows, min_degree, width))
            rows = 0
        if rows == 0:
            min_degree = degree
        rows, width = rows + count, degree
    if rows:
        groups.append(_KeyMatrix(rows, min_degree, width))
    return groups


def _weighted_by_keys(weight: Tensor, start: Tensor, deg: Tensor, k: int,
                      generator) -> tuple[Tensor, Tensor]:
    """``k`` distinct edges per node, drawn one at a time proportionally to weight.

    Efraimidis and Spirakis (2006): give every edge the key ``Exp(1) / weight`` and keep each
    node's ``k`` smallest keys; this is distributed exactly as drawing an edge with probability
    proportional to its weight, removing it, and repeating, the smallest key first (pyg-lib's
    ``_biased_sample``: ``topk`` of ``log(U) / weight``, largest first). Nodes sorted by degree
    are cut into key matrices (:func:`_key_matrices`), each one selection along its rows
    (:func:`_k_smallest_columns`): no per-node Python.
    ``weight`` comes from :func:`weights_for_row_views`; keys take its type (float32 keys would
    turn a float64 weight below ~1e-38 into weight 0).

    Returns:
        ``(order, edge)``: the nodes by ascending degree (positions in ``deg``), and ``[len(deg),
        k]`` CSC positions of the drawn edges, one row per node in that order, each row in draw
        order.
    """
    device = deg.device
    order = _argsort(deg)
    sorted_deg = deg.index_select(0, order)
    degrees, counts = torch.unique_consecutive(sorted_deg, return_counts=True)
    budget = _PADDING_BUDGET_CPU if device.type == "cpu" else _PADDING_BUDGET_GPU
    groups = _key_matrices(degrees.tolist(), counts.tolist(), budget)
    sorted_start = start.index_select(0, order)
    offset = torch.empty(deg.numel(), k, dtype=torch.long, device=device)
    column = torch.arange(groups[-1].width, device=device)
    rows, cells = [g.rows for g in groups], [g.rows * g.width for g in groups]
    # One draw for every key: per matrix, its ~6 ops cost more than the cache misses they save.
    log_u = _log_uniform(sum(cells), generator, device)
    for group, key, group_start, group_deg, group_offset in zip(
            groups, log_u.split(cells), sorted_start.split(rows),
            sorted_deg.unsqueeze(1).split(rows), offset.split(rows)):
        width = group.width
        # Row i of this view is weight[i : i + width]: gathering rows copies each node's edges
        # (and the next ones as padding) in one memcpy, ~6x faster than a gather by position.
        view = weight.as_strided((weight.numel() - width + 1, width), (1, 1))
        # key = log(U) / w = -(Exp(1) / w): the k largest keys are the k smallest Exp(1) / w.
        # They are negative (-inf for weight 0, drawn only to fill a node with fewer than k
        # positive weights), and padding is made positive so it is never drawn. Read as
        # integers of their width, floats of one sign order by magnitude and negatives sit
        # below positives, so the k smallest integers are the k largest keys (as integers they
        # pack with their columns into int64 pairs: see _k_smallest_columns).
        key, row_weight = key.view(-1, width), view.index_select(0, group_start)
        key = key.div_(row_weight) if row_weight.dtype == key.dtype else key / row_weight
        if group.min_degree < width:  # only columns past the smallest degree can be padding
            past_end = column[group.min_degree:width] >= group_deg
            key[:, group.min_degree:].masked_fill_(past_end, 1.0)
        _k_smallest_columns(key.view(_INT_OF_FLOAT[key.dtype]), k, out=group_offset)
    return order, offset.add_(sorted_start.unsqueeze(1))


def _argsort(values: Tensor) -> Tensor:
    """Positions that sort the int64 ``values``; ties in no particular order.

    On the CPU numpy's introsort: ~4x faster than ``torch.sort`` on a hop's ~10^4 degrees.
    Its order of ties is the same from run to run, but numpy picks its sorting code by CPU,
    so another machine may order ties (and so give out the random keys) differently.
    """
    if values.device.type == "cpu":
        return torch.from_numpy(np.argsort(values.numpy()))
    return torch.sort(values).indices


# The integers that weighted keys are read as.
_INT_OF_FLOAT = {torch.float32: torch.int32, torch.float64: torch.int64}
# At 1 and 2 threads numpy's partition ran 2-4x faster than topk (rows of 12-40 keys); topk's
# time halved from 1 to 2 threads, so from about 4 threads it would catch up.
_PARTITION_MAX_THREADS = 4
# Which int32 of an int64 holds its low bits, and which its high bits.
_LOW_WORD, _HIGH_WORD = (0, 1) if sys.byteorder == "little" else (1, 0)


def _k_smallest_columns(matrix: Tensor, k: int, out: Tensor) -> None:
    """Writes to ``out`` (``[rows, k]`` int64) the columns of each row's ``k`` smallest
    entries of the int32 or int64 ``matrix``, smallest first (the keys' draw order); of equal
    entries, the lower columns are taken, and first.

    Each entry and its column become one int64, the entry in the high bits: the pairs order
    as the entries do, ties by column, and they are distinct, so a row's ``k`` smallest pairs,
    sorted, are one list on every device and machine. An int32 entry fills the high word; an
    int64 one (a float64 key) gives up its lowest bits, as many as a column needs (10 for 1,024
    columns): keys closer than ``2^-(52 - bits)`` of their size are then ties, still finer
    than float32 keys resolve below 2^29 columns. On the CPU, numpy's introselect partitions
    the pairs in place: on rows of tens of entries ~3x faster than ``torch.topk``, which builds
    a buffer of (value, index) pairs for every row, and ~1.7x faster than numpy's
    ``argpartition``, which writes an index for every entry; the ``k`` kept are then sorted.
    It runs on one thread, while ``topk`` shares the rows among torch's threads: with
    ``_PARTITION_MAX_THREADS`` threads or more, and on GPUs, ``topk`` selects the pairs,
    sorted.
    """
    rows, width = matrix.shape
    if matrix.dtype == torch.int32:
        pairs = torch.empty(rows, width, 2, dtype=torch.int32, device=matrix.device)
        pairs[:, :, _HIGH_WORD] = matrix
        pairs[:, :, _LOW_WORD] = torch.arange(width, dtype=torch.int32, device=matrix.device)
        pairs = pairs.view(torch.int64).view(rows, width)
        column_bits = 32
    else:
        column_bits = max(1, (width - 1).bit_length())
        pairs = matrix.bitwise_right_shift(column_bits).bitwise_left_shift_(column_bits)
        pairs.bitwise_or_(torch.arange(width, device=matrix.device))
    if matrix.device.type == "cpu" and torch.get_num_threads() < _PARTITION_MAX_THREADS:
        pairs.numpy().partition(k - 1, axis=1)
        smallest = pairs[:, :k]
        smallest.numpy().sort(axis=1)
    else:
        smallest = torch.topk(pairs, k, dim=1, largest=False, sorted=True).values
    torch.bitwise_and(smallest, (1 << column_bits) - 1, out=out)


def _log_uniform(numel: int, generator, device) -> Tensor:
    """``[numel]`` values ``log(U)``, ``U`` uniform on the grid ``(j + 1/2) / 2^23`` inside
    ``(0, 1)``: always finite and below 0.

    Each ``U`` takes 23 random bits, half of an int64 draw (~1.7x cheaper than ``torch.rand``
    on CPU), as the mantissa of a float ``m`` in ``[1, 2)``. ``U - 1 = (m - 2) + 2^-24`` (each
    step exact in float32, the second centring the grid) goes to ``log1p``, which gives
    ``log(U)`` ~1.6x faster than ``log`` on the CPU. Every step works in place on one buffer.
    """
    bits = torch.empty((numel + 1) // 2, dtype=torch.int64, device=device)
    bits = bits.random_(generator=generator).view(torch.int32)[:numel]
    one_to_two = bits.bitwise_and_(0x7FFFFF).bitwise_or_(0x3F800000).view(torch.float32)
    return one_to_two.sub_(2.0).add_(2.0 ** -24).log1p_()
