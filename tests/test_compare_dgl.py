"""Tests for ``python -m pyg_mgpu.compare_dgl`` without DGL: summaries, table, JSON, tolerance, exit codes.

The real DGL run is CI's own step (.ci/compare_dgl.sh); here the two sides are metrics.json files
written by hand, or tiny stand-in commands that write one.
"""
import json
import math
import os
import sys
from pathlib import Path

import pytest

from pyg_mgpu.compare_dgl import main
from pyg_mgpu.tools import compare_dgl
from pyg_mgpu.tools.compare_dgl import (EXIT_ACCURACY_GAP, EXIT_BAD_INPUT, EXIT_SIDE_FAILED,
                                        SideFailed, run_side, side_commands)
from pyg_mgpu.tools.comparison import (SIDES, check, compare_runs, format_table,
                                       steady_epoch_time, summarize_run, summarize_side)
from pyg_mgpu.train.config import TrainConfig

REQUIRED = ("test_acc", "best_val_acc", "epoch_time_s", "peak_mem_mb")


def metrics(test_acc=0.80, best_val=0.78, times=(2.0, 1.0, 1.2), seed=0, peak=900.0,
            sampler="native"):
    epochs = [{"epoch": i + 1, "train_loss": 1.0 / (i + 1), "train_acc": 0.5, "val_acc": 0.7,
               "epoch_time_s": t, "eval_time_s": 0.1} for i, t in enumerate(times)]
    return {"dataset": "cora", "world_size": 2, "device": "cpu", "backend": "gloo",
            "sampler": sampler, "config": {"seed": seed}, "epochs": epochs,
            "best_val_acc": best_val, "best_epoch": 2, "test_acc": test_acc,
            "peak_mem_mb": peak, "wall_time_s": 9.0}


def write_run(folder: Path, **kwargs) -> Path:
    folder.mkdir(parents=True)
    (folder / "metrics.json").write_text(json.dumps(metrics(**kwargs)))
    return folder


@pytest.mark.parametrize("times,expected", [
    ([5.0, 1.0, 2.0], 1.5),  # the first epoch's warm-up is left out
    ([3.0], 3.0),            # unless it is the only one
])
def test_steady_epoch_time(times, expected):
    records = [{"epoch_time_s": t} for t in times]
    assert steady_epoch_time(records) == pytest.approx(expected)


def test_summarize_side_means_and_spread():
    runs = [summarize_run(metrics(test_acc=a, seed=s, peak=p))
            for a, s, p in [(0.80, 0, 900.0), (0.82, 1, 1000.0), (0.84, 2, 1100.0)]]
    side = summarize_side(runs, {"sampler": "native"})
    assert side["test_acc"] == pytest.approx(0.82)
    assert side["test_acc_std"] == pytest.approx(0.02)
    assert (side["test_acc_min"], side["test_acc_max"]) == (0.80, 0.84)
    assert side["peak_mem_mb"] == pytest.approx(1000.0)
    assert side["epoch_time_s"] == pytest.approx(1.1)
    assert side["first_epoch_time_s"] == pytest.approx(2.0)
    assert [r["seed"] for r in side["runs"]] == [0, 1, 2]
    assert side["num_runs"] == 3 and side["sampler"] == "native"


def test_single_run_has_no_spread():
    side = summarize_side([summarize_run(metrics())])
    assert side["test_acc_std"] is None and side["num_runs"] == 1


@pytest.mark.parametrize("pyg,dgl,tol,passed", [
    (0.80, 0.82, 0.03, True),
    (0.80, 0.83, 0.03, True),   # exactly at the tolerance passes
    (0.80, 0.84, 0.03, False),
    (0.84, 0.80, 0.03, False),  # the gap is absolute: either side may be ahead
    (0.80, 0.80, 0.0, True),
])
def test_verdict(pyg, dgl, tol, passed):
    verdict = check({"pyg_mgpu": {"test_acc": pyg}, "dgl": {"test_acc": dgl}}, tol)
    assert verdict.gap == pytest.approx(abs(pyg - dgl))
    assert verdict.passed is passed
    assert ("within" if passed else "OVER") in verdict.describe()


def test_table_is_aligned_and_complete(tmp_path):
    comparison = compare_runs({
        "pyg_mgpu": [write_run(tmp_path / "p0", test_acc=0.8, seed=0),
                     write_run(tmp_path / "p1", test_acc=0.82, seed=1)],
        "dgl": [write_run(tmp_path / "d0", test_acc=0.79, sampler="dgl-dataloader")]})
    table = format_table(comparison)
    lines = table.splitlines()
    assert len({len(line) for line in lines}) == 1, "columns are padded to equal widths"
    assert all(s in lines[0] for s in SIDES)
    for label in ("test acc", "best val acc", "mean epoch s", "peak mem MB"):
        assert any(line.startswith(f"| {label}") for line in lines), label
    assert "0.8100 ± 0.0141 (2 seeds)" in table  # mean ± sample std over the seeds
    assert "dgl-dataloader" in table


def compare_only(tmp_path, pyg_acc, dgl_acc, *extra):
    pyg = write_run(tmp_path / "pyg", test_acc=pyg_acc)
    dgl = write_run(tmp_path / "dgl", test_acc=dgl_acc, sampler="dgl-dataloader")
    out = tmp_path / "cmp"
    code = main(["--compare-only", str(pyg), str(dgl), "--out", str(out), *extra])
    return code, out


def test_compare_only_writes_json_and_markdown(tmp_path, capsys):
    code, out = compare_only(tmp_path, 0.80, 0.81, "--tolerance", "0.02")
    assert code == 0
    data = json.loads((out / "comparison.json").read_text())
    assert set(data) == set(SIDES)
    for side in SIDES:
        for key in REQUIRED:
            assert isinstance(data[side][key], float), (side, key)
    assert data["pyg_mgpu"]["test_acc"] == 0.80 and data["dgl"]["test_acc"] == 0.81
    assert data["pyg_mgpu"]["epoch_time_s"] == pytest.approx(1.1)
    report = (out / "comparison.md").read_text()
    assert format_table(data) in report and "within the tolerance 0.0200" in report
    assert format_table(data) in capsys.readouterr().out


def test_gap_over_tolerance_exits_3(tmp_path, capsys):
    code, out = compare_only(tmp_path, 0.70, 0.80, "--tolerance", "0.05")
    assert code == EXIT_ACCURACY_GAP == 3
    assert "OVER the tolerance" in (out / "comparison.md").read_text()
    assert "OVER" in capsys.readouterr().out


@pytest.mark.parametrize("argv,message", [
    (["--tolerance", "-0.1"], "--tolerance"),
    (["--repeats", "0"], "--repeats"),
    (["--eval-on", "all"], "--eval-on"),
    (["--eval-every", "2"], "--eval-every"),
    (["--resume", "runs/old"], "--resume"),
    (["--epochs", "0"], "--epochs"),
    (["--dgl-python", "/no/such/python"], "--dgl-python"),
    (["--dataset", "synthetic-hetero"], "heterogeneous"),
])
def test_bad_input_is_one_line_and_exit_2(argv, message, tmp_path, capsys):
    assert main(argv + ["--out", str(tmp_path / "out")]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and message in err and "Traceback" not in err


def test_unfinished_run_is_reported(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    dgl = write_run(tmp_path / "dgl")
    assert main(["--compare-only", str(empty), str(dgl), "--out", str(tmp_path)]) == 2
    assert "metrics.json" in capsys.readouterr().err


def test_both_sides_get_the_same_settings(tmp_path):
    cfg = TrainConfig.from_flags(devices="cpu", nprocs=3, epochs=7, batch_size=256, fanout=(5, 4, 3),
                      hidden=32, dropout=0.25, lr=0.01, num_workers=1, timeout_s=60.0,
                      profile=True)
    cmds = side_commands(cfg, tmp_path / "g.npz", seed=5, out=tmp_path, dgl_python="py",
                         dgl_sampler="graphbolt")

    def flags(cmd):
        return {a: b for a, b in zip(cmd, cmd[1:]) if a.startswith("--")}

    pyg, dgl = flags(cmds["pyg_mgpu"]), flags(cmds["dgl"])
    shared = {"--nprocs": "3", "--epochs": "7", "--batch-size": "256", "--fanout": "5,4,3",
              "--hidden": "32", "--dropout": "0.25", "--lr": "0.01", "--seed": "5",
              "--num-workers": "1"}
    assert shared.items() <= pyg.items() and shared.items() <= dgl.items()
    assert pyg["--dataset"] == dgl["--npz"] == str(tmp_path / "g.npz")
    assert pyg["--eval-on"] == "rank0" and pyg["--eval-every"] == "1"
    assert dgl["--devices"] == "cpu" and dgl["--sampler"] == "graphbolt"
    # Flags only the main command knows go to its side alone; defaults are not spelled out.
    assert pyg["--timeout"] == "60.0" and "--profile" in cmds["pyg_mgpu"]
    assert "--timeout" not in dgl and "--profile" not in cmds["dgl"]
    assert "--sampler" not in pyg and "--resume" not in pyg
    assert cmds["pyg_mgpu"][-1] != cmds["dgl"][-1]  # separate run folders


def test_failed_side_quotes_its_log(tmp_path):
    cmd = [sys.executable, "-c", "print('loading'); raise SystemExit('rank 1 exploded')"]
    with pytest.raises(SideFailed, match="exit code 1") as info:
        run_side("dgl", cmd, tmp_path / "log.txt", timeout_s=60)
    assert "rank 1 exploded" in str(info.value)
    assert "loading" in (tmp_path / "log.txt").read_text()


def test_silent_hung_side_times_out(tmp_path):
    cmd = [sys.executable, "-c", "import time; time.sleep(60)"]
    with pytest.raises(SideFailed, match="side-timeout"):
        run_side("pyg_mgpu", cmd, tmp_path / "log.txt", timeout_s=0.5)


FAKE_SIDE = """
import json, sys
from pathlib import Path
out, acc, seed = Path(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
out.mkdir(parents=True, exist_ok=True)
epochs = [{"epoch": 1, "epoch_time_s": 2.0}, {"epoch": 2, "epoch_time_s": 1.0}]
(out / "metrics.json").write_text(json.dumps({
    "dataset": "synthetic", "world_size": 2, "device": "cpu", "backend": "gloo",
    "sampler": "fake", "config": {"seed": seed}, "epochs": epochs, "best_val_acc": acc,
    "best_epoch": 2, "test_acc": acc + 0.001 * seed, "peak_mem_mb": 100.0,
    "wall_time_s": 3.0}))
print("epoch 1\\repoch 2\\rdone")
"""


def stand_in_dgl(folder: Path, monkeypatch, importable: bool = True) -> None:
    """A ``dgl`` package on the PYTHONPATH of the processes the test starts, which imports or
    fails as DGL missing does."""
    (folder / "dgl").mkdir(parents=True)
    (folder / "dgl" / "__init__.py").write_text(
        "" if importable else "raise ModuleNotFoundError(\"No module named 'dgl'\")\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        filter(None, [str(folder), os.environ.get("PYTHONPATH")])))


def test_a_dgl_python_without_dgl_is_refused_before_any_side_trains(tmp_path, monkeypatch,
                                                                    capsys):
    stand_in_dgl(tmp_path / "site", monkeypatch, importable=False)

    def trained(*args, **kwargs):
        raise AssertionError("a side was started")
    monkeypatch.setattr(compare_dgl, "side_commands", trained)
    assert main(["--dgl-python", sys.executable, "--out", str(tmp_path / "out")]) == \
        EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: --dgl-python {sys.executable}: cannot import dgl "
                          "(ModuleNotFoundError: No module named 'dgl')"), err


def test_end_to_end_with_stand_in_sides(tmp_path, monkeypatch, capsys):
    """The orchestration (export, one run per side and seed, outputs) with fake trainers."""
    stand_in_dgl(tmp_path / "site", monkeypatch)
    script = tmp_path / "fake_side.py"
    script.write_text(FAKE_SIDE)
    seen = []

    def fake_commands(cfg, npz, seed, out, dgl_python, dgl_sampler):
        seen.append((Path(npz), seed, dgl_python))
        return {side: [sys.executable, str(script), str(compare_dgl.run_folder(out, side, seed)),
                       str(acc), str(seed)]
                for side, acc in (("pyg_mgpu", 0.80), ("dgl", 0.81))}

    monkeypatch.setattr(compare_dgl, "side_commands", fake_commands)
    out = tmp_path / "cmp"
    code = main(["--num-nodes", "200", "--num-edges", "1000", "--num-features", "4",
                 "--num-classes", "3", "--seed", "4", "--repeats", "2", "--tolerance", "0.02",
                 "--dgl-python", sys.executable, "--out", str(out)])
    assert code == 0
    assert [s for _, s, _ in seen] == [4, 5]
    npz = seen[0][0]
    assert npz == (out / "data" / "synthetic.npz").resolve() and npz.is_file()
    data = json.loads((out / "comparison.json").read_text())
    assert data["dgl"]["num_runs"] == 2
    assert data["dgl"]["test_acc"] == pytest.approx(0.81 + 0.0045)
    assert math.isclose(data["pyg_mgpu"]["epoch_time_s"], 1.0)
    assert (out / "dgl" / "seed5" / "log.txt").is_file()
    printed = capsys.readouterr().out
    assert "  [dgl] done" in printed and "  [dgl] epoch 1" not in printed
    assert "seed 4:" in (out / "comparison.md").read_text()


def test_the_dgl_side_scripts_are_where_the_tools_look():
    # The tools live in pyg_mgpu/tools/; the DGL scripts in the checkout's benchmarks/.
    assert compare_dgl.DGL_SCRIPT.is_file() and compare_dgl.DGL_ENV_SCRIPT.is_file()


def test_refuses_what_the_dgl_variant_cannot_train(tmp_path, capsys):
    # The DGL side trains GraphSAGE with plain Adam; anything else would compare unlike recipes.
    for extra in (["--model", "gat"], ["--weight-decay", "5e-4"]):
        assert main(["--out", str(tmp_path), *extra]) == 2
        assert "DGL variant trains GraphSAGE" in capsys.readouterr().err


def test_the_pyg_sides_own_flags_parse_back_to_the_same_settings():
    from pyg_mgpu.distributed_sampling import build_parser
    from pyg_mgpu.tools.compare_dgl import pyg_only_flags

    changed = dict(amp="bf16", timeout_s=60.0, profile=True, sampler="native", grace_s=5.0,
                   split_fractions=(0.6, 0.1, 0.1), feature_cache_gb=0.5)
    flags = pyg_only_flags(TrainConfig.from_flags(**changed))
    assert "--timeout" in flags and "--split-fractions" in flags
    back = TrainConfig.from_flags(**vars(build_parser().parse_args(flags)))
    for name, value in changed.items():
        assert back.flat()[name] == value, name
