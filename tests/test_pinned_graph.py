"""``--graph-on host``: the shared host copy pinned in place and read by GPU kernels through
CUDA views of its bytes (:mod:`pyg_mgpu.data.pinned`). Everything up to the CUDA calls runs
here, with a stand-in for the CUDA runtime; tests/test_gpu_paths.py runs the calls on a GPU."""
import contextlib
import ctypes

import numpy as np
import pytest
import torch

from pyg_mgpu.data import pinned
from pyg_mgpu.distributed_sampling import main


class FakeRuntime:
    """Records cudaHostRegister calls; answers with ``code``."""

    def __init__(self, code=0):
        self.code, self.calls = code, []

    def cudaHostRegister(self, ptr, nbytes, flags):
        self.calls.append((ptr, nbytes, flags))
        return self.code


def read_back(mapped, device=None):
    """What torch.as_tensor would see: a tensor over the interface's pointer, shape and type
    (on the CPU, where the bytes are)."""
    face = mapped.__cuda_array_interface__
    dtype = {"<f4": np.float32, "<i8": np.int64, "<i4": np.int32, "<i2": np.int16,
             "|u1": np.uint8}[face["typestr"]]
    count = int(np.prod(face["shape"])) if face["shape"] else 1
    buffer = (ctypes.c_byte * (count * np.dtype(dtype).itemsize)).from_address(face["data"][0])
    return torch.from_numpy(np.frombuffer(buffer, dtype=dtype).reshape(face["shape"]))


@pytest.fixture
def on_cpu(monkeypatch):
    """device_view's CUDA steps replaced by reading the interface back on the CPU."""
    monkeypatch.setattr(pinned.torch.cuda, "device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(pinned.torch, "as_tensor", read_back)


def test_registers_the_tensors_bytes_mapped_and_portable():
    runtime, x = FakeRuntime(), torch.randn(10, 3)
    pinned.register_host_memory(x, runtime)
    assert runtime.calls == [(x.data_ptr(), 10 * 3 * 4, 3)]
    pinned.register_host_memory(torch.empty(0), runtime)  # nothing to pin
    assert len(runtime.calls) == 1


def test_a_second_registration_is_fine_and_a_refusal_says_what_to_do():
    pinned.register_host_memory(torch.ones(4), FakeRuntime(pinned.ALREADY_REGISTERED))
    with pytest.raises(pinned.HostRegistrationError, match=r"error 2\).*ulimit -l.*--graph-on"):
        pinned.register_host_memory(torch.ones(4), FakeRuntime(2))


@pytest.mark.parametrize("host", [torch.arange(12, dtype=torch.int64).view(3, 4),
                                  torch.randn(5, 6), torch.arange(7, dtype=torch.int32),
                                  torch.randn(4, 2).to(torch.bfloat16)],
                         ids=["int64", "float32", "int32", "bfloat16"])
def test_view_has_the_tensors_bytes_shape_and_type(on_cpu, host):
    runtime = FakeRuntime()
    view = pinned.device_view(host, torch.device("cuda", 0), runtime)
    assert view.dtype == host.dtype and view.shape == host.shape
    assert torch.equal(view, host)
    assert runtime.calls[0][:2] == (host.data_ptr(), host.numel() * host.element_size())
    host.view(-1)[0] += 1  # the same bytes, not a copy
    assert torch.equal(view, host)


def test_view_refuses_what_it_cannot_map():
    with pytest.raises(ValueError, match="contiguous CPU tensor"):
        pinned.device_view(torch.randn(4, 4).t(), torch.device("cuda", 0), FakeRuntime())


def test_graph_tensors_are_views(monkeypatch):
    viewed = []
    monkeypatch.setattr(pinned, "device_view",
                        lambda t, device, runtime=None: viewed.append(t) or t)
    tensors = {"colptr": torch.arange(5), "x": torch.randn(4, 2)}
    pinned.pinned_graph_tensors(tensors, torch.device("cpu"))
    assert [id(t) for t in viewed] == [id(tensors["colptr"]), id(tensors["x"])]


@pytest.mark.parametrize("flags, message", [
    (["--graph-on", "host", "--sampler", "pyg"], "--graph-on host needs --sampler native"),
    (["--graph-on", "host", "--features-on", "mmap"], "--graph-on host pins the shared copy"),
    (["--graph-on", "host", "--dataset", "synthetic-hetero"],
     "--graph-on host is for homogeneous datasets"),
])
def test_cli_refuses_what_the_pinned_graph_cannot_do(capfd, flags, message):
    assert main(flags) == 2
    assert message in capfd.readouterr().err


def test_a_gpu_rank_with_graph_on_host_gets_the_views(monkeypatch):
    from pyg_mgpu.data.synthetic import SyntheticSpec, make_synthetic
    from pyg_mgpu.train import loaders
    graph = make_synthetic(SyntheticSpec(num_nodes=200, num_edges=1000, num_features=4,
                                         num_classes=3), 0)
    asked = {}

    def views(tensors, device):
        asked.update(device=device, names=set(tensors))
        return dict(tensors)

    monkeypatch.setattr(loaders, "pinned_graph_tensors", views)
    placed = loaders.place_graph(graph, torch.device("cuda", 0), "host")
    splits = {"train_idx", "val_idx", "test_idx"}
    assert asked["device"] == torch.device("cuda", 0)
    assert asked["names"] == set(graph.tensors()) - splits
    # The split ids and the pointers' original stay on the host, for the loader's seeds and
    # their first hop.
    assert all(getattr(placed, name) is getattr(graph, name) for name in splits)
    assert placed.host_colptr is graph.colptr
    assert set(placed.tensors()) == set(graph.tensors())
    assert torch.equal(placed.colptr, graph.colptr) and placed.num_classes == graph.num_classes
    # The CPU placement never pins anything.
    assert loaders.place_graph(graph, torch.device("cuda", 0), "cpu") is graph


def test_pinned_data_views_every_tensor_and_its_csc_and_loads_the_same_batches(monkeypatch):
    from torch_geometric.data import Data

    import pyg_mgpu
    from pyg_mgpu.data.csc import cached_csc, csc_of
    viewed = []

    def fake_view(tensor, device, runtime=None):  # a different tensor with the same values
        viewed.append(tensor)
        return tensor.clone()

    monkeypatch.setattr(pinned, "device_view", fake_view)
    gen = torch.Generator().manual_seed(0)
    data = Data(x=torch.randn(200, 5), y=torch.randint(3, (200,)),
                edge_index=torch.randint(200, (2, 1500), generator=gen),
                edge_attr=torch.randn(1500, 2))
    out = pyg_mgpu.pinned_data(data, torch.device("cuda", 0))
    host = csc_of(data)
    csc = cached_csc(out)
    assert csc is not None and csc.colptr is not host.colptr  # the views', found, not rebuilt
    assert torch.equal(csc.colptr, host.colptr) and torch.equal(csc.row, host.row)
    assert all(out[key] is not data[key] for key in ("x", "y", "edge_index", "edge_attr"))
    assert len(viewed) == 4 + len(host.tensors())

    def batches(graph):
        loader = pyg_mgpu.NeighborLoader(graph, [4, 3], input_nodes=torch.arange(60),
                                         batch_size=16, seed=3)
        return [(b.n_id, b.e_id, b.edge_index, b.x, b.edge_attr) for b in loader]

    for a, b in zip(batches(data), batches(out)):
        assert all(torch.equal(u, v) for u, v in zip(a, b))


def test_pinned_data_refuses_a_graph_on_the_gpu(monkeypatch):
    from torch_geometric.data import Data

    import pyg_mgpu
    data = Data(edge_index=torch.tensor([[0, 1], [1, 0]]), num_nodes=2)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    with pytest.raises(ValueError, match="needs the graph in host memory"):
        pyg_mgpu.pinned_data(data, torch.device("cuda", 0))


def test_pinned_data_refuses_a_heterogeneous_graph():
    from torch_geometric.data import HeteroData

    import pyg_mgpu
    data = HeteroData()
    data["a"].num_nodes = 2
    data["a", "to", "a"].edge_index = torch.tensor([[0, 1], [1, 0]])
    with pytest.raises(ValueError, match="pinned_data takes a homogeneous Data, got a HeteroData"):
        pyg_mgpu.pinned_data(data, torch.device("cuda", 0))


def test_a_copy_instead_of_a_view_is_refused(monkeypatch):
    monkeypatch.setattr(pinned.torch.cuda, "device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(pinned.torch, "as_tensor", lambda mapped, device=None:
                        read_back(mapped).clone())  # what torch does when it copies
    with pytest.raises(pinned.HostRegistrationError, match="not seen in place"):
        pinned.device_view(torch.randn(8), torch.device("cuda", 0), FakeRuntime())
