"""python -m pyg_mgpu.predict: a trained run's predictions on its ranks, its exact accuracy,
and one error line (exit 2, nothing written) for every input it cannot use."""
import copy
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import pyg_mgpu
from pyg_mgpu.distributed_sampling import main as train
from pyg_mgpu.files import save_json
from pyg_mgpu.nn.sage import GraphSAGE
from pyg_mgpu.predict import main

predict_command = sys.modules["pyg_mgpu.predict"]
from pyg_mgpu.train.config import TrainConfig
from pyg_mgpu.train.dataset import load_configured

TINY = ["--num-nodes", "1500", "--num-edges", "15000", "--num-features", "8",
        "--num-classes", "4", "--hidden", "16", "--batch-size", "128"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A finished 2-rank run that computed its exact (layer-wise) accuracies."""
    out = tmp_path_factory.mktemp("run")
    assert train(TINY + ["--epochs", "1", "--devices", "cpu", "--nprocs", "2",
                         "--inference", "layerwise", "--out", str(out)]) == 0
    return out


def run_graph_and_model(run_dir):
    config = json.loads((run_dir / "metrics.json").read_text())["config"]
    graph = load_configured(TrainConfig.from_flags(**config))
    model = GraphSAGE(8, 16, 4, 2)
    model.load_state_dict(torch.load(run_dir / "best.pt", weights_only=True))
    return graph, model.eval()


@pytest.mark.slow
def test_a_runs_predictions_on_two_ranks_give_its_exact_accuracies(run_dir, tmp_path, capsys):
    out = tmp_path / "out"
    assert main([str(run_dir), "--out", str(out), "--outputs", "logits,probabilities,labels",
                 "--embeddings", "1", "--batch-size", "200", "--devices", "cpu",
                 "--nprocs", "2"]) == 0
    metrics = json.loads((run_dir / "metrics.json").read_text())
    summary = json.loads((out / "predictions.json").read_text())
    assert summary["accuracy"]["test"] == {"accuracy": metrics["test_acc_exact"], "nodes": 300}
    assert summary["accuracy"]["val"]["accuracy"] == metrics["val_acc_exact"]
    assert summary["files"]["logits"] == {"file": "logits.npy", "shape": [1500, 4],
                                          "dtype": "float32"}
    assert summary["files"]["embeddings"]["shape"] == [1500, 16]
    assert summary["world_size"] == 2 and summary["commit"] is not None
    graph, model = run_graph_and_model(run_dir)
    edge_index = graph.edge_index()
    expected = model(graph.x, edge_index)
    logits = torch.from_numpy(np.load(out / "logits.npy"))
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-4)
    assert torch.equal(torch.from_numpy(np.load(out / "labels.npy")), expected.argmax(-1))
    hidden = torch.relu(model.convs[0](graph.x, edge_index))
    torch.testing.assert_close(torch.from_numpy(np.load(out / "embeddings.npy")), hidden,
                               rtol=0, atol=1e-4)
    # Resumed once finished: nothing computed, no rank started, the same summary.
    written = {name: (out / name).stat().st_mtime_ns for name in ("logits.npy", "labels.npy")}
    capsys.readouterr()
    assert main([str(run_dir), "--out", str(out), "--outputs", "logits,probabilities,labels",
                 "--embeddings", "1", "--batch-size", "200", "--devices", "cpu",
                 "--nprocs", "2", "--resume"]) == 0
    assert "holds these predictions whole already: nothing to compute" in capsys.readouterr().out
    assert {name: (out / name).stat().st_mtime_ns for name in written} == written
    again = json.loads((out / "predictions.json").read_text())
    assert again["accuracy"] == summary["accuracy"] and again["files"] == summary["files"]


@pytest.mark.slow
def test_one_split_on_one_rank_in_its_order(run_dir, tmp_path):
    out = tmp_path / "out"
    assert main([str(run_dir), "--out", str(out), "--nodes", "test", "--outputs", "labels",
                 "--hidden-dtype", "bfloat16", "--devices", "cpu", "--nprocs", "1"]) == 0
    graph, model = run_graph_and_model(run_dir)
    assert np.array_equal(np.load(out / "node_ids.npy"), graph.test_idx.numpy())
    summary = json.loads((out / "predictions.json").read_text())
    assert list(summary["accuracy"]) == ["test"]  # the other splits' nodes were not asked for
    assert summary["files"]["labels"]["shape"] == [300]
    # Hidden rows in bfloat16: the labels are the float32 model's but for near ties.
    expected = model(graph.x, graph.edge_index())[graph.test_idx].argmax(-1)
    agree = (torch.from_numpy(np.load(out / "labels.npy")) == expected).float().mean()
    assert agree >= 0.95


def error_of(argv, capsys) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: "), err
    return err


class RunsCode:
    """Pickled, it touches ``path`` when loaded (with weights_only=False)."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (Path.touch, (Path(self.path),))


@pytest.mark.slow
def test_a_run_recorded_with_folder_settings_now_refused_still_predicts(run_copy, tmp_path):
    # A run given --resume RUN --overwrite (accepted, the flag ignored, before that pair was
    # refused) recorded both; they say nothing of its model or data.
    metrics = json.loads((run_copy / "metrics.json").read_text())
    metrics["config"].update(out=str(run_copy), resume=str(run_copy), overwrite=True)
    (run_copy / "metrics.json").write_text(json.dumps(metrics))
    assert main([str(run_copy), "--out", str(tmp_path / "out"), "--outputs", "labels",
                 "--devices", "cpu", "--nprocs", "1"]) == 0


@pytest.fixture
def run_copy(run_dir, tmp_path):
    """A copy of the run folder (its metrics, config and best.pt), to break."""
    copy = tmp_path / "run"
    copy.mkdir()
    for name in ("metrics.json", "best.pt"):
        shutil.copy(run_dir / name, copy / name)
    return copy


@pytest.mark.slow
def test_bad_input_is_one_error_line_and_nothing_is_written(run_copy, tmp_path, capsys,
                                                            monkeypatch):
    out = tmp_path / "out"
    base = [str(run_copy), "--out", str(out), "--devices", "cpu", "--nprocs", "1"]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "no configuration" in error_of([str(empty)], capsys)
    assert "--embeddings 2: the model has 2 layers" in error_of(base + ["--embeddings", "2"],
                                                                capsys)
    ids = tmp_path / "ids.txt"
    ids.write_text("3\n1500\n")
    assert "--nodes holds node id 1500, outside the graph's 0..1499" in error_of(
        base + ["--nodes", str(ids)], capsys)
    # A checkpoint of a model other than the run's, and one from a run on other data.
    other = tmp_path / "other"
    other.mkdir()
    torch.save(GraphSAGE(8, 32, 4, 2).state_dict(), other / "best.pt")
    assert "does not fit the run's model (--model sage, --hidden 16, 2 layers)" in error_of(
        base + ["--checkpoint", str(other / "best.pt")], capsys)
    metrics = json.loads((run_copy / "metrics.json").read_text())
    metrics["config"]["num_nodes"] = 2000
    (other / "metrics.json").write_text(json.dumps(metrics))
    shutil.copy(run_copy / "best.pt", other / "best.pt")
    assert "was trained with num_nodes=2000" in error_of(
        base + ["--checkpoint", str(other / "best.pt")], capsys)
    # The same from a run that was stopped (its config is in checkpoint.pt, no metrics.json).
    (other / "metrics.json").unlink()
    torch.save({"config": metrics["config"], "data_fingerprint": metrics["data_fingerprint"]},
               other / "checkpoint.pt")
    assert "was trained with num_nodes=2000" in error_of(
        base + ["--checkpoint", str(other / "best.pt")], capsys)
    # That file was not named by the user: it is read as data, and pickled code never runs.
    torch.save(RunsCode(tmp_path / "ran"), other / "checkpoint.pt")
    assert "unreadable as a torch checkpoint" in error_of(
        base + ["--checkpoint", str(other / "best.pt")], capsys)
    assert not (tmp_path / "ran").exists()
    # The checkpoint of another run started in the run's folder since, and stopped.
    torch.save({"config": {**metrics["config"], "num_nodes": 1500, "seed": 1},
                "data_fingerprint": "0" * 32, "history": []}, run_copy / "checkpoint.pt")
    assert "holds files of two runs" in error_of(base, capsys)
    (run_copy / "checkpoint.pt").unlink()
    # A layers/ folder predict did not write, which it would use and delete: kept, even with
    # --overwrite.
    (out / "layers").mkdir(parents=True)
    (out / "layers" / "notes.txt").write_text("mine")
    assert "layers was not written by pyg_mgpu.predict" in error_of(base + ["--overwrite"],
                                                                    capsys)
    assert [p.name for p in out.rglob("*")] == ["layers", "notes.txt"]
    shutil.rmtree(out)
    # Output folders it cannot write to, or that lack the room.
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert "cannot write there" in error_of(base[:1] + ["--out", str(blocker / "out")] + base[3:],
                                            capsys)
    monkeypatch.setattr(predict_command.shutil, "disk_usage",
                        lambda path: shutil._ntuple_diskusage(10**9, 10**9, 1000))
    assert "GiB free" in error_of(base, capsys)
    monkeypatch.undo()
    assert not out.exists()
    (run_copy / "best.pt").unlink()
    assert "best.pt: no such file; the run never validated" in error_of(base, capsys)
    assert not out.exists()


def test_a_run_folder_with_files_of_two_runs_is_refused(tmp_path):
    """--overwrite started a run in a finished run's folder, which stopped: checkpoint.pt (and
    best.pt) are the new run's, metrics.json the old one's."""
    config = TrainConfig().to_dict()
    epochs = [{"epoch": 1, "train_loss": float("nan"), "val_acc": 0.5, "epoch_time_s": 0.1},
              {"epoch": 2, "train_loss": 1.2, "val_acc": 0.6, "epoch_time_s": 0.1}]
    # As the trainer writes it: the NaN loss is null there, and nan in the checkpoint.
    save_json({"config": config, "data_fingerprint": "a" * 32, "epochs": epochs},
              tmp_path / "metrics.json")

    def checkpoint(history, fingerprint="a" * 32, **changed):
        torch.save({"config": {**config, **changed}, "data_fingerprint": fingerprint,
                    "history": history}, tmp_path / "checkpoint.pt")

    checkpoint(epochs[:1])  # the run's own, from before its end
    assert predict_command.read_run(tmp_path)[1] == config
    checkpoint(epochs + [{**epochs[1], "epoch": 3}])  # resumed in its folder, stopped again
    assert predict_command.read_run(tmp_path)[1] == config
    checkpoint([], seed=1)
    with pytest.raises(ValueError, match=r"holds files of two runs: .* seed \(0 in "
                                         r"metrics.json, 1 in checkpoint.pt\)"):
        predict_command.read_run(tmp_path)
    checkpoint([], fingerprint="b" * 32)
    with pytest.raises(ValueError, match="differ in the data's fingerprint"):
        predict_command.read_run(tmp_path)
    checkpoint([{**epochs[0], "val_acc": 0.4}])  # the same settings, trained again
    with pytest.raises(ValueError, match="differ in their epochs"):
        predict_command.read_run(tmp_path)


@pytest.mark.slow
def test_a_stopped_overwrite_leaves_no_earlier_predictions_json(run_copy, tmp_path,
                                                                monkeypatch):
    from pyg_mgpu.distributed import launch
    from pyg_mgpu.distributed.context import JobStopped
    out = tmp_path / "out"
    out.mkdir()
    (out / "predictions.json").write_text(json.dumps({"nodes": "all", "files": {}}))

    def stopped(*args, **kwargs):
        raise JobStopped(2)
    monkeypatch.setattr(launch, "launch_local", stopped)
    assert main([str(run_copy), "--out", str(out), "--overwrite", "--devices", "cpu",
                 "--nprocs", "1"]) == 130
    assert not (out / "predictions.json").exists()


def test_the_name_stays_the_library_function_once_the_command_is_imported(tmp_path):
    from torch_geometric.data import Data
    data = Data(x=torch.randn(5, 8), edge_index=torch.tensor([[0, 1, 2], [1, 2, 3]]))
    model = GraphSAGE(8, 16, 4, 2).eval()
    assert predict_command.__name__ == "pyg_mgpu.predict"  # imported above, by main
    from pyg_mgpu.inference import predict
    assert pyg_mgpu.predict is predict
    got = pyg_mgpu.predict(model, data, tmp_path, outputs=["logits"])
    torch.testing.assert_close(torch.from_numpy(np.array(got.logits)),
                               model(data.x, data.edge_index), rtol=0, atol=1e-5)


@pytest.fixture(scope="module")
def hetero_run(tmp_path_factory):
    """A run folder of an R-GCN on synthetic-hetero: its recorded config, its data's digest
    and weights (as initialised: what is checked does not depend on training)."""
    from pyg_mgpu.data.fingerprint import data_fingerprint
    folder = tmp_path_factory.mktemp("hetero-run")
    cfg = TrainConfig.from_flags(dataset="synthetic-hetero", model="rgcn", hidden=16)
    graph = load_configured(cfg)
    torch.manual_seed(0)
    model = predict_command.build_run_model(cfg, graph).eval()
    torch.save(model.state_dict(), folder / "best.pt")
    (folder / "metrics.json").write_text(json.dumps(
        {"config": cfg.flat(), "data_fingerprint": data_fingerprint(graph.tensors())}))
    return folder, graph, model


@pytest.mark.slow
def test_a_hetero_runs_predictions_per_node_type_equal_its_full_graph_forward(hetero_run,
                                                                             tmp_path):
    folder, graph, model = hetero_run
    out = tmp_path / "out"
    assert main([str(folder), "--out", str(out), "--embeddings", "1", "--devices", "cpu",
                 "--nprocs", "1"]) == 0
    expected = model(graph.data.x_dict, graph.data.edge_index_dict)
    logits = torch.from_numpy(np.load(out / "paper" / "logits.npy"))
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-4)
    summary = json.loads((out / "predictions.json").read_text())
    test = graph.test_idx
    correct = int((expected[test].argmax(-1) == graph.data["paper"].y[test]).sum())
    assert summary["accuracy"]["test"] == {"accuracy": correct / test.numel(),
                                           "nodes": test.numel()}
    assert summary["files"]["author/embeddings"]["shape"] == [10_000, 16]
    assert np.array_equal(np.load(out / "author" / "node_ids.npy"), np.arange(10_000))


@pytest.mark.slow
@pytest.mark.parametrize("other", ["model", "data"])
def test_resuming_layers_of_another_model_or_data_is_one_error_line(other, hetero_run,
                                                                     tmp_path, capsys,
                                                                     monkeypatch):
    from pyg_mgpu.inference import predictions
    folder, graph, model = hetero_run
    out = tmp_path / "out"
    stopped = copy.deepcopy(model)
    key = {"data": json.loads((folder / "metrics.json").read_text())["data_fingerprint"]}
    if other == "model":
        torch.nn.init.zeros_(stopped.roots[0]["paper"].weight)
    else:
        key["data"] = "0" * 64

    def stop_at_the_last(run, i):
        if i == 1:
            raise KeyboardInterrupt
        run_layer(run, i)

    run_layer = predictions._Run._run_layer
    monkeypatch.setattr(predictions._Run, "_run_layer", stop_at_the_last)
    with pytest.raises(KeyboardInterrupt):  # a job stopped after its first layer
        pyg_mgpu.predict(stopped, graph, out, outputs=["logits", "labels"], key=key)
    monkeypatch.undo()
    err = error_of([str(folder), "--out", str(out), "--resume", "--devices", "cpu",
                    "--nprocs", "1"], capsys)
    assert f"holds layers or outputs computed with other {other}; start afresh" in err


@pytest.mark.slow
def test_a_run_given_relative_paths_predicts_from_any_folder_and_after_its_data_moved(
        shared_data, tmp_path, monkeypatch, capsys):
    work, run = tmp_path / "work", tmp_path / "run"
    shutil.copytree(shared_data / "planetoid" / "Cora", work / "planetoid" / "Cora")
    monkeypatch.chdir(work)
    assert train(["--dataset", "cora", "--root", "planetoid", "--no-cache", "--epochs", "1",
                  "--devices", "cpu", "--nprocs", "1", "--out", str(run)]) == 0
    common = ["--outputs", "labels", "--devices", "cpu", "--nprocs", "1"]
    monkeypatch.chdir(tmp_path)  # not the folder the run started in
    assert main([str(run), "--out", "from-elsewhere", *common]) == 0
    shutil.move(work / "planetoid", tmp_path / "moved")
    capsys.readouterr()
    assert "pass --root DIR" in error_of([str(run), "--out", "after-the-move", *common], capsys)
    assert main([str(run), "--out", "after-the-move", "--root", "moved", *common]) == 0
    first, second = (json.loads((tmp_path / out / "predictions.json").read_text())["accuracy"]
                     for out in ("from-elsewhere", "after-the-move"))
    assert first == second and first["test"]["nodes"] == 1000
