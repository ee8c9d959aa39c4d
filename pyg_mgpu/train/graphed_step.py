"""The training step of pyg_mgpu's GraphSAGE at fixed shapes, replayed from a CUDA graph
(``--cuda-graph``).

A CUDA graph replays a step's kernels with one launch, but only at the shapes it was captured
with, and sampled batches differ in size. So each hop's nodes and edges are padded to a
capacity (:class:`PaddedLayout`, a few per cent above the counts) and the batch is copied into
static buffers of those sizes (:class:`StaticBatch`), where the padding cannot change a real
node's output or any gradient:

- hop ``h``'s nodes keep their order at the start of the hop's block of rows; the pad rows
  after them hold any finite values (features of earlier batches);
- hop ``h``'s pad edges all feed the first pad row of hop ``h - 1``'s block, from row 0, so
  the edges stay sorted by destination and no real node receives a pad edge;
- pad seeds carry the label ``-100``, which the loss ignores.

A pad row's output then reaches the loss through no path, so its gradient is exactly zero and
adds nothing to the parameters'. The edges of every layer stay a prefix of the batch's, as
the trimmed model needs (:class:`~pyg_mgpu.nn.GraphSAGE`).

:class:`GraphedStep` captures zeroing the gradients, the forward, the loss and the backward;
the gradient all-reduce (one flat buffer) and the fused optimizer step stay outside the graph,
so no collective is captured and each rank may replay or run eagerly on its own. A batch
larger than the layout grows it, which takes a few eager steps and a new capture; on CPU
ranks the same padded step runs eagerly. The module must not be wrapped in DDP: its reducer
holds each parameter's gradient-accumulation node, bound to the stream it was built on, which
a capture on another stream cannot take in.
"""
from __future__ import annotations

import itertools
import math
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Callable, ContextManager, Optional, Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from pyg_mgpu.data.graph import HALF_FEATURES

PAD_LABEL = -100  # cross_entropy's default ignore_index
# A fanout's batches vary in size by about 1% (a hop's largest count was 1.4% above its mean
# at 200k nodes, fanout 15,10,5): 2% above the count that needs it, few layouts follow.
HEADROOM = 1.02
ALIGN = 16  # rows and edges per block: a multiple of 16
WARMUP_STEPS = 3  # eager steps at a new layout before it is captured (lazy inits, allocator)


def capacity(n: int) -> int:
    """The block size that holds ``n`` with :data:`HEADROOM`, rounded up to :data:`ALIGN`."""
    return ALIGN * max(1, math.ceil(n * HEADROOM / ALIGN))


@dataclass(frozen=True)
class PaddedLayout:
    """Rows per hop (``nodes``: seeds, then each hop) and edges per hop (``edges``) of the
    padded batch. Every block of nodes but the last has at least one pad row, which its next
    hop's pad edges feed."""

    nodes: tuple[int, ...]
    edges: tuple[int, ...]

    def __post_init__(self) -> None:
        assert len(self.nodes) == len(self.edges) + 1, "one node block per hop plus the seeds"

    @classmethod
    def holding(cls, nodes: Sequence[int], edges: Sequence[int],
                within: Optional["PaddedLayout"] = None) -> "PaddedLayout":
        """The layout ``within`` (if any), each block grown to :func:`capacity` where it
        cannot hold ``nodes`` and ``edges``."""
        def grown(have: int, need: int) -> int:
            return have if have >= need else capacity(need)
        old_nodes = within.nodes if within else (0,) * len(nodes)
        old_edges = within.edges if within else (0,) * len(edges)
        return cls(tuple(grown(have, n + (h < len(edges))) for h, (have, n)
                         in enumerate(zip(old_nodes, nodes))),
                   tuple(grown(have, e) for have, e in zip(old_edges, edges)))

    def holds(self, nodes: Sequence[int], edges: Sequence[int]) -> bool:
        """Whether a batch with these per-hop counts fits (a pad row left in every block of
        nodes but the last)."""
        return (len(nodes) == len(self.nodes) and len(edges) == len(self.edges)
                and all(n + (h < len(edges)) <= have
                        for h, (n, have) in enumerate(zip(nodes, self.nodes)))
                and all(e <= have for e, have in zip(edges, self.edges)))

    @property
    def num_nodes(self) -> int:
        return sum(self.nodes)

    @property
    def num_edges(self) -> int:
        return sum(self.edges)


def _starts(sizes: Sequence[int]) -> list[int]:
    return [0, *itertools.accumulate(sizes)]


class StaticBatch:
    """The buffers of one :class:`PaddedLayout`: features ``x``, ``edge_index`` (sources,
    destinations) and the seeds' labels ``y``; :meth:`load` copies a batch in."""

    def __init__(self, layout: PaddedLayout, num_features: int, *, feature_dtype: torch.dtype,
                 index_dtype: torch.dtype, device: torch.device):
        self.layout = layout
        self.x = torch.zeros(layout.num_nodes, num_features, dtype=feature_dtype, device=device)
        self.edge_index = torch.zeros(2, layout.num_edges, dtype=index_dtype, device=device)
        self.y = torch.full((layout.nodes[0],), PAD_LABEL, dtype=torch.long, device=device)

    def load(self, x: Tensor, edge_index: Tensor, y: Tensor, nodes: Sequence[int],
             edges: Sequence[int]) -> None:
        """Copies a batch in: ``x`` (its nodes hop by hop), ``edge_index`` (hop by hop, each
        hop's edges sorted by destination, which lie in the hop before), ``y`` (at least the
        seeds' labels), with ``nodes``/``edges`` per hop as host integers. Every op's size is
        known on the host: no read-back."""
        layout = self.layout
        real, padded = _starts(nodes), _starts(layout.nodes)
        for h, n in enumerate(nodes):
            self.x[padded[h]:padded[h] + n].copy_(x[real[h]:real[h] + n])
        # A node moves by its hop block's shift; the shifts grow with the node number.
        src = edge_index[0]
        shifted = src
        for h in range(1, len(nodes)):
            step = (padded[h] - real[h]) - (padded[h - 1] - real[h - 1])
            if step:
                shifted = torch.add(shifted, src >= real[h], alpha=step)
        real_e, padded_e = _starts(edges), _starts(layout.edges)
        for h, e in enumerate(edges, start=1):
            into, have = padded_e[h - 1], layout.edges[h - 1]
            self.edge_index[0, into:into + e].copy_(shifted[real_e[h - 1]:real_e[h - 1] + e])
            torch.add(edge_index[1, real_e[h - 1]:real_e[h - 1] + e],
                      padded[h - 1] - real[h - 1], out=self.edge_index[1, into:into + e])
            if e < have:  # pad edges: row 0 feeds the first pad row of the hop before
                self.edge_index[0, into + e:into + have].fill_(0)
                self.edge_index[1, into + e:into + have].fill_(padded[h - 1] + nodes[h - 1])
        self.y[:nodes[0]].copy_(y[:nodes[0]])
        self.y[nodes[0]:].fill_(PAD_LABEL)


class GraphedStep:
    """Forward, loss and backward of a trimmed GraphSAGE on padded batches
    (:class:`StaticBatch`), replayed from a CUDA graph once a layout has run
    :data:`WARMUP_STEPS` eager steps; every step eager on CPU tensors.

    The parameters' gradients are views of one flat buffer, which :meth:`forward_backward`
    starts all-reducing (averaged over ``group``) and :meth:`wait` finishes: the loop calls it
    where it waits for DDP's deferred all-reduce, then steps the optimizer. The model is
    called directly, not through DDP.
    """

    def __init__(self, model: nn.Module, *, amp: bool = False,
                 group: Optional[dist.ProcessGroup] = None, capture: Optional[bool] = None):
        self.model = model
        params = [p for p in model.parameters() if p.requires_grad]
        self.device = params[0].device
        self.flat_grad = torch.zeros(sum(p.numel() for p in params), dtype=params[0].dtype,
                                     device=self.device)
        for p, view in zip(params, self.flat_grad.split([p.numel() for p in params])):
            p.grad = view.view_as(p)
        self.amp, self.group = amp, group
        self.world_size = dist.get_world_size(group) if dist.is_initialized() else 1
        self.capture = self.device.type == "cuda" if capture is None else capture
        self.static: Optional[StaticBatch] = None
        self._resumed: Optional[PaddedLayout] = None  # the layout a checkpoint recorded
        self._graph: Optional[torch.cuda.CUDAGraph] = None
        self._outputs: Optional[tuple[Tensor, Tensor]] = None  # the graph's logits and loss
        self._eager_left = WARMUP_STEPS
        self._work = None  # the running all-reduce
        self._side: Optional[torch.cuda.Stream] = None  # warm-up steps' stream
        self.stats = {"captures": 0, "replays": 0, "eager_steps": 0, "layouts": 0,
                      "real_nodes": 0, "padded_nodes": 0}
        self._steps = 0
        self._layout_steps: list[int] = []  # the steps that began a layout (the first 20)

    def forward_backward(self, batch, pause_loading: Callable[[], ContextManager] = nullcontext
                         ) -> tuple[Tensor, Tensor]:
        """One batch's forward and backward into the flat gradient, whose all-reduce it starts;
        returns the seeds' logits (float32) and the mean loss over the real seeds.

        ``pause_loading`` (the prefetcher's :meth:`~pyg_mgpu.sampling.prefetch.Prefetcher.paused`)
        stops the loader's thread while a graph is captured.
        """
        nodes = [int(n) for n in batch.num_sampled_nodes]
        edges = [int(e) for e in batch.num_sampled_edges]
        assert nodes[0] == batch.batch_size, "the first node block is the batch's seeds"
        if self.static is None or not self.static.layout.holds(nodes, edges):
            self._new_layout(PaddedLayout.holding(nodes, edges, self.layout), batch)
        self.static.load(batch.x, batch.edge_index, batch.y, nodes, edges)
        self._steps += 1
        self.stats["real_nodes"] += sum(nodes)
        self.stats["padded_nodes"] += self.static.layout.num_nodes
        if self._graph is None and self.capture and self._eager_left == 0:
            with pause_loading():
                self._capture()
        if self._graph is not None:
            self._graph.replay()
            self.stats["replays"] += 1
            logits, loss = self._outputs
        else:
            logits, loss = self._eager()
        if self.world_size > 1:
            self._work = dist.all_reduce(self.flat_grad, group=self.group, async_op=True)
        return logits[:nodes[0]], loss

    @property
    def layout(self) -> Optional[PaddedLayout]:
        """The current layout (None before the first batch)."""
        return self.static.layout if self.static is not None else self._resumed

    def layout_state(self) -> Optional[tuple]:
        """The layout as a checkpoint keeps it: a resumed run pads its next batch alike, so
        it draws the same dropout masks (their number depends on the padded sizes)."""
        layout = self.layout
        return None if layout is None else (list(layout.nodes), list(layout.edges))

    def resume_layout(self, state: Optional[tuple]) -> None:
        """Continues from :meth:`layout_state`'s record (before the first batch)."""
        assert self.static is None, "a layout is resumed before the first batch"
        self._resumed = None if state is None else PaddedLayout(tuple(state[0]), tuple(state[1]))

    def wait(self) -> None:
        """Waits for the gradient all-reduce that :meth:`forward_backward` started."""
        if self._work is not None:
            self._work.wait()
            self._work = None

    @property
    def pending(self) -> bool:
        return self._work is not None

    def _new_layout(self, layout: PaddedLayout, batch) -> None:
        self._graph = self._outputs = None  # the old graph's memory goes back to the pool
        # Half-precision features are copied in as float32 unless the step autocasts.
        half = batch.x.dtype in HALF_FEATURES
        feature_dtype = torch.float32 if half and not self.amp else batch.x.dtype
        self.static = StaticBatch(layout, batch.x.size(1), feature_dtype=feature_dtype,
                                  index_dtype=batch.edge_index.dtype, device=self.device)
        self._eager_left = WARMUP_STEPS
        self.stats["layouts"] += 1
        if len(self._layout_steps) < 20:
            self._layout_steps.append(self._steps)

    def _forward_backward(self) -> tuple[Tensor, Tensor]:
        """The step as captured: its shapes and host integers come from the layout alone."""
        static = self.static
        self.flat_grad.zero_()
        # No autocast cache: a graph must not keep casts made before its capture.
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.amp,
                            cache_enabled=False):
            logits = self.model(static.x, static.edge_index, static.layout.nodes,
                                static.layout.edges).float()
        loss = F.cross_entropy(logits, static.y, ignore_index=PAD_LABEL)
        loss.backward()
        if self.world_size > 1:
            self.flat_grad.div_(self.world_size)
        return logits.detach(), loss.detach()

    def _eager(self) -> tuple[Tensor, Tensor]:
        self.stats["eager_steps"] += 1
        self._eager_left = max(self._eager_left - 1, 0)
        if self.device.type != "cuda" or not self.capture:
            return self._forward_backward()
        # Warm-up runs on a side stream, as torch's CUDA-graph notes ask before a capture.
        side = self._side_stream()
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            outputs = self._forward_backward()
        torch.cuda.current_stream(self.device).wait_stream(side)
        return outputs

    def _side_stream(self) -> torch.cuda.Stream:
        if self._side is None:
            self._side = torch.cuda.Stream(self.device)
        return self._side

    def _capture(self) -> None:
        graph = torch.cuda.CUDAGraph()
        try:
            # On the warm-up steps' stream (their lazily made workspaces belong to it);
            # thread_local: other threads' CUDA calls (NCCL's watchdog) do not void it.
            with torch.cuda.graph(graph, stream=self._side_stream(),
                                  capture_error_mode="thread_local"):
                outputs = self._forward_backward()
        except RuntimeError as error:
            # A failed capture leaves torch's allocator and current stream as the capture had
            # them: no eager step after it would be sound. An op that failed inside the capture
            # is the cause; ending the capture then fails too.
            causes = [e for e in (error.__context__, error) if e is not None]
            said = "; then ".join(str(e).splitlines()[0] for e in causes)
            raise RuntimeError(f"--cuda-graph: capturing the training step as a CUDA graph "
                               f"failed ({said}); run without --cuda-graph.") from error
        self._graph, self._outputs = graph, outputs
        self.stats["captures"] += 1

    def summary(self) -> dict:
        """Captures, replays, eager steps, layouts and the share of padded rows, for
        metrics.json."""
        stats = dict(self.stats)
        real, padded = stats.pop("real_nodes"), stats.pop("padded_nodes")
        stats["padded_rows_per_real_row"] = padded / real if real else None
        stats["layout_began_at_steps"] = list(self._layout_steps)
        stats["layout"] = ({"nodes": list(self.static.layout.nodes),
                            "edges": list(self.static.layout.edges)} if self.static else None)
        return stats
