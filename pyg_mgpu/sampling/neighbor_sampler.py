"""``pyg_mgpu.NeighborSampler``: PyG's ``NeighborSampler`` in plain torch (no pyg-lib/torch-sparse).

Same constructor, same :class:`~torch_geometric.sampler.SamplerOutput`, same semantics as
``torch_geometric.sampler.NeighborSampler`` for homogeneous graphs, on CPU or CUDA tensors (a
``HeteroData`` gets :class:`~pyg_mgpu.sampling.hetero.HeteroNeighborSampler`, the same options
per edge type):

- ``node`` lists the seeds first, then each hop's newly reached nodes in order of first
  appearance; ``row``/``col`` are local ids of each sampled edge's (source, destination), grouped
  by hop and, within a hop, by destination; ``edge`` is the edge's position in the CSC and
  :attr:`edge_permutation` maps it to the caller's ``edge_index`` column (PyG's loaders apply it,
  so ``batch.e_id`` and every edge attribute name the caller's edges);
- ``subgraph_type``: ``directional`` (the sampled edges), ``bidirectional`` (plus their reverses,
  by PyG's own post-processing), ``induced`` (every edge among the sampled nodes);
- ``disjoint=True``: a separate tree per seed (``batch`` says whose); ``replace=True``: draws with
  replacement; ``weight_attr``: draws proportional to an edge attribute (see :mod:`.draws`);
  ``time_attr``: temporal sampling, only neighbours no later than their seed (see
  :mod:`.temporal`).

The graph's CSC is built once per ``Data`` and shared (:mod:`pyg_mgpu.data.csc`); sampling runs
on the device that holds ``edge_index``.
"""
from __future__ import annotations

import time
import warnings
from typing import Optional, Union

import torch
from torch import Tensor
from torch_geometric.data import Data, HeteroData
from torch_geometric.sampler import NeighborSampler as PyGNeighborSampler
from torch_geometric.sampler import NodeSamplerInput, SamplerOutput
from torch_geometric.sampler.base import DataType, SubgraphType

from pyg_mgpu.data.csc import CSC, csc_of
from pyg_mgpu.sampling import remote, temporal
from pyg_mgpu.sampling.draws import hop_edges
from pyg_mgpu.sampling.tree_ids import TreeIds
from pyg_mgpu.sampling.weighted import EdgeWeights, edge_weights


def _unseen(lookup_type: torch.dtype) -> int:
    """The lookup entry of a node not in the batch (yet): above every id and offer."""
    return torch.iinfo(lookup_type).max


class NeighborSampler(PyGNeighborSampler):
    """Neighbour sampling over a ``Data``, a ``HeteroData`` or a ``(FeatureStore, GraphStore)``
    pair, a drop-in for PyG's ``NeighborSampler`` that needs neither pyg-lib nor torch-sparse.

    Args:
        data: The graph: a ``Data`` (its ``edge_index`` int64 or int32, on CPU or CUDA), a
            ``HeteroData`` (:class:`~pyg_mgpu.sampling.hetero.HeteroNeighborSampler`), or a
            ``(FeatureStore, GraphStore)`` pair (:mod:`pyg_mgpu.sampling.remote`).
        num_neighbors: Neighbours to draw per node at each hop; ``-1`` keeps all of them.
        subgraph_type: ``"directional"``, ``"bidirectional"`` or ``"induced"``.
        replace: Draw with replacement.
        disjoint: One separate subgraph per seed node.
        temporal_strategy: With ``time_attr``: ``"uniform"`` draws among the eligible
            neighbours, ``"last"`` keeps the most recent ``num_neighbors[i]`` of them.
        time_attr: A node or edge attribute of timestamps: temporal sampling, as PyG's with
            pyg-lib. A neighbour is eligible when its timestamp (the node's, or the edge's) is
            at most its seed's time (the loader's ``input_time``, else the seed node's own
            timestamp), and every seed grows its own tree (``disjoint``, as in PyG).
        weight_attr: Name of an edge attribute of ``data`` holding non-negative sampling weights.
        is_sorted: ``edge_index`` is already sorted by destination (skips the sort; checked).
        share_memory: Move the graph's CSC to shared memory (for DataLoader workers).
        directed: Deprecated PyG spelling of ``subgraph_type="induced"`` (when False).
        sample_direction: ``"forward"`` draws in-neighbours (messages flow to the seeds),
            ``"backward"`` out-neighbours.
        seed: Seed of this sampler's own random generator. Default: drawn once from torch's
            global generator, so ``torch.manual_seed`` makes runs repeat.

    Example:
        PyG's loaders take it as their ``neighbor_sampler``, e.g. ``LinkNeighborLoader``; on its
        own, every in-neighbour of node 0 (``-1``):

        >>> from torch_geometric.data import Data
        >>> from torch_geometric.sampler import NodeSamplerInput
        >>> data = Data(num_nodes=4, edge_index=torch.tensor([[1, 2, 3, 0], [0, 0, 0, 1]]))
        >>> sampler = pyg_mgpu.NeighborSampler(data, num_neighbors=[-1])
        >>> out = sampler.sample_from_nodes(NodeSamplerInput(None, torch.tensor([0])))
        >>> out.node, out.row, out.col, out.edge  # local ids; edge: the caller's edge ids
        (tensor([0, 1, 2, 3]), tensor([1, 2, 3]), tensor([0, 0, 0]), tensor([0, 1, 2]))
    """

    def __new__(cls, data=None, *args, **kwargs):
        # PyG's class takes Data and HeteroData alike: a HeteroData gets the heterogeneous
        # sampler (pyg_mgpu.sampling.hetero), built from the same per-hop draws.
        if cls is NeighborSampler and (isinstance(data, HeteroData)
                                       or remote.is_hetero_remote(data)):
            from pyg_mgpu.sampling.hetero import HeteroNeighborSampler
            cls = HeteroNeighborSampler
        return super().__new__(cls)

    def __init__(
        self,
        data: Data,
        num_neighbors,
        subgraph_type: Union[SubgraphType, str] = "directional",
        replace: bool = False,
        disjoint: bool = False,
        temporal_strategy: str = "uniform",
        time_attr: Optional[str] = None,
        weight_attr: Optional[str] = None,
        is_sorted: bool = False,
        share_memory: bool = False,
        directed: bool = True,
        sample_direction: str = "forward",
        *,
        seed: Optional[int] = None,
    ):
        # PyG's __init__ is not called: it converts edge_index to a CSC copy of its own (per
        # sampler, per rank) and refuses weights without pyg-lib. The attributes PyG's loaders
        # read are set here instead.
        if not isinstance(data, Data) and not remote.is_remote(data):
            raise ValueError(_INPUT_ERROR)  # a HeteroData gets HeteroNeighborSampler (__new__)
        check_options(time_attr, weight_attr, sample_direction, temporal_strategy)
        # "backward" samples out-neighbours: the same walk over the transposed graph, with
        # each sampled edge turned back at the end.
        self.sample_direction = sample_direction
        if not directed:
            subgraph_type = SubgraphType.induced
            warnings.warn("The usage of the 'directed' argument in 'NeighborSampler' is "
                          "deprecated. Use `subgraph_type='induced'` instead.", stacklevel=2)
        self.node_time = self.edge_time = None
        if remote.is_remote(data):  # (FeatureStore, GraphStore)
            if weight_attr is not None:  # as PyG's sampler
                raise NotImplementedError("'weight_attr' is not supported for "
                                          "'(FeatureStore, GraphStore)' inputs.")
            self.data_type = DataType.remote
            self.node_types = self.edge_types = [None]
            self.num_nodes, self.csc, self.node_time, self.edge_time = \
                remote.homogeneous_graph(data, sample_direction, time_attr)
        else:
            self.data_type = DataType.homogeneous
            self.num_nodes = data.num_nodes
            if time_attr is not None:
                self.node_time, self.edge_time = temporal.time_of(data, time_attr)
            self.csc = csc_of(data, is_sorted=is_sorted,
                              transpose=sample_direction == "backward")
        if share_memory and not self.csc.row.is_cuda:
            self.csc.share_memory_()
        self.colptr, self.row, self.perm = self.csc.colptr, self.csc.row, self.csc.perm
        self._by_time: Optional[temporal.TemporalCSC] = None
        if time_attr is not None:
            # This sampler's own copy of the sources and edge ids, sorted by time in each run.
            self._by_time = temporal.sort_by_time(self.csc, self.node_time, self.edge_time)
            if share_memory and not self._by_time.row.is_cuda:
                self._by_time.share_memory_()
            self.row, self.perm = self._by_time.row, self._by_time.perm
        # Outputs are int32 for an int32 edge_index, as PyG's are.
        self.index_dtype = (torch.int32 if self.data_type == DataType.homogeneous
                            and data.get("edge_index") is not None
                            and data.edge_index.dtype == torch.int32 else torch.long)
        self.weights = (_csc_weights(data, weight_attr, self.csc, replace)
                        if self.data_type == DataType.homogeneous else None)

        self.num_neighbors = num_neighbors  # PyG's setter: a NumNeighbors
        self.replace = replace
        self.subgraph_type = SubgraphType(subgraph_type)
        self.disjoint = disjoint  # PyG's property: always True when temporal
        self.temporal_strategy = temporal_strategy
        self.keep_orig_edges = False
        if self.is_temporal and self.subgraph_type == SubgraphType.induced:
            raise ValueError("temporal sampling grows one tree per seed (disjoint), which "
                             "subgraph_type='induced' does not support (neither does PyG); use "
                             "'directional' or 'bidirectional'.")
        if self.disjoint and self.subgraph_type == SubgraphType.induced:
            raise ValueError("'disjoint' sampling is not supported with "
                             "subgraph_type='induced' (neither is it in PyG); use "
                             "'directional' or 'bidirectional'.")

        self._start_generator(seed)
        self._lookup: Optional[Tensor] = None  # global -> local id, built lazily per process
        # int32 halves the lookup's random accesses' footprint; its entries go up to the node
        # count plus one hop's sampled edges (see _first_occurrences).
        self._lookup_type = torch.int32 if self.num_nodes < 2**30 else torch.int64
        # Floyd's offsets are below a degree, so int32 holds them whenever the edge count does.
        self._offset_type = torch.int32 if self.row.numel() < 2**31 else torch.int64

    def _start_generator(self, seed: Optional[int]) -> None:
        """This sampler's own random generator on :attr:`device`, seeded with ``seed`` (default:
        drawn from torch's global generator), and its per-process counters."""
        self.generator = torch.Generator(device=self.device)
        if seed is None:
            seed = int(torch.randint(2**62, (), dtype=torch.long))
        self.generator.manual_seed(seed)
        self._seeded_for_worker: Optional[int] = None
        self.busy_s = 0.0  # seconds spent sampling in this process (for per-stage timing)

    @property
    def fanouts(self) -> list[int]:
        """Neighbours per hop (read on every batch: PyG's wrappers reassign num_neighbors)."""
        return [int(k) for k in self.num_neighbors.get_mapped_values()]

    @property
    def device(self) -> torch.device:
        return self.colptr.device

    def __getstate__(self) -> dict:
        # DataLoader workers rebuild their own lookup array; never pickle per-process scratch.
        state = self.__dict__.copy()
        state["_lookup"] = None
        # As bytes: a tensor made here would go to a spawned worker as shared memory that is
        # freed when pickling ends, before the worker maps it.
        state["generator"] = self.generator.get_state().numpy().tobytes()
        return state

    def __setstate__(self, state: dict) -> None:
        gen_state = torch.frombuffer(bytearray(state.pop("generator")), dtype=torch.uint8)
        self.__dict__.update(state)
        self.generator = torch.Generator(device=self.device)
        self.generator.set_state(gen_state)

    def sample(self, seeds: Tensor) -> SamplerOutput:
        """The sampled subgraph around ``seeds`` (node ids), without a loader."""
        return self.sample_from_nodes(NodeSamplerInput(input_id=None, node=seeds))

    def sample_from_nodes(self, inputs: NodeSamplerInput, **kwargs) -> SamplerOutput:
        start = time.perf_counter()
        out = super().sample_from_nodes(inputs)
        self.busy_s += time.perf_counter() - start
        return out

    def _sample(self, seed: Tensor, seed_time: Optional[Tensor] = None,
                **kwargs) -> SamplerOutput:
        """Samples the multi-hop neighbourhood of ``seed`` (PyG's hook for both node and edge
        loaders)."""
        if isinstance(seed, dict):
            raise ValueError("this sampler was built on a homogeneous graph: its seeds are one "
                             "tensor of node ids, not a dict per node type.")
        self._reseed_in_worker()
        seed = seed.to(device=self.device, dtype=torch.long)
        if self.is_temporal:
            times = temporal.seed_times(seed, seed_time, self.node_time)
            out = self._sample_disjoint(seed, times)
        elif seed_time is not None:
            raise ValueError("input_time was given, but the sampler has no time_attr; pass "
                             "time_attr (the node or edge timestamps) for temporal sampling.")
        else:
            out = self._sample_disjoint(seed) if self.disjoint else self._sample_joint(seed)
        if self.sample_direction == "backward":
            out.row, out.col = out.col, out.row
        if self.index_dtype != torch.long:  # PyG's outputs take the graph's index type
            for name in ("node", "row", "col", "edge", "batch"):
                value = getattr(out, name)
                if value is not None:
                    setattr(out, name, value.to(self.index_dtype))
        return out

    def _draw(self, frontier: Tensor, fanout: int,
              time_limit: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
        if fanout == 0:
            empty = torch.empty(0, dtype=torch.long, device=self.device)
            return empty, empty
        runs = None
        if time_limit is not None:  # only edges no later than each node's seed time
            runs, fanout = temporal.eligible_runs(self.colptr, self._by_time, frontier,
                                                  time_limit, fanout, self.temporal_strategy)
        return hop_edges(self.colptr, frontier, fanout, replace=self.replace,
                         weights=self.weights, generator=self.generator,
                         offset_type=self._offset_type, runs=runs)

    def _sample_joint(self, seed: Tensor) -> SamplerOutput:
        """One shared subgraph for all seeds: each node appears once."""
        if self._lookup is None or self._lookup.device != self.device:
            self._lookup = torch.full((self.num_nodes,), _unseen(self._lookup_type),
                                      dtype=self._lookup_type, device=self.device)
        lookup = self._lookup
        nodes = [seed]
        num_nodes = seed.numel()
        frontier, frontier_start = seed, 0
        rows, cols, edges = [], [], []
        num_sampled_nodes, num_sampled_edges = [seed.numel()], []
        touched = None  # this hop's neighbours: their lookup entries may be mid-update
        try:
            # A repeated seed keeps its first position (as pyg-lib); a plain indexed write
            # would keep an arbitrary one.
            lookup.scatter_reduce_(0, seed, torch.arange(seed.numel(), dtype=lookup.dtype,
                                                         device=self.device), reduce="amin")
            for fanout in self.fanouts:
                local_dst, edge = self._draw(frontier, fanout)
                # int64 from here on: scatter and index_copy take no int32 index.
                touched = nbr = self.row.index_select(0, edge).long()
                new_nodes = _number_new_nodes(nbr, lookup, num_nodes)
                touched = None
                nodes.append(new_nodes)
                rows.append(lookup.index_select(0, nbr))
                cols.append(local_dst.add_(frontier_start))
                edges.append(edge)
                num_sampled_nodes.append(new_nodes.numel())
                num_sampled_edges.append(edge.numel())
                frontier, frontier_start = new_nodes, num_nodes
                num_nodes += new_nodes.numel()
            node = torch.cat(nodes)
            if self.subgraph_type == SubgraphType.induced:
                row, col, edge = induced_edges(self.colptr, self.row, node, lookup,
                                               self._offset_type)
                # As PyG's induced sampling (torch-sparse): no per-hop counts.
                num_sampled_nodes = num_sampled_edges = None
            else:
                row, col, edge = (_cat(parts, self.device) for parts in (rows, cols, edges))
        finally:
            # Leave the scratch array clean for the next batch, even after an error.
            lookup.index_fill_(0, torch.cat(nodes), _unseen(lookup.dtype))
            if touched is not None:
                lookup.index_fill_(0, touched, _unseen(lookup.dtype))
        return SamplerOutput(node=node, row=row.long(), col=col, edge=edge,
                             num_sampled_nodes=num_sampled_nodes,
                             num_sampled_edges=num_sampled_edges)

    def _sample_disjoint(self, seed: Tensor, times: Optional[Tensor] = None) -> SamplerOutput:
        """A separate tree per seed: a node reached from two seeds appears twice.

        A node of the batch is the pair (seed index, node id), numbered by :class:`TreeIds`.
        With ``times`` (temporal sampling), tree ``i`` only takes edges no later than
        ``times[i]``.
        """
        ids = TreeIds(seed, self.num_nodes, num_trees=seed.numel())
        batch = ids.seed_trees
        nodes, batches = [seed], [batch]
        frontier, frontier_batch, frontier_start = seed, batch, 0
        num_nodes = seed.numel()
        rows, cols, edges = [], [], []
        num_sampled_nodes, num_sampled_edges = [seed.numel()], []
        for fanout in self.fanouts:
            limit = None if times is None else times.index_select(0, frontier_batch)
            local_dst, edge = self._draw(frontier, fanout, limit)
            nbr = self.row.index_select(0, edge).long()
            local, new_nodes, new_batch = ids.number(nbr,
                                                     frontier_batch.index_select(0, local_dst))
            nodes.append(new_nodes)
            batches.append(new_batch)
            rows.append(local)
            cols.append(local_dst.add_(frontier_start))
            edges.append(edge)
            num_sampled_nodes.append(new_nodes.numel())
            num_sampled_edges.append(edge.numel())
            frontier, frontier_batch, frontier_start = new_nodes, new_batch, num_nodes
            num_nodes += new_nodes.numel()
        row, col, edge = (_cat(parts, self.device) for parts in (rows, cols, edges))
        return SamplerOutput(node=torch.cat(nodes), row=row, col=col, edge=edge,
                             batch=torch.cat(batches),
                             num_sampled_nodes=num_sampled_nodes,
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


_INPUT_ERROR = ("pyg_mgpu.NeighborSampler samples a torch_geometric.data.Data, a HeteroData "
                "or a (FeatureStore, GraphStore) pair; got something else.")


def check_options(time_attr: Optional[str], weight_attr: Optional[str], sample_direction: str,
                  temporal_strategy: str) -> None:
    """The refusals of the homogeneous and heterogeneous samplers alike, in PyG's words where
    it has them."""
    if sample_direction not in ("forward", "backward"):
        raise ValueError(f"sample_direction must be 'forward' or 'backward', got "
                         f"{sample_direction!r}.")
    if time_attr is None:
        return
    if sample_direction == "backward":
        raise NotImplementedError("Temporal Sampling not yet supported for backward sampling")
    if weight_attr is not None:
        raise ValueError("weighted temporal sampling is not supported (weight_attr with "
                         "time_attr); pass one of them.")
    if temporal_strategy not in temporal.STRATEGIES:
        raise ValueError(f"temporal_strategy must be one of {temporal.STRATEGIES}, got "
                         f"{temporal_strategy!r}.")


def _csc_weights(data: Data, weight_attr: Optional[str], csc: CSC,
                 replace: bool) -> Optional[EdgeWeights]:
    """The sampling weights in CSC order, in the forms the draws read (for draws with
    replacement a float64 running sum, 8 bytes per edge: only built when needed)."""
    if weight_attr is None:
        return None
    if weight_attr not in data or not isinstance(data[weight_attr], Tensor):
        raise ValueError(f"weight_attr={weight_attr!r} is not a tensor attribute of the graph.")
    weight = data[weight_attr]
    if weight.dim() != 1 or weight.numel() != csc.num_edges:
        raise ValueError(f"weight_attr={weight_attr!r} must hold one weight per edge, shape "
                         f"[{csc.num_edges}], got {tuple(weight.shape)}.")
    weight = weight.float()  # the keys of weighted draws are float32
    if bool((weight < 0).any()) or not bool(torch.isfinite(weight).all()):
        raise ValueError(f"weight_attr={weight_attr!r} holds negative or non-finite weights; "
                         "sampling weights must be finite and >= 0.")
    weight = weight.to(csc.row.device)
    if csc.perm is not None:
        weight = weight.index_select(0, csc.perm)
    return edge_weights(weight, csc.colptr, replace)


def _cat(parts: list, device: torch.device) -> Tensor:
    """``torch.cat(parts)``, or an empty int64 tensor for no parts (no hops to sample)."""
    return torch.cat(parts) if parts else torch.empty(0, dtype=torch.long, device=device)


def _number_new_nodes(nbr: Tensor, lookup: Tensor, first_id: int) -> Tensor:
    """The nodes of ``nbr`` not yet in ``lookup``, in order of first appearance, entered in it
    with the local ids ``first_id, first_id + 1, ...`` (the ids below are the batch's so far)."""
    new = _first_occurrences(nbr, lookup, first_id)
    lookup.index_copy_(0, new, torch.arange(first_id, first_id + new.numel(),
                                            dtype=lookup.dtype, device=lookup.device))
    return new


def _first_occurrences(nbr: Tensor, lookup: Tensor, num_ids: int) -> Tensor:
    """Distinct nodes of ``nbr`` not yet in ``lookup``, in order of first appearance.

    Every position offers ``base + position`` to its node's lookup entry and the smallest
    wins, where ``base`` is above every local id given so far (``num_ids`` of them; more than
    the graph's nodes when seeds repeat). Known nodes hold a local id and keep it; unseen ones
    hold ``_unseen`` (above everything) and end up with their first position, which reads back
    equal only there. No sort, one pass, and the same order on every run and thread count (a
    plain indexed write lets an arbitrary duplicate win when it runs in parallel).
    """
    base = max(lookup.numel(), num_ids)
    if base + nbr.numel() >= _unseen(lookup.dtype):
        raise RuntimeError(f"{nbr.numel():,} sampled neighbours in one hop of a "
                           f"{lookup.numel():,}-node graph overflow the lookup's "
                           f"{lookup.dtype}; sample smaller batches.")
    offer = torch.arange(base, base + nbr.numel(), dtype=lookup.dtype, device=nbr.device)
    lookup.scatter_reduce_(0, nbr, offer, reduce="amin")
    return nbr.masked_select(lookup.index_select(0, nbr) == offer)


def induced_edges(colptr: Tensor, row: Tensor, node: Tensor, lookup: Tensor,
                  offset_type: torch.dtype = torch.int64) -> tuple[Tensor, Tensor, Tensor]:
    """Every edge into ``node`` whose source holds a local id in ``lookup``: (local source,
    position of the destination in ``node``, CSC position), by destination in node order,
    then in CSC order."""
    start = colptr.index_select(0, node)
    deg = colptr[1:].index_select(0, node).sub_(start)
    # Every in-edge of every sampled node: its CSC position (a run per node). Most are
    # dropped below, so these passes run in int32 where the edge count allows.
    edge = _runs(start.to(offset_type), deg, step=1, total=int(deg.sum()))
    src_local = lookup.index_select(0, row.index_select(0, edge))
    inside = src_local != _unseen(lookup.dtype)
    kept = inside.nonzero().squeeze(1)
    # Destinations of the kept edges: node i keeps those of its run, read off a running
    # count of kept edges at the runs' ends (cheaper than a binary search per kept edge).
    kept_so_far = torch.zeros(edge.numel() + 1, dtype=edge.dtype, device=node.device)
    torch.cumsum(inside, 0, dtype=edge.dtype, out=kept_so_far[1:])
    kept_before = kept_so_far.index_select(0, torch.cumsum(deg, 0))
    kept_per_node = torch.diff(kept_before, prepend=kept_before.new_zeros(1))
    dst_local = _runs(torch.arange(node.numel(), device=node.device), kept_per_node,
                      step=0, total=kept.numel())
    return (src_local.index_select(0, kept), dst_local,
            edge.index_select(0, kept).long())


def _runs(first: Tensor, length: Tensor, step: int, total: int) -> Tensor:
    """``cat([first[i] + step * arange(length[i]) for i])`` in ``first``'s dtype (``total`` is
    ``length.sum()``): with ``step=1`` the ranges ``first[i] .. first[i] + length[i] - 1``
    one after another, with ``step=0`` ``repeat_interleave(first, length)``.

    Built as a running sum of ``step``, where each run's first element instead jumps from the
    previous run's last: a fill and a running sum over the output, and a write per run.
    ``repeat_interleave`` of the starts plus an ``arange`` (an int64 index and more passes)
    took ~6x longer on the CPU for the millions of positions of an induced subgraph's
    in-edges.
    """
    out = torch.full((total,), step, dtype=first.dtype, device=first.device)
    nonempty = (length > 0).nonzero().squeeze(1)
    first, length = first.index_select(0, nonempty), length.index_select(0, nonempty)
    last = first + step * (length.to(first.dtype) - 1)
    previous_last = torch.cat([last.new_zeros(1), last[:-1]])  # the sum starts from 0
    out.index_copy_(0, torch.cumsum(length, 0).sub_(length), first - previous_last)
    return out.cumsum_(0)
