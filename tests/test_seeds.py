"""The derived seeds keep their formulas: a change would alter every recorded run's results and
break exact resume of runs checkpointed before it."""
import pytest

from pyg_mgpu.seeds import dropout_seed, eval_loader_seed, rank_seed

CASES = [(0, 0), (0, 3), (1, 0), (42, 1), (12345, 7)]


@pytest.mark.parametrize("seed, rank", CASES)
def test_rank_seed_keeps_its_formula(seed, rank):
    assert rank_seed(seed, rank) == seed * 1009 + rank


@pytest.mark.parametrize("seed", [seed for seed, _ in CASES])
def test_eval_loader_seed_keeps_its_formula(seed):
    assert eval_loader_seed(seed) == seed + 7919


@pytest.mark.parametrize("seed, rank", CASES)
def test_dropout_seed_keeps_its_formula(seed, rank):
    assert dropout_seed(seed, rank) == seed * 7919 + 1 + rank


def test_pinned_values():
    assert [rank_seed(0, 1), rank_seed(42, 1), eval_loader_seed(0), dropout_seed(0, 0),
            dropout_seed(42, 1)] == [1, 42379, 7919, 1, 332600]
