"""The numbering of a disjoint batch's (tree, node) pairs, against plain Python."""
import pytest
import torch

from pyg_mgpu.sampling import tree_ids
from pyg_mgpu.sampling.tree_ids import (HASH_MULTIPLIERS, TreeIds, assign_local_ids,
                                        first_positions)


def first_positions_reference(keys: list) -> list:
    first = {}
    return [first.setdefault(key, position) for position, key in enumerate(keys)]


def _keys_with_repeats(n: int, distinct: int, dtype, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    values = torch.randint(2**31 - 1, (distinct,), generator=g)
    if dtype == torch.int64:  # keys above 2^31 fold before hashing
        values = values * 4099 + 2**40
    return values[torch.randint(distinct, (n,), generator=g)].to(dtype)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("rounds", [0, 1, 2, len(HASH_MULTIPLIERS)])
def test_first_positions_match_python_with_any_number_of_hash_rounds(dtype, rounds):
    # 0 rounds: the sort settles everything; 1-2: hashing leaves colliding keys to the sort.
    for n, distinct in [(0, 1), (1, 1), (5000, 50), (5000, 4000), (20000, 20000)]:
        keys = _keys_with_repeats(n, distinct, dtype, seed=n + rounds)
        first = first_positions(keys, multipliers=HASH_MULTIPLIERS[:rounds])
        assert first.tolist() == first_positions_reference(keys.tolist()), (n, distinct)


def test_first_positions_with_a_table_smaller_than_the_keys(monkeypatch):
    # The table's size cap (for hops of billions of keys), here 8 slots for 3000 distinct keys.
    monkeypatch.setattr(tree_ids, "_MAX_SLOT_BITS", 3)
    keys = _keys_with_repeats(5000, 3000, torch.int32)
    assert first_positions(keys).tolist() == first_positions_reference(keys.tolist())


def test_first_positions_when_every_key_shares_one_slot():
    # int64 keys j * 2^31 + (j ^ 5) all fold to 5: one slot in every round, so each round
    # settles one key and the sort the rest.
    j = torch.arange(64)
    shuffle = torch.randperm(192, generator=torch.Generator().manual_seed(0))
    keys = (j * 2**31 + (j ^ 5)).repeat(3)[shuffle]
    folded = (keys ^ (keys >> 31)) & 0x7FFFFFFF
    assert folded.unique().tolist() == [5]
    assert first_positions(keys).tolist() == first_positions_reference(keys.tolist())


def test_assign_local_ids_numbers_new_keys_by_first_appearance():
    seen = torch.tensor([40, 10, 30], dtype=torch.int32)  # local ids 0, 1, 2
    keys = torch.tensor([30, 99, 10, 77, 99, 40, 77, 5], dtype=torch.int32)
    local, is_new = assign_local_ids(keys, seen)
    assert local.tolist() == [2, 3, 1, 4, 3, 0, 4, 5]
    assert is_new.tolist() == [False, True, False, True, False, False, False, True]


def test_tree_ids_tell_trees_apart_and_continue_numbering():
    ids = TreeIds(torch.tensor([5, 5, 2]), num_nodes=10, num_trees=3)  # trees 0, 1, 2
    # Node 5 in tree 0 is seed 0; in tree 2 it is new. Node 2 in tree 2 is seed 2.
    local, nodes, trees = ids.number(torch.tensor([5, 5, 2, 5, 7]), torch.tensor([0, 2, 2, 2, 1]))
    assert local.tolist() == [0, 3, 2, 3, 4]
    assert nodes.tolist() == [5, 7] and trees.tolist() == [2, 1]
    assert ids.count == 5
    local, nodes, trees = ids.number(torch.tensor([7, 7]), torch.tensor([1, 0]))
    assert local.tolist() == [4, 5] and nodes.tolist() == [7] and trees.tolist() == [0]
