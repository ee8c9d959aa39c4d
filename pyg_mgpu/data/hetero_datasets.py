"""Heterogeneous datasets as PyG ``HeteroData``: ``ogbn-mag`` from OGB's raw files, and the
embedded synthetic one (:mod:`pyg_mgpu.data.synthetic_hetero`).

``ogbn-mag`` is read by OGB's own reader (``ogb.nodeproppred.NodePropPredDataset``) from
``ROOT/ogbn_mag/`` (downloaded there where the network allows), with the same guards and error
messages as the homogeneous OGB datasets. Papers carry features, the year, labels and OGB's
time split as masks; the other node types (author, institution, field_of_study) have no features
in OGB's release. As PyG's recipes make it with ``ToUndirected``, so that every node type receives
messages, each relation between two types gets its reverse (``rev_writes`` and so on), and
``cites`` (paper to paper) becomes undirected in place: each pair of papers joined once, both ways.

:func:`load_hetero_graph` is the CLI's route: the dataset as a
:class:`~pyg_mgpu.data.hetero_graph.HeteroGraph`, with features for the node types that have none
(:func:`fill_missing_features`).
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional, Union

import numpy as np
import torch

from pyg_mgpu.data.downloads import ogb_guards, run_library
from pyg_mgpu.data.graph import undirected_edges
from pyg_mgpu.data.validation import DatasetError, ids_outside

if TYPE_CHECKING:  # PyG is imported when a heterogeneous graph is loaded, not for its names
    from torch_geometric.data import HeteroData

    from pyg_mgpu.data.hetero_graph import HeteroGraph
    from pyg_mgpu.data.synthetic_hetero import SyntheticHeteroSpec

_MAG_URL = "http://snap.stanford.edu/ogb/data/nodeproppred/mag.zip"


def load_hetero_dataset(name: str, root: Union[str, Path, None] = None, *,
                        seed: int = 0,
                        synthetic: Optional[SyntheticHeteroSpec] = None) -> HeteroData:
    """``ogbn-mag`` (from ``root``, default ``./data``) or ``synthetic-hetero``."""
    if name.lower() == "synthetic-hetero":
        from pyg_mgpu.data.synthetic_hetero import SyntheticHeteroSpec, make_synthetic_hetero

        return make_synthetic_hetero(synthetic or SyntheticHeteroSpec(), seed=seed)
    return _load_ogbn_mag(Path(root) if root is not None else Path("data"))


def load_hetero_graph(name: str, root: Union[str, Path, None] = None, *,
                      seed: int = 0) -> HeteroGraph:
    """The dataset for training: every node type with features (:func:`fill_missing_features`),
    the labelled type (the one with ``y``) as the target."""
    from pyg_mgpu.data.hetero_graph import HeteroGraph, check_edges

    data = load_hetero_dataset(name, root, seed=seed)
    check_edges(name, data)  # before the features are filled through the edges
    data = fill_missing_features(data)
    target = next(t for t in data.node_types if "y" in data[t])
    return HeteroGraph(name=name.lower(), data=data, target=target,
                       num_classes=int(data.num_classes))


def fill_missing_features(data: HeteroData) -> HeteroData:
    """Gives every node type without features ``x`` the mean of its in-neighbours' features,
    in place.

    A round fills each featureless type that has in-edges from types with features at the
    round's start (the mean over all those edges); rounds repeat until no type is left or none
    can be filled. On ogbn-mag, authors and fields of study take their papers' mean, then
    institutions their authors' (a common featurization of OGB-MAG's featureless types, which
    reads features only, never labels). A node with no such in-edge gets zeros.

    Raises:
        ValueError: when a featureless type cannot be reached from any type with features.
    """
    while True:
        have = {t for t in data.node_types if "x" in data[t]}
        missing = [t for t in data.node_types if t not in have]
        if not missing:
            return data
        filled = {}
        for t in missing:
            sources = [(s, data[s, r, d].edge_index) for s, r, d in data.edge_types
                       if d == t and s in have]
            if not sources:
                continue
            width = data[sources[0][0]].x.size(-1)
            total = torch.zeros(data[t].num_nodes, width)
            count = torch.zeros(data[t].num_nodes)
            for s, edge_index in sources:
                if data[s].x.size(-1) != width:
                    continue  # one feature width per filled type: the first source's
                total.index_add_(0, edge_index[1], data[s].x[edge_index[0]].float())
                count.index_add_(0, edge_index[1], torch.ones(edge_index.size(1)))
            filled[t] = total / count.clamp(min=1).unsqueeze(-1)
        if not filled:
            raise ValueError(f"node types {', '.join(missing)} have no features and no in-edges "
                             "from a type that has them; give them features x.")
        for t, x in filled.items():
            data[t].x = x


def _load_ogbn_mag(root: Path) -> HeteroData:

    folder = root / "ogbn_mag"
    expected = [Path("ogbn_mag", "raw", "triplet-type-list.csv.gz")] + [
        Path("ogbn_mag", "split", "time", "paper", f"{s}.csv.gz")
        for s in ("train", "valid", "test")]

    def build(r: Path):
        from ogb.nodeproppred import NodePropPredDataset

        if (r / "ogbn_mag" / "raw" / "triplet-type-list.csv.gz").exists():
            (r / "ogbn_mag" / "processed").mkdir(exist_ok=True)  # OGB never creates it
        with ogb_guards():
            dataset = NodePropPredDataset("ogbn-mag", root=str(r))
            return dataset, dataset.get_idx_split()

    from torch_geometric.data import HeteroData

    dataset, split = run_library("ogbn-mag", root, folder, expected, _MAG_URL, build)
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
        if src == dst:  # cites: ToUndirected merges the reverse in, no rev_ type
            data[src, rel, dst].edge_index = torch.stack(undirected_edges(*edge_index))
        else:
            data[src, rel, dst].edge_index = edge_index
            data[dst, f"rev_{rel}", src].edge_index = edge_index.flip(0)
    for node_type in split["train"]:
        n = data[node_type].num_nodes
        for key, name in (("train", "train_mask"), ("valid", "val_mask"), ("test", "test_mask")):
            ids = torch.from_numpy(np.array(split[key][node_type], dtype=np.int64))
            outside = ids_outside(ids, n)
            if outside:
                raise DatasetError(f"ogbn-mag: split {key} of {node_type} holds node ids "
                                   f"{outside}; fetch the split files again.")
            mask = torch.zeros(n, dtype=torch.bool)
            mask[ids] = True
            data[node_type][name] = mask
    data.num_classes = int(dataset.num_classes)
    return data
