"""Your own model and training loop on every GPU (or on CPU ranks), with pyg_mgpu.

The model is written here with PyG's layer API (a stack of ``GATConv``) and trained by a plain
PyG loop. pyg_mgpu supplies the distributed parts only:

- ``pyg_mgpu.spawn``: one rank per GPU (or 2 CPU ranks), the graph shared once by all ranks;
- ``pyg_mgpu.NeighborLoader(..., distributed=True)``: PyG's loader, each rank a shard of the
  nodes and every rank the same number of batches (DDP never waits on a finished rank);
and it scores with torchmetrics, as PyG's multi-GPU examples do: ``MulticlassAccuracy`` adds its
correct predictions and node counts over the ranks when it computes, and since the loaders show
every evaluation node to exactly one rank, the accuracy is the whole split's (``pyg_mgpu.accuracy``
computes the same sums, and divides in float64).

    python examples/custom_model.py
    python examples/custom_model.py --dataset cora --root ../shared/data/planetoid --epochs 20
"""
import argparse

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch_geometric.nn import GATConv
from torch_geometric.utils import trim_to_layer
from torchmetrics.classification import MulticlassAccuracy

import pyg_mgpu
from pyg_mgpu.data import DatasetError, SyntheticSpec


class GAT(torch.nn.Module):
    """GATConv layers: hidden ones concatenate ``heads`` heads, the output layer has one."""

    def __init__(self, in_channels: int, hidden_channels: int, out_channels: int,
                 num_layers: int = 2, heads: int = 8, dropout: float = 0.5):
        super().__init__()
        self.dropout = dropout
        self.convs = torch.nn.ModuleList()
        for i in range(num_layers):
            last = i == num_layers - 1
            self.convs.append(GATConv(in_channels if i == 0 else hidden_channels,
                                      out_channels if last else hidden_channels // heads,
                                      heads=1 if last else heads))

    def forward(self, x, edge_index, num_sampled_nodes=None, num_sampled_edges=None):
        for i, conv in enumerate(self.convs):
            if num_sampled_nodes is not None:
                # Layer i feeds only nodes within (num_layers - i) hops of the seeds: PyG's
                # trim_to_layer drops the outer hops' nodes and edges. Same outputs on the
                # seeds, less work. Needs the batch's per-hop counts (the loader gives them).
                x, edge_index, _ = trim_to_layer(i, num_sampled_nodes, num_sampled_edges,
                                                 x, edge_index)
            x = F.dropout(x, p=self.dropout, training=self.training)
            x = conv(x, edge_index)
            if i < len(self.convs) - 1:
                x = F.elu(x)
        return x


@torch.no_grad()
def evaluate(model: torch.nn.Module, loader, metric: MulticlassAccuracy, device) -> float:
    """The accuracy over every rank's shard of ``loader``'s nodes: each rank counts its own,
    and ``compute`` sums the counts over the ranks (every rank must call it)."""
    model.eval()
    metric.reset()
    for batch in loader:
        batch = batch.to(device)
        out = model(batch.x, batch.edge_index, batch.num_sampled_nodes,
                    batch.num_sampled_edges)[:batch.batch_size]
        metric.update(out.argmax(dim=-1), batch.y[:batch.batch_size])
    return float(metric.compute())


def train(ctx: pyg_mgpu.RankContext, data, args: argparse.Namespace) -> None:
    sampling = dict(num_neighbors=[10, 10], batch_size=args.batch_size, distributed=True)
    train_loader = pyg_mgpu.NeighborLoader(data, input_nodes=data.train_mask, shuffle=True,
                                           **sampling)
    val_loader = pyg_mgpu.NeighborLoader(data, input_nodes=data.val_mask, **sampling)
    test_loader = pyg_mgpu.NeighborLoader(data, input_nodes=data.test_mask, **sampling)

    torch.manual_seed(0)
    model = GAT(data.num_features, args.hidden, data.num_classes).to(ctx.device)
    # DDP averages the gradients over the ranks at every backward.
    ddp = DistributedDataParallel(model, device_ids=[ctx.device] if ctx.device.type == "cuda"
                                  else None)
    optimizer = torch.optim.Adam(ddp.parameters(), lr=args.lr, weight_decay=5e-4)
    # average="micro": correct predictions over all nodes, not a mean over classes.
    metric = MulticlassAccuracy(data.num_classes, average="micro").to(ctx.device)

    for epoch in range(1, args.epochs + 1):
        ddp.train()
        train_loader.set_epoch(epoch)  # the epoch's shuffle, identical on every rank
        for batch in train_loader:
            batch = batch.to(ctx.device)
            optimizer.zero_grad()
            out = ddp(batch.x, batch.edge_index, batch.num_sampled_nodes,
                      batch.num_sampled_edges)[:batch.batch_size]  # the seeds come first
            loss = F.cross_entropy(out, batch.y[:batch.batch_size])
            loss.backward()
            optimizer.step()
        # Every rank evaluates its shard and the metric sums over the ranks, so every rank
        # calls it. Pass the unwrapped model: DDP's forward is for training.
        val_acc = evaluate(model, val_loader, metric, ctx.device)
        if ctx.is_main:
            print(f"epoch {epoch:02d}: loss {loss.item():.4f} (rank 0's last batch), "
                  f"val acc {val_acc:.4f}", flush=True)

    test_acc = evaluate(model, test_loader, metric, ctx.device)
    if ctx.is_main:
        print(f"val acc {val_acc:.4f} | test acc {test_acc:.4f} | {ctx.world_size} ranks on "
              f"{ctx.device.type}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description="A GAT written in this script, trained on every "
                                            "GPU (or CPU ranks) with pyg_mgpu.")
    p.add_argument("--dataset", default="synthetic")
    p.add_argument("--root", default=None, help="folder the dataset lives in")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--devices", default="auto", help="auto, cpu, cuda or cuda:0,1,...")
    p.add_argument("--nprocs", type=int, default=None, help="CPU ranks (default 2)")
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.005)
    p.add_argument("--num-nodes", type=int, default=50_000, help="synthetic graph size")
    p.add_argument("--num-edges", type=int, default=1_000_000, help="synthetic graph size")
    args = p.parse_args()
    if args.epochs < 1:
        p.error(f"--epochs must be at least 1, got {args.epochs}")

    try:
        data = pyg_mgpu.load_dataset(args.dataset, args.root, synthetic=SyntheticSpec(
            num_nodes=args.num_nodes, num_edges=args.num_edges))
    except DatasetError as e:  # unknown name, files missing or unreadable: the message says
        p.error(str(e))        # what to pass instead
    pyg_mgpu.spawn(train, args=(data, args), devices=args.devices, nprocs=args.nprocs)


if __name__ == "__main__":
    main()
