"""Loads a dataset by name and converts it, once, to a :class:`GraphStore` (:func:`load_graph`)
or to a PyG ``Data`` with split masks (:func:`load_dataset`, the public entry).

PyG (Planetoid, Reddit) and OGB datasets are read through their own libraries from a data folder
(``--root``). Nothing here ever reads stdin or writes into a read-only data folder: OGB's
interactive prompts are answered in code, and a read-only folder (a shared copy of the data) is
mirrored into a cache where the libraries may write their ``processed/`` files. When the raw
files are absent the libraries' own download is tried; if it fails (no network) the
:class:`DatasetError` says which files were expected where and which flag points at them.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import os
import pickle
import sys
import zipfile
import zlib
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional
from unittest import mock

import numpy as np
import torch
from torch_geometric.data import Data, HeteroData

from pyg_mgpu.data.cache import CACHE_ENV, cache_folder, default_cache_dir, load_cached
from pyg_mgpu.data.graph import NPZ_KEYS, SPLITS, DatasetError, GraphStore
from pyg_mgpu.data.hetero_datasets import (HETERO_DATASETS, load_hetero_dataset,
                                           load_hetero_graph)
from pyg_mgpu.data.hetero_graph import HeteroGraph
from pyg_mgpu.data.npz import NpzArray, npz_members
from pyg_mgpu.data.synthetic import SyntheticSpec, make_synthetic

if TYPE_CHECKING:
    from pyg_mgpu.train.config import TrainConfig

DATASETS = ("synthetic", "cora", "citeseer", "pubmed", "reddit",
            "ogbn-arxiv", "ogbn-products", "ogbn-papers100M")
"""Accepted dataset names; any path ending in ``.npz`` is accepted as well."""

DEFAULT_ROOT = Path("data")

_PLANETOID = {"cora": "Cora", "citeseer": "CiteSeer", "pubmed": "PubMed"}
_PLANETOID_FILES = ("x", "tx", "allx", "y", "ty", "ally", "graph", "test.index")

# From ogb/nodeproppred/master.csv: the file OGB checks before downloading, the split folder
# and the archive it downloads.
_OGB = {
    "ogbn-arxiv": ("raw/edge.csv.gz", "time",
                   "http://snap.stanford.edu/ogb/data/nodeproppred/arxiv.zip"),
    "ogbn-products": ("raw/edge.csv.gz", "sales_ranking",
                      "http://snap.stanford.edu/ogb/data/nodeproppred/products.zip"),
    "ogbn-papers100M": ("raw/data.npz", "time",
                        "http://snap.stanford.edu/ogb/data/nodeproppred/papers100M-bin.zip"),
}
# Citation graphs that OGB stores one way only. DGL's and PyG's recipes train ogbn-arxiv as an
# undirected graph; papers100M is left as stored, since doubling its 1.6B edges would add ~26 GB.
_ADD_REVERSE_EDGES = {"ogbn-arxiv"}

# What reading raw files or a failed download raises (URLError and aiohttp's errors are OSErrors).
_READ_ERRORS = (OSError, ValueError, KeyError, EOFError, RuntimeError, zipfile.BadZipFile,
                zlib.error, pickle.UnpicklingError)

_NPZ_CONTENTS = ("edge_index [2, E] (int), x [N, F], y [N], train_idx, val_idx, test_idx "
                 "(int node ids) and optionally num_classes, as GraphStore.save_npz writes")


def load_configured(cfg: "TrainConfig", *, for_training: bool = True,
                    placement: Optional[str] = None) -> GraphStore | HeteroGraph:
    """The dataset a run's config names (``--dataset --root --seed``, the synthetic size flags
    and the cache flags): the one place the launchers and the DGL comparison turn flags into
    a graph. A heterogeneous dataset (:data:`HETERO_DATASETS`) comes as a
    :class:`~pyg_mgpu.data.hetero_graph.HeteroGraph`, read without the converted-graph cache.

    ``for_training`` applies the run's storage choices (bf16 features with ``--amp bf16``);
    exports for other tools (the DGL comparison) leave it off and get the dataset as read.
    ``placement`` overrides ``--features-on`` (see :data:`pyg_mgpu.data.cache.PLACEMENTS`).
    """
    if cfg.is_hetero:
        return load_hetero_graph(cfg.dataset, cfg.root, seed=cfg.seed)
    spec = SyntheticSpec(num_nodes=cfg.num_nodes, num_edges=cfg.num_edges,
                         num_features=cfg.num_features, num_classes=cfg.num_classes,
                         train_fraction=cfg.split_fractions[0],
                         val_fraction=cfg.split_fractions[1],
                         test_fraction=cfg.split_fractions[2])
    # The bf16 model reads its first layer's inputs in bf16 anyway (autocast rounds the
    # neighbour mean and the node's own row); stored so, the features take half the shared
    # memory and every batch gathers half the bytes, which on a 1M-node graph cut the gather
    # from ~19 to ~12 ms per step (random rows of a 512 MB matrix). The neighbour mean is now
    # taken of rounded features (torch accumulates it in float32).
    bf16 = for_training and cfg.amp == "bf16"
    if placement is None and not cfg.no_cache and cfg.features_on != "auto":
        placement = cfg.features_on  # shm or mmap; auto stays None
    return load_graph(cfg.dataset, cfg.root, seed=cfg.seed, synthetic=spec,
                      feature_dtype=torch.bfloat16 if bf16 else torch.float32,
                      cache_dir=None if cfg.no_cache else (cfg.cache_dir or default_cache_dir()),
                      placement=placement, log=lambda line: print(line, flush=True))


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
            one of :data:`~pyg_mgpu.data.hetero_datasets.HETERO_DATASETS` (``ogbn-mag``,
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
    feature_dtype: torch.dtype = torch.float32,
    cache_dir: str | Path | None = None,
    placement: Optional[str] = "tensors",
    log: Optional[Callable[[str], None]] = None,
) -> GraphStore:
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
        feature_dtype: The features' dtype (float32, or bfloat16 for bf16 runs).
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
                               "or a path ending in .npz.")
    spec = synthetic or SyntheticSpec()

    def build() -> GraphStore:
        graph = _convert(key, name, root, seed, spec)
        if graph.x.dtype != feature_dtype:
            graph.x = graph.x.to(feature_dtype)
        return graph

    if cache_dir is None:
        if placement not in (None, "tensors"):
            raise ValueError(f"placement={placement!r} places the graph cache's files; pass "
                             "cache_dir.")
        return build()
    identity, label, sources = _cache_identity(key, name, root, seed, spec)
    identity["feature_dtype"] = str(feature_dtype)
    folder = cache_folder(Path(cache_dir).expanduser(), label, identity)
    return load_cached(folder, identity, sources, build, placement, log)


def _convert(key: Optional[str], name: str, root: str | Path | None, seed: int,
             spec: SyntheticSpec) -> GraphStore:
    if key is None:
        return _load_npz(Path(name))
    if key == "synthetic":
        return make_synthetic(spec, seed)
    if key in _PLANETOID:
        return _load_planetoid(_PLANETOID[key], Path(root or DEFAULT_ROOT))
    if key == "reddit":
        return _load_reddit(Path(root or DEFAULT_ROOT / "reddit"))
    return _load_ogb(key, Path(root or DEFAULT_ROOT))


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
    if key in _PLANETOID:
        folder = Path(root or DEFAULT_ROOT).resolve() / _PLANETOID[key] / "raw"
    elif key == "reddit":
        folder = Path(root or DEFAULT_ROOT / "reddit").resolve() / "raw"
    else:
        folder = Path(root or DEFAULT_ROOT).resolve() / key.replace("-", "_")

    def sources() -> list[Path]:
        # OGB's split/ files sit beside raw/; its processed/ and the libraries' are outputs.
        return [p for p in folder.rglob("*") if p.is_file() and "processed" not in p.parts]

    return {"dataset": key, "root": str(folder)}, key, sources


def _load_planetoid(name: str, root: Path) -> GraphStore:
    from torch_geometric.datasets import Planetoid

    expected = [Path(name, "raw", f"ind.{name.lower()}.{f}") for f in _PLANETOID_FILES]
    dataset = _run_library(name, root, root / name, expected, Planetoid.url,
                           lambda r: Planetoid(str(r), name))
    return _from_pyg(name.lower(), dataset)


def _load_reddit(root: Path) -> GraphStore:
    from torch_geometric.datasets import Reddit

    expected = [Path("raw", "reddit_data.npz"), Path("raw", "reddit_graph.npz")]
    dataset = _run_library("reddit", root, root, expected, Reddit.url,
                           lambda r: Reddit(str(r)))
    return _from_pyg("reddit", dataset)


def _from_pyg(name: str, dataset: Any) -> GraphStore:
    data = dataset[0]
    return GraphStore.from_edge_index(
        name=name,
        edge_index=data.edge_index,
        x=data.x,
        y=data.y,
        train_idx=data.train_mask.nonzero().view(-1),
        val_idx=data.val_mask.nonzero().view(-1),
        test_idx=data.test_mask.nonzero().view(-1),
        num_classes=dataset.num_classes,
    )


def _load_ogb(name: str, root: Path) -> GraphStore:
    raw_file, split, url = _OGB[name]
    folder = root / name.replace("-", "_")
    expected = [Path(folder.name, raw_file)] + [
        Path(folder.name, "split", split, f"{s}.csv.gz") for s in ("train", "valid", "test")]

    def build(r: Path) -> tuple[Any, dict]:
        from ogb.nodeproppred import NodePropPredDataset

        # OGB saves processed/ there but never creates it; its downloaded archive ships it.
        if (r / folder.name / raw_file).exists():
            (r / folder.name / "processed").mkdir(exist_ok=True)
        with _ogb_guards():
            dataset = NodePropPredDataset(name, root=str(r))
            return dataset, dataset.get_idx_split()

    dataset, idx = _run_library(name, root, folder, expected, url, build)
    graph, labels = dataset[0]
    y = np.asarray(labels).reshape(-1)
    if np.issubdtype(y.dtype, np.floating):
        # papers100M leaves most nodes unlabeled (NaN); GraphStore takes negative labels
        # on nodes outside every split.
        y = np.nan_to_num(y, nan=-1.0)
    return GraphStore.from_edge_index(
        name=name,
        edge_index=torch.from_numpy(graph["edge_index"]),
        x=torch.from_numpy(graph["node_feat"]),
        y=torch.from_numpy(y.astype(np.int64)),
        # torch.tensor copies: pandas hands out read-only arrays.
        train_idx=torch.tensor(idx["train"], dtype=torch.long),
        val_idx=torch.tensor(idx["valid"], dtype=torch.long),
        test_idx=torch.tensor(idx["test"], dtype=torch.long),
        num_classes=dataset.num_classes,
        add_reverse=name in _ADD_REVERSE_EDGES,
    )


@contextmanager
def _ogb_guards() -> Iterator[None]:
    """Patches OGB 1.3.6 so that it never waits on stdin and can reload its own cache."""
    # An outdated dataset prompts "Will you update the dataset now? (y/N)" and deletes the
    # folder on "y": answer no, keeping the user's files and never blocking.
    no_prompt = mock.patch("builtins.input", lambda prompt="": "n")
    # Its download asks for confirmation above 1 GB; naming the dataset is the confirmation.
    no_confirm = mock.patch("ogb.nodeproppred.dataset.decide_download", lambda url: True)
    # It pickles numpy arrays into processed/ and reloads them with torch.load's default,
    # which torch >= 2.6 turned into weights_only=True (which rejects them).
    full_unpickle = mock.patch("torch.load",
                               functools.partial(torch.load, weights_only=False))
    with no_prompt, no_confirm, full_unpickle:
        yield


def _run_library(label: str, root: Path, folder: Path, expected: list[Path], url: str,
                 build: Callable[[Path], Any]) -> Any:
    """Runs ``build(root)`` (a PyG or OGB constructor, which downloads missing raw files) and
    turns its failures into :class:`DatasetError`.

    Args:
        label: Dataset name for messages.
        root: The user's data folder.
        folder: The dataset's folder under ``root``, where the library writes ``processed/``.
        expected: Files (relative to ``root``) that make a download unnecessary.
        url: Where the library downloads from, for the message.
        build: Called with ``root``, or with a writable mirror of it.
    """
    missing = [p for p in expected if not (root / p).is_file()]
    writable = _is_writable(folder)

    def missing_error(reason: str) -> DatasetError:
        return DatasetError(
            f"{label}: dataset files not found under {root.absolute()} (missing "
            f"{', '.join(map(str, missing))}) and {reason}. Fetch them on a machine with "
            "network access and pass --root DIR, where DIR holds "
            f"{', '.join(map(str, expected))}.")

    if missing and not writable:
        raise missing_error("the folder is read-only, so nothing was downloaded")
    created = _first_missing_ancestor(folder)
    try:
        return build(root if writable else _mirror(root, folder))
    except _READ_ERRORS as err:
        if missing:
            # The library makes its folders before downloading; left empty, they would pass
            # for a dataset folder at the next look (a test's skip check, a user's ls).
            _remove_empty_dirs(created)
            raise missing_error(f"the download from {url} failed "
                                f"({type(err).__name__}: {err})") from err
        raise DatasetError(f"{label}: could not read the files in {folder.absolute()} "
                           f"({type(err).__name__}: {err}); they may be truncated or "
                           "corrupt: fetch them again.") from err


def _first_missing_ancestor(path: Path) -> Optional[Path]:
    """The outermost folder on the way to ``path`` that does not exist yet (None if it does)."""
    path = path.absolute()
    if path.exists():
        return None
    while not path.parent.exists():
        path = path.parent
    return path


def _remove_empty_dirs(top: Optional[Path]) -> None:
    """Removes ``top`` and the folders under it that hold no files; never removes a file."""
    if top is None or not top.is_dir():
        return
    for folder, _, _ in os.walk(top, topdown=False):
        with contextlib.suppress(OSError):  # not empty: something was written, keep it
            os.rmdir(folder)


def _is_writable(path: Path) -> bool:
    """Whether files may be created in ``path`` (or, before it exists, its nearest parent).

    Root passes ``os.access`` everywhere, so the permission bits count too: a folder marked
    read-only (a shared copy of the data) stays untouched whoever runs.
    """
    path = path.absolute()
    while not path.exists():
        path = path.parent
    return os.access(path, os.W_OK) and bool(path.stat().st_mode & 0o222)


def _mirror(root: Path, folder: Path) -> Path:
    """Mirrors a read-only ``folder`` under ``root`` into the cache and returns the new root.

    Every entry but ``processed/`` is symlinked, not copied (OGB's raw files take many GB);
    the library then writes ``processed/`` in the cache.
    """
    cache = Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "pyg_mgpu")
    # One mirror per source folder, so two data folders never share processed files.
    cache_root = cache / hashlib.sha1(str(root.resolve()).encode()).hexdigest()[:16]
    mirror = cache_root / folder.relative_to(root)
    mirror.mkdir(parents=True, exist_ok=True)
    for entry in folder.iterdir():
        link = mirror / entry.name
        if entry.name != "processed" and not link.is_symlink():
            link.symlink_to(entry.resolve())
    return cache_root


def _load_npz(path: Path) -> GraphStore:
    """Reads a ``.npz`` graph without loading its edge list whole: the conversion streams
    ``edge_index`` from the file and the features go straight into their final float32 tensor,
    so the peak is the converted graph plus a few chunks (not an int64 copy of the edges)."""
    def error(problem: str) -> DatasetError:
        return DatasetError(f"{path}: {problem}. The file must contain {_NPZ_CONTENTS}.")

    if not path.is_file():
        raise error("no such file")
    try:
        members = {k: NpzArray(path, info) for k, info in npz_members(path).items()
                   if k in NPZ_KEYS + ("num_classes",)}
        missing = [k for k in NPZ_KEYS if k not in members]
        if missing:
            raise error(f"missing key(s) {', '.join(missing)}")
        small = {k: torch.from_numpy(members[k].read_all()) for k in ("y",) + SPLITS}
        num_classes = members["num_classes"].read_all() if "num_classes" in members else None
        for key in ("edge_index",) + SPLITS:
            if not np.issubdtype(members[key].dtype, np.integer):
                raise error(f"{key} must hold integer node ids, got dtype {members[key].dtype}")
        edges, features = members["edge_index"], members["x"]
        if len(edges.shape) != 2 or edges.shape[0] != 2:
            raise error(f"edge_index must have shape [2, num_edges], got {edges.shape}")
        if len(features.shape) != 2 or features.shape[0] == 0:
            raise error(f"features x must be a non-empty [num_nodes, num_features] matrix, got "
                        f"shape {features.shape}")
        x = features.read_into(torch.empty(features.shape, dtype=torch.float32))
        if num_classes is not None:
            if num_classes.ndim != 0 or not np.issubdtype(num_classes.dtype, np.integer):
                raise error(f"num_classes must be one integer, got {num_classes!r}")
            num_classes = int(num_classes)
        # Named by the full path, validation messages say which file is wrong.
        store = GraphStore.from_edge_chunks(str(path), edges.edge_chunks(), x, small["y"],
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
