"""The kernel table of a ``--trace-steps`` run: kernels by GPU time per step, each with the
stage of the step that launched it, and the training stream's idle time."""
import json

import pytest
import torch

from pyg_mgpu.tools.kernel_table import (format_table, kernel_table, main, table_from_csv,
                                         table_from_trace)
from pyg_mgpu.train.trace import StepTrace

MAIN, AUTOGRAD, PREFETCH = 1, 2, 3


def op(name, tid, ts, dur, cat="cpu_op"):
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur}


def launch(tid, ts, correlation):
    return {**op("cudaLaunchKernel", tid, ts, 1, cat="cuda_runtime"),
            "args": {"correlation": correlation}}


def kernel(name, ts, dur, correlation, stream=7, cat="kernel"):
    return {**op(name, 0, ts, dur, cat=cat), "pid": 0,
            "args": {"correlation": correlation, "stream": stream}}


def gpu_step(start: float, c: int) -> list:
    """One 1000 µs step as the training loop orders it, each stage launching kernels. As
    kineto writes a CUDA trace, the step's annotation is there twice: on the GPU timeline
    (spanning the step's kernels, the stream as its thread; listed first) and on the host's."""
    return [
        {**kernel(f"ProfilerStep#{c}", start + 20, 700, None, cat="gpu_user_annotation"),
         "tid": 7},
        op(f"ProfilerStep#{c}", MAIN, start, 1000, cat="user_annotation"),
        op("aten::mm", MAIN, start + 10, 20), launch(MAIN, start + 15, c + 1),
        kernel("gemm", start + 20, 100, c + 1),
        op("autograd::engine::evaluate_function: MmBackward0", AUTOGRAD, start + 200, 100),
        launch(AUTOGRAD, start + 210, c + 2), kernel("gemm", start + 220, 200, c + 2),
        op("aten::copy_", MAIN, start + 400, 10), launch(MAIN, start + 402, c + 3),
        kernel("Memcpy HtoD", start + 440, 5, c + 3, cat="gpu_memcpy"),
        op("Optimizer.step#Adam.step", MAIN, start + 500, 100, cat="user_annotation"),
        launch(MAIN, start + 510, c + 4), kernel("adam", start + 520, 30, c + 4),
        launch(MAIN, start + 700, c + 5), kernel("sum", start + 710, 10, c + 5),
        # the next batch sampled on the prefetch thread, on its own stream
        launch(PREFETCH, start + 50, c + 6), kernel("sort", start + 100, 50, c + 6, stream=20),
    ]


def gpu_trace() -> dict:
    return {"traceEvents": gpu_step(0.0, 0) + gpu_step(1000.0, 10)}


def test_kernels_get_their_time_per_step_share_and_stage():
    table = table_from_trace(gpu_trace())
    assert table.device and table.steps == 2 and table.step_us == 1000
    rows = {row.name: row for row in table.rows}
    assert [row.name for row in table.rows] == ["gemm", "sort", "adam", "sum", "Memcpy HtoD"]
    assert (rows["gemm"].calls, rows["gemm"].us) == (4, 600)
    assert rows["gemm"].stage() == "backward 67%, forward 33%"
    assert [rows[n].stage() for n in ("sort", "adam", "sum", "Memcpy HtoD")] == \
        ["load", "optimizer", "metrics", "load"]
    assert table.stage_us == {"load": 55, "forward": 100, "backward": 200, "optimizer": 30,
                              "metrics": 10}
    # Stream 7 trains: 345 µs of kernels a step, none overlapping; with the sampler's 50 µs
    # on stream 20 overlapping the forward gemm by 20 µs, some stream runs 375 µs.
    assert table.training_stream == 7
    assert table.stream_busy_us == pytest.approx(345)
    assert table.any_stream_busy_us == pytest.approx(375)
    text = format_table(table, top=2)
    assert "| 1 | `gemm` | 2 | 300.0 | 30.0% | backward 67%, forward 33% |" in text
    assert "| 2 | `sort` | 1 | 50.0 | 5.0% | load |" in text
    assert "`adam`" not in text and "all 5 (3 more: 45.0 µs)" in text
    assert "| backward | 200.0 | 20.0% |" in text
    assert "idle 655.0 µs (65.5% of the step)" in text


def test_a_cpu_trace_lists_ops_by_self_time_in_the_stage_that_ran_them(tmp_path):
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(64, 64))
    optimizer = torch.optim.Adam([w])
    trace = StepTrace(tmp_path, steps=2, device=torch.device("cpu"), skip=0)
    trace.start(steps_in_epoch=3)
    for _ in range(3):  # the loop's order: forward, backward, next batch, optimizer, metrics
        x = torch.randn(32, 64)
        loss = torch.tanh(x @ w).sum()
        loss.backward()
        torch.cumsum(x, 0)
        optimizer.step()
        optimizer.zero_grad()
        torch.sigmoid(x)
        trace.step()
    trace.stop()
    table = kernel_table(tmp_path)
    assert not table.device and table.steps == 2 and table.step_us > 0
    rows = {row.name: row for row in table.rows}
    assert rows["aten::tanh"].stage() == "forward"
    assert rows["aten::tanh_backward"].stage() == "backward"
    assert rows["aten::cumsum"].stage() == "load"
    assert rows["aten::sigmoid"].stage() == "metrics"
    assert rows["aten::tanh"].calls == 2
    # Self times: the matmul's own time is not counted again in the ops around it.
    assert table.rows == sorted(table.rows, key=lambda r: -r.us)
    assert sum(r.us for r in table.rows) <= table.steps * table.step_us


def test_kernels_csv_alone_gives_the_kernels_without_stages(tmp_path):
    (tmp_path / "kernels.csv").write_text(
        "name,calls,self_device_ms,self_cpu_ms,self_device_ms_per_step,self_cpu_ms_per_step\n"
        "aten::mm,8,3.0,0.4,0.75,0.1\n"
        "sm90_gemm,8,2.0,0.0,0.5,0.0\n"
        "void at::native::sort|kernel,4,4.0,0.0,1.0,0.0\n")
    table = kernel_table(tmp_path)
    assert table.device and table.steps == 4 and table.step_us is None
    assert [(r.name, r.calls, r.us) for r in table.rows] == [
        ("void at::native::sort|kernel", 4, 4000.0), ("sm90_gemm", 8, 2000.0)]
    text = format_table(table)
    assert "| 1 | `void at::native::sort\\|kernel` | 1 | 1,000.0 | - | - |" in text


def test_the_command_prints_and_writes_the_table(tmp_path, capsys):
    (tmp_path / "trace.json").write_text(json.dumps(gpu_trace()))
    assert main([str(tmp_path), "--out", str(tmp_path / "kernels.md")]) == 0
    printed = capsys.readouterr().out
    assert printed == (tmp_path / "kernels.md").read_text() and "`gemm`" in printed
    assert main([str(tmp_path / "missing")]) == 2
    assert f"{tmp_path / 'missing'}: no such folder or file" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main([str(tmp_path / "empty")]) == 2
    assert "neither trace.json nor kernels.csv" in capsys.readouterr().err
    (tmp_path / "cut").mkdir()
    (tmp_path / "cut" / "trace.json").write_text('{"traceEvents": [{"na')
    assert main([str(tmp_path / "cut")]) == 2
    assert capsys.readouterr().err.startswith(
        f"error: {tmp_path / 'cut' / 'trace.json'}: not a whole JSON trace (")


def test_csv_rows_of_a_cpu_run_are_its_ops(tmp_path):
    path = tmp_path / "kernels.csv"
    path.write_text("name,calls,self_device_ms,self_cpu_ms,self_device_ms_per_step,"
                    "self_cpu_ms_per_step\naten::mm,6,0.0,3.0,0.0,1.0\n")
    table = table_from_csv(path)
    assert not table.device and table.steps == 3 and table.rows[0].us == 3000.0
