"""Local ids of a disjoint batch, where a node is a pair (tree, node id).

Each seed grows its own tree (``disjoint=True``, and every temporal batch), so a node reached
from two seeds appears twice, and a hop's neighbours must be told apart by tree. The pairs are
encoded as one integer key, ``tree * num_nodes + node``, and each hop's keys are numbered by
:func:`first_positions`: a few rounds of hashing with a scatter-min, no sort (numbering by a
sort of the keys took 2.3x as long on the CPU, ~40% of a temporal batch's time).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

# One odd 31-bit multiplier per hashing round (Knuth's multiplicative hashing on 32 bits).
HASH_MULTIPLIERS = (0x5851F42D, 0x2545F491, 0x27BB2EE7, 0x369DEA0F)
# Table slots per key hashed: more slots, fewer keys sharing one with another key.
_SLOTS_PER_KEY = 4
# At most 2^28 slots (1 GiB of int32): a larger hop shares slots more, and takes more rounds.
_MAX_SLOT_BITS = 28


class TreeIds:
    """Local ids in a disjoint batch: the seeds are trees ``first_tree, first_tree + 1, ...``
    (of ``num_trees`` over every node type) and nodes ``0, 1, ...`` in order; each hop's new
    pairs take the next ids, in order of first appearance."""

    def __init__(self, seed: Tensor, num_nodes: int, num_trees: int, first_tree: int = 0):
        self.num_nodes = num_nodes
        # int32 where every pair fits: half the memory traffic of every pass over the keys.
        self.key_type = torch.int32 if num_trees * num_nodes < 2**31 else torch.int64
        self.seed_trees = torch.arange(first_tree, first_tree + seed.numel(), device=seed.device)
        self._keys = (self.seed_trees * num_nodes + seed).to(self.key_type)  # by local id

    @property
    def count(self) -> int:
        """Pairs numbered so far."""
        return self._keys.numel()

    def number(self, nbr: Tensor, nbr_tree: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(local ids of the pairs ``(nbr_tree, nbr)``, the new nodes in order of first
        appearance, their trees)."""
        keys = (nbr_tree * self.num_nodes + nbr).to(self.key_type)
        local, is_new = assign_local_ids(keys, self._keys)
        new = is_new.nonzero().squeeze(1)
        self._keys = torch.cat([self._keys, keys.index_select(0, new)])
        return local, nbr.index_select(0, new), nbr_tree.index_select(0, new)


def assign_local_ids(keys: Tensor, seen_keys: Tensor) -> tuple[Tensor, Tensor]:
    """Local ids of ``keys``, where ``seen_keys`` (distinct) hold ids ``0, 1, ...`` in order
    and each new key takes the next id at its first appearance. Returns (int64 local ids, a
    mask of the positions that are a new key's first appearance)."""
    num_seen = seen_keys.numel()
    first = first_positions(torch.cat([seen_keys, keys]))
    is_new = first[num_seen:] == torch.arange(num_seen, first.numel(), dtype=first.dtype,
                                              device=keys.device)
    # The local id at each position that is a first appearance (the only ones read).
    local_at = torch.cat([torch.arange(num_seen, device=keys.device),
                          torch.cumsum(is_new, 0).add_(num_seen - 1)])
    return local_at.index_select(0, first[num_seen:]), is_new


def first_positions(keys: Tensor, multipliers: tuple[int, ...] = HASH_MULTIPLIERS) -> Tensor:
    """For each position of ``keys`` (int32 or int64), the position of the first equal key.

    Each round, every unsettled position offers its position to its key's hash slot and the
    smallest offer wins (a scatter-min: the same result on any thread count or device). A key's
    positions share a slot, so when the winner holds the same key it is that key's first
    position, for all of them at once; keys beaten by another key in their slot try again with
    the next multiplier. With four slots per key ~7% of a sampled hop's positions go to a
    second round and ~1 in 20,000 past the fourth; a stable sort settles any left after the
    last.
    """
    n = keys.numel()
    position_type = torch.int32 if n < 2**31 else torch.int64
    hashed = keys.long()
    if keys.dtype == torch.int64:  # fold to 31 bits: the product below stays within int64
        hashed = (hashed ^ (hashed >> 31)) & 0x7FFFFFFF
    first: Optional[Tensor] = None
    pending = torch.arange(n, device=keys.device)  # positions not yet settled
    for multiplier in multipliers:
        if first is None:  # the first round: every position
            key, hashed_key = keys, hashed
        else:
            key, hashed_key = keys.index_select(0, pending), hashed.index_select(0, pending)
        position = pending.to(position_type)
        bits = min(max(1, (_SLOTS_PER_KEY * position.numel() - 1).bit_length()), _MAX_SLOT_BITS)
        slot = ((hashed_key * multiplier) >> (32 - bits)) & ((1 << bits) - 1)
        table = torch.full((1 << bits,), n, dtype=position_type, device=keys.device)
        table.scatter_reduce_(0, slot, position, reduce="amin")
        winner = table.index_select(0, slot)
        # Right where the winner holds the same key; the others are overwritten later.
        if first is None:
            first = winner
        else:
            first.index_copy_(0, pending, winner)
        pending = pending.masked_select(keys.index_select(0, winner) != key)
        if pending.numel() == 0:
            return first
    if first is None:  # no hashing rounds
        first = torch.empty(n, dtype=position_type, device=keys.device)
    _settle_by_sort(keys, pending, first)
    return first


def _settle_by_sort(keys: Tensor, pending: Tensor, first: Tensor) -> None:
    """Writes into ``first`` the first position of each key at ``pending`` (all positions of
    those keys are pending): a stable sort puts each key's first position at the head of its
    run."""
    in_order = pending.index_select(0, torch.sort(keys.index_select(0, pending),
                                                  stable=True).indices)
    ordered = keys.index_select(0, in_order)
    starts = torch.ones_like(ordered, dtype=torch.bool)
    torch.ne(ordered[1:], ordered[:-1], out=starts[1:])
    run_first = in_order.masked_select(starts).to(first.dtype)
    first.index_copy_(0, in_order, run_first.index_select(0, torch.cumsum(starts, 0).sub_(1)))
