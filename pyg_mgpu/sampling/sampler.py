"""A vectorized uniform neighbour sampler in plain torch, plugged into PyG's loader API.

PyG's own ``NeighborSampler`` needs ``pyg-lib`` or ``torch-sparse``; this one needs neither and
runs on CPU and CUDA tensors alike. Per hop, every frontier node keeps all its in-neighbours when
its degree is at most the fanout, and otherwise exactly ``fanout`` distinct ones, each equally
likely (Floyd's algorithm, run for all nodes at once: ``fanout`` vector steps, no per-node Python).

Output follows PyG's conventions (:class:`~torch_geometric.sampler.SamplerOutput`): ``node``
lists the seeds first, then each hop's newly reached nodes; ``row``/``col`` are local ids of the
(source, destination) of every sampled edge, grouped by hop and, within a hop, by destination;
``num_sampled_nodes``/``num_sampled_edges`` give the per-hop counts that layer trimming uses.
"""
from __future__ import annotations

import time
from typing import Optional, Sequence

import torch
from torch import Tensor
from torch_geometric.sampler import BaseSampler, NodeSamplerInput, SamplerOutput


def _unseen(lookup_type: torch.dtype) -> int:
    """The lookup entry of a node not in the batch (yet): above every id and offer."""
    return torch.iinfo(lookup_type).max


class NativeNeighborSampler(BaseSampler):
    """Uniform neighbour sampling without replacement over a CSC graph.

    Args:
        colptr: ``[N + 1]`` CSC pointers.
        row: ``[E]`` source node of each edge, grouped by destination.
        fanouts: neighbours to draw per node at each hop; ``-1`` keeps all of them.
        seed: seeds this sampler's random generator (so runs are reproducible).
    """

    def __init__(self, colptr: Tensor, row: Tensor, fanouts: Sequence[int],
                 seed: Optional[int] = None):
        if any(k == 0 or k < -1 for k in fanouts):
            raise ValueError(f"fanouts must be positive (or -1 for all neighbours), got "
                             f"{list(fanouts)}.")
        self.colptr = colptr
        self.row = row
        self.fanouts = list(fanouts)
        self.generator = torch.Generator(device=colptr.device)
        if seed is not None:
            self.generator.manual_seed(seed)
        self._lookup: Optional[Tensor] = None  # global -> local id, built lazily per process
        self._seeded_for_worker: Optional[int] = None
        # int32 halves the lookup's random accesses' footprint; its entries go up to the node
        # count plus one hop's sampled edges (see _first_occurrences).
        self._lookup_type = torch.int32 if self.num_nodes < 2**30 else torch.int64
        # Floyd's offsets are below a degree, so int32 holds them whenever the edge count does.
        self._offset_type = torch.int32 if row.numel() < 2**31 else torch.int64
        self.busy_s = 0.0  # seconds spent sampling in this process (for per-stage timing)

    @property
    def num_nodes(self) -> int:
        return self.colptr.numel() - 1

    def __getstate__(self) -> dict:
        # Workers rebuild their own lookup array; never pickle a per-process scratch buffer.
        state = self.__dict__.copy()
        state["_lookup"] = None
        state["generator"] = self.generator.get_state()
        return state

    def __setstate__(self, state: dict) -> None:
        gen_state = state.pop("generator")
        self.__dict__.update(state)
        self.generator = torch.Generator(device=self.colptr.device)
        self.generator.set_state(gen_state)

    def sample_from_nodes(self, inputs: NodeSamplerInput, **kwargs) -> SamplerOutput:
        start = time.perf_counter()
        out = self.sample(inputs.node)
        self.busy_s += time.perf_counter() - start
        out.metadata = (inputs.input_id, inputs.time)
        return out

    def sample_from_edges(self, inputs, neg_sampling=None) -> SamplerOutput:
        raise NotImplementedError("NativeNeighborSampler samples from nodes only (node "
                                  "classification); use PyG's NeighborSampler for link tasks.")

    def sample(self, seeds: Tensor) -> SamplerOutput:
        """Samples the multi-hop neighbourhood of ``seeds`` (global ids, assumed distinct)."""
        self._reseed_in_worker()
        device = self.colptr.device
        seeds = seeds.to(device=device, dtype=torch.long)
        if self._lookup is None or self._lookup.device != device:
            self._lookup = torch.full((self.num_nodes,), _unseen(self._lookup_type),
                                      dtype=self._lookup_type,
                                      device=device)
        lookup = self._lookup

        nodes = [seeds]
        num_nodes = seeds.numel()
        frontier, frontier_start = seeds, 0
        rows, cols, edges = [], [], []
        num_sampled_nodes, num_sampled_edges = [seeds.numel()], []
        touched = None  # this hop's neighbours: their lookup entries may be mid-update
        try:
            lookup.index_copy_(0, seeds, torch.arange(seeds.numel(), dtype=lookup.dtype,
                                                      device=device))
            for fanout in self.fanouts:
                local_dst, edge_id = self._sample_hop(frontier, fanout)
                # int64 from here on: scatter and index_copy take no int32 index.
                touched = nbr = self.row.index_select(0, edge_id).long()
                new_nodes = self._first_occurrences(nbr, lookup)
                lookup.index_copy_(0, new_nodes, torch.arange(
                    num_nodes, num_nodes + new_nodes.numel(), dtype=lookup.dtype, device=device))
                nodes.append(new_nodes)
                touched = None
                rows.append(lookup.index_select(0, nbr))
                cols.append(local_dst.add_(frontier_start))
                edges.append(edge_id)
                num_sampled_nodes.append(new_nodes.numel())
                num_sampled_edges.append(edge_id.numel())
                frontier, frontier_start = new_nodes, num_nodes
                num_nodes += new_nodes.numel()
            node = torch.cat(nodes)
        finally:
            # Leave the scratch array clean for the next batch, even after an error.
            lookup.index_fill_(0, torch.cat(nodes), _unseen(lookup.dtype))
            if touched is not None:
                lookup.index_fill_(0, touched, _unseen(lookup.dtype))
        return SamplerOutput(node=node, row=torch.cat(rows).long(), col=torch.cat(cols),
                             edge=torch.cat(edges), num_sampled_nodes=num_sampled_nodes,
                             num_sampled_edges=num_sampled_edges)

    def _reseed_in_worker(self) -> None:
        # Every DataLoader worker starts from a copy of this sampler, generator state included:
        # unseeded, all workers would replay one random stream on their different batches. Each
        # takes the seed DataLoader derives for it instead (reproducible from the loader's
        # generator), once.
        info = torch.utils.data.get_worker_info()
        if info is not None and self._seeded_for_worker != info.id:
            self.generator.manual_seed(info.seed)
            self._seeded_for_worker = info.id

    def _sample_hop(self, dst: Tensor, fanout: int) -> tuple[Tensor, Tensor]:
        """Returns (position of the destination in ``dst``, CSC edge id) for each sampled edge."""
        # index_select, not tensor[index]: the latter took ~2.5x as long on CPU here.
        start = self.colptr.index_select(0, dst)
        deg = self.colptr[1:].index_select(0, dst).sub_(start)
        count = deg if fanout < 0 else deg.clamp(max=fanout)
        local_dst = torch.repeat_interleave(count)
        first_slot = torch.cumsum(count, 0).sub_(count)
        # Slot s of node v reads edge start[v] + (s - first_slot[v]): all of v's edges when it
        # has at most `fanout`, else overwritten below by Floyd's draws.
        edge_id = (start - first_slot).index_select(0, local_dst)
        edge_id.add_(torch.arange(edge_id.numel(), device=dst.device))
        if fanout > 0:
            big = (deg > fanout).nonzero().squeeze(1)
            if big.numel() > 0:
                # Big nodes own exactly `fanout` consecutive slots from their first one.
                steps = torch.arange(fanout, device=dst.device)
                slots = first_slot.index_select(0, big) + steps.unsqueeze(1)
                drawn = self._floyd(deg.index_select(0, big), fanout)
                drawn.add_(start.index_select(0, big))
                edge_id.index_copy_(0, slots.view(-1), drawn.view(-1))
        return local_dst, edge_id

    def _floyd(self, deg: Tensor, k: int) -> Tensor:
        """``[k, len(deg)]``: k distinct uniform offsets in ``[0, deg)`` per column (Floyd, 1987).

        Step i draws t uniformly from [0, j] with j = deg - k + i; if t was already chosen, j
        (never chosen before) is taken instead. Every k-subset comes out equally likely.
        """
        # float64 keeps the draw uniform even for degrees in the millions. Steps run along the
        # first axis so that every step reads and writes contiguous rows.
        u = torch.rand(k, deg.numel(), dtype=torch.float64, device=deg.device,
                       generator=self.generator)
        # All steps' upper bounds j and raw draws t at once; the loop only resolves repeats.
        j = (deg - k).to(self._offset_type) + torch.arange(k, dtype=self._offset_type,
                                                           device=deg.device).unsqueeze(1)
        chosen = u.mul_(j + 1).to(self._offset_type)
        for i in range(1, k):
            t = chosen[i]
            # XOR is zero exactly where t repeats an earlier draw. Integer XOR and min ran
            # faster than the bool compare-and-any (see the sampler notes in benchmarks.md).
            repeat = torch.bitwise_xor(chosen[:i], t).amin(0) == 0
            torch.where(repeat, j[i], t, out=t)
        return chosen.long()

    @staticmethod
    def _first_occurrences(nbr: Tensor, lookup: Tensor) -> Tensor:
        """Distinct nodes of ``nbr`` not yet in ``lookup``, in order of first appearance.

        Every position offers ``num_nodes + position`` to its node's lookup entry and the smallest
        wins. Known nodes hold a local id (below ``num_nodes``) and keep it; unseen ones hold
        ``_unseen`` (above everything) and end up with their first position, which reads back
        equal only there. No sort, one pass, and the same order on every run and thread count (a
        plain indexed write lets an arbitrary duplicate win when it runs in parallel).
        """
        if lookup.numel() + nbr.numel() >= _unseen(lookup.dtype):
            raise RuntimeError(f"{nbr.numel():,} sampled neighbours in one hop of a "
                               f"{lookup.numel():,}-node graph overflow the lookup's "
                               f"{lookup.dtype}; sample smaller batches.")
        offer = torch.arange(lookup.numel(), lookup.numel() + nbr.numel(), dtype=lookup.dtype,
                             device=nbr.device)
        lookup.scatter_reduce_(0, nbr, offer, reduce="amin")
        return nbr.masked_select(lookup.index_select(0, nbr) == offer)
