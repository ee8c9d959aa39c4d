"""Local ids of a batch's nodes, per node type, as the walk reaches them.

A batch numbers each node type's nodes ``0, 1, ...``: the seeds first, then each hop's new
nodes in order of first appearance. Two numberings share one interface
(``seeds``, ``number``, ``count``, ``close``):

- :class:`JointIds`: each node once per batch. A lookup array per node type maps a global id
  to its local id; it is scratch kept by the graph between batches and left clean (every entry
  :func:`unseen`) by :meth:`JointIds.close`, also after an error.
- :class:`DisjointIds`: one tree per seed (``disjoint=True`` and every temporal batch),
  numbered over the seed types in turn, a node being a (tree, node) pair, numbered by
  :class:`~.tree_ids.TreeIds`.
- :class:`BatchIds`: several joint batches in one walk, node ``v`` of batch ``b`` being
  ``b * num_nodes + v`` in a lookup array of ``num_batches * num_nodes`` entries: each batch
  numbered as :class:`JointIds` numbers one.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import Tensor

from pyg_mgpu.gpu_path import iota
from pyg_mgpu.sampling.tree_ids import TreeIds


def unseen(lookup_type: torch.dtype) -> int:
    """The lookup entry of a node not in the batch (yet): above every id and offer."""
    return torch.iinfo(lookup_type).max


def lookup_type(num_nodes: int) -> torch.dtype:
    """int32 where the lookup's entries (up to the node count plus one hop's offers) fit: half
    the footprint of its random reads and writes."""
    return torch.int32 if num_nodes < 2**30 else torch.int64


LOOKUP_ENTRIES = 2**30
"""The most entries a walk's lookup array may have (4 GiB of int32), unless one copy needs
more: :func:`max_batches_per_walk`."""


def max_batches_per_walk(num_nodes: int) -> int:
    """The most joint batches one walk numbers together over ``num_nodes`` nodes: each needs
    its own copy of the lookup (:class:`BatchIds`), so ``copies * num_nodes`` stays below
    :data:`LOOKUP_ENTRIES`, where entries are int32 and so are the keys ``batch * num_nodes +
    node``. At least 1: a graph of 2**30 nodes or more walks one batch at a time, over an
    int64 lookup of its own size."""
    return max(1, (LOOKUP_ENTRIES - 1) // max(1, num_nodes))


def first_occurrences(nbr: Tensor, lookup: Tensor, num_ids: int) -> Tensor:
    """Distinct nodes of ``nbr`` not yet in ``lookup``, in order of first appearance.

    Every position offers ``base + position`` to its node's lookup entry and the smallest
    wins, where ``base`` is above every local id given so far (``num_ids`` of them; more than
    the graph's nodes when seeds repeat). Known nodes hold a local id and keep it; unseen ones
    hold :func:`unseen` (above everything) and end up with their first position, which reads
    back equal only there. No sort, one pass, and the same order on every run and thread count
    (a plain indexed write lets an arbitrary duplicate win when it runs in parallel).
    """
    seen, offer = _claim(max(lookup.numel(), num_ids), nbr, lookup)
    return nbr.masked_select(seen == offer)


def _claim(base: int, nbr: Tensor, lookup: Tensor) -> tuple[Tensor, Tensor]:
    """Every position of ``nbr`` offers ``base + position`` to its node's entry of ``lookup``
    and the smallest offer wins: (each position's entry afterwards, its offer). The entry
    equals the offer exactly at a new node's first position."""
    if base + nbr.numel() >= unseen(lookup.dtype):
        raise RuntimeError(f"{nbr.numel():,} sampled neighbours in one hop of a "
                           f"{lookup.numel():,}-node graph overflow the lookup's "
                           f"{lookup.dtype}; sample smaller batches.")
    offer = torch.arange(base, base + nbr.numel(), dtype=lookup.dtype, device=nbr.device)
    # Atomic minima, not a sort: a GPU serialises only the offers to one entry (a node that
    # many positions reach), while a sort-based first occurrence (sort, run starts, scatter
    # back) takes several passes over the whole frontier, the widest of which holds millions
    # of 64-bit keys, and more kernels per hop for the same positions.
    lookup.scatter_reduce_(0, nbr, offer, reduce="amin")
    return lookup.index_select(0, nbr), offer


class JointIds:
    """Each node of a type once per batch, its local id held in that type's lookup array."""

    def __init__(self, lookup: Callable[[str], Tensor]):
        self.lookup = lookup  # node type -> its scratch array, every entry unseen
        self.count: dict = {}
        self._entered: list[tuple[object, Tensor]] = []  # (type, nodes given a local id)
        self._touched: Optional[tuple[object, Tensor]] = None  # mid-update: offers left here

    def seeds(self, t, seed: Tensor) -> None:
        lookup = self.lookup(t)
        self._entered.append((t, seed))
        # A repeated seed keeps its first position (as pyg-lib); a plain indexed write would
        # keep an arbitrary one.
        lookup.scatter_reduce_(0, seed, iota(seed.numel(), seed.device, lookup.dtype),
                               reduce="amin")
        self.count[t] = seed.numel()

    def number(self, t, nbr: Tensor, nbr_tree: None) -> tuple[Tensor, Tensor, None]:
        """(local ids of ``nbr``, the new nodes in order of first appearance, no trees)."""
        lookup = self.lookup(t)
        self._touched = (t, nbr)
        first_id = self.count[t]
        new = first_occurrences(nbr, lookup, first_id)
        lookup.index_copy_(0, new, torch.arange(first_id, first_id + new.numel(),
                                                dtype=lookup.dtype, device=lookup.device))
        self._entered.append((t, new))
        self._touched = None  # every entry of nbr is now a local id, entered above
        self.count[t] += new.numel()
        return lookup.index_select(0, nbr), new, None

    def number_deferred(self, t, nbr: Tensor) -> tuple[Tensor, Tensor]:
        """(local ids of ``nbr``, which positions introduce a new node), as :meth:`number`
        numbers them but without reading how many are new: the GPU's path, where that read
        waits for the device. The caller reads ``mask.sum()`` later, with other sizes, and
        adds it to :attr:`count` before numbering more."""
        lookup = self.lookup(t)
        self._touched = (t, nbr)
        first_id = self.count[t]
        base = max(lookup.numel(), first_id)
        seen, offer = _claim(base, nbr, lookup)
        first = seen == offer
        # A new node's entry holds its first position's offer, a known one its local id; the
        # k-th first position (in order) takes id first_id + k, as number() gives it.
        ids = torch.cumsum(first, 0, dtype=lookup.dtype).add_(first_id - 1)
        local = torch.where(seen >= base, ids.index_select(0, (seen - base).clamp_(min=0)),
                            seen)
        lookup.index_copy_(0, nbr, local)  # a node's positions all write its one id
        self._entered.append((t, nbr))
        self._touched = None
        return local, first

    def close(self) -> None:
        """Every entry this batch wrote back to :func:`unseen`, for the next batch."""
        if self._touched is not None:
            self._entered.append(self._touched)
            self._touched = None
        by_type: dict = {}
        for t, entered in self._entered:
            by_type.setdefault(t, []).append(entered)
        for t, parts in by_type.items():  # one fill per type: a kernel each on a GPU
            lookup = self.lookup(t)
            lookup.index_fill_(0, parts[0] if len(parts) == 1 else torch.cat(parts),
                               unseen(lookup.dtype))
        self._entered.clear()


class DisjointIds:
    """Local ids in a disjoint batch: :class:`TreeIds` per node type, a tree per seed. The
    trees are numbered over the seed types in the seed dict's order, as pyg-lib numbers them:
    a link's source seeds (one type) are trees ``0..B-1``, its destination seeds (another
    type) ``B..2B-1``, and a node both ends reach is in both trees."""

    def __init__(self, num_nodes: dict, seed: dict):
        self.num_nodes = num_nodes
        self.first_tree, self.num_trees = {}, 0
        for t, s in seed.items():
            self.first_tree[t] = self.num_trees
            self.num_trees += s.numel()
        self._ids: dict = {}

    @property
    def count(self) -> dict:
        return {t: ids.count for t, ids in self._ids.items()}

    def seeds(self, t, seed: Tensor) -> Tensor:
        self._ids[t] = TreeIds(seed, self.num_nodes[t], self.num_trees,
                               self.first_tree.get(t, 0))
        return self._ids[t].seed_trees

    def number(self, t, nbr: Tensor,
               nbr_tree: Optional[Tensor]) -> tuple[Tensor, Tensor, Tensor]:
        """(local ids of the pairs ``(nbr_tree, nbr)``, the new nodes in order of first
        appearance, their trees)."""
        return self._ids[t].number(nbr, nbr_tree)

    def close(self) -> None:
        pass


class BatchIds:
    """Local ids when several joint batches share one walk: :class:`JointIds` over the keys
    ``batch * num_nodes + node`` (``lookup`` holds one entry per key), each batch's nodes
    once, a node two batches reach once in each."""

    def __init__(self, lookup: Callable[[str], Tensor], num_nodes: dict, seed_batch: dict):
        self._joint = JointIds(lookup)
        self.num_nodes, self.seed_batch = num_nodes, seed_batch

    @property
    def count(self) -> dict:
        return self._joint.count

    def seeds(self, t, seed: Tensor) -> Tensor:
        batch = self.seed_batch[t]
        self._joint.seeds(t, seed.add(batch, alpha=self.num_nodes[t]))
        return batch

    def number(self, t, nbr: Tensor, nbr_batch: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(local ids of the pairs ``(nbr_batch, nbr)``, the new nodes in order of first
        appearance, their batches)."""
        local, new, _ = self._joint.number(t, nbr.add(nbr_batch, alpha=self.num_nodes[t]), None)
        new_batch = torch.div(new, self.num_nodes[t], rounding_mode="floor")
        return local, new - new_batch * self.num_nodes[t], new_batch

    def number_deferred(self, t, nbr: Tensor, nbr_batch: Tensor) -> tuple[Tensor, Tensor]:
        """:meth:`JointIds.number_deferred` of the pairs ``(nbr_batch, nbr)``."""
        return self._joint.number_deferred(t, nbr.add(nbr_batch, alpha=self.num_nodes[t]))

    def close(self) -> None:
        self._joint.close()
