"""Bytes of the CSC that PyG's ``NeighborSampler`` builds for each ``NeighborLoader``.

PyG's sampler sorts the edges by destination into ``colptr`` (nodes + 1), ``row`` and ``perm``
(one per edge each), all int64, and it does so in every loader: PyG's multi-GPU tutorial builds
three loaders per rank. This builds one PyG ``NeighborSampler`` on the synthetic graph of
``copies.py`` (100,000 nodes, 2,000,000 edges, 128 features) and adds up its tensors, then
applies the same arithmetic to Reddit's published size (232,965 nodes, 114,615,892 edges),
which cannot be downloaded here.

    python benchmarks/from_tutorial/csc_size.py
"""
import warnings

import torch
from torch_geometric.sampler import NeighborSampler

import pyg_mgpu
from pyg_mgpu.data import SyntheticSpec

MiB, GiB = 2 ** 20, 2 ** 30
SPEC = SyntheticSpec(num_nodes=100_000, num_edges=2_000_000, num_features=128)


def main() -> None:
    data = pyg_mgpu.load_dataset("synthetic", synthetic=SPEC)
    tensors = sum(t.numel() * t.element_size() for _, t in data() if torch.is_tensor(t))
    print(f"synthetic graph: {data.num_nodes:,} nodes, {data.num_edges:,} edges, "
          f"{data.num_features} features; its tensors {tensors / MiB:.1f} MiB")
    warnings.filterwarnings("ignore", message=".*pyg-lib.*")  # no pyg-lib here; not needed to build
    sampler = NeighborSampler(data, num_neighbors=[25, 10])
    parts = {name: getattr(sampler, name) for name in ("colptr", "row", "perm")}
    csc = sum(t.numel() * t.element_size() for t in parts.values())
    print("PyG NeighborSampler CSC: " + ", ".join(
        f"{k} {tuple(t.shape)} {t.dtype}" for k, t in parts.items()))
    print(f"one loader's CSC: {csc / MiB:.1f} MiB; three loaders per rank: {3 * csc / MiB:.1f} MiB")

    nodes, edges, ranks = 232_965, 114_615_892, 4
    reddit = (nodes + 1 + 2 * edges) * 8
    print(f"Reddit: ({nodes + 1:,} + 2 x {edges:,}) x 8 bytes = {reddit / GiB:.2f} GiB per loader; "
          f"3 loaders x {ranks} ranks = {3 * ranks} CSCs, {3 * ranks * reddit / GiB:.1f} GiB")


if __name__ == "__main__":
    main()
