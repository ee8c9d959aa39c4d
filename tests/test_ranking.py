"""``pyg_mgpu.global_auc`` and ``pyg_mgpu.ranking_metrics``: exact link-prediction metrics, the
same as one process over all edges when the edges are spread over ranks."""
import pytest
import torch
from sklearn.metrics import roc_auc_score

import _ranks
import pyg_mgpu
from pyg_mgpu.distributed.launch import launch_local
from pyg_mgpu.train.ranking import auc

CPU2 = [torch.device("cpu")] * 2


@pytest.mark.parametrize("seed", range(4))
def test_auc_is_scikit_learns_ties_included(seed):
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randint(0, 12, (300,), generator=gen).float()  # many ties
    labels = torch.randint(0, 2, (300,), generator=gen)
    assert auc(scores, labels) == pytest.approx(roc_auc_score(labels.numpy(), scores.numpy()),
                                                abs=1e-12)


def brute_force(pos, neg, ks):
    ranks = []
    for p, row in zip(pos.tolist(), neg.tolist()):
        ranks.append(1 + sum(n > p for n in row) + 0.5 * sum(n == p for n in row))
    out = {"mrr": sum(1 / r for r in ranks) / len(ranks)}
    out.update({f"hits@{k}": sum(r <= k for r in ranks) / len(ranks) for k in ks})
    return out


def test_ranking_metrics_are_the_mean_reciprocal_rank_and_hits():
    gen = torch.Generator().manual_seed(0)
    pos = torch.randint(0, 6, (50,), generator=gen).float()
    neg = torch.randint(0, 6, (50, 7), generator=gen).float()
    got = pyg_mgpu.ranking_metrics(pos, neg, ks=(1, 3, 10), sum_over_ranks=False)
    assert got == pytest.approx(brute_force(pos, neg, (1, 3, 10)))


def test_bad_input_says_what_is_wrong():
    with pytest.raises(ValueError, match="one label per score"):
        pyg_mgpu.global_auc(torch.ones(3), torch.ones(2), sum_over_ranks=False)
    with pytest.raises(ValueError, match="positive and negative labels"):
        pyg_mgpu.global_auc(torch.ones(3), torch.ones(3), sum_over_ranks=False)
    with pytest.raises(ValueError, match="queries, negatives"):
        pyg_mgpu.ranking_metrics(torch.ones(3), torch.ones(2, 4), sum_over_ranks=False)


@pytest.mark.slow
def test_two_ranks_give_the_metrics_of_all_edges_not_a_mean_of_theirs():
    gen = torch.Generator().manual_seed(1)
    # Rank 0's edges score high, rank 1's low: each rank alone ranks its own pairs well, but
    # across ranks rank 1's positives fall below rank 0's negatives.
    scores = torch.stack([torch.rand(100, generator=gen) + 1,
                          torch.rand(100, generator=gen)], 1).reshape(-1).share_memory_()
    labels = (torch.rand(200, generator=gen) < 0.5).long().share_memory_()
    scores += labels * 0.3  # positives a little above negatives within a rank
    pos = torch.rand(41, generator=gen).share_memory_()
    neg = torch.rand(41, 5, generator=gen).share_memory_()
    result = torch.full((2, 5), float("nan"), dtype=torch.float64).share_memory_()
    launch_local(_ranks.link_metrics_over_ranks, CPU2, args=(scores, labels, pos, neg, result))
    whole = auc(scores, labels)
    ranking = pyg_mgpu.ranking_metrics(pos, neg, ks=(1, 3), sum_over_ranks=False)
    for rank in range(2):
        assert result[rank, 0].item() == pytest.approx(whole, abs=1e-12)
        assert result[rank, 2:5].tolist() == pytest.approx(
            [ranking["mrr"], ranking["hits@1"], ranking["hits@3"]])
    mean_of_ranks = result[:, 1].mean().item()
    assert abs(mean_of_ranks - whole) > 0.05  # what averaging per rank would have reported
