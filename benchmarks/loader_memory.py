"""Memory of 2 ranks sampling one graph: one shared CSC (pyg_mgpu) vs a CSC built per rank.

Run it under the PSS meter, once per mode, and compare the peaks::

    python -m pyg_mgpu.memory --out /tmp/mem_shared.json -- python benchmarks/loader_memory.py --csc shared
    python -m pyg_mgpu.memory --out /tmp/mem_per_rank.json -- python benchmarks/loader_memory.py --csc per-rank
    python -m pyg_mgpu.memory --out /tmp/mem_pyg.json -- python benchmarks/loader_memory.py --csc pyg

- ``shared``: ``pyg_mgpu.spawn`` builds the CSC once in the parent and shares it with the graph;
  each rank's ``pyg_mgpu.NeighborLoader`` maps it.
- ``per-rank``: the same loader, but each rank builds its own CSC from ``edge_index`` (what
  PyG's ``NeighborSampler`` does in every rank and for every loader).
- ``pyg``: PyG's own ``NeighborLoader`` (needs pyg-lib or torch-sparse).

The graph is a PyG user's: an unsorted int64 ``edge_index`` and float features.
"""
from __future__ import annotations

import argparse
import time

import torch
from torch_geometric.data import Data

import pyg_mgpu


def make_graph(num_nodes: int, num_edges: int, num_features: int) -> Data:
    gen = torch.Generator().manual_seed(0)
    edge_index = torch.randint(num_nodes, (2, num_edges), generator=gen)
    return Data(x=torch.randn(num_nodes, num_features, generator=gen), edge_index=edge_index,
                num_nodes=num_nodes)


def rank_fn(ctx, csc: str, batches: int, *graph) -> None:
    if csc == "shared":
        graph = graph[0]
    else:  # plain shared tensors: this rank's loader converts edge_index itself
        graph = Data(x=graph[0], edge_index=graph[1])
    if csc == "pyg":
        from torch_geometric.loader import NeighborLoader
        loader = NeighborLoader(graph, [25, 10], batch_size=1024, shuffle=True)
    else:
        loader = pyg_mgpu.NeighborLoader(graph, [25, 10], batch_size=1024, shuffle=True,
                                         distributed=True)
    for _, batch in zip(range(batches), loader):
        pass
    time.sleep(1.0)  # hold the peak long enough for the meter's sampling
    torch.distributed.barrier()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--csc", choices=["shared", "per-rank", "pyg"], default="shared")
    p.add_argument("--num-nodes", type=int, default=1_000_000)
    p.add_argument("--num-edges", type=int, default=20_000_000)
    p.add_argument("--num-features", type=int, default=32)
    p.add_argument("--batches", type=int, default=5)
    p.add_argument("--nprocs", type=int, default=2)
    args = p.parse_args()
    data = make_graph(args.num_nodes, args.num_edges, args.num_features)
    edge_mb = data.edge_index.numel() * 8 / 2**20
    print(f"{args.num_nodes:,} nodes, {args.num_edges:,} edges (edge_index {edge_mb:.0f} MiB), "
          f"{args.nprocs} ranks, CSC {args.csc}", flush=True)
    # A Data is shared with its CSC, built here once; plain tensors are shared as they are.
    graph = (data,) if args.csc == "shared" else (data.x, data.edge_index)
    pyg_mgpu.spawn(rank_fn, args=(args.csc, args.batches, *graph), devices="cpu",
                   nprocs=args.nprocs)


if __name__ == "__main__":
    main()
