"""``pyg_mgpu.BidirectionalNeighborSampler``: PyG's sampler of both edge directions, on our draws.

Each hop draws the in-neighbours (``sample_direction="forward"``) and the out-neighbours
(``"backward"``) of the frontier, merges the two, and makes the nodes not seen before the next
frontier: PyG's own algorithm (its ``_sample``, ``SamplerOutput.merge_with`` and ``collate``),
fed by two :class:`~pyg_mgpu.sampling.neighbor_sampler.NeighborSampler` s instead of pyg-lib.
With ``disjoint=True`` every frontier node carries its tree through the hops, which PyG's
algorithm loses after the first; the batches are those PyG's tests expect of it.

One difference from PyG, on purpose: PyG merges the two directions' edge ids as each sampler
numbers them (positions in the graph sorted by destination, and by source), then names them all
with the forward sampler's permutation, so a backward edge's ``e_id`` and attributes can name
another edge, and an edge drawn from both ends is kept twice. Here both samplers name their edges
by the caller's ``edge_index`` column before the merge, which therefore removes such duplicates.
"""
from __future__ import annotations

from typing import Optional, Union

import torch
from torch import Tensor
from torch_geometric.data import Data, HeteroData
from torch_geometric.sampler import BidirectionalNeighborSampler as PyGBidirectionalSampler
from torch_geometric.sampler import NodeSamplerInput, SamplerOutput
from torch_geometric.sampler.base import NumNeighbors, SubgraphType

from pyg_mgpu.sampling import remote
from pyg_mgpu.sampling.neighbor_sampler import NeighborSampler
from pyg_mgpu.sampling.tree_ids import assign_local_ids


class _CallerEdgeIds(NeighborSampler):
    """A :class:`NeighborSampler` whose ``edge`` output is the caller's edge id itself."""

    def _sample(self, seed: Tensor, seed_time: Optional[Tensor] = None,
                **kwargs) -> SamplerOutput:
        out = super()._sample(seed, seed_time, **kwargs)
        if self.perm is not None:
            out.edge = self.perm.index_select(0, out.edge.long()).to(out.edge.dtype)
        return out

    @property
    def edge_permutation(self) -> None:
        return None  # already applied


class BidirectionalNeighborSampler(PyGBidirectionalSampler):
    """A drop-in for PyG's ``BidirectionalNeighborSampler`` (homogeneous graphs) that needs
    neither pyg-lib nor torch-sparse: every hop samples each frontier node's in-neighbours and
    its out-neighbours, ``num_neighbors[i]`` of each.

    Args:
        data: The graph; its ``edge_index`` may be int64 or int32, on CPU or CUDA.
        num_neighbors: Neighbours per hop and direction (a list; ``-1`` keeps all of them).
            PyG's per-edge-type dict is refused, as PyG refuses it.
        subgraph_type, replace, weight_attr, is_sorted, share_memory, directed:
            As for :class:`pyg_mgpu.NeighborSampler`, applied in both directions.
        disjoint: One tree per seed position, over every hop (PyG's own algorithm mixes
            trees after the first hop).
        temporal_strategy, time_attr: Temporal sampling is refused (PyG's class refuses it
            too); :class:`pyg_mgpu.NeighborSampler` does it.
        seed: Seed of the two samplers' random generators (the backward one takes
            ``seed + 1``). Default: drawn once from torch's global generator.

    Example:
        Node 0 has one in-edge (from 1) and one out-edge (to 2); both are sampled, named by
        their column in ``edge_index``:

        >>> from torch_geometric.data import Data
        >>> from torch_geometric.sampler import NodeSamplerInput
        >>> data = Data(num_nodes=4, edge_index=torch.tensor([[0, 1, 3], [2, 0, 1]]))
        >>> sampler = pyg_mgpu.BidirectionalNeighborSampler(data, num_neighbors=[-1])
        >>> out = sampler.sample_from_nodes(NodeSamplerInput(None, torch.tensor([0])))
        >>> sorted(out.node.tolist()), sorted(out.edge.tolist())
        ([0, 1, 2], [0, 1])

        With PyG's loaders, pass it as ``neighbor_sampler``::

            loader = pyg_mgpu.NeighborLoader(data, [10, 5], neighbor_sampler=sampler,
                                             batch_size=128, input_nodes=data.train_mask)
    """

    # PyG's signature, that of NeighborSampler without sample_direction.
    def __init__(self, data: Data, num_neighbors,
                 subgraph_type: Union[SubgraphType, str] = "directional", replace: bool = False,
                 disjoint: bool = False, temporal_strategy: str = "uniform",
                 time_attr: Optional[str] = None, weight_attr: Optional[str] = None,
                 is_sorted: bool = False, share_memory: bool = False, directed: bool = True,
                 *, seed: Optional[int] = None):
        # PyG's __init__ is not called: it would build PyG's own two samplers.
        if isinstance(data, HeteroData) or remote.is_hetero_remote(data):
            raise ValueError("BidirectionalNeighborSampler samples homogeneous graphs (as PyG's "
                             "does); on a HeteroData add reverse edge types and use "
                             "pyg_mgpu.NeighborSampler, or subgraph_type='bidirectional'.")
        values = num_neighbors.values if isinstance(num_neighbors, NumNeighbors) else num_neighbors
        if isinstance(values, dict):
            raise RuntimeError("BidirectionalNeighborSampler samples with one list of "
                               "neighbour counts per hop (as PyG's does); pass a list, not a "
                               "dict per edge type.")
        if time_attr is not None:
            raise ValueError("BidirectionalNeighborSampler does not do temporal sampling "
                             "(neither does PyG's); use pyg_mgpu.NeighborSampler with "
                             "time_attr.")
        if seed is None:
            seed = int(torch.randint(2**62, (), dtype=torch.long))
        settings = dict(subgraph_type=subgraph_type, replace=replace, disjoint=disjoint,
                        temporal_strategy=temporal_strategy, time_attr=time_attr,
                        weight_attr=weight_attr, is_sorted=is_sorted, share_memory=share_memory,
                        directed=directed,
                        int64_edge_permutation=False)  # _CallerEdgeIds maps edges itself
        self.forward_sampler = _CallerEdgeIds(data, num_neighbors, sample_direction="forward",
                                              seed=seed, **settings)
        self.backward_sampler = _CallerEdgeIds(data, num_neighbors, sample_direction="backward",
                                               seed=seed + 1, **settings)
        self.num_neighbors = num_neighbors  # PyG's setter (it warns above one hop, as PyG does)
        self.subgraph_type = subgraph_type

    def _sample(self, seed, seed_time=None, **kwargs) -> SamplerOutput:
        if not self.disjoint:
            # PyG's merge of the two directions keeps one copy of a repeated seed, which
            # shifts the next node into the batch's seed positions (n_id[:batch_size]): its
            # label would be trained on as a seed's.
            if seed.unique().numel() != seed.numel():
                raise ValueError("BidirectionalNeighborSampler with disjoint=False needs "
                                 "distinct seeds in a batch (a sampler drawing seeds with "
                                 "replacement repeats them); pass disjoint=True, which keeps "
                                 "every seed position, or draw seeds without replacement.")
            return super()._sample(seed, seed_time, **kwargs)
        return self._sample_trees(seed)

    def _sample_trees(self, seed: Tensor) -> SamplerOutput:
        """PyG's bidirectional walk with one tree per seed: each hop samples the frontier in
        both directions, and a node or edge is new when its (tree, node) or (tree, edge) pair
        is. PyG's own algorithm looks up the next frontier's trees by the wrong index and
        mixes trees after the first hop; here every frontier node carries its tree.

        As PyG's: nodes in order of first appearance (each hop forward, then backward), each
        call to a direction's sampler adds two entries to ``num_sampled_nodes`` (its seeds,
        its new nodes; counted when not seen before) and one to ``num_sampled_edges``.
        """
        index_dtype = self.forward_sampler.index_dtype
        seed = seed.to(self.forward_sampler.device, torch.long)
        num_nodes, num_edges = self.forward_sampler.num_nodes, self.forward_sampler.row.numel()
        node_keys = torch.empty(0, dtype=torch.long, device=seed.device)  # by local id
        edge_keys = node_keys
        nodes, batches, rows, cols, edges = [], [], [], [], []
        num_sampled_nodes, num_sampled_edges = [], []
        frontier, frontier_tree = seed, torch.arange(seed.numel(), device=seed.device)
        for fanout in self.num_neighbors.values:
            next_frontier, next_tree = [], []
            for sampler in (self.forward_sampler, self.backward_sampler):
                sampler.num_neighbors = [fanout]
                out = sampler._sample(frontier)
                tree = frontier_tree.index_select(0, out.batch.long())
                keys = tree * num_nodes + out.node.long()
                local, is_new = assign_local_ids(keys, node_keys)
                new = is_new.nonzero().squeeze(1)
                node_keys = torch.cat([node_keys, keys.index_select(0, new)])
                next_frontier.append(out.node.long().index_select(0, new))
                next_tree.append(tree.index_select(0, new))
                num_seeds = frontier.numel()
                num_sampled_nodes += [int(is_new[:num_seeds].sum()),
                                      int(is_new[num_seeds:].sum())]
                # An edge of a tree is new once, whichever direction or hop drew it.
                edge = out.edge.long()
                keys = tree.index_select(0, out.col.long()) * num_edges + edge
                _, edge_is_new = assign_local_ids(keys, edge_keys)
                kept = edge_is_new.nonzero().squeeze(1)
                edge_keys = torch.cat([edge_keys, keys.index_select(0, kept)])
                rows.append(local.index_select(0, out.row.long().index_select(0, kept)))
                cols.append(local.index_select(0, out.col.long().index_select(0, kept)))
                edges.append(edge.index_select(0, kept))
                num_sampled_edges.append(kept.numel())
            nodes += next_frontier
            batches += next_tree
            frontier, frontier_tree = torch.cat(next_frontier), torch.cat(next_tree)
        # The loaders read the samplers' num_neighbors as one list for the whole walk.
        self.forward_sampler.num_neighbors = self.num_neighbors
        self.backward_sampler.num_neighbors = self.num_neighbors
        return SamplerOutput(
            node=torch.cat(nodes).to(index_dtype), row=torch.cat(rows).to(index_dtype),
            col=torch.cat(cols).to(index_dtype),
            edge=torch.cat(edges).to(self.forward_sampler.edge_dtype),
            batch=torch.cat(batches).to(index_dtype), num_sampled_nodes=num_sampled_nodes,
            num_sampled_edges=num_sampled_edges)

    @property
    def edge_permutation(self) -> None:
        return None  # both samplers name the caller's edges already

    def sample(self, seeds: Tensor) -> SamplerOutput:
        """The sampled subgraph around ``seeds`` (node ids), without a loader."""
        return self.sample_from_nodes(NodeSamplerInput(input_id=None, node=seeds))
