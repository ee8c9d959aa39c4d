"""``python -m pyg_mgpu.bench --predict``: every node's outputs through :func:`pyg_mgpu.predict`
against PyG's own way, ``model.inference(subgraph_loader)`` over a one-hop, all-neighbour loader
as in PyG's Reddit example (:func:`pyg_mgpu.layerwise_inference`, whose loader is
``pyg_mgpu.NeighborLoader(num_neighbors=[-1])``: PyG's own needs pyg-lib or torch-sparse), with
PyG's ``GraphSAGE`` on the bench's synthetic graph, in this one process.

What made the ratio move between runs, and what holds each of them still here:

- The graph's CSC is built by the first call that needs it and cached with the ``Data``: it is
  built before any timing, so the side that runs first does not pay it.
- ``pyg_mgpu.predict`` leaves gigabytes of dirty file pages (its layer files) that the kernel
  writes back while the next call runs: every timed call starts after ``os.sync()`` and the
  removal of the previous call's folder.
- First calls grow the allocator's heap, start torch's thread pool and import PyG's loader: one
  untimed call of each side on a small graph comes first.
- Both sides run on the same torch thread count, recorded; other work on the machine is what
  remains, so the sides alternate order round by round (``A B``, ``B A``, ...) and the ratio
  reported is the median over rounds of each round's ratio.
"""
from __future__ import annotations

import os
import shutil
import statistics
import time
from pathlib import Path

from pyg_mgpu.tools.sampler_bench import synthetic_graph

SIDES = ("pyg_inference", "pyg_mgpu_predict")


def round_orders(rounds: int) -> list[tuple[str, str]]:
    """The sides' order in each round: alternating, so each runs first equally often (for an
    even count)."""
    return [SIDES if r % 2 == 0 else SIDES[::-1] for r in range(rounds)]


def summarize(times: dict[str, list[float]]) -> dict:
    """Per side its times and median; each round's ratio (PyG's time over pyg_mgpu's) and
    their median."""
    ratios = [pyg / ours for pyg, ours in zip(*(times[side] for side in SIDES))]
    return {**{f"{side}_s": times[side] for side in SIDES},
            **{f"{side}_median_s": statistics.median(times[side]) for side in SIDES},
            "ratios": ratios, "ratio_median": statistics.median(ratios)}


def run_predict_bench(args, out: Path) -> dict:
    """Times both sides ``args.repeats`` times on the bench's graph (see the module's
    docstring); also returns their outputs' largest difference."""
    import numpy as np
    import torch
    from torch_geometric.nn import GraphSAGE

    import pyg_mgpu
    from pyg_mgpu.data.csc import csc_of

    layers = len(args.fanout.split(","))  # the training systems' depth: a layer per hop

    def model_for(num_features: int) -> torch.nn.Module:
        torch.manual_seed(args.seed)
        return GraphSAGE(num_features, args.hidden, layers,
                         out_channels=args.num_classes).eval()

    def sides(data, model, folder: Path) -> dict:
        return {"pyg_inference": lambda: pyg_mgpu.layerwise_inference(
                    model, data, batch_size=args.batch_size),
                "pyg_mgpu_predict": lambda: pyg_mgpu.predict(
                    model, data, folder, batch_size=args.batch_size).logits}

    small = synthetic_graph(type(args)(**{**vars(args), "num_nodes": 2000,
                                          "num_edges": 20_000})).to_data()
    shutil.rmtree(out / "warm-up", ignore_errors=True)  # a stopped bench's: predict keeps outputs
    for call in sides(small, model_for(small.num_features), out / "warm-up").values():
        call()
    data = synthetic_graph(args).to_data()
    csc_of(data)
    model = model_for(data.num_features)
    calls, folder = sides(data, model, out / "predictions"), out / "predictions"
    times: dict[str, list[float]] = {side: [] for side in SIDES}
    results = {}
    for order in round_orders(args.repeats):
        for side in order:
            shutil.rmtree(folder, ignore_errors=True)
            os.sync()
            start = time.perf_counter()
            results[side] = calls[side]()
            times[side].append(time.perf_counter() - start)
            print(f"{side:18s} {times[side][-1]:8.2f} s", flush=True)
    difference = (torch.from_numpy(np.array(results["pyg_mgpu_predict"]))
                  - results["pyg_inference"]).abs().max().item()
    shutil.rmtree(folder, ignore_errors=True)
    shutil.rmtree(out / "warm-up", ignore_errors=True)
    return {**summarize(times), "max_abs_difference": difference,
            "threads": torch.get_num_threads(), "num_layers": layers,
            "num_nodes": data.num_nodes, "num_edges": data.num_edges}


def format_predict(results: dict) -> str:
    return (f"PyG model.inference: median {results['pyg_inference_median_s']:.2f} s | "
            f"pyg_mgpu.predict: median {results['pyg_mgpu_predict_median_s']:.2f} s | "
            f"PyG / pyg_mgpu: median {results['ratio_median']:.2f}x over "
            f"{len(results['ratios'])} rounds ("
            + ", ".join(f"{r:.2f}" for r in results["ratios"])
            + f") | max abs difference {results['max_abs_difference']:.1e} | "
            f"{results['threads']} threads")
