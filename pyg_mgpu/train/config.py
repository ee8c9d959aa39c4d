"""One typed, validated configuration for a training run (argparse lives only in the CLI).

:class:`TrainConfig` nests one dataclass per group of the CLI's flags (data, synthetic, model,
training, evaluation, ranks, performance, outputs, faults); each checks its own settings, and
the config checks the ones that span groups. Every setting is the flag of its name
(:func:`flag_of`), and :meth:`TrainConfig.from_flags` builds a config from the flags' values.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any, Optional

import torch

from pyg_mgpu.distributed.devices import BACKENDS, resolve_backend
from pyg_mgpu.errors import ArgumentError


class ConfigError(ValueError):
    """A bad option: the message names the flag, what was given and what is accepted."""


EVAL_MODES = ("rank0", "all")
SAMPLERS = ("auto", "native", "pyg")
INFERENCE_MODES = ("sampled", "layerwise")
AMP_MODES = ("none", "bf16")
# "pyg_mgpu": trimmed layers, embedding-bag mean aggregation, fused ReLU/byte dropout. "pyg":
# PyG's multi-GPU example as written (every layer on every sampled node, gather/scatter
# messages, torch dropout), kept as the benchmark baseline.
RECIPES = ("pyg_mgpu", "pyg")
# "sage": our GraphSAGE (the fast path above); gcn, gat, gin: PyG's models (nn/models.py). On a
# heterogeneous dataset: sage = SAGEConv per edge type, rgcn = R-GCN (nn/hetero.py).
HOMOGENEOUS_MODELS = ("sage", "gcn", "gat", "gin")
MODELS = HOMOGENEOUS_MODELS + ("rgcn",)
# Normalization after each hidden layer of PyG's models (--model gcn, gat, gin), and inside
# GIN's MLPs: PyG's BatchNorm (per batch in training, running statistics in evaluation) or
# LayerNorm over each node's features.
NORMS = ("none", "batch", "layer")
# Each model's own defaults for the settings its paper or PyG's example for it fixes; a flag the
# user gives always wins (TrainConfig.recipe_sources says which came from where).
MODEL_RECIPES = {
    # Our GraphSAGE: the settings the synthetic default and Cora are measured with (README).
    "sage": {"lr": 0.003, "hidden": 256, "dropout": 0.5, "weight_decay": 0.0, "heads": 8,
             "norm": "none"},
    # Kipf & Welling's GCN as PyG's examples/gcn.py trains it on Cora, but 256 hidden channels
    # instead of 16, which trained better on sampled batches (CHANGELOG, 2026-11-26).
    "gcn": {"lr": 0.01, "hidden": 256, "dropout": 0.5, "weight_decay": 5e-4, "heads": 8,
            "norm": "none"},
    # Velickovic et al.'s GAT as PyG's examples/gat.py: 8 heads of 8 channels.
    "gat": {"lr": 0.005, "hidden": 64, "dropout": 0.6, "weight_decay": 5e-4, "heads": 8,
            "norm": "none"},
    # GIN (Xu et al.) normalizes inside its MLPs (BatchNorm in the paper and PyG's
    # examples/gin.py). On Cora's small sampled batches LayerNorm per node trained best, and
    # without normalization at hidden 256 its ReLUs died (CHANGELOG, 2026-11-26).
    "gin": {"lr": 0.01, "hidden": 64, "dropout": 0.5, "weight_decay": 5e-4, "heads": 8,
            "norm": "layer"},
    # R-GCN (heterogeneous datasets only) as OGB's sampled ogbn-mag baseline trains it.
    "rgcn": {"lr": 0.01, "hidden": 64, "dropout": 0.5, "weight_decay": 0.0, "heads": 8,
             "norm": "none"},
}
RECIPE_FIELDS = ("lr", "hidden", "dropout", "weight_decay", "heads", "norm")
# Where the graph lives for the ranks: copied to /dev/shm, or left in the graph cache's files
# (mapped: the kernel may page it out, so it need not fit in RAM); auto maps when /dev/shm is
# too small for it.
FEATURES_ON = ("auto", "shm", "mmap")


# Every setting is the CLI flag of its name (``feature_cache_gb``: ``--feature-cache-gb``), but
# for these.
_FLAG_NAMES = {"timeout_s": "--timeout"}


def flag_of(name: str) -> str:
    """The CLI flag that sets the config field ``name``."""
    return _FLAG_NAMES.get(name, "--" + name.replace("_", "-"))


def in_flags(error: BaseException) -> str:
    """An error's message for a user of the CLI: library arguments named as their flags."""
    return error.naming(flag_of) if isinstance(error, ArgumentError) else str(error)


def _positive(**values) -> None:
    for name, value in values.items():
        if value is not None and value < 1:
            raise ConfigError(f"{flag_of(name)} must be a positive integer, got {value}.")


def _one_of(**values) -> None:
    """Each ``name=(value, allowed)``: value must be one of allowed."""
    for name, (value, allowed) in values.items():
        if value not in allowed:
            raise ConfigError(f"{flag_of(name)} must be one of {', '.join(allowed)}, got "
                              f"{value!r}.")


@dataclass
class DataSettings:
    """Which dataset, where, and how the ranks hold it."""
    dataset: str = "synthetic"
    root: Optional[str] = None
    cache_dir: Optional[str] = None  # None: $PYG_MGPU_CACHE/graphs or ~/.cache/pyg_mgpu/graphs
    no_cache: bool = False
    features_on: str = "auto"

    def __post_init__(self) -> None:
        _one_of(features_on=(self.features_on, FEATURES_ON))
        if self.features_on == "mmap" and self.no_cache:
            raise ConfigError("--features-on mmap maps the graph cache's files, which --no-cache "
                              "turns off; drop one of the two.")

    @property
    def is_hetero(self) -> bool:
        """Whether ``--dataset`` names a heterogeneous graph (``HeteroData``)."""
        from pyg_mgpu.data.hetero_datasets import HETERO_DATASETS
        return self.dataset.lower() in HETERO_DATASETS


@dataclass
class SyntheticSettings:
    """The size of the embedded synthetic dataset (ignored by the others)."""
    num_nodes: int = 50_000
    num_edges: int = 1_000_000
    num_features: int = 64
    num_classes: int = 16
    split_fractions: tuple[float, float, float] = (0.5, 0.1, 0.2)  # train, val, test

    def __post_init__(self) -> None:
        _positive(num_nodes=self.num_nodes, num_edges=self.num_edges,
                  num_features=self.num_features, num_classes=self.num_classes)
        self.split_fractions = tuple(float(f) for f in self.split_fractions)
        if (len(self.split_fractions) != 3 or min(self.split_fractions) <= 0
                or sum(self.split_fractions) > 1):
            raise ConfigError("--split-fractions takes three positive shares of the nodes "
                              "(train,val,test) summing to at most 1, e.g. 0.5,0.1,0.2; got "
                              f"{','.join(map(str, self.split_fractions))}.")


@dataclass
class ModelSettings:
    """The network and its optimizer. The settings left None take the model's recipe
    (:data:`MODEL_RECIPES`); :attr:`recipe_sources` says where each came from."""
    model: str = "sage"
    hidden: Optional[int] = None
    heads: Optional[int] = None  # GAT only
    dropout: Optional[float] = None
    lr: Optional[float] = None
    weight_decay: Optional[float] = None
    norm: Optional[str] = None
    recipe: str = "pyg_mgpu"
    # Filled in by __post_init__: each recipe field's source, "flag" or "recipe".
    recipe_sources: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        _one_of(model=(self.model, MODELS))
        recipe = MODEL_RECIPES[self.model]
        for name in RECIPE_FIELDS:
            if getattr(self, name) is None or self.recipe_sources.get(name) == "recipe":
                setattr(self, name, recipe[name])
                self.recipe_sources[name] = "recipe"
            else:
                self.recipe_sources[name] = "flag"
        _positive(hidden=self.hidden, heads=self.heads)
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"--dropout must lie in [0, 1), got {self.dropout}.")
        # An infinite step turns every weight into NaN at the first update.
        if not 0 < self.lr < math.inf:
            raise ConfigError(f"--lr must be a finite positive number, got {self.lr}.")
        if not 0 <= self.weight_decay < math.inf:
            raise ConfigError(f"--weight-decay must be a finite number >= 0, got "
                              f"{self.weight_decay}.")
        _one_of(recipe=(self.recipe, RECIPES), norm=(self.norm, NORMS))
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
    epochs: int = 10
    batch_size: int = 1024
    fanout: tuple[int, ...] = (25, 10)
    sampler: str = "auto"
    seed: int = 0

    def __post_init__(self) -> None:
        self.fanout = tuple(int(k) for k in self.fanout)
        _positive(epochs=self.epochs, batch_size=self.batch_size)
        if not self.fanout or any(k == 0 or k < -1 for k in self.fanout):
            raise ConfigError(f"--fanout must list one positive count per layer (or -1 for all "
                              f"neighbours), e.g. 25,10; got {','.join(map(str, self.fanout))}.")
        _one_of(sampler=(self.sampler, SAMPLERS))

    @property
    def num_layers(self) -> int:
        return len(self.fanout)


@dataclass
class EvaluationSettings:
    eval_on: str = "rank0"
    eval_every: int = 1
    eval_batch_size: Optional[int] = None
    inference: str = "sampled"

    def __post_init__(self) -> None:
        _positive(eval_every=self.eval_every, eval_batch_size=self.eval_batch_size)
        _one_of(eval_on=(self.eval_on, EVAL_MODES), inference=(self.inference, INFERENCE_MODES))


@dataclass
class RankSettings:
    """Where the ranks run and how they wait for each other."""
    devices: str = "auto"
    nprocs: Optional[int] = None
    backend: str = "auto"
    timeout_s: float = 300.0

    def __post_init__(self) -> None:
        _positive(nprocs=self.nprocs)
        _one_of(backend=(self.backend, BACKENDS))
        if self.devices.strip().lower() == "cpu":  # nccl is refused there before any rank starts
            try:
                resolve_backend(self.backend, torch.device("cpu"))
            except ArgumentError as e:
                raise ConfigError(in_flags(e)) from None
        if not 0 < self.timeout_s < math.inf:
            raise ConfigError(f"--timeout must be finite positive seconds, got {self.timeout_s}.")


GRAPH_PLACES = ("auto", "cpu", "gpu", "host")


@dataclass
class PerformanceSettings:
    amp: str = "none"
    compile: bool = False
    cuda_graph: bool = False
    graph_on: str = "auto"
    feature_cache_gb: Optional[float] = None  # None: up to a quarter of free GPU memory
    num_workers: int = 0
    prefetch: Optional[int] = None  # None: 1 ahead on GPU ranks with the native sampler, else off
    sample_batches: Optional[int] = None  # None: loaders.batches_per_walk's default
    profile: bool = False
    trace_steps: int = 0  # 0: no torch.profiler trace

    def __post_init__(self) -> None:
        _one_of(amp=(self.amp, AMP_MODES), graph_on=(self.graph_on, GRAPH_PLACES))
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
    out: Optional[str] = None
    debug: bool = False
    overwrite: bool = False  # start afresh in an --out that holds another run's checkpoint


@dataclass
class FaultSettings:
    resume: Optional[str] = None  # a run folder, or "auto": --out's checkpoint if it has one
    checkpoint_every_steps: Optional[int] = None  # also checkpoint inside epochs, every N steps
    checkpoint_every_s: Optional[float] = None  # ... or every S seconds
    grace_s: float = 30.0  # seconds the ranks have to end after a stop signal

    def __post_init__(self) -> None:
        if not 0 < self.grace_s < math.inf:
            raise ConfigError(f"--grace-s must be finite positive seconds, got {self.grace_s}.")
        if self.checkpoint_every_steps is not None and self.checkpoint_every_steps < 1:
            raise ConfigError("--checkpoint-every-steps must be a positive number of steps, "
                              f"got {self.checkpoint_every_steps}.")
        if self.checkpoint_every_s is not None and not self.checkpoint_every_s > 0:
            raise ConfigError("--checkpoint-every-s must be positive seconds, got "
                              f"{self.checkpoint_every_s}.")


@dataclass
class TrainConfig:
    """Everything a run needs, by group; each group checks itself when built, and
    ``__post_init__`` the settings that span groups. Messages name the flag."""

    data: DataSettings = field(default_factory=DataSettings)
    synthetic: SyntheticSettings = field(default_factory=SyntheticSettings)
    model: ModelSettings = field(default_factory=ModelSettings)
    training: TrainingSettings = field(default_factory=TrainingSettings)
    evaluation: EvaluationSettings = field(default_factory=EvaluationSettings)
    ranks: RankSettings = field(default_factory=RankSettings)
    performance: PerformanceSettings = field(default_factory=PerformanceSettings)
    outputs: OutputSettings = field(default_factory=OutputSettings)
    faults: FaultSettings = field(default_factory=FaultSettings)

    @classmethod
    def from_flags(cls, **values: Any) -> "TrainConfig":
        """A config from settings named as the CLI's flags (``hidden=256``, ``timeout_s=60``),
        each to its group; a name no group has is refused."""
        groups = {f.name: {} for f in fields(cls)}
        for name, value in values.items():
            group = _GROUP_OF.get(name)
            if group is None:
                raise TypeError(f"TrainConfig has no setting {name!r}.")
            groups[group][name] = value
        built = {}
        for f in fields(cls):
            built[f.name] = f.default_factory(**groups[f.name])
        return cls(**built)

    def __post_init__(self) -> None:
        if self.data.is_hetero:
            self._check_hetero()
        elif self.model.model == "rgcn":
            raise ConfigError(f"--model rgcn is for heterogeneous datasets (ogbn-mag, "
                              f"synthetic-hetero); --dataset {self.data.dataset} is homogeneous: "
                              "use sage, gcn, gat or gin.")
        if self.model.model == "gcn" and self.evaluation.inference == "layerwise":
            # GCN's normalisation reads every source's degree in the whole graph; a one-hop
            # batch of layer-wise inference (like a sampled batch) holds only its own edges.
            raise ConfigError("--inference layerwise is not exact for --model gcn (its "
                              "normalisation needs whole-graph degrees); use gat, gin or sage.")
        if self.performance.graph_on in ("gpu", "host") and self.training.sampler == "pyg":
            raise ConfigError(f"--graph-on {self.performance.graph_on} needs --sampler native: "
                              "PyG's sampler (pyg-lib, torch-sparse) samples on the CPU from the "
                              "host copy of the graph.")
        if (self.performance.sample_batches or 1) > 1 and self.training.sampler == "pyg":
            raise ConfigError(f"--sample-batches {self.performance.sample_batches} walks the "
                              "native sampler; PyG's samples one batch at a time. Drop it, or "
                              "use --sampler native.")
        if self.performance.graph_on == "host" and self.data.features_on == "mmap":
            raise ConfigError("--graph-on host pins the shared copy in memory; --features-on "
                              "mmap leaves the features in a file. Use one of them.")
        if self.performance.cuda_graph:
            self._check_cuda_graph()
        if self.faults.resume == "auto" and not self.outputs.out:
            raise ConfigError("--resume auto continues from --out's checkpoint when there is "
                              "one; give --out (the folder every restart of the job shares).")
        if self.faults.resume == "auto" and self.outputs.overwrite:
            raise ConfigError("--overwrite starts afresh in --out, --resume auto continues "
                              "from --out's checkpoint: use one of them.")

    def ignored_flags(self, device_type: str) -> list[str]:
        """Flags given that do nothing for this run: one sentence each, for a warning line."""
        ignored = []
        if self.model.recipe_sources.get("heads") == "flag" and self.model.model != "gat":
            ignored.append(f"--heads is for --model gat; --model {self.model.model} ignores it.")
        if device_type == "cpu":
            p = self.performance
            if p.graph_on in ("gpu", "host"):
                ignored.append(f"--graph-on {p.graph_on} places the graph for GPU ranks; these "
                               "ranks run on the CPU, sampling from the shared host copy.")
            if p.feature_cache_gb is not None:
                ignored.append("--feature-cache-gb caches feature rows on the GPU; these ranks "
                               "run on the CPU and ignore it.")
        return ignored

    @property
    def is_hetero(self) -> bool:
        return self.data.is_hetero

    def _check_cuda_graph(self) -> None:
        """--cuda-graph replays pyg_mgpu's trimmed GraphSAGE step at padded sizes."""
        needs = {"--model sage": self.model.model == "sage",
                 "--recipe pyg_mgpu": self.model.recipe == "pyg_mgpu",
                 "--sampler native": self.training.sampler != "pyg",
                 "a homogeneous dataset": not self.data.is_hetero}
        missing = [what for what, ok in needs.items() if not ok]
        if missing:
            raise ConfigError(f"--cuda-graph replays pyg_mgpu's own GraphSAGE step and needs "
                              f"{', '.join(missing)}; drop --cuda-graph or change those.")
        if self.performance.compile:
            raise ConfigError("--cuda-graph and --compile both rebuild the step; use one.")

    def _check_hetero(self) -> None:
        """What the heterogeneous path does not do (yet), each with its way out."""
        from pyg_mgpu.nn.hetero import HETERO_MODELS
        if self.model.model not in HETERO_MODELS:
            raise ConfigError(f"--dataset {self.data.dataset} is heterogeneous: --model must be "
                              f"one of {', '.join(HETERO_MODELS)}, got {self.model.model}.")
        refused = {"--recipe pyg": self.model.recipe == "pyg",
                   "--inference layerwise": self.evaluation.inference == "layerwise",
                   "--sampler pyg": self.training.sampler == "pyg",
                   "--graph-on gpu": self.performance.graph_on == "gpu",
                   "--graph-on host": self.performance.graph_on == "host",
                   "--sample-batches": (self.performance.sample_batches or 1) > 1,
                   "--compile": self.performance.compile,
                   "--features-on mmap": self.data.features_on == "mmap"}
        for flag, given in refused.items():
            if given:
                raise ConfigError(f"{flag} is for homogeneous datasets; --dataset "
                                  f"{self.data.dataset} is heterogeneous (its graph stays in "
                                  "shared host memory and trains with sampled evaluation): drop "
                                  f"{flag.split()[0]}.")

    # Settings a resumed run must share with the checkpoint, or it would not continue the run.
    RESUME_MUST_MATCH = ("dataset", "model", "heads", "fanout", "hidden", "batch_size", "seed",
                         "recipe", "lr", "weight_decay", "dropout", "norm", "num_nodes",
                         "num_edges", "num_features", "num_classes", "split_fractions")

    def recipe_summary(self) -> str:
        """The model's settings and where each came from, for the run's header line."""
        m = self.model
        values = ", ".join(f"{name} {getattr(m, name)}"
                           + ("" if m.recipe_sources.get(name) == "flag" else "*")
                           for name in RECIPE_FIELDS if name != "heads" or m.model == "gat")
        return f"model {m.model}: {values} (* from the {m.model} recipe)"

    def flat(self) -> dict:
        """Every setting by its flag's name (``{"hidden": 256, ...}``), as :meth:`from_flags`
        takes them."""
        return {f.name: getattr(getattr(self, group), f.name)
                for group in _GROUPS for f in fields(getattr(self, group))}

    def to_dict(self) -> dict:
        """The settings for ``metrics.json`` and checkpoints: :meth:`flat`, lists for tuples."""
        return {name: list(value) if isinstance(value, tuple) else value
                for name, value in self.flat().items()}


_GROUPS = [f.name for f in fields(TrainConfig)]
_GROUP_OF = {setting.name: group.name for group in fields(TrainConfig)
             for setting in fields(group.default_factory)}
