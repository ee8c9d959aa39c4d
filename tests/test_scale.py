"""Defects that only appear at size, checked at that size without allocating it: zero-memory
``expand``ed tensors, or the arithmetic on its own."""
import pytest
import torch
from torch_geometric.data import Data

from pyg_mgpu import NeighborLoader, NeighborSampler
from pyg_mgpu.data.csc import CSC, attach_csc
from pyg_mgpu.data.synthetic import SyntheticSpec, make_synthetic
from pyg_mgpu.data.fingerprint import (BLOCK, BLOCKS, WHOLE, block_starts, data_fingerprint,
                                       earlier_fingerprint, float32_block_starts)
from pyg_mgpu.sampling import numbering
from pyg_mgpu.sampling.numbering import max_batches_per_walk
from test_sampler import check_output

INT32_MAX = torch.iinfo(torch.int32).max


def sizes_around_powers_of_two(low=22, high=33):
    return sorted({n for p in range(low, high + 1) for n in (2**p - 1, 2**p, 2**p + 1)
                   if n > WHOLE} | {119_649_612, 1_615_685_872, 114_615_892})


@pytest.mark.parametrize("numel", sizes_around_powers_of_two())
def test_fingerprint_runs_start_inside_the_tensor_at_every_size(numel):
    starts = block_starts(numel)
    assert starts.dtype == torch.long and starts.numel() == BLOCKS
    assert int(starts[0]) == 0 and int(starts[-1]) == numel - BLOCK
    gaps = starts.diff()
    # Evenly spaced: every gap the exact quotient, rounded down or up.
    assert int(gaps.min()) >= (numel - BLOCK) // (BLOCKS - 1)
    assert int(gaps.max()) <= -(-(numel - BLOCK) // (BLOCKS - 1))


def test_a_tensor_whose_float32_starts_overran_it_is_fingerprinted():
    # 119,649,612 edges: the float32 linspace put the last run's start past the end.
    assert float32_block_starts(119_649_612) is None
    colptr = torch.arange(7)
    big = torch.zeros(1, dtype=torch.int32).expand(119_649_612)
    digest = data_fingerprint({"row": big, "colptr": colptr})
    assert digest == data_fingerprint({"row": torch.zeros(1, dtype=torch.int32)
                                              .expand(119_649_612), "colptr": colptr})
    assert digest != data_fingerprint({"row": torch.ones(1, dtype=torch.int32)
                                              .expand(119_649_612), "colptr": colptr})
    assert earlier_fingerprint({"row": big, "colptr": colptr}) is None


def test_the_earlier_digest_is_what_float32_starts_hashed():
    # A checkpoint of an earlier release holds the digest of its float32 starts; it must be
    # recomputed exactly, or such a run could not resume.
    numel = 5_000_001
    values = torch.arange(numel, dtype=torch.int64)
    starts = torch.linspace(0, numel - BLOCK, BLOCKS).long()
    import hashlib
    digest = hashlib.blake2b(digest_size=16)
    digest.update(f"x:{values.dtype}:{tuple(values.shape)};".encode())
    digest.update(values[(starts[:, None] + torch.arange(BLOCK)).view(-1)].numpy().tobytes())
    assert earlier_fingerprint({"x": values}) == digest.hexdigest()
    assert data_fingerprint({"x": values}) != digest.hexdigest()  # the starts differ here
    small = {"x": torch.arange(100)}  # hashed whole: one digest
    assert earlier_fingerprint(small) is None


def graph_with_edges(num_edges: int) -> Data:
    """Three nodes, int32 ids, ``num_edges`` edges that cost no memory: node 2's five
    in-edges are the CSC's last five positions, node 1 takes every other edge."""
    row = torch.zeros(1, dtype=torch.int32).expand(num_edges)
    colptr = torch.tensor([0, 0, num_edges - 5, num_edges])
    edge_index = torch.zeros(2, 1, dtype=torch.int32).expand(2, num_edges)
    data = Data(edge_index=edge_index, num_nodes=3)
    return attach_csc(data, CSC(colptr, row, perm=None, edge_index=edge_index))


def test_edge_ids_past_two_to_the_31_stay_int64_and_exact():
    num_edges = 2**31 + 10
    data = graph_with_edges(num_edges)
    expected = torch.arange(num_edges - 5, num_edges)
    loader = NeighborLoader(data, num_neighbors=[10], batch_size=1,
                            input_nodes=torch.tensor([2]))
    batch = next(iter(loader))
    assert batch.n_id.dtype == torch.int32  # node ids fit: PyG's int32 outputs
    assert batch.e_id.dtype == torch.int64 and torch.equal(batch.e_id, expected)
    sampler = NeighborSampler(data, num_neighbors=[10])
    for out in sampler.sample_batches([torch.tensor([2]), torch.tensor([2, 0])]):
        assert torch.equal(out.edge, expected)
    both = NeighborSampler(data, num_neighbors=[10], subgraph_type="bidirectional")
    out = both.sample(torch.tensor([2]))
    assert out.edge.dtype == torch.int64 and bool((out.edge >= num_edges - 5).all())


def test_edge_ids_below_two_to_the_31_keep_the_graph_index_type():
    data = graph_with_edges(1000)
    out = NeighborSampler(data, num_neighbors=[10]).sample(torch.tensor([2]))
    assert out.edge.dtype == torch.int32
    assert torch.equal(out.edge.long(), torch.arange(995, 1000))


@pytest.mark.parametrize("num_nodes, most", [(2_449_029, 438), (111_059_956, 9),
                                             (244_160_499, 4), (2**30, 1), (3 * 2**30, 1)])
def test_batches_per_walk_keep_the_lookup_int32_and_bounded(num_nodes, most):
    assert max_batches_per_walk(num_nodes) == most
    entries = most * num_nodes
    assert entries < numbering.LOOKUP_ENTRIES or most == 1
    if most > 1:  # the keys batch * num_nodes + node fit int32
        assert (most - 1) * num_nodes + num_nodes - 1 <= INT32_MAX


def test_walks_split_where_the_lookup_would_grow_past_its_bound(monkeypatch):
    graph = make_synthetic(SyntheticSpec(num_nodes=300, num_edges=3000), seed=1)
    monkeypatch.setattr(numbering, "LOOKUP_ENTRIES", 2 * 300 + 1)  # two batches a walk
    sampler = NeighborSampler(graph.loader_data(), num_neighbors=[5, 3], seed=0)
    gen = torch.Generator().manual_seed(0)
    seeds = [torch.randperm(300, generator=gen)[:20] for _ in range(5)]
    batches = sampler.sample_batches(seeds)
    assert len(batches) == 5
    for seed, batch in zip(seeds, batches):
        check_output(graph, batch, seed, [5, 3])
    (lookup,) = sampler.graph.lookups.values()  # one array, never one per batch count
    assert lookup.numel() == 2 * 300
    assert bool((lookup == numbering.unseen(lookup.dtype)).all())  # left clean


def test_a_shorter_walk_reads_the_longer_walk_lookup():
    data = Data(edge_index=torch.randint(50, (2, 400)), num_nodes=50)
    sampler = NeighborSampler(data, num_neighbors=[4], seed=0)
    sampler.sample_batches([torch.arange(5)] * 3)
    sampler.sample_batches([torch.arange(5)] * 2)  # an epoch's last walk
    sampler.sample(torch.arange(5))  # one batch
    (lookup,) = sampler.graph.lookups.values()
    assert lookup.numel() == 3 * 50


# The CLI at 2**27 + 5 edges (a size whose float32 fingerprint starts overran the tensor): its
# conversion replaced by a graph made directly (1M nodes, each taking ~134 in-edges from
# consecutive nodes), so the test pays for the start-up path itself: the cache written and read
# back into /dev/shm, the fingerprint, the ranks and their batches.
_BIG_GRAPH_CLI = """
import sys
import torch
from pyg_mgpu.data import datasets
from pyg_mgpu.data.graph import ConvertedGraph

def convert(*args):
    n, e = 1_000_000, 2**27 + 5
    splits = torch.randperm(n, generator=torch.Generator().manual_seed(0))[:3072].view(3, -1)
    return ConvertedGraph(name="big", colptr=torch.arange(n + 1) * e // n,
                          row=torch.arange(e, dtype=torch.int32) % n,
                          x=torch.randn(n, 4), y=torch.arange(n) % 3, train_idx=splits[0],
                          val_idx=splits[1], test_idx=splits[2], num_classes=3)

datasets._convert = convert
from pyg_mgpu.distributed_sampling import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_the_cli_starts_and_trains_on_a_graph_above_two_to_the_27_edges(tmp_path):
    assert float32_block_starts(2**27 + 5) is None
    import json
    import subprocess
    import sys
    source = tmp_path / "big.npz"
    source.write_bytes(b"")  # only named: the graph comes from the patched conversion
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-c", _BIG_GRAPH_CLI, "--dataset", str(source), "--devices", "cpu",
         "--nprocs", "2", "--epochs", "1", "--batch-size", "512", "--fanout", "3,2",
         "--cache-dir", str(tmp_path / "cache"), "--out", str(out)],
        capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "134,217,733 edges" in proc.stdout
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["epochs"][0]["epoch"] == 1
    assert 0.0 <= metrics["test_acc"] <= 1.0


def test_outgrown_iota_buffers_add_up_to_less_than_the_kept_one():
    from pyg_mgpu import gpu_path
    dtype = torch.float64  # a type no other code asks for: this test's buffers alone
    for size in (5000, 3000, 70_000, 70_001, 300_000, 1_000_000):
        assert torch.equal(gpu_path.iota(size, "cpu", dtype), torch.arange(size, dtype=dtype))
    kept = gpu_path._IOTA[torch.device("cpu"), dtype]
    outgrown = [t for t in gpu_path._IOTA_OUTGROWN if t.dtype == dtype]
    assert sum(t.numel() for t in outgrown) < kept.numel() <= 2 * 1_000_000


def test_a_checkpoint_holding_the_earlier_digest_resumes_on_the_same_data_only():
    from pyg_mgpu.train.checkpoint import check_same_data
    values = {"x": torch.arange(5_000_001)}
    written_before = {"data_fingerprint": earlier_fingerprint(values)}
    check_same_data(written_before, data_fingerprint(values), "runs/x", values)
    changed = {"x": torch.arange(5_000_001).flip(0)}
    with pytest.raises(ValueError, match="trained on other data"):
        check_same_data(written_before, data_fingerprint(changed), "runs/x", changed)
    check_same_data({}, data_fingerprint(changed), "runs/x", changed)  # kept no digest
