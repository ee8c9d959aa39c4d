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
from pyg_mgpu.data.csc import share_data
from pyg_mgpu.data.datasets import load_dataset
from pyg_mgpu.data.pinned import pinned_data
from pyg_mgpu.distributed.context import JobStopped, RankContext, RankFailed
from pyg_mgpu.distributed.launch import spawn
from pyg_mgpu.sampling.bidirectional import BidirectionalNeighborSampler
from pyg_mgpu.sampling.link_neighbor_loader import LinkNeighborLoader
from pyg_mgpu.sampling.neighbor_loader import NeighborLoader
from pyg_mgpu.sampling.neighbor_sampler import NeighborSampler
from pyg_mgpu.train import evaluation
from pyg_mgpu.train.evaluation import accuracy, global_ratio, layerwise_inference
from pyg_mgpu.train.ranking import global_auc, ranking_metrics

__all__ = [
    "BidirectionalNeighborSampler",
    "JobStopped",
    "LinkNeighborLoader",
    "NeighborLoader",
    "NeighborSampler",
    "RankContext",
    "RankFailed",
    "accuracy",
    "evaluation",
    "global_auc",
    "global_ratio",
    "layerwise_inference",
    "load_dataset",
    "pinned_data",
    "ranking_metrics",
    "share_data",
    "spawn",
]
