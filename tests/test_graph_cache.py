"""Loading at scale: the chunked conversion equals the old whole-array one bit for bit, .npz
files stream in any layout, and the converted-graph cache hits, goes stale, survives damage
and maps its files for the ranks."""
import json
import os
import pickle
import subprocess
import sys
import zipfile

import numpy as np
import pytest
import torch

from pyg_mgpu.data import cache as cache_module
from pyg_mgpu.data import datasets, sources
from pyg_mgpu.data.csc import build_csc, csc_from_chunks, edge_chunks
from pyg_mgpu.data.datasets import load_graph
from pyg_mgpu.data.graph import ConvertedGraph
from pyg_mgpu.data.synthetic import SyntheticSpec, make_synthetic
from pyg_mgpu.distributed_sampling import main

SMALL = SyntheticSpec(num_nodes=300, num_edges=4000, num_features=6, num_classes=3)


def old_conversion(edge_index: torch.Tensor, num_nodes: int):
    """The conversion before chunking: one stable sort of the whole edge list."""
    perm = torch.sort(edge_index[1], stable=True).indices
    colptr = torch.zeros(num_nodes + 1, dtype=torch.long)
    torch.cumsum(torch.bincount(edge_index[1], minlength=num_nodes), 0, out=colptr[1:])
    return colptr, edge_index[0][perm].to(torch.int32), perm.to(torch.int32)


@pytest.mark.parametrize("num_nodes, num_edges, chunk", [
    (10, 60, 7), (500, 20_000, 1_000), (500, 20_000, 1), (50, 3, 1_000), (7, 0, 4),
    (2_000, 50_000, 1 << 20)])
def test_chunked_conversion_equals_the_whole_array_sort(num_nodes, num_edges, chunk):
    gen = torch.Generator().manual_seed(num_edges)
    edge_index = torch.randint(0, num_nodes, (2, num_edges), generator=gen)
    colptr, row, perm = old_conversion(edge_index, num_nodes)
    for ids in (edge_index, edge_index.int()):
        csc = csc_from_chunks(edge_chunks(ids[0], ids[1], chunk), num_nodes)
        assert torch.equal(csc.colptr, colptr) and csc.colptr.dtype == torch.int64
        assert torch.equal(csc.row, row) and csc.row.dtype == torch.int32
        if num_edges > 1:
            assert torch.equal(csc.perm, perm)
    # Already grouped by destination: the edges are copied in order, and ids are positions.
    grouped = edge_index[:, perm.long()]
    csc = csc_from_chunks(edge_chunks(grouped[0], grouped[1], chunk), num_nodes)
    assert csc.perm is None and torch.equal(csc.row, row) and torch.equal(csc.colptr, colptr)
    # The transposed graph (out-edges) is the conversion of the flipped list.
    out = build_csc(edge_index, num_nodes, transpose=True)
    colptr_t, row_t, _ = old_conversion(edge_index.flip(0), num_nodes)
    assert torch.equal(out.colptr, colptr_t) and torch.equal(out.row, row_t)


def test_chunk_boundaries_inside_a_sorted_run_are_checked():
    # Each chunk is sorted but the sequence is not: the conversion must still sort.
    dst = torch.tensor([0, 1, 2, 0, 1, 2])
    src = torch.tensor([5, 4, 3, 2, 1, 0])
    csc = csc_from_chunks(edge_chunks(src, dst, 3), 6)
    assert csc.perm is not None
    assert csc.row.tolist() == [5, 2, 4, 1, 3, 0]


def test_store_from_an_edge_list_equals_the_old_conversion():
    g = make_synthetic(SMALL, seed=2)
    gen = torch.Generator().manual_seed(0)
    shuffled = g.edge_index()[:, torch.randperm(g.num_edges, generator=gen)]
    again = ConvertedGraph.from_edge_index("again", shuffled, g.x, g.y, g.train_idx, g.val_idx,
                                       g.test_idx)
    colptr, row, _ = old_conversion(shuffled, g.num_nodes)
    assert torch.equal(again.colptr, colptr) and torch.equal(again.row, row)


def write_npz(path, g: ConvertedGraph, *, compressed=False, fortran=False, big_endian=False,
              int32=False, float64=False):
    ei = g.edge_index().numpy()
    if int32:
        ei = ei.astype(np.int32)
    if big_endian:
        ei = ei.astype(ei.dtype.newbyteorder(">"))
    if fortran:
        ei = np.asfortranarray(ei)
    x = g.x.numpy().astype(np.float64 if float64 else np.float32)
    arrays = dict(edge_index=ei, x=x, y=g.y.numpy(), train_idx=g.train_idx.numpy(),
                  val_idx=g.val_idx.numpy(), test_idx=g.test_idx.numpy(),
                  num_classes=np.int64(g.num_classes))
    (np.savez_compressed if compressed else np.savez)(path, **arrays)
    return path


@pytest.mark.parametrize("layout", ["plain", "compressed", "fortran", "big_endian", "int32",
                                    "float64"])
def test_npz_streams_in_every_layout(tmp_path, monkeypatch, layout):
    g = make_synthetic(SMALL, seed=1)
    path = write_npz(tmp_path / "g.npz", g, **({} if layout == "plain" else {layout: True}))
    # Small chunks, so every stream crosses many chunk boundaries.
    import pyg_mgpu.data.npz as npz_module
    monkeypatch.setattr(npz_module, "CHUNK_EDGES", 333)
    back = load_graph(str(path))
    for key, t in g.tensors().items():
        assert torch.equal(t, back.tensors()[key]), key


def test_npz_truncated_inside_the_edges_is_a_clear_error(tmp_path):
    g = make_synthetic(SMALL, seed=1)
    path = write_npz(tmp_path / "g.npz", g)
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo("edge_index.npy")
    data = path.read_bytes()
    path.write_bytes(data[:info.header_offset + info.file_size // 2])
    with pytest.raises(datasets.DatasetError, match="truncated or corrupt"):
        load_graph(str(path))



@pytest.mark.parametrize("layout", ["plain", "compressed"])
@pytest.mark.parametrize("member", ["edge_index", "x"])
def test_npz_with_a_changed_byte_is_a_clear_error(tmp_path, layout, member):
    # Same size, one bit different: a stored member is read by seeks, which skip zipfile's
    # CRC check, so without its own check the graph would load with one id or value changed.
    g = make_synthetic(SMALL, seed=1)
    path = write_npz(tmp_path / "g.npz", g, **({} if layout == "plain" else {layout: True}))
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo(f"{member}.npy")
    data = bytearray(path.read_bytes())
    data[info.header_offset + 30 + len(info.filename) + info.compress_size // 2] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(datasets.DatasetError, match="truncated or corrupt"):
        load_graph(str(path))


# The cache.

def load_npz_cached(path, cache_dir, lines, placement="tensors"):
    return load_graph(str(path), cache_dir=cache_dir, placement=placement, log=lines.append)


def test_cache_hit_reads_without_converting(tmp_path, monkeypatch):
    g = make_synthetic(SMALL, seed=3)
    path = write_npz(tmp_path / "g.npz", g)
    lines = []
    first = load_npz_cached(path, tmp_path / "cache", lines)
    assert "converted and wrote" in lines[-1]
    monkeypatch.setattr(sources, "load_npz", lambda p: pytest.fail("converted again"))
    where = {"tensors": "in shared memory", "shm": "copied to /dev/shm", "mmap": "mapped"}
    for placement, said in where.items():
        again = load_npz_cached(path, tmp_path / "cache", lines, placement)
        assert lines[-1].startswith("graph cache: read") and lines[-1].endswith(f"({said})")
        assert again.name == first.name == "g" and again.num_classes == first.num_classes
        for key, t in first.tensors().items():
            assert torch.equal(t, again.tensors()[key]) and t.dtype == again.tensors()[key].dtype
        mapped = set(again.mapped) if placement != "tensors" else set()
        assert set(again.mapped) == mapped and again.is_shared()
        in_shm = bool(again.mapped) and all(f.path.startswith("/dev/shm/")
                                            for f in again.mapped.values())
        assert in_shm == (placement == "shm")


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="needs /dev/shm")
def test_shm_copies_go_with_the_graph_and_orphans_are_swept(tmp_path):
    path = write_npz(tmp_path / "g.npz", make_synthetic(SMALL, seed=3))
    load_npz_cached(path, tmp_path / "cache", [])
    g = load_npz_cached(path, tmp_path / "cache", [], "shm")
    copies = [f.path for f in g.mapped.values()]
    assert copies and all(os.path.exists(p) for p in copies)
    x = g.x.clone()
    del g
    assert not any(os.path.exists(p) for p in copies)
    # A killed process's copies (its pid is gone) are removed by the next shm open.
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    orphan = f"/dev/shm/{cache_module.SHM_PREFIX}{dead}-0000-x.bin"
    open(orphan, "wb").close()
    g = load_npz_cached(path, tmp_path / "cache", [], "shm")
    assert not os.path.exists(orphan) and torch.equal(g.x, x)


def test_changed_source_makes_the_cache_stale(tmp_path):
    path = write_npz(tmp_path / "g.npz", make_synthetic(SMALL, seed=3))
    lines = []
    load_npz_cached(path, tmp_path / "cache", lines)
    other = make_synthetic(SMALL, seed=4)
    write_npz(path, other)
    os.utime(path, ns=(1, 1))  # a new modification time even on coarse clocks
    back = load_npz_cached(path, tmp_path / "cache", lines)
    assert "stale" in lines[-1] and "rebuilt" in lines[-1] and len(lines[-1].splitlines()) == 1
    assert torch.equal(back.x, other.x) and torch.equal(back.row, other.row)
    # Other options (the feature dtype) are other caches, side by side.
    bf16 = load_graph(str(path), cache_dir=tmp_path / "cache", feature_dtype=torch.bfloat16,
                      log=lines.append)
    assert bf16.x.dtype == torch.bfloat16 and "converted and wrote" in lines[-1]
    assert len(list((tmp_path / "cache").iterdir())) == 2


def overwrite_start(path, values: np.ndarray) -> None:
    """Overwrites the first bytes of ``path`` with ``values``, keeping its size."""
    with open(path, "r+b") as f:
        f.write(values.tobytes())


# Same size, wrong content: what a sampler or the loss would trip over mid-run.
SAME_SIZE_DAMAGE = {
    "pointers-decrease": ("colptr", lambda g: np.array([0, g.num_edges], np.int64)),
    "source-ids": ("row", lambda g: np.array([g.num_nodes], g.row.numpy().dtype)),
    "labels": ("y", lambda g: np.array([g.num_classes], np.int64)),
    "split-ids": ("train_idx", lambda g: np.array([g.num_nodes], np.int64)),
}


@pytest.mark.parametrize("damage", ["truncated", "missing", "meta", "pointers",
                                    *SAME_SIZE_DAMAGE])
def test_damaged_cache_is_rebuilt(tmp_path, damage):
    g = make_synthetic(SMALL, seed=5)
    path = write_npz(tmp_path / "g.npz", g)
    lines = []
    load_npz_cached(path, tmp_path / "cache", lines)
    folder = next((tmp_path / "cache").iterdir())
    if damage == "truncated":
        data = (folder / "x.bin").read_bytes()
        (folder / "x.bin").write_bytes(data[:len(data) // 2])
    elif damage == "missing":
        (folder / "row.bin").unlink()
    elif damage == "meta":
        (folder / "meta.json").write_text("{not json")
    elif damage == "pointers":  # same size: the pointers no longer end at the edge count
        (folder / "colptr.bin").write_bytes(bytes(len((folder / "colptr.bin").read_bytes())))
    else:
        name, values = SAME_SIZE_DAMAGE[damage]
        overwrite_start(folder / f"{name}.bin", values(g))
    back = load_npz_cached(path, tmp_path / "cache", lines)
    assert "rebuilt" in lines[-1] and ("corrupt" in lines[-1] or "unreadable" in lines[-1])
    for key, t in g.tensors().items():
        assert torch.equal(t, back.tensors()[key]), key
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [folder.name]


def test_a_store_another_writer_finished_first_is_kept(tmp_path):
    # Two nodes' ranks sharing a cache both build the graph: the second writer keeps the first's
    # folder (its readers have its files open) and drops its own copy; a stale one it replaces.
    g = make_synthetic(SMALL, seed=5)
    folder = tmp_path / "cache" / "g"
    cache_module.save_store(g, folder, "key")
    first = (folder / "meta.json").stat().st_ino
    reader = cache_module.open_store(folder, "key")
    cache_module.save_store(g, folder, "key")
    assert (folder / "meta.json").stat().st_ino == first
    assert [p.name for p in folder.parent.iterdir()] == ["g"], "its own copy was left behind"
    assert torch.equal(reader.colptr, g.colptr)
    cache_module.save_store(g, folder, "another key")
    assert (folder / "meta.json").stat().st_ino != first


def test_crash_while_writing_leaves_no_cache_that_looks_complete(tmp_path, monkeypatch):
    path = write_npz(tmp_path / "g.npz", make_synthetic(SMALL, seed=5))

    def torn(self, *args, **kwargs):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(cache_module.Path, "write_text", torn)
    lines = []
    g = load_npz_cached(path, tmp_path / "cache", lines)  # the run goes on without a cache
    assert "could not write" in lines[-1] and g.num_edges == SMALL.num_edges
    monkeypatch.undo()
    assert list((tmp_path / "cache").iterdir()) == [], "a partial cache was left behind"
    load_npz_cached(path, tmp_path / "cache", lines)
    assert "converted and wrote" in lines[-1]


def test_an_unwritable_cache_is_an_error_where_the_run_was_to_map_its_files(tmp_path):
    path = write_npz(tmp_path / "g.npz", make_synthetic(SMALL, seed=5))
    cache = tmp_path / "cache"
    cache.write_text("a file where the cache folder should be")
    with pytest.raises(OSError, match="--features-on mmap.*writable"):
        load_graph(str(path), cache_dir=cache, placement="mmap")
    assert load_graph(str(path), cache_dir=cache, placement="tensors").num_edges == \
        SMALL.num_edges  # other placements go on without the cache


@pytest.mark.slow
def test_mapped_graph_reaches_another_process_as_its_files(tmp_path):
    path = write_npz(tmp_path / "g.npz", make_synthetic(SMALL, seed=6))
    g = load_npz_cached(path, tmp_path / "cache", [], "mmap")
    payload = pickle.dumps(g)
    assert len(payload) < 10_000, "a mapped tensor was pickled with its bytes"
    script = ("import pickle, sys, torch; g = pickle.load(sys.stdin.buffer); "
              "print(sorted(g.mapped), float(g.x.sum()), int(g.row.long().sum()))")
    proc = subprocess.run([sys.executable, "-c", script], input=payload, capture_output=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    assert proc.stdout.decode().split("]")[0] + "]" == str(sorted(g.tensors()))
    _, x_sum, row_sum = proc.stdout.decode().rsplit(" ", 2)
    assert float(x_sum) == float(g.x.sum()) and int(row_sum) == int(g.row.long().sum())


def test_a_saved_mapped_tensor_loads_as_a_plain_tensor(tmp_path):
    # torch.save writes a mapped tensor's data, which torch.load(weights_only=True) reads back
    # (it takes no tensor subclass); multiprocessing sends it as its file instead.
    from multiprocessing.reduction import ForkingPickler
    path = write_npz(tmp_path / "g.npz", make_synthetic(SMALL, seed=6))
    g = load_npz_cached(path, tmp_path / "cache", [], "mmap")
    torch.save({"x": g.x}, tmp_path / "x.pt")
    x = torch.load(tmp_path / "x.pt", weights_only=True)["x"]
    assert type(x) is torch.Tensor and torch.equal(x, g.x)
    assert len(ForkingPickler.dumps(g.x)) < 10_000, "multiprocessing pickled the bytes"


@pytest.mark.slow
def test_mapped_features_train_like_shared_memory(tmp_path):
    tiny = ["--num-nodes", "1500", "--num-edges", "15000", "--num-features", "8",
            "--num-classes", "4", "--hidden", "16", "--batch-size", "256", "--devices", "cpu",
            "--nprocs", "2", "--epochs", "2", "--cache-dir", str(tmp_path / "cache")]
    losses = {}
    for mode in ("shm", "mmap"):
        assert main(tiny + ["--features-on", mode, "--out", str(tmp_path / mode)]) == 0
        metrics = json.loads((tmp_path / mode / "metrics.json").read_text())
        losses[mode] = [e["train_loss"] for e in metrics["epochs"]]
    assert losses["shm"] == losses["mmap"]
    assert main(tiny + ["--no-cache", "--features-on", "mmap", "--out", str(tmp_path)]) == 2


def test_past_the_whole_read_limit_source_ids_are_checked_evenly_spaced(tmp_path, monkeypatch):
    monkeypatch.setattr(cache_module, "_ROWS_READ_WHOLE", 16)
    g = make_synthetic(SMALL, seed=5)
    path = write_npz(tmp_path / "g.npz", g)
    lines = []
    load_npz_cached(path, tmp_path / "cache", lines)
    folder = next((tmp_path / "cache").iterdir())
    step = -(-g.num_edges // 16)
    bad = np.array([g.num_nodes], g.row.numpy().dtype)
    with open(folder / "row.bin", "r+b") as f:  # an id the sample reads: edge 3 * step
        f.seek(3 * step * bad.itemsize)
        f.write(bad.tobytes())
    back = load_npz_cached(path, tmp_path / "cache", lines)
    assert "rebuilt" in lines[-1] and "source ids" in lines[-1]
    assert torch.equal(back.row, g.row)
