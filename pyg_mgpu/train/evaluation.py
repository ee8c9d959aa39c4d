"""``pyg_mgpu.evaluation``: the evaluation helpers for PyG users' own loops, by the module name
they are documented under. Exact metrics over ranks live in :mod:`pyg_mgpu.metrics`, layer-wise
inference in :mod:`pyg_mgpu.inference.layerwise`; the CLI's rank evaluates through the same
functions (:class:`~pyg_mgpu.train.evaluator.Evaluator`).
"""
from pyg_mgpu.inference.layerwise import layerwise_inference
from pyg_mgpu.metrics.accuracy import accuracy
from pyg_mgpu.metrics.batches import compute_features, seed_outputs, seed_store
from pyg_mgpu.metrics.reduce import all_reduce_sum, global_ratio

__all__ = ["accuracy", "all_reduce_sum", "compute_features", "global_ratio",
           "layerwise_inference", "seed_outputs", "seed_store"]
