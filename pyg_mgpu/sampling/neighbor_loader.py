"""``pyg_mgpu.NeighborLoader``: PyG's ``NeighborLoader`` on our sampler, plus distributed epochs.

It is ``torch_geometric.loader.NeighborLoader`` itself, handed a
:class:`pyg_mgpu.NeighborSampler`, so batches are PyG's: every node and edge attribute sliced,
``n_id``, ``e_id`` (columns of the caller's ``edge_index``), ``input_id``, ``batch_size``,
``num_sampled_nodes``, ``num_sampled_edges``, and ``batch`` when disjoint.

``distributed=True`` adds what PyG's multi-GPU recipe lacks: each epoch the input nodes are
permuted alike on every rank (from ``seed`` and the epoch set by :meth:`set_epoch`) and cut into
equal shards, and every rank runs the same number of batches (so DDP never waits on a rank that
ran out); every input node is seen exactly once per epoch across ranks, none dropped or repeated.
"""
from __future__ import annotations

import contextlib
import operator
from typing import Callable, Iterator, Optional

import torch
import torch.distributed as dist
from torch import Tensor
from torch_geometric.data import Data
from torch_geometric.loader import NeighborLoader as PyGNeighborLoader
from torch_geometric.loader.utils import get_input_nodes
from torch.utils.data import DataLoader

from pyg_mgpu.data.csc import drop_cached_csc
from pyg_mgpu.gpu_path import host_work
from pyg_mgpu.sampling.checks import check_input_nodes
from pyg_mgpu.sampling.neighbor_sampler import NeighborSampler
from pyg_mgpu.sampling.rank_agreement import RankAgreement, inputs_digest
from pyg_mgpu.sampling.sharding import epoch_batches, steps_per_epoch
from pyg_mgpu.sampling.walk_batches import Batches, WalkBatches, check_sample_batches
from pyg_mgpu.seeds import rank_seed


class EpochBatchSampler:
    """Yields this rank's batches (positions into the input nodes) for the current epoch.

    Call :meth:`set_epoch` before each epoch; the batches come from
    :func:`pyg_mgpu.sampling.sharding.epoch_batches`, so all ranks run the same number of steps.

    With ``batches_per_walk`` k above 1 it yields lists of k batches (the last may hold fewer),
    the epoch's batches ``[0, k)``, ``[k, 2k)``, ...: a walk starts at the same batch whatever
    step the epoch started from, which is what makes a resumed epoch draw the same batches. The
    first list then starts at ``start_step`` rounded down to a multiple of k, and the loader
    drops its first :attr:`skip` batches. ``len`` counts batches either way.
    """

    def __init__(self, num_items: int, *, seed: int, rank: int, world_size: int,
                 batch_size: int, shuffle: bool = True, batches_per_walk: int = 1,
                 items: str = "input nodes"):
        self.num_items = num_items
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.batch_size, self.shuffle = batch_size, shuffle
        # Batches in a whole epoch (``len`` counts those left from ``start_step``); refuses
        # ``items`` (what the seeds are) that cannot give every rank the same count.
        self.steps_per_epoch = steps_per_epoch(num_items, world_size, batch_size, items)
        self.batches_per_walk = batches_per_walk
        self.epoch = 0
        self.start_step = 0
        # Set where the rank and world size are the process group's: the check that every
        # rank sets the same epoch.
        self.agreement: Optional[RankAgreement] = None

    def set_epoch(self, epoch: int, start_step: int = 0) -> None:
        try:  # an int, or an int-like such as a 0-d integer tensor restored from a checkpoint
            epoch, start_step = operator.index(epoch), operator.index(start_step)
        except TypeError:
            raise TypeError(f"set_epoch takes the epoch as an integer (and start_step as one), "
                            f"got {epoch!r}, {start_step!r}.") from None
        if not 0 <= start_step <= self.steps_per_epoch:
            raise ValueError(f"start_step={start_step} must lie in [0, {self.steps_per_epoch}], "
                             "the batches of one epoch on this rank.")
        if self.agreement is not None:
            self.agreement.check_epoch(epoch, start_step)
        self.epoch, self.start_step = epoch, start_step

    def __len__(self) -> int:
        return self.steps_per_epoch - self.start_step

    @property
    def skip(self) -> int:
        """Batches of the first walk that come before ``start_step``."""
        return self.start_step % self.batches_per_walk

    def __iter__(self) -> Iterator[list]:
        positions = torch.arange(self.num_items)
        batches = epoch_batches(positions, seed=self.seed, epoch=self.epoch, rank=self.rank,
                                world_size=self.world_size, batch_size=self.batch_size,
                                shuffle=self.shuffle)
        k = self.batches_per_walk
        if k == 1 or self.start_step == len(batches):
            for batch in batches[self.start_step:]:
                yield batch.tolist()
            return
        for first in range(self.start_step - self.skip, len(batches), k):
            yield [batch.tolist() for batch in batches[first:first + k]]


def without_csc(batch):
    """A batch without the graph's cached CSCs (a batch is a shallow copy of the graph, and
    DataLoader workers would pickle the CSC with every batch), its ``e_id`` int64 as PyG's."""
    for store in batch.edge_stores:
        drop_cached_csc(store)
        if "e_id" in store:
            store.e_id = store.e_id.long()  # the CSC keeps the permutation int32 where it fits
    return drop_cached_csc(batch) if isinstance(batch, Data) else batch


class WithoutCscThen:
    """The transform the loaders hand to PyG's: :func:`without_csc`, then the user's own.

    PyG applies its loader's transform last, so a user's transform sees the batch as PyG's
    would be (``e_id`` int64) and may return anything, a tuple or a dict as well. A class,
    not a closure, so that DataLoader workers started by spawn can pickle it.
    """

    def __init__(self, transform: Optional[Callable]):
        self.transform = transform

    def __call__(self, batch):
        batch = without_csc(batch)
        return batch if self.transform is None else self.transform(batch)


class TransformAfterCsc:
    """A loader's ``transform`` attribute: whatever is assigned, in PyG's constructor or later
    by the user, is kept as :class:`WithoutCscThen` around it, so that PyG's ``filter_fn``
    (which reads ``self.transform``) always widens ``e_id`` first. Reading it gives that
    wrapper; the user's own function is its ``.transform``."""

    def __get__(self, loader, owner=None):
        if loader is None:
            return self
        try:
            return loader.__dict__["_transform"]
        except KeyError:  # before PyG's constructor has set it
            raise AttributeError("transform") from None

    def __set__(self, loader, transform: Optional[Callable]) -> None:
        if not isinstance(transform, WithoutCscThen):
            transform = WithoutCscThen(transform)
        loader.__dict__["_transform"] = transform


class NeighborLoader(PyGNeighborLoader):
    """A drop-in for ``torch_geometric.loader.NeighborLoader`` that needs neither pyg-lib nor
    torch-sparse: ``data`` is a ``Data``, a ``HeteroData`` (``input_nodes=(node_type,
    nodes)``) or a ``(FeatureStore, GraphStore)`` pair.

    Takes PyG's arguments (see its documentation) and these keyword-only ones:

    Args:
        distributed: Shard the input nodes over the ranks of the process group, with equal
            step counts; call :meth:`set_epoch` at the start of every epoch.
        rank, world_size: This rank and the rank count (default: from ``torch.distributed``).
        seed: Seeds the epoch permutation (identical on all ranks) and, offset by the rank,
            the sampler's draws. Default 0 with ``distributed``, else drawn from torch's global
            generator.
        sample_batches: With ``distributed``, sample this many consecutive batches in one walk
            of the sampler (:meth:`NeighborSampler.sample_batches`) and hand them out one by
            one. Each is an ordinary batch of its own seeds, drawn as when sampled alone; the
            walk issues its kernels and host reads once for all of them, which is what a GPU
            waits on. Homogeneous graphs without ``time_attr`` or ``subgraph_type="induced"``.

    Example:
        Nodes 1, 2 and 3 point to node 0; the batch of seed 0 holds two of them:

        >>> from torch_geometric.data import Data
        >>> data = Data(x=torch.randn(4, 8), edge_index=torch.tensor([[1, 2, 3, 0],
        ...                                                           [0, 0, 0, 1]]))
        >>> loader = pyg_mgpu.NeighborLoader(data, num_neighbors=[2], batch_size=1,
        ...                                  input_nodes=torch.tensor([0]))
        >>> batch = next(iter(loader))
        >>> batch.n_id[:batch.batch_size], batch.num_sampled_nodes, batch.num_sampled_edges
        (tensor([0]), [1, 2], [2])
        >>> bool((batch.edge_index[1] == 0).all())  # both edges point into the seed
        True

        On several ranks, each takes its shard of the seeds, with equal step counts::

            loader = pyg_mgpu.NeighborLoader(data, [25, 10], input_nodes=data.train_mask,
                                             batch_size=1024, shuffle=True, distributed=True)
            for epoch in range(epochs):
                loader.set_epoch(epoch)
                for batch in loader: ...
    """

    transform = TransformAfterCsc()  # the user's transform runs after e_id is widened

    def __init__(
        self,
        data: Data,
        num_neighbors,
        input_nodes=None,
        input_time: Optional[Tensor] = None,
        replace: bool = False,
        subgraph_type="directional",
        disjoint: bool = False,
        temporal_strategy: str = "uniform",
        time_attr: Optional[str] = None,
        weight_attr: Optional[str] = None,
        transform: Optional[Callable] = None,
        transform_sampler_output: Optional[Callable] = None,
        is_sorted: bool = False,
        filter_per_worker: Optional[bool] = None,
        neighbor_sampler: Optional[NeighborSampler] = None,
        directed: bool = True,
        *,
        distributed: bool = False,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        seed: Optional[int] = None,
        sample_batches: int = 1,
        **kwargs,
    ):
        check_input_nodes(data, input_nodes)
        self.epoch_sampler: Optional[EpochBatchSampler]
        self.epoch_sampler, rank, seed = shard_epochs(
            kwargs, lambda: get_input_nodes(data, input_nodes)[1],
            distributed=distributed, rank=rank, world_size=world_size, seed=seed)
        if neighbor_sampler is None:
            neighbor_sampler = rank_sampler(data, num_neighbors, kwargs, seed=seed, rank=rank,
                                            **sampler_options(locals()))
        self.sample_batches = check_sample_batches(sample_batches, self.epoch_sampler is not None,
                                                   neighbor_sampler)
        if self.epoch_sampler is not None:
            self.epoch_sampler.batches_per_walk = self.sample_batches
        self._walks: Optional[WalkBatches] = None
        super().__init__(data, num_neighbors, input_nodes=input_nodes, input_time=input_time,
                         time_attr=time_attr, transform=transform,
                         transform_sampler_output=transform_sampler_output,
                         filter_per_worker=filter_per_worker, neighbor_sampler=neighbor_sampler,
                         **kwargs)
        if self.sample_batches > 1:
            # DataLoader fetches each item of a batch-sampler entry from its dataset, PyG's
            # range(num_inputs); a walk's entry holds whole batches, handed to collate_fn as
            # they are. (DataLoader refuses a new dataset once built, hence object's setattr.)
            object.__setattr__(self, "dataset", Batches(len(self.dataset)))

    def set_epoch(self, epoch: int, start_step: int = 0) -> None:
        """Selects the epoch's permutation (``distributed=True``; otherwise does nothing).

        ``start_step`` skips the epoch's first batches without sampling them, to continue an
        epoch from a checkpoint; ``len(loader)`` then counts the batches left. To draw what the
        uninterrupted epoch would have drawn, also restore the sampler's generator state as it
        was before batch ``start_step`` (the trainer's checkpoints hold it).
        """
        select_epoch(self.epoch_sampler, epoch, start_step)

    def collate_fn(self, index):
        if self.sample_batches == 1:
            return super().collate_fn(index)
        # One walk's batches; seeds held by the host are sliced there (no kernel on a GPU).
        with host_work() if not self.input_data.node.is_cuda else contextlib.nullcontext():
            inputs = [self.input_data[batch] for batch in index]
        outs = self.node_sampler.sample_batches([inputs.node for inputs in inputs])
        for out, seeds in zip(outs, inputs):
            out.metadata = (seeds.input_id, seeds.time)  # as PyG's sampler sets it
        return [self.filter_fn(out) for out in outs] if self.filter_per_worker else outs

    def _get_iterator(self):
        if self.sample_batches == 1:
            return super()._get_iterator()
        walks = DataLoader._get_iterator(self)  # each item: one walk's batches
        generator = getattr(self.node_sampler, "generator", None)
        self._walks = WalkBatches(walks, None if self.filter_per_worker else self.filter_fn,
                                  skip=self.epoch_sampler.skip,
                                  generator=generator if self.num_workers == 0 else None)
        return self._walks

    def sampler_state(self) -> Optional[Tensor]:
        """The sampler's generator state from before the next batch was drawn: what a
        checkpoint records so that a resumed run (``set_epoch(epoch, start_step)``, then this
        state restored) draws the batches the uninterrupted run would have. None when the
        sampler has no generator of its own. With ``sample_batches``, the state from before
        the walk that holds the next batch."""
        generator = getattr(self.node_sampler, "generator", None)
        if generator is None:
            return None
        if self._walks is not None and self._walks.pending:
            return self._walks.state_before
        return generator.get_state()


def select_epoch(epoch_sampler: Optional[EpochBatchSampler], epoch: int,
                 start_step: int) -> None:
    """A loader's ``set_epoch``: the epoch's permutation with ``distributed=True``; otherwise
    nothing (and no ``start_step``)."""
    if epoch_sampler is not None:
        epoch_sampler.set_epoch(epoch, start_step)
    elif start_step:
        raise ValueError("start_step needs distributed=True (its epochs are what a "
                         "checkpoint can name a position in).")


def rank_and_world_size(rank: Optional[int], world_size: Optional[int]) -> tuple[int, int]:
    if rank is None or world_size is None:
        if not (dist.is_available() and dist.is_initialized()):
            raise ValueError("distributed=True needs rank= and world_size=, or an initialized "
                             "process group (torch.distributed.init_process_group, or "
                             "pyg_mgpu.spawn).")
        rank = dist.get_rank() if rank is None else rank
        world_size = dist.get_world_size() if world_size is None else world_size
    try:
        rank, world_size = operator.index(rank), operator.index(world_size)
    except TypeError:
        raise TypeError(f"rank and world_size must be integers, got rank={rank!r} and "
                        f"world_size={world_size!r}.") from None
    if not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} must lie in [0, world_size={world_size}).")
    return rank, world_size


def shard_epochs(kwargs: dict, seed_inputs: Callable[[], Tensor], *, distributed: bool,
                 rank: Optional[int], world_size: Optional[int],
                 seed: Optional[int], items: str = "input nodes", loader: str = "NeighborLoader"
                 ) -> tuple[Optional[EpochBatchSampler], Optional[int], Optional[int]]:
    """With ``distributed``: this rank's epoch batch sampler over the seeds ``seed_inputs()``
    gives (``items``: nodes, or edges as the columns of a ``[2, E]`` index), put into
    DataLoader's ``kwargs`` as its ``batch_sampler``; with the rank, and the seed (default 0:
    every rank must permute alike). Where the rank and world size are the process group's, the
    ``loader`` checks that its ranks agree (:mod:`~pyg_mgpu.sampling.rank_agreement`).
    Returns ``(sampler or None, rank, seed)``."""
    if not distributed:
        return None, rank, seed
    rank, world_size = rank_and_world_size(rank, world_size)
    agreement = RankAgreement.from_group(loader, rank, world_size)
    seed = 0 if seed is None else seed
    inputs = seed_inputs()
    sampler = epoch_sampler(inputs.size(-1), kwargs, seed=seed, rank=rank,
                            world_size=world_size, items=items)
    if agreement is not None:
        agreement.check_built({"seed": seed, "world_size": world_size,
                               "batch_size": sampler.batch_size, "shuffle": sampler.shuffle,
                               "num_inputs": sampler.num_items, "inputs": inputs_digest(inputs)})
        sampler.agreement = agreement
    kwargs["batch_sampler"] = sampler
    return sampler, rank, seed


# The loaders' arguments that are NeighborSampler's options too (PyG's loader signatures).
SAMPLER_OPTIONS = ("replace", "subgraph_type", "disjoint", "temporal_strategy", "time_attr",
                   "weight_attr", "is_sorted", "directed")


def sampler_options(arguments: dict) -> dict:
    """The sampler options among a loader's ``arguments`` (its ``locals()``)."""
    return {name: arguments[name] for name in SAMPLER_OPTIONS}


def rank_sampler(data, num_neighbors, kwargs: dict, *, seed: Optional[int],
                 rank: Optional[int], **options) -> NeighborSampler:
    """A loader's own :class:`NeighborSampler`: in shared memory for DataLoader workers, and
    seeded per rank (:func:`~pyg_mgpu.seeds.rank_seed`), so that each rank draws its own samples while the
    epochs' permutation is shared."""
    return NeighborSampler(data, num_neighbors=num_neighbors,
                           share_memory=kwargs.get("num_workers", 0) > 0,
                           seed=None if seed is None else rank_seed(seed, rank or 0),
                           int64_edge_permutation=False,  # WithoutCscThen widens e_id
                           **options)


def epoch_sampler(num_inputs: int, kwargs: dict, *, seed: int, rank: int,
                  world_size: int, items: str = "input nodes") -> EpochBatchSampler:
    """Takes DataLoader's batching arguments out of ``kwargs`` into an epoch batch sampler over
    ``num_inputs`` seeds (nodes, or edges)."""
    if kwargs.get("sampler") is not None or kwargs.get("batch_sampler") is not None:
        raise ValueError("distributed=True makes its own batches; drop sampler= / "
                         "batch_sampler=.")
    if kwargs.pop("drop_last", False):
        raise ValueError("distributed=True drops no input: every rank gets the same number of "
                         "batches of near-equal size; drop drop_last=True.")
    batch_size = kwargs.pop("batch_size", 1)
    shuffle = kwargs.pop("shuffle", False)
    return EpochBatchSampler(num_inputs, seed=seed, rank=rank, world_size=world_size,
                             batch_size=batch_size, shuffle=shuffle, items=items)
