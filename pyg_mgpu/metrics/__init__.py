"""Exact metrics over every rank's predictions: sums and counts (or every rank's scores)
combined over the ranks in one collective, divided once.

Node classification: :func:`accuracy` of a model on a loader's seed nodes, and
:func:`global_ratio` for any other sum over a count. Link prediction: :func:`global_auc` (ROC AUC
over every rank's edges) and :func:`ranking_metrics` (MRR and hits@k of each positive against
its own negatives). Each is a collective by default (every rank calls it), or this rank's own
with ``sum_over_ranks=False``.
"""
from pyg_mgpu.metrics.accuracy import accuracy
from pyg_mgpu.metrics.ranking import global_auc, ranking_metrics
from pyg_mgpu.metrics.reduce import all_gather_cat, all_reduce_sum, global_ratio

__all__ = ["accuracy", "all_gather_cat", "all_reduce_sum", "global_auc", "global_ratio",
           "ranking_metrics"]
