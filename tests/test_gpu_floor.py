"""``benchmarks/gpu_floor.py``: the GPU-floor call's Markdown from what its steps left, each
A/B run against strict fp32, and the TF32 rule's verdict."""
import importlib.util
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_floor.py"


@pytest.fixture(scope="module")
def gpu_floor():
    spec = importlib.util.spec_from_file_location("gpu_floor", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_run(out: Path, name: str, epoch_s: float, test_acc: float) -> None:
    (out / name).mkdir()
    (out / name / "metrics.json").write_text(json.dumps({
        "train_nodes": 1000, "test_acc": test_acc,
        "epochs": [{"epoch": 1, "epoch_time_s": 9.0, "gpu_busy_pct": 50.0},
                   {"epoch": 2, "epoch_time_s": epoch_s, "gpu_busy_pct": 80.0}]}))


@pytest.mark.parametrize("tf32_acc, verdict", [(0.9005, "within"), (0.8970, "outside")])
def test_ab_runs_are_compared_with_strict_fp32(gpu_floor, tmp_path, tf32_acc, verdict):
    (tmp_path / "steps.tsv").write_text(
        "batch_sizes\t0\t40\t\n"
        "fp32\t0\t45\t--matmul-precision highest\n"
        "tf32\t0\t40\t--matmul-precision high\n"
        "bf16\t124\t150\t--amp bf16\n"
        "fused\tno --fused-aggregation\t0\t--fused-aggregation\n")
    write_run(tmp_path, "fp32", 2.0, 0.9000)
    write_run(tmp_path, "tf32", 1.6, tf32_acc)
    (tmp_path / "kernels.md").write_text("| # | kernel |\n")
    assert gpu_floor.main([str(tmp_path), "--num-nodes 10"]) == 0
    text = (tmp_path / "gpu_floor.md").read_text()
    assert "| fp32 | `--matmul-precision highest` | 2.00 | 500 | 1.00x | 80% | 0.9000 | " \
           "+0.0000 |" in text
    assert (f"| tf32 | `--matmul-precision high` | 1.60 | 625 | 1.25x | 80% | {tf32_acc:.4f} | "
            f"{tf32_acc - 0.9:+.4f} |") in text
    assert "| bf16 | `--amp bf16` | timed out |" in text
    assert "| fused | `--fused-aggregation` | no --fused-aggregation |" in text
    assert f"{verdict} the 0.002 that a change of the default needs" in text
    assert "| # | kernel |" in text and "`--num-nodes 10`" in text
    assert "| batch_sizes | 0 | 40 |" in text


def test_a_run_without_a_test_accuracy_is_listed_without_one(gpu_floor, tmp_path):
    (tmp_path / "steps.tsv").write_text("fp32\t0\t45\t--matmul-precision highest\n"
                                        "tf32\t0\t40\t--matmul-precision high\n")
    write_run(tmp_path, "fp32", 2.0, 0.9000)
    write_run(tmp_path, "tf32", 1.6, None)
    assert gpu_floor.main([str(tmp_path), "--num-nodes 10"]) == 0
    text = (tmp_path / "gpu_floor.md").read_text()
    assert "| tf32 | `--matmul-precision high` | 1.60 | 625 | 1.25x | 80% | - | - |" in text
    assert "TF32 against strict fp32" not in text  # no verdict without both accuracies


def test_the_fused_kernels_times_are_tabled_against_embedding_bag(gpu_floor, tmp_path):
    (tmp_path / "fused_mean.json").write_text(json.dumps({
        "nodes": [1024, 12000], "edges": [15000], "model_step_embedding_bag_ms": 3.0,
        "model_step_fused_ms": 2.0, "layers": [
            {"layer": 1, "dtype": "torch.float32", "embedding_bag_forward_ms": 0.9,
             "fused_forward_ms": 0.3, "embedding_bag_forward_backward_ms": 2.0,
             "fused_forward_backward_ms": 1.0},
            {"layer": 3, "dtype": "torch.bfloat16", "embedding_bag_forward_ms": 0.2,
             "fused_forward_ms": 0.4}]}))
    assert gpu_floor.main([str(tmp_path), "--num-nodes 10"]) == 0
    text = (tmp_path / "gpu_floor.md").read_text()
    assert "| 1 | float32 | 0.900 | 0.300 | 3.00x | 2.000 | 1.000 | 2.00x |" in text
    assert "| 3 | bfloat16 | 0.200 | 0.400 | 0.50x | - | - | - |" in text  # no backward
    assert "embedding_bag 3.000 ms, fused 2.000 ms, 1.50x." in text
    (tmp_path / "fused_mean.json").write_text(json.dumps({"nodes": [8], "edges": [], "layers": []}))
    assert gpu_floor.main([str(tmp_path), "--num-nodes 10"]) == 0
    assert "not timed (no CUDA device)" in (tmp_path / "gpu_floor.md").read_text()


def test_the_report_loads_no_torch(tmp_path):
    """The script writes the report after every step: torch's seconds of start-up each time
    would eat the call's budget."""
    (tmp_path / "batch_sizes.json").write_text(json.dumps({
        "batches": 2, "batch_size": 4, "fanout": [2], "device": "cuda:0",
        "plan": {"graph_on": "gpu", "sample_batches": 8}, "nodes_per_hop": [4.0, 6.0],
        "edges_per_hop": [8.0], "nodes": 10.0, "edges": 8.0, "feature_bytes": 400.0,
        "feature_row_bytes": 40.0}))
    code = ("import runpy, sys\n"
            f"sys.argv = [{str(SCRIPT)!r}, {str(tmp_path)!r}, '--num-nodes 10']\n"
            "try:\n"
            f"    runpy.run_path({str(SCRIPT)!r}, run_name='__main__')\n"
            "except SystemExit as e:\n"
            "    assert e.code == 0, e.code\n"
            "print('torch' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False"]
    text = (tmp_path / "gpu_floor.md").read_text()
    assert "| 1 | 6 | 8 |" in text and "(40 bytes per node)" in text


def test_the_script_leaves_the_markdown_and_one_archive_in_out(tmp_path):
    """A remote GPU runner may return only a few files from OUT: the script keeps its steps'
    files in its work folder and OUT holds gpu_floor.md, kernels.md once there is one, and
    gpu-floor.tgz with the rest. With no budget every step is skipped, and recorded so."""
    out, work = tmp_path / "out", tmp_path / "work"
    env = {**os.environ, "OUT": str(out), "GPU_FLOOR_WORK": str(work), "PYTHON": sys.executable,
           "GPU_FLOOR_BUDGET_S": "0", "GPU_FLOOR_TINY": "1"}
    done = subprocess.run(["bash", str(SCRIPT.with_suffix(".sh"))], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["gpu-floor.tgz", "gpu_floor.md"]
    with tarfile.open(out / "gpu-floor.tgz") as archive:
        names = archive.getnames()
        steps = archive.extractfile("gpu-floor/steps.tsv").read().decode()
    assert {"gpu-floor/env.txt", "gpu-floor/gpu_floor.md"} <= set(names)
    assert [line.split("\t")[:2] for line in steps.splitlines()] == [
        [name, "skipped"] for name in ("cache_bf16", "fused_check", "batch_sizes", "trace",
                                       "kernel_table", "fp32", "tf32", "bf16", "cuda_graph",
                                       "fused", "prefetch3", "fused_bench")]
    assert (out / "gpu_floor.md").read_text() == (work / "gpu-floor" / "gpu_floor.md").read_text()
