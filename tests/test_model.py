"""Trimmed layers give the seeds exactly what the untrimmed model gives them."""
import pytest
import torch

from pyg_mgpu.data.synthetic import SyntheticSpec, make_synthetic
from pyg_mgpu.sampling.sampler_choice import pyg_sampler_available
from pyg_mgpu.nn.sage import GraphSAGE
from pyg_mgpu.sampling.neighbor_sampler import NeighborSampler


def small_batch():
    """A 2-hop [5, 5] sample of 32 seeds: (graph, sampler output, features, edge_index)."""
    g = make_synthetic(SyntheticSpec(num_nodes=1000, num_edges=10_000, num_features=8), seed=0)
    out = NeighborSampler(g.loader_data(), [5, 5], seed=0).sample(torch.arange(32))
    return g, out, g.x[out.node], torch.stack([out.row, out.col])


def test_trimmed_equals_untrimmed_on_seeds():
    g = make_synthetic(SyntheticSpec(num_nodes=2000, num_edges=30_000, num_features=16), seed=0)
    for fanouts in ([10, 5], [4, 4, 4]):
        out = NeighborSampler(g.loader_data(), fanouts, seed=0).sample(torch.arange(64))
        x, edge_index = g.x[out.node], torch.stack([out.row, out.col])
        torch.manual_seed(0)
        model = GraphSAGE(16, 32, g.num_classes, len(fanouts), dropout=0.5).eval()
        full = model(x, edge_index)[:64]
        trimmed = model(x, edge_index, out.num_sampled_nodes, out.num_sampled_edges)
        assert trimmed.shape == (64, g.num_classes)
        torch.testing.assert_close(trimmed, full, rtol=1e-5, atol=1e-5)


def test_destination_pointers_by_count_and_by_search_agree():
    from pyg_mgpu.nn.sage import _dst_pointers
    _, out, _, _ = small_batch()
    num_dst = out.num_sampled_nodes[0] + out.num_sampled_nodes[1]
    by_count = _dst_pointers(out.col, num_dst, without_sync=False)
    assert torch.equal(_dst_pointers(out.col, num_dst, without_sync=True), by_count)
    assert by_count[-1] == out.col.numel()  # every edge enters one of the destinations
    assert torch.equal(by_count.diff(), torch.bincount(out.col, minlength=num_dst))


def test_trimmed_gradients_match():
    g, out, x, edge_index = small_batch()
    grads = []
    for counts in ((None, None), (out.num_sampled_nodes, out.num_sampled_edges)):
        torch.manual_seed(0)
        model = GraphSAGE(8, 16, g.num_classes, 2, dropout=0.0)
        model(x, edge_index, *counts)[:32].sum().backward()
        grads.append([p.grad for p in model.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_sparse_and_scatter_aggregation_agree():
    g, out, x, edge_index = small_batch()
    outputs = []
    for sparse in (True, False):
        torch.manual_seed(0)
        model = GraphSAGE(8, 16, g.num_classes, 2, sparse_aggregation=sparse).eval()
        outputs.append(model(x, edge_index, out.num_sampled_nodes, out.num_sampled_edges))
    torch.testing.assert_close(outputs[0], outputs[1], rtol=1e-5, atol=1e-5)


def test_relu_dropout_is_relu_then_unbiased_dropout():
    from pyg_mgpu.nn.sage import relu_dropout
    torch.manual_seed(0)
    x = torch.randn(1000, 1000)
    for p in (0.5, 0.2, 0.7):
        y = relu_dropout(x, p)
        positive = x > 0
        assert (y[~positive] == 0).all(), "ReLU: non-positive inputs give 0"
        kept = (y[positive] != 0).double().mean().item()
        assert abs(kept - (1 - p)) < 0.005
        scale = 256 / round((1 - p) * 256)
        survivors = y[y != 0]
        torch.testing.assert_close(survivors, (x * scale)[y != 0])  # kept units scaled exactly
    assert torch.equal(relu_dropout(x, 0.5, training=False), torch.relu(x))
    x.requires_grad_(True)
    y = relu_dropout(x, 0.5)
    y.sum().backward()
    # The gradient passes (scaled by 2) exactly where the unit passed both ReLU and the mask.
    assert torch.equal(x.grad, (y > 0).float() * 2.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_relu_dropout_on_the_gpus_path_is_relu_then_unbiased_dropout(dtype):
    # The GPU's form (native_dropout, exact p), taken here on CPU tensors.
    from pyg_mgpu.gpu_path import counting_gpu_path
    from pyg_mgpu.nn.sage import relu_dropout
    torch.manual_seed(0)
    x = torch.randn(1000, 1000, dtype=dtype, requires_grad=True)
    with counting_gpu_path():
        for p in (0.5, 0.3):
            y = relu_dropout(x, p)
            assert y.dtype == dtype
            positive = x > 0
            assert (y[~positive] == 0).all()
            kept = (y[positive] != 0).double().mean().item()
            assert abs(kept - (1 - p)) < 0.005
            survivors = y != 0
            torch.testing.assert_close(y[survivors], (x / (1 - p))[survivors].to(dtype))
        y = relu_dropout(x, 0.5)
    y.float().sum().backward()
    assert torch.equal(x.grad, (y > 0).to(dtype) * 2.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("p", [0.5, 0.2])
def test_dropout_masks_are_independent_across_elements(dtype, p):
    # Each element must get its own random bits: an element reusing another's bit (same word,
    # same byte, or a shifted copy) would agree with it far more often than chance.
    from pyg_mgpu.nn.sage import _keep_bytes, _keep_mask
    torch.manual_seed(0)
    like = torch.empty(999, 1001, dtype=dtype)  # odd sizes: no lag lines up with a row
    keep = (_keep_mask(like, _keep_bytes(p)) != 0).flatten().double()
    q = keep.mean().item()
    assert abs(q - (1 - p)) < 0.003
    chance = q * q + (1 - q) * (1 - q)
    n = keep.numel()
    for lag in (1, 2, 8, 15, 16, 17, 64, -(-n // 16), -(-n // 8), n // 2):
        agree = (keep[:-lag] == keep[lag:]).double().mean().item()
        assert abs(agree - chance) < 0.005, f"lag {lag}: agreement {agree:.4f}, chance {chance:.4f}"


def test_relu_dropout_in_bfloat16_keeps_its_dtype():
    from pyg_mgpu.nn.sage import relu_dropout
    x = torch.randn(300, 300, dtype=torch.bfloat16, requires_grad=True)
    y = relu_dropout(x, 0.5)
    assert y.dtype == torch.bfloat16
    assert set(y[y != 0].div(x[y != 0]).float().unique().tolist()) == {2.0}
    y.float().sum().backward()
    assert x.grad.dtype == torch.bfloat16


def test_batches_without_hop_counts_run_untrimmed():
    # PyG's sampler on torch-sparse (no pyg-lib) returns no per-hop counts: the seeds' logits
    # must still come out, from the untrimmed model, equal to the trimmed ones.
    from torch_geometric.data import Data

    from pyg_mgpu.train.loop import seed_logits
    g, out, x, edge_index = small_batch()
    model = GraphSAGE(8, 16, g.num_classes, 2).eval()
    with_counts = Data(x=x, edge_index=edge_index, batch_size=32,
                       num_sampled_nodes=out.num_sampled_nodes,
                       num_sampled_edges=out.num_sampled_edges)
    without = Data(x=x, edge_index=edge_index, batch_size=32)
    torch.testing.assert_close(seed_logits(model, without), seed_logits(model, with_counts),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not pyg_sampler_available(),
                    reason="PyG's sampler needs pyg-lib or torch-sparse (docs/benchmarks.md)")
def test_pyg_sampler_batches_train_the_model():
    from pyg_mgpu.train.loaders import make_loader
    from pyg_mgpu.train.loop import seed_logits
    g = make_synthetic(SyntheticSpec(num_nodes=1000, num_edges=10_000, num_features=8), seed=0)
    loader = make_loader(g, g.train_idx, fanout=[5, 5], sampler="pyg", seed=0, batch_size=64)
    model = GraphSAGE(8, 16, g.num_classes, 2)
    batch = next(iter(loader))
    assert seed_logits(model, batch).shape == (64, g.num_classes)


def _bipartite_edges(num_src: int, num_dst: int, num_edges: int):
    """Random edges sorted by destination; destinations from ``num_dst - 10`` on get none."""
    src = torch.randint(0, num_src, (num_edges,))
    dst = torch.randint(0, num_dst - 10, (num_edges,)).sort().values
    return src, dst


def _sage_layer_ours_and_pygs(bf16: bool):
    """``sage_layer`` and PyG's ``SAGEConv`` on the same layer and edges (ours first): their
    float32 outputs, parameter gradients and input gradients."""
    from pyg_mgpu.nn.sage import _dst_pointers, sage_layer
    from torch_geometric.nn import SAGEConv
    torch.manual_seed(0)
    conv = SAGEConv(16, 32, aggr="mean")
    src, dst = _bipartite_edges(300, 100, 2000)
    ptr = _dst_pointers(dst, 100)
    outputs, param_grads, input_grads = [], [], []
    for ours in (True, False):
        conv.zero_grad()
        x = torch.randn(300, 16, generator=torch.Generator().manual_seed(1), requires_grad=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            if ours:
                out = sage_layer(conv, x, 100, ptr, src)
            else:
                out = conv((x, x[:100]), torch.stack([src, dst]), size=(300, 100))
        out.float().square().sum().backward()
        outputs.append(out.float())
        param_grads.append([p.grad.clone() for p in conv.parameters()])
        input_grads.append(x.grad)
    return outputs, param_grads, input_grads


def test_sage_layer_equals_pyg_sageconv_with_gradients():
    outputs, param_grads, input_grads = _sage_layer_ours_and_pygs(bf16=False)
    assert outputs[0][90:].abs().sum() > 0  # destinations without edges still get lin_r(x_dst)
    torch.testing.assert_close(outputs[0], outputs[1], rtol=1e-5, atol=1e-5)
    for a, b in zip(*param_grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    # The input's gradient too: the aggregation's backward.
    torch.testing.assert_close(input_grads[0], input_grads[1], rtol=1e-4, atol=1e-4)


def test_sage_layer_equals_pyg_sageconv_under_bf16_autocast_with_gradients():
    outputs, param_grads, _ = _sage_layer_ours_and_pygs(bf16=True)
    # bf16 rounding differs (PyG rounds each product before adding): compare at bf16 precision.
    torch.testing.assert_close(outputs[0], outputs[1], rtol=2e-2, atol=2e-2)
    for a, b in zip(*param_grads):  # sums of many bf16 products: compare as whole tensors
        assert (a - b).norm() <= 0.02 * b.norm()


def test_mean_aggregation_gradient_whether_or_not_the_caller_gives_destinations_and_degrees():
    # The trimmed model hands every layer the batch's degrees, more rows than a layer has; the
    # backward then divides only the layer's own gradient rows. Both ways give PyG's mean's
    # gradient (scatter_mean's backward), and the root rows' gradient lands in the same rows.
    from torch_geometric.utils import scatter
    from pyg_mgpu.nn.sage import edge_destinations, mean_aggregate
    gen = torch.Generator().manual_seed(0)
    ptr = torch.tensor([0, 3, 3, 7, 12])
    src = torch.randint(9, (12,), generator=gen)
    dst = edge_destinations(ptr, src.numel())
    grads = []
    for given in (None, (dst, torch.tensor([3, 0, 4, 5, 2, 7]))):
        x = torch.randn(9, 5, generator=torch.Generator().manual_seed(1), requires_grad=True)
        agg, root = mean_aggregate(x, ptr, src, *(given or (None, None)), num_root=4)
        (agg + root).mul(torch.arange(20.).view(4, 5)).sum().backward()
        grads.append(x.grad)
    x = torch.randn(9, 5, generator=torch.Generator().manual_seed(1), requires_grad=True)
    expected = scatter(x[src], dst, dim=0, dim_size=4, reduce="mean") + x[:4]
    expected.mul(torch.arange(20.).view(4, 5)).sum().backward()
    torch.testing.assert_close(grads[0], x.grad)
    torch.testing.assert_close(grads[1], grads[0], rtol=0, atol=0)
    assert grads[0][4:].abs().sum() > 0 and grads[0][:4].abs().sum() > 0