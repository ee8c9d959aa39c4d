"""The readers of each dataset's source files, each returning a :class:`ConvertedGraph`: Planetoid
and Reddit through PyG, the OGB node-property datasets through OGB, and ``.npz`` files
streamed from disk."""
from __future__ import annotations

import dataclasses
import zipfile
import zlib
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from pyg_mgpu.data.downloads import ogb_guards, run_library
from pyg_mgpu.data.graph import NPZ_KEYS, ConvertedGraph
from pyg_mgpu.data.npz import NpzArray, npz_members
from pyg_mgpu.data.validation import SPLITS, DatasetError, as_signed_ids

PLANETOID = {"cora": "Cora", "citeseer": "CiteSeer", "pubmed": "PubMed"}
_PLANETOID_FILES = ("x", "tx", "allx", "y", "ty", "ally", "graph", "test.index")

# From ogb/nodeproppred/master.csv: the file OGB checks before downloading, the split folder
# and the archive it downloads.
OGB = {
    "ogbn-arxiv": ("raw/edge.csv.gz", "time",
                   "http://snap.stanford.edu/ogb/data/nodeproppred/arxiv.zip"),
    "ogbn-products": ("raw/edge.csv.gz", "sales_ranking",
                      "http://snap.stanford.edu/ogb/data/nodeproppred/products.zip"),
    "ogbn-papers100M": ("raw/data.npz", "time",
                        "http://snap.stanford.edu/ogb/data/nodeproppred/papers100M-bin.zip"),
}
# The other raw files OGB's readers cannot do without (ogb/io/read_graph_raw.py and the
# datasets' "additional node files"): named as missing rather than read as corrupt. The
# features are optional to OGB; load_ogb names their file itself.
_OGB_RAW = {
    "ogbn-arxiv": ("num-node-list.csv.gz", "num-edge-list.csv.gz", "node-label.csv.gz",
                   "node_year.csv.gz"),
    "ogbn-products": ("num-node-list.csv.gz", "num-edge-list.csv.gz", "node-label.csv.gz"),
    "ogbn-papers100M": ("node-label.npz",),
}
# Citation graphs that OGB stores one way only. DGL's and PyG's recipes train ogbn-arxiv as an
# undirected graph (ToUndirected: each pair of nodes joined once, both ways); papers100M is left
# as stored, since doubling its 1.6B edges would add ~26 GB.
_ADD_REVERSE_EDGES = {"ogbn-arxiv"}

_NPZ_CONTENTS = ("edge_index [2, E] (int), x [N, F], y [N], train_idx, val_idx, test_idx "
                 "(int node ids) and optionally num_classes, as ConvertedGraph.save_npz writes")



def load_planetoid(name: str, root: Path) -> ConvertedGraph:
    from torch_geometric.datasets import Planetoid

    expected = [Path(name, "raw", f"ind.{name.lower()}.{f}") for f in _PLANETOID_FILES]
    dataset = run_library(name, root, root / name, expected, Planetoid.url,
                           lambda r: Planetoid(str(r), name))
    return from_pyg(name.lower(), dataset)


def load_reddit(root: Path) -> ConvertedGraph:
    from torch_geometric.datasets import Reddit

    expected = [Path("raw", "reddit_data.npz"), Path("raw", "reddit_graph.npz")]
    # Reddit's folder is the root itself, which may hold other datasets: a mirror of a
    # read-only one links raw/ alone.
    dataset = run_library("reddit", root, root, expected, Reddit.url,
                           lambda r: Reddit(str(r)), reads=("raw",))
    return from_pyg("reddit", dataset)


def from_pyg(name: str, dataset: Any) -> ConvertedGraph:
    data = dataset[0]
    return ConvertedGraph.from_edge_index(
        name=name,
        edge_index=data.edge_index,
        x=data.x,
        y=data.y,
        train_idx=data.train_mask.nonzero().view(-1),
        val_idx=data.val_mask.nonzero().view(-1),
        test_idx=data.test_mask.nonzero().view(-1),
        num_classes=dataset.num_classes,
    )


def load_ogb(name: str, root: Path) -> ConvertedGraph:
    raw_file, split, url = OGB[name]
    folder = root / name.replace("-", "_")
    expected = [Path(folder.name, raw_file)] + [
        Path(folder.name, "split", split, f"{s}.csv.gz") for s in ("train", "valid", "test")
    ] + [Path(folder.name, "raw", f) for f in _OGB_RAW[name]]

    def build(r: Path) -> tuple[Any, dict]:
        from ogb.nodeproppred import NodePropPredDataset

        # OGB saves processed/ there but never creates it; its downloaded archive ships it.
        if (r / folder.name / raw_file).exists():
            (r / folder.name / "processed").mkdir(exist_ok=True)
        with ogb_guards():
            dataset = NodePropPredDataset(name, root=str(r))
            return dataset, dataset.get_idx_split()

    dataset, idx = run_library(name, root, folder, expected, url, build)
    graph, labels = dataset[0]
    if graph.get("node_feat") is None:  # OGB reads its feature file as optional
        features = folder / (raw_file if raw_file.endswith(".npz") else "raw/node-feat.csv.gz")
        problem = "holds none" if features.exists() else "is missing"
        raise DatasetError(f"{name}: OGB read no node features: {features} {problem}; put "
                           f"OGB's file there (it is in {url}).")
    return ConvertedGraph.from_edge_index(
        name=name,
        edge_index=torch.from_numpy(graph["edge_index"]),
        x=torch.from_numpy(graph["node_feat"]),
        # papers100M's labels are floats, NaN where a node is unlabelled, which ConvertedGraph
        # takes on nodes outside every split. torch.tensor copies: pandas hands out read-only
        # arrays.
        y=torch.tensor(np.asarray(labels).reshape(-1)),
        train_idx=torch.tensor(idx["train"], dtype=torch.long),
        val_idx=torch.tensor(idx["valid"], dtype=torch.long),
        test_idx=torch.tensor(idx["test"], dtype=torch.long),
        num_classes=dataset.num_classes,
        add_reverse=name in _ADD_REVERSE_EDGES,
    )


def _check_label_gaps(y: torch.Tensor, error: Callable[[str], DatasetError]) -> None:
    """Refuses labels whose classes are mostly empty: with the class count taken as the largest
    label + 1, one stray label (99 among 0..3) would silently train a 100-way classifier."""
    labels = y[y >= 0]
    if labels.numel() == 0 or (labels.is_floating_point() and not bool((labels % 1 == 0).all())):
        return  # none, or fractional: the graph's validation says what is wrong
    count, present = int(labels.max()) + 1, int(torch.unique(labels).numel())
    if present * 2 < count:
        raise error(f"labels y run up to {count - 1}, but only {present} distinct labels occur, "
                    f"so {count - present} of {count} classes would have no node; fix the stray "
                    f"labels, or store the class count in the file (num_classes={count}) if "
                    "those classes are meant to be empty")


def _feature_dtype(features: NpzArray) -> torch.dtype:
    """The type ``.npz`` features are read into: float16 kept (MAG240M's fp16 features would
    double as float32), anything else float32."""
    return torch.float16 if features.dtype == np.float16 else torch.float32


def npz_feature_dtype(path: Path) -> torch.dtype:
    """The type :func:`load_npz` reads ``path``'s features into, from the array's header alone
    (float32 where it cannot be read: the conversion then says what is wrong)."""
    try:
        info = npz_members(path).get("x")
        return torch.float32 if info is None else _feature_dtype(NpzArray(path, info))
    except (OSError, ValueError, zipfile.BadZipFile):
        return torch.float32


def load_npz(path: Path) -> ConvertedGraph:
    """Reads a ``.npz`` graph without loading its edge list whole: the conversion streams
    ``edge_index`` (of any integer type) from the file and the features go straight into their
    final tensor (float16 where stored so, else float32), so the peak is the converted graph
    plus a few chunks (not an int64 copy of the edges)."""
    def error(problem: str) -> DatasetError:
        return DatasetError(f"{path}: {problem}. The file must contain {_NPZ_CONTENTS}.")

    if not path.is_file():
        raise error("a folder, not a file" if path.is_dir() else "no such file")
    try:
        members = {k: NpzArray(path, info) for k, info in npz_members(path).items()
                   if k in NPZ_KEYS + ("num_classes",)}
        missing = [k for k in NPZ_KEYS if k not in members]
        if missing:
            raise error(f"missing key(s) {', '.join(missing)}")
        for member in members.values():  # reads below seek past zipfile's own check
            member.check_crc()
        for key in ("edge_index",) + SPLITS:
            if not np.issubdtype(members[key].dtype, np.integer):
                raise error(f"{key} must hold integer node ids, got dtype {members[key].dtype}")
        if members["y"].dtype.kind not in "iuf":
            raise error(f"labels y must hold integer class ids (or floats, NaN for an "
                        f"unlabelled node), got dtype {members['y'].dtype}")
        small = {k: torch.from_numpy(members[k].read_all()) for k in ("y",) + SPLITS}
        if not np.issubdtype(members["y"].dtype, np.floating):
            small["y"] = as_signed_ids(small["y"], "labels y", str(path))
        num_classes = members["num_classes"].read_all() if "num_classes" in members else None
        edges, features = members["edge_index"], members["x"]
        if len(edges.shape) != 2 or edges.shape[0] != 2:
            raise error(f"edge_index must have shape [2, num_edges], got {edges.shape}")
        if len(features.shape) != 2 or features.shape[0] == 0:
            raise error(f"features x must be a non-empty [num_nodes, num_features] matrix, got "
                        f"shape {features.shape}")
        if features.dtype.kind not in "biuf":  # read into float: the rest would be mangled
            raise error(f"features x must hold real numbers (bool, integer or float), got "
                        f"dtype {features.dtype}" + ("; store the real and imaginary parts as "
                        "separate feature columns" if features.dtype.kind == "c" else ""))
        x = features.read_into(torch.empty(features.shape, dtype=_feature_dtype(features)))
        if num_classes is not None:
            if num_classes.size != 1 or not np.issubdtype(num_classes.dtype, np.integer):
                raise error(f"num_classes must be one integer, got {num_classes!r}")
            num_classes = int(num_classes.reshape(()))
        else:
            _check_label_gaps(small["y"], error)
        # Named by the full path, validation messages say which file is wrong.
        store = ConvertedGraph.from_edge_chunks(str(path), edges.edge_chunks(), x, small["y"],
                                            *(small[k] for k in SPLITS),
                                            num_classes=num_classes)
    except DatasetError as err:
        if "must contain" in str(err):
            raise
        raise DatasetError(f"{err} The file must contain {_NPZ_CONTENTS}.") from None
    except (zipfile.BadZipFile, EOFError, ValueError, OSError, zlib.error) as err:
        raise error(f"cannot read it as .npz ({type(err).__name__}: {err}); the file may be "
                    "truncated or corrupt") from err
    return dataclasses.replace(store, name=path.stem)
