"""Loading and training at scale on one machine: load time (first run, cached), the load-time
memory peak over the dataset's bytes, per-rank PSS and epoch time, for graphs of 100k to 10M
nodes, plus the products-like ``.npz`` graph (shm against mmap features, and the code before
the streaming conversion as the baseline, run in the same script).

    python benchmarks/scale.py --work /tmp/scale --out docs/scale [--sizes 100k,1M,2.4M,10M]
        [--baseline-commit 3404bc3]

Every run is the CLI under ``python -m pyg_mgpu.memory`` (2 CPU ranks, fanout 15,10,5, batch
1024, one epoch). Every epoch trains the same 20,480 seeds whatever the graph's size, so the
epoch times compare graphs, not split sizes. Writes ``results.json``, ``results.csv`` and
``scale.png`` to ``--out``, and ``features_ab.json`` (epoch times with /dev/shm against mapped
features, alternating runs).
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SEEDS, EVAL_NODES = 20_480, 5_000

# name: (nodes, directed edges, features); products-like is read from an .npz file.
SIZES = {"100k": (100_000, 5_000_000, 100), "1M": (1_000_000, 50_000_000, 100),
         "2.4M": (2_400_000, 120_000_000, 100), "10M": (10_000_000, 200_000_000, 128)}


def splits(nodes: int) -> str:
    return f"{SEEDS / nodes:.8f},{EVAL_NODES / nodes:.8f},{EVAL_NODES / nodes:.8f}"


def run(name: str, cli: list[str], work: Path, python_path: Path = REPO) -> dict:
    """One CLI run under the PSS meter; its figures from memory.json and metrics.json."""
    out = work / "runs" / name
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    # The meter is always this checkout's; the measured CLI may be the baseline's.
    # (run as a file: "-m" would import the package from the working folder, the baseline's)
    command = [sys.executable, str(REPO / "pyg_mgpu" / "memory.py"), "--interval", "0.1", "--",
               "env", f"PYTHONPATH={python_path}",
               sys.executable, "-m", "pyg_mgpu.distributed_sampling", *cli,
               "--devices", "cpu", "--nprocs", "2", "--fanout", "15,10,5",
               "--batch-size", "1024", "--epochs", "1", "--out", str(out)]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    print(f"[{time.strftime('%H:%M:%S')}] {name}: {' '.join(command[7:])}", flush=True)
    proc = subprocess.run(command, env=env, cwd=python_path, capture_output=True, text=True)
    log = proc.stdout + proc.stderr
    (out / "log.txt").write_text(log)
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed (exit {proc.returncode}):\n{log[-3000:]}")
    memory = json.loads((out / "memory.json").read_text())
    metrics = json.loads((out / "metrics.json").read_text())
    ranks = memory["processes"][1:]  # the first is the CLI's parent
    row = {
        "run": name,
        "load_time_s": metrics["load_time_s"],
        "dataset_mb": metrics["dataset_bytes"] / 2**20,
        # RAM = PSS outside shared memory + /dev/shm growth: counts a /dev/shm copy of the
        # graph before any process maps it (PSS alone would not).
        "load_peak_mb": memory["load_peak_ram_mb"],
        "load_peak_per_dataset": memory["load_peak_ram_per_dataset"],
        "load_peak_pss_mb": memory["load_peak_pss_mb"],
        "peak_total_mb": memory["peak_ram_mb"],
        "peak_total_pss_mb": memory["peak_total_pss_mb"],
        "rank_peak_mb": max(p["peak_pss_mb"] for p in ranks) if ranks else None,
        "epoch_time_s": metrics["epochs"][0]["epoch_time_s"],
        "cache": next((line for line in log.splitlines()
                       if line.startswith("graph cache:")), ""),
    }
    print("    " + ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}"
                             for k, v in row.items() if k != "run"), flush=True)
    return row


def features_ab(npz: Path, work: Path, cache: Path, repeats: int = 2) -> dict:
    """Epoch time with features in /dev/shm against mapped from the cache, warm page cache:
    the two alternate, ``repeats`` runs of 2 epochs each, without the meter."""
    times = {"shm": [], "mmap": []}
    for _ in range(repeats):
        for mode in times:
            out = work / "runs" / f"ab-{mode}"
            shutil.rmtree(out, ignore_errors=True)
            cli = [sys.executable, "-m", "pyg_mgpu.distributed_sampling", "--dataset", str(npz),
                   "--cache-dir", str(cache), "--features-on", mode, "--devices", "cpu",
                   "--nprocs", "2", "--fanout", "15,10,5", "--batch-size", "1024",
                   "--epochs", "2", "--out", str(out)]
            subprocess.run(cli, check=True, capture_output=True, cwd=REPO,
                           env=dict(os.environ, PYTHONPATH=str(REPO)))
            epochs = json.loads((out / "metrics.json").read_text())["epochs"]
            times[mode] += [e["epoch_time_s"] for e in epochs]
    mean = {mode: sum(t) / len(t) for mode, t in times.items()}
    result = {"epoch_times_s": times, "mean_s": mean, "mmap_over_shm": mean["mmap"] / mean["shm"]}
    print(f"features shm vs mmap: {json.dumps(result)}", flush=True)
    return result


def products_npz(work: Path) -> Path:
    """The products-like graph as an .npz file (written once; not part of any measurement)."""
    path = work / "products_like.npz"
    if not path.exists():
        sys.path.insert(0, str(REPO))
        import numpy as np
        import torch

        from pyg_mgpu.data.synthetic import SyntheticSpec, make_synthetic
        nodes, edges, features = SIZES["2.4M"]
        spec = SyntheticSpec(num_nodes=nodes, num_edges=edges, num_features=features,
                             num_classes=47, train_fraction=SEEDS / nodes,
                             val_fraction=EVAL_NODES / nodes, test_fraction=EVAL_NODES / nodes)
        print(f"writing {path}", flush=True)
        graph = make_synthetic(spec, seed=0)
        # Edges in random order, as a user's edge list comes (save_npz would write them
        # grouped by destination, which lets any conversion skip its sort).
        edge_index = graph.edge_index()
        edge_index = edge_index[:, torch.randperm(graph.num_edges,
                                                  generator=torch.Generator().manual_seed(0))]
        np.savez(path, edge_index=edge_index.numpy(), x=graph.x.numpy(), y=graph.y.numpy(),
                 train_idx=graph.train_idx.numpy(), val_idx=graph.val_idx.numpy(),
                 test_idx=graph.test_idx.numpy(), num_classes=np.int64(graph.num_classes))
    return path


def baseline_checkout(work: Path, commit: str) -> Path:
    tree = work / f"baseline-{commit}"
    if not tree.exists():
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(tree), commit],
                       check=True)
    return tree


def plot(rows: list[dict], out: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sized = [r for r in rows if r["run"].startswith("synthetic-") and r["run"].endswith("-cached")]
    first = {r["run"].removesuffix("-first"): r for r in rows if r["run"].endswith("-first")}
    nodes = [r["nodes"] for r in sized]
    fig, (mem, epoch) = plt.subplots(1, 2, figsize=(11, 4))
    mem.plot(nodes, [r["dataset_mb"] / 1024 for r in sized], "k--", label="dataset")
    mem.plot(nodes, [first[r["run"].removesuffix("-cached")]["load_peak_mb"] / 1024
                     for r in sized], "o-", label="load peak, first run")
    mem.plot(nodes, [r["load_peak_mb"] / 1024 for r in sized], "s-", label="load peak, cached")
    mem.plot(nodes, [r["peak_total_mb"] / 1024 for r in sized], "^-",
             label="peak of the whole run (2 ranks training)")
    for r in rows:
        if r["run"] == "products-baseline":
            mem.plot([r["nodes"]], [r["load_peak_mb"] / 1024], "rx", markersize=9,
                     label="load peak before streaming (products-like .npz)")
    mem.set(xscale="log", xlabel="nodes", ylabel="GiB",
            title="RAM (PSS outside shm + /dev/shm growth)")
    mem.legend(fontsize=8)
    epoch.plot(nodes, [r["epoch_time_s"] for r in sized], "o-", label="epoch (20,480 seeds)")
    epoch.plot(nodes, [first[r["run"].removesuffix("-cached")]["load_time_s"] for r in sized],
               "s-", label="load, first run")
    epoch.plot(nodes, [r["load_time_s"] for r in sized], "^-", label="load, cached")
    epoch.set(xscale="log", yscale="log", xlabel="nodes", ylabel="seconds",
              title="Time (2 CPU ranks, fanout 15,10,5)")
    epoch.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "scale.png", dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", type=Path, default=Path("/tmp/pyg_mgpu_scale"))
    p.add_argument("--out", type=Path, default=REPO / "docs" / "scale")
    p.add_argument("--sizes", default="100k,1M,2.4M,10M")
    p.add_argument("--baseline-commit", default="3404bc3",
                   help="the code before the streaming conversion and the cache; '' skips it")
    p.add_argument("--skip-products", action="store_true")
    p.add_argument("--plot-only", action="store_true",
                   help="redraw scale.png from --out's results.json, running nothing")
    args = p.parse_args()
    if args.plot_only:
        plot(json.loads((args.out / "results.json").read_text()), args.out)
        return
    args.work.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    cache = args.work / "cache"
    rows = []

    def record(row: dict, **extra) -> None:
        rows.append({**row, **extra})
        (args.out / "results.json").write_text(json.dumps(rows, indent=1))

    if not args.skip_products:
        npz = products_npz(args.work)
        nodes = SIZES["2.4M"][0]
        if args.baseline_commit:
            tree = baseline_checkout(args.work, args.baseline_commit)
            record(run("products-baseline", ["--dataset", str(npz)], args.work, tree),
                   nodes=nodes)
        shutil.rmtree(cache, ignore_errors=True)
        common = ["--dataset", str(npz), "--cache-dir", str(cache)]
        record(run("products-first", common + ["--features-on", "shm"], args.work), nodes=nodes)
        for mode in ("shm", "mmap"):
            record(run(f"products-cached-{mode}", common + ["--features-on", mode], args.work),
                   nodes=nodes)
        (args.out / "features_ab.json").write_text(
            json.dumps(features_ab(npz, args.work, cache), indent=1))
    for size in args.sizes.split(","):
        nodes, edges, features = SIZES[size]
        common = ["--dataset", "synthetic", "--num-nodes", str(nodes), "--num-edges", str(edges),
                  "--num-features", str(features), "--split-fractions", splits(nodes),
                  "--cache-dir", str(cache)]
        shutil.rmtree(cache, ignore_errors=True)
        record(run(f"synthetic-{size}-first", common + ["--features-on", "shm"], args.work),
               nodes=nodes)
        record(run(f"synthetic-{size}-cached", common + ["--features-on", "shm"], args.work),
               nodes=nodes)
    shutil.rmtree(cache, ignore_errors=True)
    with open(args.out / "results.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    plot(rows, args.out)
    print(f"wrote {args.out}/results.json, results.csv, scale.png")


if __name__ == "__main__":
    main()
