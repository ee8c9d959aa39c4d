"""Side by side with DGL's recipe: ``python -m pyg_mgpu.compare_dgl``.

Takes the main command's dataset and training flags, exports the dataset once to the neutral
``.npz`` format, and trains on it twice with the same ranks, fanout, batch size, hidden size,
learning rate, dropout, epochs and seed: once with ``python -m pyg_mgpu.distributed_sampling``,
once with DGL's multi-GPU recipe (``benchmarks/dgl_variant.py``, run by the separate DGL
environment that ``benchmarks/dgl_env.sh`` builds). Both write ``metrics.json``; this module reads
the two, prints a table (test accuracy, best validation accuracy, mean epoch time, peak memory)
and writes it to ``--out`` as ``comparison.md`` and ``comparison.json``.

Exit codes: 0 the test accuracies agree within ``--tolerance``; 1 a side failed (crashed, timed
out, wrote no metrics) or the DGL environment could not be built; 2 bad input; 3 the test
accuracies differ by more than ``--tolerance``.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Optional, Sequence

from pyg_mgpu.files import cannot_write, save_json, save_text
from pyg_mgpu.tools.comparison import (
    SIDES,
    Verdict,
    check,
    compare_runs,
    format_report,
    format_table,
)
from pyg_mgpu.train.config import TrainConfig, flag_of
from pyg_mgpu.train.metrics import RunError

REPO_ROOT = Path(__file__).resolve().parents[2]  # pyg_mgpu/tools/ -> the checkout
DGL_SCRIPT = REPO_ROOT / "benchmarks" / "dgl_variant.py"
DGL_ENV_SCRIPT = REPO_ROOT / "benchmarks" / "dgl_env.sh"
# Absolute gap in test accuracy tolerated between the sides; docs/comparison.md shows the
# seed-to-seed spread it was chosen from.
DEFAULT_TOLERANCE = 0.03
EXIT_SIDE_FAILED, EXIT_BAD_INPUT, EXIT_ACCURACY_GAP = 1, 2, 3
# Flags of the main command that the comparison fixes: the DGL recipe has one way only, and a
# comparison starts from scratch.
FIXED_FLAGS = {"eval_on": "rank0", "eval_every": 1, "eval_batch_size": None, "resume": None}
# Settings that are no flag of the main command: the model's record of its recipe.
NOT_FLAGS = ("recipe_sources",)
# Main-command settings both sides get (side_commands spells them out), or that only choose the
# data, which both sides read from the one exported .npz.
# (--overwrite: the pyg_mgpu side always gets it, see side_commands.)
SHARED_FIELDS = {"dataset", "root", "devices", "nprocs", "epochs", "batch_size", "fanout",
                 "hidden", "dropout", "lr", "seed", "num_workers", "out", "overwrite",
                 "num_nodes", "num_edges", "num_features", "num_classes", *FIXED_FLAGS}


@dataclasses.dataclass
class CompareOptions:
    """The comparison's own settings (the training settings are a ``TrainConfig``)."""
    dgl_python: Optional[str] = None  # the DGL environment's python; None: build or reuse it
    dgl_sampler: str = "dataloader"  # or "graphbolt"
    tolerance: float = DEFAULT_TOLERANCE  # largest accepted gap in mean test accuracy
    repeats: int = 1  # seeds per side: seed, seed + 1, ...
    side_timeout: float = 3600.0  # seconds one training run may take
    compare_only: Optional[tuple[Path, Path]] = None  # compare these run folders, train none


class CompareError(ValueError):
    """Bad input to the comparison; the message names the flag."""


class SideFailed(RuntimeError):
    """One side crashed, timed out or wrote no metrics; the message says which and where."""


# Running the two sides.

def dgl_devices(cfg: TrainConfig) -> tuple[str, int]:
    """The DGL side's ``--devices`` and rank count for the main command's ``--devices``."""
    from pyg_mgpu.distributed.devices import resolve_devices

    devices = resolve_devices(cfg.ranks.devices, cfg.ranks.nprocs)
    if devices[0].type == "cpu":
        return "cpu", len(devices)
    if [d.index for d in devices] != list(range(len(devices))):
        raise CompareError(f"--devices {cfg.ranks.devices}: the DGL side uses GPUs 0..N-1 (one per "
                           "rank); pass --devices cuda --nprocs N.")
    return "cuda", len(devices)


def export_dataset(cfg: TrainConfig, folder: Path) -> Path:
    """The dataset both sides read, as ``.npz`` (a ``.npz`` input is used as it is)."""
    if cfg.data.dataset.endswith(".npz"):
        return Path(cfg.data.dataset).resolve()
    from pyg_mgpu.train.dataset import load_configured

    graph = load_configured(cfg, for_training=False)  # DGL gets the dataset as read
    print(f"[compare] {graph.summary()}", flush=True)
    return graph.save_npz(folder / f"{cfg.data.dataset.lower()}.npz").resolve()


def run_folder(out: Path, side: str, seed: int) -> Path:
    """Where one side's run for one seed writes its metrics.json."""
    return out / side / f"seed{seed}"


def pyg_only_flags(cfg: TrainConfig) -> list[str]:
    """The main command's other settings the user changed (``--sampler``, ``--amp``,
    ``--recipe``, ...), as its flags, passed on to the pyg_mgpu side only, so none is silently
    dropped (the parser's defaults are a default config's values)."""
    defaults = TrainConfig().flat()
    flags = []
    for name, value in cfg.flat().items():
        if name in SHARED_FIELDS or name in NOT_FLAGS or value == defaults[name]:
            continue
        flag = flag_of(name)
        if isinstance(value, bool):  # an on/off switch such as --profile
            flags.append(flag)
        elif isinstance(value, (tuple, list)):
            flags += [flag, ",".join(map(str, value))]
        else:
            flags += [flag, str(value)]
    return flags


def side_commands(cfg: TrainConfig, npz: Path, seed: int, out: Path, dgl_python: str,
                  dgl_sampler: str) -> dict[str, list[str]]:
    """Both sides' command lines for one seed, with every shared setting spelled out."""
    dgl_device, nprocs = dgl_devices(cfg)
    shared = ["--nprocs", str(nprocs), "--epochs", str(cfg.training.epochs),
              "--batch-size", str(cfg.training.batch_size), "--fanout", ",".join(map(str, cfg.training.fanout)),
              "--hidden", str(cfg.model.hidden), "--dropout", str(cfg.model.dropout), "--lr", str(cfg.model.lr),
              "--seed", str(seed), "--num-workers", str(cfg.performance.num_workers)]
    return {
        "pyg_mgpu": [sys.executable, "-m", "pyg_mgpu.distributed_sampling",
                     "--dataset", str(npz), "--devices", cfg.ranks.devices, *shared,
                     "--eval-on", "rank0", "--eval-every", "1", *pyg_only_flags(cfg),
                     # A comparison repeated in the same --out starts its runs afresh.
                     "--out", str(run_folder(out, "pyg_mgpu", seed)), "--overwrite"],
        "dgl": [dgl_python, str(DGL_SCRIPT), "--npz", str(npz), "--devices", dgl_device,
                *shared, "--sampler", dgl_sampler, "--out", str(run_folder(out, "dgl", seed))],
    }


def run_side(side: str, cmd: list[str], log: Path, timeout_s: float) -> None:
    """Runs one training command, echoing its output and keeping all of it in ``log``.

    Raises:
        SideFailed: the command exited non-zero (the message quotes the log's last lines) or
            ran past ``timeout_s`` (it is killed with every process it started).
    """
    env = dict(os.environ)
    # The child runs this very checkout of pyg_mgpu, whatever the working directory.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    log.parent.mkdir(parents=True, exist_ok=True)
    print(f"[compare] {side}: {' '.join(cmd)}", flush=True)
    # Bytes, not text mode: text mode would turn progress bars' carriage returns into newlines.
    with open(log, "w") as f, subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
            start_new_session=True) as proc:
        # A thread copies the output, so a silent, hung run still meets the timeout below.
        pump = threading.Thread(target=_copy_output, args=(proc.stdout, f, side), daemon=True)
        pump.start()
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):  # it may have just ended
                os.killpg(proc.pid, signal.SIGKILL)  # the whole session: the run and its ranks
            proc.wait()
            pump.join()
            raise SideFailed(f"{side} ran past --side-timeout {timeout_s:g}s and was killed; "
                             f"its output is in {log}") from None
        pump.join()
    if proc.returncode != 0:
        tail = "".join(log.read_text().splitlines(keepends=True)[-25:])
        raise SideFailed(f"{side} failed with exit code {proc.returncode}; last lines of "
                         f"{log}:\n{tail}")


def _copy_output(stream, log, side: str) -> None:
    for raw in stream:
        line = raw.decode(errors="replace")
        log.write(line)
        # Progress bars redraw with carriage returns: echo only their final state.
        shown = line.rstrip("\n").rsplit("\r", 1)[-1].rstrip()
        if shown:
            print(f"  [{side}] {shown}", flush=True)


def resolve_dgl_python(given: Optional[str]) -> str:
    """``--dgl-python`` as given, or the python of the environment ``dgl_env.sh`` builds."""
    if given:
        if not (os.path.isfile(given) and os.access(given, os.X_OK)):
            raise CompareError(f"--dgl-python {given}: not an executable file; pass the python "
                               "of an environment with DGL, or leave the flag out to build one.")
        # Checked before the pyg_mgpu side trains, which would be lost to a failed DGL side.
        found = subprocess.run([given, "-c", "import dgl"], capture_output=True, text=True)
        if found.returncode != 0:
            last = (found.stderr.strip().splitlines() or ["no output"])[-1]
            raise CompareError(f"--dgl-python {given}: cannot import dgl ({last}); pass the "
                               "python of an environment with DGL, or leave the flag out to "
                               "build one.")
        return given
    if not DGL_ENV_SCRIPT.is_file():
        raise CompareError(f"{DGL_ENV_SCRIPT} is missing (pyg_mgpu runs outside its checkout?); "
                           "pass --dgl-python PATH.")
    print("[compare] DGL environment: bash benchmarks/dgl_env.sh (builds it on first use, "
          "several minutes)", flush=True)
    result = subprocess.run(["bash", str(DGL_ENV_SCRIPT)], stdout=subprocess.PIPE, text=True)
    lines = result.stdout.strip().splitlines()
    if result.returncode != 0 or not lines:
        raise SideFailed(f"building the DGL environment failed (exit code {result.returncode}); "
                         f"its log is above. Rerun bash {DGL_ENV_SCRIPT} to retry.")
    return lines[-1]


def make_out_dir(out: Optional[str]) -> Path:
    path = Path(out) if out else Path("runs") / time.strftime("compare-dgl-%Y%m%d-%H%M%S")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CompareError(cannot_write(path, e))
    return path


def write_outputs(comparison: dict, verdict: Verdict, settings: dict, commands: Sequence[str],
                  out: Path) -> None:
    save_json(comparison, out / "comparison.json")
    save_text(format_report(comparison, verdict, settings, commands), out / "comparison.md")


def shared_settings(cfg: TrainConfig, nprocs: int) -> dict:
    return {"dataset": cfg.data.dataset, "ranks": nprocs, "fanout": ",".join(map(str, cfg.training.fanout)),
            "batch size": cfg.training.batch_size, "hidden": cfg.model.hidden, "lr": cfg.model.lr,
            "dropout": cfg.model.dropout, "epochs": cfg.training.epochs, "seed": cfg.training.seed}


def run(cfg: TrainConfig, opts: CompareOptions) -> tuple[dict, Verdict]:
    out = make_out_dir(cfg.outputs.out)
    if opts.compare_only:
        pyg_dir, dgl_dir = opts.compare_only
        comparison = compare_runs({"pyg_mgpu": [pyg_dir], "dgl": [dgl_dir]})
        settings = {"runs": f"{pyg_dir} vs {dgl_dir}"}
        commands: list[str] = []
    else:
        _, nprocs = dgl_devices(cfg)  # bad --devices fails here, before any training
        dgl_python = resolve_dgl_python(opts.dgl_python)
        npz = export_dataset(cfg, out / "data")
        dirs: dict[str, list[Path]] = {s: [] for s in SIDES}
        commands = []
        for seed in range(cfg.training.seed, cfg.training.seed + opts.repeats):
            cmds = side_commands(cfg, npz, seed, out, dgl_python, opts.dgl_sampler)
            for side in SIDES:
                run_dir = run_folder(out, side, seed)
                # A metrics.json left by an earlier comparison in this --out must not stand in
                # for this run's.
                (run_dir / "metrics.json").unlink(missing_ok=True)
                run_side(side, cmds[side], run_dir / "log.txt", opts.side_timeout)
                dirs[side].append(run_dir)
                commands.append(" ".join(cmds[side]))
        try:
            comparison = compare_runs(dirs)
        except RunError as e:  # the command succeeded, yet its metrics are missing or partial
            raise SideFailed(str(e)) from None
        settings = shared_settings(cfg, nprocs)
    verdict = check(comparison, opts.tolerance)
    write_outputs(comparison, verdict, settings, commands, out)
    print(format_table(comparison), end="")
    print(f"{verdict.describe()}; wrote {out / 'comparison.md'} and {out / 'comparison.json'}")
    return comparison, verdict
