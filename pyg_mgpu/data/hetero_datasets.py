"""Heterogeneous datasets as PyG ``HeteroData``: ``ogbn-mag`` from OGB's raw files, and the
embedded synthetic one (:mod:`pyg_mgpu.data.synthetic_hetero`).

``ogbn-mag`` is read by OGB's own reader (``ogb.nodeproppred.NodePropPredDataset``) from
``ROOT/ogbn_mag/`` (downloaded there where the network allows), with the same guards and error
messages as the homogeneous OGB datasets. Papers carry features, the year, labels and OGB's
time split as masks; the other node types (author, institution, field_of_study) have no features
in OGB's release. Each of the four relations also gets its reverse (``rev_writes`` and so on), as
PyG's recipes add with ``ToUndirected``, so that every node type receives messages.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Union

import numpy as np
import torch
from torch_geometric.data import HeteroData

from pyg_mgpu.data.synthetic_hetero import SyntheticHeteroSpec, make_synthetic_hetero

HETERO_DATASETS = ("ogbn-mag", "synthetic-hetero")
"""Dataset names that :func:`pyg_mgpu.load_dataset` returns as a ``HeteroData``."""

_MAG_URL = "http://snap.stanford.edu/ogb/data/nodeproppred/mag.zip"


def load_hetero_dataset(name: str, root: Union[str, Path, None] = None, *,
                        seed: int = 0,
                        synthetic: Optional[SyntheticHeteroSpec] = None) -> HeteroData:
    """``ogbn-mag`` (from ``root``, default ``./data``) or ``synthetic-hetero``."""
    if name.lower() == "synthetic-hetero":
        return make_synthetic_hetero(synthetic or SyntheticHeteroSpec(), seed=seed)
    return _load_ogbn_mag(Path(root) if root is not None else Path("data"))


def _load_ogbn_mag(root: Path) -> HeteroData:
    from pyg_mgpu.data.datasets import _ogb_guards, _run_library  # the homogeneous loaders'

    folder = root / "ogbn_mag"
    expected = [Path("ogbn_mag", "raw", "triplet-type-list.csv.gz")] + [
        Path("ogbn_mag", "split", "time", "paper", f"{s}.csv.gz")
        for s in ("train", "valid", "test")]

    def build(r: Path):
        from ogb.nodeproppred import NodePropPredDataset

        if (r / "ogbn_mag" / "raw" / "triplet-type-list.csv.gz").exists():
            (r / "ogbn_mag" / "processed").mkdir(exist_ok=True)  # OGB never creates it
        with _ogb_guards():
            dataset = NodePropPredDataset("ogbn-mag", root=str(r))
            return dataset, dataset.get_idx_split()

    dataset, split = _run_library("ogbn-mag", root, folder, expected, _MAG_URL, build)
    graph, labels = dataset[0]
    data = HeteroData()
    for node_type, count in graph["num_nodes_dict"].items():
        data[node_type].num_nodes = int(count)
    for node_type, feat in (graph.get("node_feat_dict") or {}).items():
        data[node_type].x = torch.from_numpy(np.asarray(feat, dtype=np.float32))
    for node_type, year in (graph.get("node_year") or {}).items():
        data[node_type].year = torch.from_numpy(np.asarray(year).reshape(-1).astype(np.int64))
    for node_type, y in labels.items():
        data[node_type].y = torch.from_numpy(np.asarray(y).reshape(-1).astype(np.int64))
    for (src, rel, dst), edge_index in graph["edge_index_dict"].items():
        edge_index = torch.from_numpy(np.asarray(edge_index, dtype=np.int64))
        data[src, rel, dst].edge_index = edge_index
        if (src, rel, dst) != (dst, rel, src):  # cites is paper -> paper: no reverse type
            data[dst, f"rev_{rel}", src].edge_index = edge_index.flip(0)
    for node_type in split["train"]:
        n = data[node_type].num_nodes
        for key, name in (("train", "train_mask"), ("valid", "val_mask"), ("test", "test_mask")):
            mask = torch.zeros(n, dtype=torch.bool)
            mask[torch.as_tensor(np.asarray(split[key][node_type]), dtype=torch.long)] = True
            data[node_type][name] = mask
    data.num_classes = int(dataset.num_classes)
    return data
