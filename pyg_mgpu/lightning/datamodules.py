"""``pyg_mgpu.LightningNodeData`` and ``LightningLinkData``: PyG's Lightning data modules on
pyg_mgpu's loaders, sharded for Lightning's DDP.

They are PyG's classes (``torch_geometric.data.lightning``), with their constructor, argument
checks and ``loader='full'`` route, but their ``loader='neighbor'`` loaders are
:class:`pyg_mgpu.NeighborLoader` and :class:`pyg_mgpu.LinkNeighborLoader` (neither pyg-lib nor
torch-sparse), made on each rank when Lightning asks for them, with the rank and world size of
the trainer:

- training: ``distributed=True`` epochs, every rank the same number of batches and every seed
  once per epoch over the ranks, reshuffled by the epoch number Lightning passes to
  ``set_epoch``; the loader is resumable (:class:`~pyg_mgpu.lightning.shards.ResumableEpochs`),
  so a run resumed from a checkpoint continues the epoch order, in the middle of an epoch too;
- validation, test and prediction: each rank its contiguous slice of the split, in order, every
  seed on exactly one rank, so that metrics summed over ranks (torchmetrics, ``self.log(...,
  sync_dist=True)`` of sums) are exact.

Each loader's ``sampler`` is a ``DistributedSampler`` that says what the loader draws
(:mod:`pyg_mgpu.lightning.shards`), so Lightning's sampler replacement keeps the loader as it is,
with or without ``Trainer(use_distributed_sampler=False)``.
"""
from __future__ import annotations

import os
from typing import Any, Optional

from torch_geometric.data import Data, HeteroData
from torch_geometric.data.lightning import LightningLinkData as PyGLightningLinkData
from torch_geometric.data.lightning import LightningNodeData as PyGLightningNodeData
from torch_geometric.data.lightning.datamodule import split_kwargs
from torch_geometric.loader.utils import get_edge_label_index, get_input_nodes
from torch_geometric.sampler import BaseSampler
from torch.utils.data import DataLoader

from pyg_mgpu.lightning.shards import EvalShard, ResumableEpochs
from pyg_mgpu.sampling.link_neighbor_loader import LinkNeighborLoader
from pyg_mgpu.sampling.neighbor_loader import NeighborLoader
from pyg_mgpu.sampling.neighbor_sampler import NeighborSampler
from pyg_mgpu.seeds import eval_loader_seed

# What each data module's loader='neighbor' means (PyG's names: 'link_neighbor' is a synonym for
# links).
_NEIGHBOR_LOADERS = ("neighbor", "link_neighbor")

# The time_attr handed to a loader over a custom sampler with input times. PyG's loaders refuse
# input times without a time_attr, which they read only to build a sampler of their own; a
# custom sampler samples by its own timestamps, as PyG's data modules hand it the times (through
# NodeLoader and LinkLoader, which do not check). Any name does.
_CUSTOM_SAMPLER_TIME_ATTR = "time"


class TrainNeighborLoader(ResumableEpochs, NeighborLoader):
    """A :class:`LightningNodeData`'s training loader: a distributed
    :class:`pyg_mgpu.NeighborLoader` that Lightning checkpoints and resumes mid-epoch."""


class TrainLinkNeighborLoader(ResumableEpochs, LinkNeighborLoader):
    """A :class:`LightningLinkData`'s training loader: a distributed
    :class:`pyg_mgpu.LinkNeighborLoader` that Lightning checkpoints and resumes mid-epoch."""


class PerRankSampler:
    """Stands in for the sampler in PyG's constructor, which would otherwise build PyG's
    ``NeighborSampler`` (a CSC copy of its own, unusable without pyg-lib or torch-sparse).

    Its constructor takes no arguments, so PyG's constructor hands every keyword argument,
    the sampler's options included, to the loaders (``loader_kwargs``, ``eval_loader_kwargs``);
    each rank's loaders build their own seeded :class:`pyg_mgpu.NeighborSampler` from them.
    """

    def __init__(self):  # noqa: D107
        pass


class ShardedLoaders:
    """What :class:`LightningNodeData` and :class:`LightningLinkData` add to PyG's classes:
    the constructor's set-up around PyG's, and the loaders' ranks, seeds and shard samplers."""

    _sampler_argument: str  # the name of PyG's constructor's sampler argument
    loader: str
    kwargs: dict
    loader_kwargs: dict
    eval_loader_kwargs: dict

    # The loaders Lightning asks for; "full" is PyG's own (one device). ``_split_loader``:
    # the node or link class's loader over a split's seeds.
    def train_dataloader(self) -> DataLoader:
        """This rank's training loader: its share of each epoch's seeds, reshuffled by
        ``set_epoch``."""
        if self.loader == "full":
            return super().train_dataloader()
        return self._split_loader("train", train=True)

    def val_dataloader(self) -> DataLoader:
        """This rank's slice of the validation seeds, in order."""
        if self.loader == "full":
            return super().val_dataloader()
        return self._split_loader("val")

    def test_dataloader(self) -> DataLoader:
        """This rank's slice of the test seeds, in order."""
        if self.loader == "full":
            return super().test_dataloader()
        return self._split_loader("test")

    def predict_dataloader(self) -> DataLoader:
        """This rank's slice of the prediction seeds, in order."""
        if self.loader == "full":
            return super().predict_dataloader()
        return self._split_loader("pred")

    def _init_module(self, pyg_init, data, loader: str, graph_sampler: Optional[BaseSampler],
                     seed: Optional[int], kwargs: dict, **arguments) -> None:
        """PyG's constructor (``pyg_init``) on ``arguments``, with a :class:`PerRankSampler`
        in place of PyG's sampler for ``loader='neighbor'``."""
        ours = loader in _NEIGHBOR_LOADERS and graph_sampler is None
        if ours:
            if "num_neighbors" not in kwargs:
                raise TypeError(f"{type(self).__name__}(loader={loader!r}) needs num_neighbors= "
                                "(the neighbours to draw per hop, as for NeighborLoader).")
            graph_sampler = PerRankSampler()
        pyg_init(data=data, loader=loader, **{self._sampler_argument: graph_sampler},
                 **arguments, **kwargs)
        if "sample_batches" not in (arguments["eval_loader_kwargs"] or {}):
            # It groups the batches of training epochs into walks; the evaluation loaders are
            # no such epochs and sample one batch at a time (PyG's constructor copied it there).
            self.eval_loader_kwargs.pop("sample_batches", None)
        self.seed = seed
        if ours:
            self.loader = loader  # PyG's constructor calls a given sampler's loader 'custom'
            self.graph_sampler = self.eval_graph_sampler = None
            prepare_graph(data, self.kwargs)

    def _loader_seed(self) -> int:
        """The seed of the epochs' permutation, the same on every rank: the data module's
        ``seed``, else Lightning's global seed (``seed_everything``), else 0 (what Lightning's
        own ``DistributedSampler`` takes)."""
        if self.seed is not None:
            return self.seed
        return int(os.environ.get("PL_GLOBAL_SEED", 0))

    def _ranks(self) -> tuple[int, int]:
        """This process's rank and the job's rank count, from the trainer (rank 0 of 1 when the
        module is used without one)."""
        trainer = getattr(self, "trainer", None)
        if trainer is None:
            return 0, 1
        check_trainer(trainer)
        return trainer.global_rank, trainer.world_size

    def _inputs(self, split: str, kind: str):
        """The split's seeds (``kind``: ``"nodes"`` or ``"edges"``); refuses a split PyG would
        fail on with an ``AssertionError``: none given, where ``data`` gives no default."""
        inputs = getattr(self, f"input_{split}_{kind}")
        if inputs is None and not isinstance(self.data, Data):
            if isinstance(self.data, HeteroData) and kind == "nodes":
                why = (f"they are inferred from a HeteroData only where one node type has a "
                       f"{split}_mask, {split}_idx or {split}_index")
            else:
                data = "HeteroData" if isinstance(self.data, HeteroData) else \
                    "(FeatureStore, GraphStore) pair"
                why = f"a {data} gives no default {split} {kind}"
            raise ValueError(f"{type(self).__name__} has no {split} {kind}: pass "
                             f"input_{split}_{kind}= ({why}).")
        return inputs

    def _sharded(self, make, split: str, num_inputs, kwargs: dict, *, train: bool,
                 sampler: Optional[BaseSampler], timed: bool) -> DataLoader:
        """A loader from ``make(seed=..., **options)``: this rank's training epochs, or its
        slice of an evaluation split of ``num_inputs()`` seeds; ``timed``: the split has input
        times."""
        rank, world_size = self._ranks()
        seed = self._loader_seed()
        kwargs = dict(kwargs, neighbor_sampler=sampler)
        kwargs.setdefault("num_neighbors", None)  # a custom sampler has its own
        if sampler is not None and timed:
            kwargs.setdefault("time_attr", _CUSTOM_SAMPLER_TIME_ATTR)
        if train:
            for name in ("sampler", "batch_sampler"):
                if kwargs.get(name) is not None:
                    raise ValueError(f"{type(self).__name__} makes its own training batches "
                                     f"(each rank's share of every epoch); drop {name}=.")
            loader = make(shuffle=True, distributed=True, rank=rank, world_size=world_size,
                          seed=seed, **kwargs)
            # The epoch Lightning is about to run: a resumed fit asks for the loader after it
            # restored its epoch and starts iterating it before it calls set_epoch, and
            # DataLoader workers draw their first batches at once.
            loader.sampler.set_epoch(fitted_epochs(getattr(self, "trainer", None)))
            return loader
        if kwargs.pop("drop_last", False):
            raise ValueError(
                f"{type(self).__name__} evaluates every {split} seed exactly once over the "
                "ranks (so that metrics summed over them are exact) and cannot drop the last "
                "batch: drop drop_last=True (from eval_loader_kwargs, or from the module's "
                "arguments, which evaluation takes too).")
        num = num_inputs()
        if 0 < num < world_size:
            raise ValueError(
                f"{type(self).__name__}'s {split} split holds {num} seed(s), fewer than the "
                f"{world_size} ranks: each rank evaluates its own slice of it, and a rank "
                "without one has no batches, which Lightning cannot run under DDP. Give the "
                f"split at least {world_size} seeds, or run on at most {num} device(s).")
        # Seeded per rank, as training's samplers are: each rank its own neighbours and
        # negatives.
        return make(shuffle=False, sampler=EvalShard(num, rank, world_size),
                    seed=eval_loader_seed(seed), rank=rank, **kwargs)


class LightningNodeData(ShardedLoaders, PyGLightningNodeData):
    """A drop-in for ``torch_geometric.data.lightning.LightningNodeData`` that needs neither
    pyg-lib nor torch-sparse and is exact under Lightning's DDP.

    Takes PyG's arguments (see its documentation): ``data`` (a ``Data``, a ``HeteroData`` or
    a ``(FeatureStore, GraphStore)`` pair), ``input_train_nodes`` / ``_val_`` / ``_test_`` /
    ``_pred_`` (inferred from ``data``'s masks when not given) and their times, ``loader``
    (``"neighbor"`` or ``"full"``), ``node_sampler``, ``eval_loader_kwargs`` and the
    :class:`pyg_mgpu.NeighborLoader` arguments (``num_neighbors``, ``batch_size``,
    ``num_workers``, ...), and one keyword-only argument:

    Args:
        seed: Seeds the training epochs' permutation (the same on every rank) and each
            rank's sampler. Default: Lightning's global seed (``seed_everything``), else 0.

    With ``loader="neighbor"``, training batches are each rank's share of the epoch's
    permutation of the training nodes, cut into equal numbers of near-equal batches of at most
    ``batch_size``, and the training loader keeps its place in the epoch in Lightning's
    checkpoints (a fit resumed mid-epoch runs the rest of that epoch); evaluation batches are
    ``batch_size`` consecutive nodes of the rank's slice of the split, seeded per rank. ``sampler=`` and ``batch_sampler=`` cannot be honoured for
    training, nor ``drop_last=True`` for training or evaluation (which visits every seed of
    the split, once over the ranks): they are refused when the loader is made, as is an
    evaluation split with fewer seeds than ranks. ``sample_batches=`` applies to the training
    loader only.

    Example:
        >>> from torch_geometric.data import Data
        >>> data = Data(x=torch.randn(6, 4), edge_index=torch.tensor([[0, 1, 2, 3, 4],
        ...                                                            [1, 2, 3, 4, 5]]),
        ...             train_mask=torch.tensor([True, True, True, True, False, False]))
        >>> datamodule = pyg_mgpu.LightningNodeData(data, num_neighbors=[2], batch_size=2)
        >>> loader = datamodule.train_dataloader()  # outside a trainer: rank 0 of 1
        >>> [batch.batch_size for batch in loader]
        [2, 2]
    """

    _sampler_argument = "node_sampler"

    def __init__(self, data, input_train_nodes=None, input_train_time=None,
                 input_val_nodes=None, input_val_time=None, input_test_nodes=None,
                 input_test_time=None, input_pred_nodes=None, input_pred_time=None,
                 loader: str = "neighbor", node_sampler: Optional[BaseSampler] = None,
                 eval_loader_kwargs: Optional[dict[str, Any]] = None, *,
                 seed: Optional[int] = None, **kwargs: Any):
        self._init_module(
            super().__init__, data, loader, node_sampler, seed, kwargs,
            input_train_nodes=input_train_nodes, input_train_time=input_train_time,
            input_val_nodes=input_val_nodes, input_val_time=input_val_time,
            input_test_nodes=input_test_nodes, input_test_time=input_test_time,
            input_pred_nodes=input_pred_nodes, input_pred_time=input_pred_time,
            eval_loader_kwargs=eval_loader_kwargs)

    def _split_loader(self, split: str, train: bool = False) -> DataLoader:
        nodes, time = self._inputs(split, "nodes"), getattr(self, f"input_{split}_time")
        sampler = self.graph_sampler if train else self.eval_graph_sampler

        def make(**options) -> NeighborLoader:
            cls = TrainNeighborLoader if train else NeighborLoader
            return cls(self.data, input_nodes=nodes, input_time=time, **options)

        return self._sharded(make, split, lambda: get_input_nodes(self.data, nodes)[1].numel(),
                             self.loader_kwargs if train else self.eval_loader_kwargs,
                             train=train, sampler=sampler, timed=time is not None)


class LightningLinkData(ShardedLoaders, PyGLightningLinkData):
    """A drop-in for ``torch_geometric.data.lightning.LightningLinkData`` that needs neither
    pyg-lib nor torch-sparse and is exact under Lightning's DDP.

    Takes PyG's arguments (see its documentation): ``data``, ``input_train_edges`` /
    ``_val_`` / ``_test_`` / ``_pred_`` with their ``_labels`` and ``_time``, ``loader``,
    ``link_sampler``, ``eval_loader_kwargs`` and the :class:`pyg_mgpu.LinkNeighborLoader`
    arguments (``num_neighbors``, ``neg_sampling``, ``neg_sampling_ratio``, ``batch_size``,
    ...), and ``seed`` as :class:`LightningNodeData` takes it. Training shards the seed edges
    over the ranks each epoch; each rank draws its negatives from its own sampler's generator,
    in training and in evaluation.

    Example:
        Binary negatives, one per positive seed edge, on rank 0 of 1 (outside a trainer):

        >>> from torch_geometric.data import Data
        >>> data = Data(x=torch.randn(6, 4), edge_index=torch.tensor([[0, 1, 2, 3, 4],
        ...                                                            [1, 2, 3, 4, 5]]))
        >>> datamodule = pyg_mgpu.LightningLinkData(data, data.edge_index, num_neighbors=[2],
        ...                                         neg_sampling_ratio=1.0, batch_size=5)
        >>> batch = next(iter(datamodule.train_dataloader()))
        >>> batch.edge_label.tolist()
        [1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    """

    _sampler_argument = "link_sampler"

    def __init__(self, data, input_train_edges=None, input_train_labels=None,
                 input_train_time=None, input_val_edges=None, input_val_labels=None,
                 input_val_time=None, input_test_edges=None, input_test_labels=None,
                 input_test_time=None, input_pred_edges=None, input_pred_labels=None,
                 input_pred_time=None, loader: str = "neighbor",
                 link_sampler: Optional[BaseSampler] = None,
                 eval_loader_kwargs: Optional[dict[str, Any]] = None, *,
                 seed: Optional[int] = None, **kwargs: Any):
        self._init_module(
            super().__init__, data, loader, link_sampler, seed, kwargs,
            input_train_edges=input_train_edges, input_train_labels=input_train_labels,
            input_train_time=input_train_time, input_val_edges=input_val_edges,
            input_val_labels=input_val_labels, input_val_time=input_val_time,
            input_test_edges=input_test_edges, input_test_labels=input_test_labels,
            input_test_time=input_test_time, input_pred_edges=input_pred_edges,
            input_pred_labels=input_pred_labels, input_pred_time=input_pred_time,
            eval_loader_kwargs=eval_loader_kwargs)

    def _split_loader(self, split: str, train: bool = False) -> DataLoader:
        edges = self._inputs(split, "edges")
        labels = getattr(self, f"input_{split}_labels")
        time = getattr(self, f"input_{split}_time")
        sampler = self.graph_sampler if train else self.eval_graph_sampler

        def make(**options) -> LinkNeighborLoader:
            cls = TrainLinkNeighborLoader if train else LinkNeighborLoader
            loader = cls(self.data, edge_label_index=edges, edge_label=labels,
                         edge_label_time=time, **options)
            if sampler is None:  # the rank's own sampler: its negatives from its generator
                loader.link_sampler.negatives_from_generator = True
            return loader

        return self._sharded(make, split,
                             lambda: get_edge_label_index(self.data, edges)[1].size(1),
                             self.loader_kwargs if train else self.eval_loader_kwargs,
                             train=train, sampler=sampler, timed=time is not None)


def prepare_graph(data, kwargs: dict) -> None:
    """Builds what every rank's sampler reads of ``data`` (its CSC per edge type, with the time
    order or weights the options ask for) once, here, cached with ``data``: under
    ``ddp_spawn`` it reaches the ranks with ``data``'s tensors, through shared memory, and no
    rank builds its own. A ``(FeatureStore, GraphStore)`` pair holds its CSC already."""
    if isinstance(data, (Data, HeteroData)):
        options, _ = split_kwargs(kwargs, NeighborSampler)
        options.pop("share_memory", None)
        NeighborSampler(data, **options, seed=0, int64_edge_permutation=False)


def fitted_epochs(trainer) -> int:
    """The epochs Lightning's fit loop has run (0 outside a fit): the epoch it passes to the
    training loader's ``set_epoch`` next. ``trainer.current_epoch`` lags it while a fit
    resumed from an epoch's end asks for its loaders."""
    fit_loop = getattr(trainer, "fit_loop", None)
    return 0 if fit_loop is None else fit_loop.epoch_progress.current.processed


def check_trainer(trainer) -> None:
    """Refuses the Lightning settings the sharded loaders cannot honour, naming them."""
    if getattr(trainer, "overfit_batches", 0):
        raise ValueError(f"Trainer(overfit_batches={trainer.overfit_batches}) re-creates the "
                         "loaders with a SequentialSampler, which pyg_mgpu's Lightning data "
                         "modules do not take: their loaders shard the seeds over the ranks "
                         "themselves. Drop overfit_batches, or limit the epoch with "
                         "limit_train_batches.")
