"""``pyg_mgpu.global_auc`` and ``pyg_mgpu.ranking_metrics``: exact link-prediction metrics, the
same as one process over all edges when the edges are spread over ranks."""
import pytest
import torch
from sklearn.metrics import roc_auc_score

import _ranks
import pyg_mgpu
from pyg_mgpu.distributed.launch import launch_local
from pyg_mgpu.metrics.ranking import auc

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


NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("pos, neg, name", [
    ([NAN, NAN], [[0.1, 0.2], [0.3, 0.4]], "pos_scores holds 2 NaN or infinite"),
    ([0.9, 0.5], [[NAN, 0.2], [0.3, 0.4]], "neg_scores holds 1 NaN or infinite"),
    ([INF, 0.5], [[0.1, 0.2], [0.3, 0.4]], "pos_scores holds 1 NaN or infinite"),
])
def test_ranking_refuses_scores_of_a_diverged_model(pos, neg, name):
    # A NaN compares false with every negative: it would rank first, every query a hit.
    with pytest.raises(ValueError, match=name):
        pyg_mgpu.ranking_metrics(torch.tensor(pos), torch.tensor(neg), ks=(1,),
                                 sum_over_ranks=False)


@pytest.mark.parametrize("scores, labels, message", [
    ([NAN, 0.1, 0.5, 0.2], [1, 0, 1, 0], "scores holds 1 NaN or infinite"),
    ([0.3, 0.1, -INF, 0.2], [1, 0, 1, 0], "scores holds 1 NaN or infinite"),
    ([0.3, 0.1, 0.5, 0.2], [2, 0, 2, 0], "labels must be 0 .* or 1 .*; got 2 other value"),
    ([0.3, 0.1, 0.5, 0.2], [1.0, 0.0, 0.5, 0.0], "got 1 other value.*such as 0.5"),
])
def test_auc_refuses_non_finite_scores_and_labels_other_than_0_or_1(scores, labels, message):
    if "scores" in message:  # as scikit-learn does
        with pytest.raises(ValueError):
            roc_auc_score(labels, scores)
    with pytest.raises(ValueError, match=message):
        pyg_mgpu.global_auc(torch.tensor(scores), torch.tensor(labels), sum_over_ranks=False)


def test_ranking_inputs_of_the_wrong_shape_are_named():
    with pytest.raises(ValueError, match=r"pos_scores must be \[queries\]"):
        pyg_mgpu.ranking_metrics(torch.ones(3, 2), torch.ones(6, 4), sum_over_ranks=False)
    with pytest.raises(ValueError, match="at least one negative each"):
        pyg_mgpu.ranking_metrics(torch.ones(3), torch.ones(3, 0), sum_over_ranks=False)
    with pytest.raises(ValueError, match="ks must be positive integers"):
        pyg_mgpu.ranking_metrics(torch.ones(3), torch.ones(3, 4), ks=(0, 10),
                                 sum_over_ranks=False)
    # A decoder's [Q, 1] output is one score per query.
    pos, neg = torch.tensor([0.9, 0.5]), torch.tensor([[0.1, 0.2], [0.7, 0.5]])
    assert pyg_mgpu.ranking_metrics(pos[:, None], neg, sum_over_ranks=False) == \
        pyg_mgpu.ranking_metrics(pos, neg, sum_over_ranks=False)


@pytest.mark.slow
def test_a_nan_on_one_rank_is_refused_on_every_rank():
    # The checks are summed with the metric, so every rank raises alike and none is left
    # waiting in a collective.
    refused = torch.zeros(2, 2, dtype=torch.long).share_memory_()
    launch_local(_ranks.link_metrics_with_a_nan_on_rank_1, CPU2, args=(refused,))
    assert refused.tolist() == [[1, 1], [1, 1]]


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
