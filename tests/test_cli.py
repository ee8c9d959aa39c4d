"""The command line: one-line errors for bad input, and complete outputs for a real run."""
import csv
import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pyg_mgpu.distributed_sampling import main

REPO = Path(__file__).resolve().parents[1]
from pyg_mgpu.nn.sage import GraphSAGE

TINY = ["--num-nodes", "1500", "--num-edges", "15000", "--num-features", "8",
        "--num-classes", "4", "--hidden", "16", "--batch-size", "128"]
TINY_TEST_NODES = 300  # the default split: a fifth of the nodes


@pytest.mark.parametrize("argv,message", [
    (["--fanout", "25,0"], "--fanout"),
    (["--fanout", "5,x"], "--fanout takes comma-separated int values such as 25,10, got '5,x'"),
    (["--split-fractions", "0.5,a,0.2"], "--split-fractions takes comma-separated float values"),
    (["--model", "mlp"], "--model must be one of sage, gcn, gat, gin, rgcn, got 'mlp'"),
    (["--norm", "group"], "--norm must be one of none, batch, layer, got 'group'"),
    (["--epochs", "0"], "--epochs must be a positive integer"),
    (["--batch-size", "-4"], "--batch-size must be a positive integer"),
    (["--dropout", "1.5"], "--dropout"),
    (["--dataset", "no-such-data"], "no-such-data"),
    (["--dataset", "synthetic_hetero"], "or a heterogeneous one: ogbn-mag, synthetic-hetero"),
    (["--devices", "cuda:0,1"] if not torch.cuda.is_available() else ["--devices", "cuda:99"],
     "--devices"),
    (["--devices", "cpu", "--nprocs", "0"], "--nprocs"),
    (["--feature-cache-gb", "-1"], "--feature-cache-gb"),
    (["--prefetch", "-1"], "--prefetch"),
    (["--graph-on", "gpu", "--sampler", "pyg"], "--graph-on gpu needs --sampler native"),
    (["--lr", "inf"], "--lr must be a finite positive number, got inf"),
    (["--weight-decay", "inf"], "--weight-decay must be a finite number"),
    (["--timeout", "inf"], "--timeout must be finite positive seconds"),
    (["--resume", "auto", "--overwrite"], "--overwrite starts afresh"),
])
def test_bad_input_is_one_line_and_exit_2(argv, message, tmp_path, capsys):
    assert main(argv + ["--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and message in err
    assert "Traceback" not in err



def test_a_graph_too_large_for_memory_is_one_line(tmp_path, capsys):
    # 8e17 bytes of features: beyond any address space, so refused whatever the overcommit
    # policy; the launcher's failed allocation is one line, not a traceback.
    assert main(["--num-nodes", str(10 ** 17), "--out", str(tmp_path / "run")]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: out of memory before any rank started") and \
        "choose a smaller graph (--num-nodes" in err and "Traceback" not in err, err
    assert not (tmp_path / "run").exists()


def test_overwrite_with_a_resume_of_the_same_folder_is_refused(tmp_path, capsys):
    from pyg_mgpu.train.config import TrainConfig
    for out in ([], ["--out", str(tmp_path / "." / "")]):
        assert main(["--resume", str(tmp_path), "--overwrite", *out]) == 2
        assert "--overwrite starts afresh, --resume" in capsys.readouterr().err
    (tmp_path / "link").symlink_to(tmp_path)  # the same folder by another name
    assert main(["--resume", str(tmp_path), "--overwrite", "--out", str(tmp_path / "link")]) == 2
    assert "--overwrite starts afresh, --resume" in capsys.readouterr().err
    # Resumed into another folder, --overwrite lets it replace a checkpoint there.
    TrainConfig.from_flags(resume=str(tmp_path), out=str(tmp_path / "next"), overwrite=True)


@pytest.mark.parametrize("argv, message", [
    (["--epochs", "x"], "argument --epochs: invalid int value: 'x'"),
    (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    (["--fanout", "-1,10"], "argument --fanout: expected one argument; a value that starts "
                            "with '-' goes after '=': --fanout=-1,10\n"),
    (["--fanout", "-1", "--fanout", "-1,10"], "--fanout=-1,10\n"),
    (["--epochs", "--lr", "3"], "argument --epochs: expected one argument\n"),
])
def test_a_flag_argparse_refuses_is_one_line_not_the_whole_usage(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and "usage:" not in err
    assert err.splitlines()[-1] == "(python -m pyg_mgpu.distributed_sampling --help lists every flag)"


def test_help_a_refused_flag_and_a_refused_setting_never_load_torch():
    # Answered in a fraction of a second: importing torch takes over one.
    probe = ("import sys\n"
             "from pyg_mgpu.distributed_sampling import main\n"
             "try:\n"
             "    code = main(sys.argv[1:])\n"
             "except SystemExit as e:\n"
             "    code = e.code\n"
             "print(code, 'torch' in sys.modules)\n")
    for argv, code in ((["--help"], 0), (["--epochs", "x"], 2), (["--epochs", "0"], 2),
                       (["--fanout", "10,-1,x"], 2),
                       (["--dataset", "synthetic-hetero", "--model", "gat"], 2)):
        proc = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True,
                              text=True, timeout=120)
        assert proc.stdout.splitlines()[-1] == f"{code} False", (argv, proc.stdout[-300:])


def test_flags_that_do_nothing_here_are_named():
    from pyg_mgpu.train.config import TrainConfig

    cfg = TrainConfig.from_flags(graph_on="host", feature_cache_gb=1.0, heads=4)
    on_cpu = cfg.ignored_flags("cpu")
    assert [line.split()[0] for line in on_cpu] == ["--heads", "--graph-on", "--feature-cache-gb"]
    assert cfg.ignored_flags("cuda") == on_cpu[:1]
    assert TrainConfig.from_flags(model="gat", heads=4).ignored_flags("cpu") == []
    assert TrainConfig.from_flags().ignored_flags("cpu") == []  # defaults are never named


@pytest.mark.parametrize("dataset", ["cora", "synthetic-hetero"])
def test_synthetic_sizes_given_with_another_dataset_are_named(dataset):
    from pyg_mgpu.train.config import TrainConfig

    sized = TrainConfig.from_flags(dataset=dataset, split_fractions="0.2,0.1,0.1", num_nodes=99)
    assert sized.ignored_flags("cpu") == [
        "--num-nodes, --split-fractions size the embedded synthetic graph (--dataset synthetic); "
        f"--dataset {dataset} ignores them."]
    assert TrainConfig.from_flags(dataset=dataset, num_classes=3).ignored_flags("cpu") == [
        "--num-classes sizes the embedded synthetic graph (--dataset synthetic); "
        f"--dataset {dataset} ignores it."]
    assert TrainConfig.from_flags(dataset=dataset, split_fractions="0.5,0.1,0.2",
                                  num_nodes=50_000).ignored_flags("cpu") == []  # the defaults
    assert TrainConfig.from_flags(num_nodes=99, split_fractions="0.2,0.1,0.1").ignored_flags(
        "cpu") == []


def test_more_than_4_cpu_ranks_per_core_are_refused_before_the_data_loads(tmp_path, capsys,
                                                                          monkeypatch):
    from pyg_mgpu.train import dataset

    def loaded(*args, **kwargs):
        raise AssertionError("the data loaded")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(dataset, "load_configured", loaded)
    assert main(TINY + ["--devices", "cpu", "--nprocs", "9", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --nprocs 9: more than 4 CPU ranks per core (2 core(s) here: "
                          "at most 8)") and "about 2.7 GB of memory (an estimate" in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert tmp_path.is_dir()  # the user's folder stays; one the run made for itself goes
    assert main(TINY + ["--devices", "cpu", "--nprocs", "9", "--out", str(tmp_path / "new")]) == 2
    assert not (tmp_path / "new").exists()


def test_ctrl_c_while_the_data_loads_leaves_no_empty_run_folder(tmp_path, capsys, monkeypatch):
    from pyg_mgpu.train import job

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(job, "load_checked", interrupted)
    monkeypatch.chdir(tmp_path)
    assert main(TINY + ["--devices", "cpu", "--nprocs", "2", "--out", "new"]) == 130
    assert main(TINY + ["--devices", "cpu", "--nprocs", "2"]) == 130  # runs/<timestamp>
    assert capsys.readouterr().err.split() == "error: stopped by SIGINT".split() * 2
    assert not (tmp_path / "new").exists() and list((tmp_path / "runs").iterdir()) == []
    (tmp_path / "mine").mkdir()  # a folder the user made stays
    assert main(TINY + ["--devices", "cpu", "--nprocs", "2", "--out", "mine"]) == 130
    assert (tmp_path / "mine").is_dir()


def test_ctrl_c_while_the_run_folder_is_claimed_leaves_no_folder(tmp_path, capsys, monkeypatch):
    # The signal lands inside the claim, once its lock file exists: the folder made for the run
    # holds nothing but that lock, and goes with its parents.
    from pyg_mgpu.train import run_folder

    def interrupted(fd, *args, **kwargs):
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        raise KeyboardInterrupt
    monkeypatch.setattr(run_folder, "_lock", interrupted)
    out = tmp_path / "new" / "run"
    assert main(TINY + ["--devices", "cpu", "--nprocs", "2", "--out", str(out)]) == 130
    assert capsys.readouterr().err.split() == "error: stopped by SIGINT".split()
    assert list(tmp_path.iterdir()) == []


def test_an_unused_run_folder_is_removed_only_where_no_run_holds_it(tmp_path):
    from pyg_mgpu.train.run_folder import LOCK, remove_if_unclaimed

    held, kept, empty = tmp_path / "held", tmp_path / "kept", tmp_path / "empty"
    for folder in (held, kept, empty):
        folder.mkdir()
    for folder in (held, kept):
        (folder / LOCK).write_text("pid 1 on host since now\n")
    (kept / "checkpoint.pt").write_bytes(b"")
    with open(held / LOCK) as f:
        fcntl.flock(f, fcntl.LOCK_SH)  # a run that claimed it and has written nothing yet
        for folder in (held, kept, empty):
            remove_if_unclaimed(folder)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["held", "kept"]
    remove_if_unclaimed(held)  # its run has ended
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept"]
    assert sorted(p.name for p in kept.iterdir()) == [LOCK, "checkpoint.pt"]


def test_a_refused_resume_leaves_none_of_the_folders_it_made(tmp_path, capsys):
    # A typo in --resume: the folder and its missing parents were made for the run, then
    # refused with them still there.
    missing = tmp_path / "typo" / "a" / "run"
    assert main(TINY + ["--devices", "cpu", "--nprocs", "2", "--resume", str(missing)]) == 2
    assert f"--resume {missing}: no checkpoint.pt there" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
    out = tmp_path / "new" / "deep" / "run"
    assert main(TINY + ["--devices", "cpu", "--nprocs", "2", "--resume", str(missing),
                        "--out", str(out)]) == 2
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "mine").mkdir()  # a folder the user made stays
    assert main(TINY + ["--devices", "cpu", "--nprocs", "2", "--resume", str(missing),
                        "--out", str(tmp_path / "mine" / "run")]) == 2
    assert [p.name for p in tmp_path.iterdir()] == ["mine"]
    assert list((tmp_path / "mine").iterdir()) == []


@pytest.mark.slow
def test_figures_a_full_disk_refuses_are_a_warning_after_a_completed_run(tmp_path, capsys,
                                                                        monkeypatch):
    import errno

    from pyg_mgpu.train import plots

    def full_disk(path, write, mode="wb"):  # as write() fails: no file name in the error
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(plots, "atomic_write", full_disk)
    out = tmp_path / "run"
    assert main(TINY + ["--epochs", "1", "--devices", "cpu", "--nprocs", "2",
                        "--out", str(out)]) == 0
    err = capsys.readouterr().err
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and str(out / "curves.png") in warnings[0], err
    assert "No space left on device" in warnings[0], err
    assert "error:" not in err, err
    assert (out / "metrics.json").is_file() and not (out / "curves.png").exists()


def test_the_stop_line_names_only_a_run_folder_that_is_there(tmp_path):
    from pyg_mgpu.distributed_sampling import _checkpoint_note
    from pyg_mgpu.train.config import TrainConfig

    kept = TrainConfig.from_flags(out=str(tmp_path))
    assert _checkpoint_note(kept) == (f"no checkpoint in {tmp_path} (the job stopped before "
                                      "writing one)")
    removed = TrainConfig.from_flags(out=str(tmp_path / "removed"))
    assert _checkpoint_note(removed) == "no checkpoint (the job stopped before writing one)"


def test_unwritable_out_is_reported(tmp_path, capsys):
    from pyg_mgpu.tools import bench

    blocker = tmp_path / "file"
    blocker.write_text("")
    for command in (main, bench.main):  # every command says it alike
        assert command(["--out", str(blocker / "run")]) == 2
        assert capsys.readouterr().err == (f"error: --out {blocker / 'run'}: cannot write there "
                                           "(Not a directory); choose a writable folder.\n")


def test_batch_size_1_that_leaves_a_rank_short_is_refused(tmp_path, capsys):
    # 10 nodes, half of them training: 5 over 3 ranks in batches of 1 cannot give every rank
    # the same number of steps.
    argv = TINY + ["--num-nodes", "10", "--num-edges", "40", "--batch-size", "1",
                   "--devices", "cpu", "--nprocs", "3", "--out", str(tmp_path)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "batch size 1 with 5 training nodes on 3 ranks" in err and "--batch-size 2" in err


def test_more_ranks_than_training_nodes_is_refused(tmp_path, capsys):
    argv = TINY + ["--num-nodes", "10", "--num-edges", "40", "--devices", "cpu", "--nprocs", "6",
                   "--out", str(tmp_path)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "warning: 6 CPU ranks on" in err or len(os.sched_getaffinity(0)) >= 6
    assert "cannot give each of 6 ranks at least one of 5 training nodes" in err
    assert "use fewer ranks (--nprocs / --devices)" in err


def assert_exact_ratio(accuracy: float, count: int):
    """An accuracy over ``count`` nodes reduced as sums and counts: a whole number of them."""
    assert 0.0 <= accuracy <= 1.0
    assert accuracy * count == pytest.approx(round(accuracy * count), abs=1e-6), accuracy


@pytest.mark.slow
def test_end_to_end_run_writes_complete_outputs(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "pyg_mgpu.distributed_sampling", *TINY,
                           "--epochs", "2", "--devices", "cpu", "--nprocs", "2", "--lr", "0.01",
                           "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    for key in ("dataset", "world_size", "device", "backend", "sampler", "config", "epochs",
                "best_val_acc", "best_epoch", "test_acc", "wall_time_s"):
        assert key in metrics
    assert metrics["world_size"] == 2 and metrics["backend"] == "gloo"
    # What ran, every default resolved; the config keeps what was asked (None: the default).
    assert metrics["plan"] == {"sampler": "native", "graph_on": "cpu", "sample_batches": 1,
                               "prefetch": 0, "feature_cache_gb": 0, "eval_batch_size": 128,
                               "backend": "gloo", "matmul_precision": "highest",
                               "fused_aggregation": "off", "cuda_graph": False}
    assert metrics["config"]["sample_batches"] is None and metrics["config"]["sampler"] == "auto"
    assert [e["epoch"] for e in metrics["epochs"]] == [1, 2]
    for e in metrics["epochs"]:
        assert {"train_loss", "val_acc", "epoch_time_s", "eval_time_s"} <= set(e)
        stages = e["stage_times_s"]
        assert set(stages) == {"sample", "gather", "forward", "backward", "allreduce",
                               "optimizer", "checkpoint"}
        # Positive after carving sampling out of loading and the all-reduce out of backward.
        assert all(v > 0 for v in stages.values())
    rows = list(csv.DictReader((out / "history.csv").open()))
    assert [int(r["epoch"]) for r in rows] == [1, 2]
    state = torch.load(out / "best.pt")
    # The model built as docs/outputs.md says, from what metrics.json records of the graph
    assert (metrics["num_features"], metrics["num_classes"]) == (8, 4)
    model = GraphSAGE(metrics["num_features"], metrics["config"]["hidden"],
                      metrics["num_classes"], len(metrics["config"]["fanout"]))
    model.load_state_dict(state)  # plain state_dict, no "module." prefix
    # ... and its recipe for any --model.
    from pyg_mgpu.predict import build_run_model
    from pyg_mgpu.train.config import TrainConfig
    from pyg_mgpu.train.dataset import load_configured
    cfg = TrainConfig.from_flags(**metrics["config"])
    build_run_model(cfg, load_configured(cfg)).load_state_dict(state)
    assert_exact_ratio(metrics["test_acc"], TINY_TEST_NODES)
    # The run learned (the seed fixes every draw, so this holds on every run): the loss fell by
    # more than a second epoch's other batches and dropout masks move it without training
    # (about 0.02), and the model beats chance (0.25 among 4 classes).
    first, second = (e["train_loss"] for e in metrics["epochs"])
    assert second < first - 0.05, (first, second)
    assert metrics["best_val_acc"] > 0.35 and metrics["test_acc"] > 0.35, metrics


_PARENT_MODULES = ("import sys\n"
                   "from pyg_mgpu.distributed_sampling import main\n"
                   "code = main(sys.argv[1:])\n"
                   "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch_geometric'))\n"
                   "sys.exit(code)\n")


@pytest.mark.slow
def test_the_parent_of_a_run_never_loads_pyg(tmp_path):
    # Only the ranks train with PyG; a parent that loaded it too would take seconds longer to
    # start them. The run is the CLI's own main(); it prints which PyG modules it loaded.
    proc = subprocess.run([sys.executable, "-c", _PARENT_MODULES, *TINY, "--epochs", "1",
                           "--devices", "cpu", "--nprocs", "2", "--out", str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines()[-1] == "[]"
    assert (tmp_path / "run" / "metrics.json").is_file()  # the ranks trained, with PyG


@pytest.mark.slow
def test_rank0_and_sharded_evaluation_agree(tmp_path):
    # With fanout -1 the evaluation sample is every neighbour: exact, whoever evaluates.
    results = {}
    for mode in ("rank0", "all"):
        out = tmp_path / mode
        argv = TINY + ["--fanout=-1,-1", "--epochs", "2", "--devices", "cpu", "--nprocs",
                       "2", "--eval-on", mode, "--inference", "layerwise", "--out", str(out)]
        assert main(argv) == 0
        results[mode] = json.loads((out / "metrics.json").read_text())
    for key in ("best_val_acc", "test_acc"):
        assert results["rank0"][key] == results["all"][key]
    assert [e["val_acc"] for e in results["rank0"]["epochs"]] == \
        [e["val_acc"] for e in results["all"]["epochs"]]
    # Sampling every neighbour is exact, so it must agree with layer-wise inference (up to one
    # node whose argmax a different summation order could flip).
    m = results["all"]
    assert abs(m["val_acc_exact"] - m["best_val_acc"]) <= 1 / 150 + 1e-9
    assert abs(m["test_acc_exact"] - m["test_acc"]) <= 1 / 300 + 1e-9


@pytest.mark.slow
def test_pyg_recipe_and_bf16_variants_train(tmp_path):
    for name, extra in (("recipe", ["--recipe", "pyg"]),
                        ("bf16", ["--amp", "bf16", "--inference", "layerwise"])):
        out = tmp_path / name
        assert main(TINY + ["--epochs", "1", "--devices", "cpu", "--nprocs", "2",
                            "--out", str(out)] + extra) == 0
        metrics = json.loads((out / "metrics.json").read_text())
        assert metrics["recipe"] == ("pyg" if name == "recipe" else "pyg_mgpu")
        assert_exact_ratio(metrics["test_acc"], TINY_TEST_NODES)
    # bf16 runs store the features in bf16: the shared dataset shrinks by half of x's bytes.
    full = json.loads((tmp_path / "recipe" / "metrics.json").read_text())["dataset_bytes"]
    assert metrics["dataset_bytes"] == full - 1500 * 8 * 2
    assert_exact_ratio(metrics["test_acc_exact"], TINY_TEST_NODES)


@pytest.mark.slow
def test_compiled_model_trains_like_the_eager_one(tmp_path):
    # Without dropout the compiled model computes the same function (up to rounding).
    runs = {}
    for name, extra in (("eager", []), ("compiled", ["--compile"])):
        out = tmp_path / name
        assert main(TINY + ["--epochs", "2", "--devices", "cpu", "--nprocs", "2", "--dropout",
                            "0", "--out", str(out)] + extra) == 0
        runs[name] = json.loads((out / "metrics.json").read_text())
    assert runs["compiled"]["config"]["compile"] is True
    assert [e["train_loss"] for e in runs["compiled"]["epochs"]] == pytest.approx(
        [e["train_loss"] for e in runs["eager"]["epochs"]], rel=1e-4)
    # Compiled in place: the checkpoint keeps PyG's plain keys.
    GraphSAGE(8, 16, 4, 2).load_state_dict(torch.load(tmp_path / "compiled" / "best.pt"))


@pytest.mark.slow
def test_prefetching_changes_timing_not_results(tmp_path):
    runs = {}
    for depth in ("0", "2"):
        out = tmp_path / depth
        assert main(TINY + ["--epochs", "2", "--devices", "cpu", "--nprocs", "2",
                            "--prefetch", depth, "--out", str(out)]) == 0
        runs[depth] = json.loads((out / "metrics.json").read_text())
    for field in ("train_loss", "train_acc", "val_acc"):
        assert [e[field] for e in runs["0"]["epochs"]] == [e[field] for e in runs["2"]["epochs"]]
    assert runs["0"]["test_acc"] == runs["2"]["test_acc"]
    # Sampling runs in the background thread: this thread only sees the wait for a batch.
    assert set(runs["2"]["epochs"][0]["stage_times_s"]) == {"load", "forward", "backward",
                                                            "allreduce", "optimizer",
                                                            "checkpoint"}


def test_full_shared_memory_is_a_clear_error(tmp_path, capsys, monkeypatch):
    import shutil
    from collections import namedtuple
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(100, 100, 0))
    for cache in (["--features-on", "shm"], ["--no-cache"]):
        assert main(TINY + cache + ["--out", str(tmp_path)]) == 2
        err = capsys.readouterr().err
        assert "shared memory" in err and "--shm-size" in err and "Traceback" not in err
        assert "--features-on mmap" in err


def test_full_shared_memory_maps_the_cache_instead(tmp_path, capsys, monkeypatch):
    # --features-on auto: too little /dev/shm for the graph, so the ranks map the cache files.
    import shutil
    from collections import namedtuple
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(100, 100, 0))
    assert main(TINY + ["--epochs", "1", "--out", str(tmp_path)]) == 0
    assert "(mapped)" in capsys.readouterr().out


@pytest.mark.gpu
@pytest.mark.parametrize("graph_on, cache_gb, cached_rows", [
    ("gpu", "0.01", 0),  # features on the GPU already: no cache
    ("cpu", "0", 0),  # cache turned off: every row copied per batch
    ("cpu", str(100 * 8 * 4 / 2**30), 100),  # room for exactly 100 rows of 8 float32
])
def test_trains_on_one_gpu(tmp_path, graph_on, cache_gb, cached_rows):
    out = tmp_path / graph_on
    assert main(TINY + ["--epochs", "2", "--devices", "cuda:0", "--graph-on", graph_on,
                        "--feature-cache-gb", cache_gb, "--out", str(out)]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["device"] == "cuda" and metrics["backend"] == "nccl"
    assert metrics["feature_cache_rows"] == cached_rows


@pytest.mark.slow
def test_dataloader_workers_in_spawned_ranks(tmp_path):
    # Spawned ranks used to spawn their workers too, re-sharing graph tensors whose file
    # descriptors torch had closed: "bad value(s) in fds_to_keep" at the first epoch.
    assert main(TINY + ["--epochs", "2", "--devices", "cpu", "--nprocs", "2", "--num-workers",
                        "1", "--out", str(tmp_path)]) == 0
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert [e["epoch"] for e in metrics["epochs"]] == [1, 2]
    assert set(metrics["epochs"][0]["stage_times_s"]) == {"load", "forward", "backward",
                                                          "allreduce", "optimizer",
                                                          "checkpoint"}


def test_every_flag_is_a_setting_and_every_setting_a_flag():
    """The parser is made from the settings' definitions: no flag of the main command is
    declared anywhere else, and each choice is listed once, in its setting."""
    from dataclasses import fields

    from pyg_mgpu.distributed_sampling import build_parser
    from pyg_mgpu.train.config import TrainConfig
    from pyg_mgpu.train.recipes import RECIPE_FIELDS
    from pyg_mgpu.train.setting import flag_fields, flag_of

    settings = [f for group in fields(TrainConfig) for f in flag_fields(group.default_factory)]
    parser = build_parser()
    flags = {flag for action in parser._actions for flag in action.option_strings} - {"-h",
                                                                                      "--help"}
    assert flags == {flag_of(f.name) for f in settings}
    assert {f.name for f in settings if f.metadata["from_recipe"]} == set(RECIPE_FIELDS)
    source = (REPO / "pyg_mgpu" / "distributed_sampling.py").read_text()
    assert "add_argument(" not in source and "choices=" not in source
    for action in parser._actions:  # the metavar shows the choices; the config checks them
        assert action.choices is None, action.option_strings
    model = parser.parse_args(["--model", "gat"])
    assert TrainConfig.from_flags(**vars(model)).model.hidden == 64  # the gat recipe's
