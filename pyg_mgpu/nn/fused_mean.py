"""Neighbour means gathered straight from a feature table: Triton kernels, forward and backward.

:func:`gather_mean` computes what :func:`pyg_mgpu.nn.sage.mean_aggregate` does (PyG's
``scatter(x[src], dst, reduce="mean")`` over a CSR by destination), with two differences in
how: the source rows may be read through an index (``table[index[src]]``, so a batch's first
layer reads the feature table through the batch's node ids and no ``x[n_id]`` copy is made),
and one Triton program per destination row and block of features sums its edges' rows in fp32,
where ``embedding_bag``'s CUDA kernel walks each bag's edges one feature at a time.

The backward needs no sort: each destination's program adds ``grad[v] / deg(v)`` into its
sources' gradient rows with atomic adds (into an fp32 buffer, then cast to the rows' type),
where ``embedding_bag``'s backward sorts the edges by source every layer. Atomic adds make the
order of those sums, and so the last bits of a gradient, vary from run to run.

Importing this module imports ``triton``. Triton compiles the kernels for CUDA tensors; CPU
tensors run only under Triton's interpreter (``TRITON_INTERPRET=1`` set before this module is
imported), which the tests use.
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl
from torch import Tensor

# Edges per loop step of a program: a fanout's rows (5 to 25 edges) take one or two steps, a
# hub row loops. Features per program: a 256-wide layer takes two programs per row.
_BLOCK_EDGES = 16
_MAX_BLOCK_FEATURES = 128


@triton.jit
def _edge_rows(index, src, first, end, HAS_INDEX: tl.constexpr, BLOCK_E: tl.constexpr):
    # The table rows of edges first..first + BLOCK_E (index[src[e]], or src[e] without an
    # index), as int64 (a table's rows times its width may pass 2**31), and which are < end.
    edges = first + tl.arange(0, BLOCK_E)
    edge_mask = edges < end
    rows = tl.load(src + edges, mask=edge_mask, other=0)
    if HAS_INDEX:
        rows = tl.load(index + rows, mask=edge_mask, other=0)
    return rows.to(tl.int64), edge_mask


@triton.jit
def _mean_rows_kernel(table, index, ptr, src, out, num_features, table_stride, out_stride,
                      HAS_INDEX: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_F: tl.constexpr):
    # out[row, cols] = mean over edges e in ptr[row]:ptr[row + 1] of table[index[src[e]], cols]
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    col_mask = cols < num_features
    start = tl.load(ptr + row)
    end = tl.load(ptr + row + 1)
    acc = tl.zeros([BLOCK_E, BLOCK_F], dtype=tl.float32)
    for first in range(start, end, BLOCK_E):
        rows, edge_mask = _edge_rows(index, src, first, end, HAS_INDEX, BLOCK_E)
        offsets = rows[:, None] * table_stride + cols[None, :]
        values = tl.load(table + offsets, mask=edge_mask[:, None] & col_mask[None, :], other=0.0)
        acc += values.to(tl.float32)
    count = (end - start).to(tl.float32)
    mean = tl.sum(acc, axis=0) / tl.maximum(count, 1.0)  # an empty row: 0 / 1
    tl.store(out + row.to(tl.int64) * out_stride + cols, mean.to(out.dtype.element_ty),
             mask=col_mask)


@triton.jit
def _scatter_mean_grad_kernel(grad, index, ptr, src, grad_table, num_features, grad_stride,
                              grad_table_stride, HAS_INDEX: tl.constexpr, BLOCK_E: tl.constexpr,
                              BLOCK_F: tl.constexpr):
    # grad_table[index[src[e]], cols] += grad[row, cols] / deg(row) for each edge e into row
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    col_mask = cols < num_features
    start = tl.load(ptr + row)
    end = tl.load(ptr + row + 1)
    count = (end - start).to(tl.float32)
    g = tl.load(grad + row.to(tl.int64) * grad_stride + cols, mask=col_mask, other=0.0)
    share = g.to(tl.float32) / tl.maximum(count, 1.0)
    block = tl.zeros([BLOCK_E, BLOCK_F], dtype=tl.float32) + share[None, :]
    for first in range(start, end, BLOCK_E):
        rows, edge_mask = _edge_rows(index, src, first, end, HAS_INDEX, BLOCK_E)
        offsets = rows[:, None] * grad_table_stride + cols[None, :]
        tl.atomic_add(grad_table + offsets, block, mask=edge_mask[:, None] & col_mask[None, :],
                      sem="relaxed")


def _grid(num_rows: int, num_features: int) -> tuple[tuple[int, int], int]:
    block_features = min(_MAX_BLOCK_FEATURES, triton.next_power_of_2(max(num_features, 1)))
    return (num_rows, triton.cdiv(num_features, block_features)), block_features


class _GatherMean(torch.autograd.Function):
    """:func:`gather_mean`'s forward and backward (see the module's docstring)."""

    @staticmethod
    def forward(ctx, table: Tensor, ptr: Tensor, src: Tensor, index: Optional[Tensor],
                num_root: int) -> tuple[Tensor, Tensor]:
        ctx.set_materialize_grads(False)
        table = table.contiguous()
        num_dst, num_features = ptr.numel() - 1, table.size(1)
        out = table.new_empty(num_dst, num_features)
        if num_dst > 0 and num_features > 0:
            grid, block_features = _grid(num_dst, num_features)
            _mean_rows_kernel[grid](table, index if index is not None else src, ptr, src, out,
                                    num_features, table.stride(0), out.stride(0),
                                    HAS_INDEX=index is not None, BLOCK_E=_BLOCK_EDGES,
                                    BLOCK_F=block_features)
        root = table[:num_root] if index is None else table.index_select(0, index[:num_root])
        ctx.save_for_backward(ptr, src, index)
        ctx.table_shape, ctx.table_dtype = table.shape, table.dtype
        return out, root

    @staticmethod
    def backward(ctx, grad: Optional[Tensor], grad_root: Optional[Tensor]):
        if not ctx.needs_input_grad[0] or (grad is None and grad_root is None):
            return None, None, None, None, None
        ptr, src, index = ctx.saved_tensors
        num_rows, num_features = ctx.table_shape
        like = grad if grad is not None else grad_root
        grad_table = torch.zeros(num_rows, num_features, dtype=torch.float32, device=like.device)
        num_dst = ptr.numel() - 1
        if grad is not None and num_dst > 0 and num_features > 0:
            grad = grad.contiguous()
            grid, block_features = _grid(num_dst, num_features)
            _scatter_mean_grad_kernel[grid](grad, index if index is not None else src, ptr, src,
                                            grad_table, num_features, grad.stride(0),
                                            grad_table.stride(0), HAS_INDEX=index is not None,
                                            BLOCK_E=_BLOCK_EDGES, BLOCK_F=block_features)
        if grad_root is not None:
            if index is None:
                grad_table[:grad_root.size(0)].add_(grad_root)
            else:
                grad_table.index_add_(0, index[:grad_root.size(0)].long(),
                                      grad_root.to(torch.float32))
        return grad_table.to(ctx.table_dtype), None, None, None, None


# Runs eagerly under torch.compile, as mean_aggregate does: its kernels are Triton's own.
@torch.compiler.disable
def gather_mean(table: Tensor, ptr: Tensor, src: Tensor, index: Optional[Tensor] = None,
                num_root: int = 0) -> tuple[Tensor, Tensor]:
    """PyG's ``scatter(x[src], dst, reduce="mean")`` for the CSR ``ptr``/``src`` by
    destination, where ``x = table[index]`` (``table`` itself without ``index``), and
    ``x[:num_root]``; that is, row ``i`` of the first output is the mean of
    ``table[index[src[ptr[i]:ptr[i + 1]]]]``, zeros where that is empty, as
    :func:`pyg_mgpu.nn.sage.mean_aggregate` computes it.

    ``ptr``, ``src`` and ``index`` are int32 or int64 tensors on ``table``'s device; the means
    keep ``table``'s dtype (fp32 or bf16), summed in fp32. ``table`` gets a gradient when it
    requires one (with ``index``, rows that ``index`` names twice receive both shares).
    """
    if table.dim() != 2:
        raise ValueError(f"gather_mean needs a 2-D table of rows, got shape {tuple(table.shape)}.")
    for name, tensor in (("ptr", ptr), ("src", src), ("index", index)):
        if tensor is not None and tensor.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"gather_mean's {name} must be int32 or int64, got {tensor.dtype}.")
    return _GatherMean.apply(table, ptr.contiguous(), src.contiguous(),
                             None if index is None else index.contiguous(), num_root)
