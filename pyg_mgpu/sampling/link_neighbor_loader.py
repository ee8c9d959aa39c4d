"""``pyg_mgpu.LinkNeighborLoader``: PyG's ``LinkNeighborLoader`` on our sampler, plus distributed
epochs of seed edges.

It is ``torch_geometric.loader.LinkNeighborLoader`` itself, handed a
:class:`pyg_mgpu.NeighborSampler`, so batches are PyG's: ``edge_label_index`` and
``edge_label`` (or ``src_index``, ``dst_pos_index``, ``dst_neg_index`` for triplet negatives)
relabelled to the batch's nodes, ``n_id``, ``e_id``, ``input_id``, ``edge_label_time`` for
temporal sampling, on ``Data``, ``HeteroData`` and ``(FeatureStore, GraphStore)`` inputs.

``distributed=True`` adds what :class:`pyg_mgpu.NeighborLoader` adds for seed nodes: each epoch
the seed edges are permuted alike on every rank and cut into equal shards, every rank runs the
same number of batches, and every seed edge is used once per epoch across ranks. Each rank
draws its negatives from its own sampler's generator, not from torch's global state (which
ranks share when they seed their models alike).
"""
from __future__ import annotations

from typing import Callable, Optional

from torch import Tensor
from torch_geometric.loader import LinkNeighborLoader as PyGLinkNeighborLoader
from torch_geometric.loader.utils import get_edge_label_index

from pyg_mgpu.sampling.checks import check_edge_label_index, check_per_seed_edge
from pyg_mgpu.sampling.neighbor_loader import (EpochBatchSampler, TransformAfterCsc,
                                               rank_sampler, sampler_options, select_epoch,
                                               shard_epochs)
from pyg_mgpu.sampling.neighbor_sampler import NeighborSampler


class LinkNeighborLoader(PyGLinkNeighborLoader):
    """A drop-in for ``torch_geometric.loader.LinkNeighborLoader`` that needs neither pyg-lib
    nor torch-sparse.

    Takes PyG's arguments (see its documentation) and these keyword-only ones:

    Args:
        distributed: Shard the seed edges over ranks with equal step counts; call
            :meth:`set_epoch` before each epoch (``shuffle=True`` permutes each epoch).
        rank, world_size: This rank and the rank count; default: the initialized process
            group's.
        seed: Seeds the epochs' permutations (the same on every rank) and this rank's sampler
            (``seed * 1009 + rank``: its neighbours and negatives). Default 0 with
            ``distributed=True``, else a seed drawn from torch's global generator.

    Example:
        Binary negatives, one per positive edge, for a link predictor over a ``Data``:

        >>> from torch_geometric.data import Data
        >>> data = Data(x=torch.randn(6, 4), edge_index=torch.tensor([[0, 1, 2, 3, 4],
        ...                                                            [1, 2, 3, 4, 5]]))
        >>> loader = pyg_mgpu.LinkNeighborLoader(data, [2, 2], batch_size=2,
        ...                                      neg_sampling_ratio=1.0)
        >>> batch = next(iter(loader))
        >>> batch.edge_label_index.shape, batch.edge_label.tolist()
        (torch.Size([2, 4]), [1.0, 1.0, 0.0, 0.0])
    """

    transform = TransformAfterCsc()  # the user's transform runs after e_id is widened

    def __init__(self, data, num_neighbors, edge_label_index=None,
                 edge_label: Optional[Tensor] = None, edge_label_time: Optional[Tensor] = None,
                 replace: bool = False, subgraph_type="directional", disjoint: bool = False,
                 temporal_strategy: str = "uniform", neg_sampling=None,
                 neg_sampling_ratio=None, time_attr: Optional[str] = None,
                 weight_attr: Optional[str] = None, transform: Optional[Callable] = None,
                 transform_sampler_output: Optional[Callable] = None, is_sorted: bool = False,
                 filter_per_worker: Optional[bool] = None,
                 neighbor_sampler: Optional[NeighborSampler] = None, directed: bool = True,
                 *, distributed: bool = False, rank: Optional[int] = None,
                 world_size: Optional[int] = None, seed: Optional[int] = None, **kwargs):
        check_edge_label_index(data, edge_label_index)

        def seed_edges() -> Tensor:
            return get_edge_label_index(data, edge_label_index)[1]
        check_per_seed_edge(lambda: seed_edges().size(1), edge_label=edge_label,
                            edge_label_time=edge_label_time)
        self.epoch_sampler: Optional[EpochBatchSampler]
        self.epoch_sampler, rank, seed = shard_epochs(
            kwargs, seed_edges,
            distributed=distributed, rank=rank, world_size=world_size, seed=seed,
            items="seed edges", loader="LinkNeighborLoader")
        if neighbor_sampler is None:
            neighbor_sampler = rank_sampler(data, num_neighbors, kwargs, seed=seed, rank=rank,
                                            **sampler_options(locals()))
            neighbor_sampler.negatives_from_generator = distributed
        super().__init__(data, num_neighbors, edge_label_index=edge_label_index,
                         edge_label=edge_label, edge_label_time=edge_label_time,
                         neg_sampling=neg_sampling, neg_sampling_ratio=neg_sampling_ratio,
                         time_attr=time_attr, transform=transform,
                         transform_sampler_output=transform_sampler_output,
                         filter_per_worker=filter_per_worker, neighbor_sampler=neighbor_sampler,
                         **kwargs)

    def set_epoch(self, epoch: int, start_step: int = 0) -> None:
        """Selects the epoch's permutation of the seed edges (``distributed=True``; otherwise
        does nothing).

        ``start_step`` skips the epoch's first batches without sampling them, to continue an
        epoch from a checkpoint; ``len(loader)`` then counts the batches left. To draw the
        neighbours and negatives the uninterrupted epoch would have drawn, also restore the
        sampler's generator (``loader.link_sampler.generator.set_state``) to the
        :meth:`sampler_state` recorded before batch ``start_step``.
        """
        select_epoch(self.epoch_sampler, epoch, start_step)

    def sampler_state(self) -> Optional[Tensor]:
        """The sampler's generator state, from before the next batch is drawn (without
        DataLoader workers, which draw ahead with generators of their own): what a checkpoint
        records for :meth:`set_epoch`'s ``start_step``. None where the sampler has no
        generator of its own."""
        generator = getattr(self.link_sampler, "generator", None)
        return None if generator is None else generator.get_state()
