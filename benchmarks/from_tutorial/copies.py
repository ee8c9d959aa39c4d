"""Memory per rank of three NeighborLoaders: PyG's tutorial's way against pyg_mgpu's.

Both sides load the same synthetic graph (100,000 nodes, 2,000,000 edges, 128 features) once in
the parent and start 2 gloo ranks, and each rank builds the tutorial's three loaders (train, val,
test) and draws no batch (PyG's loader needs pyg-lib to draw one, not to be built). Each rank
prints whether it received the features and edges in shared memory, and its USS and PSS once
the loaders are built.

    tutorial: mp.spawn(tutorial_rank, args=(2, port, data)), torch_geometric.loader.NeighborLoader
    pyg_mgpu: pyg_mgpu.spawn(pyg_mgpu_rank, args=(data,)), pyg_mgpu.NeighborLoader

Run under pyg_mgpu's memory sampler for the job's peak PSS (all processes):

    python -m pyg_mgpu.memory --interval 0.2 -- python benchmarks/from_tutorial/copies.py tutorial
    python -m pyg_mgpu.memory --interval 0.2 -- python benchmarks/from_tutorial/copies.py pyg_mgpu
"""
import os
import socket
import sys
import time
import warnings

import psutil
import torch.distributed as dist
import torch.multiprocessing as mp
from torch_geometric.loader import NeighborLoader as PyGNeighborLoader

import pyg_mgpu
from pyg_mgpu.data import SyntheticSpec

MiB = 2 ** 20
SPEC = SyntheticSpec(num_nodes=100_000, num_edges=2_000_000, num_features=128)
MODES = ("tutorial", "pyg_mgpu")


def build_loaders(loader_cls, data):
    return [loader_cls(data, num_neighbors=[25, 10], input_nodes=mask, batch_size=1024)
            for mask in (data.train_mask, data.val_mask, data.test_mask)]


def report(rank: int, data, loader_cls) -> None:
    warnings.filterwarnings("ignore", message=".*pyg-lib.*")
    shared = data.x.is_shared(), data.edge_index.is_shared()
    loaders = build_loaders(loader_cls, data)
    info = psutil.Process().memory_full_info()
    print(f"rank {rank}: x shared {shared[0]}, edge_index shared {shared[1]}; "
          f"{len(loaders)} loaders built: USS {info.uss / MiB:.0f} MiB, "
          f"PSS {info.pss / MiB:.0f} MiB", flush=True)
    time.sleep(1.0)  # held for a few of the memory sampler's 0.2 s intervals
    dist.barrier()


def tutorial_rank(rank: int, world_size: int, port: int, data) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    report(rank, data, PyGNeighborLoader)
    dist.destroy_process_group()


def pyg_mgpu_rank(ctx: pyg_mgpu.RankContext, data) -> None:
    report(ctx.rank, data, pyg_mgpu.NeighborLoader)


def main() -> None:
    if len(sys.argv) != 2 or sys.argv[1] not in MODES:
        sys.exit(f"usage: copies.py {{{'|'.join(MODES)}}}, got {sys.argv[1:]}")
    data = pyg_mgpu.load_dataset("synthetic", synthetic=SPEC)
    if sys.argv[1] == "tutorial":
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        mp.spawn(tutorial_rank, args=(2, port, data), nprocs=2, join=True)
    else:
        pyg_mgpu.spawn(pyg_mgpu_rank, args=(data,), devices="cpu", nprocs=2)


if __name__ == "__main__":
    main()
