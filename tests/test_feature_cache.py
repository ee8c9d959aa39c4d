"""The GPU feature cache serves exactly x[n_id], caching the most-sampled rows (tested on CPU)."""
import pytest
import torch

from pyg_mgpu.data.synthetic import SyntheticSpec, make_synthetic
from pyg_mgpu.sampling.feature_cache import FeatureCache, out_degree
from pyg_mgpu.train.loaders import make_loader

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def graph():
    return make_synthetic(SyntheticSpec(num_nodes=2000, num_edges=30_000, num_features=6), seed=0)


@pytest.mark.parametrize("max_rows", [0, 1, 500, 2000, 10**9])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gathers_exactly_the_requested_rows(graph, max_rows, dtype):
    x = graph.x.to(dtype)
    cache = FeatureCache(x, out_degree(graph.row, graph.num_nodes), CPU, max_rows)
    assert cache.num_cached == min(max_rows, graph.num_nodes)
    n_id = torch.randperm(graph.num_nodes)[:700]
    got = cache.gather(n_id)
    assert got.dtype == dtype and torch.equal(got, x[n_id])
    assert cache.gather(torch.empty(0, dtype=torch.long)).shape == (0, 6)


@pytest.mark.parametrize("max_rows", [0, 1, 500, 2000])
def test_gathers_in_place_from_a_view_of_host_memory(graph, max_rows):
    # --graph-on host: the features and the batch's ids are (views) on the device, the misses
    # read by the gather itself. The same code on CPU tensors, counted along the GPU's path.
    from pyg_mgpu.gpu_path import counting_gpu_path
    from pyg_mgpu.tools.step_costs import STAGES, OpCounter
    cache = FeatureCache(graph.x, out_degree(graph.row, graph.num_nodes), CPU, max_rows)
    cache.in_place = True
    n_id = torch.randint(graph.num_nodes, (700,))
    counter = OpCounter()
    with counting_gpu_path(), counter:
        got = cache.gather(n_id)
    assert torch.equal(got, graph.x[n_id])
    # at most one wait for the device: the misses' count, and none when nothing can miss
    # (no cache: every row read in place; the whole graph cached: every row a hit)
    waits = 1 if 0 < max_rows < graph.num_nodes else 0
    assert counter.costs[STAGES[0]].syncs == waits, counter.costs[STAGES[0]].sync_ops


def test_fills_the_cache_in_chunks(graph, monkeypatch):
    monkeypatch.setattr("pyg_mgpu.sampling.feature_cache._CHUNK_ROWS", 7)
    cache = FeatureCache(graph.x, out_degree(graph.row, graph.num_nodes), CPU, 100)
    n_id = torch.arange(graph.num_nodes)
    assert torch.equal(cache.gather(n_id), graph.x)


def test_caches_the_most_sampled_nodes(graph):
    degree = out_degree(graph.row, graph.num_nodes)
    assert int(degree.sum()) == graph.num_edges
    cache = FeatureCache(graph.x, degree, CPU, max_rows=100)
    cached = (cache.slot >= 0).nonzero().squeeze(1)
    assert cached.numel() == 100
    # Every cached node is at least as hot as every node left out.
    assert int(degree[cached].min()) >= int(degree[cache.slot < 0].max())
    assert torch.equal(cache.rows, graph.x[cached[cache.slot[cached].argsort()]])


def test_rejects_hotness_of_the_wrong_shape(graph):
    with pytest.raises(ValueError, match="one value per node"):
        FeatureCache(graph.x, torch.ones(5), CPU, 10)


@pytest.mark.parametrize("workers", [0, 1])
def test_loader_batches_carry_their_rows(graph, workers):
    cache = FeatureCache(graph.x, out_degree(graph.row, graph.num_nodes), CPU, 300)
    loader = make_loader(graph, graph.train_idx[:400], fanout=[5, 3], sampler="native",
                         seed=0, batch_size=128, num_workers=workers, feature_cache=cache)
    for batch in loader:
        assert torch.equal(batch.x, graph.x[batch.n_id])
        assert torch.equal(batch.y, graph.y[batch.n_id])


def test_pickled_copies_carry_no_rows(graph):
    # DataLoader workers started with spawn/forkserver get a pickled loader, transform included.
    import pickle
    cache = FeatureCache(graph.x, out_degree(graph.row, graph.num_nodes), CPU, max_rows=100)
    payload = pickle.dumps(cache)
    assert len(payload) < 10_000, "the features or cached rows went into the pickle"
    copy = pickle.loads(payload)
    with pytest.raises(RuntimeError, match="training process only"):
        copy.gather(torch.arange(5))
    assert torch.equal(cache.gather(torch.arange(5)), graph.x[:5])  # the original still serves


def test_graph_stays_on_the_host_for_pyg_sampler_or_too_little_gpu_memory(graph):
    from pyg_mgpu.train.loaders import place_graph
    # PyG's sampler runs on the CPU: even a GPU rank with room to spare samples the host copy.
    # (Decided before any CUDA call, so this runs without a GPU.)
    assert place_graph(graph, torch.device("cuda", 0), "auto", sampler="pyg") is graph
    # With --graph-on auto, every rank goes by the same (least) free memory.
    from pyg_mgpu.train.loaders import choose_placement
    cuda = torch.device("cuda", 0)
    assert choose_placement(graph, cuda, "auto", free_bytes=2 * graph.nbytes()) == "gpu"
    # Too little: the host copy pinned and read by the GPU, unless its features are a file's.
    assert choose_placement(graph, cuda, "auto", free_bytes=2 * graph.nbytes() - 1) == "host"
    assert choose_placement(graph, torch.device("cpu"), "auto") == "cpu"
    assert choose_placement(graph, cuda, "cpu") == "cpu"
    assert choose_placement(graph, cuda, "host", sampler="pyg") == "cpu"


def test_a_host_copy_in_a_file_stays_with_the_cpu(tmp_path):
    from test_graph_cache import SMALL, load_npz_cached, write_npz

    from pyg_mgpu.data.synthetic import make_synthetic
    from pyg_mgpu.train.loaders import choose_placement, features_in_a_file
    path = write_npz(tmp_path / "g.npz", make_synthetic(SMALL, seed=0))
    cuda = torch.device("cuda", 0)
    for placement, pinned in [("mmap", False), ("shm", True), ("tensors", True)]:
        graph = load_npz_cached(path, tmp_path / "cache", [], placement)
        assert features_in_a_file(graph) == (not pinned), placement
        assert choose_placement(graph, cuda, "auto", free_bytes=0) == \
            ("host" if pinned else "cpu"), placement


def test_cpu_ranks_never_touch_cuda_on_a_gpu_machine(graph, monkeypatch):
    from pyg_mgpu.train.checkpoint import rng_state

    def no_cuda(*args, **kwargs):
        raise AssertionError("a CPU rank opened CUDA")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for name in ("get_rng_state", "get_rng_state_all", "init"):
        monkeypatch.setattr(torch.cuda, name, no_cuda)
    loader = make_loader(graph, graph.train_idx[:100], fanout=[2], sampler="native", seed=0,
                         batch_size=50, num_workers=1, device=CPU)
    assert not loader.pin_memory  # pinning would start CUDA in the pin thread
    assert "cuda" not in rng_state(loader.node_sampler, CPU)
