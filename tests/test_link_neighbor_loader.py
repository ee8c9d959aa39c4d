"""``pyg_mgpu.LinkNeighborLoader``: PyG's link loader on pyg_mgpu's sampler (the same batches as
PyG's class handed that sampler), and with ``distributed=True`` equal steps on every rank, every
seed edge once per epoch over the ranks, and each rank's own negatives."""
import re

import pytest
import torch
from torch_geometric.data import Data, HeteroData
from torch_geometric.loader import LinkNeighborLoader as PyGLinkNeighborLoader

import pyg_mgpu


def graph(num_nodes=80, num_edges=400, seed=0):
    gen = torch.Generator().manual_seed(seed)
    edge_index = torch.randint(num_nodes, (2, num_edges), generator=gen)
    return Data(x=torch.arange(num_nodes).float().view(-1, 1), edge_index=edge_index,
                edge_attr=torch.arange(num_edges))


def positives_are_edges(data, batch):
    label_index = batch.n_id[batch.edge_label_index]
    positive = batch.edge_label == 1
    edges = set(map(tuple, data.edge_index.t().tolist()))
    assert all(tuple(pair) in edges for pair in label_index[:, positive].t().tolist())


@pytest.mark.parametrize("options", [{"neg_sampling_ratio": 1.0},
                                     {"neg_sampling": dict(mode="triplet", amount=2)},
                                     {"disjoint": True, "neg_sampling_ratio": 0.5}])
def test_the_batches_of_pygs_loader_on_the_same_sampler(options):
    data = graph()
    ours = pyg_mgpu.LinkNeighborLoader(data, [3, 2], batch_size=32, shuffle=True, seed=4,
                                       **options)
    theirs = PyGLinkNeighborLoader(
        data, [3, 2], batch_size=32, shuffle=True,
        neighbor_sampler=pyg_mgpu.NeighborSampler(data, [3, 2], seed=4 * 1009,
                                                  disjoint=options.get("disjoint", False)),
        **options)
    torch.manual_seed(0)
    a = list(ours)
    torch.manual_seed(0)
    b = list(theirs)
    assert len(a) == len(b) == 13
    for x, y in zip(a, b):
        assert set(x.keys()) == set(y.keys())
        for key in x.keys():
            if isinstance(x[key], torch.Tensor):
                assert torch.equal(x[key], y[key]) and x[key].dtype == y[key].dtype, key
    if "neg_sampling_ratio" in options:
        for batch in a:
            positives_are_edges(data, batch)


def epoch(loaders, epoch_number):
    """Each rank's batches of one epoch."""
    out = []
    for loader in loaders:
        loader.set_epoch(epoch_number)
        out.append(list(loader))
    return out


@pytest.mark.parametrize("num_edges, world_size, batch_size", [(400, 3, 32), (10, 4, 8),
                                                               (97, 2, 5)])
def test_distributed_epochs_use_every_seed_edge_once_in_equal_steps(num_edges, world_size,
                                                                    batch_size):
    data = graph(num_edges=num_edges)
    loaders = [pyg_mgpu.LinkNeighborLoader(data, [2], batch_size=batch_size, shuffle=True,
                                           neg_sampling_ratio=1.0, distributed=True, rank=r,
                                           world_size=world_size, seed=7)
               for r in range(world_size)]
    orders = []
    for e in range(2):
        batches = epoch(loaders, e)
        assert len({len(rank) for rank in batches}) == 1  # equal steps on every rank
        assert all(len(rank) == len(loader) for rank, loader in zip(batches, loaders))
        seen = torch.cat([b.input_id for rank in batches for b in rank])
        assert sorted(seen.tolist()) == list(range(num_edges))  # each seed edge once
        orders.append(seen)
        for rank in batches:
            for batch in rank:
                positives_are_edges(data, batch)
    assert not torch.equal(orders[0], orders[1])  # set_epoch reshuffles


@pytest.mark.parametrize("options", [{"neg_sampling_ratio": 1.0},
                                     {"neg_sampling": dict(mode="triplet", amount=2)}])
def test_an_epoch_continued_from_a_step_draws_what_the_whole_epoch_drew(options):
    # As a checkpoint of a link predictor resumes: the epoch and step, and the sampler's
    # generator as it was before that step.
    data = graph()

    def loader():
        return pyg_mgpu.LinkNeighborLoader(data, [3, 2], batch_size=16, shuffle=True,
                                           distributed=True, rank=1, world_size=2, seed=3,
                                           **options)
    whole = loader()
    whole.set_epoch(2)
    batches, states = [], []
    for batch in whole:
        batches.append(batch)
        states.append(whole.sampler_state())  # the state before the next batch
    resumed = loader()
    resumed.set_epoch(2, start_step=5)
    resumed.link_sampler.generator.set_state(states[4])
    assert len(resumed) == len(batches) - 5 == 8
    rest = list(resumed)
    assert len(rest) == 8
    for x, y in zip(rest, batches[5:]):
        for key in x.keys():
            if isinstance(x[key], torch.Tensor):
                assert torch.equal(x[key], y[key]), key
    with pytest.raises(ValueError, match="start_step needs distributed=True"):
        pyg_mgpu.LinkNeighborLoader(data, [2], batch_size=16).set_epoch(0, start_step=1)


def test_each_rank_draws_its_own_negatives_and_repeats_them():
    data = graph()

    def negatives(rank, seed=7):
        torch.manual_seed(0)  # ranks seed their models alike: the global state is shared
        loader = pyg_mgpu.LinkNeighborLoader(data, [2], batch_size=400, neg_sampling_ratio=1.0,
                                             distributed=True, rank=rank, world_size=2,
                                             seed=seed)
        loader.set_epoch(0)
        batch = next(iter(loader))
        return batch.n_id[batch.edge_label_index[:, batch.edge_label == 0]]

    zero, one = negatives(0), negatives(1)
    assert not torch.equal(zero, one)
    assert torch.equal(zero, negatives(0))  # the same seed repeats them
    assert not torch.equal(zero, negatives(0, seed=8))


@pytest.mark.parametrize("mode", ["binary", "triplet"])
def test_each_worker_draws_its_own_negatives_in_every_epoch(mode):
    data = graph()
    loader = pyg_mgpu.LinkNeighborLoader(data, [2], batch_size=100,
                                         neg_sampling=dict(mode=mode, amount=2), shuffle=True,
                                         distributed=True, rank=0, world_size=1, num_workers=2)

    def first_negatives(epoch_):
        loader.set_epoch(epoch_)
        # Batches 0 and 1 are each worker's first: drawn before a worker had drawn anything.
        return [(b.n_id[b.dst_neg_index] if mode == "triplet" else
                 b.n_id[b.edge_label_index[:, b.edge_label == 0]]).sort().values
                for b, _ in zip(loader, range(2))]

    (a0, a1), (b0, _) = first_negatives(0), first_negatives(1)
    assert not torch.equal(a0, a1), "two workers drew the same negatives"
    assert not torch.equal(a0, b0), "an epoch repeated the one before's negatives"


def test_ranks_seeded_alike_draw_their_own_negatives_in_workers():
    data = graph()

    def first_negatives(rank, seed=7):
        torch.manual_seed(0)  # as every rank does, for equal initial weights
        loader = pyg_mgpu.LinkNeighborLoader(data, [2], batch_size=100, neg_sampling_ratio=1.0,
                                             distributed=True, rank=rank, world_size=2,
                                             seed=seed, num_workers=1)
        loader.set_epoch(0)
        batch = next(iter(loader))
        return batch.n_id[batch.edge_label_index[:, batch.edge_label == 0]]

    zero = first_negatives(0)
    assert not torch.equal(zero, first_negatives(1)), "two ranks drew the same negatives"
    assert not torch.equal(zero, first_negatives(0, seed=8)), "seed= was not used"
    assert torch.equal(zero, first_negatives(0)), "the same seeds must repeat them"


def distributed_negatives_loader(mode):
    return pyg_mgpu.LinkNeighborLoader(graph(), [2], batch_size=100,
                                       neg_sampling=dict(mode=mode, amount=1), distributed=True,
                                       rank=0, world_size=1)


@pytest.mark.parametrize("mode", ["binary", "triplet"])
def test_rank_negatives_of_a_cpu_graph_never_seed_cuda_generators(mode, monkeypatch):
    """The negatives' seed goes to the CPU generator they draw from alone: a CPU graph beside
    a GPU model must not reseed the model's CUDA generators at every batch (as
    ``torch.manual_seed`` would: ``torch.cuda.manual_seed_all``, run lazily without CUDA)."""
    calls = []
    for name in ("manual_seed", "manual_seed_all"):
        monkeypatch.setattr(torch.cuda, name, lambda seed, name=name: calls.append(name))
    loader = distributed_negatives_loader(mode)
    loader.set_epoch(0)
    assert len(list(loader)) == 4
    assert calls == []


@pytest.mark.gpu
def test_rank_negatives_of_a_cpu_graph_leave_the_cuda_random_state_alone():
    torch.cuda.init()
    before = torch.cuda.get_rng_state()
    loader = distributed_negatives_loader("binary")
    loader.set_epoch(0)
    list(loader)
    assert torch.equal(torch.cuda.get_rng_state(), before)


def test_heterogeneous_seed_edges_are_sharded_too():
    data = HeteroData()
    data["user"].x = torch.randn(30, 4)
    data["item"].x = torch.randn(20, 4)
    gen = torch.Generator().manual_seed(1)
    buys = torch.stack([torch.randint(30, (120,), generator=gen),
                        torch.randint(20, (120,), generator=gen)])
    data["user", "buys", "item"].edge_index = buys
    data["item", "rev_buys", "user"].edge_index = buys.flip(0)
    et = ("user", "buys", "item")
    loaders = [pyg_mgpu.LinkNeighborLoader(data, [3, 2], edge_label_index=(et, buys),
                                           batch_size=16, shuffle=True, neg_sampling_ratio=1.0,
                                           distributed=True, rank=r, world_size=2, seed=3)
               for r in range(2)]
    batches = epoch(loaders, 0)
    assert len(batches[0]) == len(batches[1]) == 4
    seen = torch.cat([b[et].input_id for rank in batches for b in rank])
    assert sorted(seen.tolist()) == list(range(120))
    for batch in batches[0]:
        pairs = torch.stack([batch["user"].n_id[batch[et].edge_label_index[0]],
                             batch["item"].n_id[batch[et].edge_label_index[1]]])
        positive = pairs[:, batch[et].edge_label == 1]
        edges = set(map(tuple, buys.t().tolist()))
        assert all(tuple(p) in edges for p in positive.t().tolist())


def test_distributed_refuses_its_own_batching_overridden():
    with pytest.raises(ValueError, match="drop_last"):
        pyg_mgpu.LinkNeighborLoader(graph(), [2], batch_size=8, drop_last=True,
                                    distributed=True, rank=0, world_size=2)


def test_seed_edges_outside_the_graph_are_named_when_the_loader_is_built():
    data = graph()
    for index, says in ((torch.tensor([[0, 80], [1, 2]]), "(sources) holds node ids from 0 to 80"),
                        (torch.tensor([[0, 1], [2, -1]]), "(destinations) holds node ids from -1"),
                        (torch.tensor([[0, 1, 2]]), "has shape (1, 3)")):
        with pytest.raises(ValueError, match=re.escape(f"edge_label_index {says}")):
            pyg_mgpu.LinkNeighborLoader(data, [2], edge_label_index=index, batch_size=4)
    for name in ("edge_label", "edge_label_time"):
        with pytest.raises(ValueError, match=f"{name} has 5 entries, but there are 6 seed edges"):
            pyg_mgpu.LinkNeighborLoader(data, [2], edge_label_index=data.edge_index[:, :6],
                                        batch_size=4, **{name: torch.ones(5)})
    hetero = HeteroData()
    hetero["a"].x, hetero["b"].x = torch.arange(5), torch.arange(3)
    hetero["a", "to", "b"].edge_index = torch.tensor([[0, 1], [1, 2]])
    with pytest.raises(ValueError, match=r"of type \('a', 'to', 'b'\) \(destinations\)"):
        pyg_mgpu.LinkNeighborLoader(hetero, [2], batch_size=2, edge_label_index=(
            ("a", "to", "b"), torch.tensor([[0], [3]])))
    with pytest.raises(ValueError, match=r"edge type \('a', 'to', 'c'\), but the graph has no "
                                         r"node type 'c'; its node types are \['a', 'b'\]"):
        pyg_mgpu.LinkNeighborLoader(hetero, [2], batch_size=2, edge_label_index=(
            ("a", "to", "c"), torch.tensor([[0], [1]])))


def test_too_few_seed_edges_for_the_ranks_are_named_so():
    data = graph()
    with pytest.raises(ValueError, match=re.escape(
            "cannot give each of 4 ranks at least one of 3 seed edges; shard them over at "
            "most 3 ranks")):
        pyg_mgpu.LinkNeighborLoader(data, [2], edge_label_index=data.edge_index[:, :3],
                                    batch_size=2, distributed=True, rank=0, world_size=4)


@pytest.mark.parametrize("temporal", [False, True])
def test_disjoint_seed_links_between_two_node_types_grow_a_tree_from_each_end(temporal):
    # As pyg-lib numbers them: the source seeds (users) are trees 0..B-1 and the destination
    # seeds (items) B..2B-1, so user 1, reached from both ends of the link user 0 -> item 0,
    # is in both trees (PyG then folds the trees into links: batch % B). Temporal sampling is
    # always disjoint.
    data = HeteroData()
    data["user"].x, data["item"].x = torch.arange(2), torch.arange(1)
    data["user", "buys", "item"].edge_index = torch.tensor([[0, 1], [0, 0]])
    data["user", "knows", "user"].edge_index = torch.tensor([[1], [0]])
    options = {"disjoint": True}
    if temporal:
        data["user"].time = torch.zeros(2, dtype=torch.long)
        data["item"].time = torch.zeros(1, dtype=torch.long)
        options = {"edge_label_time": torch.tensor([1]), "time_attr": "time"}
    loader = pyg_mgpu.LinkNeighborLoader(
        data, [-1], edge_label_index=(("user", "buys", "item"), torch.tensor([[0], [0]])),
        batch_size=1, **options)
    batch = next(iter(loader))
    # user 0 (tree 0's seed), then hop 1: user 0 and user 1 into tree 1's item 0, user 1
    # into tree 0's user 0
    assert batch["user"].n_id.tolist() == [0, 0, 1, 1]
    assert batch["user"].batch.tolist() == [0, 0, 0, 0]
    assert batch["item"].n_id.tolist() == [0]
    assert batch["user", "buys", "item"].edge_index.tolist() == [[1, 2], [0, 0]]
    assert batch["user", "knows", "user"].edge_index.tolist() == [[3], [0]]
