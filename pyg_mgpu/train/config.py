"""One typed, validated configuration for a training run (argparse lives only in the CLI).

:class:`TrainConfig` nests one settings group per topic of the CLI's flags (data, synthetic,
model, training, evaluation, ranks, performance, outputs, faults: :mod:`pyg_mgpu.train.settings`,
where each setting is defined once, with its flag); each group checks its own settings, and the
config checks the ones that span groups. :meth:`TrainConfig.from_flags` builds a config from the
flags' values.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from pyg_mgpu.distributed.devices import BACKENDS
from pyg_mgpu.files import same_folder
from pyg_mgpu.nn import HETERO_MODELS
from pyg_mgpu.train.recipes import (HOMOGENEOUS_MODELS, MODEL_RECIPES, MODELS, NORMS,
                                    RECIPE_FIELDS, RECIPES)
from pyg_mgpu.train.setting import ConfigError, flag_fields, flag_of, in_flags
from pyg_mgpu.train.settings import (AMP_MODES, EVAL_MODES, FEATURES_ON, GRAPH_PLACES,
                                     INFERENCE_MODES, SAMPLERS, DataSettings,
                                     EvaluationSettings, FaultSettings, ModelSettings,
                                     OutputSettings, PerformanceSettings, RankSettings,
                                     SyntheticSettings, TrainingSettings)

__all__ = ["TrainConfig", "ConfigError", "flag_of", "in_flags", "BACKENDS", "MODELS",
           "HOMOGENEOUS_MODELS", "MODEL_RECIPES", "RECIPE_FIELDS", "RECIPES", "NORMS",
           "AMP_MODES", "EVAL_MODES", "FEATURES_ON", "GRAPH_PLACES", "INFERENCE_MODES",
           "SAMPLERS"]


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
        resume, out = self.faults.resume, self.outputs.out
        if (self.outputs.overwrite and resume not in (None, "auto")
                and (not out or same_folder(out, resume))):
            raise ConfigError(f"--overwrite starts afresh, --resume {resume} continues its "
                              "checkpoint in that same folder: use one of them (with --out "
                              "another folder, --overwrite lets the resumed run replace a "
                              "checkpoint there).")

    def ignored_flags(self, device_type: str) -> list[str]:
        """Flags given that do nothing for this run: one sentence each, for a warning line."""
        ignored = []
        if self.model.recipe_sources.get("heads") == "flag" and self.model.model != "gat":
            ignored.append(f"--heads is for --model gat; --model {self.model.model} ignores it.")
        not_ours = {"--model " + self.model.model: self.model.model != "sage",
                    "--recipe pyg": self.model.recipe == "pyg",
                    f"--dataset {self.data.dataset} (heterogeneous)": self.data.is_hetero}
        not_ours = [flag for flag, given in not_ours.items() if given]
        if self.performance.fused_aggregation and not_ours:
            ignored.append("--fused-aggregation runs in pyg_mgpu's own GraphSAGE on homogeneous "
                           f"graphs; {' and '.join(not_ours)} ignores it.")
        elif device_type == "cpu" and self.performance.fused_aggregation:
            ignored.append("--fused-aggregation runs Triton kernels on GPUs; these ranks run "
                           "on the CPU and aggregate with embedding_bag.")
        if self.data.dataset.lower() != "synthetic":
            sized = [flag_of(f.name) for f in flag_fields(self.synthetic)
                     if _differs(getattr(self.synthetic, f.name), f.default)]
            one = len(sized) == 1
            if sized:
                ignored.append(f"{', '.join(sized)} {'sizes' if one else 'size'} the embedded "
                               f"synthetic graph (--dataset synthetic); --dataset "
                               f"{self.data.dataset} ignores {'it' if one else 'them'}.")
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
# Settings a resumed run must share with the checkpoint, or it would not continue the run.
TrainConfig.RESUME_MUST_MATCH = tuple(
    f.name for group in fields(TrainConfig) for f in flag_fields(group.default_factory)
    if f.metadata["same_on_resume"])


def _differs(value: Any, default: Any) -> bool:
    """Whether a setting was given another value than its default (lists and tuples alike)."""
    if isinstance(default, (list, tuple)):
        return tuple(value) != tuple(default)
    return value != default
