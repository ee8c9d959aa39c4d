"""pyg_mgpu: multi-GPU (or multi-CPU-rank) minibatch GNN training for PyTorch Geometric users.

The public API, in pipeline order::

    data = pyg_mgpu.load_dataset("reddit", root="data/reddit")     # PyG Data with split masks
    pyg_mgpu.spawn(train, args=(data,))                             # one rank per GPU, data shared

    def train(ctx, data):                                           # ctx: rank, world_size, device
        loader = pyg_mgpu.NeighborLoader(data, [25, 10], input_nodes=data.train_mask,
                                         batch_size=1024, shuffle=True, distributed=True)
        ...                                                         # your model, DDP, your loop
        val_acc = pyg_mgpu.accuracy(model, val_loader)              # exact over ranks

``NeighborLoader``, ``NeighborSampler`` and ``BidirectionalNeighborSampler`` are PyG's classes driven
by a sampler in plain torch,
so they need neither pyg-lib nor torch-sparse. See docs/api.md.
"""
from __future__ import annotations

import importlib
import sys
import types
from typing import Any

# Each public name and the module that defines it. They are imported when first used, so that
# ``python -m pyg_mgpu.distributed_sampling`` (which imports this package first) reaches its own
# code, its flag checks and its Ctrl-C handling, before torch and PyG have loaded.
_HOMES = {
    "BidirectionalNeighborSampler": "pyg_mgpu.sampling.bidirectional",
    "JobStopped": "pyg_mgpu.distributed.context",
    "LightningLinkData": "pyg_mgpu.lightning",
    "LightningNodeData": "pyg_mgpu.lightning",
    "LinkNeighborLoader": "pyg_mgpu.sampling.link_neighbor_loader",
    "NeighborLoader": "pyg_mgpu.sampling.neighbor_loader",
    "NeighborSampler": "pyg_mgpu.sampling.neighbor_sampler",
    "RankContext": "pyg_mgpu.distributed.context",
    "RankFailed": "pyg_mgpu.distributed.context",
    "accuracy": "pyg_mgpu.metrics.accuracy",
    "evaluation": "pyg_mgpu.train",
    "global_auc": "pyg_mgpu.metrics.ranking",
    "global_ratio": "pyg_mgpu.metrics.reduce",
    "layerwise_inference": "pyg_mgpu.inference.layerwise",
    "load_dataset": "pyg_mgpu.data.datasets",
    "pinned_data": "pyg_mgpu.data.pinned",
    "predict": "pyg_mgpu.inference.predictions",
    "ranking_metrics": "pyg_mgpu.metrics.ranking",
    "share_data": "pyg_mgpu.data.csc",
    "share_sampling": "pyg_mgpu.sampling.sampling_graph",
    "spawn": "pyg_mgpu.distributed.launch",
}

__all__ = sorted(_HOMES)


class _Package(types.ModuleType):
    """This package, keeping ``predict`` the library's function: importing the command module
    ``pyg_mgpu.predict`` (``python -m pyg_mgpu.predict``) would otherwise rebind the name to
    that module, and what ``pyg_mgpu.predict`` is would depend on what was imported before."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "predict" and isinstance(value, types.ModuleType):
            return  # the submodule stays reachable as sys.modules["pyg_mgpu.predict"]
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'pyg_mgpu' has no attribute {name!r}")
    module = importlib.import_module(home)
    value = (importlib.import_module(f"{home}.{name}") if not hasattr(module, name)
             else getattr(module, name))
    globals()[name] = value  # looked up once
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
