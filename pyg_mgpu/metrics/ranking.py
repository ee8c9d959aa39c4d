"""Link-prediction metrics over every rank's edges, exact: ROC AUC, mean reciprocal rank and
hits@k.

A rank's AUC over its own edges, averaged over ranks, is not the AUC over all of them (the
pairs across ranks are never compared). :func:`global_auc` gathers every rank's scores once,
at the end of an evaluation, and ranks them together. Per-query metrics (:func:`ranking_metrics`:
a positive edge against its own negatives) are sums over queries, added over the ranks with
one all-reduce and divided once, as :func:`~pyg_mgpu.metrics.reduce.global_ratio` does.
Nothing here reads a GPU value back before the end: the checks of the inputs (finite scores,
labels 0 or 1) are counted with the metric and read in the same one read, on every rank alike,
so every rank raises the same error and none is left waiting in a collective.

A diverged model's NaN or infinite scores are refused, not ranked: a NaN compares false with
everything, so it would rank first and score as perfect. To score the finite ones anyway, drop
the others first (``keep = torch.isfinite(scores)``) and say so where the metric is reported.

Why not torchmetrics: its ``BinaryAUROC`` (``thresholds=None``, every score kept) computes the
curve in float32 and passes scores outside [0, 1] through a sigmoid, batch by batch, which ties
large logits (in float32 every score above about 17 becomes 1.0); its retrieval metrics
(``RetrievalMRR``, ``RetrievalHitRate``) order tied scores as their sort leaves them, where OGB
counts a tie half, and keep every score of every query until the end, where sums suffice here.
``tests/test_metrics_torchmetrics.py`` shows each difference, and that on probabilities the two
AUCs agree to float32's rounding.
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from pyg_mgpu.metrics.reduce import all_gather_cat, all_reduce_sum


def auc(scores: Tensor, labels: Tensor) -> float:
    """ROC AUC: the probability that a positive scores above a negative, ties counting half
    (the Mann-Whitney statistic over midranks).

    Raises:
        ValueError: a score is NaN or infinite, a label is neither 0 nor 1, or one of the two
            classes is missing.
    """
    scores, labels = scores.reshape(-1).double(), labels.reshape(-1)
    positive = labels == 1
    # One read for the checks and the class counts.
    num_pos, other_labels, not_finite = torch.stack([
        positive.sum(), (~positive & (labels != 0)).sum(),
        (~torch.isfinite(scores)).sum()]).tolist()
    if not_finite:
        raise ValueError(f"scores holds {not_finite} NaN or infinite value(s) (a diverged "
                         "model?); an AUC over them means nothing: fix the model, or drop "
                         "them first (torch.isfinite).")
    if other_labels:
        example = labels[~positive & (labels != 0)][0].item()
        raise ValueError(f"labels must be 0 (a negative) or 1 (a true edge); got "
                         f"{other_labels} other value(s), such as {example!r}.")
    labels = positive
    num_neg = labels.numel() - num_pos
    if num_pos == 0 or num_neg == 0:
        raise ValueError(f"AUC needs positive and negative labels; got {num_pos} positive and "
                         f"{num_neg} negative.")
    order = torch.argsort(scores)
    _, inverse, counts = torch.unique_consecutive(scores[order], return_inverse=True,
                                                  return_counts=True)
    # Tied scores share the mean of the ranks (1-based) they occupy.
    ends = torch.cumsum(counts, 0).double()
    midrank = ends - (counts.double() - 1) / 2
    ranks = torch.empty_like(scores)
    ranks[order] = midrank[inverse]
    pos_rank_sum = ranks[labels].sum()
    return float((pos_rank_sum - num_pos * (num_pos + 1) / 2) / (num_pos * num_neg))


def global_auc(scores: Tensor, labels: Tensor, *, sum_over_ranks: bool = True) -> float:
    """ROC AUC of ``scores`` against binary ``labels`` over every rank's edges, exact.

    Args:
        scores: This rank's scores (any shape; higher means more likely an edge), all finite.
        labels: 1 for a true edge, 0 for a negative, one per score.
        sum_over_ranks: Gather every rank's scores first (a collective: every rank must
            call). False: this rank's own AUC (evaluation on rank 0 alone).

    Raises:
        ValueError: on every rank alike, when a score is NaN or infinite, a label is neither
            0 nor 1, or the edges of all ranks lack one of the two classes.

    Example:
        >>> scores = torch.tensor([0.9, 0.8, 0.3, 0.8, 0.1])
        >>> labels = torch.tensor([1, 1, 1, 0, 0])
        >>> pyg_mgpu.global_auc(scores, labels, sum_over_ranks=False)  # (2 + 0.5 + 2) / 6
        0.75
    """
    if scores.numel() != labels.numel():
        raise ValueError(f"scores has {scores.numel()} entries and labels "
                         f"{labels.numel()}; give one label per score.")
    if sum_over_ranks:
        scores = all_gather_cat(scores.reshape(-1).double())
        labels = all_gather_cat(labels.reshape(-1).double())  # a stray 0.5 stays 0.5
    return auc(scores, labels)


def ranking_metrics(pos_scores: Tensor, neg_scores: Tensor, ks: Sequence[int] = (1, 10, 50), *,
                    sum_over_ranks: bool = True) -> dict[str, float]:
    """Mean reciprocal rank and hits@k of each positive edge against its own negatives, over
    every rank's queries, exact.

    A positive's rank is 1 plus the negatives scoring above it, ties counting half (OGB's
    link-prediction rank: the mean of its optimistic and pessimistic ranks).

    Args:
        pos_scores: ``[Q]`` (or ``[Q, 1]``) this rank's positive scores, one per query, all
            finite.
        neg_scores: ``[Q, N]`` each query's negative scores (``N >= 1``), all finite.
        ks: The cut-offs of hits@k, positive integers.
        sum_over_ranks: Sum over every rank before dividing (a collective: every rank must
            call). False: this rank's own queries.

    Returns:
        ``{"mrr": ..., "hits@1": ..., ...}``.

    Raises:
        ValueError: for inputs of the wrong shape or ``ks`` that are not positive integers
            (on the rank that passed them), and, on every rank alike, when a score of any
            rank is NaN or infinite or no rank had a query.

    Example:
        >>> pos = torch.tensor([0.9, 0.5])
        >>> neg = torch.tensor([[0.1, 0.2], [0.7, 0.5]])  # ranks 1 and 2.5
        >>> pyg_mgpu.ranking_metrics(pos, neg, ks=(1, 3), sum_over_ranks=False)
        {'mrr': 0.7, 'hits@1': 0.5, 'hits@3': 1.0}
    """
    if not (pos_scores.dim() == 1 or (pos_scores.dim() == 2 and pos_scores.size(1) == 1)):
        raise ValueError(f"pos_scores must be [queries] (or [queries, 1]), one score per "
                         f"query, got {tuple(pos_scores.shape)}.")
    pos = pos_scores.reshape(-1, 1)
    if neg_scores.dim() != 2 or neg_scores.size(0) != pos.size(0) or neg_scores.size(1) == 0:
        raise ValueError(f"neg_scores must be [queries, negatives] with {pos.size(0)} rows and "
                         f"at least one negative each, got {tuple(neg_scores.shape)}.")
    if not all(isinstance(k, int) and not isinstance(k, bool) and k > 0 for k in ks):
        raise ValueError(f"ks must be positive integers (the cut-offs of hits@k), got "
                         f"{list(ks)!r}.")
    above = (neg_scores > pos).sum(1).double()
    tied = (neg_scores == pos).sum(1).double()
    rank = 1 + above + tied / 2
    count = torch.tensor(float(rank.numel()), dtype=torch.float64, device=rank.device)
    not_finite = [(~torch.isfinite(s)).sum().double() for s in (pos_scores, neg_scores)]
    sums = torch.stack([(1 / rank).sum(), *[(rank <= k).double().sum() for k in ks], count,
                        *not_finite])
    if sum_over_ranks:
        sums = all_reduce_sum(sums)
    *sums, pos_not_finite, neg_not_finite = sums.tolist()  # the one read back
    for name, bad in (("pos_scores", pos_not_finite), ("neg_scores", neg_not_finite)):
        if bad:
            raise ValueError(f"{name} holds {int(bad)} NaN or infinite score(s) (a diverged "
                             "model?); ranks among them mean nothing: fix the model, or drop "
                             "those queries first (torch.isfinite).")
    if sums[-1] == 0:
        raise ValueError("no query was evaluated on any rank (count 0).")
    names = ["mrr", *[f"hits@{k}" for k in ks]]
    return {name: value / sums[-1] for name, value in zip(names, sums)}
