"""The padded step behind ``--cuda-graph``: capacities, layouts, the copy into static
buffers, and a step whose logits and gradients are the unpadded model's. On CPU tensors the
padded step runs without capture; the capture itself is tested on CUDA (skipped without)."""
import json

import pytest
import torch
import torch.nn.functional as F
from torch_geometric.data import Data

from pyg_mgpu.distributed_sampling import main
from pyg_mgpu.nn.sage import GraphSAGE
from pyg_mgpu.sampling.neighbor_loader import NeighborLoader
from pyg_mgpu.train.graphed_step import (ALIGN, HEADROOM, PAD_LABEL, WARMUP_STEPS, GraphedStep,
                                         PaddedLayout, StaticBatch, capacity)

FANOUT = [4, 3, 2]


def graph(num_nodes: int = 610, num_edges: int = 6000, num_features: int = 0) -> Data:
    """A random graph; without ``num_features`` each node's feature is its own number."""
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(num_nodes, num_features, generator=gen) if num_features
         else torch.arange(num_nodes, dtype=torch.float).unsqueeze(1))
    return Data(x=x, edge_index=torch.randint(0, num_nodes, (2, num_edges), generator=gen),
                y=torch.randint(0, 5, (num_nodes,), generator=gen), num_nodes=num_nodes)


def batches(data: Data, batch_size: int = 40, device="cpu") -> list:
    return list(NeighborLoader(data.to(device), FANOUT, batch_size=batch_size, shuffle=True,
                               seed=0))


def counts(batch) -> tuple[list, list]:
    return [int(n) for n in batch.num_sampled_nodes], [int(e) for e in batch.num_sampled_edges]


def test_capacity_is_the_count_with_headroom_rounded_up_to_the_alignment():
    for n in range(1, 5000):
        size = capacity(n)
        assert size % ALIGN == 0 and n * HEADROOM <= size < n * HEADROOM + ALIGN
    assert capacity(1024) == 1056


def test_a_layout_keeps_a_pad_row_in_every_block_but_the_last():
    layout = PaddedLayout.holding([40, 150, 400], [160, 450])
    assert layout.holds([40, 150, 400], [160, 450])
    assert not layout.holds([layout.nodes[0], 150, 400], [160, 450])  # no pad row left
    assert layout.holds([40, 150, layout.nodes[2]], [160, layout.edges[1]])  # none needed
    assert not layout.holds([40, 150, 400], [layout.edges[0] + 1, 450])
    assert not layout.holds([40, 150], [160])  # another number of hops


def test_a_layout_grows_only_the_blocks_a_batch_overflows():
    layout = PaddedLayout.holding([40, 150, 400], [160, 450])
    bigger = layout.nodes[2] + 1
    grown = PaddedLayout.holding([40, 150, bigger], [160, 450], within=layout)
    assert grown.nodes[:2] == layout.nodes[:2] and grown.edges == layout.edges
    assert grown.nodes[2] == capacity(bigger)
    assert PaddedLayout.holding([1, 1, 1], [1, 1], within=grown) == grown  # never shrinks


def padded_positions(sizes: list, layout_sizes: tuple) -> torch.Tensor:
    """Where each real row (or edge) of a batch lies in the padded layout."""
    starts = torch.tensor([0, *layout_sizes]).cumsum(0)
    return torch.cat([torch.arange(n) + starts[h] for h, n in enumerate(sizes)])


def test_a_loaded_batch_keeps_every_node_and_edge_and_pads_apart():
    data = graph()  # features: node numbers, so the rows say which node they hold
    loaded = batches(data)
    layout = PaddedLayout.holding(*counts(loaded[0]))
    for batch in loaded:
        layout = PaddedLayout.holding(*counts(batch), within=layout)
    static = StaticBatch(layout, 1, feature_dtype=torch.float, index_dtype=torch.long,
                         device=torch.device("cpu"))
    # the biggest batch first, then the smaller last one over its leftovers
    by_size = sorted(loaded, key=lambda b: -b.num_nodes)
    for batch in [by_size[0], loaded[-1]]:
        nodes, edges = counts(batch)
        static.load(batch.x, batch.edge_index, batch.y, nodes, edges)
        rows = padded_positions(nodes, layout.nodes)
        assert torch.equal(static.x[rows], batch.x)
        slots = padded_positions(edges, layout.edges)
        assert torch.equal(static.edge_index[:, slots], rows[batch.edge_index])
        pad = torch.ones(layout.num_edges, dtype=torch.bool)
        pad[slots] = False
        real_row = torch.zeros(layout.num_nodes, dtype=torch.bool)
        real_row[rows] = True
        assert not real_row[static.edge_index[1, pad]].any(), "a pad edge feeds a real node"
        assert (static.edge_index[0, pad] == 0).all()
        assert (static.edge_index[1].diff() >= 0).all(), "edges sorted by destination"
        assert torch.equal(static.y[:nodes[0]], batch.y[:nodes[0]])
        assert (static.y[nodes[0]:] == PAD_LABEL).all()


def unpadded_step(model: GraphSAGE, batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    logits = model(batch.x, batch.edge_index, batch.num_sampled_nodes,
                   batch.num_sampled_edges)[:batch.batch_size]
    loss = F.cross_entropy(logits, batch.y[:batch.batch_size])
    loss.backward()
    return logits, loss, torch.cat([p.grad.flatten() for p in model.parameters()])


def growing_batches(device, index_dtype=torch.long) -> list:
    """Batches of 20 seeds, then of 40: the layout must grow; the last batch of 40 is smaller.
    Drawn on the CPU, so that every device trains on the same ones."""
    data = graph(num_features=8)
    data.edge_index = data.edge_index.to(index_dtype)
    return [b.to(device) for b in batches(data, 20)[:WARMUP_STEPS + 3] + batches(data, 40)]


def check_same_steps(device, index_dtype=torch.long) -> tuple[GraphedStep, int]:
    loaded = growing_batches(device, index_dtype)
    torch.manual_seed(0)
    model = GraphSAGE(8, 16, 5, len(FANOUT), dropout=0.0).to(device)
    reference = GraphSAGE(8, 16, 5, len(FANOUT), dropout=0.0).to(device)
    reference.load_state_dict(model.state_dict())
    step = GraphedStep(model)
    for batch in loaded:
        logits, loss = step.forward_backward(batch)
        expected_logits, expected_loss, expected_grad = unpadded_step(reference, batch)
        torch.testing.assert_close(logits, expected_logits, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(loss, expected_loss.detach(), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(step.flat_grad, expected_grad, rtol=1e-4, atol=1e-6)
        assert all(p.grad.data_ptr() >= step.flat_grad.data_ptr() for p in model.parameters())
    assert step.stats["layouts"] >= 2
    return step, len(loaded)


@pytest.mark.parametrize("index_dtype", [torch.long, torch.int32])
def test_the_padded_step_gives_the_unpadded_logits_loss_and_gradients(index_dtype):
    step, steps = check_same_steps("cpu", index_dtype)
    assert step.static.edge_index.dtype == index_dtype
    summary = step.summary()
    assert (summary["captures"], summary["replays"], summary["eager_steps"]) == (0, 0, steps)
    assert 1.0 <= summary["padded_rows_per_real_row"] < 1.5


def test_pad_rows_change_no_output_or_gradient_with_dropout():
    data = graph(num_features=8)
    batch = batches(data)[0]
    step = GraphedStep(GraphSAGE(8, 16, 5, len(FANOUT), dropout=0.5))
    results = []
    for garbage in (False, True):
        if garbage:  # pad rows hold whatever earlier batches left there
            nodes, _ = counts(batch)
            real = torch.zeros(step.static.layout.num_nodes, dtype=torch.bool)
            real[padded_positions(nodes, step.static.layout.nodes)] = True
            step.static.x[~real] = torch.randn(int((~real).sum()), 8) * 1e6
        with torch.random.fork_rng():
            torch.manual_seed(1)  # the same dropout masks
            logits, loss = step.forward_backward(batch)
        results.append((logits.clone(), loss.clone(), step.flat_grad.clone()))
    for clean, dirty in zip(*results):
        assert torch.equal(clean, dirty)


def test_a_resumed_layout_pads_the_next_batch_alike():
    data = graph(num_features=8)
    loaded = batches(data)
    first = GraphedStep(GraphSAGE(8, 16, 5, len(FANOUT)))
    for batch in loaded[:4]:
        first.forward_backward(batch)
    state = first.layout_state()
    resumed = GraphedStep(GraphSAGE(8, 16, 5, len(FANOUT)))
    resumed.resume_layout(json.loads(json.dumps(state)))  # as a checkpoint keeps it
    resumed.forward_backward(loaded[-1])  # a small batch: a fresh step would pad it less
    assert resumed.static.layout == first.static.layout
    fresh = GraphedStep(GraphSAGE(8, 16, 5, len(FANOUT)))
    fresh.forward_backward(loaded[-1])
    assert fresh.static.layout != first.static.layout


def test_a_failed_capture_names_the_op_that_failed_and_pauses_loading(monkeypatch):
    # On CUDA, an op that fails inside a capture is the cause; ending the capture fails after.
    import contextlib

    import pyg_mgpu.train.graphed_step as graphed_step

    @contextlib.contextmanager
    def failing_capture(graph, **kwargs):
        try:
            yield
        except RuntimeError:
            raise RuntimeError("operation failed due to a previous error during capture")

    def op_not_capturable(self):
        raise RuntimeError("operation not permitted when stream is capturing\nCUDA details")
    monkeypatch.setattr(torch.cuda, "CUDAGraph", lambda: None)
    monkeypatch.setattr(torch.cuda, "graph", failing_capture)
    monkeypatch.setattr(graphed_step.GraphedStep, "_side_stream", lambda self: None)
    batch = growing_batches("cpu")[0]
    step = GraphedStep(GraphSAGE(8, 16, 5, len(FANOUT)), capture=True)
    for _ in range(WARMUP_STEPS):
        step.forward_backward(batch)
    monkeypatch.setattr(graphed_step.GraphedStep, "_forward_backward", op_not_capturable)
    paused = []

    @contextlib.contextmanager
    def pause_loading():
        paused.append(True)
        yield
    with pytest.raises(RuntimeError) as failed:
        step.forward_backward(batch, pause_loading=pause_loading)
    assert str(failed.value) == (
        "--cuda-graph: capturing the training step as a CUDA graph failed (operation not "
        "permitted when stream is capturing; then operation failed due to a previous error "
        "during capture); run without --cuda-graph.")
    assert paused == [True]


@pytest.mark.parametrize("argv,missing", [
    (["--model", "gcn"], "--model sage"),
    (["--recipe", "pyg"], "--recipe pyg_mgpu"),
    (["--dataset", "synthetic-hetero"], "a homogeneous dataset"),
    (["--compile"], "--compile"),
])
def test_cuda_graph_refuses_what_it_cannot_replay(argv, missing, tmp_path, capsys):
    assert main(argv + ["--cuda-graph", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --cuda-graph") and missing in err


TINY = ["--num-nodes", "1500", "--num-edges", "15000", "--num-features", "8",
        "--num-classes", "4", "--hidden", "16", "--batch-size", "96", "--epochs", "2",
        "--dropout", "0"]


def without_and_with_cuda_graph(tmp_path, argv: list) -> tuple[dict, dict]:
    """The metrics of a CLI run of ``argv``, and of the same with ``--cuda-graph``."""
    runs = []
    for name, extra in (("plain", []), ("graphed", ["--cuda-graph"])):
        assert main(argv + [*extra, "--out", str(tmp_path / name)]) == 0
        runs.append(json.loads((tmp_path / name / "metrics.json").read_text()))
    return runs[0], runs[1]


@pytest.mark.slow
def test_two_ranks_train_the_same_with_the_padded_step(tmp_path):
    plain, padded = without_and_with_cuda_graph(tmp_path,
                                                TINY + ["--devices", "cpu", "--nprocs", "2"])
    for a, b in zip(plain["epochs"], padded["epochs"]):
        assert b["train_loss"] == pytest.approx(a["train_loss"], rel=1e-5)
        assert b["train_acc"] == a["train_acc"]
    assert padded["test_acc"] == plain["test_acc"]
    summary = padded["cuda_graph"]
    assert summary["captures"] == 0 and summary["eager_steps"] == 2 * plain["steps_per_epoch"]
    began = summary["layout_began_at_steps"]
    assert began[0] == 0 and len(began) == summary["layouts"] and began == sorted(began)


@pytest.mark.gpu
def test_the_replayed_step_gives_the_unpadded_logits_loss_and_gradients():
    step, steps = check_same_steps(torch.device("cuda", 0))
    # Every layout that outlived its warm-up steps was captured, and replayed from then on.
    began = step.summary()["layout_began_at_steps"] + [steps]
    lasted = [end - start for start, end in zip(began, began[1:])]
    assert step.stats["captures"] == sum(n > WARMUP_STEPS for n in lasted) >= 1
    assert step.stats["replays"] == sum(max(n - WARMUP_STEPS, 0) for n in lasted)


@pytest.mark.gpu
def test_replays_draw_the_eager_steps_dropout_masks():
    # A replay advances CUDA's random offsets as an eager step does: the same masks, in turn.
    device = torch.device("cuda", 0)
    loaded = growing_batches(device)
    runs = []
    for capture in (False, True):
        torch.manual_seed(0)
        step = GraphedStep(GraphSAGE(8, 16, 5, len(FANOUT), dropout=0.5).to(device),
                           capture=capture)
        runs.append([tuple(t.clone() for t in (*step.forward_backward(b), step.flat_grad))
                     for b in loaded])
        assert step.stats["replays"] > 0 if capture else step.stats["captures"] == 0
    for eager, replayed in zip(*runs):
        for a, b in zip(eager, replayed):
            torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6)


@pytest.mark.gpu
def test_cuda_graph_trains_on_one_gpu_as_eagerly(tmp_path):
    # 4 epochs of 8 steps: a tiny graph's layout may still grow late in the second.
    eager, graphed = without_and_with_cuda_graph(tmp_path,
                                                 TINY + ["--epochs", "4", "--devices", "cuda:0"])
    summary = graphed["cuda_graph"]
    assert summary["replays"] > 0 and summary["layout_began_at_steps"][0] == 0
    graph_losses = [e["train_loss"] for e in graphed["epochs"]]
    assert graph_losses[1] < graph_losses[0]  # the replays train
    # The same batches; padded products round otherwise, so the runs drift apart slowly.
    for a, b in zip(eager["epochs"], graphed["epochs"]):
        assert b["train_loss"] == pytest.approx(a["train_loss"], rel=2e-2)
