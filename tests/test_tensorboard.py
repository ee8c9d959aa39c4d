"""The CLI's TensorBoard log (``RUN/tensorboard/``), read back with TensorBoard's own reader."""
import json
import sys

import pytest

from pyg_mgpu.train.tensorboard_log import FOLDER, SEEDS_PER_S, TensorBoardLog

event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")

TINY = ["--num-nodes", "1500", "--num-edges", "15000", "--num-features", "8",
        "--num-classes", "4", "--hidden", "16", "--batch-size", "128"]


def read_log(folder):
    log = event_accumulator.EventAccumulator(str(folder), size_guidance={"tensors": 0})
    log.Reload()
    scalars = {tag: [(e.step, e.value) for e in log.Scalars(tag)] for tag in log.Tags()["scalars"]}
    texts = {tag: [e.tensor_proto.string_val[0].decode() for e in log.Tensors(tag)]
             for tag in log.Tags()["tensors"]}
    return scalars, texts


def record(epoch, val_acc):
    return {"epoch": epoch, "train_loss": 1.5 / epoch, "train_acc": 0.25 * epoch,
            "val_acc": val_acc, "epoch_time_s": 2.0, "eval_time_s": 0.5, "gpu_busy_pct": None}


def test_epochs_results_and_config_read_back(tmp_path):
    board = TensorBoardLog.for_run(tmp_path, {"lr": 0.01, "fanout": [5, 5]}, is_main=True)
    board.epoch(record(1, None), seeds=1000)  # an epoch that did not validate
    board.epoch(record(2, 0.5), seeds=1000)
    assert board.finish({"test_acc": 0.625}, best_epoch=2) == {"written": True, "folder": FOLDER}
    scalars, texts = read_log(tmp_path / FOLDER)
    assert scalars["loss/train"] == [(1, 1.5), (2, 0.75)]
    assert scalars["accuracy/train"] == [(1, 0.25), (2, 0.5)]
    assert scalars["accuracy/val"] == [(2, 0.5)]
    assert scalars["accuracy/test"] == [(2, 0.625)]
    assert scalars[SEEDS_PER_S] == [(1, 500.0), (2, 500.0)]
    assert "gpu/busy_pct" not in scalars  # no GPU: nothing logged
    assert json.loads(texts["config/text_summary"][0].replace("\n    ", "\n")) == {
        "fanout": [5, 5], "lr": 0.01}


def test_other_ranks_write_nothing(tmp_path):
    board = TensorBoardLog.for_run(tmp_path, {}, is_main=False)
    board.epoch(record(1, 0.5), seeds=10)
    assert board.finish({"test_acc": 0.5}, best_epoch=1) is None
    assert not (tmp_path / FOLDER).exists()


def test_without_tensorboard_the_run_goes_on_and_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails
    board = TensorBoardLog.for_run(tmp_path, {}, is_main=True)
    board.epoch(record(1, 0.5), seeds=10)
    status = board.finish({"test_acc": 0.5}, best_epoch=1)
    assert status["written"] is False and "pip install tensorboard" in status["reason"]
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and lines[0].startswith("warning: no TensorBoard log")
    assert not (tmp_path / FOLDER).exists()


@pytest.mark.slow
def test_a_cli_run_logs_what_metrics_json_records(tmp_path):
    from pyg_mgpu.distributed_sampling import main
    out = tmp_path / "run"
    assert main(TINY + ["--epochs", "2", "--devices", "cpu", "--nprocs", "2",
                        "--out", str(out)]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["tensorboard"] == {"written": True, "folder": FOLDER}
    scalars, texts = read_log(out / FOLDER)
    for key, tag in (("train_loss", "loss/train"), ("train_acc", "accuracy/train"),
                     ("val_acc", "accuracy/val"), ("epoch_time_s", "time/epoch_s")):
        logged = scalars[tag]
        assert [step for step, _ in logged] == [1, 2]
        assert [value for _, value in logged] == pytest.approx(
            [e[key] for e in metrics["epochs"]], rel=1e-6)  # TensorBoard keeps float32
    assert scalars["accuracy/test"] == [(metrics["best_epoch"], pytest.approx(metrics["test_acc"]))]
    assert [v for _, v in scalars[SEEDS_PER_S]] == pytest.approx(
        [metrics["train_nodes"] / e["epoch_time_s"] for e in metrics["epochs"]], rel=1e-6)
    assert json.loads(texts["config/text_summary"][0].replace("\n    ", "\n"))["epochs"] == 2
