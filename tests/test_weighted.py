"""Weighted draws as pyg-lib makes them: each node's edges come in draw order on every route
(numpy's partition, ``topk`` from ``weighted._PARTITION_MAX_THREADS`` torch threads and on
CUDA, rejection), which decides the order new nodes are numbered in; and float64 weights stay
float64, so a weight of 1e-60 is not 0 nor one of 1e300 infinite."""
import pytest
import torch
from scipy.stats import chisquare
from torch_geometric.data import Data

from pyg_mgpu.sampling import weighted
from pyg_mgpu.sampling.neighbor_sampler import NeighborSampler

from test_neighbor_loader import (BOTH_SELECTIONS, WEIGHTS,
                                  check_successive_draws_for_mixed_degrees, random_graph,
                                  rows_drawn_by_rejection, weighted_star)

CUDA = torch.device("cuda", 0)
# Both key selections by torch's thread count: numpy's partition, then topk.
THREAD_COUNTS = pytest.mark.parametrize("num_threads", [1, weighted._PARTITION_MAX_THREADS])


@pytest.fixture
def threads():
    """``torch.set_num_threads`` for one test (the thread count picks the key selection),
    the caller's count restored after."""
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


def heavy_stars(num_stars, degree, heavy, dtype=torch.float32):
    """Centres ``0..num_stars-1``, each with ``degree`` in-edges from leaves of its own, listed
    by centre (so an edge id modulo ``degree`` is its leaf); the last leaf weighs ``heavy``,
    the others 1."""
    src = num_stars + torch.arange(degree * num_stars)
    dst = torch.arange(num_stars).repeat_interleave(degree)
    weight = torch.ones(degree, dtype=dtype)
    weight[-1] = heavy
    return Data(edge_index=torch.stack([src, dst]), weight=weight.repeat(num_stars),
                num_nodes=num_stars * (degree + 1))


def check_heavy_edge_slots(data, num_stars, degree, heavy, fanout, device="cpu", p_min=1e-3):
    """Each centre's ``fanout`` edges come in draw order: the heavy one is draw ``i`` as often
    as drawing one edge at a time proportionally to the remaining weights makes it, and its
    leaf is the centre's first new node as often as it is the first draw."""
    out = NeighborSampler(data, [fanout], weight_attr="weight", seed=0).sample(
        torch.arange(num_stars, device=device))
    edge, node = out.edge.cpu(), out.node.cpu()
    is_heavy = (edge % degree == degree - 1).view(num_stars, fanout)
    slot = torch.where(is_heavy.any(1), is_heavy.int().argmax(1), fanout)
    counts = torch.bincount(slot, minlength=fanout + 1).double()
    expected, left = [], 1.0
    for i in range(fanout):
        first = heavy / (heavy + degree - 1 - i)
        expected.append(left * first)
        left *= 1 - first
    expected = torch.tensor(expected + [left], dtype=torch.float64) * num_stars
    assert chisquare(counts.numpy(), expected.numpy()).pvalue > p_min, counts
    first_new = node[num_stars:].view(num_stars, fanout)[:, 0]
    assert torch.equal((first_new - num_stars) % degree == degree - 1, is_heavy[:, 0])


@THREAD_COUNTS
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_weighted_draws_come_in_draw_order(num_threads, dtype, threads):
    threads(num_threads)
    check_heavy_edge_slots(heavy_stars(3000, 40, 100.0, dtype), 3000, 40, 100.0, 5)


def test_weighted_draws_by_rejection_come_in_draw_order(monkeypatch):
    """Degree 64 with the heavy leaf at 4x: mean / largest just above 1/4, so rejection."""
    rows = rows_drawn_by_rejection(monkeypatch)
    check_heavy_edge_slots(heavy_stars(3000, 64, 4.0), 3000, 64, 4.0, 5)
    assert sum(rows) == 3000


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_weighted_samples_are_the_same_on_every_key_selection(dtype, threads):
    """The keys are the same draws on every route, so the same seed gives the same batch:
    same edges, in the same order, the same node numbering (two hops)."""
    data = random_graph(num_nodes=300, num_edges=9000)
    data.weight = torch.rand(9000, generator=torch.Generator().manual_seed(3)).to(dtype) ** 3
    outs = []
    for num_threads in (1, weighted._PARTITION_MAX_THREADS):
        threads(num_threads)
        outs.append(NeighborSampler(data, [6, 4], weight_attr="weight", seed=2).sample(
            torch.arange(0, 300, 5)))
    for name in ("node", "row", "col", "edge"):
        assert torch.equal(getattr(outs[0], name), getattr(outs[1], name)), name


@BOTH_SELECTIONS
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_k_smallest_columns_come_smallest_first(dtype, partition_max_threads, monkeypatch):
    """Each row's ``k`` smallest entries, smallest first, equal ones by column (an int64
    entry, a float64 key, loses only the low bits its columns take)."""
    monkeypatch.setattr(weighted, "_PARTITION_MAX_THREADS", partition_max_threads)
    info = torch.iinfo(dtype)
    generator = torch.Generator().manual_seed(1)
    keys = torch.randint(info.min, info.max, (400, 40), dtype=dtype, generator=generator)
    keys[:100] = torch.randint(-3, 3, (100, 40), dtype=dtype, generator=generator) << 8
    columns = torch.empty(400, 25, dtype=torch.long)
    weighted._k_smallest_columns(keys, 25, out=columns)
    expected = keys.sort(dim=1, stable=True).indices[:, :25]
    if dtype == torch.int64:  # 40 columns take 6 bits: only keys that differ above them
        expected = (keys >> 6).sort(dim=1, stable=True).indices[:, :25]
    assert torch.equal(columns, expected)


def scaled(data, scale):
    data.weight = data.weight.double() * scale
    return data


@BOTH_SELECTIONS
@pytest.mark.parametrize("scale", [1e-60, 1e300])
def test_float64_weights_beyond_float32_are_drawn_exactly(scale, partition_max_threads,
                                                          monkeypatch):
    """Weights that float32 makes 0 or infinite: keys in float64, successive draws exact."""
    monkeypatch.setattr(weighted, "_PARTITION_MAX_THREADS", partition_max_threads)
    check_successive_draws_for_mixed_degrees(lambda data: scaled(data, scale),
                                             degrees=range(3, 7), per_degree=2000)


@pytest.mark.parametrize("scale", [1e-60, 1e300])
def test_float64_weights_beyond_float32_are_drawn_exactly_by_rejection(scale, monkeypatch):
    monkeypatch.setattr(weighted, "_REJECTION_MIN_DEGREE", 0)  # fanout 2: degree 16 and up
    rows = rows_drawn_by_rejection(monkeypatch)
    check_successive_draws_for_mixed_degrees(lambda data: scaled(data, scale), degrees=(6, 16),
                                             weights=torch.linspace(1, 3, 16), per_degree=4000)
    assert sum(rows) == 4000, "the nodes of degree 16 must draw by rejection"


@pytest.mark.parametrize("scale", [1e-60, 1e300])
def test_float64_weights_beyond_float32_are_drawn_exactly_with_replacement(scale):
    data, c = weighted_star(4000)
    out = NeighborSampler(scaled(data, scale), [1], weight_attr="weight", replace=True,
                          seed=0).sample(torch.arange(c))
    counts = torch.bincount(out.node[out.row] - c, minlength=len(WEIGHTS)).double()
    assert counts[4] == 0, "a weight-0 edge was drawn"
    expected = WEIGHTS[:4].double() / WEIGHTS.sum() * c
    assert chisquare(counts[:4].numpy(), expected.numpy()).pvalue > 1e-3


@pytest.mark.parametrize("bad", [float("inf"), float("nan"), -1e-300])
def test_float64_weights_must_be_finite_and_not_negative(bad):
    data, _ = weighted_star(2)
    data.weight = data.weight.double()
    data.weight[3] = bad
    with pytest.raises(ValueError, match="finite and >= 0"):
        NeighborSampler(data, [1], weight_attr="weight")


def test_float64_weights_whose_sum_overflows_are_refused_for_draws_with_replacement():
    data, _ = weighted_star(2)
    data.weight = torch.full_like(data.weight, 1e308, dtype=torch.float64)
    NeighborSampler(data, [1], weight_attr="weight")  # keys need no sum
    with pytest.raises(ValueError, match="sum past the largest float64"):
        NeighborSampler(data, [1], weight_attr="weight", replace=True)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_weighted_draws_come_in_draw_order_on_cuda(dtype):
    check_heavy_edge_slots(heavy_stars(3000, 40, 100.0, dtype).to(CUDA), 3000, 40, 100.0, 5,
                           device=CUDA, p_min=1e-5)


@pytest.mark.gpu
def test_float64_weights_beyond_float32_are_drawn_exactly_on_cuda():
    check_successive_draws_for_mixed_degrees(lambda data: scaled(data, 1e-60).to(CUDA),
                                             degrees=range(3, 7), per_degree=2000, p_min=1e-5)
