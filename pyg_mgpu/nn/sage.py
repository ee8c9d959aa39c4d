"""GraphSAGE (PyG ``SAGEConv``, mean aggregation) that computes each layer only where needed.

A sampled batch lists nodes hop by hop: seeds, then hop-1 nodes, then hop-2 nodes, and edges hop
by hop. Layer ``i`` of ``L`` only has to produce outputs for the nodes within ``L - 1 - i`` hops
of the seeds, using the edges of the first ``L - i`` hops. Everything else (PyG's tutorial computes
every layer on every node) is wasted work: on a [25, 10] sample the input has ~40k nodes but layer
2 needs only the 1,024 seeds. Trimming makes each layer a bipartite SAGEConv over a prefix.
"""
from __future__ import annotations

import functools
import importlib
import itertools
from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch_geometric.nn import SAGEConv

from pyg_mgpu.gpu_path import iota, takes_gpu_path


def _random_bytes(count: int, device: torch.device) -> Tensor:
    """``count`` uniform random bytes: one 64-bit draw gives eight."""
    words = torch.empty(-(-count // 8), dtype=torch.int64, device=device)
    return words.random_(-2**63, 2**63 - 1).view(torch.uint8)[:count]


def _keep_bytes(p: float) -> int:
    # The keep probability rounded to a multiple of 1/256 (exact for p = 0.5).
    return round((1.0 - p) * 256)


# Integer types of the float types' sizes: the dropout mask is built in integer arithmetic.
_SAME_SIZE_INT = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def _keep_mask(like: Tensor, keep_bytes: int) -> Tensor:
    """Per element of ``like``: all bits set (kept, probability ``keep_bytes / 256``) or none,
    as the integer type of ``like``'s element size, so ``&`` with the float's bits applies it.

    No compare is made (bool kernels ran 3-10x slower than arithmetic on CPU here): with one
    random byte per element, ``byte - keep_bytes`` is negative exactly for kept units and an
    arithmetic right shift spreads its sign over the word. For p = 0.5 one random bit per element
    is enough: row ``j`` of ``[16, W]`` takes bit ``j`` of every 16-bit word to the sign position.
    """
    int_type = _SAME_SIZE_INT[like.element_size()]
    n = like.numel()
    if keep_bytes == 128:
        words = _random_bytes(2 * -(-n // 16), like.device).view(torch.int16)
        shifts = torch.arange(15, -1, -1, dtype=torch.int16, device=like.device).unsqueeze(1)
        keep = (words.unsqueeze(0) << shifts).view(-1)[:n].bitwise_right_shift_(15)
        return keep.to(int_type).view(like.shape)  # sign extension keeps all bits set
    keep = _random_bytes(n, like.device).to(int_type).sub_(keep_bytes)
    return keep.bitwise_right_shift_(8 * like.element_size() - 1).view(like.shape)


class _ReLUDropout(torch.autograd.Function):
    """``dropout(relu(x))`` with masks made from random bits, in a few cheap integer passes.

    ``torch.bernoulli_`` draws one float per element and took a fifth of a training step here;
    one 64-bit draw gives eight mask bytes instead, or 64 masks when p = 0.5. The keep
    probability is rounded to a multiple of 1/256 (exact for p = 0.5) and survivors are scaled
    by its exact inverse, so the layer stays unbiased in expectation. The mask is applied to the
    ReLU's output as an integer AND (see ``_keep_mask``). Backward needs only the output: a unit
    passed the ReLU and the mask exactly where the output is positive (ReLU's own backward
    kernel). Its time against the float-mask version: docs/benchmarks.md, "Model kernels on one
    CPU thread".
    """

    @staticmethod
    def forward(ctx, x: Tensor, keep_bytes: int) -> Tensor:
        scale = 256.0 / keep_bytes
        y = torch.relu(x)
        y.view(_SAME_SIZE_INT[x.element_size()]).bitwise_and_(_keep_mask(x, keep_bytes))
        # The scale is applied by an in-place multiply with a Python float, which rounds each
        # product once instead of rounding the scale itself to bf16 (256 / 205 would become
        # 1.25, a 0.1% bias).
        y.mul_(scale)
        ctx.scale = scale
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad: Tensor):
        (y,) = ctx.saved_tensors
        return torch.ops.aten.threshold_backward(grad, y, 0).mul_(ctx.scale), None


def relu_dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """``dropout(relu(x))``: with byte masks on the CPU, fused for its speed (see
    ``_ReLUDropout``); on the GPU's path ``native_dropout``, one kernel forward and one
    backward where the byte masks take six and one (exact ``p``; both are unbiased)."""
    keep_bytes = _keep_bytes(p)
    if not training or keep_bytes >= 256:
        return torch.relu(x)
    if keep_bytes == 0:
        return torch.relu(x) * 0.0
    if takes_gpu_path(x):
        return torch.native_dropout(torch.relu(x), p, True)[0]
    return _ReLUDropout.apply(x, keep_bytes)


class _MeanAggregate(torch.autograd.Function):
    """Neighbour means by ``embedding_bag``, forward and backward, and the layer's own rows.

    Forward: ``embedding_bag(mode="mean")`` reads each neighbour row once and writes only the
    means (fbgemm's kernels on CPU). Backward: source ``u`` receives ``grad[v] / deg(v)`` from
    each destination ``v`` it feeds, a sum bag per source over the edges regrouped by source.
    Faster than ``torch.sparse`` CSR products (``spmm(reduce="mean")``) forward and backward,
    in fp32 and bf16: docs/benchmarks.md, "Model kernels on one CPU thread".

    The second output is the first ``num_root`` rows of ``x_src`` (the destinations' own rows,
    a view): their gradient is added into the aggregation's in place, where slicing outside
    would make a zero-filled copy and a sum of the two.

    ``dst`` (each edge's destination) and ``deg`` (each destination's edge count) may come
    from the caller, which finds them once for every layer of a batch.
    """

    @staticmethod
    def forward(ctx, x_src: Tensor, ptr: Tensor, src: Tensor, dst: Optional[Tensor],
                deg: Optional[Tensor], num_root: int) -> tuple[Tensor, Tensor]:
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(ptr, src, dst, deg)
        ctx.num_src = x_src.size(0)
        device_type = x_src.device.type
        # Under autocast the means stay in the input's own type on every device (CPU autocast
        # leaves embedding_bag alone): no cast of the gathered rows.
        with torch.autocast(device_type, enabled=False):
            agg = F.embedding_bag(src, x_src, ptr[:-1], mode="mean")
        return agg, x_src[:num_root]

    @staticmethod
    def backward(ctx, grad: Optional[Tensor], grad_root: Optional[Tensor]):
        ptr, src, dst, deg = ctx.saved_tensors
        grad_src = None
        if grad is not None:
            if dst is None or deg is None:
                dst, deg = edge_destinations(ptr, src.numel()), ptr.diff()
            sorted_src, by_source = torch.sort(src, stable=True)
            src_ptr = torch.searchsorted(sorted_src, iota(ctx.num_src + 1, src.device))
            # A destination without edges divides by 0, but no edge reads its row.
            grad_src = F.embedding_bag(dst.index_select(0, by_source),
                                       grad / deg[:grad.size(0)].unsqueeze(1),
                                       src_ptr[:-1], mode="sum")
        if grad_root is not None:
            if grad_src is None:
                grad_src = grad_root.new_zeros(ctx.num_src, grad_root.size(1))
            grad_src[:grad_root.size(0)].add_(grad_root)
        return grad_src, None, None, None, None, None


def edge_destinations(ptr: Tensor, num_edges: int) -> Tensor:
    """Each edge's destination, for CSR pointers ``ptr``."""
    degree = ptr.diff()
    return torch.repeat_interleave(torch.arange(degree.numel(), device=ptr.device), degree,
                                   output_size=num_edges)


# Runs eagerly under torch.compile: on CUDA, inductor's code for this function's graph (its
# argsort moved into the forward) raised a device-side assert (H100, torch 2.11, 2026-11-25);
# its kernels are library calls (embedding_bag, sort, searchsorted) that compiling cannot fuse.
@torch.compiler.disable
def mean_aggregate(x_src: Tensor, ptr: Tensor, src: Tensor, dst: Optional[Tensor] = None,
                   deg: Optional[Tensor] = None, num_root: int = 0) -> tuple[Tensor, Tensor]:
    """Row ``i``: the mean of ``x_src[src[ptr[i]:ptr[i + 1]]]`` (zeros where that is empty),
    and ``x_src[:num_root]``. ``dst``, ``deg``: each edge's destination and each
    destination's edge count (at least as many rows as ``ptr`` has), if the caller has them
    (found otherwise)."""
    return _MeanAggregate.apply(x_src, ptr, src, dst, deg, num_root)


@functools.lru_cache(maxsize=None)
def _triton_imports() -> bool:
    try:
        importlib.import_module("triton")
    except ImportError:
        return False
    return True


def fused_aggregation_runs(x: Tensor) -> bool:
    """Whether :func:`sage_layer` can aggregate ``x`` with the fused Triton kernels
    (:func:`pyg_mgpu.nn.fused_mean.gather_mean`): a CUDA tensor, and ``triton`` imports."""
    return x.is_cuda and _triton_imports()


def sage_layer(conv: SAGEConv, x: Tensor, num_dst: int, ptr: Tensor, src: Tensor,
               dst: Optional[Tensor] = None, deg: Optional[Tensor] = None, *,
               fused: bool = False, n_id: Optional[Tensor] = None,
               root: Optional[Tensor] = None) -> Tensor:
    """PyG's ``SAGEConv(aggr="mean")`` forward with its own parameters, for destinations
    ``x[:num_dst]``, destination ``i`` fed by the sources ``src[ptr[i]:ptr[i + 1]]`` (rows of
    ``x``); ``dst``, ``deg`` as :func:`mean_aggregate` takes them.

    ``fused``: the means by :func:`pyg_mgpu.nn.fused_mean.gather_mean` (CUDA tensors, see
    :func:`fused_aggregation_runs`); then ``n_id`` may name the layer's rows in ``x``, which
    is read through it (the layer's input is ``x[n_id]``, never copied out).

    ``root``: the destinations' own rows, where they are not the first ``num_dst`` rows of
    ``x`` (then ``x`` may be a whole table that ``src`` indexes: no rows copied out of it).

    Only for the defaults :class:`GraphSAGE` builds (no ``normalize``, ``project`` or
    ``root_weight=False``); the result equals ``conv((x, x[:num_dst]), edge_index)`` (tested).

    ``lin_l(mean of neighbours) + lin_r(x_dst)`` as one matmul plus one accumulating matmul:
    PyG's version also allocates and adds the two products (a full extra pass over the layer).
    """
    if fused:
        from pyg_mgpu.nn.fused_mean import gather_mean  # imports triton: only on this path
        agg, x_dst = gather_mean(x, ptr, src, n_id, num_dst)
    else:
        assert n_id is None, "only the fused aggregation reads its rows through n_id"
        agg, x_dst = mean_aggregate(x, ptr, src, dst, deg, num_dst if root is None else 0)
    if root is not None:
        x_dst = root
    out = F.linear(agg, conv.lin_l.weight, conv.lin_l.bias)
    # In-place matmul is outside autocast: cast its operands to the output's dtype by hand.
    return out.addmm_(x_dst.to(out.dtype), conv.lin_r.weight.t().to(out.dtype))


class GraphSAGE(nn.Module):
    """A stack of ``num_layers`` mean-aggregating SAGEConv layers with ReLU and dropout between.

    Args:
        in_channels: Input feature size.
        hidden_channels: Width of every hidden layer.
        out_channels: Number of classes.
        num_layers: Number of layers (equals the number of sampling hops).
        dropout: Dropout probability applied after each hidden layer.
        sparse_aggregation: Trimmed layers aggregate with :func:`mean_aggregate` (else
            PyG's ``SAGEConv`` forward).
        fast_dropout: The fused ReLU and dropout (:func:`relu_dropout`).
        fused_aggregation: With ``sparse_aggregation``, CUDA inputs aggregate with the fused
            Triton kernels instead (see :func:`fused_aggregation_runs`); elsewhere ignored.
    """

    def __init__(self, in_channels: int, hidden_channels: int, out_channels: int,
                 num_layers: int, dropout: float = 0.5, sparse_aggregation: bool = True,
                 fast_dropout: bool = True, fused_aggregation: bool = False):
        super().__init__()
        if num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {num_layers}.")
        sizes = [in_channels] + [hidden_channels] * (num_layers - 1) + [out_channels]
        self.convs = nn.ModuleList(SAGEConv(a, b, aggr="mean") for a, b in zip(sizes, sizes[1:]))
        self.dropout = dropout
        self.sparse_aggregation = sparse_aggregation
        self.fast_dropout = fast_dropout
        self.fused_aggregation = fused_aggregation

    @property
    def num_layers(self) -> int:
        return len(self.convs)

    def forward(self, x: Tensor, edge_index: Tensor,
                num_sampled_nodes_per_hop: Optional[Sequence[int]] = None,
                num_sampled_edges_per_hop: Optional[Sequence[int]] = None, *,
                n_id: Optional[Tensor] = None) -> Tensor:
        """Runs the stack; with per-hop counts it trims every layer to what the next one needs.

        The counts take PyG's ``BasicGNN.forward`` keyword names, so the trainer calls this
        model and PyG's (``--model``) alike. With ``n_id``, ``x`` is a feature table and the
        batch's features are ``x[n_id]``: the fused aggregation's first layer reads them in
        place, any other path gathers them first.

        Returns:
            Trimmed: logits of the seeds (``num_sampled_nodes_per_hop[0]`` rows). Untrimmed:
            logits of every node in ``x``.
        """
        trim = num_sampled_nodes_per_hop is not None and num_sampled_edges_per_hop is not None
        if trim:
            assert len(num_sampled_nodes_per_hop) == self.num_layers + 1, (
                "need one node count per hop plus the seeds")
            # Host integers: summed in Python, no tensor op (nor a kernel on the GPU's path).
            nodes_upto = list(itertools.accumulate(int(n) for n in num_sampled_nodes_per_hop))
            edges_upto = list(itertools.accumulate(int(n) for n in num_sampled_edges_per_hop))
            if self.sparse_aggregation:
                dst_ptr = _dst_pointers(edge_index[1], nodes_upto[-2])
                # Every layer's edges are a prefix of the batch's, and a destination's edges
                # all lie in the prefix of each layer it is in: one degree per destination
                # serves all layers' backward passes.
                deg = dst_ptr.diff()
        fused = trim and self.sparse_aggregation and self.fused_aggregation and (
            fused_aggregation_runs(x))
        if fused:
            # int32 pointers and sources, converted once for every layer of the batch.
            dst_ptr, src = dst_ptr.to(torch.int32), edge_index[0].to(torch.int32)
        elif n_id is not None:
            x = x.index_select(0, n_id)
        for i, conv in enumerate(self.convs):
            if trim:
                hops_left = self.num_layers - i  # hops of input this layer still consumes
                num_dst = nodes_upto[hops_left - 1]
                num_edges = edges_upto[hops_left - 1]
                if fused:
                    x = sage_layer(conv, x, num_dst, dst_ptr[:num_dst + 1], src[:num_edges],
                                   fused=True, n_id=n_id if i == 0 else None)
                elif self.sparse_aggregation:
                    x = sage_layer(conv, x, num_dst, dst_ptr[:num_dst + 1],
                                   edge_index[0, :num_edges], edge_index[1, :num_edges], deg)
                else:
                    x = conv((x, x[:num_dst]), edge_index[:, :num_edges],
                             size=(x.size(0), num_dst))
            else:
                x = conv(x, edge_index)
            if i < self.num_layers - 1:
                if self.fast_dropout:
                    x = relu_dropout(x, self.dropout, self.training)
                else:
                    x = F.dropout(F.relu(x), p=self.dropout, training=self.training)
        return x


def _dst_pointers(col: Tensor, num_dst: int, without_sync: Optional[bool] = None) -> Tensor:
    """CSR row pointers of the sampled edges, which the sampler emits sorted by destination.

    Because hop h's destinations come before hop h + 1's, the first ``ptr[k]`` edges are exactly
    those into the first ``k`` nodes: every trimmed layer's adjacency is a prefix of this one.

    On CUDA (``without_sync`` by default) a binary search per pointer: ``bincount`` reads its
    maximum back to the host, a stall per batch. On CPU ``bincount`` is faster
    (docs/benchmarks.md, "Model kernels on one CPU thread").
    """
    if without_sync is None:
        without_sync = takes_gpu_path(col)
    if without_sync:
        return torch.searchsorted(col, iota(num_dst + 1, col.device))
    ptr = torch.zeros(num_dst + 1, dtype=torch.long, device=col.device)
    torch.cumsum(torch.bincount(col, minlength=num_dst), 0, out=ptr[1:])
    return ptr

