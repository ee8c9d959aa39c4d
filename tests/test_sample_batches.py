"""``NeighborSampler.sample_batches``: several batches in one walk, each the batch a lone walk
over its seeds gives (exactly, where nothing is random; in distribution otherwise), for the
walk's kernels once."""
import itertools

import pytest
import torch
from scipy.stats import chisquare
from torch_geometric.data import Data

from pyg_mgpu import NeighborLoader, NeighborSampler
from pyg_mgpu.tools.step_costs import STAGES, OpCounter
from test_sampler import check_output, graph, native  # noqa: F401 (graph: a fixture)

SEEDS = [torch.tensor([1, 5, 7]), torch.tensor([5, 9]), torch.tensor([3, 3, 4]),
         torch.tensor([], dtype=torch.long)]


def random_data(dtype=torch.long):
    gen = torch.Generator().manual_seed(0)
    edge_index = torch.randint(300, (2, 3000), generator=gen)
    return Data(edge_index=edge_index.to(dtype), num_nodes=300)


def same(a, b, disjoint=False):
    fields = ("node", "row", "col", "edge") + (("batch",) if disjoint else ())
    return all(torch.equal(getattr(a, f), getattr(b, f)) for f in fields) and \
        a.num_sampled_nodes == b.num_sampled_nodes and \
        a.num_sampled_edges == b.num_sampled_edges


@pytest.mark.parametrize("options", [{}, {"disjoint": True}, {"sample_direction": "backward"},
                                     {"subgraph_type": "bidirectional"}])
@pytest.mark.parametrize("dtype", [torch.long, torch.int32])
def test_every_neighbour_gives_each_batch_exactly_its_lone_walk(options, dtype):
    # With every neighbour drawn nothing is random: each batch must be the lone batch,
    # repeated and empty seed lists included.
    sampler = NeighborSampler(random_data(dtype), [-1, -1], seed=0, **options)
    batches = sampler.sample_batches(SEEDS)
    assert len(batches) == len(SEEDS)
    for seeds, batch in zip(SEEDS, batches):
        assert same(sampler.sample(seeds), batch, disjoint=options.get("disjoint", False))
        assert batch.node.dtype == dtype


def test_each_batch_is_a_valid_sample(graph):
    fanouts = [10, 5]
    sampler = native(graph, fanouts, seed=3)
    seeds = [torch.randperm(graph.num_nodes)[:150] for _ in range(6)]
    for seed, batch in zip(seeds, sampler.sample_batches(seeds)):
        check_output(graph, batch, seed, fanouts)


def test_draws_stay_uniform_without_replacement():
    # 8 batches of destination nodes that share the same 10 in-neighbours, each drawing 3 of
    # them: every 3-subset equally likely, in whichever batch.
    deg, per_batch, num_batches, fanout = 10, 300, 8, 3
    n = deg + per_batch * num_batches
    dst = torch.arange(deg, n).repeat_interleave(deg)
    src = torch.arange(deg).repeat(n - deg)
    sampler = NeighborSampler(Data(edge_index=torch.stack([src, dst]), num_nodes=n), [fanout],
                              seed=11)
    seeds = list(torch.arange(deg, n).split(per_batch))
    index = {s: i for i, s in enumerate(itertools.combinations(range(deg), fanout))}
    codes = []
    for _ in range(2):
        for batch in sampler.sample_batches(seeds):
            picked = batch.node[batch.row].view(per_batch, fanout).sort(dim=1).values
            assert (picked[:, 1:] > picked[:, :-1]).all(), "a neighbour was drawn twice"
            codes += [index[tuple(s)] for s in picked.tolist()]
    per_subset = torch.bincount(torch.tensor(codes), minlength=len(index)).double()
    assert chisquare(per_subset.numpy()).pvalue > 1e-3


def test_one_walk_issues_fewer_ops_per_batch(graph):
    sampler = native(graph, [10, 5], seed=0)
    seeds = [torch.randperm(graph.num_nodes)[:128] for _ in range(8)]
    alone, together = OpCounter(), OpCounter()
    with alone:
        for seed in seeds:
            sampler.sample(seed)
    with together:
        sampler.sample_batches(seeds)
    ops_alone = alone.costs[STAGES[0]].kernels
    ops_together = together.costs[STAGES[0]].kernels
    assert ops_together * 3 < ops_alone, (ops_together, ops_alone)
    assert together.costs[STAGES[0]].syncs * 3 < alone.costs[STAGES[0]].syncs


def test_refuses_what_one_walk_cannot_split():
    data = random_data()
    data.time = torch.arange(300)
    for options in ({"time_attr": "time"}, {"subgraph_type": "induced"}):
        with pytest.raises(NotImplementedError, match="sample_batches"):
            NeighborSampler(data, [2], **options).sample_batches(SEEDS[:2])


# The loader: pyg_mgpu.NeighborLoader(distributed=True, sample_batches=k).

def loader_data() -> Data:
    gen = torch.Generator().manual_seed(0)
    return Data(x=torch.randn(500, 4), y=torch.randint(3, (500,)),
                edge_index=torch.randint(500, (2, 5000), generator=gen))


def sharded_loader(data, k, rank=0, **options):
    return NeighborLoader(data, [5, 3], input_nodes=torch.arange(300), batch_size=32,
                          shuffle=True, distributed=True, rank=rank, world_size=2, seed=1,
                          sample_batches=k, **options)


def drain(loader) -> tuple[list, list]:
    """The batches of one epoch, and the state the loader reports before each."""
    batches, states, it = [], [], iter(loader)
    while True:
        states.append(loader.sampler_state())
        batch = next(it, None)
        if batch is None:
            return batches, states
        batches.append(batch)


@pytest.mark.parametrize("k", [2, 3, 8])
def test_loader_hands_out_the_same_seeds_and_valid_batches(k):
    data = loader_data()
    seen = []
    for rank in range(2):
        alone, walked = sharded_loader(data, 1, rank), sharded_loader(data, k, rank)
        alone.set_epoch(3)
        walked.set_epoch(3)
        expected = list(alone)
        batches = list(walked)
        assert len(walked) == len(alone) == len(batches) == len(expected)
        for a, b in zip(expected, batches):
            assert torch.equal(a.input_id, b.input_id) and a.batch_size == b.batch_size
            assert torch.equal(b.n_id[:b.batch_size], b.input_id)  # seeds first
            src, dst = b.n_id[b.edge_index[0]], b.n_id[b.edge_index[1]]
            # every edge is a true edge of the caller's graph, named by e_id
            assert torch.equal(data.edge_index[:, b.e_id], torch.stack([src, dst]))
            assert torch.equal(b.x, data.x[b.n_id]) and torch.equal(b.y, data.y[b.n_id])
            seen += b.input_id.tolist()
    assert sorted(seen) == list(range(300))  # every seed once per epoch over the ranks


@pytest.mark.parametrize("k", [1, 3])
def test_loader_resumes_at_every_step_with_the_same_batches(k):
    data = loader_data()
    loader = sharded_loader(data, k)
    loader.set_epoch(2)
    batches, states = drain(loader)
    for start in range(len(batches) + 1):
        resumed = sharded_loader(data, k)
        resumed.set_epoch(2, start_step=start)
        resumed.node_sampler.generator.set_state(states[start])
        rest = list(resumed)
        assert len(rest) == len(resumed) == len(batches) - start
        for a, b in zip(rest, batches[start:]):
            assert torch.equal(a.n_id, b.n_id) and torch.equal(a.edge_index, b.edge_index)
            assert torch.equal(a.e_id, b.e_id)


def test_loader_with_workers_gives_the_walks_batches():
    data = loader_data()
    inline, workers = sharded_loader(data, 3), sharded_loader(data, 3, num_workers=2)
    inline.set_epoch(1)
    workers.set_epoch(1)
    expected = [b.input_id for b in inline]
    got = list(workers)
    assert len(got) == len(expected) == len(workers)
    for seeds, batch in zip(expected, got):
        assert torch.equal(batch.input_id, seeds) and torch.equal(batch.x, data.x[batch.n_id])


def test_loader_refuses_what_it_cannot_walk():
    data = loader_data()
    with pytest.raises(ValueError, match="needs distributed=True"):
        NeighborLoader(data, [2], batch_size=4, sample_batches=2)
    with pytest.raises(ValueError, match="positive whole number"):
        sharded_loader(data, 0)
    data.time = torch.arange(500)
    with pytest.raises(ValueError, match="homogeneous graph, without time_attr"):
        sharded_loader(data, 2, time_attr="time")


# The GPU's path (pyg_mgpu.gpu_path): new nodes counted one hop late, sizes read once per hop.

@pytest.mark.parametrize("options", [{}, {"replace": True}, {"weight_attr": "w"},
                                     {"subgraph_type": "bidirectional"},
                                     {"sample_direction": "backward"}])
def test_gpu_path_draws_the_cpu_paths_batches(options):
    from pyg_mgpu.gpu_path import counting_gpu_path
    data = random_data()
    data.w = torch.rand(data.num_edges) + 0.1
    seeds = [torch.randint(300, (40,)) for _ in range(3)]
    cpu, gpu = NeighborSampler(data, [6, 4, 2], seed=5, **options), \
        NeighborSampler(data, [6, 4, 2], seed=5, **options)
    expected = [cpu.sample(s) for s in seeds] + cpu.sample_batches(seeds)
    with counting_gpu_path():
        got = [gpu.sample(s) for s in seeds] + gpu.sample_batches(seeds)
    for a, b in zip(expected, got):
        assert same(a, b)


@pytest.mark.parametrize("host_pointers", [True, False])
def test_gpu_path_reads_sizes_once_per_hop(host_pointers):
    # Seeds on the host and the graph's pointers there too: the first hop is planned on the
    # host, and the walk reads once at each later hop and once at its end (3 reads for 3
    # hops). Without the pointers on the host (a user's graph moved to a GPU) the first hop
    # reads its sizes as well.
    from pyg_mgpu.gpu_path import counting_gpu_path
    sampler = NeighborSampler(random_data(), [6, 4, 2], seed=0)
    if not host_pointers:
        sampler.graph.host_colptr = {}
    reads = 3 if host_pointers else 4
    for seeds in ([torch.arange(50)],
                  [torch.arange(50), torch.arange(20, 90), torch.arange(5),
                   torch.arange(100, 160)]):
        counter = OpCounter()
        with counting_gpu_path(), counter:
            # Four batches in one walk: every batch's counts come with the walk's last read.
            sampler.sample(seeds[0]) if len(seeds) == 1 else sampler.sample_batches(seeds)
        sampling = counter.costs[STAGES[0]]
        assert sampling.syncs == reads, sampling.sync_ops
        assert set(sampling.sync_ops) == {"host read"}


@pytest.mark.parametrize("flags, message", [
    (["--sample-batches", "4", "--sampler", "pyg"], "--sample-batches 4 walks the native"),
    (["--sample-batches", "4", "--dataset", "synthetic-hetero"],
     "--sample-batches is for homogeneous datasets"),
    (["--sample-batches", "0"], "--sample-batches must be a positive number"),
])
def test_cli_refuses_walks_it_cannot_take(capfd, flags, message):
    from pyg_mgpu.distributed_sampling import main
    assert main(flags) == 2
    assert message in capfd.readouterr().err


def test_first_hop_planned_on_the_host_gives_the_same_batches():
    # The plan made on the host from its copy of the pointers, and the one made on the device,
    # draw the same batches from the same generator state, one or several per walk.
    from pyg_mgpu.gpu_path import counting_gpu_path
    seeds = [torch.arange(50), torch.arange(20, 90), torch.arange(5), torch.arange(100, 160)]
    outputs = []
    for host_pointers in (True, False):
        sampler = NeighborSampler(random_data(), [6, 4, 2], seed=0)
        if not host_pointers:
            sampler.graph.host_colptr = {}
        with counting_gpu_path():
            outputs.append([sampler.sample(seeds[0]), *sampler.sample_batches(seeds)])
    for a, b in zip(*outputs):
        for name in ("node", "row", "col", "edge"):
            assert torch.equal(getattr(a, name), getattr(b, name)), name
        assert a.num_sampled_nodes == b.num_sampled_nodes
        assert a.num_sampled_edges == b.num_sampled_edges


def test_a_sampler_without_hops_returns_its_seeds_on_the_gpu_path():
    from pyg_mgpu.gpu_path import counting_gpu_path
    sampler = NeighborSampler(random_data(), [], seed=0)
    with counting_gpu_path():
        out = sampler.sample(torch.tensor([3, 1, 4]))
    assert out.node.tolist() == [3, 1, 4] and out.row.numel() == 0


@pytest.mark.parametrize("gpu_path", [False, True])
@pytest.mark.parametrize("fanouts", [[], [0], [3, 0]])
def test_walks_whose_last_hop_draws_nothing_split_into_their_batches(fanouts, gpu_path):
    # No new nodes at the end: the batches' counts are not read with the walk's last hop but
    # counted in the split.
    import contextlib
    from pyg_mgpu.gpu_path import counting_gpu_path
    seeds = [torch.arange(10), torch.arange(5, 20)]
    sampler = NeighborSampler(random_data(), fanouts, seed=0)
    with counting_gpu_path() if gpu_path else contextlib.nullcontext():
        walked = sampler.sample_batches(seeds)
    alone = NeighborSampler(random_data(), fanouts, seed=0)
    for out, s in zip(walked, seeds):
        assert out.node[:s.numel()].tolist() == s.tolist()
        assert out.num_sampled_nodes[0] == s.numel()
        if not any(fanouts):
            assert torch.equal(out.node, alone.sample(s).node)


def test_the_clis_default_batches_per_walk():
    from types import SimpleNamespace

    from pyg_mgpu.train.loaders import BATCHES_PER_WALK, SMALL_CPU_BATCH, batches_per_walk
    cpu = SimpleNamespace(is_hetero=False, x=torch.zeros(1))
    hetero = SimpleNamespace(is_hetero=True, x=None)
    assert batches_per_walk(None, cpu, "native", SMALL_CPU_BATCH) == BATCHES_PER_WALK > 1
    assert batches_per_walk(None, cpu, "native", SMALL_CPU_BATCH + 1) == 1
    assert batches_per_walk(None, cpu, "pyg", 32) == 1  # PyG's sampler walks one batch
    assert batches_per_walk(None, hetero, "native", 32) == 1
    assert batches_per_walk(3, cpu, "native", 1024) == 3  # --sample-batches as given
