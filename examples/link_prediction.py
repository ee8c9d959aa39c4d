"""Heterogeneous link prediction on several GPUs (or CPU ranks), on pyg_mgpu's public API.

PyG's link-prediction recipe (``to_hetero`` GraphSAGE, a dot-product decoder,
``LinkNeighborLoader`` with one negative per positive) with what a multi-GPU run needs: every
rank takes an equal shard of the training edges each epoch (``distributed=True``), draws its own
negatives, and the test AUC is computed over every rank's edges at once (``global_auc``). The
graph is embedded: users buy items mostly of their own taste group, and both carry weak, noisy
features of that group.

    python examples/link_prediction.py                    # every GPU, or 2 CPU ranks
    python examples/link_prediction.py --devices cpu --nprocs 4 --epochs 5
"""
import argparse
import json
import random
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
import torch_geometric.transforms as T
from torch.nn.parallel import DistributedDataParallel
from torch_geometric.data import HeteroData
from torch_geometric.nn import SAGEConv, to_hetero
from tqdm import tqdm

import pyg_mgpu

BUYS, REV = ("user", "buys", "item"), ("item", "rev_buys", "user")


def user_item_graph(num_users: int, num_items: int, groups: int = 8, per_user: int = 8,
                    seed: int = 0) -> HeteroData:
    """Users buying items, 90% of them in the user's own taste group; features: the group as
    a one-hot of strength 1 under unit noise."""
    gen = torch.Generator().manual_seed(seed)
    user_group = torch.randint(groups, (num_users,), generator=gen)
    item_group = torch.randint(groups, (num_items,), generator=gen)
    by_group = [torch.nonzero(item_group == g).view(-1) for g in range(groups)]
    users = torch.arange(num_users).repeat_interleave(per_user)
    items = torch.randint(num_items, (users.numel(),), generator=gen)  # the 10% off-taste buys
    own = torch.rand(users.numel(), generator=gen) < 0.9
    for g, group_items in enumerate(by_group):
        pick = own & (user_group[users] == g)
        items[pick] = group_items[torch.randint(group_items.numel(), (int(pick.sum()),),
                                                generator=gen)]
    data = HeteroData()
    for name, group in (("user", user_group), ("item", item_group)):
        data[name].x = F.one_hot(group, 16).float() + torch.randn(group.numel(), 16,
                                                                         generator=gen)
    data[BUYS].edge_index = torch.stack([users, items]).unique(dim=1)
    return T.ToUndirected()(data)  # adds (item, rev_buys, user)


class Encoder(torch.nn.Module):
    """Two SAGEConv layers with lazy input sizes; ``to_hetero`` makes one per edge type."""

    def __init__(self, hidden: int):
        super().__init__()
        self.conv1, self.conv2 = SAGEConv((-1, -1), hidden), SAGEConv((-1, -1), hidden)

    def forward(self, x, edge_index):
        return self.conv2(self.conv1(x, edge_index).relu(), edge_index)


class LinkPredictor(torch.nn.Module):
    """Node embeddings per type, and a link's score: the dot product of its ends'."""

    def __init__(self, hidden: int, metadata):
        super().__init__()
        self.encoder = to_hetero(Encoder(hidden), metadata, aggr="sum")

    def forward(self, x_dict, edge_index_dict, edge_label_index):
        z = self.encoder(x_dict, edge_index_dict)
        return (z["user"][edge_label_index[0]] * z["item"][edge_label_index[1]]).sum(-1)


def run(ctx: pyg_mgpu.RankContext, train_data, test_data, args: argparse.Namespace) -> None:
    train_loader = pyg_mgpu.LinkNeighborLoader(
        train_data, [10, 5], edge_label_index=(BUYS, train_data[BUYS].edge_label_index),
        neg_sampling_ratio=1.0, batch_size=args.batch_size, shuffle=True, distributed=True)
    # Every test edge (positives and the split's negatives) on one rank or another.
    test_loader = pyg_mgpu.LinkNeighborLoader(
        test_data, [10, 5], edge_label_index=(BUYS, test_data[BUYS].edge_label_index),
        edge_label=test_data[BUYS].edge_label, batch_size=args.batch_size, distributed=True)

    torch.manual_seed(12345)  # the same initial weights on every rank
    model = LinkPredictor(args.hidden, train_data.metadata()).to(ctx.device)
    with torch.no_grad():  # lazy layers take their sizes from one batch before DDP wraps them
        first = next(iter(train_loader)).to(ctx.device)
        model(first.x_dict, first.edge_index_dict, first[BUYS].edge_label_index)
    ddp = DistributedDataParallel(model, device_ids=[ctx.device] if ctx.device.type == "cuda"
                                  else None)
    optimizer = torch.optim.Adam(ddp.parameters(), lr=args.lr)
    for epoch in range(1, args.epochs + 1):
        train_loader.set_epoch(epoch)  # a new permutation, the same on every rank
        loss_sum, seen = torch.zeros((), device=ctx.device), 0
        for batch in tqdm(train_loader, desc=f"Epoch {epoch:02d}", disable=not ctx.is_main,
                          leave=False):
            batch = batch.to(ctx.device)
            label = batch[BUYS].edge_label
            out = ddp(batch.x_dict, batch.edge_index_dict, batch[BUYS].edge_label_index)
            loss = F.binary_cross_entropy_with_logits(out, label)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            loss_sum += loss.detach() * label.numel()
            seen += label.numel()
        train_loss = pyg_mgpu.global_ratio(loss_sum, seen)
        if ctx.is_main:
            print(f"Epoch {epoch:02d}: train loss {train_loss:.4f}", flush=True)

    scores, labels = [], []
    model.eval()
    with torch.no_grad():
        for batch in test_loader:
            batch = batch.to(ctx.device)
            scores.append(model(batch.x_dict, batch.edge_index_dict,
                                batch[BUYS].edge_label_index))
            labels.append(batch[BUYS].edge_label)
    test_auc = pyg_mgpu.global_auc(torch.cat(scores), torch.cat(labels))  # over every rank
    if ctx.is_main:
        baseline = features_only_auc(train_data, test_data)
        metrics = {"world_size": ctx.world_size, "device": ctx.device.type,
                   "epochs": args.epochs, "train_loss": train_loss, "test_auc": test_auc,
                   "features_only_test_auc": baseline}
        out = Path(args.out)
        (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
        print(f"Final: test AUC {test_auc:.4f} (all {ctx.world_size} ranks, every test edge); "
              f"features only {baseline:.4f}; wrote {out / 'metrics.json'}", flush=True)
    dist.barrier()


def features_only_auc(train_data, test_data, steps: int = 200) -> float:
    """Test AUC of a logistic regression on the product of a user's and an item's features:
    the baseline that the graph has to beat."""
    def pairs(data, edge_label_index):
        return data["user"].x[edge_label_index[0]] * data["item"].x[edge_label_index[1]]
    torch.manual_seed(0)
    positive = train_data[BUYS].edge_label_index
    negative = torch.stack([torch.randint(train_data["user"].num_nodes, (positive.size(1),)),
                            torch.randint(train_data["item"].num_nodes, (positive.size(1),))])
    x = pairs(train_data, torch.cat([positive, negative], 1))
    y = torch.cat([torch.ones(positive.size(1)), torch.zeros(negative.size(1))])
    linear = torch.nn.Linear(x.size(1), 1)
    optimizer = torch.optim.Adam(linear.parameters(), lr=0.01)
    for _ in range(steps):
        optimizer.zero_grad()
        F.binary_cross_entropy_with_logits(linear(x).view(-1), y).backward()
        optimizer.step()
    with torch.no_grad():
        scores = linear(pairs(test_data, test_data[BUYS].edge_label_index)).view(-1)
    return pyg_mgpu.global_auc(scores, test_data[BUYS].edge_label, sum_over_ranks=False)


def main() -> None:
    p = argparse.ArgumentParser(description="Heterogeneous link prediction on pyg_mgpu.")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--devices", default="auto", help="auto, cpu, cuda or cuda:0,1,...")
    p.add_argument("--nprocs", type=int, default=None, help="CPU ranks (default 2)")
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--num-users", type=int, default=4000)
    p.add_argument("--num-items", type=int, default=2000)
    p.add_argument("--out", default="runs/link_example", help="folder for metrics.json")
    args = p.parse_args()
    if args.epochs < 1:
        p.error(f"--epochs must be at least 1, got {args.epochs}")
    # The split's edges and negatives (PyG's negative_sampling draws with Python's random).
    torch.manual_seed(0)
    random.seed(0)
    # Training links to predict are kept out of the graph the model sees (30% of the training
    # edges), or the model would learn to find each link in its own neighbourhood.
    split = T.RandomLinkSplit(num_val=0.1, num_test=0.1, disjoint_train_ratio=0.3,
                              neg_sampling_ratio=1.0, add_negative_train_samples=False,
                              edge_types=[BUYS], rev_edge_types=[REV])
    train_data, _, test_data = split(user_item_graph(args.num_users, args.num_items))
    Path(args.out).mkdir(parents=True, exist_ok=True)
    pyg_mgpu.spawn(run, args=(train_data, test_data, args), devices=args.devices,
                   nprocs=args.nprocs)


if __name__ == "__main__":
    main()
