"""CUDA paths: the public sampler/loader in every mode on CUDA tensors (the invariants of
tests/test_neighbor_loader.py), the launcher with NCCL and with ranks sharing one GPU over gloo,
and CLI runs with each GPU option. Every test here skips without CUDA.

Run on a GPU machine with ``python -m pytest -q -m gpu`` (benchmarks/gpu_suite.sh does).
"""
import json
from types import SimpleNamespace

import pytest
import torch
from scipy.stats import chisquare
from torch_geometric.data import Data
from torch_geometric.sampler import NodeSamplerInput, SamplerOutput

from pyg_mgpu.data.synthetic import SyntheticSpec, make_synthetic
from pyg_mgpu.distributed.launch import launch_local, spawn
from pyg_mgpu.distributed_sampling import main
from pyg_mgpu.nn.sage import GraphSAGE
from pyg_mgpu.sampling import tree_ids, weighted
from pyg_mgpu.sampling.bidirectional import BidirectionalNeighborSampler
from pyg_mgpu.sampling.neighbor_loader import NeighborLoader
from pyg_mgpu.sampling.neighbor_sampler import NeighborSampler
from pyg_mgpu.train.inference import layerwise_logits

import _gpu_ranks
from test_bidirectional_sampler import undirected_reach
from test_hetero_sampling import academic_graph, typed_reach
from test_hetero_sampling import timed_graph as timed_hetero_graph
from test_temporal_sampling import reference_trees, timed_graph, tree_of
from test_neighbor_loader import (WEIGHTS, centres_of_degrees,
                                  check_names_callers_edges, check_per_hop,
                                  check_successive_draws_for_mixed_degrees,
                                  check_three_of_eight_uniform, drawn_leaves, global_edges,
                                  random_graph, star, weighted_star)

pytestmark = pytest.mark.gpu

CUDA = torch.device("cuda", 0)
# Chi-square checks here use CUDA's random streams, which the CPU-tuned seeds never saw: a
# looser bound than the CPU tests' 1e-3 keeps a fixed-seed fluke from failing every run, and
# a real bias on these sample sizes still gives p far below it.
P_MIN = 1e-5
TINY = ["--num-nodes", "1500", "--num-edges", "15000", "--num-features", "8",
        "--num-classes", "4", "--hidden", "16", "--batch-size", "128"]


def on_cuda(data: Data) -> Data:
    return data.clone().to(CUDA)


def assert_on_cuda(batch):
    assert batch.edge_index.is_cuda and batch.n_id.is_cuda and batch.e_id.is_cuda
    assert batch.x.is_cuda


# --- the public loader/sampler on CUDA, mode by mode -------------------------------------------

# Not bidirectional: PyG gives a reversed edge the id of the edge it reverses, so e_id cannot
# name it (test_bidirectional_... below checks that mode).
@pytest.mark.parametrize("dtype", [torch.long, torch.int32])
@pytest.mark.parametrize("options", [{}, {"replace": True}, {"disjoint": True},
                                     {"subgraph_type": "induced"},
                                     {"weight_attr": "edge_attr"}])
def test_batches_name_the_callers_nodes_and_edges_on_cuda(dtype, options):
    data = random_graph(dtype=dtype)
    data.edge_attr = data.edge_attr.float() + 1  # positive weights for weight_attr
    cuda = on_cuda(data)
    seen = []
    for batch in NeighborLoader(cuda, [4, 3], batch_size=32, seed=0, **options):
        assert_on_cuda(batch)
        check_names_callers_edges(cuda, batch)
        # Seeds first. input_id stays on the host: PyG's loader takes it from the DataLoader.
        assert torch.equal(batch.n_id[:batch.batch_size].cpu(), batch.input_id.cpu())
        assert batch.edge_index.max() < batch.num_nodes
        assert batch.edge_index.dtype == batch.n_id.dtype == dtype
        assert batch.e_id.dtype == torch.long
        assert (batch.batch is not None) == bool(options.get("disjoint"))
        seen.append(batch.input_id.cpu())
    assert torch.equal(torch.cat(seen), torch.arange(data.num_nodes))


@pytest.mark.parametrize("options", [{}, {"weight_attr": "edge_attr"}])
def test_per_hop_counts_and_fanouts_on_cuda(options):
    data = random_graph()
    data.edge_attr = data.edge_attr.float() + 1
    for batch in NeighborLoader(on_cuda(data), [5, 3], batch_size=40, seed=1, **options):
        check_per_hop(data, batch.cpu(), [5, 3])


def test_full_neighbourhood_matches_the_cpu_on_cuda():
    data = random_graph()
    seeds = torch.tensor([3, 1, 4])
    cpu = NeighborLoader(data, [-1, -1], batch_size=10, seed=0)(seeds)
    # Seeds index the loader's input nodes, which PyG keeps on the host.
    gpu = NeighborLoader(on_cuda(data), [-1, -1], batch_size=10, seed=0)(seeds)
    assert torch.equal(gpu.e_id.cpu(), cpu.e_id) and torch.equal(gpu.n_id.cpu(), cpu.n_id)


def test_bidirectional_is_the_sampled_edges_plus_their_reverses_on_cuda():
    data = on_cuda(random_graph())
    seeds = torch.arange(30, device=CUDA)
    directional = NeighborSampler(data, [4, 3], seed=5).sample(seeds)
    both = NeighborSampler(data, [4, 3], subgraph_type="bidirectional", seed=5).sample(seeds)
    assert both.node.is_cuda and torch.equal(directional.node, both.node)

    def pairs(out):
        return set(zip(out.node[out.row].tolist(), out.node[out.col].tolist()))
    one_way = pairs(directional)
    assert pairs(both) == one_way | {(d, s) for s, d in one_way}


def test_bidirectional_sampler_is_the_undirected_neighbourhood_on_cuda():
    data = random_graph(num_nodes=60, num_edges=150)
    sampler = BidirectionalNeighborSampler(on_cuda(data), [-1, -1], seed=0)
    for seeds in ([0], [3, 17]):
        out = sampler.sample(torch.tensor(seeds, device=CUDA))
        nodes, edges = undirected_reach(data, seeds, hops=2)
        assert out.node.is_cuda and set(out.node.tolist()) == nodes
        assert sorted(out.edge.tolist()) == sorted(edges)
        ei = data.edge_index.to(CUDA)
        assert torch.equal(out.node[out.row], ei[0, out.edge])


@pytest.mark.parametrize("time_attr", ["time", "edge_time"])
def test_temporal_takes_every_eligible_neighbour_on_cuda(time_attr):
    data = timed_graph()
    sampler = NeighborSampler(on_cuda(data), [-1, -1], time_attr=time_attr, seed=0)
    seeds, times = [0, 5, 5, 17], torch.tensor([60, 10, 79, 40])
    out = sampler.sample_from_nodes(NodeSamplerInput(None, torch.tensor(seeds, device=CUDA),
                                                     time=times.to(CUDA)))
    assert out.node.is_cuda
    out = SamplerOutput(node=out.node.cpu(), row=out.row.cpu(), col=out.col.cpu(),
                        edge=out.edge.cpu(), batch=out.batch.cpu())
    perm = sampler.edge_permutation
    on_host = SimpleNamespace(edge_permutation=None if perm is None else perm.cpu())
    reference = reference_trees(data, seeds, times.tolist(), 2, time_attr == "time")
    for tree, (nodes, edges) in enumerate(reference):
        assert tree_of(out, tree, on_host) == (nodes, edges), tree


def test_hetero_sampler_is_the_typed_neighbourhood_on_cuda():
    data = academic_graph()
    sampler = NeighborSampler(data.clone().to(CUDA), [-1, -1], seed=0)
    seeds = [3, 11, 12]
    out = sampler.sample_from_nodes(NodeSamplerInput(None, torch.tensor(seeds, device=CUDA),
                                                     input_type="paper"))
    nodes, edges = typed_reach(data, "paper", seeds, 2)
    for node_type in data.node_types:
        assert out.node[node_type].is_cuda
        assert sorted(out.node[node_type].tolist()) == sorted(nodes[node_type])
    for et in data.edge_types:
        perm = sampler.edge_permutation[et]
        ids = out.edge[et] if perm is None else perm[out.edge[et]]
        assert sorted(ids.tolist()) == sorted(edges[et])


@pytest.mark.parametrize("options", [{"disjoint": True}, {"time_attr": "time"},
                                     {"time_attr": "time", "temporal_strategy": "last"},
                                     {"subgraph_type": "induced"},
                                     {"sample_direction": "backward"}])
def test_hetero_modes_give_the_cpu_batches_on_cuda(options):
    # Every neighbour (or the 'last' ones): no random draw, so the CPU's output is the answer.
    data = timed_hetero_graph()
    fanout = [2, 2] if options.get("temporal_strategy") == "last" else [-1, -1]
    seeds = torch.tensor([3, 11, 12])
    time = torch.tensor([40, 90, 70]) if "time_attr" in options else None
    outs = []
    for device in ("cpu", CUDA):
        sampler = NeighborSampler(data.clone().to(device), fanout, seed=0, **options)
        outs.append((sampler, sampler.sample_from_nodes(NodeSamplerInput(
            None, seeds.to(device), time=None if time is None else time.to(device),
            input_type="paper"))))
    (cpu_sampler, cpu), (gpu_sampler, gpu) = outs
    for t in data.node_types:
        assert gpu.node[t].is_cuda and torch.equal(gpu.node[t].cpu(), cpu.node[t])
        if cpu.batch is not None:
            assert torch.equal(gpu.batch[t].cpu(), cpu.batch[t])
    for et in data.edge_types:
        assert torch.equal(gpu.row[et].cpu(), cpu.row[et])
        assert torch.equal(gpu.col[et].cpu(), cpu.col[et])
        cpu_ids = cpu_sampler.edge_permutation[et][cpu.edge[et]]
        gpu_ids = gpu_sampler.edge_permutation[et][gpu.edge[et]]
        assert torch.equal(gpu_ids.cpu(), cpu_ids)


def test_induced_is_every_edge_among_the_sampled_nodes_on_cuda():
    data = random_graph()
    for batch in NeighborLoader(on_cuda(data), [3, 2], batch_size=50, subgraph_type="induced",
                                seed=2):
        n_id, e_id = batch.n_id.cpu(), batch.e_id.cpu()
        inside = torch.zeros(data.num_nodes, dtype=torch.bool)
        inside[n_id] = True
        expected = (inside[data.edge_index[0]] & inside[data.edge_index[1]]).nonzero().view(-1)
        assert torch.equal(e_id.sort().values, expected)


def test_disjoint_keeps_trees_apart_on_cuda():
    data = on_cuda(random_graph())
    out = NeighborSampler(data, [3, 2], disjoint=True, seed=0).sample(
        torch.tensor([7, 7, 9], device=CUDA))
    keys = out.batch * data.num_nodes + out.node
    assert keys.unique().numel() == keys.numel(), "a (seed, node) pair appears twice"
    assert out.node[:3].tolist() == [7, 7, 9] and out.batch[:3].tolist() == [0, 1, 2]
    assert torch.equal(out.batch[out.row], out.batch[out.col])


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_disjoint_numbering_equals_the_cpus_on_cuda(dtype):
    # The scatter-min of the hashing rounds, and the sort after a round too few, on CUDA.
    keys = torch.randint(0, 5000, (20000,), generator=torch.Generator().manual_seed(0))
    keys = (keys * 2**33 if dtype == torch.int64 else keys).to(dtype)
    for rounds in (0, 1, len(tree_ids.HASH_MULTIPLIERS)):
        multipliers = tree_ids.HASH_MULTIPLIERS[:rounds]
        on_gpu = tree_ids.first_positions(keys.to(CUDA), multipliers)
        assert torch.equal(on_gpu.cpu(), tree_ids.first_positions(keys, multipliers))


def test_uniform_without_replacement_on_cuda():
    edge_index, n = star(8, num_centres=3000)
    perm = torch.randperm(edge_index.size(1), generator=torch.Generator().manual_seed(0))
    data = on_cuda(Data(edge_index=edge_index[:, perm], num_nodes=n))
    check_three_of_eight_uniform(
        NeighborSampler(data, [3], seed=0).sample(torch.arange(3000, device=CUDA)), P_MIN)


def test_replace_draws_fanout_times_uniformly_on_cuda():
    edge_index, n = star(3, num_centres=2000)
    data = on_cuda(Data(edge_index=edge_index, num_nodes=n))
    out = NeighborSampler(data, [5], replace=True, seed=0).sample(torch.arange(2000, device=CUDA))
    assert out.num_sampled_edges == [2000 * 5]
    picked = (out.node[out.row] - 2000).cpu()
    assert chisquare(torch.bincount(picked, minlength=3).numpy()).pvalue > P_MIN
    per_centre = picked.view(2000, 5).sort(1).values
    assert (per_centre[:, 1:] == per_centre[:, :-1]).any(), "no repeats: not with replacement"


@pytest.mark.parametrize("replace", [False, True])
def test_weighted_single_draws_are_proportional_to_weight_on_cuda(replace):
    data, c = weighted_star(4000)
    out = NeighborSampler(on_cuda(data), [1], weight_attr="weight", replace=replace,
                          seed=0).sample(torch.arange(c, device=CUDA))
    leaf = (out.node[out.row] - c).cpu()
    counts = torch.bincount(leaf, minlength=len(WEIGHTS)).double()
    assert counts[4] == 0, "a weight-0 edge was drawn"
    expected = WEIGHTS[:4].double() / WEIGHTS.sum() * c
    assert chisquare(counts[:4].numpy(), expected.numpy()).pvalue > P_MIN


@pytest.mark.parametrize("padding_budget", [0, 10 ** 9])
def test_weighted_key_matrices_on_cuda(padding_budget, monkeypatch):
    """Weighted key matrices shared by nodes of several degrees (the GPU budget): padding is
    never drawn, pairs follow successive draws, zero weights fill short nodes."""
    monkeypatch.setattr(weighted, "_PADDING_BUDGET_GPU", padding_budget)
    check_successive_draws_for_mixed_degrees(on_cuda, p_min=P_MIN)
    degree = torch.tensor([4, 5, 6, 7]).repeat(50)
    leaf_weight = torch.tensor([1.0, 0, 0, 0, 0, 0, 0])
    picks = drawn_leaves(on_cuda(centres_of_degrees(degree, leaf_weight)), degree, 3)
    assert (picks[:, 0] == 0).all()


def test_backward_samples_out_neighbours_on_cuda():
    data = random_graph()
    out_degree = torch.bincount(data.edge_index[0], minlength=data.num_nodes)
    cuda = on_cuda(data)
    loader = NeighborLoader(cuda, [4], batch_size=20, seed=0,
                            neighbor_sampler=NeighborSampler(cuda, [4], seed=0,
                                                             sample_direction="backward"))
    for batch in loader:
        assert_on_cuda(batch)
        check_names_callers_edges(cuda, batch)
        src, _ = global_edges(batch)
        seeds = batch.n_id[:batch.batch_size].cpu()
        assert torch.equal(torch.bincount(src.cpu(), minlength=data.num_nodes)[seeds],
                           out_degree[seeds].clamp(max=4))


def test_same_seed_same_batches_on_cuda():
    cuda = on_cuda(random_graph())
    runs = [[b.e_id for b in NeighborLoader(cuda, [3, 3], batch_size=50, seed=9)]
            for _ in range(2)]
    assert all(torch.equal(a, b) for a, b in zip(*runs))


# --- the launcher on one GPU ---------------------------------------------------------------------

def test_one_nccl_rank_runs_every_collective():
    result = torch.zeros(1, 6)
    spawn(_gpu_ranks.collectives_on_the_gpu, args=(result,), devices="cuda:0", timeout_s=120)
    assert result[0].tolist() == [0, 1, 1, 1, 1, 7]


def test_two_gloo_ranks_share_one_gpu():
    result = torch.zeros(2, 6)
    spawn(_gpu_ranks.collectives_on_the_gpu, args=(result,), devices="cuda:0,0",
          backend="gloo", timeout_s=120)
    assert result.tolist() == [[0, 2, 1, 0, 3, 7], [1, 2, 1, 0, 3, 7]]


def test_a_gpu_listed_twice_needs_gloo():
    with pytest.raises(ValueError, match="backend=gloo"):
        spawn(_gpu_ranks.collectives_on_the_gpu, args=(torch.zeros(2, 6),),
              devices="cuda:0,0", timeout_s=60)


def test_layerwise_inference_over_gloo_ranks_sharing_a_gpu():
    graph = make_synthetic(SyntheticSpec(num_nodes=997, num_edges=12_000, num_features=8),
                           seed=0).share_memory_()
    torch.manual_seed(2)
    model = GraphSAGE(graph.num_features, 16, graph.num_classes, 2).eval()
    expected = layerwise_logits(model, graph, rank=0, world_size=1, batch_size=100,
                                device=torch.device("cpu"))
    result = torch.full((2, graph.num_nodes, graph.num_classes), float("nan")).share_memory_()
    launch_local(_gpu_ranks.layerwise_on_the_gpu, [CUDA, CUDA],
                 args=(graph, model.state_dict(), 2, 16, result), timeout_s=120, backend="gloo")
    for rank in range(2):
        torch.testing.assert_close(result[rank], expected, rtol=1e-4, atol=1e-4)


# --- the CLI with each GPU option ----------------------------------------------------------------

@pytest.mark.parametrize("flags", [
    ["--graph-on", "gpu"],
    ["--graph-on", "cpu", "--feature-cache-gb", "0.001"],
    ["--amp", "bf16"],
    ["--prefetch", "2"],
    ["--prefetch", "0"],
    ["--inference", "layerwise"],
    ["--eval-on", "all"],
    ["--compile"],
    ["--model", "gat", "--inference", "layerwise"],  # PyG's model over the graph's edge list
], ids=lambda f: "_".join(f).strip("-"))
def test_cli_gpu_variants(tmp_path, flags):
    assert main(TINY + ["--epochs", "2", "--devices", "cuda:0", "--out", str(tmp_path),
                        *flags]) == 0
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["device"] == "cuda" and metrics["backend"] == "nccl"
    assert 0.0 <= metrics["test_acc"] <= 1.0


def test_cli_graph_on_host_trains_as_the_gpu_copy_does(tmp_path):
    # Same sampler on the same GPU, the graph read in place from pinned host memory instead of
    # a GPU copy: the same batches, so the same losses and accuracies.
    # With the feature cache, hits come from GPU rows and misses from the host: same rows.
    metrics = {}
    for name, flags in [("gpu", ["--graph-on", "gpu"]), ("host", ["--graph-on", "host"]),
                        ("host_cache", ["--graph-on", "host", "--feature-cache-gb", "0.001"])]:
        out = tmp_path / name
        assert main(TINY + ["--epochs", "2", "--devices", "cuda:0", "--out", str(out),
                            *flags]) == 0
        metrics[name] = json.loads((out / "metrics.json").read_text())
    for name in ("host", "host_cache"):
        for key in ("train_loss", "train_acc", "val_acc"):
            assert [e[key] for e in metrics[name]["epochs"]] == \
                [e[key] for e in metrics["gpu"]["epochs"]], (name, key)


def test_cli_sample_batches_on_the_gpu_trains(tmp_path):
    # On 2 CPU ranks these flags reach test accuracy 0.72 with 1 or 4 batches per walk (chance:
    # 0.25, and 0.31 after 2 epochs at the default learning rate).
    assert main(TINY + ["--epochs", "6", "--lr", "0.03", "--devices", "cuda:0",
                        "--sample-batches", "4", "--checkpoint-every-steps", "3",
                        "--out", str(tmp_path)]) == 0
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["test_acc"] > 0.5


def _joined_pairs(edge_index: torch.Tensor) -> list:
    """Each column's two nodes, in either order."""
    return [frozenset(pair) for pair in edge_index.t().tolist()]


def with_host_pointers(data: Data) -> Data:
    """``data`` on the GPU with its CSC's pointers also on the host, as the trainer places a
    graph: the sampler plans the first hop of host seeds there."""
    from pyg_mgpu.data.csc import CSC, attach_csc, csc_of
    csc = csc_of(data)
    cuda = data.to(CUDA)
    return attach_csc(cuda, CSC(csc.colptr.to(CUDA), csc.row.to(CUDA),
                                None if csc.perm is None else csc.perm.to(CUDA),
                                edge_index=cuda.edge_index, host_colptr=csc.colptr))


@pytest.mark.parametrize("host_pointers", [False, True])
@pytest.mark.parametrize("options", [{}, {"disjoint": True}, {"subgraph_type": "bidirectional"}])
def test_walks_on_cuda_number_as_on_the_cpu(options, host_pointers):
    # Every neighbour drawn: nothing random, so the CUDA walk (new nodes counted one hop late,
    # sizes read once per hop, the first hop planned on the host or not) must give the CPU's
    # batches exactly, alone and 3 per walk.
    gen = torch.Generator().manual_seed(0)
    data = Data(edge_index=torch.randint(300, (2, 2000), generator=gen), num_nodes=300)
    seeds = [torch.randint(300, (30,), generator=gen) for _ in range(3)]
    cpu = NeighborSampler(data, [-1, -1, -1], seed=0, **options)
    cuda = NeighborSampler(with_host_pointers(data) if host_pointers else data.to(CUDA),
                           [-1, -1, -1], seed=0, **options)
    assert (cuda.graph.host_colptr[("node", "to", "node")] is not None) == host_pointers
    for a, b in zip([cpu.sample(s) for s in seeds] + cpu.sample_batches(seeds),
                    [cuda.sample(s) for s in seeds] + cuda.sample_batches(seeds)):
        for field in ("node", "row", "col"):
            assert torch.equal(getattr(a, field), getattr(b, field).cpu()), field
        if options.get("subgraph_type") == "bidirectional":
            # PyG's to_bidirectional merges parallel edges with scatter "any": on CUDA any
            # one of them names the merged edge, so each id need only join the same two nodes.
            assert _joined_pairs(data.edge_index[:, cpu.perm[b.edge.cpu()]]) == \
                _joined_pairs(torch.stack([a.node[a.row], a.node[a.col]]))
        else:
            assert torch.equal(a.edge, b.edge.cpu())
        assert a.num_sampled_nodes == b.num_sampled_nodes
        assert a.num_sampled_edges == b.num_sampled_edges


def test_loader_over_pinned_data_draws_the_gpu_copys_batches():
    import pyg_mgpu
    gen = torch.Generator().manual_seed(0)
    data = Data(x=torch.randn(400, 6), y=torch.randint(3, (400,)),
                edge_index=torch.randint(400, (2, 4000), generator=gen))
    pinned = pyg_mgpu.pinned_data(pyg_mgpu.share_data(data), CUDA)
    assert pinned.x.is_cuda and pinned.edge_index.is_cuda

    def batches(graph):
        loader = NeighborLoader(graph, [5, 3], input_nodes=torch.arange(100), batch_size=20,
                                seed=7)
        return [(b.n_id.cpu(), b.e_id.cpu(), b.x.cpu()) for b in loader]

    for a, b in zip(batches(data.to(CUDA)), batches(pinned)):
        assert all(torch.equal(u, v) for u, v in zip(a, b))


def test_device_view_reads_the_host_bytes_in_place():
    from pyg_mgpu.data.pinned import device_view
    for host in (torch.arange(1000, dtype=torch.int64), torch.randn(300, 7),
                 torch.randn(50, 4).to(torch.bfloat16)):
        host = host.share_memory_()
        view = device_view(host, CUDA)
        assert view.is_cuda and view.dtype == host.dtype and view.shape == host.shape
        assert torch.equal(view.cpu(), host)
        picked = torch.tensor([3, 0, 17], device=CUDA)
        assert torch.equal(view.index_select(0, picked).cpu(), host[picked.cpu()])
        host[0] = host[1]  # a view, not a copy: a host write shows on the device
        torch.cuda.synchronize()
        assert torch.equal(view[0].cpu(), host[1])


@pytest.mark.parametrize("cache_gb", ["0", "0.001"])
def test_cli_gathers_features_from_the_mapped_cache_on_the_gpu(tmp_path, cache_gb):
    # The graph stays in host memory as the cache's mapped files; batches gather rows from
    # them into pinned memory (every row, or the GPU cache's misses) and copy them over.
    losses = {}
    for mode in ("shm", "mmap"):
        out = tmp_path / mode
        assert main(TINY + ["--epochs", "2", "--devices", "cuda:0", "--graph-on", "cpu",
                            "--feature-cache-gb", cache_gb, "--features-on", mode,
                            "--cache-dir", str(tmp_path / "cache"), "--out", str(out)]) == 0
        losses[mode] = [e["train_loss"] for e in
                        json.loads((out / "metrics.json").read_text())["epochs"]]
    assert losses["shm"] == losses["mmap"]


def test_cli_resume_on_the_gpu(tmp_path):
    assert main(TINY + ["--epochs", "1", "--devices", "cuda:0", "--out", str(tmp_path)]) == 0
    assert main(TINY + ["--epochs", "2", "--devices", "cuda:0", "--resume", str(tmp_path)]) == 0
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert [e["epoch"] for e in metrics["epochs"]] == [1, 2]


@pytest.mark.parametrize("eval_on", ["rank0", "all"])
def test_cli_two_gloo_ranks_on_one_gpu(tmp_path, eval_on):
    assert main(TINY + ["--epochs", "2", "--devices", "cuda:0,0", "--backend", "gloo",
                        "--eval-on", eval_on, "--inference", "layerwise",
                        "--out", str(tmp_path)]) == 0
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["device"] == "cuda" and metrics["backend"] == "gloo"
    assert metrics["world_size"] == 2


def test_cli_refuses_a_shared_gpu_without_gloo(tmp_path, capsys):
    assert main(TINY + ["--devices", "cuda:0,0", "--out", str(tmp_path)]) == 2
    assert "--backend gloo" in capsys.readouterr().err
