"""Tests for pyg_mgpu.tools.report: per-run plots, the comparison CLI and its input errors."""
import json
from pathlib import Path

import pytest

from pyg_mgpu.tools.report import format_table, main
from pyg_mgpu.train.metrics import load_metrics
from pyg_mgpu.train.plots import plot_run

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def write_run(folder: Path, val_accs=(0.30, None, 0.50), epoch_time=1.0) -> Path:
    """A run folder shaped like the trainer's output, written by hand."""
    folder.mkdir(parents=True)
    epochs = [{"epoch": i + 1, "train_loss": 2.0 - 0.3 * i, "train_acc": 0.2 + 0.1 * i,
               "val_acc": val, "epoch_time_s": epoch_time + 0.1 * i, "eval_time_s": 0.2,
               "stage_times_s": {"load": 0.1, "forward": 0.5, "backward": 0.3,
                                 "optimizer": 0.1}}
              for i, val in enumerate(val_accs)]
    vals = [v for v in val_accs if v is not None]
    metrics = {"dataset": "synthetic", "world_size": 2, "device": "cpu", "backend": "gloo",
               "sampler": "native", "config": {"epochs": len(epochs)}, "epochs": epochs,
               "best_val_acc": max(vals), "best_epoch": 1 + list(val_accs).index(max(vals)),
               "test_acc": 0.48, "mean_epoch_time_s": epoch_time, "peak_mem_mb": 812.5,
               "wall_time_s": 12.0, "dataset_bytes": 1_000_000, "num_nodes": 100,
               "num_edges": 1000}
    (folder / "metrics.json").write_text(json.dumps(metrics))
    (folder / "history.csv").write_text(
        "epoch,train_loss,train_acc,val_acc,epoch_time_s,eval_time_s\n" + "".join(
            f"{r['epoch']},{r['train_loss']},{r['train_acc']},"
            f"{'' if r['val_acc'] is None else r['val_acc']},{r['epoch_time_s']},0.2\n"
            for r in epochs))
    return folder


def assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC, f"{path} is not a PNG"
    assert len(data) > 5_000, f"{path} is suspiciously small ({len(data)} bytes)"


def test_plot_run_writes_pngs_with_a_null_val_acc(tmp_path):
    run = write_run(tmp_path / "run_a")
    paths = plot_run(run)
    assert [p.name for p in paths] == ["curves.png", "epoch_time.png"]
    for path in paths:
        assert path.parent == run
        assert_png(path)
    assert not list(run.glob(".*.tmp")), "temp files of the atomic write were left behind"


def test_plot_run_with_one_epoch_and_no_stage_times(tmp_path):
    run = write_run(tmp_path / "one", val_accs=(0.4,))
    metrics = json.loads((run / "metrics.json").read_text())
    metrics["epochs"][0]["stage_times_s"] = {}
    (run / "metrics.json").write_text(json.dumps(metrics))
    for path in plot_run(run):
        assert_png(path)


def test_cli_compares_runs_side_by_side(tmp_path, capsys):
    runs = [write_run(tmp_path / "fast", epoch_time=1.0),
            write_run(tmp_path / "slow", val_accs=(0.2, 0.3, None), epoch_time=3.0)]
    out = tmp_path / "report"
    assert main([str(r) for r in runs] + ["--out", str(out)]) == 0
    assert_png(out / "report.png")
    report = (out / "report.md").read_text()
    header = report.splitlines()[2]
    assert "fast" in header and "slow" in header
    assert "| test acc" in report and "0.4800" in report
    printed = capsys.readouterr().out
    assert "fast" in printed and "report.md" in printed


def test_a_runs_metrics_json_names_its_run(tmp_path):
    run = write_run(tmp_path / "only")
    assert main([str(run / "metrics.json"), "--out", str(tmp_path / "report")]) == 0
    assert "only" in (tmp_path / "report" / "report.md").read_text()


def test_cli_defaults_out_to_the_first_run(tmp_path):
    run = write_run(tmp_path / "only")
    assert main([str(run)]) == 0
    assert (run / "report.md").is_file()
    assert_png(run / "report.png")


def test_table_has_one_column_per_run_and_dashes_for_missing_keys():
    runs = {"a": {"epochs": [{"epoch": 1}], "test_acc": 0.5}, "b": {"epochs": [{"epoch": 1}]}}
    lines = format_table(runs).splitlines()
    assert [c.strip() for c in lines[0].split("|")[2:4]] == ["a", "b"]
    test_row = next(line for line in lines if line.startswith("| test acc"))
    assert [c.strip() for c in test_row.split("|")[2:4]] == ["0.5000", "-"]


def test_table_names_each_runs_model_and_sampling_settings():
    runs = {"gcn": {"epochs": [], "config": {"model": "gcn", "fanout": [15, 10], "batch_size": 512}},
            "dgl": {"epochs": [], "config": {"fanout": [25, 10], "batch_size": 1024}}}
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:4]]
            for line in format_table(runs).splitlines()[2:]}
    assert rows["model"] == ["gcn", "-"]
    assert rows["fanout"] == ["15,10", "25,10"]
    assert rows["batch size"] == ["512", "1024"]


NO_FOLDER = object()


@pytest.mark.parametrize("content, expected", [
    (NO_FOLDER, "no such folder"),
    ("a file", "a file, not a run folder"),
    (None, "has no metrics.json"),
    ("{not json", "cannot be read as JSON"),
    ('{"epochs": []}', "per-epoch records"),
    ("[1, 2]", "per-epoch records"),
])
def test_bad_input_is_one_line_and_exit_code_2(tmp_path, capsys, content, expected):
    run = tmp_path / "run"
    if content == "a file":
        run.write_text("")
    elif content is not NO_FOLDER:
        run.mkdir()
        if content is not None:
            (run / "metrics.json").write_text(content)
    assert main([str(run), "--out", str(tmp_path / "out")]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert err.startswith("error: ") and "\n" not in err
    assert expected in err and "--out DIR" in err  # says what is wrong and what to pass
    assert "Traceback" not in captured.err and captured.out == ""


def test_a_bad_run_among_good_ones_writes_nothing(tmp_path):
    good = write_run(tmp_path / "good")
    assert main([str(good), str(tmp_path / "missing")]) == 2
    assert not (good / "report.md").exists()


def test_load_metrics_rejects_records_without_epoch(tmp_path):
    (tmp_path / "metrics.json").write_text('{"epochs": [{"train_loss": 1.0}]}')
    with pytest.raises(ValueError, match="per-epoch records"):
        load_metrics(tmp_path)
