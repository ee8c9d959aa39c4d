"""``--trace-steps``: torch.profiler over steps of the last epoch, written as a kernel table and a
Chrome trace, without changing what the run computes."""
import csv
import json

import pytest

from pyg_mgpu.distributed_sampling import main

RUN = ["--num-nodes", "6000", "--num-edges", "60000", "--num-features", "8", "--num-classes", "4",
       "--hidden", "16", "--batch-size", "128", "--epochs", "2", "--nprocs", "1"]


@pytest.mark.slow
def test_trace_writes_the_ops_by_time_and_changes_nothing(tmp_path):
    assert main(RUN + ["--out", str(tmp_path / "plain")]) == 0
    assert main(RUN + ["--trace-steps", "4", "--out", str(tmp_path / "traced")]) == 0
    with open(tmp_path / "traced" / "kernels.csv") as f:
        rows = list(csv.DictReader(f))
    names = [r["name"] for r in rows]
    # The model's matmuls and the sampler's gathers, each op once, by host time on a CPU.
    assert "aten::addmm_" in names and "aten::index_select" in names
    assert len(names) == len(set(names))
    cpu = [float(r["self_cpu_ms"]) for r in rows]
    assert cpu == sorted(cpu, reverse=True)
    # 4 steps traced: the layers' in-place matmul, one per layer (fanout 25,10: 2) a step.
    assert int(rows[names.index("aten::addmm_")]["calls"]) == 2 * 4
    trace = json.loads((tmp_path / "traced" / "trace.json").read_text())
    assert any(e.get("name") == "aten::addmm_" for e in trace["traceEvents"])
    plain, traced = (json.loads((tmp_path / run / "metrics.json").read_text())["epochs"]
                     for run in ("plain", "traced"))
    assert [e["train_loss"] for e in plain] == [e["train_loss"] for e in traced]
    assert [e["val_acc"] for e in plain] == [e["val_acc"] for e in traced]


def test_trace_steps_must_not_be_negative(capsys):
    assert main(RUN + ["--trace-steps", "-1"]) == 2
    assert "--trace-steps must be >= 0" in capsys.readouterr().err
