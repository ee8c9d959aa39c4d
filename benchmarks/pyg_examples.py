"""Runs PyG's own multi-GPU examples on pyg_mgpu's loaders, on CPU ranks, and checks they learn.

PyG's ``examples/multi_gpu/taobao.py``, ``papers100m_gcn.py`` and ``mag240m_graphsage.py`` need
pyg-lib or torch-sparse for their loaders. With one line changed, the loader import, they run on
pyg_mgpu's pure-torch sampler instead::

    git clone https://github.com/pyg-team/pytorch_geometric        # or any release's examples
    python benchmarks/pyg_examples.py pytorch_geometric/examples/multi_gpu --out pyg_examples_run

What this script changes in each example, and why (each change is printed as a diff):

- the loader import, ``torch_geometric.loader`` -> ``pyg_mgpu``: the change a user makes;
- CPU instead of GPUs, so that the examples run on a machine without one: ``gloo`` for
  ``nccl``, ``.to('cpu')`` for ``.to(rank)``, no ``device_ids``, two ranks, and a free port;
- where the data is: each example reads small files of its dataset's own raw format that this
  script writes (Taobao's ``UserBehavior.csv``, OGB's binary ``ogbn-papers100M``, OGB-LSC's
  ``mag240m_kddcup2021`` arrays), with a learnable signal, so that "beats chance" means something.
  The released ``ogb`` has no ``MAG240MDataset.to_pyg_hetero_data``, which the MAG240M example
  calls, so this script supplies that function over the same files; that example also fails
  under ``DistributedDataParallel`` on any loader (a lazy root weight for featureless authors
  never initialises, and is never used), so this script gives its first layer the paper feature
  width and DDP ``find_unused_parameters``, and (since only its rank 0 calls
  ``acc.compute()``, which waits for every rank by default) its metric ``sync_on_compute=False``,
  so that rank 0 reports its own half of the validation split; and it runs the examples
  with ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1``, since that ogb's ``torch.load`` calls predate
  torch 2.6's ``weights_only`` default.

Each run's last reported metric is compared with chance on the same split (AUC 0.5; the most
frequent label's share for accuracy). Results go to ``<out>/pyg_examples.json``; the script exits
non-zero if an example fails or does not beat chance. It needs ``torchmetrics`` and
``scikit-learn``, which the examples import.
"""
from __future__ import annotations

import argparse
import difflib
import gzip
import json
import os
import re
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

SEED = 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Small datasets in each example's raw format, with labels or links that the features and graph
# explain.

def write_taobao(root: Path, users: int = 1500, items: int = 600, groups: int = 12,
                 per_user: int = 24) -> None:
    """``raw/UserBehavior.csv`` as Taobao ships it: userId,itemId,categoryId,behaviorType,timestamp.
    Each user buys mostly within one group of items, so held-out links are predictable."""
    rng = np.random.default_rng(SEED)
    item_group = rng.integers(groups, size=items)
    item_category = item_group * 3 + rng.integers(3, size=items)
    by_group = [np.flatnonzero(item_group == g) for g in range(groups)]
    user_group = rng.integers(groups, size=users)
    rows = []
    start, end = 1511539200, 1512316799  # the dataset's own time window
    behaviours = np.array(["pv", "cart", "buy", "fav"])
    for u in range(users):
        own = rng.choice(by_group[user_group[u]], size=per_user - 4)
        other = rng.integers(items, size=4)
        for i in np.concatenate([own, other]):
            rows.append((u * 7 + 1, int(i) * 5 + 2, int(item_category[i]) + 100,
                         behaviours[rng.integers(4)], int(rng.integers(start, end))))
    (root / "raw").mkdir(parents=True, exist_ok=True)
    with open(root / "raw" / "UserBehavior.csv", "w") as f:
        f.writelines(",".join(map(str, r)) + "\n" for r in rows)


def labelled_features(rng, labels: np.ndarray, classes: int, dim: int,
                      noise: float) -> np.ndarray:
    centres = rng.normal(size=(classes, dim))
    return (centres[labels] + noise * rng.normal(size=(len(labels), dim))).astype(np.float32)


def homophilous_edges(rng, labels: np.ndarray, per_node: int, same: float) -> np.ndarray:
    n = len(labels)
    order = np.argsort(labels, kind="stable")
    starts = np.searchsorted(labels[order], np.arange(labels.max() + 2))
    src = np.repeat(np.arange(n), per_node)
    dst = rng.integers(n, size=len(src))
    within = rng.random(len(src)) < same
    lo, hi = starts[labels[src[within]]], starts[labels[src[within]] + 1]
    dst[within] = order[lo + (rng.random(within.sum()) * (hi - lo)).astype(np.int64)]
    return np.stack([src, dst])


def write_papers100m(root: Path, n: int = 12000, classes: int = 172, dim: int = 128) -> dict:
    """``ogbn_papers100M`` in OGB's binary raw format (``data.npz``, ``node-label.npz``, a time
    split); as in the real dataset, only the split's nodes are labelled (NaN elsewhere)."""
    rng = np.random.default_rng(SEED)
    folder = root / "ogbn_papers100M"
    (folder / "raw").mkdir(parents=True, exist_ok=True)
    (folder / "split" / "time").mkdir(parents=True, exist_ok=True)
    labels = rng.integers(classes, size=n)
    edges = homophilous_edges(rng, labels, per_node=8, same=0.7)
    np.savez(folder / "raw" / "data.npz", edge_index=edges.astype(np.int64),
             num_nodes_list=np.array([n]), num_edges_list=np.array([edges.shape[1]]),
             node_feat=labelled_features(rng, labels, classes, dim, noise=3.0),
             node_year=rng.integers(1990, 2020, size=(n, 1)))
    perm = rng.permutation(n)
    split = {"train": perm[: n // 2], "valid": perm[n // 2: n // 2 + n // 10],
             "test": perm[n // 2 + n // 10: n // 2 + n // 5]}
    y = np.full((n, 1), np.nan, dtype=np.float32)
    for idx in split.values():
        y[idx, 0] = labels[idx]
    np.savez(folder / "raw" / "node-label.npz", node_label=y)
    for name, idx in split.items():
        with gzip.open(folder / "split" / "time" / f"{name}.csv.gz", "wt") as f:
            f.writelines(f"{i}\n" for i in idx)
    (folder / "RELEASE_v1.txt").write_text("")  # without it OGB asks on stdin to update
    return {"chance": majority_share(labels[split["test"]])}


def write_mag240m(root: Path, papers: int = 6000, authors: int = 3000, institutions: int = 60,
                  classes: int = 153, dim: int = 768) -> dict:
    """``mag240m_kddcup2021`` as OGB-LSC ships it: ``meta.pt``, ``split_dict.pt`` and the
    ``processed/`` arrays (float16 paper features, float labels with NaN outside the splits)."""
    rng = np.random.default_rng(SEED)
    folder = root / "mag240m_kddcup2021"
    labels = rng.integers(classes, size=papers)
    author_field = rng.integers(classes, size=authors)

    def save(rel: str, array: np.ndarray) -> None:
        path = folder / "processed" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        np.save(path, array)

    save("paper/node_feat.npy",
         labelled_features(rng, labels, classes, dim, noise=12.0).astype(np.float16))
    perm = rng.permutation(papers)
    split = {"train": perm[: papers // 2], "valid": perm[papers // 2: papers * 6 // 10],
             "test-whole": perm[papers * 6 // 10: papers * 7 // 10]}
    split["test-dev"], split["test-challenge"] = np.array_split(split["test-whole"], 2)
    y = np.full(papers, np.nan, dtype=np.float32)
    labelled = np.concatenate([split["train"], split["valid"]])
    y[labelled] = labels[labelled]
    save("paper/node_label.npy", y)
    save("paper/node_year.npy", rng.integers(1990, 2020, size=papers).astype(np.int64))
    save("paper___cites___paper/edge_index.npy", homophilous_edges(rng, labels, 6, 0.6))
    # Authors write papers of their own field, mostly.
    writes_src = np.repeat(np.arange(authors), 4)
    field_papers = homophilous_edges(rng, np.concatenate([author_field, labels]), 4, 0.8)
    paper_of = field_papers[1][field_papers[1] >= authors][: len(writes_src)] - authors
    save("author___writes___paper/edge_index.npy",
         np.stack([writes_src[: len(paper_of)], paper_of]).astype(np.int64))
    save("author___affiliated_with___institution/edge_index.npy",
         np.stack([np.arange(authors), rng.integers(institutions, size=authors)]))
    torch.save({"paper": papers, "author": authors, "institution": institutions,
                "num_classes": classes}, folder / "meta.pt")
    torch.save(split, folder / "split_dict.pt")
    (folder / "RELEASE_v1.txt").write_text("")
    return {"chance": majority_share(labels[split["valid"]])}


def majority_share(labels: np.ndarray) -> float:
    return float(np.bincount(labels).max() / len(labels))


# ``MAG240MDataset.to_pyg_hetero_data``, which the example calls and the released ogb lacks: the
# paper features, labels, years and split masks, the three relations and their reverses.
MAG240M_TO_HETERO = '''
import os.path as osp

import numpy as np
import torch
from torch_geometric.data import HeteroData


def to_pyg_hetero_data(dataset):
    data = HeteroData()
    processed = osp.join(dataset.dir, "processed")
    data["paper"].x = torch.from_numpy(np.load(osp.join(processed, "paper", "node_feat.npy")))
    data["paper"].y = torch.from_numpy(np.load(osp.join(processed, "paper", "node_label.npy")))
    data["paper"].year = torch.from_numpy(np.load(osp.join(processed, "paper", "node_year.npy")))
    data.num_classes = dataset.num_classes
    data["author"].num_nodes = dataset.num_authors
    data["institution"].num_nodes = dataset.num_institutions
    for src, rel, dst in [("author", "affiliated_with", "institution"),
                          ("author", "writes", "paper"), ("paper", "cites", "paper")]:
        edge_index = torch.from_numpy(dataset.edge_index(src, rel, dst))
        data[src, rel, dst].edge_index = edge_index
        data[dst, f"rev_{rel}", src].edge_index = edge_index.flip([0])
    for split, name in [("train", "train"), ("valid", "val"), ("test-dev", "test")]:
        mask = torch.zeros(data["paper"].num_nodes, dtype=torch.bool)
        mask[torch.from_numpy(dataset.get_idx_split(split))] = True
        data["paper"][f"{name}_mask"] = mask
    return data
'''


@dataclass
class Example:
    name: str
    loader: str                     # the class whose import changes
    args: list[str]                 # command-line arguments, sized for two CPU cores
    metric: str                     # regex of the metric line; its last match is the result
    done: str                       # regex of the line the example prints when it has finished
    done_times: int = 1             # ... and how many times it prints it by then
    scale: float = 1.0              # the metric in [0, 1]: 0.01 where it prints a percentage
    edits: list[tuple[str, str, str]] = field(default_factory=list)  # (old, new, why)


CPU = "CPU ranks instead of GPUs"
MAG_DDP = ("the example's own bug on more than one device, on any loader: the first layer's "
           "paper -> author convolution has a root weight that never sees an input (authors have "
           "no features), so it stays a lazy parameter that DDP refuses, and an unused one")


def examples(data_root: Path, port: int) -> list[Example]:
    def cpu_edits(extra: list[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
        return [
            ("dist.init_process_group('nccl'", "dist.init_process_group('gloo'", CPU),
            ("os.environ['MASTER_PORT'] = '12355'", f"os.environ['MASTER_PORT'] = '{port}'",
             "a free port"),
            (", device_ids=[rank])", ")", CPU),
            *extra,
        ]

    return [
        Example(
            "taobao", "LinkNeighborLoader",
            ["--num_workers", "0", "--epochs", "5", "--batch_size", "512",
             "--dataset_root_dir", str(data_root / "taobao")],
            r"Test AUC: ([0-9.]+)", r"Test AUC",
            edits=cpu_edits([
                (".to(rank)", ".to('cpu')", CPU),
                ("world_size = torch.cuda.device_count()", "world_size = 2", CPU),
            ])),
        Example(
            "papers100m_gcn", "NeighborLoader",
            ["--n_devices", "2", "--epochs", "3", "--batch_size", "64", "--fan_out", "10",
             "--hidden_channels", "128"],
            r"Test Accuracy: ([0-9.]+)%", r"total_time - prep_time", scale=0.01,
            edits=cpu_edits([
                (".to(rank)", ".to('cpu')", CPU),
                ("torch.cuda.synchronize()", "torch.cpu.synchronize()", CPU),
                ("root='/datasets/ogb_datasets'", f"root={str(data_root)!r}", "where the data is"),
            ])),
        Example(
            "mag240m_graphsage", "NeighborLoader",
            ["--num_devices", "2", "--num_epochs", "3", "--hidden_channels", "128",
             "--batch_size", "128", "--num_neighbors", "10-5", "--log_every_n_steps", "20"],
            r"Val Acc: ([0-9.]+)", r"Val Acc", done_times=3,
            edits=cpu_edits([
                ("model.to(rank)", "model.to('cpu')", CPU),
                ("acc.to(rank)", "acc.to('cpu')", CPU),
                ("batch.to(rank,", "batch.to('cpu',", CPU),
                ("if not torch.cuda.is_available():", "if False:", CPU),
                ("torch.cuda.device_count()", "2", CPU),
                ("num_workers=16", "num_workers=0", "two CPU cores, two ranks"),
                ("persistent_workers=True", "persistent_workers=False", "no worker processes"),
                ("Accuracy(task='multiclass', num_classes=data.num_classes)",
                 "Accuracy(task='multiclass', num_classes=data.num_classes, "
                 "sync_on_compute=False)",
                 "the example's own hang on more than one device: only rank 0 calls "
                 "acc.compute(), which by default gathers from every rank"),
                ("in_channels=-1,", "in_channels=data['paper'].num_features,", MAG_DDP),
                ("model = DistributedDataParallel(model)",
                 "model = DistributedDataParallel(model, find_unused_parameters=True)", MAG_DDP),
                ("MAG240MDataset()", f"MAG240MDataset({str(data_root)!r})", "where the data is"),
                ("data = dataset.to_pyg_hetero_data()",
                 "from mag240m_to_hetero import to_pyg_hetero_data\n"
                 "    data = to_pyg_hetero_data(dataset)",
                 "the released ogb has no MAG240MDataset.to_pyg_hetero_data"),
            ])),
    ]


def rewrite(source: str, example: Example) -> str:
    """The example with its loader import pointed at pyg_mgpu and the listed edits; every edit
    must apply, so that a changed example fails here instead of running something else."""
    pattern = re.compile(rf"^from torch_geometric\.loader import {example.loader}$", re.M)
    if len(pattern.findall(source)) != 1:
        raise SystemExit(f"{example.name}: expected one 'from torch_geometric.loader import "
                         f"{example.loader}' line; has the example changed?")
    source = pattern.sub(f"from pyg_mgpu import {example.loader}", source)
    for old, new, why in example.edits:
        if old not in source:
            raise SystemExit(f"{example.name}: {old!r} not found ({why}); has the example "
                             "changed?")
        source = source.replace(old, new)
    return source


def run(example: Example, folder: Path, out: Path, chance: float, timeout: int) -> dict:
    original = (folder / f"{example.name}.py").read_text()
    edited = rewrite(original, example)
    work = out / example.name
    work.mkdir(parents=True, exist_ok=True)
    script = work / f"{example.name}.py"
    script.write_text(edited)
    (work / "mag240m_to_hetero.py").write_text(MAG240M_TO_HETERO)
    diff = "".join(difflib.unified_diff(original.splitlines(True), edited.splitlines(True),
                                        f"pyg/{example.name}.py", f"edited/{example.name}.py"))
    (work / "changes.diff").write_text(diff)
    print(f"== {example.name}: changes\n{diff}", flush=True)
    command = [sys.executable, script.name, *example.args]
    start = time.perf_counter()
    # The released ogb reads its own files with torch.load's old default, which torch >= 2.6
    # refuses; torch's documented switch restores it, for these trusted, generated files.
    env = {**os.environ, "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"}
    proc = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True,
                          timeout=timeout)
    seconds = time.perf_counter() - start
    log = proc.stdout + proc.stderr
    (work / "output.log").write_text(log)
    found = re.findall(example.metric, log)
    metric = float(found[-1]) * example.scale if found else None
    # torch's gloo backend sometimes aborts a process at interpreter exit, after all its work
    # ("terminate called without an active exception"), with or without pyg_mgpu; so whether
    # the example finished is read from its own last line, and the exit code is reported too.
    finished = len(re.findall(example.done, log)) >= example.done_times
    result = {"example": example.name, "loader": f"pyg_mgpu.{example.loader}",
              "command": " ".join(command), "finished": finished,
              "returncode": proc.returncode, "seconds": round(seconds, 1), "metric": metric,
              "chance": round(chance, 4),
              "beats_chance": finished and metric is not None and metric > chance}
    lines = [line for line in log.splitlines()
             if line.strip() and "it/s]" not in line and "s/it]" not in line]
    tail = "\n".join(lines[-12:])  # without tqdm's bars
    print(f"== {example.name}: {'finished' if finished else 'DID NOT FINISH'}, exit "
          f"{proc.returncode}, {seconds:.0f} s, metric {metric} (chance {chance:.4f})\n{tail}\n",
          flush=True)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("examples", type=Path, help="PyG's examples/multi_gpu folder")
    parser.add_argument("--out", type=Path, default=Path("pyg_examples_run"))
    parser.add_argument("--only", nargs="*", help="run only these examples (by file stem)")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per example")
    args = parser.parse_args()
    out = args.out.resolve()
    data_root = out / "data"
    chance = {"taobao": 0.5}
    write_taobao(data_root / "taobao")
    chance["papers100m_gcn"] = write_papers100m(data_root)["chance"]
    chance["mag240m_graphsage"] = write_mag240m(data_root)["chance"]
    results = []
    for example in examples(data_root, free_port()):
        if args.only and example.name not in args.only:
            continue
        results.append(run(example, args.examples, out, chance[example.name], args.timeout))
    (out / "pyg_examples.json").write_text(json.dumps(results, indent=2) + "\n")
    for r in results:
        print(f"{r['example']:<20} {r['loader']:<30} finished {r['finished']}, exit "
              f"{r['returncode']}  metric "
              f"{r['metric']}  chance {r['chance']}  {'beats chance' if r['beats_chance'] else 'FAILS'}")
    return 0 if results and all(r["beats_chance"] for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
