"""PyG's multi-GPU tutorial, run on Cora with 2 CPU ranks: its "Test acc" and its dropped nodes.

This is PyG's ``examples/multi_gpu/distributed_sampling.py`` at release 2.8.0.post1 (the same
file as 2.7.0 and 2.8.0) with only what it takes to run here changed:

- Cora (``Planetoid``, from the raw files under ``--root``) instead of Reddit, and 2 ranks
  instead of one per GPU (``torch.cuda.device_count()``).
- gloo on CPU instead of NCCL on GPUs: ``device`` is the CPU where the tutorial uses ``rank``,
  DDP gets no ``device_ids``, and ``ReduceOp.AVG`` (which gloo lacks) is a SUM divided by the
  world size.
- ``pyg_mgpu.NeighborLoader`` instead of PyG's (PyG's needs pyg-lib to draw a batch), with
  ``num_workers=0`` and no ``persistent_workers`` (which needs workers).
- A free port instead of 12355; ``--root`` and ``--batch-size`` flags (tutorial: 1024).
- Added lines: each rank prints its shard sizes and batch counts, and after training the same
  model is evaluated on every node of ``val_mask`` and of ``test_mask`` with
  ``pyg_mgpu.accuracy`` (the tutorial's "Test acc" is taken on ``val_mask``).

Planetoid writes ``processed/`` beside ``raw/``, so give it a writable copy of the data:

    cp -r ../shared/data/planetoid /tmp/planetoid
    python benchmarks/from_tutorial/tutorial_on_cora.py --root /tmp/planetoid --batch-size 64
    python benchmarks/from_tutorial/tutorial_on_cora.py --root /tmp/planetoid --batch-size 1024
"""
import argparse
import os
import socket
from math import ceil

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import Tensor
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from torch_geometric.datasets import Planetoid
from torch_geometric.nn import SAGEConv

import pyg_mgpu
from pyg_mgpu import NeighborLoader


class SAGE(torch.nn.Module):
    def __init__(
        self,
        in_channels: int,
        hidden_channels: int,
        out_channels: int,
        num_layers: int = 2,
    ) -> None:
        super().__init__()
        self.convs = torch.nn.ModuleList()
        self.convs.append(SAGEConv(in_channels, hidden_channels))
        for _ in range(num_layers - 2):
            self.convs.append(SAGEConv(hidden_channels, hidden_channels))
        self.convs.append(SAGEConv(hidden_channels, out_channels))

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        for i, conv in enumerate(self.convs):
            x = conv(x, edge_index)
            if i < len(self.convs) - 1:
                x = x.relu()
                x = F.dropout(x, p=0.5, training=self.training)
        return x


@torch.no_grad()
def test(
    loader: NeighborLoader,
    model: DistributedDataParallel,
    device: torch.device,
) -> Tensor:
    model.eval()
    total_correct = torch.tensor(0, dtype=torch.long, device=device)
    total_examples = 0
    for batch in loader:
        out = model(batch.x, batch.edge_index.to(device))
        pred = out[:batch.batch_size].argmax(dim=-1)
        y = batch.y[:batch.batch_size].to(device)
        total_correct += (pred == y).sum()
        total_examples += batch.batch_size

    return total_correct / total_examples


def run(rank: int, world_size: int, dataset: Planetoid, port: int,
        batch_size: int) -> None:
    os.environ['MASTER_ADDR'] = 'localhost'
    os.environ['MASTER_PORT'] = str(port)
    dist.init_process_group('gloo', rank=rank, world_size=world_size)
    device = torch.device('cpu')

    data = dataset[0]
    data = data.to(device, 'x', 'y')  # Move to device for faster feature fetch.

    # Split indices into `world_size` many chunks:
    train_idx = data.train_mask.nonzero(as_tuple=False).view(-1)
    train_idx = train_idx.split(ceil(train_idx.size(0) / world_size))[rank]
    val_idx = data.val_mask.nonzero(as_tuple=False).view(-1)
    val_idx = val_idx.split(ceil(val_idx.size(0) / world_size))[rank]
    test_idx = data.val_mask.nonzero(as_tuple=False).view(-1)
    test_idx = test_idx.split(ceil(test_idx.size(0) / world_size))[rank]

    kwargs = dict(
        data=data,
        batch_size=batch_size,
        num_neighbors=[25, 10],
        drop_last=True,
        num_workers=0,
    )
    train_loader = NeighborLoader(
        input_nodes=train_idx,
        shuffle=True,
        **kwargs,
    )
    val_loader = NeighborLoader(
        input_nodes=val_idx,
        shuffle=False,
        **kwargs,
    )
    test_loader = NeighborLoader(
        input_nodes=test_idx,
        shuffle=False,
        **kwargs,
    )

    print(f'rank {rank}: train/val/test shard {train_idx.numel()}/{val_idx.numel()}/'
          f'{test_idx.numel()} nodes, {len(train_loader)}/{len(val_loader)}/'
          f'{len(test_loader)} batches', flush=True)

    torch.manual_seed(12345)
    model = SAGE(dataset.num_features, 256, dataset.num_classes).to(device)
    model = DistributedDataParallel(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.001)

    for epoch in range(1, 21):
        model.train()
        for batch in tqdm(
                train_loader,
                desc=f'Epoch {epoch:02d}',
                disable=rank != 0,
        ):
            out = model(batch.x, batch.edge_index.to(device))[:batch.batch_size]
            loss = F.cross_entropy(out, batch.y[:batch.batch_size])
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()

        if rank == 0:
            print(f'Epoch {epoch:02d}: Train loss: {loss:.4f}')

        if epoch % 5 == 0:
            train_acc = test(train_loader, model, device)
            val_acc = test(val_loader, model, device)
            test_acc = test(test_loader, model, device)

            if world_size > 1:  # gloo has no ReduceOp.AVG: SUM, then divide
                for acc in (train_acc, val_acc, test_acc):
                    dist.all_reduce(acc, op=dist.ReduceOp.SUM)
                    acc /= world_size

            if rank == 0:
                print(f'Train acc: {train_acc:.4f}, '
                      f'Val acc: {val_acc:.4f}, '
                      f'Test acc: {test_acc:.4f}')

    # Added for comparison: the same model on every node of each mask, every rank taking an
    # equal shard, correct predictions and counts summed over the ranks.
    for name in ('val_mask', 'test_mask'):
        loader = NeighborLoader(data, num_neighbors=[25, 10], input_nodes=data[name],
                                batch_size=batch_size, distributed=True)
        acc = pyg_mgpu.accuracy(model, loader)
        if rank == 0:
            print(f'same model, every node of {name}: {acc:.4f}')

    dist.destroy_process_group()


if __name__ == '__main__':
    parser = argparse.ArgumentParser()
    parser.add_argument('--root', required=True,
                        help='folder holding Cora/raw (writable: processed/ goes beside it)')
    parser.add_argument('--batch-size', type=int, default=1024)
    args = parser.parse_args()
    dataset = Planetoid(args.root, 'Cora')
    world_size = 2
    print("Let's use", world_size, "CPU ranks!")
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        port = s.getsockname()[1]
    mp.spawn(run, args=(world_size, dataset, port, args.batch_size),
             nprocs=world_size, join=True)
