"""Loads a dataset by name and converts it, once, to a :class:`ConvertedGraph` (:func:`load_graph`)
or to a PyG ``Data`` with split masks (:func:`load_dataset`, the public entry).

PyG (Planetoid, Reddit) and OGB datasets are read through their own libraries from a data folder
(:mod:`.sources`, :mod:`.downloads`); converted graphs may be kept in a cache (:mod:`.cache`).
"""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

import torch

from pyg_mgpu.data import sources
from pyg_mgpu.data.cache import cache_folder, load_cached
from pyg_mgpu.data.graph import ConvertedGraph, feature_dtype_for
from pyg_mgpu.data import HETERO_DATASETS
from pyg_mgpu.data.hetero_datasets import load_hetero_dataset
from pyg_mgpu.data.sources import PLANETOID
from pyg_mgpu.data.synthetic import SyntheticSpec, make_synthetic
from pyg_mgpu.data.validation import DatasetError

if TYPE_CHECKING:  # a Data is made by PyG's own code (to_data, the hetero loaders)
    from torch_geometric.data import Data, HeteroData

DATASETS = ("synthetic", "cora", "citeseer", "pubmed", "reddit",
            "ogbn-arxiv", "ogbn-products", "ogbn-papers100M")
"""Accepted dataset names; any path ending in ``.npz`` is accepted as well."""

DEFAULT_ROOT = Path("data")

def load_dataset(
    name: str,
    root: str | Path | None = None,
    *,
    seed: int = 0,
    synthetic: Optional[SyntheticSpec] = None,
    cache_dir: str | Path | None = None,
) -> Data | HeteroData:
    """Loads a node-classification dataset as a PyG ``Data`` (or ``HeteroData``).

    Every dataset the CLI knows, read the same way (see :func:`load_graph` for where files are
    looked for and what happens offline or in a read-only folder)::

        data = load_dataset("cora", root="data/planetoid")
        model = GraphSAGE(data.num_features, 256, 2, data.num_classes)

    Args:
        name: One of :data:`DATASETS` (case-insensitive), or a path ending in ``.npz``; or
            one of :data:`~pyg_mgpu.data.HETERO_DATASETS` (``ogbn-mag``,
            ``synthetic-hetero``), returned as a ``HeteroData`` with the labelled type's masks.
        root: Data folder for PyG and OGB datasets; default ``./data`` (``./data/reddit`` for
            Reddit).
        seed: Seed of the synthetic graph.
        synthetic: Size of the synthetic graph; used only when ``name`` is ``synthetic``.
        cache_dir: Keep the converted graph there (:mod:`pyg_mgpu.data.cache`): later calls
            read it back instead of converting again. None: no cache.

    Returns:
        A validated ``Data`` with ``x``, ``y``, ``edge_index`` (int64, sorted by destination),
        boolean ``train_mask``, ``val_mask``, ``test_mask`` and the int ``num_classes``. Its
        CSC is attached, so :class:`pyg_mgpu.NeighborLoader` and :func:`pyg_mgpu.spawn` reuse
        it instead of building another.

    Raises:
        DatasetError: for an unknown name, missing files that could not be downloaded, or a
            file whose contents are wrong (the message says which and what to do).

    Example:
        >>> from pyg_mgpu.data.synthetic import SyntheticSpec
        >>> data = pyg_mgpu.load_dataset("synthetic", synthetic=SyntheticSpec(
        ...     num_nodes=100, num_edges=1000, num_features=8, num_classes=3))
        >>> data.num_nodes, data.num_edges, data.num_features, data.num_classes
        (100, 1000, 8, 3)
        >>> int(data.train_mask.sum()), int(data.val_mask.sum()), int(data.test_mask.sum())
        (50, 10, 20)
    """
    if name.lower() in HETERO_DATASETS:  # a HeteroData, no converted-graph cache
        return load_hetero_dataset(name, root, seed=seed)
    return load_graph(name, root, seed=seed, synthetic=synthetic, cache_dir=cache_dir,
                      log=lambda line: print(line, file=sys.stderr)).to_data()


def load_graph(
    name: str,
    root: str | Path | None = None,
    *,
    seed: int = 0,
    synthetic: Optional[SyntheticSpec] = None,
    feature_dtype: Optional[torch.dtype] = None,
    cache_dir: str | Path | None = None,
    placement: Optional[str] = "tensors",
    log: Optional[Callable[[str], None]] = None,
) -> ConvertedGraph:
    """Loads a dataset and converts it to the training layout (or reads the converted graph
    from the cache).

    Args:
        name: One of :data:`DATASETS` (case-insensitive), or a path ending in ``.npz``.
        root: Data folder for PyG and OGB datasets (``--root``); default ``./data``. It holds
            ``Cora/raw/ind.cora.*`` (likewise ``CiteSeer``, ``PubMed``), ``ogbn_arxiv/raw/...``
            (likewise the other OGB datasets), and for Reddit ``raw/reddit_data.npz`` and
            ``raw/reddit_graph.npz`` directly (default ``./data/reddit``). The libraries write
            ``processed/`` beside ``raw/``; a read-only folder is mirrored into the cache named
            by ``$PYG_MGPU_CACHE`` (default ``~/.cache/pyg_mgpu``) instead.
        seed: Seed of the synthetic graph.
        synthetic: Size of the synthetic graph; used only when ``name`` is ``synthetic``.
        feature_dtype: The features' dtype (bfloat16 for bf16 runs), or None: as stored where
            that is a half precision (a ``.npz`` of fp16 features stays fp16, half the memory),
            else float32.
        cache_dir: Where converted graphs are kept (:mod:`pyg_mgpu.data.cache`); None converts
            every time.
        placement: With a cache, where the graph goes (:data:`~pyg_mgpu.data.cache.PLACEMENTS`):
            ``tensors`` (torch shared memory, what :func:`pyg_mgpu.spawn` can pass on),
            ``shm`` (a copy in ``/dev/shm`` files), ``mmap`` (the cache files, mapped), or
            None (``shm`` if it fits in ``/dev/shm``, else ``mmap``).
        log: Receives the cache's one-line notices (hit, built, stale or corrupt: rebuilt).

    Returns:
        The validated graph in CSC form with features, labels and split indices.

    Raises:
        DatasetError: for an unknown name, missing files that could not be downloaded, or a
            file whose contents are wrong (the message says which and what to do).
    """
    name = str(name)
    if name.endswith(".npz"):
        key = None
    else:
        key = {n.lower(): n for n in DATASETS}.get(name.lower())
        if key is None and name.lower() in HETERO_DATASETS:
            raise DatasetError(f"{name} is heterogeneous, and load_graph converts homogeneous "
                               f"graphs: load it with pyg_mgpu.load_dataset({name!r}) (a "
                               "HeteroData), or train it with the CLI (--dataset "
                               f"{name.lower()}).")
        if key is None:
            raise DatasetError(f"unknown dataset {name!r}; use one of {', '.join(DATASETS)}, "
                               "a path ending in .npz, or a heterogeneous one: "
                               f"{', '.join(HETERO_DATASETS)}.")
    spec = synthetic or SyntheticSpec()

    def build() -> ConvertedGraph:
        graph = _convert(key, name, root, seed, spec)
        wanted = feature_dtype_for(graph.x.dtype, feature_dtype)
        if graph.x.dtype != wanted:
            graph.x = graph.x.to(wanted)
        return graph

    if cache_dir is None:
        if placement not in (None, "tensors"):
            raise ValueError(f"placement={placement!r} places the graph cache's files; pass "
                             "cache_dir.")
        return build()
    identity, label, sources = _cache_identity(key, name, root, seed, spec)
    identity["feature_dtype"] = str(feature_dtype_for(_stored_feature_dtype(key, name),
                                                      feature_dtype))
    folder = cache_folder(Path(cache_dir).expanduser(), label, identity)
    return load_cached(folder, identity, sources, build, placement, log)


def _convert(key: Optional[str], name: str, root: str | Path | None, seed: int,
             spec: SyntheticSpec) -> ConvertedGraph:
    if key is None:
        return sources.load_npz(Path(name))
    if key == "synthetic":
        return make_synthetic(spec, seed)
    if key in PLANETOID:
        return sources.load_planetoid(PLANETOID[key], Path(root or DEFAULT_ROOT))
    if key == "reddit":
        return sources.load_reddit(Path(root or DEFAULT_ROOT / "reddit"))
    return sources.load_ogb(key, Path(root or DEFAULT_ROOT))


def _stored_feature_dtype(key: Optional[str], name: str) -> torch.dtype:
    """The features' type as the source is read: a ``.npz`` file's
    (:func:`~pyg_mgpu.data.sources.npz_feature_dtype`), float32 for the rest."""
    return sources.npz_feature_dtype(Path(name)) if key is None else torch.float32


def _cache_identity(key: Optional[str], name: str, root: str | Path | None, seed: int,
                    spec: SyntheticSpec) -> tuple[dict, str, Callable[[], list[Path]]]:
    """What a cached graph is (the key's configuration part), a folder label, and its source
    files (a function: a download may create them)."""
    if key is None:
        path = Path(name).resolve()
        return {"npz": str(path)}, path.stem, lambda: [path]
    if key == "synthetic":
        return ({"synthetic": dataclasses.asdict(spec), "seed": seed},
                f"synthetic-{spec.num_nodes}", lambda: [])
    if key in PLANETOID:
        folder = Path(root or DEFAULT_ROOT).resolve() / PLANETOID[key] / "raw"
    elif key == "reddit":
        folder = Path(root or DEFAULT_ROOT / "reddit").resolve() / "raw"
    else:
        folder = Path(root or DEFAULT_ROOT).resolve() / key.replace("-", "_")

    def sources() -> list[Path]:
        # OGB's split/ files sit beside raw/; its processed/ and the libraries' are outputs
        # (a processed/ inside the dataset's folder: the folder's own path may hold one).
        return [p for p in folder.rglob("*")
                if p.is_file() and "processed" not in p.relative_to(folder).parts]

    return {"dataset": key, "root": str(folder)}, key, sources


