"""The models the CLI trains, and each model's own recipe: the settings its paper or PyG's
example for it fixes, which a run takes unless a flag says otherwise."""
from __future__ import annotations

from pyg_mgpu.nn import HETERO_MODELS

# "pyg_mgpu": trimmed layers, embedding-bag mean aggregation, fused ReLU/byte dropout. "pyg":
# PyG's multi-GPU example as written (every layer on every sampled node, gather/scatter
# messages, torch dropout), kept as the benchmark baseline.
RECIPES = ("pyg_mgpu", "pyg")
# "sage": our GraphSAGE (the fast path above); gcn, gat, gin: PyG's models (nn/models.py). On a
# heterogeneous dataset: sage = SAGEConv per edge type, rgcn = R-GCN (nn/hetero.py).
HOMOGENEOUS_MODELS = ("sage", "gcn", "gat", "gin")
MODELS = HOMOGENEOUS_MODELS + tuple(m for m in HETERO_MODELS if m not in HOMOGENEOUS_MODELS)
# Normalization after each hidden layer of PyG's models (--model gcn, gat, gin), and inside
# GIN's MLPs: PyG's BatchNorm (per batch in training, running statistics in evaluation) or
# LayerNorm over each node's features.
NORMS = ("none", "batch", "layer")
# Each model's own defaults for the settings its paper or PyG's example for it fixes; a flag the
# user gives always wins (TrainConfig.recipe_sources says which came from where).
MODEL_RECIPES = {
    # Our GraphSAGE: the settings the synthetic default and Cora are measured with (README).
    "sage": {"lr": 0.003, "hidden": 256, "dropout": 0.5, "weight_decay": 0.0, "heads": 8,
             "norm": "none"},
    # Kipf & Welling's GCN as PyG's examples/gcn.py trains it on Cora, but 256 hidden channels
    # instead of 16, which trained better on sampled batches (CHANGELOG, 2026-11-26).
    "gcn": {"lr": 0.01, "hidden": 256, "dropout": 0.5, "weight_decay": 5e-4, "heads": 8,
            "norm": "none"},
    # Velickovic et al.'s GAT as PyG's examples/gat.py: 8 heads of 8 channels.
    "gat": {"lr": 0.005, "hidden": 64, "dropout": 0.6, "weight_decay": 5e-4, "heads": 8,
            "norm": "none"},
    # GIN (Xu et al.) normalizes inside its MLPs (BatchNorm in the paper and PyG's
    # examples/gin.py). On Cora's small sampled batches LayerNorm per node trained best, and
    # without normalization at hidden 256 its ReLUs died (CHANGELOG, 2026-11-26).
    "gin": {"lr": 0.01, "hidden": 64, "dropout": 0.5, "weight_decay": 5e-4, "heads": 8,
            "norm": "layer"},
    # R-GCN (heterogeneous datasets only) as OGB's sampled ogbn-mag baseline trains it.
    "rgcn": {"lr": 0.01, "hidden": 64, "dropout": 0.5, "weight_decay": 0.0, "heads": 8,
             "norm": "none"},
}
RECIPE_FIELDS = ("lr", "hidden", "dropout", "weight_decay", "heads", "norm")
