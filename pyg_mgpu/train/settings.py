"""A run's settings, one group per topic of the CLI's ``--help``, each setting defined once.

Every field is a flag (:func:`~pyg_mgpu.train.setting.setting`: its help, choices and type);
the CLI's parser is made from these groups, and each group checks its own values when built.
:class:`~pyg_mgpu.train.config.TrainConfig` holds one of each and checks what spans groups.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Optional

from pyg_mgpu.data import HETERO_DATASETS
from pyg_mgpu.distributed.devices import BACKENDS, backend_for
from pyg_mgpu.errors import ArgumentError
from pyg_mgpu.train.recipes import MODEL_RECIPES, MODELS, NORMS, RECIPE_FIELDS, RECIPES
from pyg_mgpu.train.setting import (ConfigError, check_choices, check_positive, in_flags, listed,
                                    setting)

EVAL_MODES = ("rank0", "all")
SAMPLERS = ("auto", "native", "pyg")
INFERENCE_MODES = ("sampled", "layerwise")
AMP_MODES = ("none", "bf16")
# torch.set_float32_matmul_precision's: strict fp32, or TF32 on GPUs.
MATMUL_PRECISIONS = ("highest", "high")
# Longer, and torch's millisecond timeouts overflow as the ranks meet (about 1e13 s).
MAX_TIMEOUT_S = 1e9
# |--seed| below this: the epochs' permutation is seeded with seed * 1_000_003 + epoch
# (pyg_mgpu.sampling.sharding), which must fit torch's 64-bit seeds.
SEED_LIMIT = 2 ** 43
# Where the graph lives for the ranks: copied to /dev/shm, or left in the graph cache's files
# (mapped: the kernel may page it out, so it need not fit in RAM); auto maps when /dev/shm is
# too small for it.
FEATURES_ON = ("auto", "shm", "mmap")
GRAPH_PLACES = ("auto", "cpu", "gpu", "host")


@dataclass
class DataSettings:
    """Which dataset, where, and how the ranks hold it."""
    TITLE = "data"
    dataset: str = setting(
        "synthetic", "synthetic, cora, citeseer, pubmed, reddit, ogbn-arxiv, ogbn-products, "
        "ogbn-papers100M, or a path to a .npz graph; heterogeneous: synthetic-hetero, ogbn-mag "
        "(the papers are classified)", same_on_resume=True)
    root: Optional[str] = setting(
        None, "folder the dataset lives in (default: ./data; ./data/reddit for reddit)")
    cache_dir: Optional[str] = setting(
        None, "where converted graphs are kept, so later runs read them instead of converting "
        "again (default: $PYG_MGPU_CACHE/graphs, else ~/.cache/pyg_mgpu/graphs)")
    no_cache: bool = setting(False, "convert the dataset on every run and keep no cache")
    features_on: str = setting(
        "auto", "shm: copy the graph to /dev/shm for the ranks; mmap: the ranks map the graph "
        "cache's files, which the kernel pages in as batches read them (for graphs larger than "
        "/dev/shm or RAM); auto: mmap when /dev/shm cannot hold the graph", choices=FEATURES_ON)

    def __post_init__(self) -> None:
        check_choices(self)
        if self.features_on == "mmap" and self.no_cache:
            raise ConfigError("--features-on mmap maps the graph cache's files, which --no-cache "
                              "turns off; drop one of the two.")

    def make_paths_absolute(self) -> None:
        """``root``, ``cache_dir`` and a ``.npz`` dataset as absolute paths: what the run
        records then names the same files from any folder (``python -m pyg_mgpu.predict``
        started elsewhere, ``--resume`` from another working directory)."""
        if self.root is not None:
            self.root = os.path.abspath(self.root)
        if self.cache_dir is not None:
            self.cache_dir = os.path.abspath(os.path.expanduser(self.cache_dir))
        if self.dataset.endswith(".npz"):
            self.dataset = os.path.abspath(self.dataset)

    @property
    def is_hetero(self) -> bool:
        """Whether ``--dataset`` names a heterogeneous graph (``HeteroData``)."""
        return self.dataset.lower() in HETERO_DATASETS


@dataclass
class SyntheticSettings:
    """The size of the embedded synthetic dataset (ignored by the others)."""
    TITLE = "synthetic dataset (--dataset synthetic)"
    num_nodes: int = setting(50_000, "nodes of the synthetic graph", same_on_resume=True)
    num_edges: int = setting(1_000_000, "directed edges of the synthetic graph",
                             same_on_resume=True)
    num_features: int = setting(64, "features per node of the synthetic graph",
                                same_on_resume=True)
    num_classes: int = setting(16, "classes of the synthetic graph", same_on_resume=True)
    split_fractions: tuple[float, float, float] = setting(
        (0.5, 0.1, 0.2), "shares of the nodes in the train,val,test splits (the training share "
        "sets an epoch's length)", same_on_resume=True)

    def __post_init__(self) -> None:
        check_positive(num_nodes=self.num_nodes, num_edges=self.num_edges,
                       num_features=self.num_features, num_classes=self.num_classes)
        self.split_fractions = listed(self.split_fractions, "split_fractions", float,
                                      "0.5,0.1,0.2")
        if (len(self.split_fractions) != 3 or not all(0 < f <= 1 for f in self.split_fractions)
                or sum(self.split_fractions) > 1):  # (NaN fails every comparison)
            raise ConfigError("--split-fractions takes three positive shares of the nodes "
                              "(train,val,test) summing to at most 1, e.g. 0.5,0.1,0.2; got "
                              f"{','.join(map(str, self.split_fractions))}.")


def _recipes_note() -> str:
    return ("--hidden, --heads, --dropout, --lr, --weight-decay and --norm default to the chosen "
            "--model's recipe (its paper's, or PyG's example for it): "
            + "; ".join(f"{name}: " + ", ".join(f"{k} {v}" for k, v in recipe.items()
                                                if k != "heads" or name == "gat")
                        for name, recipe in MODEL_RECIPES.items())
            + ". A flag given overrides its recipe value")


@dataclass
class ModelSettings:
    """The network and its optimizer. The settings left None take the model's recipe
    (:data:`~pyg_mgpu.train.recipes.MODEL_RECIPES`); :attr:`recipe_sources` says where each
    came from."""
    TITLE = "model"
    NOTE = _recipes_note()
    model: str = setting(
        "sage", "sage = our GraphSAGE (trimmed layers, fused kernels); gcn, gat, gin = PyG's "
        "GCN, GAT, GIN models, trimmed per layer with PyG's per-hop counts. Heterogeneous "
        "datasets: sage = a SAGEConv per edge type (PyG's to_hetero GraphSAGE), rgcn = R-GCN",
        choices=MODELS, same_on_resume=True)
    hidden: Optional[int] = setting(
        None, "width of every hidden layer (GAT: all heads together)", type=int,
        from_recipe=True, same_on_resume=True)
    heads: Optional[int] = setting(
        None, "--model gat: attention heads per layer; hidden layers concatenate them (--hidden "
        "/ --heads channels each), the output layer averages them (the example's has one head)",
        type=int, from_recipe=True, same_on_resume=True)
    dropout: Optional[float] = setting(
        None, "dropout probability after each hidden layer", type=float, from_recipe=True,
        same_on_resume=True)
    lr: Optional[float] = setting(None, "Adam's learning rate", type=float, from_recipe=True,
                                  same_on_resume=True)
    weight_decay: Optional[float] = setting(None, "Adam's L2 penalty", type=float,
                                            from_recipe=True, same_on_resume=True)
    norm: Optional[str] = setting(
        None, "PyG's models: normalization after each hidden layer and in GIN's MLPs; batch = "
        "BatchNorm (batch statistics in training, running statistics in evaluation), layer = "
        "LayerNorm per node", choices=NORMS, from_recipe=True, same_on_resume=True)
    recipe: str = setting(
        "pyg_mgpu", "pyg = PyG's example model as written (untrimmed), the benchmark baseline",
        choices=RECIPES, same_on_resume=True)
    # Filled in by __post_init__: each recipe field's source, "flag" or "recipe".
    recipe_sources: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_choices(self, "model")
        recipe = MODEL_RECIPES[self.model]
        for name in RECIPE_FIELDS:
            if getattr(self, name) is None or self.recipe_sources.get(name) == "recipe":
                setattr(self, name, recipe[name])
                self.recipe_sources[name] = "recipe"
            else:
                self.recipe_sources[name] = "flag"
        check_positive(hidden=self.hidden, heads=self.heads)
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"--dropout must lie in [0, 1), got {self.dropout}.")
        # An infinite step turns every weight into NaN at the first update.
        if not 0 < self.lr < math.inf:
            raise ConfigError(f"--lr must be a finite positive number, got {self.lr}.")
        if not 0 <= self.weight_decay < math.inf:
            raise ConfigError(f"--weight-decay must be a finite number >= 0, got "
                              f"{self.weight_decay}.")
        check_choices(self)
        if self.model == "gat" and self.hidden % self.heads:
            raise ConfigError(f"--hidden {self.hidden} is not divisible by --heads {self.heads}: "
                              "PyG's GAT splits each hidden layer's channels over its heads; "
                              "choose a multiple of --heads.")
        if self.model in ("sage", "rgcn") and self.norm != "none":
            raise ConfigError(f"--norm {self.norm} is for PyG's models (--model gcn, gat, gin); "
                              f"--model {self.model} has no normalization layers.")
        if self.model not in ("sage", "rgcn") and self.recipe == "pyg":
            raise ConfigError(f"--recipe pyg is PyG's GraphSAGE example as written and runs "
                              f"--model sage only, got --model {self.model}.")


@dataclass
class TrainingSettings:
    TITLE = "training"
    epochs: int = setting(10, "passes over the training nodes")
    batch_size: int = setting(1024, "seed nodes per batch on each rank", same_on_resume=True)
    fanout: tuple[int, ...] = setting(
        (25, 10), "neighbours per layer, e.g. 25,10 (-1 = all); sets the layer count",
        same_on_resume=True)
    sampler: str = setting("auto", "native = pyg_mgpu's vectorized sampler; pyg = PyG's (needs "
                           "pyg-lib or torch-sparse); auto = native", choices=SAMPLERS)
    seed: int = setting(0, "seeds the synthetic graph, the model, the epochs' shuffles and the "
                        "sampling", same_on_resume=True)

    def __post_init__(self) -> None:
        self.fanout = listed(self.fanout, "fanout", int, "25,10")
        check_positive(epochs=self.epochs, batch_size=self.batch_size)
        if not -SEED_LIMIT < self.seed < SEED_LIMIT:
            raise ConfigError(f"--seed must lie between -2**43 and 2**43 (the seeds derived from "
                              f"it must fit 64 bits), got {self.seed}.")
        if not self.fanout or any(k == 0 or k < -1 for k in self.fanout):
            raise ConfigError(f"--fanout must list one positive count per layer (or -1 for all "
                              f"neighbours), e.g. 25,10; got {','.join(map(str, self.fanout))}.")
        check_choices(self)

    @property
    def num_layers(self) -> int:
        return len(self.fanout)


@dataclass
class EvaluationSettings:
    TITLE = "evaluation"
    eval_on: str = setting("rank0", "rank0 = rank 0 validates while the others wait; all = "
                           "every rank validates its shard and the counts are summed",
                           choices=EVAL_MODES)
    eval_every: int = setting(1, "validate every N epochs (and after the last)")
    eval_batch_size: Optional[int] = setting(None, "defaults to --batch-size", type=int)
    inference: str = setting("sampled", "layerwise: also evaluate the best model exactly (all "
                             "neighbours, layer by layer over all nodes: sharded across ranks "
                             "for sage, on rank 0 for PyG's models, the others waiting as long "
                             "as it takes)", choices=INFERENCE_MODES)

    def __post_init__(self) -> None:
        check_positive(eval_every=self.eval_every, eval_batch_size=self.eval_batch_size)
        check_choices(self)


@dataclass
class RankSettings:
    """Where the ranks run and how they wait for each other."""
    TITLE = "devices and ranks"
    devices: str = setting("auto", "auto, cpu, cuda or cuda:0,1,... (cuda:0,0: two ranks on GPU "
                           "0, with --backend gloo)")
    nprocs: Optional[int] = setting(
        None, "number of ranks (CPU ranks default to 2; more CPU ranks than cores train no "
        "faster and get a warning with the memory they take; more than 4 per core are refused)",
        type=int)
    backend: str = setting("auto", "process-group backend: auto = NCCL on GPU ranks, gloo on CPU "
                           "ranks; gloo on GPUs lets several ranks share one GPU (NCCL refuses "
                           "that), for testing multi-rank logic on one GPU", choices=BACKENDS)
    timeout_s: float = setting(300.0, "seconds a collective may wait for a peer before the job "
                               "fails")

    def __post_init__(self) -> None:
        check_positive(nprocs=self.nprocs)
        check_choices(self)
        if self.devices.strip().lower() == "cpu":  # nccl is refused there before any rank starts
            try:
                backend_for(self.backend, "cpu")
            except ArgumentError as e:
                raise ConfigError(in_flags(e)) from None
        if not 0 < self.timeout_s <= MAX_TIMEOUT_S:
            raise ConfigError(f"--timeout must be finite positive seconds, at most "
                              f"{MAX_TIMEOUT_S:.0e} (31 years), got {self.timeout_s}.")


@dataclass
class PerformanceSettings:
    TITLE = "performance"
    amp: str = setting("none", "bf16 autocast for the model, features stored in bf16 (CPU with "
                       "AVX512-BF16/AMX, or GPU)", choices=AMP_MODES, same_on_resume=True)
    matmul_precision: str = setting(
        "highest", "float32 matmuls: highest = strict fp32; high = TF32 on NVIDIA GPUs (Ampere "
        "and later: fp32 range, a 10-bit mantissa, several times the fp32 matmul rate). CPUs "
        "keep fp32 accuracy with either (oneDNN may pick another fp32 kernel, so the last bits "
        "can differ). Sets torch.set_float32_matmul_precision on every rank",
        choices=MATMUL_PRECISIONS)
    compile: bool = setting(False, "torch.compile the model (dynamic shapes; inductor fuses "
                            "ReLU and dropout itself); meant for GPUs")
    cuda_graph: bool = setting(
        False, "replay each step's forward and backward from a CUDA graph, every hop's nodes and "
        "edges padded to a few sizes (our GraphSAGE, homogeneous data; CPU ranks run the padded "
        "step without a graph)")
    graph_on: str = setting(
        "auto", "where GPU ranks keep graph and features: gpu = a copy on each GPU; cpu = the "
        "shared host copy, sampled on the CPU; host = the shared host copy pinned once, sampled "
        "and gathered by every GPU in place (zero-copy); auto = gpu if it fits in half the free "
        "memory, else host (cpu where --features-on mmap leaves the features in a file)",
        choices=GRAPH_PLACES)
    feature_cache_gb: Optional[float] = setting(
        None, "GPU ranks with the graph in host memory cache the most-sampled feature rows on "
        "the GPU, up to this size; default: up to a quarter of the free GPU memory; 0 turns it "
        "off", type=float)
    num_workers: int = setting(0, "DataLoader worker processes per rank for sampling")
    prefetch: Optional[int] = setting(
        None, "batches a background thread prepares ahead of training (sampling, gathering, the "
        "copy to the GPU on a side stream); 0 turns it off. Default: 1 on GPU ranks with the "
        "native sampler, else 0", type=int)
    sample_batches: Optional[int] = setting(
        None, "batches the native sampler draws in one walk, each still its own batch: one "
        "walk's kernel launches and host reads for K batches. Default: 8 where the sampler runs "
        "on the GPU, or on the CPU with --batch-size 64 or less, else 1 (on the CPU larger "
        "batches sample faster one at a time)", type=int, metavar="K")
    fused_aggregation: bool = setting(
        False, "GPU ranks: our GraphSAGE takes its neighbour means with fused Triton kernels "
        "(rows summed per destination, gradients added by atomics, no sort) instead of "
        "embedding_bag; off until measured faster (needs the triton package)")
    profile: bool = setting(False, "print per-stage times per epoch")
    trace_steps: int = setting(
        0, "rank 0 runs N steps of the last epoch (after 10 warm-up steps) under torch.profiler: "
        "kernels.csv (ops and kernels by their own device and host time) and trace.json (Chrome "
        "trace) in --out; 0 traces nothing", metavar="N")

    def __post_init__(self) -> None:
        check_choices(self)
        if self.trace_steps < 0:
            raise ConfigError(f"--trace-steps must be >= 0 (0: no trace), got {self.trace_steps}.")
        if self.num_workers < 0:
            raise ConfigError(f"--num-workers must be >= 0, got {self.num_workers}.")
        if self.feature_cache_gb is not None and not self.feature_cache_gb >= 0:
            raise ConfigError(f"--feature-cache-gb must be >= 0 (0 turns the cache off), got "
                              f"{self.feature_cache_gb}.")
        if self.prefetch is not None and self.prefetch < 0:
            raise ConfigError(f"--prefetch must be >= 0 (0 turns it off), got {self.prefetch}.")
        if self.sample_batches is not None and self.sample_batches < 1:
            raise ConfigError("--sample-batches must be a positive number of batches per walk, "
                              f"got {self.sample_batches}.")


@dataclass
class OutputSettings:
    TITLE = "outputs"
    out: Optional[str] = setting(None, "output folder (default: runs/<timestamp>)")
    overwrite: bool = setting(False, "start afresh in an --out that holds another run's "
                              "checkpoint.pt, deleting it (without this, or --resume, such a "
                              "run is refused)")
    debug: bool = setting(False, "show full tracebacks")


@dataclass
class FaultSettings:
    TITLE = "faults, stops and resume"
    resume: Optional[str] = setting(
        None, "continue the run whose checkpoint.pt is in RUN_DIR (writes there too unless --out "
        "is given), at the epoch or step it was taken; 'auto': continue from --out's checkpoint "
        "if there is one, else start afresh (for torchrun --max-restarts and requeued batch "
        "jobs)", metavar="RUN_DIR")
    checkpoint_every_steps: Optional[int] = setting(
        None, "also write checkpoint.pt inside epochs, every N training steps (only the newest "
        "is kept)", type=int, metavar="N")
    checkpoint_every_s: Optional[float] = setting(
        None, "also write checkpoint.pt inside epochs, every S seconds", type=float, metavar="S")
    grace_s: float = setting(30.0, "after SIGTERM, SIGINT or SIGHUP the ranks finish their step, "
                             "write a checkpoint and exit; a rank still running this many "
                             "seconds later is killed")

    def __post_init__(self) -> None:
        if not 0 < self.grace_s < math.inf:
            raise ConfigError(f"--grace-s must be finite positive seconds, got {self.grace_s}.")
        if self.checkpoint_every_steps is not None and self.checkpoint_every_steps < 1:
            raise ConfigError("--checkpoint-every-steps must be a positive number of steps, "
                              f"got {self.checkpoint_every_steps}.")
        if self.checkpoint_every_s is not None and not self.checkpoint_every_s > 0:
            raise ConfigError("--checkpoint-every-s must be positive seconds, got "
                              f"{self.checkpoint_every_s}.")
