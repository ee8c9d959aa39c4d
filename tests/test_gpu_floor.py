"""``benchmarks/gpu_floor.py``: the GPU-floor call's Markdown from what its steps left, each
A/B run against strict fp32, and the TF32 rule's verdict."""
import importlib.util
import json
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
