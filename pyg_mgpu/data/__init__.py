"""Datasets, the graph store every dataset is converted to, and its PyG ``Data`` form.

The names below are imported when first used: a job's parent that loads a synthetic, ``.npz``
or cached graph never imports PyG (a couple of seconds on every run), its ranks do.
"""
from __future__ import annotations

import importlib
from typing import Any

_HOMES = {
    "CachedGraph": "pyg_mgpu.data.stores",
    "ConvertedGraph": "pyg_mgpu.data.graph",
    "DATASETS": "pyg_mgpu.data.datasets",
    "DatasetError": "pyg_mgpu.data.validation",
    "SyntheticSpec": "pyg_mgpu.data.synthetic",
    "load_dataset": "pyg_mgpu.data.datasets",
    "load_graph": "pyg_mgpu.data.datasets",
    "make_synthetic": "pyg_mgpu.data.synthetic",
    "open_stores": "pyg_mgpu.data.stores",
}

HETERO_DATASETS = ("ogbn-mag", "synthetic-hetero")
"""Dataset names that :func:`pyg_mgpu.load_dataset` returns as a ``HeteroData`` (named here,
where nothing imports torch, so that the CLI refuses a setting they lack at once)."""

__all__ = sorted([*_HOMES, "HETERO_DATASETS"])


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:  # a submodule not imported yet (pyg_mgpu.data.cache) is found by import
        raise AttributeError(f"module 'pyg_mgpu.data' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOMES))
