"""One SHA-256 per sampler mode over a fixed set of seeded batches, to show that a change to the
sampler keeps its batches bit for bit.

Run it at two commits and compare the lines::

    git stash; python benchmarks/batch_fingerprints.py > before.txt; git stash pop
    python benchmarks/batch_fingerprints.py > after.txt; diff before.txt after.txt

Every mode samples a seeded random graph (homogeneous, or three node types and edge types) with
``pyg_mgpu.NeighborSampler`` and its own generator seed, five batches in a row, so the
generator's state carries from batch to batch as in a loader (the ``walk-`` modes: five
batches in one walk, ``sample_batches``). The hash covers every field of
each ``SamplerOutput`` (values, dtypes and shapes) and the per-hop counts.

``--gpu-path`` samples along the branches a GPU takes where the code branches on the device
(:mod:`pyg_mgpu.gpu_path`), still on the CPU: its lines must equal those without it.
"""
from __future__ import annotations

import hashlib

import torch
from torch_geometric.data import Data, HeteroData
from torch_geometric.sampler import NodeSamplerInput

import pyg_mgpu

NUM_NODES, NUM_EDGES = 2_000, 30_000


def homogeneous_graph(int32: bool = False) -> Data:
    gen = torch.Generator().manual_seed(0)
    # Skewed in-degrees: some nodes above every fanout, some below.
    dst = (torch.rand(NUM_EDGES, generator=gen) ** 2 * NUM_NODES).long()
    src = torch.randint(NUM_NODES, (NUM_EDGES,), generator=gen)
    edge_index = torch.stack([src, dst])
    data = Data(edge_index=edge_index.int() if int32 else edge_index, num_nodes=NUM_NODES)
    data.weight = torch.rand(NUM_EDGES, generator=gen) + 0.01
    data.node_time = torch.randint(100, (NUM_NODES,), generator=gen)
    data.edge_time = torch.randint(100, (NUM_EDGES,), generator=gen)
    return data


def hetero_graph(edge_time: bool = False) -> HeteroData:
    gen = torch.Generator().manual_seed(1)
    data = HeteroData()
    sizes = {"paper": 800, "author": 1_200, "venue": 40}
    for t, n in sizes.items():
        data[t].num_nodes = n
        if not edge_time:
            data[t].time = torch.randint(100, (n,), generator=gen)
    for (src, rel, dst), m in {("paper", "cites", "paper"): 6_000,
                               ("author", "writes", "paper"): 5_000,
                               ("paper", "written_by", "author"): 5_000,
                               ("paper", "in", "venue"): 800}.items():
        et = (src, rel, dst)
        data[et].edge_index = torch.stack([torch.randint(sizes[src], (m,), generator=gen),
                                           (torch.rand(m, generator=gen) ** 2
                                            * sizes[dst]).long()])
        data[et].weight = torch.rand(m, generator=gen) + 0.01
        if edge_time:
            data[et].time = torch.randint(100, (m,), generator=gen)
    return data


HOMOGENEOUS = {
    "joint": {},
    "joint-all": {"num_neighbors": [-1, 3]},
    "joint-int32": {"int32": True},
    "replace": {"replace": True},
    "weighted": {"weight_attr": "weight"},
    "weighted-replace": {"weight_attr": "weight", "replace": True},
    "disjoint": {"disjoint": True},
    "disjoint-weighted": {"disjoint": True, "weight_attr": "weight"},
    "induced": {"subgraph_type": "induced"},
    "bidirectional": {"subgraph_type": "bidirectional"},
    "backward": {"sample_direction": "backward"},
    "backward-disjoint": {"sample_direction": "backward", "disjoint": True},
    "temporal-node": {"time_attr": "node_time"},
    "temporal-node-last": {"time_attr": "node_time", "temporal_strategy": "last"},
    "temporal-edge": {"time_attr": "edge_time", "input_time": True},
    "temporal-edge-last": {"time_attr": "edge_time", "input_time": True,
                           "temporal_strategy": "last"},
}
HETERO = {
    "hetero-joint": {},
    "hetero-replace": {"replace": True},
    "hetero-weighted": {"weight_attr": "weight"},
    "hetero-disjoint": {"disjoint": True},
    "hetero-induced": {"subgraph_type": "induced"},
    "hetero-bidirectional": {"subgraph_type": "bidirectional"},
    "hetero-backward": {"sample_direction": "backward"},
    "hetero-temporal-node": {"time_attr": "time"},
    "hetero-temporal-node-last": {"time_attr": "time", "temporal_strategy": "last"},
    "hetero-temporal-edge": {"time_attr": "time", "edge_time": True, "input_time": True},
}


def digest(out) -> str:
    h = hashlib.sha256()

    def add(name, value):
        if value is None:
            h.update(f"{name}:None;".encode())
        elif isinstance(value, dict):
            for key in sorted(value, key=str):
                add(f"{name}[{key}]", value[key])
        elif isinstance(value, torch.Tensor):
            h.update(f"{name}:{value.dtype}:{tuple(value.shape)};".encode())
            h.update(value.contiguous().cpu().numpy().tobytes())
        else:
            h.update(f"{name}:{value!r};".encode())

    for field in ("node", "row", "col", "edge", "batch", "num_sampled_nodes",
                  "num_sampled_edges"):
        add(field, getattr(out, field, None))
    return h.hexdigest()[:16]


def fingerprint(data, options: dict, seeds_of, num_batches: int = 5) -> str:
    options = dict(options)
    input_time = options.pop("input_time", False)
    options.setdefault("num_neighbors", [10, 5])
    sampler = pyg_mgpu.NeighborSampler(data, seed=7, **options)
    gen = torch.Generator().manual_seed(3)
    parts = []
    for _ in range(num_batches):
        node, time = seeds_of(gen)
        inputs = NodeSamplerInput(input_id=None, node=node,
                                  time=time if input_time else None,
                                  input_type=None if not isinstance(data, HeteroData)
                                  else "paper")
        parts.append(digest(sampler.sample_from_nodes(inputs)))
    return hashlib.sha256(" ".join(parts).encode()).hexdigest()[:16]


# Several batches in one walk (NeighborSampler.sample_batches; BatchCounts on the GPU path).
WALKS = {"walk-joint": {}, "walk-joint-int32": {"int32": True}, "walk-disjoint": {"disjoint": True}}


def walk_fingerprint(data, options: dict, seeds_of, num_batches: int = 5) -> str:
    options = dict(options)
    options.setdefault("num_neighbors", [10, 5])
    sampler = pyg_mgpu.NeighborSampler(data, seed=7, **options)
    gen = torch.Generator().manual_seed(3)
    seeds = [seeds_of(gen)[0] for _ in range(num_batches)]
    parts = [digest(out) for out in sampler.sample_batches(seeds)]
    return hashlib.sha256(" ".join(parts).encode()).hexdigest()[:16]


def main() -> None:
    import argparse
    import contextlib

    from pyg_mgpu.gpu_path import counting_gpu_path
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpu-path", action="store_true",
                        help="sample along the code path a GPU takes (on the CPU): its lines "
                             "must equal the CPU path's")
    args = parser.parse_args()
    with counting_gpu_path() if args.gpu_path else contextlib.nullcontext():
        print_fingerprints()


def print_fingerprints() -> None:
    torch.set_num_threads(1)
    plain, plain32 = homogeneous_graph(), homogeneous_graph(int32=True)

    def homogeneous_seeds(gen):
        # Repeated seeds included: a repeated seed keeps its first position.
        return (torch.randint(NUM_NODES, (64,), generator=gen),
                torch.randint(40, 100, (64,), generator=gen))

    def paper_seeds(gen):
        return (torch.randint(800, (48,), generator=gen),
                torch.randint(40, 100, (48,), generator=gen))

    for name, options in HOMOGENEOUS.items():
        options = dict(options)
        data = plain32 if options.pop("int32", False) else plain
        print(name, fingerprint(data, options, homogeneous_seeds))
    for name, options in WALKS.items():
        options = dict(options)
        data = plain32 if options.pop("int32", False) else plain
        print(name, walk_fingerprint(data, options, homogeneous_seeds))
    node_timed, edge_timed = hetero_graph(), hetero_graph(edge_time=True)
    for name, options in HETERO.items():
        options = dict(options)
        data = edge_timed if options.pop("edge_time", False) else node_timed
        print(name, fingerprint(data, options, paper_seeds))


if __name__ == "__main__":
    main()
