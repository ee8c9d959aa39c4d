"""Tests of load_graph and load_dataset: every source becomes a validated ConvertedGraph (and a PyG
``Data``), and every failure a DatasetError that says what to do, quickly and without reading
stdin."""
from __future__ import annotations

import gzip
import os
import re
import shutil
import socket
import stat
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from torch_geometric.utils import to_undirected

import pyg_mgpu.data.csc as csc_module
from pyg_mgpu.data import (DATASETS, DatasetError, ConvertedGraph, SyntheticSpec, load_dataset,
                           load_graph, make_synthetic)
from pyg_mgpu.data.csc import cached_csc, csc_of
from pyg_mgpu.data.cache import CACHE_ENV
from pyg_mgpu.data.csc import index_dtype
from pyg_mgpu.train.setting import in_flags

SMALL = SyntheticSpec(num_nodes=300, num_edges=3_000, num_features=8, num_classes=4)


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Mirrors of read-only folders go to a temporary cache, never to ~/.cache."""
    path = tmp_path / "cache"
    monkeypatch.setenv(CACHE_ENV, str(path))
    return path


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> list:
    """Makes every download fail at once, whatever network the machine has; the hosts looked
    up, one entry a try."""
    tries = []

    def no_network(host, *args, **kwargs):
        tries.append(host)
        raise socket.gaierror(socket.EAI_NONAME, "network disabled by the test")

    monkeypatch.setattr(socket, "getaddrinfo", no_network)
    return tries


@pytest.fixture
def no_stdin(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fails the test if anything reads stdin (a prompt would hang a real run)."""
    class NoStdin:
        def read(self, *args):
            raise AssertionError("stdin was read")

        readline = read

    monkeypatch.setattr("sys.stdin", NoStdin())


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file and folder under ``folder`` with its size and modification time."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        for entry in dirnames + filenames:
            st = os.stat(os.path.join(dirpath, entry))
            out[os.path.relpath(os.path.join(dirpath, entry), folder)] = (st.st_size,
                                                                           st.st_mtime_ns)
    return out


def make_read_only(folder: Path) -> None:
    for dirpath, _, filenames in os.walk(folder):
        for f in filenames:
            os.chmod(os.path.join(dirpath, f), 0o444)
        os.chmod(dirpath, 0o555)


def make_writable(folder: Path) -> None:
    for dirpath, _, _ in os.walk(folder):
        os.chmod(dirpath, 0o755)


def edge_set(edge_index: torch.Tensor) -> set[tuple[int, int]]:
    return set(map(tuple, edge_index.t().tolist()))


# Synthetic.

def test_synthetic_is_deterministic_from_seed():
    a = load_graph("synthetic", seed=3, synthetic=SMALL)
    b = load_graph("synthetic", seed=3, synthetic=SMALL)
    c = load_graph("synthetic", seed=4, synthetic=SMALL)
    for key, t in a.tensors().items():
        assert torch.equal(t, b.tensors()[key]), key
    assert not torch.equal(a.x, c.x)
    assert not torch.equal(a.row, c.row)
    assert torch.equal(a.x, make_synthetic(SMALL, 3).x)


def test_synthetic_splits_labels_and_csc():
    g = load_graph("synthetic", seed=0, synthetic=SMALL)
    splits = torch.cat([g.train_idx, g.val_idx, g.test_idx])
    assert splits.unique().numel() == splits.numel()
    assert int(g.y.min()) >= 0 and int(g.y.max()) < g.num_classes == SMALL.num_classes
    assert g.num_nodes == SMALL.num_nodes and g.num_edges == SMALL.num_edges
    assert int(g.colptr[0]) == 0 and int(g.colptr[-1]) == g.num_edges
    assert bool((g.in_degree() >= 0).all())
    again = ConvertedGraph.from_edge_index("again", g.edge_index(), g.x, g.y, g.train_idx,
                                       g.val_idx, g.test_idx, g.num_classes)
    assert torch.equal(again.colptr, g.colptr) and torch.equal(again.row, g.row)
    # Node ids fit in int32, so the CSC indices take half the bytes; edge lists stay int64.
    assert g.row.dtype == torch.int32 and g.edge_index().dtype == torch.long


def split_of(mask: torch.Tensor) -> list[int]:
    assert mask.dtype == torch.bool
    return mask.nonzero().view(-1).tolist()


def assert_data_matches_graph(data, g: ConvertedGraph) -> None:
    """``data`` is ``g`` as PyG's ``Data``: same tensors, masks of its splits, its CSC."""
    data.validate()
    assert data.num_nodes == g.num_nodes and data.num_classes == g.num_classes
    assert torch.equal(data.x, g.x) and torch.equal(data.y, g.y)
    for split in ("train", "val", "test"):
        assert split_of(data[f"{split}_mask"]) == sorted(getattr(g, f"{split}_idx").tolist())
    # edge_index in CSC order: int64, sorted by destination, the store's edges.
    assert data.edge_index.dtype == torch.long
    assert torch.equal(data.edge_index, g.edge_index())
    csc = cached_csc(data)
    assert csc is not None and csc.perm is None, "no CSC attached, or it is not in edge order"
    assert torch.equal(csc.colptr, g.colptr) and torch.equal(csc.row, g.row)


def test_load_dataset_is_the_graph_as_pyg_data(monkeypatch):
    data = load_dataset("synthetic", seed=0, synthetic=SMALL)
    assert_data_matches_graph(data, load_graph("synthetic", seed=0, synthetic=SMALL))
    # Samplers find the CSC attached and never sort edge_index again.
    monkeypatch.setattr(csc_module, "build_csc", lambda *a, **k: pytest.fail("CSC rebuilt"))
    assert csc_of(data) is cached_csc(data)


def test_node_ids_beyond_int32_keep_int64_indices():
    assert index_dtype(2**31 - 1) == torch.int32
    assert index_dtype(2**31) == torch.int64


# Planetoid, from the shared offline copy.

@pytest.fixture
def planetoid_root(shared_data: Path, tmp_path: Path) -> Iterator[Path]:
    """A private, read-only copy of the shared Planetoid files.

    Read-only whatever the shared folder's permissions (read-only in CI, often writable on a
    fresh clone), so the test always checks the same thing: a read-only data folder is loaded
    without being written to. Private, so a failure never leaves files in the shared folder.
    """
    source = shared_data / "planetoid"
    if not source.is_dir():
        pytest.skip(f"{source} is absent")
    folder = Path(shutil.copytree(source, tmp_path / "planetoid"))
    make_read_only(folder)
    yield folder
    make_writable(folder)  # so that pytest can delete it


@pytest.mark.parametrize("name, folder, nodes, classes, splits", [
    ("cora", "Cora", 2708, 7, (140, 500, 1000)),
    ("citeseer", "CiteSeer", 3327, 6, (120, 500, 1000)),
])
@pytest.mark.slow
def test_planetoid_public_split(planetoid_root, cache, name, folder, nodes, classes, splits):
    before = snapshot(planetoid_root)
    g = load_graph(name, planetoid_root)
    assert g.name == name
    assert g.num_nodes == nodes and g.num_classes == classes
    assert (g.train_idx.numel(), g.val_idx.numel(), g.test_idx.numel()) == splits
    assert_data_matches_graph(load_dataset(name, planetoid_root), g)
    assert snapshot(planetoid_root) == before, "the read-only data folder was written to"
    assert list(cache.glob(f"*/{folder}/processed/*.pt")), "processed/ did not go to the cache"


# Reddit, from tiny files in its raw format (what torch_geometric's Reddit.process reads).

def write_reddit(root: Path, n: int = 12) -> dict[str, np.ndarray]:
    raw = root / "raw"
    raw.mkdir(parents=True)
    data = {
        "feature": np.arange(n * 5, dtype=np.float32).reshape(n, 5),
        "label": np.arange(n) % 3,
        "node_types": np.array([1] * 6 + [2] * 3 + [3] * 3),
    }
    np.savez(raw / "reddit_data.npz", **data)
    src = np.arange(n)
    row, col = np.concatenate([src, (src + 1) % n]), np.concatenate([(src + 1) % n, src])
    adj = sp.coo_matrix((np.ones(2 * n), (row, col)), shape=(n, n))
    sp.save_npz(raw / "reddit_graph.npz", adj)
    data["edges"] = np.stack([row, col])
    return data


@pytest.mark.slow
def test_reddit_from_raw_files(tmp_path):
    data = write_reddit(tmp_path / "reddit")
    g = load_graph("reddit", tmp_path / "reddit")
    assert g.num_nodes == 12 and g.num_edges == 24 and g.num_classes == 3
    assert torch.equal(g.x, torch.from_numpy(data["feature"]))
    assert torch.equal(g.y, torch.from_numpy(data["label"]))
    assert g.train_idx.tolist() == list(range(6))
    assert g.val_idx.tolist() == [6, 7, 8] and g.test_idx.tolist() == [9, 10, 11]
    assert edge_set(g.edge_index()) == edge_set(torch.from_numpy(data["edges"]))


@pytest.mark.slow
def test_read_only_root_is_mirrored_into_cache(tmp_path, cache):
    root = tmp_path / "reddit"
    write_reddit(root)
    make_read_only(root)
    before = snapshot(root)
    try:
        first = load_graph("reddit", root)
        second = load_graph("reddit", root)  # now from the processed files in the cache
    finally:
        make_writable(root)
    assert snapshot(root) == before, "the read-only folder was written to"
    assert list(cache.glob("*/processed/data.pt"))
    assert torch.equal(first.row, second.row) and first.num_nodes == 12


@pytest.mark.slow
def test_a_read_only_root_with_other_datasets_beside_reddit_mirrors_its_raw_files_alone(
        tmp_path, cache, planetoid_root):
    # Reddit's folder is the root itself: a mirror linking the other datasets' folders would
    # let their library write through the links into the read-only root.
    root = planetoid_root
    make_writable(root)
    write_reddit(root)
    make_read_only(root)
    before = snapshot(root)
    try:
        assert load_graph("reddit", root).num_nodes == 12
        assert load_graph("cora", root).num_nodes == 2708
    finally:
        make_writable(root)
    assert snapshot(root) == before, "the read-only folder was written to"
    mirrors = [entry for entry in cache.iterdir() if (entry / "raw").is_symlink()]
    assert len(mirrors) == 1
    assert [p.name for p in mirrors[0].iterdir() if p.is_symlink()] == ["raw"]


# OGB, from tiny files in its raw format (ogb/io/read_graph_raw.py, ogb/nodeproppred/dataset.py).

def write_ogbn_arxiv(root: Path, release: bool,
                     edges: np.ndarray | None = None) -> dict[str, np.ndarray]:
    folder = root / "ogbn_arxiv"
    (folder / "raw").mkdir(parents=True)
    (folder / "split" / "time").mkdir(parents=True)
    n = 10
    if edges is None:
        edges = np.array([[0, 1, 2, 3, 4, 5, 6, 7, 8, 0],
                          [1, 2, 3, 4, 5, 6, 7, 8, 9, 5]])
    data = {"edges": edges, "x": np.arange(n * 3).reshape(n, 3) / 4, "y": np.arange(n) % 4,
            "train": np.arange(5), "valid": np.array([5, 6]), "test": np.array([7, 8, 9])}

    def save(path: str, values, fmt: str = "%d") -> None:
        np.savetxt(folder / path, values, fmt=fmt, delimiter=",")

    save("raw/edge.csv.gz", edges.T)
    save("raw/node-feat.csv.gz", data["x"], fmt="%.2f")
    save("raw/node-label.csv.gz", data["y"])
    save("raw/node_year.csv.gz", 2000 + np.arange(n))
    save("raw/num-node-list.csv.gz", [n])
    save("raw/num-edge-list.csv.gz", [edges.shape[1]])
    for split in ("train", "valid", "test"):
        save(f"split/time/{split}.csv.gz", data[split])
    if release:
        (folder / "RELEASE_v1.txt").write_text("")  # without it OGB asks to update on stdin
    return data


@pytest.mark.slow
@pytest.mark.parametrize("release", [True, False], ids=["released", "outdated"])
def test_ogbn_arxiv_from_raw_files(tmp_path, offline, no_stdin, release):
    data = write_ogbn_arxiv(tmp_path, release)
    for _ in range(2):  # the second load reads OGB's processed/ cache
        g = load_graph("ogbn-arxiv", tmp_path)
        assert g.num_nodes == 10 and g.num_classes == 40
        assert g.num_edges == 2 * data["edges"].shape[1], "reverse edges were not added"
        edges = torch.from_numpy(data["edges"])
        assert edge_set(g.edge_index()) == edge_set(torch.cat([edges, edges.flip(0)], 1))
        assert torch.equal(g.x, torch.from_numpy(data["x"]).float())
        assert torch.equal(g.y, torch.from_numpy(data["y"]))
        assert g.train_idx.tolist() == data["train"].tolist()
        assert g.val_idx.tolist() == data["valid"].tolist()
        assert g.test_idx.tolist() == data["test"].tolist()
    assert (tmp_path / "ogbn_arxiv" / "raw" / "edge.csv.gz").exists(), "OGB deleted the data"


# An edge given both ways, a self loop and a duplicate: each (source, destination) pair once.
ONE_WAY_AND_BACK = np.array([[0, 1, 2, 3, 3, 5, 7, 9],
                             [1, 0, 2, 4, 4, 6, 0, 8]])


def in_csc_order(edge_index: torch.Tensor) -> torch.Tensor:
    """``edge_index`` sorted by destination, then source: the order of a graph's edge ids."""
    order = edge_index[0].argsort(stable=True)
    order = order[edge_index[1][order].argsort(stable=True)]
    return edge_index[:, order]


@pytest.mark.slow
def test_ogbn_arxiv_is_made_undirected_as_pyg_to_undirected_makes_it(tmp_path, offline, no_stdin):
    write_ogbn_arxiv(tmp_path, True, ONE_WAY_AND_BACK)
    g = load_graph("ogbn-arxiv", tmp_path)
    expected = to_undirected(torch.from_numpy(ONE_WAY_AND_BACK), num_nodes=10)
    assert expected.size(1) == 11  # 0-1, 3-4, 5-6, 7-0, 9-8 both ways and the loop 2-2 once
    # Edge ids are positions in this order (in-edges by destination, sources ascending).
    assert torch.equal(g.edge_index(), in_csc_order(expected))


def test_from_edge_index_add_reverse_is_the_coalesced_union():
    edges = torch.from_numpy(ONE_WAY_AND_BACK).int()
    n = 10
    g = ConvertedGraph.from_edge_index("g", edges, torch.ones(n, 1), torch.arange(n) % 2,
                                       torch.arange(4), torch.arange(4, 6), torch.arange(6, 10),
                                       add_reverse=True)
    assert torch.equal(g.edge_index(), in_csc_order(to_undirected(edges.long(), num_nodes=n)))
    # An id out of range is still refused by name, not merged away with another pair.
    with pytest.raises(DatasetError, match=r"outside \[0, 10\) \(min 0, max 10\)"):
        ConvertedGraph.from_edge_index("g", torch.tensor([[0, 1], [10, 0]]), torch.ones(n, 1),
                                       torch.arange(n) % 2, torch.arange(4),
                                       torch.arange(4, 6), torch.arange(6, 10), add_reverse=True)


@pytest.mark.slow
def test_an_ogb_folder_without_features_names_the_file(tmp_path, offline, no_stdin):
    write_ogbn_arxiv(tmp_path, True)
    features = tmp_path / "ogbn_arxiv" / "raw" / "node-feat.csv.gz"
    features.unlink()
    with pytest.raises(DatasetError, match=re.escape(f"ogbn-arxiv: OGB read no node features: "
                                                     f"{features} is missing; put OGB's file")):
        load_graph("ogbn-arxiv", tmp_path)


# Missing files, offline.

@pytest.mark.parametrize("name, expected", [
    ("reddit", "raw/reddit_data.npz"),
    ("ogbn-arxiv", "ogbn_arxiv/raw/edge.csv.gz"),
    ("pubmed", "PubMed/raw/ind.pubmed.x"),
])
def test_missing_dataset_fails_fast_offline(tmp_path, offline, no_stdin, name, expected):
    with pytest.raises(DatasetError) as info:
        load_graph(name, tmp_path / "empty")
    assert len(offline) == 1, offline  # one try, no retries to wait through
    message = str(info.value)
    assert "pass root=DIR" in message and expected in message and "download" in message
    # The CLI names the argument as its flag
    assert "pass --root DIR" in in_flags(info.value)
    assert str((tmp_path / "empty").absolute()) in message
    # The folders the library made before its download failed are gone again.
    assert not (tmp_path / "empty").exists()


def test_missing_dataset_in_read_only_folder_downloads_nothing(tmp_path, no_stdin):
    root = tmp_path / "ro"
    root.mkdir()
    os.chmod(root, stat.S_IRUSR | stat.S_IXUSR)
    try:
        with pytest.raises(DatasetError, match="read-only.*root=DIR"):
            load_graph("reddit", root)
        assert not any(root.iterdir())
    finally:
        os.chmod(root, 0o755)


def test_unknown_name_lists_the_accepted_names():
    with pytest.raises(DatasetError) as info:
        load_graph("imagenet")
    for name in DATASETS:
        assert name in str(info.value)
    assert ".npz" in str(info.value)


# The neutral .npz format.

def test_npz_round_trip(tmp_path):
    g = make_synthetic(SMALL, seed=1)
    path = g.save_npz(tmp_path / "graph.npz")
    back = load_graph(str(path))
    assert back.name == "graph" and back.num_classes == g.num_classes
    for key, t in g.tensors().items():
        assert torch.equal(t, back.tensors()[key]), key


def good_arrays() -> dict[str, np.ndarray]:
    return {
        "edge_index": np.array([[0, 1, 2, 3, 4, 5], [1, 2, 3, 4, 5, 0]]),
        "x": np.arange(12, dtype=np.float32).reshape(6, 2),
        "y": np.array([0, 1, 0, 1, 0, 1]),
        "train_idx": np.array([0, 1]),
        "val_idx": np.array([2, 3]),
        "test_idx": np.array([4, 5]),
        "num_classes": np.int64(2),
    }


NAN_X = np.arange(12, dtype=np.float32).reshape(6, 2)
NAN_X[3, 1] = np.nan


@pytest.mark.parametrize("change, problem", [
    ({"y": None}, "missing key(s) y"),
    ({"x": np.zeros(6, np.float32)}, "features x must be"),
    ({"y": np.array([0, 1, 0, 1, 0, 2])}, "out of range for 2 classes"),
    ({"x": NAN_X}, "NaN"),
    ({"val_idx": np.array([], dtype=np.int64)}, "val_idx is empty"),
    ({"test_idx": np.array([4, 0])}, "overlaps"),
    ({"test_idx": np.array([4, 6])}, "outside [0, 6)"),
    ({"edge_index": np.array([[0, 1], [1, 9]])},
     "edge_index holds node ids outside [0, 6) (min 0, max 9); x has 6 rows, one per node"),
    ({"train_idx": np.array([0.0, 1.0])}, "train_idx must hold integer node ids"),
    ({"num_classes": np.array([2, 2])}, "num_classes must be one integer"),
    ({"x": np.zeros((5, 2), np.float32)}, "features x have 5 rows but labels y have 6"),
    ({"y": np.array([0, 1, 0, 1, 0, 9]), "num_classes": None},
     "only 3 distinct labels occur, so 7 of 10 classes would have no node"),
    ({"y": np.array([0, 0.5, 100.5, 1, 0, 1]), "num_classes": None}, "fractional values"),
    ({"x": np.array([["a", "b"]] * 6)}, "features x must hold real numbers (bool, integer or "
                                        "float), got dtype <U1"),
    ({"x": np.ones((6, 2), np.complex64)}, "got dtype complex64; store the real and imaginary"),
    ({"x": np.ones((6, 0), np.float32)}, "at least one feature per node), got shape (6, 0)"),
    ({"y": np.array([1e20, 1, 0, 1, 0, 1])}, "label 100000000000000000000 is out of range for "
                                             "2 classes"),
    ({"y": np.array([0, 1, np.nan, 1, 0, 1])}, "split val_idx holds 1 node(s) whose label is "
                                               "NaN (unlabelled), e.g. node 2"),
    ({"y": np.array([0, 1, 0, 1, np.inf, 1])}, "labels y must be integer class ids, got inf"),
    ({"y": np.array(["a", "b", "a", "b", "a", "b"])}, "labels y must hold integer class ids "
                                                      "(or floats, NaN for an unlabelled node), "
                                                      "got dtype <U1"),
    ({"y": np.arange(6).astype("datetime64[D]")}, "got dtype datetime64[D]"),
    ({"train_idx": np.array(["0", "1"])}, "train_idx must hold integer node ids, got dtype <U1"),
], ids=["missing-key", "x-shape", "label-range", "nan-feature", "empty-split", "overlap",
        "split-range", "edge-range", "float-index", "num-classes", "rows-disagree",
        "stray-label", "fractional-label", "string-features", "complex-features",
        "no-feature-columns", "huge-float-label", "nan-label-in-split", "inf-label",
        "string-labels", "date-labels", "string-split"])
def test_bad_npz_is_rejected(tmp_path, change, problem):
    arrays = {**good_arrays(), **change}
    path = tmp_path / "bad.npz"
    np.savez(path, **{k: v for k, v in arrays.items() if v is not None})
    with pytest.raises(DatasetError) as info:
        load_graph(str(path))
    assert str(path) in str(info.value) and problem in str(info.value)


def test_nan_labels_outside_the_splits_are_unlabelled(tmp_path):
    # OGB's convention (papers100M): NaN marks a node without a label.
    arrays = {**good_arrays(), "y": np.array([0, 1, 0, 1, 0, 1, np.nan]),
              "x": np.ones((7, 2), np.float32)}
    np.savez(tmp_path / "g.npz", **arrays)
    g = load_graph(str(tmp_path / "g.npz"))
    assert g.y.tolist() == [0, 1, 0, 1, 0, 1, -1] and g.num_classes == 2


@pytest.mark.parametrize("change", [{"x": np.array([["a", "b"]] * 6)},
                                    {"x": np.ones((6, 0), np.float32)},
                                    {"y": np.array([1e20, 1, 0, 1, 0, 1])}],
                         ids=["string-features", "no-feature-columns", "huge-float-label"])
def test_bad_npz_is_one_error_line_on_the_cli(tmp_path, capsys, change):
    from pyg_mgpu.distributed_sampling import main
    np.savez(tmp_path / "bad.npz", **{**good_arrays(), **change})
    assert main(["--dataset", str(tmp_path / "bad.npz"), "--devices", "cpu", "--nprocs", "1",
                 "--epochs", "1", "--no-cache", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and len(err.splitlines()) == 1, err


def test_a_class_count_stored_as_a_one_element_array_is_read(tmp_path):
    np.savez(tmp_path / "g.npz", **{**good_arrays(), "num_classes": np.array([3])})
    assert load_graph(str(tmp_path / "g.npz")).num_classes == 3
    (tmp_path / "folder.npz").mkdir()
    with pytest.raises(DatasetError, match="folder.npz: a folder, not a file"):
        load_graph(str(tmp_path / "folder.npz"))


def test_empty_classes_load_when_the_file_says_how_many_there_are(tmp_path):
    arrays = {**good_arrays(), "y": np.array([0, 1, 0, 1, 0, 9])}
    np.savez(tmp_path / "g.npz", **{**arrays, "num_classes": np.int64(10)})
    assert load_graph(str(tmp_path / "g.npz")).num_classes == 10
    del arrays["num_classes"]
    np.savez(tmp_path / "g.npz", **{**arrays, "y": np.array([0, 2, 0, 2, 0, 2])})
    assert load_graph(str(tmp_path / "g.npz")).num_classes == 3  # one empty class of three


@pytest.mark.parametrize("damage", ["truncated", "garbage", "absent"])
def test_unreadable_npz_is_rejected(tmp_path, damage):
    path = tmp_path / "bad.npz"
    np.savez(path, **good_arrays())
    if damage == "truncated":
        path.write_bytes(path.read_bytes()[:200])
    elif damage == "garbage":
        path.write_bytes(b"not an npz file at all")
    else:
        path.unlink()
    with pytest.raises(DatasetError) as info:
        load_graph(str(path))
    assert str(path) in str(info.value) and "must contain" in str(info.value)


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts open files via /proc")
def test_running_out_of_file_descriptors_says_how_to_fix_it():
    # torch keeps one descriptor per shared tensor: with the limit just above what is open,
    # sharing the graph's tensors runs out part-way, which must read as an actionable error.
    script = r"""
import os, resource
from pyg_mgpu.data.validation import DatasetError
from pyg_mgpu.data.synthetic import SyntheticSpec, make_synthetic
g = make_synthetic(SyntheticSpec(num_nodes=200, num_edges=1000))
open_now = len(os.listdir("/proc/self/fd"))
resource.setrlimit(resource.RLIMIT_NOFILE, (open_now + 2, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
try:
    g.share_memory_()
except DatasetError as e:
    print("ERROR:", e)
else:
    print("shared without error")
"""
    import subprocess
    import sys
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "ERROR: synthetic: ran out of file descriptors" in proc.stdout, proc.stdout
    assert "ulimit -n" in proc.stdout


# ogbn-mag, from tiny files in OGB's heterogeneous raw format (ogb/io/read_graph_raw.py).

def write_ogbn_mag(root: Path, cites: list | None = None, y: list | None = None,
                   train: list | None = None) -> dict:
    folder = root / "ogbn_mag"
    raw = folder / "raw"
    types = ["author", "field_of_study", "institution", "paper"]
    counts = {"author": 4, "field_of_study": 2, "institution": 2, "paper": 6}
    relations = {("author", "affiliated_with", "institution"): [[0, 1, 2, 3], [0, 0, 1, 1]],
                 ("author", "writes", "paper"): [[0, 1, 2, 3, 3], [0, 1, 2, 3, 5]],
                 ("paper", "cites", "paper"): cites or [[0, 1, 2, 4], [1, 2, 3, 5]],
                 ("paper", "has_topic", "field_of_study"): [[0, 1, 2, 3, 4, 5],
                                                            [0, 0, 1, 1, 0, 1]]}

    def save(path: Path, rows, fmt="%d", header=None) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        if header is None:
            np.savetxt(path, rows, fmt=fmt, delimiter=",")
        else:  # pandas reads a header row here
            with gzip.open(path, "wt") as f:
                f.write(",".join(header) + "\n" + ",".join(map(str, rows)) + "\n")

    save(raw / "num-node-dict.csv.gz", [counts[t] for t in types], header=types)
    with gzip.open(raw / "triplet-type-list.csv.gz", "wt") as f:
        f.write("".join(",".join(t) + "\n" for t in relations))
    for triplet, edges in relations.items():
        sub = raw / "relations" / "___".join(triplet)
        save(sub / "edge.csv.gz", np.array(edges).T)
        save(sub / "num-edge-list.csv.gz", [len(edges[0])])
    x = np.arange(counts["paper"] * 3).reshape(-1, 3) / 4
    y = np.array(y or [0, 1, 2, 0, 1, 2])
    save(raw / "node-feat" / "paper" / "node-feat.csv.gz", x, fmt="%.2f")
    save(raw / "node-feat" / "paper" / "node_year.csv.gz", 2010 + np.arange(6))
    save(raw / "nodetype-has-label.csv.gz", ["False", "False", "False", "True"], header=types)
    save(raw / "node-label" / "paper" / "node-label.csv.gz", y)
    split = folder / "split" / "time"
    save(split / "nodetype-has-split.csv.gz", ["False", "False", "False", "True"], header=types)
    for name, idx in (("train", train or [0, 1, 2]), ("valid", [3]), ("test", [4, 5])):
        save(split / "paper" / f"{name}.csv.gz", idx)
    (folder / "RELEASE_v2.txt").write_text("")
    return {"relations": relations, "x": x, "y": y, "counts": counts}


@pytest.mark.slow
def test_ogbn_mag_from_raw_files(tmp_path, offline, no_stdin):
    written = write_ogbn_mag(tmp_path)
    for _ in range(2):  # the second load reads OGB's processed/ cache
        data = load_dataset("ogbn-mag", tmp_path)
        assert {t: data[t].num_nodes for t in data.node_types} == written["counts"]
        assert data.num_classes == 349
        for (src, rel, dst), edges in written["relations"].items():
            edges = torch.tensor(edges)
            if src != dst:
                assert torch.equal(data[src, rel, dst].edge_index, edges)
                assert torch.equal(data[dst, f"rev_{rel}", src].edge_index, edges.flip(0))
            else:  # cites, made undirected in place as PyG's ToUndirected does
                assert torch.equal(data[src, rel, dst].edge_index, to_undirected(edges))
        assert ("paper", "rev_cites", "paper") not in data.edge_types
        assert torch.equal(data["paper"].x, torch.from_numpy(written["x"]).float())
        assert torch.equal(data["paper"].y, torch.from_numpy(written["y"]))
        assert data["paper"].year.tolist() == list(range(2010, 2016))
        assert data["paper"].train_mask.nonzero().view(-1).tolist() == [0, 1, 2]
        assert data["paper"].val_mask.nonzero().view(-1).tolist() == [3]
        assert data["paper"].test_mask.nonzero().view(-1).tolist() == [4, 5]
        assert "x" not in data["author"]  # OGB ships no author features


@pytest.mark.slow
def test_ogbn_mag_cites_is_undirected_as_pyg_to_undirected_makes_it(tmp_path, offline, no_stdin):
    # A citation given both ways, a self citation and a duplicate.
    cites = [[0, 1, 2, 3, 3, 4], [1, 0, 2, 5, 5, 1]]
    write_ogbn_mag(tmp_path, cites)
    data = load_dataset("ogbn-mag", tmp_path)
    expected = to_undirected(torch.tensor(cites), num_nodes=6)
    assert expected.size(1) == 7
    assert torch.equal(data["paper", "cites", "paper"].edge_index, expected)


@pytest.mark.slow
@pytest.mark.parametrize("change, problem", [
    ({"y": [0, 1, 400, 0, 1, 2]}, "ogbn-mag: node type 'paper': the nodes in the splits need "
                                  "integer labels in [0, 349), got labels from 0 to 400"),
    ({"y": [0, -1, 2, 0, 1, 2]}, "got labels from -1 to 2"),
    ({"train": [0, 1, 99]}, "ogbn-mag: split train of paper holds node ids outside [0, 6) "
                            "(min 0, max 99)"),
    ({"cites": [[0, 1], [1, 7]]}, "ogbn-mag: edges (paper, cites, paper) name paper nodes "
                                  "outside [0, 6) (min 0, max 7)"),
], ids=["label-range", "negative-label", "split-range", "edge-range"])
def test_ogbn_mag_with_bad_labels_splits_or_edges_is_refused_before_training(
        tmp_path, offline, no_stdin, change, problem):
    from pyg_mgpu.data.hetero_datasets import load_hetero_graph

    write_ogbn_mag(tmp_path, **change)
    with pytest.raises(DatasetError) as info:
        load_hetero_graph("ogbn-mag", tmp_path)
    assert problem in str(info.value)


def test_ogbn_mag_missing_files_say_where_to_put_them(tmp_path, offline):
    with pytest.raises(DatasetError, match="ogbn_mag/raw/triplet-type-list.csv.gz"):
        load_dataset("ogbn-mag", tmp_path)


def test_the_graph_loader_points_heterogeneous_names_to_the_hetero_path():
    with pytest.raises(DatasetError, match="load_dataset\\('ogbn-mag'\\)"):
        load_graph("ogbn-mag")


def test_both_graph_kinds_declare_the_training_graph_protocol():
    from pyg_mgpu.data.hetero_datasets import load_hetero_graph
    from pyg_mgpu.data.protocol import TrainingGraph
    homo = make_synthetic(SMALL, 0)
    hetero = load_hetero_graph("synthetic-hetero", seed=0)
    assert isinstance(homo, TrainingGraph) and isinstance(hetero, TrainingGraph)
    assert not homo.is_hetero and hetero.is_hetero
    nodes = homo.train_idx[:5]
    assert homo.loader_nodes(nodes) is nodes
    assert hetero.loader_nodes(nodes) == (hetero.target, nodes)
    data = homo.loader_data(with_features=False)
    assert "x" not in data and cached_csc(data).row is homo.row  # the graph's own CSC
    typed = hetero.loader_data()
    assert set(typed.node_types) == set(hetero.data.node_types)
    assert all(cached_csc(typed[et]) is not None for et in typed.edge_types)
