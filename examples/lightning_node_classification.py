"""Node classification with PyTorch Lightning on every GPU (or on CPU ranks), with pyg_mgpu.

PyG's Lightning recipe (a ``LightningModule`` around ``GraphSAGE``, scored with
``torchmetrics.Accuracy``) with one import changed: ``pyg_mgpu.LightningNodeData`` in place of
``torch_geometric.data.lightning.LightningNodeData``. It samples without pyg-lib or
torch-sparse, gives every rank the same number of training batches, and shows every validation
and test node to exactly one rank, so the accuracies torchmetrics syncs over the ranks are exact.

    python examples/lightning_node_classification.py                  # synthetic, 2 CPU ranks
    python examples/lightning_node_classification.py --dataset cora --root ../shared/data/planetoid
    python examples/lightning_node_classification.py --accelerator gpu --devices 4
    python examples/lightning_node_classification.py --mapped         # one copy under 'ddp'
    python examples/lightning_node_classification.py --pyg-datamodule # PyG's own class

Under ``--strategy ddp`` Lightning starts this script once per rank and each loads the dataset;
``--mapped`` reads it from the converted-graph cache instead, whose files every rank maps (one
copy in the page cache). Under ``ddp_spawn`` the ranks share this process's copy.
"""
import argparse
import json
from pathlib import Path

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch_geometric.nn import GraphSAGE
from torchmetrics import Accuracy

import pyg_mgpu
from pyg_mgpu.data import SyntheticSpec
from pyg_mgpu.data.stores import open_stores


class Model(pl.LightningModule):
    def __init__(self, in_channels: int, num_classes: int, hidden: int, lr: float):
        super().__init__()
        self.gnn = GraphSAGE(in_channels, hidden, num_layers=2, out_channels=num_classes,
                             dropout=0.5)
        self.lr = lr
        self.train_acc, self.val_acc, self.test_acc = (
            Accuracy(task="multiclass", num_classes=num_classes) for _ in range(3))
        self.steps = 0  # this rank's training batches, compared over ranks at the end

    def seed_logits(self, batch):
        return self.gnn(batch.x, batch.edge_index)[:batch.batch_size], batch.y[:batch.batch_size]

    def training_step(self, batch, batch_idx):
        logits, y = self.seed_logits(batch)
        loss = F.cross_entropy(logits, y)
        self.train_acc(logits, y)
        self.log("train_acc", self.train_acc, on_step=False, on_epoch=True,
                 batch_size=y.numel())
        self.steps += 1
        return loss

    def validation_step(self, batch, batch_idx):
        logits, y = self.seed_logits(batch)
        self.val_acc(logits, y)
        self.log("val_acc", self.val_acc, on_step=False, on_epoch=True, batch_size=y.numel())

    def test_step(self, batch, batch_idx):
        logits, y = self.seed_logits(batch)
        self.test_acc(logits, y)
        self.log("test_acc", self.test_acc, on_step=False, on_epoch=True, batch_size=y.numel())

    def on_train_epoch_end(self):
        # DDP needs every rank to run as many batches as the others: the two are equal.
        steps = self.all_gather(torch.tensor(float(self.steps)))
        self.log_dict({"steps_min": steps.min(), "steps_max": steps.max()}, sync_dist=True)
        self.steps = 0

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.lr)


def datamodule(args: argparse.Namespace) -> tuple[pyg_mgpu.LightningNodeData, int, int]:
    """The data module over the dataset, and its feature and class counts."""
    options = dict(num_neighbors=[25, 10], batch_size=args.batch_size,
                   eval_loader_kwargs=dict(num_neighbors=[-1, -1]))
    synthetic = SyntheticSpec(num_nodes=args.num_nodes, num_edges=args.num_edges)
    if args.mapped:  # the cache's files, mapped by every rank: (FeatureStore, GraphStore)
        graph = open_stores(args.dataset, args.root, synthetic=synthetic)
        return (pyg_mgpu.LightningNodeData(graph.stores, graph.train_idx, None, graph.val_idx,
                                           None, graph.test_idx, **options),
                graph.graph.num_features, graph.num_classes)
    data = pyg_mgpu.load_dataset(args.dataset, args.root, synthetic=synthetic)
    if args.pyg_datamodule:  # the class this script replaces: needs pyg-lib or torch-sparse
        from torch_geometric.data.lightning import LightningNodeData
        return LightningNodeData(data, **options), data.num_features, data.num_classes
    return pyg_mgpu.LightningNodeData(data, **options), data.num_features, data.num_classes


def main() -> None:
    p = argparse.ArgumentParser(description="GraphSAGE trained by Lightning on "
                                "pyg_mgpu.LightningNodeData.")
    p.add_argument("--dataset", default="synthetic")
    p.add_argument("--root", default=None, help="folder the dataset lives in")
    p.add_argument("--mapped", action="store_true",
                   help="read the graph from the converted-graph cache's mapped files")
    p.add_argument("--pyg-datamodule", action="store_true",
                   help="PyG's own LightningNodeData instead (needs pyg-lib or torch-sparse), "
                        "for comparison")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--strategy", default="ddp", help="ddp, ddp_spawn, ...")
    p.add_argument("--accelerator", default="cpu")
    p.add_argument("--devices", type=int, default=2)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--num-nodes", type=int, default=20_000, help="synthetic graph size")
    p.add_argument("--num-edges", type=int, default=400_000, help="synthetic graph size")
    p.add_argument("--out", type=Path, default=None, help="write the results here (JSON)")
    args = p.parse_args()

    pl.seed_everything(args.seed)
    data, num_features, num_classes = datamodule(args)
    model = Model(num_features, num_classes, args.hidden, args.lr)
    trainer = pl.Trainer(strategy=args.strategy, accelerator=args.accelerator,
                         devices=args.devices, max_epochs=args.epochs, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    trainer.fit(model, data)
    fitted = {name: float(value) for name, value in trainer.callback_metrics.items()}
    # Under ddp_spawn the fitted weights come back to this process; the test spawns again.
    results = trainer.test(model, data, verbose=False)[0]
    if trainer.is_global_zero:
        results.update(fitted, world_size=trainer.world_size)
        print(json.dumps(results))
        if args.out is not None:
            args.out.write_text(json.dumps(results))


if __name__ == "__main__":
    main()
