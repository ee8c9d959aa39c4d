"""GraphSAGE's neighbour means, fused Triton kernels against embedding_bag, on one GPU.

    python benchmarks/fused_mean.py                   # products-sized batch: check, then time
    python benchmarks/fused_mean.py --check-only --num-nodes 20000 --batch-size 64

A batch shaped like one of the products-sized graph at fanout 15,10,5 (made up here, not
sampled: each hop's nodes take ``fanout`` edges from uniformly drawn nodes of the hops up to
the next; a few destinations are hubs with many more edges) is aggregated layer by layer,
as the trimmed model does, both ways:

- ``embedding_bag``: the features gathered into ``x[n_id]`` first, then
  :func:`pyg_mgpu.nn.sage.mean_aggregate` (its backward sorts the edges by source);
- ``fused``: :func:`pyg_mgpu.nn.fused_mean.gather_mean`, layer 1 reading the table through
  ``n_id``, int32 pointers and sources.

It first checks that both give the same means and gradients (fp32 to 1e-4, bf16 to 2e-2,
and the whole model's logits and weight gradients to 1e-3), then prints each layer's median
forward and forward + backward time in ms (CUDA events) and a whole model step
(GraphSAGE forward and backward, 3 layers, hidden 256) with ``fused_aggregation`` off and on,
and writes them to ``--out`` as JSON if given. Exits 1 when a check fails.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from any folder
from pyg_mgpu.nn.fused_mean import gather_mean  # noqa: E402
from pyg_mgpu.nn.sage import GraphSAGE, mean_aggregate  # noqa: E402


def synthetic_batch(num_nodes: int, batch_size: int, fanouts: list[int], hub_edges: int,
                    device: torch.device, gen: torch.Generator) -> dict:
    """Per-hop node counts, edges sorted by destination (sources, destinations), ``n_id``."""
    counts = [batch_size]
    for fanout in fanouts:  # deduplication keeps about 80% of a hop's new nodes
        counts.append(min(int(counts[-1] * fanout * 0.8), num_nodes - sum(counts)))
    src, dst, edges_per_hop, first = [], [], [], 0
    for hop, fanout in enumerate(fanouts):
        n, upto = counts[hop], sum(counts[:hop + 2])
        degree = torch.randint(0, fanout + 1, (n,), generator=gen)
        degree[: max(1, n // 1000)] = hub_edges  # a few hubs, longer than a block of edges
        hop_dst = torch.repeat_interleave(torch.arange(first, first + n), degree)
        src.append(torch.randint(0, upto, (hop_dst.numel(),), generator=gen))
        dst.append(hop_dst)
        edges_per_hop.append(hop_dst.numel())
        first += n
    n_id = torch.randperm(num_nodes, generator=gen)[:sum(counts)]
    edge_index = torch.stack([torch.cat(src), torch.cat(dst)]).to(device)
    return {"nodes": counts, "edges": edges_per_hop, "edge_index": edge_index,
            "n_id": n_id.to(device)}


def median_ms(fn, repeats: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def layers(batch: dict, table: torch.Tensor, hidden: int, dtype: torch.dtype):
    """Each trimmed layer's inputs, as the model hands them to its aggregation."""
    edge_index, n_id = batch["edge_index"], batch["n_id"]
    num_layers = len(batch["edges"])
    nodes_upto = [sum(batch["nodes"][:i + 1]) for i in range(num_layers + 1)]
    edges_upto = [sum(batch["edges"][:i + 1]) for i in range(num_layers)]
    ptr = torch.searchsorted(edge_index[1], torch.arange(nodes_upto[-2] + 1,
                                                         device=edge_index.device))
    for i in range(num_layers):
        num_dst, num_edges = nodes_upto[num_layers - 1 - i], edges_upto[num_layers - 1 - i]
        num_src = nodes_upto[num_layers - i]
        if i == 0:
            source = table  # no gradient, read through n_id
        else:
            source = torch.randn(num_src, hidden, device=table.device, dtype=dtype,
                                 requires_grad=True)
        yield i, dict(source=source, ptr=ptr[:num_dst + 1], src=edge_index[0, :num_edges],
                      dst=edge_index[1, :num_edges], deg=ptr.diff(), num_dst=num_dst,
                      n_id=n_id[:num_src] if i == 0 else None)


def embedding_bag_way(layer: dict):
    x = layer["source"] if layer["n_id"] is None else layer["source"][layer["n_id"]]
    return mean_aggregate(x, layer["ptr"], layer["src"], layer["dst"], layer["deg"],
                          layer["num_dst"])


def fused_way(layer: dict, ptr32: torch.Tensor, src32: torch.Tensor):
    return gather_mean(layer["source"], ptr32, src32, layer["n_id"], layer["num_dst"])


def run_layer(way, layer: dict, grad: torch.Tensor):
    agg, root = way()
    if layer["source"].requires_grad:
        layer["source"].grad = None
        torch.autograd.backward([agg, root], [grad, grad[:root.size(0)].to(root.dtype)])
    return agg, layer["source"].grad


def check(name: str, got: torch.Tensor, want: torch.Tensor, tol: float, failures: list) -> None:
    error = (got.float() - want.float()).abs().max().item() if got.numel() else 0.0
    scale = max(want.float().abs().max().item(), 1.0) if want.numel() else 1.0
    ok = error <= tol * scale
    print(f"check {name}: max error {error:.3g} (tolerance {tol * scale:.3g}) "
          f"{'ok' if ok else 'FAILED'}")
    if not ok:
        failures.append(name)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--num-nodes", type=int, default=2_400_000)
    p.add_argument("--num-features", type=int, default=100)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--fanout", default="15,10,5")
    p.add_argument("--hub-edges", type=int, default=200, help="edges of each hub destination")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--device", default="cuda")
    p.add_argument("--check-only", action="store_true", help="check, do not time")
    p.add_argument("--out", default=None, help="a JSON file for the times")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    gen = torch.Generator().manual_seed(0)
    fanouts = [int(f) for f in args.fanout.split(",")]
    batch = synthetic_batch(args.num_nodes, args.batch_size, fanouts, args.hub_edges, device, gen)
    print(f"batch: nodes per hop {batch['nodes']}, edges per hop {batch['edges']}")
    failures, results = [], {"nodes": batch["nodes"], "edges": batch["edges"], "layers": []}
    ptr32 = src32 = None
    for dtype, tol in ((torch.float32, 1e-4), (torch.bfloat16, 2e-2)):
        table = torch.randn(args.num_nodes, args.num_features, device=device, dtype=dtype)
        for i, layer in layers(batch, table, args.hidden, dtype):
            ptr32, src32 = layer["ptr"].to(torch.int32), layer["src"].to(torch.int32)
            grad = torch.randn(layer["num_dst"], layer["source"].size(1), device=device,
                               dtype=dtype)
            ours = run_layer(lambda: fused_way(layer, ptr32, src32), layer, grad)
            theirs = run_layer(lambda: embedding_bag_way(layer), layer, grad)
            tag = f"layer {i + 1} {str(dtype).removeprefix('torch.')}"
            check(f"{tag} means", ours[0], theirs[0], tol, failures)
            if ours[1] is not None:
                check(f"{tag} gradient", ours[1], theirs[1], tol, failures)
            if args.check_only or device.type != "cuda":
                continue
            row = {"layer": i + 1, "dtype": str(dtype), "num_dst": layer["num_dst"],
                   "num_edges": layer["src"].numel()}
            for way, fn in (("embedding_bag", lambda: embedding_bag_way(layer)),
                            ("fused", lambda: fused_way(layer, ptr32, src32))):
                with torch.no_grad():
                    row[f"{way}_forward_ms"] = median_ms(fn, args.repeats)
                if layer["source"].requires_grad:
                    row[f"{way}_forward_backward_ms"] = median_ms(
                        lambda: run_layer(fn, layer, grad), args.repeats)
            print(json.dumps(row))
            results["layers"].append(row)
    if device.type == "cuda":
        model_step(batch, args, device, failures, results)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    print("all checks passed" if not failures else f"FAILED: {', '.join(failures)}")
    return 1 if failures else 0


def model_step(batch: dict, args, device, failures: list, results: dict) -> None:
    """The whole model, forward and backward, with ``fused_aggregation`` off and on."""
    table = torch.randn(args.num_nodes, args.num_features, device=device)
    counts = (batch["nodes"], batch["edges"])
    logits, grads, models = [], [], []
    for fused in (False, True):
        torch.manual_seed(0)
        model = GraphSAGE(args.num_features, args.hidden, 47, len(batch["edges"]), dropout=0.0,
                          fused_aggregation=fused).to(device)
        out = model(table, batch["edge_index"], *counts, n_id=batch["n_id"])
        F.cross_entropy(out, torch.zeros(out.size(0), dtype=torch.long, device=device)).backward()
        logits.append(out.detach())
        grads.append(torch.cat([q.grad.flatten() for q in model.parameters()]))
        models.append(model)
    check("model logits", logits[1], logits[0], 1e-3, failures)
    check("model weight gradients", grads[1], grads[0], 1e-3, failures)
    if args.check_only:
        return
    for fused, model in zip(("embedding_bag", "fused"), models):
        def step():
            model.zero_grad(set_to_none=True)
            model(table, batch["edge_index"], *counts, n_id=batch["n_id"]).sum().backward()
        results[f"model_step_{fused}_ms"] = median_ms(step, args.repeats)
    print(f"model step (fp32): embedding_bag {results['model_step_embedding_bag_ms']:.3f} ms, "
          f"fused {results['model_step_fused_ms']:.3f} ms")


if __name__ == "__main__":
    sys.exit(main())
