"""One typed, validated configuration for a training run (argparse lives only in the CLI)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Optional

from pyg_mgpu.errors import ArgumentError


class ConfigError(ValueError):
    """A bad option: the message names the flag, what was given and what is accepted."""


EVAL_MODES = ("rank0", "all")
SAMPLERS = ("auto", "native", "pyg")
INFERENCE_MODES = ("sampled", "layerwise")
AMP_MODES = ("none", "bf16")
# auto: NCCL on GPU ranks, gloo on CPU ranks; gloo on GPUs lets ranks share one GPU.
BACKENDS = ("auto", "nccl", "gloo")
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
    # instead of 16: on sampled batches (README's Cora command, seeds 0-2) 16 gave test
    # 0.786 / 0.810 / 0.802, 256 gave 0.807 / 0.813 / 0.821.
    "gcn": {"lr": 0.01, "hidden": 256, "dropout": 0.5, "weight_decay": 5e-4, "heads": 8,
            "norm": "none"},
    # Velickovic et al.'s GAT as PyG's examples/gat.py: 8 heads of 8 channels.
    "gat": {"lr": 0.005, "hidden": 64, "dropout": 0.6, "weight_decay": 5e-4, "heads": 8,
            "norm": "none"},
    # GIN (Xu et al.) normalizes inside its MLPs (BatchNorm in the paper and PyG's
    # examples/gin.py). On Cora's sampled batches (~35 seeds) LayerNorm per node did best:
    # seed 0, test 0.791 against 0.742 with BatchNorm and 0.745 with none (README's command);
    # at hidden 256 without normalization its ReLUs died and it predicted one class (0.319).
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
# Fields that are no flag: run facts kept with the settings.
NOT_FLAGS = ("extra", "recipe_sources")


def flag_of(name: str) -> str:
    """The CLI flag that sets the config field ``name``."""
    return _FLAG_NAMES.get(name, "--" + name.replace("_", "-"))


def in_flags(error: BaseException) -> str:
    """An error's message for a user of the CLI: library arguments named as their flags."""
    return error.naming(flag_of) if isinstance(error, ArgumentError) else str(error)


@dataclass
class TrainConfig:
    """Everything a run needs; ``__post_init__`` rejects bad values with a message naming the flag."""

    dataset: str = "synthetic"
    root: Optional[str] = None
    devices: str = "auto"
    nprocs: Optional[int] = None
    backend: str = "auto"
    epochs: int = 10
    batch_size: int = 1024
    fanout: tuple[int, ...] = (25, 10)
    model: str = "sage"
    # None: the model's recipe value (MODEL_RECIPES).
    hidden: Optional[int] = None
    heads: Optional[int] = None  # GAT only
    dropout: Optional[float] = None
    lr: Optional[float] = None
    weight_decay: Optional[float] = None
    norm: Optional[str] = None
    seed: int = 0
    eval_on: str = "rank0"
    eval_every: int = 1
    eval_batch_size: Optional[int] = None
    out: Optional[str] = None
    sampler: str = "auto"
    num_workers: int = 0
    prefetch: Optional[int] = None  # None: 1 ahead on GPU ranks with the native sampler, else off
    timeout_s: float = 300.0
    amp: str = "none"
    compile: bool = False
    graph_on: str = "auto"
    feature_cache_gb: Optional[float] = None  # None: up to a quarter of free GPU memory
    inference: str = "sampled"
    resume: Optional[str] = None  # a run folder, or "auto": --out's checkpoint if it has one
    grace_s: float = 30.0  # seconds the ranks have to end after a stop signal
    checkpoint_every_steps: Optional[int] = None  # also checkpoint inside epochs, every N steps
    checkpoint_every_s: Optional[float] = None  # ... or every S seconds
    recipe: str = "pyg_mgpu"
    profile: bool = False
    debug: bool = False
    cache_dir: Optional[str] = None  # None: $PYG_MGPU_CACHE/graphs or ~/.cache/pyg_mgpu/graphs
    no_cache: bool = False
    features_on: str = "auto"
    # Size of the embedded synthetic dataset (ignored by the others).
    num_nodes: int = 50_000
    num_edges: int = 1_000_000
    num_features: int = 64
    num_classes: int = 16
    split_fractions: tuple[float, float, float] = (0.5, 0.1, 0.2)  # train, val, test
    extra: dict = field(default_factory=dict)
    # Filled in by __post_init__: each recipe field's source, "flag" or "recipe".
    recipe_sources: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.model not in MODELS:
            raise ConfigError(f"--model must be one of {', '.join(MODELS)}, got {self.model!r}.")
        if self.model in MODEL_RECIPES:
            recipe = MODEL_RECIPES[self.model]
            for name in RECIPE_FIELDS:
                if getattr(self, name) is None or self.recipe_sources.get(name) == "recipe":
                    setattr(self, name, recipe[name])
                    self.recipe_sources[name] = "recipe"
                else:
                    self.recipe_sources[name] = "flag"
        self.fanout = tuple(int(k) for k in self.fanout)
        positive = {"--epochs": self.epochs, "--batch-size": self.batch_size,
                    "--hidden": self.hidden, "--heads": self.heads,
                    "--eval-every": self.eval_every,
                    "--num-nodes": self.num_nodes, "--num-edges": self.num_edges,
                    "--num-features": self.num_features, "--num-classes": self.num_classes}
        if self.eval_batch_size is not None:
            positive["--eval-batch-size"] = self.eval_batch_size
        if self.nprocs is not None:
            positive["--nprocs"] = self.nprocs
        for flag, value in positive.items():
            if value < 1:
                raise ConfigError(f"{flag} must be a positive integer, got {value}.")
        if not self.fanout or any(k == 0 or k < -1 for k in self.fanout):
            raise ConfigError(f"--fanout must list one positive count per layer (or -1 for all "
                              f"neighbours), e.g. 25,10; got {','.join(map(str, self.fanout))}.")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"--dropout must lie in [0, 1), got {self.dropout}.")
        if not self.lr > 0:
            raise ConfigError(f"--lr must be positive, got {self.lr}.")
        if not self.weight_decay >= 0:
            raise ConfigError(f"--weight-decay must be >= 0, got {self.weight_decay}.")
        choices = {"--eval-on": (self.eval_on, EVAL_MODES), "--sampler": (self.sampler, SAMPLERS),
                   "--amp": (self.amp, AMP_MODES), "--inference": (self.inference, INFERENCE_MODES),
                   "--backend": (self.backend, BACKENDS), "--recipe": (self.recipe, RECIPES),
                   "--model": (self.model, MODELS), "--norm": (self.norm, NORMS),
                   "--features-on": (self.features_on, FEATURES_ON)}
        for flag, (value, allowed) in choices.items():
            if value not in allowed:
                raise ConfigError(f"{flag} must be one of {', '.join(allowed)}, got {value!r}.")
        if self.features_on == "mmap" and self.no_cache:
            raise ConfigError("--features-on mmap maps the graph cache's files, which --no-cache "
                              "turns off; drop one of the two.")
        self.split_fractions = tuple(float(f) for f in self.split_fractions)
        if (len(self.split_fractions) != 3 or min(self.split_fractions) <= 0
                or sum(self.split_fractions) > 1):
            raise ConfigError("--split-fractions takes three positive shares of the nodes "
                              "(train,val,test) summing to at most 1, e.g. 0.5,0.1,0.2; got "
                              f"{','.join(map(str, self.split_fractions))}.")
        if self.backend == "nccl" and self.devices.strip().lower() == "cpu":
            raise ConfigError("--backend nccl needs GPU ranks (--devices cuda...); CPU ranks "
                              "use gloo (--backend auto or gloo).")
        if self.graph_on not in ("auto", "cpu", "gpu"):
            raise ConfigError(f"--graph-on must be auto, cpu or gpu, got {self.graph_on!r}.")
        if self.graph_on == "gpu" and self.sampler == "pyg":
            raise ConfigError("--graph-on gpu needs --sampler native: PyG's sampler (pyg-lib, "
                              "torch-sparse) samples on the CPU from the host copy of the graph.")
        self._check_model()
        if self.num_workers < 0:
            raise ConfigError(f"--num-workers must be >= 0, got {self.num_workers}.")
        if self.feature_cache_gb is not None and not self.feature_cache_gb >= 0:
            raise ConfigError(f"--feature-cache-gb must be >= 0 (0 turns the cache off), got "
                              f"{self.feature_cache_gb}.")
        if self.prefetch is not None and self.prefetch < 0:
            raise ConfigError(f"--prefetch must be >= 0 (0 turns it off), got {self.prefetch}.")
        if not self.timeout_s > 0:
            raise ConfigError(f"--timeout must be positive seconds, got {self.timeout_s}.")
        if not self.grace_s > 0:
            raise ConfigError(f"--grace-s must be positive seconds, got {self.grace_s}.")
        if self.checkpoint_every_steps is not None and self.checkpoint_every_steps < 1:
            raise ConfigError("--checkpoint-every-steps must be a positive number of steps, "
                              f"got {self.checkpoint_every_steps}.")
        if self.checkpoint_every_s is not None and not self.checkpoint_every_s > 0:
            raise ConfigError("--checkpoint-every-s must be positive seconds, got "
                              f"{self.checkpoint_every_s}.")
        if self.resume == "auto" and not self.out:
            raise ConfigError("--resume auto continues from --out's checkpoint when there is "
                              "one; give --out (the folder every restart of the job shares).")

    @property
    def is_hetero(self) -> bool:
        """Whether ``--dataset`` names a heterogeneous graph (``HeteroData``)."""
        from pyg_mgpu.data.hetero_datasets import HETERO_DATASETS
        return self.dataset.lower() in HETERO_DATASETS

    def _check_hetero(self) -> None:
        """What the heterogeneous path does not do (yet), each with its way out."""
        from pyg_mgpu.nn.hetero import HETERO_MODELS
        if self.model not in HETERO_MODELS:
            raise ConfigError(f"--dataset {self.dataset} is heterogeneous: --model must be one "
                              f"of {', '.join(HETERO_MODELS)}, got {self.model}.")
        refused = {"--recipe pyg": self.recipe == "pyg",
                   "--inference layerwise": self.inference == "layerwise",
                   "--sampler pyg": self.sampler == "pyg",
                   "--graph-on gpu": self.graph_on == "gpu",
                   "--compile": self.compile,
                   "--features-on mmap": self.features_on == "mmap"}
        for flag, given in refused.items():
            if given:
                raise ConfigError(f"{flag} is for homogeneous datasets; --dataset "
                                  f"{self.dataset} is heterogeneous (its graph stays in shared "
                                  "host memory and trains with sampled evaluation): drop "
                                  f"{flag.split()[0]}.")

    def _check_model(self) -> None:
        """The options that work with one model only."""
        if self.is_hetero:
            self._check_hetero()
        elif self.model == "rgcn":
            raise ConfigError(f"--model rgcn is for heterogeneous datasets (ogbn-mag, "
                              f"synthetic-hetero); --dataset {self.dataset} is homogeneous: use "
                              "sage, gcn, gat or gin.")
        if self.model == "gat" and self.hidden % self.heads:
            raise ConfigError(f"--hidden {self.hidden} is not divisible by --heads {self.heads}: "
                              "PyG's GAT splits each hidden layer's channels over its heads; "
                              "choose a multiple of --heads.")
        if self.model in ("sage", "rgcn"):
            if self.norm != "none":
                raise ConfigError(f"--norm {self.norm} is for PyG's models (--model gcn, gat, "
                                  f"gin); --model {self.model} has no normalization layers.")
            return
        if self.recipe == "pyg":
            raise ConfigError(f"--recipe pyg is PyG's GraphSAGE example as written and runs "
                              f"--model sage only, got --model {self.model}.")
        if self.model == "gcn" and self.inference == "layerwise":
            # GCN's normalisation reads every source's degree in the whole graph; a one-hop
            # batch of layer-wise inference (like a sampled batch) holds only its own edges.
            raise ConfigError("--inference layerwise is not exact for --model gcn (its "
                              "normalisation needs whole-graph degrees); use gat, gin or sage.")

    @property
    def num_layers(self) -> int:
        return len(self.fanout)

    # Fields a resumed run must share with the checkpoint, or it would not continue the same run.
    RESUME_MUST_MATCH = ("dataset", "model", "heads", "fanout", "hidden", "batch_size", "seed",
                         "recipe", "lr", "weight_decay", "dropout", "norm", "num_nodes",
                         "num_edges", "num_features", "num_classes", "split_fractions")

    def recipe_summary(self) -> str:
        """The model's settings and where each came from, for the run's header line."""
        values = ", ".join(f"{name} {getattr(self, name)}"
                           + ("" if self.recipe_sources.get(name) == "flag" else "*")
                           for name in RECIPE_FIELDS
                           if name != "heads" or self.model == "gat")
        return f"model {self.model}: {values} (* from the {self.model} recipe)"

    def to_dict(self) -> dict:
        d = asdict(self)
        d["fanout"] = list(self.fanout)
        return d
