"""Heterogeneous node classification on several GPUs (or CPU ranks), on pyg_mgpu's public API.

PyG's heterogeneous recipe (``to_hetero`` on a GraphSAGE, a ``NeighborLoader`` over one node
type) with what the multi-GPU tutorial lacks: every rank takes an equal shard of the training
papers each epoch (``distributed=True``), metrics are sums and counts added over the ranks, and
the sampler needs neither pyg-lib nor torch-sparse. The graph is the embedded synthetic one:
papers (labelled), authors, citations and authorship.

    python examples/hetero_node_classification.py                   # every GPU, or 2 CPU ranks
    python examples/hetero_node_classification.py --devices cpu --nprocs 4 --epochs 5
"""
import argparse
import json
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch_geometric.nn import SAGEConv, to_hetero
from tqdm import tqdm

import pyg_mgpu
from pyg_mgpu.data.synthetic_hetero import SyntheticHeteroSpec, make_synthetic_hetero


class GNN(torch.nn.Module):
    """Two SAGEConv layers with lazy input sizes, as PyG's heterogeneous tutorial writes them:
    ``to_hetero`` makes one copy per edge type and sums them per destination type."""

    def __init__(self, hidden: int, out: int):
        super().__init__()
        self.conv1 = SAGEConv((-1, -1), hidden)
        # A module, not F.dropout(training=self.training): to_hetero traces forward once, and
        # would bake the training flag of that moment into the copy (dropout in evaluation too).
        self.dropout = torch.nn.Dropout(0.5)
        self.conv2 = SAGEConv((-1, -1), out)

    def forward(self, x, edge_index):
        x = self.dropout(self.conv1(x, edge_index).relu())
        return self.conv2(x, edge_index)


class PaperLogits(torch.nn.Module):
    """The model's paper outputs alone: what the loss reads, and so all DDP's forward returns.
    DDP finds the parameters without a gradient by following the autograd graph back from what
    forward returns; given the whole dict, it would count the author outputs' layer as used."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x_dict, edge_index_dict):
        return self.model(x_dict, edge_index_dict)["paper"]


def run(ctx: pyg_mgpu.RankContext, data, args: argparse.Namespace) -> None:
    sampling = dict(num_neighbors=[10, 5], batch_size=args.batch_size, distributed=True)
    train_loader = pyg_mgpu.NeighborLoader(data, input_nodes=("paper", data["paper"].train_mask),
                                           shuffle=True, **sampling)
    # Validation and test are sharded too: each rank its part, the counts added over ranks.
    val_loader = pyg_mgpu.NeighborLoader(data, input_nodes=("paper", data["paper"].val_mask),
                                         **sampling)
    test_loader = pyg_mgpu.NeighborLoader(data, input_nodes=("paper", data["paper"].test_mask),
                                          **sampling)

    torch.manual_seed(12345)  # the same initial weights on every rank
    model = to_hetero(GNN(args.hidden, data.num_classes), data.metadata(), aggr="sum")
    model = model.to(ctx.device)
    with torch.no_grad():  # lazy layers take their sizes from one batch before DDP wraps them
        first = next(iter(train_loader)).to(ctx.device)
        model(first.x_dict, first.edge_index_dict)
    # The last layer's copy for (paper, rev_writes, author) computes author outputs that the
    # loss on papers never reads: DDP must be told that some parameters get no gradient.
    ddp = DistributedDataParallel(PaperLogits(model), device_ids=[ctx.device]
                                  if ctx.device.type == "cuda" else None,
                                  find_unused_parameters=True)
    optimizer = torch.optim.Adam(ddp.parameters(), lr=args.lr)

    for epoch in range(1, args.epochs + 1):
        train_loader.set_epoch(epoch)  # a new permutation, the same on every rank
        loss_sum, seen = torch.zeros((), device=ctx.device), 0
        for batch in tqdm(train_loader, desc=f"Epoch {epoch:02d}", disable=not ctx.is_main,
                          leave=False):
            batch = batch.to(ctx.device)
            seeds = batch["paper"].batch_size
            out = ddp(batch.x_dict, batch.edge_index_dict)[:seeds]
            loss = F.cross_entropy(out, batch["paper"].y[:seeds])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            loss_sum += loss.detach() * seeds
            seen += seeds
        train_loss = pyg_mgpu.global_ratio(loss_sum, seen)
        # The unwrapped model: DDP's forward may run collectives of its own. accuracy() reads
        # the seeds' type ("paper") of the model's output dict, and sums over the ranks.
        val_acc = pyg_mgpu.accuracy(model, val_loader)
        if ctx.is_main:
            print(f"Epoch {epoch:02d}: train loss {train_loss:.4f}, val acc {val_acc:.4f}",
                  flush=True)

    test_acc = pyg_mgpu.accuracy(model, test_loader)
    if ctx.is_main:
        baseline = features_only_accuracy(data)
        metrics = {"world_size": ctx.world_size, "device": ctx.device.type,
                   "epochs": args.epochs, "train_loss": train_loss, "val_acc": val_acc,
                   "test_acc": test_acc, "features_only_test_acc": baseline}
        out = Path(args.out)
        (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
        print(f"Final: test acc {test_acc:.4f} (all {ctx.world_size} ranks, every test paper); "
              f"features only {baseline:.4f}; wrote {out / 'metrics.json'}", flush=True)
    dist.barrier()


def features_only_accuracy(data, steps: int = 200) -> float:
    """Test accuracy of a logistic regression on the papers' own features: the baseline that
    the graph has to beat."""
    paper = data["paper"]
    torch.manual_seed(0)
    linear = torch.nn.Linear(paper.x.size(1), data.num_classes)
    optimizer = torch.optim.Adam(linear.parameters(), lr=0.01)
    for _ in range(steps):
        optimizer.zero_grad()
        F.cross_entropy(linear(paper.x[paper.train_mask]), paper.y[paper.train_mask]).backward()
        optimizer.step()
    with torch.no_grad():
        predicted = linear(paper.x[paper.test_mask]).argmax(-1)
    return float((predicted == paper.y[paper.test_mask]).float().mean())


def main() -> None:
    p = argparse.ArgumentParser(description="Heterogeneous node classification on pyg_mgpu.")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--devices", default="auto", help="auto, cpu, cuda or cuda:0,1,...")
    p.add_argument("--nprocs", type=int, default=None, help="CPU ranks (default 2)")
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--num-papers", type=int, default=20_000)
    p.add_argument("--num-authors", type=int, default=10_000)
    p.add_argument("--out", default="runs/hetero_example", help="folder for metrics.json")
    args = p.parse_args()
    if args.epochs < 1:
        p.error(f"--epochs must be at least 1, got {args.epochs}")
    papers, authors = args.num_papers, args.num_authors
    data = make_synthetic_hetero(SyntheticHeteroSpec(
        num_papers=papers, num_authors=authors, num_cites=5 * papers, num_writes=6 * authors))
    Path(args.out).mkdir(parents=True, exist_ok=True)
    pyg_mgpu.spawn(run, args=(data, args), devices=args.devices, nprocs=args.nprocs)


if __name__ == "__main__":
    main()
