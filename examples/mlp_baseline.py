"""Features-only baseline: how much of the accuracy comes from the graph?

    python examples/mlp_baseline.py --dataset synthetic
    python examples/mlp_baseline.py --dataset cora --root ../shared/data/planetoid
    python examples/mlp_baseline.py --dataset synthetic-hetero    # the labelled type's features

Trains a 2-layer MLP full-batch on the same splits and prints best-validation test accuracy,
to compare with ``python -m pyg_mgpu.distributed_sampling`` on the same dataset.
"""
import argparse

import torch
import torch.nn.functional as F

from torch_geometric.data import HeteroData

from pyg_mgpu.data import load_dataset


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default="synthetic")
    p.add_argument("--root", default=None)
    p.add_argument("--epochs", type=int, default=200)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    data = load_dataset(args.dataset, args.root, seed=args.seed)
    if isinstance(data, HeteroData):  # the labelled node type's own features and splits
        num_classes = data.num_classes
        data = next(data[t] for t in data.node_types if "y" in data[t])
        data.num_classes = num_classes
    torch.manual_seed(args.seed)
    model = torch.nn.Sequential(torch.nn.Linear(data.num_features, args.hidden), torch.nn.ReLU(),
                                torch.nn.Dropout(0.5), torch.nn.Linear(args.hidden,
                                                                       data.num_classes))
    opt = torch.optim.Adam(model.parameters(), lr=args.lr, weight_decay=5e-4)

    def accuracy(mask: torch.Tensor) -> float:
        model.eval()
        with torch.no_grad():
            return float((model(data.x[mask]).argmax(-1) == data.y[mask]).float().mean())

    best_val, test_at_best = -1.0, 0.0
    for _ in range(args.epochs):
        model.train()
        opt.zero_grad()
        F.cross_entropy(model(data.x[data.train_mask]), data.y[data.train_mask]).backward()
        opt.step()
        val = accuracy(data.val_mask)
        if val > best_val:
            best_val, test_at_best = val, accuracy(data.test_mask)
    print(f"{args.dataset} MLP: best val acc {best_val:.4f} | test acc {test_at_best:.4f}")


if __name__ == "__main__":
    main()
