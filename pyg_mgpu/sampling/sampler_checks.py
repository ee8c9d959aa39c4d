"""What :class:`~pyg_mgpu.sampling.neighbor_sampler.NeighborSampler` refuses, in one place: an
input it cannot sample, option combinations it does not support (in PyG's words where PyG has
them), and seeds that do not fit its graph.
"""
from __future__ import annotations

from typing import Optional

from torch_geometric.data import Data
from torch_geometric.sampler.base import SubgraphType

from pyg_mgpu.sampling import remote, temporal

_INPUT_ERROR = ("pyg_mgpu.NeighborSampler samples a torch_geometric.data.Data, a HeteroData "
                "or a (FeatureStore, GraphStore) pair; got something else.")
_SEEDS_ERROR = ("this sampler was built on a homogeneous graph: its seeds are one tensor of "
                "node ids, not a dict per node type.")
_HETERO_SEEDS_ERROR = ("a HeteroData sampler takes its seeds per node type: use "
                       "input_nodes=(node_type, index_or_mask).")


def check_input(data, hetero: bool) -> None:
    """``data`` is a ``Data``, a ``HeteroData`` or a ``(FeatureStore, GraphStore)`` pair."""
    if not hetero and not isinstance(data, Data) and not remote.is_remote(data):
        raise ValueError(_INPUT_ERROR)


def check_options(data, *, disjoint: bool, subgraph_type, time_attr: Optional[str],
                  weight_attr: Optional[str], sample_direction: str,
                  temporal_strategy: str) -> None:
    """Every option combination the sampler refuses, in PyG's words where it has them."""
    if sample_direction not in ("forward", "backward"):
        raise ValueError(f"sample_direction must be 'forward' or 'backward', got "
                         f"{sample_direction!r}.")
    if remote.is_remote(data) and weight_attr is not None:  # as PyG's sampler
        raise NotImplementedError("'weight_attr' is not supported for "
                                  "'(FeatureStore, GraphStore)' inputs.")
    if SubgraphType(subgraph_type) == SubgraphType.induced and (disjoint or time_attr):
        raise ValueError("'disjoint' sampling (temporal sampling is disjoint) is not supported "
                         "with subgraph_type='induced' (neither is it in PyG); use "
                         "'directional' or 'bidirectional'.")
    # pyg-lib refuses an unknown strategy on every call, temporal or not
    if temporal_strategy not in temporal.STRATEGIES:
        raise ValueError(f"temporal_strategy must be one of {temporal.STRATEGIES}, got "
                         f"{temporal_strategy!r}.")
    if time_attr is None:
        return
    if sample_direction == "backward":
        raise NotImplementedError("Temporal Sampling not yet supported for backward sampling")
    if weight_attr is not None:
        raise ValueError("weighted temporal sampling is not supported (weight_attr with "
                         "time_attr); pass one of them.")


def check_seeds(seed, seed_time, *, is_hetero: bool, is_temporal: bool,
                node_types: Optional[list] = None) -> None:
    """``seed`` (and ``seed_time``) as the sampler's graph takes them: one tensor of node ids
    on a homogeneous graph, a dict per node type of the graph on a heterogeneous one; times
    only for temporal sampling."""
    if isinstance(seed, dict) != is_hetero:
        raise ValueError(_HETERO_SEEDS_ERROR if is_hetero else _SEEDS_ERROR)
    if seed_time is not None and not is_temporal:
        raise ValueError("input_time was given, but the sampler has no time_attr; pass "
                         "time_attr (the node or edge timestamps) for temporal sampling.")
    if is_hetero:
        unknown = sorted(set(seed) - set(node_types))
        if unknown:
            raise ValueError(f"seeds of node type(s) {unknown}, which the graph does not have; "
                             f"its node types are {node_types}.")
