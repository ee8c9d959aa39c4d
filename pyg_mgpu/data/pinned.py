"""One pinned host copy of the graph that every GPU rank samples and gathers from, zero-copy.

DGL's multi-GPU recipe pins its graph and features once in host memory and lets every GPU's
kernels read them there (unified virtual addressing). Here the same, in plain torch: the ranks'
shared segment is registered with the CUDA runtime that torch ships (``cudaHostRegister``,
mapped and portable), in place, and each rank gets CUDA tensors over those bytes through
``__cuda_array_interface__``. torch's GPU kernels (the sampler's, the feature gather's) then
read host memory over PCIe: no copy of the graph on any GPU, and one pinned copy on the host
however many ranks map it (page locking counts the pages, it does not copy them).

With unified addressing (every 64-bit Linux CUDA platform) a mapped registration's device
address is its host address, which is what the views are made from.
"""
from __future__ import annotations

import copy
from typing import Any

import torch
from torch import Tensor
from torch_geometric.data import Data

from pyg_mgpu.data.csc import CSC, attach_csc, csc_of

REGISTER_PORTABLE = 1  # cudaHostRegisterPortable: every CUDA context sees it pinned
REGISTER_MAPPED = 2  # cudaHostRegisterMapped: mapped into the device address space
ALREADY_REGISTERED = 712  # cudaErrorHostMemoryAlreadyRegistered: a view made earlier

# __cuda_array_interface__ type strings; types it has none for travel as an integer type of
# their size and are viewed back.
_TYPESTR = {torch.float32: "<f4", torch.float64: "<f8", torch.float16: "<f2",
            torch.int64: "<i8", torch.int32: "<i4", torch.int16: "<i2", torch.int8: "|i1",
            torch.uint8: "|u1", torch.bool: "|b1"}
_CARRIER = {2: torch.int16, 4: torch.int32, 8: torch.int64}


class HostRegistrationError(RuntimeError):
    """The CUDA runtime refused to pin the graph's host memory."""


class _Mapped:
    """A contiguous host tensor's bytes, seen as device memory (``__cuda_array_interface__``);
    holds the tensor, so the bytes outlive every view made of them."""

    def __init__(self, tensor: Tensor):
        self.tensor = tensor

    @property
    def __cuda_array_interface__(self) -> dict:
        return {"shape": tuple(self.tensor.shape), "typestr": _TYPESTR[self.tensor.dtype],
                "data": (self.tensor.data_ptr(), False), "version": 3, "strides": None}


def register_host_memory(tensor: Tensor, runtime: Any = None) -> None:
    """Pins ``tensor``'s bytes in place (``cudaHostRegister``, mapped and portable).

    Args:
        runtime: The CUDA runtime bindings (default: torch's, ``torch.cuda.cudart()``).

    Raises:
        HostRegistrationError: with the CUDA error code and what to do.
    """
    nbytes = tensor.numel() * tensor.element_size()
    if nbytes == 0:
        return
    runtime = runtime or torch.cuda.cudart()
    error = runtime.cudaHostRegister(tensor.data_ptr(), nbytes,
                                     REGISTER_PORTABLE | REGISTER_MAPPED)
    code = int(getattr(error, "value", error))
    if code not in (0, ALREADY_REGISTERED):
        raise HostRegistrationError(
            f"the CUDA runtime refused to pin {nbytes / 2**30:.2f} GiB of the graph's host "
            f"memory (cudaHostRegister error {code}); locked memory may be limited (ulimit "
            "-l, a container's memlock limit). Use --graph-on cpu or gpu instead.")


def device_view(tensor: Tensor, device: torch.device, runtime: Any = None) -> Tensor:
    """A CUDA tensor on ``device`` over ``tensor``'s host bytes, which are pinned for it: GPU
    kernels read them in place. ``tensor`` must be a contiguous CPU tensor."""
    if tensor.device.type != "cpu" or not tensor.is_contiguous():
        raise ValueError(f"device_view needs a contiguous CPU tensor, got one on "
                         f"{tensor.device} (contiguous: {tensor.is_contiguous()}).")
    carried = (tensor if tensor.dtype in _TYPESTR
               else tensor.view(_CARRIER[tensor.element_size()]))
    with torch.cuda.device(device):  # registered, and then seen, from this rank's GPU
        register_host_memory(carried, runtime)
        view = torch.as_tensor(_Mapped(carried), device=device)
    if carried.numel() and view.data_ptr() != carried.data_ptr():
        # torch placed the pointer on another device and copied it here: not a view.
        raise HostRegistrationError(
            f"the pinned host memory was not seen in place from {device} (torch made a copy); "
            "this platform may lack unified addressing. Use --graph-on cpu or gpu instead.")
    return view if view.dtype == tensor.dtype else view.view(tensor.dtype)


def pinned_graph_tensors(tensors: dict[str, Tensor], device: torch.device,
                         runtime: Any = None) -> dict[str, Tensor]:
    """The graph's tensors for a GPU rank that reads the shared host copy: a device view of
    each."""
    return {name: device_view(t, device, runtime) for name, t in tensors.items()}


def pinned_data(data: Data, device: torch.device, runtime: Any = None) -> Data:
    """``data`` for a GPU rank that samples and gathers from its one host copy in place.

    The graph's CSC is built on the host (once, cached with ``data``; :func:`pyg_mgpu.share_data`
    and :func:`pyg_mgpu.spawn` build it in the parent), and every tensor of ``data`` and of
    its CSC is pinned where it lies and replaced by a CUDA view on ``device``: a
    :class:`pyg_mgpu.NeighborLoader` over the result samples with ``device``'s kernels and
    gathers feature rows from host memory, with no copy of the graph on the GPU. In ranks
    that map shared memory, every rank reads the same pinned pages.

    Example:
        In each rank of :func:`pyg_mgpu.spawn`::

            data = pyg_mgpu.pinned_data(data, ctx.device)
            loader = pyg_mgpu.NeighborLoader(data, [15, 10, 5], input_nodes=train_idx,
                                             batch_size=1024, distributed=True)
    """
    if hasattr(data, "edge_types"):  # a HeteroData
        raise ValueError(f"pinned_data takes a homogeneous Data, got a {type(data).__name__}; "
                         "move a heterogeneous graph to the GPU whole, or sample it from "
                         "host memory.")
    csc = csc_of(data)
    if any(t.is_cuda for t in csc.tensors()):
        raise ValueError("pinned_data needs the graph in host memory; its edge_index is on "
                         f"{csc.colptr.device} (use data.cpu(), or leave the graph on the GPU "
                         "and use it as it is).")
    views: dict = {}

    def view(tensor: Tensor) -> Tensor:
        if id(tensor) not in views:
            views[id(tensor)] = device_view(tensor.contiguous(), device, runtime)
        return views[id(tensor)]

    out = copy.copy(data)
    for store in out.stores:
        for key, value in list(store.items()):
            if isinstance(value, Tensor):
                store[key] = view(value)
    edge_index = out.get("edge_index")
    return attach_csc(out, CSC(view(csc.colptr), view(csc.row),
                               None if csc.perm is None else view(csc.perm),
                               edge_index=edge_index, host_colptr=csc.colptr))
