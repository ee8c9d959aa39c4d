"""Every node's prediction from a trained run: ``python -m pyg_mgpu.predict RUN_DIR``.

It rebuilds the run's model and dataset from the configuration the run recorded
(``metrics.json``'s ``config``, or its ``checkpoint.pt``'s for a run that did not finish), loads
``best.pt`` (or ``--checkpoint``), and runs :func:`pyg_mgpu.inference.predict` on every rank a
training run would use. It writes ``.npy`` outputs and ``predictions.json`` (shapes, dtypes,
the commit, each split's accuracy) to ``--out`` (default ``RUN_DIR/predictions``), one folder
per node type for a heterogeneous run. Mistakes in the input end with one ``error:`` line and
exit code 2, before anything is written or any rank starts.

``pyg_mgpu.predict`` stays the library's function (:func:`pyg_mgpu.inference.predict`) after
this module is imported: the package keeps the name (see ``pyg_mgpu/__init__.py``).
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Optional, Sequence

from pyg_mgpu.distributed.host import exit_without_teardown
from pyg_mgpu.files import check_writable
from pyg_mgpu.tools.cli import Parser, stopped_at_start_is_one_line

# torch and the package's layers are imported inside the functions, as the training CLI does.

SPLITS = ("train", "val", "test")
_DEFAULT_OUTPUTS = "logits,labels"
# Settings a checkpoint from another run folder must share with RUN_DIR's run.
_SAME_MODEL_AND_DATA = ("dataset", "model", "hidden", "heads", "fanout", "norm", "recipe",
                        "num_nodes", "num_edges", "num_features", "num_classes",
                        "split_fractions", "seed")


def build_parser() -> argparse.ArgumentParser:
    from pyg_mgpu.inference import HIDDEN_DTYPES, OUTPUTS
    p = Parser(prog="python -m pyg_mgpu.predict",
               description="Write every node's prediction (and, with --embeddings, a hidden "
                           "layer's output) of a trained run's model, computed exactly, layer "
                           "by layer, on every rank a training run would use.")
    p.add_argument("run_dir", metavar="RUN_DIR",
                   help="the run's folder (python -m pyg_mgpu.distributed_sampling --out)")
    p.add_argument("--checkpoint", help="weights to load: a best.pt, or a checkpoint.pt (its "
                                        "latest weights) (default: RUN_DIR/best.pt)")
    p.add_argument("--out", help="output folder (default: RUN_DIR/predictions)")
    p.add_argument("--root", help="folder the dataset lives in, where it has moved since the "
                                  "run (default: the run's)")
    p.add_argument("--outputs", default=_DEFAULT_OUTPUTS,
                   help=f"comma-separated, any of {', '.join(OUTPUTS)}")
    p.add_argument("--embeddings", type=int, metavar="LAYER",
                   help="also write hidden layer LAYER's output (1 = the first layer's, after "
                        "its activation) as embeddings.npy")
    p.add_argument("--nodes", default="all",
                   help="all, train, val, test, or a file of node ids (.npy, or text with one "
                        "id per line); rows follow its order")
    p.add_argument("--batch-size", type=int, default=4096,
                   help="destination nodes per step (a step also reads all their in-edges)")
    p.add_argument("--hidden-dtype", choices=tuple(HIDDEN_DTYPES), default="float32",
                   help="storage of hidden layers on disk: bfloat16 is stored as uint16 bit "
                        "patterns, float16 as numpy float16")
    p.add_argument("--devices", default="auto", help="as for training: auto, cpu, cuda or "
                                                     "cuda:0,1,...")
    p.add_argument("--nprocs", type=int, help="number of ranks (CPU ranks default to 2)")
    p.add_argument("--backend", default="auto", choices=("auto", "nccl", "gloo"),
                   help="process-group backend")
    p.add_argument("--timeout", dest="timeout_s", type=float, default=300.0,
                   help="seconds a rank may wait for a peer before the job fails")
    p.add_argument("--resume", action="store_true",
                   help="continue in --out after the last layer a stopped run finished")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the predictions already in --out")
    p.add_argument("--debug", action="store_true", help="show full tracebacks")
    return p


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def read_run(run_dir: Path, trusted: bool = True) -> tuple[dict, dict]:
    """The run's metrics (empty for a run that did not finish) and its recorded config.
    ``trusted=False`` for a folder the user did not name: its ``checkpoint.pt`` is read as
    data only (``weights_only``), no pickled code runs.

    Raises:
        ValueError: for a folder with no configuration, or whose ``metrics.json`` and
            ``checkpoint.pt`` are of two runs (see
            :func:`~pyg_mgpu.train.run_folder.check_same_run`).
    """
    import torch
    if not run_dir.is_dir():
        raise ValueError(f"{run_dir}: no such folder; pass the --out folder of a training run.")
    metrics_path, ckpt_path = run_dir / "metrics.json", run_dir / "checkpoint.pt"
    metrics = None
    if metrics_path.is_file():
        try:
            metrics = json.loads(metrics_path.read_text())
        except ValueError as e:
            raise ValueError(f"{metrics_path}: not readable as JSON ({e}).") from None
        if not (isinstance(metrics, dict) and isinstance(metrics.get("config"), dict)):
            metrics = None
    ckpt = None
    if ckpt_path.is_file():  # a run stopped before its end records its config here
        try:
            ckpt = _load(ckpt_path, torch, weights_only=not trusted)
        except ValueError:
            if metrics is None:
                raise
        if not (isinstance(ckpt, dict) and isinstance(ckpt.get("config"), dict)):
            ckpt = None
    if metrics is not None:
        if ckpt is not None:
            from pyg_mgpu.train.run_folder import check_same_run
            check_same_run(run_dir, metrics, ckpt)
        return metrics, metrics["config"]
    if ckpt is not None:
        return {"data_fingerprint": ckpt.get("data_fingerprint")}, ckpt["config"]
    raise ValueError(f"{run_dir}: no configuration (metrics.json with a config, or "
                     "checkpoint.pt); pass the --out folder of a python -m "
                     "pyg_mgpu.distributed_sampling run.")


def _load(path: Path, torch, weights_only: bool = False):
    import pickle
    try:
        return torch.load(path, weights_only=weights_only, mmap=True, map_location="cpu")
    except Exception as e:  # a truncated or foreign file
        if weights_only and isinstance(e, pickle.UnpicklingError):
            raise ValueError(f"{path}: unreadable as a torch checkpoint (it holds objects "
                             "other than tensors and plain data, which a file of a folder not "
                             "named as RUN_DIR is never trusted to run).") from None
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"{path}: unreadable as a torch checkpoint ({first}).") from None


def read_weights(run_dir: Path, checkpoint: Optional[str], config: dict, metrics: dict) -> dict:
    """The state_dict to load, refused when it comes from a run of another model or data."""
    import torch
    path = Path(checkpoint) if checkpoint else run_dir / "best.pt"
    if not path.is_file():
        raise ValueError(f"{path}: no such file; the run never validated a model. Pass "
                         f"--checkpoint {run_dir / 'checkpoint.pt'} for its latest weights.")
    saved = _load(path, torch)
    other_config, other_fingerprint = None, None
    if isinstance(saved, dict) and "model" in saved and "config" in saved:  # a checkpoint.pt
        other_config, other_fingerprint = saved["config"], saved.get("data_fingerprint")
        saved = saved["model"]
    elif (path.parent.resolve() != run_dir.resolve()
          and any((path.parent / name).is_file() for name in ("metrics.json", "checkpoint.pt"))):
        # best.pt of another run, finished or stopped part way (elsewhere, a state_dict saved
        # by hand: only its fit to the model is checked)
        other, other_config = read_run(path.parent, trusted=False)
        other_fingerprint = other.get("data_fingerprint")
    if not isinstance(saved, dict) or not all(torch.is_tensor(v) for v in saved.values()):
        raise ValueError(f"{path}: not a model's state_dict or a pyg_mgpu checkpoint.")
    for key in _SAME_MODEL_AND_DATA if other_config else ():
        if key == "dataset" and str(config[key]).endswith(".npz"):
            continue  # a path, relative in older runs: the fingerprint compares the contents
        if key in config and other_config.get(key, config[key]) != config[key]:
            raise ValueError(f"--checkpoint {path} was trained with {key}={other_config[key]!r}, "
                             f"the run in {run_dir} with {config[key]!r}: pass a checkpoint of "
                             "that run.")
    if other_fingerprint and metrics.get("data_fingerprint") not in (None, other_fingerprint):
        raise ValueError(f"--checkpoint {path} was trained on other data than the run in "
                         f"{run_dir}; pass a checkpoint of that run.")
    return saved


def read_nodes(nodes: str, graph):
    """The ids ``--nodes`` names, or None for every node."""
    import numpy as np
    import torch
    if nodes == "all":
        return None
    if nodes in SPLITS:
        return getattr(graph, f"{nodes}_idx").long()
    path = Path(nodes)
    if not path.is_file():
        raise ValueError(f"--nodes {nodes}: expected all, train, val, test or a file of node ids.")
    try:
        ids = np.load(path) if path.suffix == ".npy" else np.loadtxt(path, dtype=np.int64, ndmin=1)
    except (OSError, ValueError) as e:
        raise ValueError(f"--nodes {nodes}: not a .npy array or a text file of integer ids ({e}).")
    if not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"--nodes {nodes}: holds {ids.dtype} values; node ids are integers.")
    return torch.from_numpy(np.asarray(ids, dtype=np.int64))


def _needed_bytes(num_nodes: int, num_out: int, widths: list[int], outputs: list[str],
                  embeddings: Optional[int], hidden_bytes: int) -> int:
    """Disk the outputs take at their peak: two hidden layers (one read, one written), the
    kept embeddings layer, GCN's degrees, and the outputs."""
    hidden = sorted((num_nodes * w * hidden_bytes for w in widths[:-1]), reverse=True)
    per_row = {"logits": widths[-1] * 4, "probabilities": widths[-1] * 4, "labels": 8}
    return (sum(hidden[:2]) + (hidden[0] if embeddings else 0) + 4 * num_nodes
            + num_out * (8 + sum(per_row[name] for name in outputs)))


def refuse_outputs(out: Path, resume: bool, overwrite: bool) -> None:
    """Refuses an ``--out`` holding predictions already, or files at their names, without
    ``--overwrite`` (or ``--resume`` of a stopped job there): what the library would refuse."""
    from pyg_mgpu.inference.outputs import in_the_way, listed
    found = in_the_way(out, resume=resume, overwrite=overwrite)
    if (out / "predictions.json").exists() and not (resume or overwrite):
        found.append("predictions.json")
    if found:
        raise ValueError(f"--out {out} holds predictions already ({listed(found)}); pass "
                         "--overwrite to replace them, --resume to continue a stopped run, or "
                         "another --out.")


def prepare_out(out: Path, overwrite: bool, needed: int) -> None:
    """``out`` made, writable and with room, or refused (nothing is left behind). With
    ``overwrite``, the earlier ``predictions.json`` is deleted before any rank starts: a job
    stopped before its end must not leave it describing outputs it has replaced."""
    created = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
        check_writable(out)
        free = shutil.disk_usage(out).free
        if free < needed:
            raise OSError(28, f"the outputs take {needed / 2**30:.2f} GiB and it has "
                              f"{free / 2**30:.2f} GiB free; free space there or choose "
                              "another --out")
        if overwrite:
            (out / "predictions.json").unlink(missing_ok=True)
    except OSError as e:
        if created:
            shutil.rmtree(out, ignore_errors=True)
        raise ValueError(f"--out {out}: cannot write there ({e.strerror}).") from None


def commit() -> Optional[str]:
    """The package's git commit, or None outside a checkout."""
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent,
                              capture_output=True, text=True, timeout=10,
                              check=True).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _predict_rank(ctx, model, graph, out: str, options: dict) -> None:
    """One rank's share of the prediction (rank 0 shows the progress)."""
    from pyg_mgpu.inference import predict
    predict(model.to(ctx.device), graph, out, device=ctx.device, progress_bar=ctx.is_main,
            **options)


def accuracies(folder: Path, graph, nodes, outputs: list[str]) -> dict:
    """Each split's accuracy over the predicted nodes in it (none without class outputs);
    ``folder`` holds the labelled type's outputs."""
    import numpy as np
    import torch
    source = next((name for name in ("labels", "logits", "probabilities") if name in outputs),
                  None)
    if source is None:
        return {}
    stored = np.load(folder / f"{source}.npy", mmap_mode="r")
    labels = graph.data[graph.target].y if graph.is_hetero else graph.y
    result = {}
    for split in SPLITS:
        idx = getattr(graph, f"{split}_idx").long()
        if nodes is None:
            rows = idx
        else:  # the split's nodes among those predicted, and their rows
            order = torch.argsort(nodes)
            at = torch.searchsorted(nodes[order], idx).clamp_(max=nodes.numel() - 1)
            found = nodes[order][at] == idx
            idx, rows = idx[found], order[at[found]]
        if idx.numel() == 0:
            continue
        picked = torch.from_numpy(np.asarray(stored[np.sort(rows.numpy())]))
        pred = picked if source == "labels" else picked.argmax(dim=-1)
        by_row = torch.argsort(rows)  # stored rows were read in increasing order
        correct = int((pred == labels[idx[by_row]]).sum())
        result[split] = {"accuracy": correct / idx.numel(), "nodes": idx.numel()}
    return result


def build_run_model(cfg, graph):
    """The run's model, as its ranks built it (weights not loaded)."""
    from pyg_mgpu.nn.hetero import HeteroGNN
    from pyg_mgpu.nn.models import build_model
    if graph.is_hetero:
        return HeteroGNN(graph.data.metadata(), graph.num_features, cfg.model.hidden,
                         graph.num_classes, cfg.training.num_layers, graph.target,
                         cfg.model.dropout, conv=cfg.model.model)
    ours = cfg.model.recipe == "pyg_mgpu"
    return build_model(cfg.model.model, graph.num_features, cfg.model.hidden, graph.num_classes,
                       cfg.training.num_layers, cfg.model.dropout, heads=cfg.model.heads,
                       norm=cfg.model.norm, sparse_aggregation=ours, fast_dropout=ours)


def run(args) -> dict:
    """The checks, the data, the ranks, then ``predictions.json``; returns its contents."""
    from pyg_mgpu.data.fingerprint import data_fingerprint, same_data
    from pyg_mgpu.distributed.devices import RANKS_PER_CORE_LIMIT, resolve_devices
    from pyg_mgpu.distributed.launch import launch_local
    from pyg_mgpu.inference import HIDDEN_DTYPES, OUTPUTS, Predictions
    from pyg_mgpu.inference.arguments import check_embeddings, check_nodes
    from pyg_mgpu.inference.layers import stack_of
    from pyg_mgpu.inference.predictions import check_out
    from pyg_mgpu.train.checkpoint import save_json
    from pyg_mgpu.train.config import TrainConfig
    from pyg_mgpu.train.dataset import load_configured

    start = time.perf_counter()
    outputs = [name for name in args.outputs.split(",") if name]
    unknown = [name for name in outputs if name not in OUTPUTS]
    if unknown or not outputs:
        raise ValueError(f"--outputs takes any of {', '.join(OUTPUTS)}, got {args.outputs!r}.")
    if args.batch_size < 1:
        raise ValueError(f"--batch-size must be a positive integer, got {args.batch_size}.")
    run_dir = Path(args.run_dir)
    metrics, config = read_run(run_dir)
    if args.root is not None:  # the data fingerprint below still checks that it is the same data
        config = {**config, "root": args.root}
    # The run's own folder settings say nothing about its model or data (and an older run
    # may hold a pair that a run is now refused).
    known = set(TrainConfig().flat()) - {"out", "resume", "overwrite"}
    cfg = TrainConfig.from_flags(**{k: v for k, v in config.items() if k in known})
    check_embeddings(args.embeddings, cfg.training.num_layers)
    devices = resolve_devices(args.devices, args.nprocs, args.backend,
                              max_per_core=RANKS_PER_CORE_LIMIT)
    weights = read_weights(run_dir, args.checkpoint, config, metrics)
    graph = load_configured(cfg)
    if not same_data(metrics.get("data_fingerprint"), graph.tensors()):
        raise ValueError(f"the dataset has changed since the run in {run_dir} trained on it "
                         f"(--dataset {cfg.data.dataset}: its features, labels, edges or splits "
                         "differ); predict on the data the model was trained on.")
    model = build_run_model(cfg, graph)
    try:
        model.load_state_dict(weights)
    except RuntimeError as e:
        first = str(e).splitlines()[1].strip() if "\n" in str(e) else str(e)
        raise ValueError(f"{args.checkpoint or run_dir / 'best.pt'} does not fit the run's "
                         f"model (--model {cfg.model.model}, --hidden {cfg.model.hidden}, "
                         f"{cfg.training.num_layers} layers): {first} Pass a checkpoint of the "
                         f"run in {run_dir}.") from None
    nodes = read_nodes(args.nodes, graph)
    labelled = graph.data[graph.target].num_nodes if graph.is_hetero else graph.num_nodes
    if nodes is not None:
        nodes = check_nodes(nodes, labelled)
    stack = stack_of(model.eval())
    widths = stack.widths(graph.num_features if graph.is_hetero else
                          {stack.target: graph.num_features})
    out = Path(args.out) if args.out else run_dir / "predictions"
    fingerprint = metrics.get("data_fingerprint") or data_fingerprint(graph.tensors())
    options = dict(outputs=outputs, embeddings=args.embeddings, nodes=nodes,
                   batch_size=args.batch_size, hidden_dtype=args.hidden_dtype)
    key = {"data": fingerprint}
    refuse_outputs(out, args.resume, args.overwrite)
    # A layers/ folder it did not write, and layers of another model or data, are refused
    # here, before anything is written or any rank starts.
    finished = check_out(model, graph, out, resume=args.resume, overwrite=args.overwrite,
                         key=key, **options)
    prepare_out(out, args.overwrite,
                _needed_bytes(graph.num_nodes, labelled if nodes is None else nodes.numel(),
                              widths, outputs, args.embeddings,
                              HIDDEN_DTYPES[args.hidden_dtype]().itemsize))
    options.update(resume=args.resume, overwrite=args.overwrite, key=key)
    if finished:
        print(f"{out} holds these predictions whole already: nothing to compute", flush=True)
    else:
        graph.share_memory_()
        print(f"{graph.summary()} | {cfg.model.model}, {cfg.training.num_layers} layers | "
              f"{len(devices)} rank(s) on {devices[0].type} | writing to {out}", flush=True)
        launch_local(_predict_rank, devices, args=(model, graph, str(out), options),
                     timeout_s=args.timeout_s, backend=args.backend, skip_teardown=True)
    opened = Predictions.load(out, stack.outputs(0) if graph.is_hetero else None)
    target_folder = out / graph.target if graph.is_hetero else out
    summary = {
        "run": str(run_dir), "checkpoint": str(args.checkpoint or run_dir / "best.pt"),
        "commit": commit(), "dataset": cfg.data.dataset, "model": cfg.model.model,
        "num_nodes": graph.num_nodes, "nodes": args.nodes, "embeddings_layer": args.embeddings,
        "hidden_dtype": args.hidden_dtype, "files": opened.files(),
        "accuracy": accuracies(target_folder, graph, nodes, outputs),
        "run_test_acc_exact": metrics.get("test_acc_exact"),
        "world_size": len(devices), "device": devices[0].type,
        "time_s": time.perf_counter() - start,
    }
    save_json(summary, out / "predictions.json")
    scores = " | ".join(f"{split} acc {v['accuracy']:.4f}"
                        for split, v in summary["accuracy"].items())
    print(f"predictions for {labelled if nodes is None else nodes.numel():,} nodes in {out}"
          + (f" | {scores}" if scores else ""), flush=True)
    return summary


def main(argv: Optional[Sequence[str]] = None) -> int:
    return stopped_at_start_is_one_line(_main, argv)


def _main(argv: Optional[Sequence[str]]) -> int:
    from pyg_mgpu.distributed.context import JobStopped, RankFailed
    from pyg_mgpu.errors import ArgumentError

    args = build_parser().parse_args(argv)
    try:
        run(args)
    except ArgumentError as e:
        if args.debug:
            traceback.print_exc()
        print(f"error: {e.naming(_flag)}", file=sys.stderr)
        return 2
    except (ValueError, OSError) as e:
        if args.debug:
            traceback.print_exc()
        print(f"error: {e}", file=sys.stderr)
        return 2
    except JobStopped as e:
        print(f"\nerror: {e}; continue with --resume", file=sys.stderr)
        return 128 + e.signum
    except RankFailed as e:
        print(f"\nerror: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    exit_without_teardown(main())
