"""Multi-GPU / multi-CPU-rank GNN training: ``python -m pyg_mgpu.distributed_sampling``.

The parent loads the dataset once into shared memory, then starts one rank per device (or runs
as one rank of a ``torchrun`` job). Mistakes in the input end with a one-line error and exit
code 2; a failed rank ends the job with exit code 1 and names the rank.
"""
from __future__ import annotations

import argparse
import errno
import os
import sys
import time
import traceback
import warnings
from types import SimpleNamespace
from pathlib import Path
from typing import Optional, Sequence

from pyg_mgpu.tools.cli import Parser, stopped_at_start_is_one_line

# torch, PyG and the rest of the package are imported inside the functions, under main()'s
# handling of Ctrl-C: loading them takes seconds, and a Ctrl-C then is a stop like any other.


_DESCRIPTION = ("Train a GNN (GraphSAGE, or PyG's GCN, GAT, GIN; R-GCN on heterogeneous graphs: "
                "--model) with neighbour sampling on every GPU (or N CPU ranks).")


def parse_fanout(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"comma-separated integers such as 25,10 expected, got {text!r}")


def parse_fractions(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"three comma-separated shares such as 0.5,0.1,0.2 expected, got {text!r}")


def build_parser(prog: str = "python -m pyg_mgpu.distributed_sampling",
                 description: str = _DESCRIPTION,
                 out_help: str = "output folder (default: runs/<timestamp>)",
                 ) -> argparse.ArgumentParser:
    """The CLI's parser, its flags grouped by topic (the docs' CLI reference is built from it).
    Other commands that take the same flags (``python -m pyg_mgpu.compare_dgl``) name
    themselves and their output folder."""
    from pyg_mgpu.train.config import (AMP_MODES, BACKENDS, EVAL_MODES, FEATURES_ON,
                                       GRAPH_PLACES, INFERENCE_MODES, MODEL_RECIPES, MODELS,
                                       NORMS, RECIPES, SAMPLERS, TrainConfig)

    d = SimpleNamespace(**TrainConfig().flat())  # the defaults, by flag name
    p = Parser(prog=prog, description=description)

    data = p.add_argument_group("data")
    data.add_argument("--dataset", default=d.dataset,
                      help="synthetic, cora, citeseer, pubmed, reddit, ogbn-arxiv, ogbn-products, "
                           "ogbn-papers100M, or a path to a .npz graph; heterogeneous: "
                           "synthetic-hetero, ogbn-mag (the papers are classified)")
    data.add_argument("--root", default=d.root, help="folder the dataset lives in (default: ./data; ./data/reddit for "
                           "reddit)")
    data.add_argument("--cache-dir", default=d.cache_dir,
                      help="where converted graphs are kept, so later runs read them instead of "
                           "converting again (default: $PYG_MGPU_CACHE/graphs, else "
                           "~/.cache/pyg_mgpu/graphs)")
    data.add_argument("--no-cache", action="store_true", default=d.no_cache,
                      help="convert the dataset on every run and keep no cache")
    data.add_argument("--features-on", choices=FEATURES_ON, default=d.features_on,
                      help="shm: copy the graph to /dev/shm for the ranks; mmap: the ranks map "
                           "the graph cache's files, which the kernel pages in as batches read "
                           "them (for graphs larger than /dev/shm or RAM); auto: mmap when "
                           "/dev/shm cannot hold the graph")

    synthetic = p.add_argument_group("synthetic dataset (--dataset synthetic)")
    for flag, what in (("num_nodes", "nodes"), ("num_edges", "directed edges"),
                       ("num_features", "features per node"), ("num_classes", "classes")):
        synthetic.add_argument("--" + flag.replace("_", "-"), type=int, default=getattr(d, flag),
                               help=f"{what} of the synthetic graph")
    synthetic.add_argument("--split-fractions", type=parse_fractions, default=d.split_fractions,
                           help="shares of the nodes in the train,val,test splits (the training "
                                "share sets an epoch's length)")

    model = p.add_argument_group(
        "model", "--hidden, --heads, --dropout, --lr, --weight-decay and --norm default to the "
        "chosen --model's recipe (its paper's, or PyG's example for it): "
        + "; ".join(f"{name}: " + ", ".join(f"{k} {v}" for k, v in recipe.items()
                                            if k != "heads" or name == "gat")
                    for name, recipe in MODEL_RECIPES.items())
        + ". A flag given overrides its recipe value")
    model.add_argument("--model", choices=MODELS, default=d.model,
                       help="sage = our GraphSAGE (trimmed layers, fused kernels); gcn, gat, gin "
                            "= PyG's GCN, GAT, GIN models, trimmed per layer with PyG's per-hop "
                            "counts. Heterogeneous datasets: sage = a SAGEConv per edge type "
                            "(PyG's to_hetero GraphSAGE), rgcn = R-GCN")
    model.add_argument("--hidden", type=int, default=argparse.SUPPRESS,
                       help="width of every hidden layer (GAT: all heads together)")
    model.add_argument("--heads", type=int, default=argparse.SUPPRESS,
                       help="--model gat: attention heads per layer; hidden layers concatenate "
                            "them (--hidden / --heads channels each), the output layer averages "
                            "them (the example's has one head)")
    model.add_argument("--dropout", type=float, default=argparse.SUPPRESS,
                       help="dropout probability after each hidden layer")
    model.add_argument("--lr", type=float, default=argparse.SUPPRESS,
                       help="Adam's learning rate")
    model.add_argument("--weight-decay", type=float, default=argparse.SUPPRESS,
                       help="Adam's L2 penalty")
    model.add_argument("--norm", choices=NORMS, default=argparse.SUPPRESS,
                       help="PyG's models: normalization after each hidden layer and in GIN's "
                            "MLPs; batch = BatchNorm (batch statistics in training, running "
                            "statistics in evaluation), layer = LayerNorm per node")
    model.add_argument("--recipe", choices=RECIPES, default=d.recipe,
                       help="pyg = PyG's example model as written (untrimmed), the benchmark "
                            "baseline")

    training = p.add_argument_group("training")
    training.add_argument("--epochs", type=int, default=d.epochs,
                          help="passes over the training nodes")
    training.add_argument("--batch-size", type=int, default=d.batch_size,
                          help="seed nodes per batch on each rank")
    training.add_argument("--fanout", type=parse_fanout, default=d.fanout,
                          help="neighbours per layer, e.g. 25,10 (-1 = all); sets the layer "
                               "count")
    training.add_argument("--sampler", choices=SAMPLERS, default=d.sampler,
                          help="native = pyg_mgpu's vectorized sampler; pyg = PyG's (needs "
                               "pyg-lib or torch-sparse); auto = native")
    training.add_argument("--seed", type=int, default=d.seed,
                          help="seeds the synthetic graph, the model, the epochs' shuffles "
                               "and the sampling")

    evaluation = p.add_argument_group("evaluation")
    evaluation.add_argument("--eval-on", choices=EVAL_MODES, default=d.eval_on,
                            help="rank0 = rank 0 validates while the others wait; all = every "
                                 "rank validates its shard and the counts are summed")
    evaluation.add_argument("--eval-every", type=int, default=d.eval_every,
                            help="validate every N epochs (and after the last)")
    evaluation.add_argument("--eval-batch-size", type=int, default=d.eval_batch_size,
                            help="defaults to --batch-size")
    evaluation.add_argument("--inference", choices=INFERENCE_MODES, default=d.inference,
                            help="layerwise: also evaluate the best model exactly (all "
                                 "neighbours, layer by layer over all nodes, sharded across "
                                 "ranks)")

    devices = p.add_argument_group("devices and ranks")
    devices.add_argument("--devices", default=d.devices,
                         help="auto, cpu, cuda or cuda:0,1,... (cuda:0,0: two ranks on GPU 0, "
                              "with --backend gloo)")
    devices.add_argument("--nprocs", type=int, default=d.nprocs,
                         help="number of ranks (CPU ranks default to 2; more CPU ranks than "
                              "cores train no faster and get a warning with the memory they "
                              "take; more than 4 per core are refused)")
    devices.add_argument("--backend", choices=BACKENDS, default=d.backend,
                         help="process-group backend: auto = NCCL on GPU ranks, gloo on CPU "
                              "ranks; gloo on GPUs lets several ranks share one GPU (NCCL "
                              "refuses that), for testing multi-rank logic on one GPU")
    devices.add_argument("--timeout", dest="timeout_s", type=float, default=d.timeout_s,
                         help="seconds a collective may wait for a peer before the job fails")

    performance = p.add_argument_group("performance")
    performance.add_argument("--amp", choices=AMP_MODES, default=d.amp,
                             help="bf16 autocast for the model, features stored in bf16 (CPU "
                                  "with AVX512-BF16/AMX, or GPU)")
    performance.add_argument("--compile", action="store_true", default=d.compile,
                             help="torch.compile the model (dynamic shapes; inductor fuses ReLU "
                                  "and dropout itself); meant for GPUs")
    performance.add_argument("--cuda-graph", action="store_true", default=d.cuda_graph,
                             help="replay each step's forward and backward from a CUDA graph, "
                                  "every hop's nodes and edges padded to a few sizes (our "
                                  "GraphSAGE, homogeneous data; CPU ranks run the padded step "
                                  "without a graph)")
    performance.add_argument("--graph-on", choices=GRAPH_PLACES, default=d.graph_on,
                             help="where GPU ranks keep graph and features: gpu = a copy on "
                                  "each GPU; cpu = the shared host copy, sampled on the CPU; "
                                  "host = the shared host copy pinned once, sampled and "
                                  "gathered by every GPU in place (zero-copy); auto = gpu if "
                                  "it fits in half the free memory, else host (cpu where "
                                  "--features-on mmap leaves the features in a file)")
    performance.add_argument("--feature-cache-gb", type=float, default=d.feature_cache_gb,
                             help="GPU ranks with the graph in host memory cache the "
                                  "most-sampled feature rows on the GPU, up to this size; "
                                  "default: up to a quarter of the free GPU memory; 0 turns it "
                                  "off")
    performance.add_argument("--num-workers", type=int, default=d.num_workers,
                             help="DataLoader worker processes per rank for sampling")
    performance.add_argument("--prefetch", type=int, default=d.prefetch,
                             help="batches a background thread prepares ahead of training "
                                  "(sampling, gathering, the copy to the GPU on a side stream); "
                                  "0 turns it off. Default: 1 on GPU ranks with the native "
                                  "sampler, else 0")
    performance.add_argument("--sample-batches", type=int, default=d.sample_batches,
                             metavar="K",
                             help="batches the native sampler draws in one walk, each still "
                                  "its own batch: one walk's kernel launches and host reads "
                                  "for K batches. Default: 8 where the sampler runs on the GPU, "
                                  "or on the CPU with --batch-size 64 or less, else 1 (on the "
                                  "CPU larger batches sample faster one at a time)")
    performance.add_argument("--profile", action="store_true",
                             help="print per-stage times per epoch")
    performance.add_argument("--trace-steps", type=int, default=d.trace_steps, metavar="N",
                             help="rank 0 runs N steps of the last epoch (after 10 warm-up "
                                  "steps) under torch.profiler: kernels.csv (ops and kernels by "
                                  "their own device and host time) and trace.json (Chrome "
                                  "trace) in --out; 0 traces nothing")

    outputs = p.add_argument_group("outputs")
    outputs.add_argument("--out", default=d.out, help=out_help)
    outputs.add_argument("--overwrite", action="store_true", default=d.overwrite,
                         help="start afresh in an --out that holds another run's "
                              "checkpoint.pt, deleting it (without this, or --resume, such "
                              "a run is refused)")
    outputs.add_argument("--debug", action="store_true", help="show full tracebacks")

    faults = p.add_argument_group("faults, stops and resume")
    faults.add_argument("--resume", default=d.resume, metavar="RUN_DIR",
                        help="continue the run whose checkpoint.pt is in RUN_DIR (writes there "
                             "too unless --out is given), at the epoch or step it was taken; "
                             "'auto': continue from --out's checkpoint if there is one, else "
                             "start afresh (for torchrun --max-restarts and requeued batch jobs)")
    faults.add_argument("--checkpoint-every-steps", type=int, default=d.checkpoint_every_steps,
                        metavar="N", help="also write checkpoint.pt inside epochs, every N "
                                          "training steps (only the newest is kept)")
    faults.add_argument("--checkpoint-every-s", type=float, default=d.checkpoint_every_s,
                        metavar="S", help="also write checkpoint.pt inside epochs, every S "
                                          "seconds")
    faults.add_argument("--grace-s", type=float, default=d.grace_s,
                        help="after SIGTERM, SIGINT or SIGHUP the ranks finish their step, "
                             "write a checkpoint and exit; a rank still running this many "
                             "seconds later is killed")
    return p


def make_out_dir(out: Optional[str]) -> Path:
    """``--out``, created and checked writable; without it a new ``runs/<timestamp>`` (with a
    suffix when a run started in the same second has it)."""
    from pyg_mgpu.train.config import ConfigError

    path = Path(out) if out else Path("runs") / time.strftime("%Y%m%d-%H%M%S")
    try:
        if out:
            path.mkdir(parents=True, exist_ok=True)
        else:
            path = _new_folder(path)
        probe = path / f".write-test-{os.getpid()}"  # by pid: never another process's
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise ConfigError(f"--out {path}: cannot write there ({e.strerror}); choose a "
                          "writable folder.")
    return path


def _new_folder(path: Path) -> Path:
    """``path``, or ``path-2``, ``path-3``, ...: the first that did not exist, created."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for n in range(1, 1000):
        candidate = path if n == 1 else path.with_name(f"{path.name}-{n}")
        try:
            candidate.mkdir()
            return candidate
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "a thousand runs started this second", str(path))


def run(cfg) -> Path:
    """Loads the data once, shares it, starts the ranks; returns the output folder.

    ``cfg``: a :class:`~pyg_mgpu.train.config.TrainConfig`.
    """
    from pyg_mgpu.distributed.devices import launched_by_torchrun
    from pyg_mgpu.train.checkpoint import CHECKPOINT, check_resume_names_a_folder
    from pyg_mgpu.train.loaders import resolve_sampler

    resolve_sampler(cfg.training.sampler)
    check_resume_names_a_folder(cfg.faults.resume)
    if cfg.faults.resume == "auto":  # a restarted job continues; a first start starts afresh
        cfg.faults.resume = cfg.outputs.out if (Path(cfg.outputs.out) / CHECKPOINT).is_file() \
            else None
    if launched_by_torchrun():  # rank 0 makes and claims the folder, in the process group
        return _start(cfg, None)
    from pyg_mgpu.train.run_folder import claim_run_folder

    out = make_out_dir(cfg.outputs.out or cfg.faults.resume)
    cfg.outputs.out = str(out)  # the folder chosen is the one recorded
    with claim_run_folder(out, resume=cfg.faults.resume, overwrite=cfg.outputs.overwrite):
        return _start(cfg, out)


def _start(cfg, out: Optional[Path]) -> Path:
    """The run in a claimed ``out``; under torchrun (``out`` None) as one rank of the job."""
    from pyg_mgpu.data.fingerprint import data_fingerprint
    from pyg_mgpu.distributed.devices import (RANKS_PER_CORE_LIMIT, launched_by_torchrun,
                                              resolve_devices, torchrun_device)
    from pyg_mgpu.distributed.host import release_free_heap, usable_cores
    from pyg_mgpu.distributed.launch import launch_local
    from pyg_mgpu.sampling.sharding import check_shardable
    from pyg_mgpu.train.checkpoint import check_resumable, check_same_data
    from pyg_mgpu.train.dataset import load_configured

    torchrun = launched_by_torchrun()
    with warnings.catch_warnings(record=True) as notices:  # one line each, as errors are
        warnings.simplefilter("always")
        devices = ([torchrun_device(cfg.ranks.devices, int(os.environ.get("LOCAL_RANK", 0)),
                                    cfg.ranks.backend)] if torchrun else
                   resolve_devices(cfg.ranks.devices, cfg.ranks.nprocs, cfg.ranks.backend,
                                   max_per_core=RANKS_PER_CORE_LIMIT))
    if int(os.environ.get("RANK", 0)) == 0:  # a torchrun job's ranks would each say it
        for notice in [str(n.message) for n in notices] + cfg.ignored_flags(devices[0].type):
            print(f"warning: {notice}", file=sys.stderr)
    resumed = (check_resumable(cfg, int(os.environ["WORLD_SIZE"]) if torchrun else len(devices))
               if cfg.faults.resume else None)
    if torchrun:
        from pyg_mgpu.train.multinode import run_torchrun_rank
        return run_torchrun_rank(cfg, lambda: make_out_dir(cfg.outputs.out or cfg.faults.resume),
                                 resumed)
    start = time.perf_counter()
    graph = load_configured(cfg)
    check_shardable(graph.train_idx.numel(), len(devices), cfg.training.batch_size)
    fingerprint = data_fingerprint(graph.tensors())
    if resumed is not None:
        check_same_data(resumed, fingerprint, cfg.faults.resume, graph.tensors())
    graph.share_memory_()
    load_s = time.perf_counter() - start
    print(f"{graph.summary()} | loaded in {load_s:.1f}s | {len(devices)} rank(s) on "
          f"{devices[0].type} | threads/rank {max(1, usable_cores() // len(devices))}\n"
          f"{cfg.recipe_summary()}", flush=True)
    release_free_heap()
    from pyg_mgpu.train.trainer import run_training
    # On the ranks resolved above (spawn would resolve them again); the graph is shared already.
    # PyG's recipe is the baseline: it runs as PyG's example would, on an untuned allocator.
    launch_local(run_training, devices,
                 args=(graph, cfg, str(out), {"load_time_s": load_s,
                                              "data_fingerprint": fingerprint}),
                 timeout_s=cfg.ranks.timeout_s, backend=cfg.ranks.backend,
                 grace_s=cfg.faults.grace_s, tune_allocator=cfg.model.recipe == "pyg_mgpu")
    from pyg_mgpu.train.plots import plot_run
    plot_run(out)
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    return stopped_at_start_is_one_line(_main, argv)


def _main(argv: Optional[Sequence[str]]) -> int:
    from pyg_mgpu.distributed.context import JobStopped, RankFailed
    from pyg_mgpu.distributed.stop import StopSignal, stopped_exit_code
    from pyg_mgpu.train.config import ConfigError, TrainConfig, in_flags

    args = build_parser().parse_args(argv)
    debug = args.debug
    cfg = None
    try:
        cfg = TrainConfig.from_flags(**vars(args))
        run(cfg)
    except (ConfigError, ValueError, OSError) as e:
        if debug:
            traceback.print_exc()
        # One write: torchrun's ranks share the launcher's stderr, and each may refuse at once.
        sys.stderr.write(f"error: {in_flags(e)}\n")
        return 2
    except (JobStopped, StopSignal) as e:  # StopSignal: this process is a torchrun rank
        if not isinstance(e, StopSignal) or int(os.environ.get("RANK", 0)) == 0:
            # A new line: a rank's progress bar may have been cut off mid-line.
            print(f"\nerror: {e}; {_checkpoint_note(cfg)}", file=sys.stderr)
        return stopped_exit_code(e.signum)
    except KeyboardInterrupt:
        raise  # main() reports it
    except Exception as e:  # a rank failed: RankFailed carries its traceback already
        if debug or not isinstance(e, RankFailed):
            traceback.print_exc()
        else:
            print(f"\nerror: {e}", file=sys.stderr)
        return 1
    return 0


def _checkpoint_note(cfg) -> str:
    """Where a stopped run's checkpoint is and how to continue from it, in one clause."""
    from pyg_mgpu.train.checkpoint import CHECKPOINT, describe

    if cfg is None or not cfg.outputs.out:  # stopped before the folder was chosen
        return "no checkpoint (the job stopped before writing one)"
    run_dir = Path(cfg.outputs.out)  # set once the folder was chosen, before any rank ran
    path = run_dir / CHECKPOINT
    try:
        import torch
        ckpt = torch.load(path, weights_only=False, mmap=True, map_location="cpu")
    except Exception:  # none yet (stopped in its first epoch), or unreadable
        return f"no checkpoint in {run_dir} (the job stopped before writing one)"
    return f"checkpoint {path} ({describe(ckpt)}); continue with --resume {run_dir}"


if __name__ == "__main__":
    sys.exit(main())
