"""DDP with ranks that run different numbers of batches: the tutorial's split on 2 CPU ranks.

255 training nodes, batch size 64: PyG's tutorial split (``idx.split(ceil(n / 2))[rank]``) with
``drop_last=True`` gives rank 0 128 nodes (2 batches) and rank 1 127 (1 batch). Process-group
timeout 10 s. Prints what each rank runs into and when, in three loop shapes:

    python benchmarks/from_tutorial/uneven_hang.py tutorial-2.6  # barrier after each epoch
    python benchmarks/from_tutorial/uneven_hang.py tutorial-2.8  # all_reduce every 5 epochs
    python benchmarks/from_tutorial/uneven_hang.py pyg_mgpu      # tutorial-2.8, distributed=True

pyg_mgpu provides the synthetic graph and a loader that runs without pyg-lib.
"""
import datetime, os, socket, sys, time
from math import ceil

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch_geometric.nn import GraphSAGE

import pyg_mgpu
from pyg_mgpu.data import SyntheticSpec

TIMEOUT_S = 10


def run(rank, world_size, port, data, mode):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=TIMEOUT_S))
    torch.set_num_threads(1)
    train_idx = data.train_mask.nonzero(as_tuple=False).view(-1)
    if mode.startswith("tutorial"):
        train_idx = train_idx.split(ceil(train_idx.size(0) / world_size))[rank]
        loader = pyg_mgpu.NeighborLoader(data, [25, 10], input_nodes=train_idx, batch_size=64,
                                         shuffle=True, drop_last=True)
    else:
        loader = pyg_mgpu.NeighborLoader(data, [25, 10], input_nodes=train_idx, batch_size=64,
                                         shuffle=True, distributed=True)
    print(f"rank {rank}: {len(loader)} batches per epoch", flush=True)
    torch.manual_seed(12345)
    model = DistributedDataParallel(GraphSAGE(data.num_features, 32, 2, data.num_classes))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    start = time.monotonic()
    try:
        for epoch in range(1, 11):
            loader.set_epoch(epoch)
            for batch in loader:
                out = model(batch.x, batch.edge_index)[:batch.batch_size]
                F.cross_entropy(out, batch.y[:batch.batch_size]).backward()
                optimizer.step()
                optimizer.zero_grad()
            if mode == "tutorial-2.6":
                dist.barrier()
            elif epoch % 5 == 0:  # the accuracies' all_reduce (gloo has no AVG: SUM)
                dist.all_reduce(torch.tensor(0.5))
        print(f"rank {rank}: finished 10 epochs after {time.monotonic() - start:.1f} s")
    except Exception as e:
        print(f"rank {rank}: {type(e).__name__} after {time.monotonic() - start:.1f} s: "
              f"{str(e).splitlines()[0][:200]}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    mode = sys.argv[1]
    data = pyg_mgpu.load_dataset("synthetic", synthetic=SyntheticSpec(
        num_nodes=1000, num_edges=10_000, train_fraction=0.255))   # 255 training nodes
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    start = time.monotonic()
    mp.spawn(run, args=(2, port, data, mode), nprocs=2, join=True)
    print(f"{mode}: job ended after {time.monotonic() - start:.1f} s")
