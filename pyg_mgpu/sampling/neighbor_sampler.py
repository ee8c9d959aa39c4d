"""``pyg_mgpu.NeighborSampler``: PyG's ``NeighborSampler`` in plain torch (no pyg-lib/torch-sparse).

Same constructor, same :class:`~torch_geometric.sampler.SamplerOutput` (``HeteroSamplerOutput``
for a ``HeteroData``, the same options per edge type), same semantics as
``torch_geometric.sampler.NeighborSampler``, on CPU or CUDA tensors:

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

The graph's CSC is built once per ``Data`` (per edge type of a ``HeteroData``) and shared
(:mod:`pyg_mgpu.data.csc`); sampling runs on the device that holds ``edge_index``. Every graph
and mode goes through one walk (:mod:`.walk`) over a :class:`~.sampling_graph.SamplingGraph`;
a ``Data`` is its one node type and one edge type. What the sampler refuses is checked in
:mod:`.sampler_checks`, PyG's output types are made in :mod:`.sampler_output`, and its random
stream is :class:`~.own_generator.OwnGenerator`'s.
"""
from __future__ import annotations

import time
import warnings
from typing import Optional, Sequence, Union

import torch
from torch import Tensor
from torch_geometric.data import Data, HeteroData
from torch_geometric.sampler import NeighborSampler as PyGNeighborSampler
from torch_geometric.sampler import (EdgeSamplerInput, HeteroSamplerOutput, NegativeSampling,
                                     NodeSamplerInput, SamplerOutput)
from torch_geometric.sampler.base import DataType, SubgraphType

from pyg_mgpu.gpu_path import host_work, iota, takes_gpu_path, to_device
from pyg_mgpu.sampling import remote, sampling_graph, temporal
from pyg_mgpu.sampling.batches import BatchCounts, split_batches
from pyg_mgpu.sampling.checks import check_num_neighbors
from pyg_mgpu.sampling.numbering import max_batches_per_walk
from pyg_mgpu.sampling.own_generator import OwnGenerator
from pyg_mgpu.sampling.sampler_checks import check_input, check_options, check_seeds
from pyg_mgpu.sampling.sampler_output import homogeneous_output, in_index_dtype, output_dtypes
from pyg_mgpu.sampling.sampling_graph import EDGE, NODE
from pyg_mgpu.sampling.walk import plan_on_host, walk


class NeighborSampler(OwnGenerator, PyGNeighborSampler):
    """Neighbour sampling over a ``Data``, a ``HeteroData`` or a ``(FeatureStore, GraphStore)``
    pair, a drop-in for PyG's ``NeighborSampler`` that needs neither pyg-lib nor torch-sparse.

    Args:
        data: The graph: a ``Data`` (its ``edge_index`` int64 or int32, on CPU or CUDA), a
            ``HeteroData`` (seeds and ``num_neighbors`` per type, as in PyG), or a
            ``(FeatureStore, GraphStore)`` pair (:mod:`pyg_mgpu.sampling.remote`).
        num_neighbors: Neighbours to draw per node at each hop; ``-1`` keeps all of them.
        subgraph_type: ``"directional"``, ``"bidirectional"`` or ``"induced"``.
        replace: Draw with replacement.
        disjoint: One separate subgraph per seed node.
        temporal_strategy: With ``time_attr``: ``"uniform"`` draws among the eligible
            neighbours, ``"last"`` keeps the most recent ``num_neighbors[i]`` of them (with
            ``replace``, draws ``num_neighbors[i]`` times from those).
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
        int64_edge_permutation: :attr:`edge_permutation` (what PyG's loaders take as
            ``e_id``) in int64, as PyG's: a copy of the CSC's int32 permutation, made once
            (and shared with ``share_memory``). False keeps the int32 one, for a loader that
            widens ``e_id`` itself (the package's own do).

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

    def __init__(
        self,
        data: Union[Data, HeteroData],
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
        int64_edge_permutation: bool = True,
    ):
        # PyG's __init__ is not called: it converts edge_index to a CSC copy of its own (per
        # sampler, per rank) and refuses weights without pyg-lib. The attributes PyG's loaders
        # read are set here instead.
        if not directed:
            subgraph_type = SubgraphType.induced
            warnings.warn("The usage of the 'directed' argument in 'NeighborSampler' is "
                          "deprecated. Use `subgraph_type='induced'` instead.", stacklevel=2)
        hetero = isinstance(data, HeteroData) or remote.is_hetero_remote(data)
        check_input(data, hetero)
        check_num_neighbors(num_neighbors, hetero)
        check_options(data, disjoint=disjoint, subgraph_type=subgraph_type,
                      time_attr=time_attr, weight_attr=weight_attr,
                      sample_direction=sample_direction, temporal_strategy=temporal_strategy)
        # "backward" samples out-neighbours: the same walk over the transposed graph, with
        # each sampled edge turned back at the end.
        self.sample_direction = sample_direction
        build = sampling_graph.from_hetero if hetero else sampling_graph.from_data
        self.graph = build(data, is_sorted=is_sorted, share_memory=share_memory,
                           weight_attr=weight_attr, replace=replace, time_attr=time_attr,
                           backward=sample_direction == "backward")
        if remote.is_remote(data):
            self.data_type = DataType.remote
        else:
            self.data_type = DataType.heterogeneous if hetero else DataType.homogeneous
        if hetero:
            self.node_types, self.edge_types = self.graph.node_types, self.graph.edge_types
            self.num_nodes = self.graph.num_nodes
            self.node_time, self.edge_time = self.graph.node_time, self.graph.edge_time
            self.perm = self.graph.perm
            self.weights = None
            # PyG's setter reads this map in backward sampling: fanouts given per edge type
            # name the graph's edge types, and are kept under the walked (reversed) ones.
            self.to_backward_edge_type = {et: walked
                                          for walked, et in self.graph.original.items()}
            self.index_dtype = self.edge_dtype = torch.long
        else:
            if self.data_type == DataType.remote:
                self.node_types = self.edge_types = [None]
            self.num_nodes = self.graph.num_nodes[NODE]
            self.node_time = (self.graph.node_time or {}).get(NODE)
            self.edge_time = (self.graph.edge_time or {}).get(EDGE)
            self.csc = self.graph.csc[EDGE]
            self.colptr, self.row, self.perm = (self.csc.colptr, self.graph.row[EDGE],
                                                self.graph.perm[EDGE])
            self.weights = self.graph.weights[EDGE]
            self.index_dtype, self.edge_dtype = output_dtypes(
                data, self.data_type == DataType.homogeneous, self.csc.num_edges)
        self._edge_permutation = (_as_int64(self.perm, share_memory) if int64_edge_permutation
                                  else self.perm)
        self.num_neighbors = num_neighbors  # PyG's setter: a NumNeighbors
        self.fanouts  # checks the edge types and hop counts
        self.replace = replace
        self.subgraph_type = SubgraphType(subgraph_type)
        self.disjoint = disjoint  # PyG's property: always True when temporal
        self.temporal_strategy = temporal_strategy
        self.keep_orig_edges = False
        self.negatives_from_generator = False
        self._start_generator(seed)
        self.busy_s = 0.0  # seconds spent sampling in this process (for per-stage timing)

    @property
    def fanouts(self) -> Union[list[int], dict]:
        """Neighbours per hop (read on every batch: PyG's wrappers reassign num_neighbors);
        per edge type on a heterogeneous graph, as walked (reversed for backward sampling;
        PyG's ``num_neighbors`` property gives back the caller's own keys)."""
        if self.is_hetero:
            return self._num_neighbors.get_values(self.edge_types)
        return [int(k) for k in self.num_neighbors.get_mapped_values()]

    @property
    def edge_permutation(self):
        """CSC position -> the caller's edge id (None: the same; per edge type on a
        ``HeteroData``); int64 unless made with ``int64_edge_permutation=False``."""
        return self._edge_permutation

    @property
    def device(self) -> torch.device:
        return self.graph.device

    @property
    def samples_batches_together(self) -> bool:
        """Whether :meth:`sample_batches` takes this sampler's graph and mode: homogeneous,
        without temporal sampling or ``subgraph_type="induced"``."""
        return not (self.is_hetero or self.is_temporal or
                    self.subgraph_type == SubgraphType.induced)

    def sample(self, seeds: Tensor) -> SamplerOutput:
        """The sampled subgraph around ``seeds`` (node ids), without a loader."""
        return self.sample_from_nodes(NodeSamplerInput(input_id=None, node=seeds))

    def sample_from_nodes(self, inputs: NodeSamplerInput, **kwargs) -> SamplerOutput:
        start = time.perf_counter()
        out = super().sample_from_nodes(inputs)
        self.busy_s += time.perf_counter() - start
        return out

    def sample_from_edges(self, inputs: EdgeSamplerInput,
                          neg_sampling: Optional[NegativeSampling] = None):
        """PyG's edge sampling. PyG draws the negatives from torch's global random state; with
        :attr:`negatives_from_generator` (``pyg_mgpu.LinkNeighborLoader(distributed=True)``)
        they come from this sampler's own generator instead, so ranks that share the global
        seed (for identical model weights) still draw independent negatives, and a run
        repeats them."""
        start = time.perf_counter()
        self._reseed_in_worker()  # before the negatives' seed is drawn from the generator
        if neg_sampling is None or not self.negatives_from_generator:
            out = super().sample_from_edges(inputs, neg_sampling)
        else:
            seed = int(torch.randint(2**62, (), dtype=torch.long, device=self.device,
                                     generator=self.generator))
            # Only the generators forked here are seeded, so the caller's states all stay as
            # they were (torch.manual_seed would seed every CUDA device, a GPU model's too).
            cuda = _negative_sampling_gpus(self.device, neg_sampling)
            with torch.random.fork_rng(devices=cuda):
                torch.default_generator.manual_seed(seed)
                for index in cuda:
                    torch.cuda.default_generators[index].manual_seed(seed)
                out = super().sample_from_edges(inputs, neg_sampling)
        self.busy_s += time.perf_counter() - start
        return out

    def _sample(self, seed, seed_time=None,
                **kwargs) -> Union[SamplerOutput, HeteroSamplerOutput]:
        """Samples the multi-hop neighbourhood of ``seed`` (PyG's hook for both node and edge
        loaders): a tensor of node ids, or a dict of them per node type."""
        check_seeds(seed, seed_time, is_hetero=self.is_hetero, is_temporal=self.is_temporal,
                    node_types=self.node_types if self.is_hetero else None)
        self._reseed_in_worker()
        if not self.is_hetero:
            first_hop = None
            if self._plans_on_host(seed):
                (seed,), first_hop = self._first_hop(seed)
            seed = to_device(seed, self.device)
            tree_time = (temporal.seed_times(seed, seed_time, self.node_time)
                         if self.is_temporal else None)
            out = self._walk({NODE: seed}, {EDGE: self.fanouts}, tree_time, first_hop)
            return homogeneous_output(out, self.index_dtype, self.edge_dtype)
        seed = {t: to_device(s, self.device) for t, s in seed.items()}
        tree_time = self._tree_times(seed, seed_time) if self.is_temporal else None
        return self._walk(seed, self.fanouts, tree_time)

    def sample_batches(self, seeds: Sequence[Tensor]) -> list[SamplerOutput]:
        """One ``SamplerOutput`` per tensor of seed node ids, all drawn in one walk.

        Each is the batch :meth:`sample` would give for those seeds in distribution (its own
        nodes numbered apart from the other batches', so a node two batches reach is in
        both), for the walk's kernels and host reads once instead of once per batch
        (:mod:`.batches`). The draws differ from separate calls': the generator is shared.
        Joint batches are walked at most :func:`~.numbering.max_batches_per_walk` at a time
        (8 on a graph of 134M nodes, 4 on one of 244M), which bounds the walk's lookup.
        Homogeneous graphs, without temporal sampling or ``subgraph_type="induced"``.
        """
        if not self.samples_batches_together:
            raise NotImplementedError("sample_batches samples homogeneous graphs, without "
                                      "time_attr or subgraph_type='induced'; call sample for "
                                      "each batch instead.")
        most = len(seeds) if self.disjoint else max_batches_per_walk(self.num_nodes)
        if len(seeds) > most:  # each joint batch needs its own copy of the walk's lookup
            return [batch for start in range(0, len(seeds), most)
                    for batch in self.sample_batches(seeds[start:start + most])]
        start = time.perf_counter()
        self._reseed_in_worker()
        first_hop = None
        if not self.disjoint and seeds and all(self._plans_on_host(s) for s in seeds):
            # The seeds, their batches and their first hop's plan made on the host, and sent
            # over in one copy.
            with host_work():
                seed = torch.cat(seeds)
                seed_batch = torch.repeat_interleave(
                    torch.arange(len(seeds)), torch.tensor([s.numel() for s in seeds]))
            (seed, seed_batch), first_hop = self._first_hop(seed, seed_batch)
        else:
            seeds = [to_device(s, self.device) for s in seeds]
            sizes = to_device([s.numel() for s in seeds], self.device)
            seed = torch.cat(seeds) if seeds else torch.empty(0, dtype=torch.long,
                                                              device=self.device)
            seed_batch = torch.repeat_interleave(torch.arange(len(seeds), device=self.device),
                                                 sizes, output_size=seed.numel())
        # Joint batches: each numbered apart, their counts read with the walk's last read on
        # the GPU's path. Disjoint ones: a tree per seed, as alone.
        counts = None if self.disjoint else BatchCounts(len(seeds), len(self.fanouts))
        out = walk(self.graph, {NODE: seed}, {EDGE: self.fanouts}, replace=self.replace,
                   generator=self.generator, disjoint=self.disjoint,
                   seed_batch=None if self.disjoint else {NODE: seed_batch},
                   num_batches=len(seeds), last_read=counts, first_hop=first_hop)
        batches = split_batches(
            out.node[NODE], out.batch[NODE], out.row[EDGE], out.col[EDGE], out.edge[EDGE],
            out.num_sampled_nodes[NODE], out.num_sampled_edges[EDGE],
            tree_batch=seed_batch if self.disjoint else iota(len(seeds), self.device,
                                                             torch.int32),
            num_batches=len(seeds),
            tree_offset=torch.cumsum(sizes, 0) - sizes if self.disjoint else None,
            counts=None if counts is None else counts.values)
        batches = [in_index_dtype(batch, self.index_dtype, self.edge_dtype) for batch in batches]
        if self.subgraph_type == SubgraphType.bidirectional:
            batches = [batch.to_bidirectional(keep_orig_edges=self.keep_orig_edges)
                       for batch in batches]
        self.busy_s += time.perf_counter() - start
        return batches

    def _walk(self, seed: dict, fanouts: dict, tree_time: Optional[Tensor],
              first_hop: Optional[dict] = None) -> HeteroSamplerOutput:
        return walk(self.graph, seed, fanouts, replace=self.replace, generator=self.generator,
                    disjoint=self.disjoint, induced=self.subgraph_type == SubgraphType.induced,
                    tree_time=tree_time, strategy=self.temporal_strategy, first_hop=first_hop)

    def _plans_on_host(self, seed) -> bool:
        """Whether the first hop from ``seed`` is planned on the host (:func:`plan_on_host`):
        on the GPU's path, where the host holds the seeds and the graph's pointers, and the
        hop draws from whole runs (not temporal)."""
        host_colptr = self.graph.host_colptr.get(EDGE)
        return (isinstance(seed, Tensor) and not seed.is_cuda and host_colptr is not None
                and len(self.fanouts) > 0 and not self.is_temporal
                and takes_gpu_path(self.graph.csc[EDGE].colptr))

    def _first_hop(self, seed: Tensor, *rows: Tensor) -> tuple[Tensor, dict]:
        """``seed`` and ``rows`` on the device, and the walk's ``first_hop``."""
        stacked, planned = plan_on_host(self.graph.host_colptr[EDGE], seed.long(),
                                        int(self.fanouts[0]), *rows, replace=self.replace,
                                        device=self.device)
        return stacked, {EDGE: planned}

    def _tree_times(self, seed: dict, seed_time: Optional[dict]) -> Tensor:
        """The time bounding each tree: ``input_time`` where given, else the seed's own
        timestamp; the trees are the seeds of each seed type in turn (see
        :class:`~.numbering.DisjointIds`)."""
        times = []
        for t, s in seed.items():
            given = None if seed_time is None else seed_time.get(t)
            own = (self.node_time or {}).get(t)
            if given is None and own is None:
                raise ValueError(f"temporal sampling needs a time per seed of type {t!r}: pass "
                                 f"input_time, or give {t!r} nodes timestamps (time_attr).")
            times.append(temporal.seed_times(s, given, own))
        return times[0] if len(times) == 1 else torch.cat(times)


def _negative_sampling_gpus(device: torch.device, neg_sampling: NegativeSampling) -> list[int]:
    """The CUDA devices whose generators PyG's negative sampling may draw from besides the
    CPU's (``torch.randint`` draws there): the graph's, and those that hold the negatives'
    weights (``torch.multinomial`` draws where its weights are)."""
    weights = (neg_sampling.src_weight, neg_sampling.dst_weight)
    devices = {device, *(w.device for w in weights if w is not None)}
    return sorted(d.index for d in devices if d.type == "cuda")


def _as_int64(perm, share_memory: bool):
    if isinstance(perm, dict):
        return {key: _as_int64(value, share_memory) for key, value in perm.items()}
    if perm is None or perm.dtype == torch.long:
        return perm
    return perm.long().share_memory_() if share_memory else perm.long()
