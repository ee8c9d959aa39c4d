"""Checkpoints for ``--resume``, written atomically (:func:`~pyg_mgpu.files.atomic_write`): a
crash mid-write never leaves a truncated file where a good one was.

A checkpoint holds everything an exact continuation needs: weights, optimizer state, history,
the best model so far, every rank's random state (its dropout masks and samples) and, for one
taken inside an epoch, where in the epoch it was and each rank's partial loss and accuracy sums.
"""
from __future__ import annotations

import copy
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch
import torch.distributed as dist

from pyg_mgpu import files
from pyg_mgpu.data.fingerprint import same_data
from pyg_mgpu.files import atomic_write

# The command ``pyg_mgpu.predict`` imports it from here.
save_json = files.save_json


def save_torch(obj: Any, path: Path) -> Path:
    """``torch.save`` to ``path`` atomically, with a CRC-32 for every entry even where the
    process turned torch's off (``torch.serialization.set_crc32_options(False)``): a resume
    checks them (:func:`damaged_entry`)."""
    def save(f) -> None:
        crc_was = torch.serialization.get_crc32_options()
        torch.serialization.set_crc32_options(True)
        try:
            torch.save(obj, f)
        finally:
            torch.serialization.set_crc32_options(crc_was)

    return atomic_write(path, save)


CHECKPOINT = "checkpoint.pt"


def check_resume_names_a_folder(resume: Optional[str]) -> None:
    """``--resume`` takes the run's folder: one naming the checkpoint file itself is refused
    before that file is mistaken for the run's output folder."""
    if resume and resume != "auto" and Path(resume).is_file():
        raise ValueError(f"--resume {resume}: a file; pass its folder, --resume "
                         f"{Path(resume).parent}")


def check_resumable(cfg, world_size: int) -> dict:
    """Loads ``--resume``'s checkpoint and rejects one that belongs to a different run.

    Raises:
        ValueError: naming the missing file or the first setting that differs.
    """
    check_resume_names_a_folder(cfg.faults.resume)
    path = Path(cfg.faults.resume) / CHECKPOINT
    if path.is_dir():
        raise ValueError(f"--resume {cfg.faults.resume}: its {CHECKPOINT} is a folder, not a "
                         "checkpoint; move it away, or pass the --out folder of another run.")
    if not path.is_file():
        raise ValueError(f"--resume {cfg.faults.resume}: no {CHECKPOINT} there; pass the --out "
                         "folder of a run that finished at least one epoch.")
    try:
        # mmap: the check reads the config, not the weights (each rank loads those itself),
        # and checks every byte against its CRC without unpickling. To host memory: a GPU
        # run's checkpoint must not open a CUDA context (or fail) here.
        ckpt = torch.load(path, weights_only=False, mmap=True, map_location="cpu")
        damaged = damaged_entry(path)
    except Exception as e:  # a truncated or foreign file
        raise ValueError(f"--resume {cfg.faults.resume}: {CHECKPOINT} is unreadable ({e}); it was not "
                         "written by pyg_mgpu, or the disk lost it.")
    if damaged:
        raise ValueError(f"--resume {cfg.faults.resume}: {CHECKPOINT} is unreadable (its part "
                         f"{damaged} fails its checksum); the disk lost part of it. Resume from "
                         "a copy, or start afresh with --overwrite.")
    foreign = not_a_checkpoint(ckpt)
    if foreign:
        raise ValueError(f"--resume {cfg.faults.resume}: {CHECKPOINT} was not written by "
                         f"pyg_mgpu ({foreign}); pass the --out folder of a pyg_mgpu run.")
    saved = ckpt["config"]
    # Settings newer than the checkpoint: it was trained with their defaults.
    defaults, settings = type(cfg)().flat(), cfg.flat()
    for key in cfg.RESUME_MUST_MATCH:
        now, before = settings[key], saved.get(key, defaults[key])
        if isinstance(now, tuple):  # fanout, split_fractions: lists once saved
            now, before = list(now), list(before)
        if before != now and not (key == "dataset" and _same_file(now, before, ckpt)):
            raise ValueError(f"--resume {cfg.faults.resume}: the checkpoint was trained with "
                             f"{key}={before!r} but this run asks for {now!r}; use the "
                             "same settings.")
    # The epochs to run include the one a mid-epoch checkpoint stopped in.
    reached = ckpt["step"]["epoch"] if ckpt.get("step") else ckpt["epoch"]
    if cfg.training.epochs < reached:
        raise ValueError(f"--resume {cfg.faults.resume}: the checkpoint is {describe(ckpt)}, "
                         f"beyond --epochs {cfg.training.epochs}; pass --epochs {reached} or "
                         "more (the total, not the epochs to add).")
    if ckpt["world_size"] != world_size:
        raise ValueError(f"--resume {cfg.faults.resume}: the checkpoint has {ckpt['world_size']} "
                         f"ranks but this run starts {world_size}; resume with the same count.")
    return ckpt


# What save_checkpoint writes, and the type of each entry check_resumable reads.
_ENTRIES = {"epoch": int, "step": (dict, type(None)), "world_size": int, "config": dict,
            "model": dict, "optimizer": dict, "history": list, "best": dict, "rng": list}


def not_a_checkpoint(ckpt: Any) -> str:
    """Why ``ckpt`` (a loaded ``checkpoint.pt``) is not one :func:`save_checkpoint` wrote, in
    a few words; '' when it is one."""
    if not isinstance(ckpt, dict):
        return f"it holds a {type(ckpt).__name__}, not a checkpoint's dict"
    missing = [key for key in _ENTRIES if key not in ckpt]
    if missing:
        return f"it has no {', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}"
    for key, kind in _ENTRIES.items():
        if not isinstance(ckpt[key], kind) or isinstance(ckpt[key], bool):
            return f"its {key} is a {type(ckpt[key]).__name__}"
    step = ckpt["step"]
    if step is not None and not all(isinstance(step.get(k), int) for k in ("epoch", "done")):
        return "its step has no epoch and done counts"
    return ""


def _same_file(now: str, before: str, ckpt: dict) -> bool:
    """Whether ``--dataset`` names the checkpoint's data file by another path: the same file
    (``r.npz`` and ``/data/r.npz``), or a file moved or copied since, which the data fingerprint
    then compares by content once the data is loaded."""
    if not Path(now).is_file():
        return False  # a dataset's name, which must match as written
    if ckpt.get("data_fingerprint") is not None:
        return True
    try:
        return os.path.samefile(now, before)
    except OSError:  # the checkpoint's path no longer exists (or names no file)
        return False


def damaged_entry(path: Path) -> Optional[str]:
    """The first entry of a checkpoint (a zip archive, as ``torch.save`` writes it) whose bytes
    fail their CRC, or None. ``torch.load`` checks none of them, and a mapped load reads only
    the headers: damage inside a tensor would show first in the ranks, as a crash or as wrong
    weights. Reads the whole file (a checkpoint of a few MiB: milliseconds).

    An entry recorded with CRC 0 and some bytes is not checked: ``torch.save`` writes that
    where torch's CRCs were turned off, and a true CRC of 0 is a 1 in 2^32 chance."""
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            if info.CRC == 0 and info.file_size:
                continue
            try:
                with archive.open(info) as entry:  # zipfile checks the CRC at the end
                    while entry.read(1 << 24):
                        pass
            except zipfile.BadZipFile:
                return info.filename
    return None


def rng_state(sampler, device: torch.device, sampler_state=None) -> dict:
    """This rank's random state: torch's (dropout), the sampler's, and its GPU's.

    ``sampler_state``: the sampler generator's state to record instead of its current one (in
    mid-epoch, the state before the batches already drawn ahead of training).
    """
    state = {"torch": torch.get_rng_state()}
    generator = getattr(sampler, "generator", None)
    if generator is not None:  # our sampler (in this process; exact with 0 workers)
        state["sampler"] = generator.get_state() if sampler_state is None else sampler_state
    if device.type == "cuda":  # this rank's GPU only: the _all variants open every GPU
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict, sampler, device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    if "sampler" in state:
        sampler.generator.set_state(state["sampler"])
    if "cuda" in state and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)


@dataclass
class StepPosition:
    """Where in an epoch a step checkpoint was taken, and what the epoch had summed so far.

    ``done``: the epoch's steps finished; ``totals``: this rank's loss sum, correct predictions,
    seeds and predictions per class (:meth:`~pyg_mgpu.train.loop.EpochTotals.state`); ``sampler_state``: the sampler's
    generator as it was before batch ``done`` was drawn; ``elapsed_s``: the epoch's training
    seconds so far.
    """

    epoch: int
    done: int
    totals: tuple
    sampler_state: object = None
    elapsed_s: float = 0.0


@dataclass
class Progress:
    """What the epochs have produced so far: what a checkpoint keeps of them
    (:meth:`state_dict`) and restores (:meth:`from_checkpoint`)."""

    history: list
    best: dict
    best_state: dict
    next_epoch: int = 1
    resume_step: Optional[StepPosition] = None  # a checkpoint taken inside next_epoch

    @classmethod
    def start(cls, model: torch.nn.Module) -> "Progress":
        """Before the first epoch: nothing validated yet, the initial weights the best."""
        return cls(history=[], best={"val_acc": -1.0, "epoch": 0},
                   best_state=copy.deepcopy(model.state_dict()))

    def state_dict(self) -> dict:
        """The checkpoint's entries for the progress (``epoch``: the epochs finished)."""
        return {"epoch": self.next_epoch - 1, "history": self.history, "best": self.best,
                "best_state": self.best_state}

    @classmethod
    def from_checkpoint(cls, ckpt: dict, rank: int) -> "Progress":
        """The progress a checkpoint recorded, with this rank's place inside the next epoch
        where it was taken between steps."""
        step = ckpt.get("step")
        position = None if step is None else StepPosition(
            step["epoch"], step["done"], step["totals"][rank], elapsed_s=step["elapsed_s"])
        return cls(ckpt["history"], ckpt["best"], ckpt["best_state"],
                   next_epoch=ckpt["epoch"] + 1, resume_step=position)


def save_checkpoint(out: Path, ctx, cfg, progress: Progress, model: torch.nn.Module,
                    optimizer: torch.optim.Optimizer, sampler,
                    step: Optional[StepPosition] = None, padded_layout: Optional[tuple] = None,
                    data_fingerprint: Optional[str] = None, plan: Optional[dict] = None) -> None:
    """Everything ``--resume`` needs to continue exactly, written atomically by rank 0.

    ``progress``: the epochs so far; ``step``: set for a checkpoint taken inside the next epoch;
    ``padded_layout``: this rank's padded sizes with ``--cuda-graph``; ``data_fingerprint``:
    the data's (:func:`~pyg_mgpu.data.fingerprint.data_fingerprint`), which a resume checks;
    ``plan``: the run plan's resolved settings (:mod:`pyg_mgpu.train.plan`), which a resume
    compares. A collective: every rank's RNG state (each draws its own dropout masks and samples),
    padded layout and, in mid-epoch, its partial sums are gathered.
    """
    mine = {"rng": rng_state(sampler, ctx.device, step and step.sampler_state),
            "totals": step and step.totals, "padded_layout": padded_layout}
    ranks: list = [None] * ctx.world_size
    dist.all_gather_object(ranks, mine)
    if ctx.is_main:
        position = None if step is None else {
            "epoch": step.epoch, "done": step.done, "elapsed_s": step.elapsed_s,
            "totals": [r["totals"] for r in ranks]}
        save_torch({**progress.state_dict(), "step": position, "world_size": ctx.world_size,
                    "config": cfg.to_dict(), "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(), "rng": [r["rng"] for r in ranks],
                    "padded_layouts": [r["padded_layout"] for r in ranks],
                    "data_fingerprint": data_fingerprint, "plan": plan},
                   out / CHECKPOINT)


def check_same_data(ckpt: dict, data_fingerprint: str, resume: str,
                    tensors: dict[str, torch.Tensor]) -> None:
    """Refuses to resume on data other than the checkpoint's ``tensors``, whose digest is
    ``data_fingerprint`` (checkpoints written before the fingerprint was kept pass, and those
    whose digest an earlier release computed are compared the way they were written)."""
    if not same_data(ckpt.get("data_fingerprint"), tensors, data_fingerprint):
        raise ValueError(f"--resume {resume}: the checkpoint was trained on other data (the "
                         "dataset's features, labels, edges or splits differ from when it was "
                         "written); resume on the same data, or start afresh without --resume.")


def describe(ckpt: dict) -> str:
    """Where a checkpoint stands, in words: "after epoch 3" or "epoch 4, 17 steps in"."""
    step = ckpt.get("step")
    if step is None:
        return f"after epoch {ckpt['epoch']}"
    return f"epoch {step['epoch']}, {step['done']} steps in"


def restore_checkpoint(run_dir: str, ctx, model: torch.nn.Module,
                       optimizer: torch.optim.Optimizer, sampler) -> dict:
    """Loads ``run_dir``'s checkpoint into the model, optimizer and this rank's random state;
    returns it (epoch, step, history, best, best_state)."""
    # To host memory whatever device saved it: RNG states must be CPU tensors, and
    # load_state_dict copies weights and optimizer state to the parameters' device.
    ckpt = torch.load(Path(run_dir) / CHECKPOINT, weights_only=False, map_location="cpu")
    model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])
    set_rng_state(ckpt["rng"][ctx.rank], sampler, ctx.device)
    return ckpt
