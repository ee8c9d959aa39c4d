"""What a training batch holds, measured: ``python -m pyg_mgpu.tools.batch_sizes [flags]``.

The training CLI's flags (``python -m pyg_mgpu.distributed_sampling``'s: the graph, fanout,
batch size, devices, ``--amp`` for the features' type) and ``--batches N``. Rank 0 of a one-rank
job builds its loader as the CLI does (the run plan: where the graph lives, batches per walk,
the feature cache) and draws N batches of the first epoch; for each hop it reports the new
(unique) nodes and the sampled edges, and per batch the feature bytes gathered, means over the
batches. The numbers a step's memory traffic is estimated from.

Importing this module loads no torch (torch is imported where a loader is built), so that
:func:`format_sizes` serves reports that only read a measurement's JSON, such as
``benchmarks/gpu_floor.py``, without torch's seconds of start-up.
"""
from __future__ import annotations

import contextlib
import json
import statistics
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Sequence

from pyg_mgpu.files import check_writable, save_text
from pyg_mgpu.tools.cli import Parser, add_setting_flags

if TYPE_CHECKING:
    import torch


def measure_batches(loader, batches: int) -> dict:
    """Per hop, the mean new nodes and sampled edges of the loader's first ``batches``
    batches (fewer in a shorter epoch), and the mean nodes, edges and feature bytes a batch
    gathers. A loader whose batches carry no ``x`` (``--fused-aggregation`` reading the
    ``feature_table`` in place) counts the bytes of the rows its ``n_id`` name, which the first
    layer reads instead."""
    table = getattr(loader, "feature_table", None)
    nodes, edges, feature_bytes = [], [], []
    for i, batch in enumerate(loader):
        if i == batches:
            break
        nodes.append([int(n) for n in batch.num_sampled_nodes])
        edges.append([int(e) for e in batch.num_sampled_edges])
        if table is None:
            feature_bytes.append(batch.x.numel() * batch.x.element_size())
        else:
            feature_bytes.append(batch.n_id.numel() * table[0].numel() * table.element_size())
    if not nodes:
        raise ValueError("the loader gave no batch: the training split is empty")

    def mean(values) -> float:
        return statistics.fmean(values)

    return {"batches": len(nodes),
            "nodes_per_hop": [mean(hop) for hop in zip(*nodes)],
            "edges_per_hop": [mean(hop) for hop in zip(*edges)],
            "nodes": mean(sum(n) for n in nodes), "edges": mean(sum(e) for e in edges),
            "feature_bytes": mean(feature_bytes),
            "feature_row_bytes": feature_bytes[0] / max(1, sum(nodes[0]))}


@contextlib.contextmanager
def _one_rank(device: torch.device):
    """This process as rank 0 of a one-rank job (gloo: its collectives stay on the host)."""
    import torch
    import torch.distributed as dist

    from pyg_mgpu.distributed.context import RankContext
    if device.type == "cuda":
        torch.cuda.set_device(device)  # as a CLI rank does: its kernels on its GPU
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield RankContext(rank=0, world_size=1, local_rank=device.index or 0, device=device,
                          backend="gloo")
    finally:
        dist.destroy_process_group()


def batch_sizes(cfg, batches: int = 8) -> dict:
    """:func:`measure_batches` over the training loader a config's rank 0 builds, with the
    run plan's settings; the first of the config's devices."""
    from pyg_mgpu.distributed.devices import resolve_devices
    from pyg_mgpu.train.dataset import load_configured
    from pyg_mgpu.train.trainer import build_loaders

    device = resolve_devices(cfg.ranks.devices, 1 if cfg.ranks.nprocs is None
                             else cfg.ranks.nprocs, cfg.ranks.backend)[0]
    graph = load_configured(cfg)
    with _one_rank(device) as ctx:
        data = build_loaders(cfg, graph, ctx)
        data.train_loader.set_epoch(0)
        result = measure_batches(data.train_loader, batches)
    plan = data.plan.to_dict()
    plan.pop("backend")  # this measurement's own, not a training run's
    return {**result, "batch_size": cfg.training.batch_size,
            "fanout": list(cfg.training.fanout), "device": str(device), "plan": plan}


def format_sizes(result: dict) -> str:
    """The sizes as Markdown: a row per hop, then the batch's totals."""
    plan = result["plan"]
    seeds = result["nodes_per_hop"][0]  # at most the batch size: shards cut into equal batches
    cut = (f" (--batch-size {result['batch_size']:,}: each rank's shard is cut into equal "
           "batches)" if round(seeds) != result["batch_size"] else "")
    lines = [f"{result['batches']} training batches of {seeds:,.0f} seeds{cut}, fanout "
             f"{','.join(map(str, result['fanout']))}, on {result['device']} (graph on "
             f"{plan['graph_on']}, {plan['sample_batches']} batches per walk); means per batch:",
             "", "| hop | new nodes | sampled edges |", "| --- | --- | --- |"]
    edges = [None, *result["edges_per_hop"]]  # hop 0 holds the seeds, drawn by no edge
    for hop, (n, e) in enumerate(zip(result["nodes_per_hop"], edges)):
        lines.append(f"| {hop}{' (seeds)' if hop == 0 else ''} | {n:,.0f} | "
                     f"{'-' if e is None else f'{e:,.0f}'} |")
    lines.append(f"| all | {result['nodes']:,.0f} | {result['edges']:,.0f} |")
    lines += ["", f"Features gathered: {result['feature_bytes'] / 1e6:,.2f} MB per batch "
                  f"({result['feature_row_bytes']:.0f} bytes per node)."]
    return "\n".join(lines) + "\n"


def build_parser():
    parser = Parser(prog="python -m pyg_mgpu.tools.batch_sizes",
                    description="Nodes per hop, edges per hop and feature bytes of the training "
                                "batches the CLI would draw with these flags.")
    parser.add_argument("--batches", type=int, default=8, help="batches to draw and average")
    parser.add_argument("--json", dest="json_out", metavar="FILE",
                        help="also write the numbers to this file")
    from pyg_mgpu.train.config import TrainConfig
    add_setting_flags(parser, TrainConfig)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    from pyg_mgpu.train.config import ConfigError, TrainConfig, in_flags

    args = vars(build_parser().parse_args(argv))
    batches, json_out = args.pop("batches"), args.pop("json_out")
    try:
        if batches < 1:
            raise ConfigError(f"--batches must be a positive number, got {batches}.")
        if json_out:  # refused now, not after the measurement
            _check_json_out(Path(json_out))
        cfg = TrainConfig.from_flags(**args)
        if cfg.data.is_hetero:
            raise ConfigError(f"--dataset {cfg.data.dataset} is heterogeneous; this measures "
                              "the batches of homogeneous graphs (one node and edge type).")
        result = batch_sizes(cfg, batches)
    except (ConfigError, ValueError, OSError) as e:
        print(f"error: {in_flags(e)}", file=sys.stderr)
        return 2
    print(format_sizes(result), end="")
    if json_out:
        try:
            save_text(json.dumps(result, indent=1) + "\n", Path(json_out))
        except OSError as e:
            print(f"error: --json {json_out}: cannot write there ({e.strerror}); the sizes are "
                  "printed above.", file=sys.stderr)
            return 1
    return 0


def _check_json_out(path: Path) -> None:
    from pyg_mgpu.train.config import ConfigError

    try:
        if path.is_dir():
            raise IsADirectoryError(21, "a folder")
        check_writable(path.parent)
    except OSError as e:
        raise ConfigError(f"--json {path}: cannot write there ({e.strerror}); choose a file "
                          "in a writable folder.") from None


if __name__ == "__main__":
    sys.exit(main())
