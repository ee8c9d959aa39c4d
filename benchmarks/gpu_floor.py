"""``gpu_floor.md``: what ``benchmarks/gpu_floor.sh`` measured so far, as Markdown for
docs/benchmarks.md.

    python benchmarks/gpu_floor.py FOLDER "GRAPH FLAGS"

Reads FOLDER's (the script's ``gpu-floor`` work folder, the one ``gpu-floor.tgz`` holds)
``steps.tsv`` (step, exit code or why it did not run or finish, seconds, an A/B run's flags),
``env.txt``, ``batch_sizes.json``, ``kernels.md``, each A/B run's ``metrics.json`` and
``fused_mean.json`` (``benchmarks/fused_mean.py``'s times), and writes FOLDER/gpu_floor.md.
The baseline of the A/B table is the ``fp32`` run (strict fp32 matmuls); TF32 becomes the
default only if it keeps test accuracy within ``TF32_RULE`` of it.
The script runs this after every step, so it imports no torch.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

TF32_RULE = 0.002
BASELINE = "fp32"


def read_steps(out: Path) -> list[dict]:
    steps = []
    path = out / "steps.tsv"
    for line in path.read_text().splitlines() if path.is_file() else []:
        name, status, seconds, flags = (line.split("\t") + [""] * 4)[:4]
        steps.append({"name": name, "status": status, "seconds": seconds, "flags": flags})
    return steps


def run_numbers(out: Path, name: str) -> dict | None:
    """The last epoch's time, seeds per second, GPU busy share and test accuracy of a run."""
    path = out / name / "metrics.json"
    if not path.is_file():
        return None
    metrics = json.loads(path.read_text())
    last = metrics["epochs"][-1]
    return {"epoch": last["epoch"], "epochs": len(metrics["epochs"]),
            "epoch_s": last["epoch_time_s"],
            "seeds_per_s": metrics.get("train_nodes", 0) / last["epoch_time_s"],
            "gpu_busy_pct": last.get("gpu_busy_pct"), "test_acc": metrics.get("test_acc"),
            "plan": metrics.get("plan", {})}


def ab_table(out: Path, steps: list[dict]) -> list[str]:
    runs = [s for s in steps if s["flags"]]
    if not runs:
        return []
    numbers = {s["name"]: run_numbers(out, s["name"]) if s["status"] == "0" else None
               for s in runs}
    base = numbers.get(BASELINE)
    epoch = f"epoch {base['epoch']} of {base['epochs']}" if base else "the last epoch"
    lines = [f"A/B runs, the same graph and seed, {epoch} (the first is the warm-up); "
             f"against `{BASELINE}` (strict fp32 matmuls):", "",
             "| run | flags | epoch s | seeds/s | speed vs fp32 | GPU busy | test acc | "
             "test acc - fp32's |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for s in runs:
        n = numbers[s["name"]]
        if n is None:
            why = {"124": "timed out", "137": "killed (time or memory)"}.get(
                s["status"], s["status"] if not s["status"].isdigit() else
                f"failed (exit {s['status']}; see {s['name']}.log in gpu-floor.tgz)")
            lines.append(f"| {s['name']} | `{s['flags']}` | {why} | | | | | |")
            continue
        busy = f"{n['gpu_busy_pct']:.0f}%" if n["gpu_busy_pct"] is not None else "-"
        speed = f"{base['epoch_s'] / n['epoch_s']:.2f}x" if base else "-"
        delta = (f"{n['test_acc'] - base['test_acc']:+.4f}" if base and n["test_acc"] is not None
                 else "-")
        acc = f"{n['test_acc']:.4f}" if n["test_acc"] is not None else "-"
        lines.append(f"| {s['name']} | `{s['flags']}` | {n['epoch_s']:.2f} | "
                     f"{n['seeds_per_s']:,.0f} | {speed} | {busy} | {acc} | {delta} |")
    tf32 = numbers.get("tf32")
    if base and tf32 and None not in (base["test_acc"], tf32["test_acc"]):
        gap = abs(tf32["test_acc"] - base["test_acc"])
        verdict = "within" if gap <= TF32_RULE else "outside"
        lines += ["", f"TF32 against strict fp32: test accuracy {tf32['test_acc']:.4f} against "
                      f"{base['test_acc']:.4f}, a gap of {gap:.4f}, {verdict} the "
                      f"{TF32_RULE} that a change of the default needs; epoch "
                      f"{base['epoch_s'] / tf32['epoch_s']:.2f}x as fast."]
    return lines


def fused_table(times: dict) -> list[str]:
    """``benchmarks/fused_mean.py``'s times: each layer's median ms both ways, the ratio."""
    if not times["layers"]:  # it times CUDA devices only
        return ["Checked against embedding_bag, not timed (no CUDA device)."]
    lines = [f"Nodes per hop {times['nodes']}, edges per hop {times['edges']} (a made-up "
             "products-shaped batch); median ms of each way, and embedding_bag's time over the "
             "fused one's:", "",
             "| layer | dtype | forward: embedding_bag | fused | ratio | forward + backward: "
             "embedding_bag | fused | ratio |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]

    def pair(row: dict, what: str) -> str:
        a, b = row.get(f"embedding_bag_{what}_ms"), row.get(f"fused_{what}_ms")
        return f"{a:.3f} | {b:.3f} | {a / b:.2f}x" if a and b else "- | - | -"
    for row in times["layers"]:
        lines.append(f"| {row['layer']} | {row['dtype'].removeprefix('torch.')} | "
                     f"{pair(row, 'forward')} | {pair(row, 'forward_backward')} |")
    a, b = times.get("model_step_embedding_bag_ms"), times.get("model_step_fused_ms")
    if a and b:
        lines += ["", f"A whole model step (forward and backward, fp32): embedding_bag {a:.3f} "
                      f"ms, fused {b:.3f} ms, {a / b:.2f}x."]
    return lines


def report(out: Path, graph_flags: str) -> str:
    steps = read_steps(out)
    env = (out / "env.txt").read_text().strip() if (out / "env.txt").is_file() else ""
    lines = ["## The GPU floor", "", "```", env, "```", "",
             f"`bash benchmarks/gpu_floor.sh`; graph and model: `{graph_flags}`.", ""]
    sizes = out / "batch_sizes.json"
    if sizes.is_file():
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from pyg_mgpu.tools.batch_sizes import format_sizes
        lines += ["### What a batch holds", "",
                  format_sizes(json.loads(sizes.read_text())).rstrip(), ""]
    kernels = out / "kernels.md"
    if kernels.is_file():
        lines += ["### Kernels by GPU time per step", "", "From the trace of one epoch "
                  "(`--epochs 1 --trace-steps N`, after 10 warm-up steps):", "",
                  kernels.read_text().rstrip(), ""]
    table = ab_table(out, steps)
    if table:
        lines += ["### A/B runs", "", *table, ""]
    fused = out / "fused_mean.json"
    if fused.is_file():
        lines += ["### The fused gather-and-mean kernels", "",
                  *fused_table(json.loads(fused.read_text())), ""]
    lines += ["### Steps", "", "| step | exit | seconds |", "| --- | --- | --- |"]
    lines += [f"| {s['name']} | {s['status']} | {s['seconds']} |" for s in steps]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python benchmarks/gpu_floor.py FOLDER 'GRAPH FLAGS'", file=sys.stderr)
        return 2
    out = Path(argv[0])
    (out / "gpu_floor.md").write_text(report(out, argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
