"""The graph a run's config names: the one place the launchers and the DGL comparison turn a
:class:`~pyg_mgpu.train.config.TrainConfig` into a dataset, and the checks every launcher makes
of it (:func:`load_checked`)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Optional

import torch

from pyg_mgpu.data.cache import default_cache_dir
from pyg_mgpu.data.datasets import load_graph
from pyg_mgpu.data.fingerprint import data_fingerprint
from pyg_mgpu.data.graph import ConvertedGraph
from pyg_mgpu.data.hetero_datasets import load_hetero_graph
from pyg_mgpu.data.synthetic import SyntheticSpec
from pyg_mgpu.sampling.sharding import check_shardable
from pyg_mgpu.train.checkpoint import check_same_data
from pyg_mgpu.train.config import TrainConfig

if TYPE_CHECKING:
    from pyg_mgpu.data.hetero_graph import HeteroGraph


def load_configured(cfg: TrainConfig, *, for_training: bool = True,
                    placement: Optional[str] = None) -> ConvertedGraph | HeteroGraph:
    """The dataset a run's config names (dataset, root, seed, the synthetic size and the cache
    settings). A heterogeneous dataset
    (:data:`~pyg_mgpu.data.HETERO_DATASETS`) comes as a
    :class:`~pyg_mgpu.data.hetero_graph.HeteroGraph`, read without the converted-graph cache.

    ``for_training`` applies the run's storage choices (bf16 features with ``--amp bf16``;
    otherwise float32, or the stored half precision kept); exports for other tools (the DGL
    comparison) leave it off and get the dataset as read.
    ``placement`` overrides ``--features-on`` (see :data:`pyg_mgpu.data.cache.PLACEMENTS`).
    """
    if cfg.is_hetero:
        return load_hetero_graph(cfg.data.dataset, cfg.data.root, seed=cfg.training.seed)
    spec = SyntheticSpec(num_nodes=cfg.synthetic.num_nodes, num_edges=cfg.synthetic.num_edges,
                         num_features=cfg.synthetic.num_features, num_classes=cfg.synthetic.num_classes,
                         train_fraction=cfg.synthetic.split_fractions[0],
                         val_fraction=cfg.synthetic.split_fractions[1],
                         test_fraction=cfg.synthetic.split_fractions[2])
    # The bf16 model reads its first layer's inputs in bf16 anyway (autocast rounds the
    # neighbour mean and the node's own row): stored so, the features take half the shared
    # memory and every batch gathers half the bytes (torch accumulates the mean in float32).
    bf16 = for_training and cfg.performance.amp == "bf16"
    if placement is None and not cfg.data.no_cache and cfg.data.features_on != "auto":
        placement = cfg.data.features_on  # shm or mmap; auto stays None
    return load_graph(cfg.data.dataset, cfg.data.root, seed=cfg.training.seed, synthetic=spec,
                      feature_dtype=torch.bfloat16 if bf16 else None,
                      cache_dir=None if cfg.data.no_cache else (cfg.data.cache_dir or default_cache_dir()),
                      placement=placement, log=lambda line: print(line, flush=True))


def load_checked(cfg: TrainConfig, world_size: int, resumed: Optional[dict],
                 load: Callable[[TrainConfig], object] = load_configured):
    """The run's graph (``load``: how this process gets it) and its fingerprint, checked: its
    training nodes shard over ``world_size`` ranks, and a resumed run (``resumed``: the
    checkpoint) continues on the data it was trained on."""
    graph = load(cfg)
    check_shardable(graph.train_idx.numel(), world_size, cfg.training.batch_size)
    fingerprint = data_fingerprint(graph.tensors())
    if resumed is not None:
        check_same_data(resumed, fingerprint, cfg.faults.resume, graph.tensors())
    return graph, fingerprint


def run_header(graph, cfg: TrainConfig, load_s: float, ranks: str) -> str:
    """The lines a run starts with: the data, how long it took to load, the ranks, the model."""
    return (f"{graph.summary()} | loaded in {load_s:.1f}s | {ranks}\n"
            f"{cfg.recipe_summary()}")
