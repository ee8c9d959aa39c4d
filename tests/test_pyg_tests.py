"""``benchmarks/pyg_tests.py``: PyG's own tests, run against pyg_mgpu's classes.

The first tests run the script on a small stand-in for a PyG checkout, written here in PyG's test
idiom, to show that PyG's names reach pyg_mgpu's classes, that the pyg-lib gates open, and that
the report tells a test that ran pyg_mgpu's code from one that did not. The last runs PyG's real
tests when ``PYG_SRC`` names a PyG checkout whose tests match the installed release.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "pyg_tests.py"

# In PyG's idiom: gated on pyg-lib, importing PyG's names.
STAND_IN_TESTS = '''
import torch
from torch_geometric.data import Data
from torch_geometric.loader import NeighborLoader
from torch_geometric.sampler import NeighborSampler
from torch_geometric.testing import onlyNeighborSampler, withPackage
from torch_geometric.typing import WITH_PYG_LIB


def graph():
    src = torch.arange(40).repeat_interleave(3)
    dst = (src + torch.tensor([1, 2, 3]).repeat(40)) % 40
    return Data(x=torch.arange(40), edge_index=torch.stack([src, dst]))


@onlyNeighborSampler
def test_loader_draws_true_in_neighbours():
    assert WITH_PYG_LIB
    batch = next(iter(NeighborLoader(graph(), [2], batch_size=4)))
    assert batch.n_id[:4].tolist() == [0, 1, 2, 3]
    dst = batch.n_id[batch.edge_index[1]]
    src = batch.n_id[batch.edge_index[0]]
    assert bool(((dst - src) % 40 >= 1).all() and ((dst - src) % 40 <= 3).all())


@withPackage('torch_sparse')
def test_a_failure_in_our_sampler():
    NeighborSampler(graph(), [2])
    assert False, 'on purpose'


def test_without_a_sampler():
    assert torch.ones(1).item() == 1
'''


def run(src: Path, out: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    proc = subprocess.run([sys.executable, str(SCRIPT), str(src), "--out", str(out), *args],
                          capture_output=True, text=True, timeout=600)
    report = out / "pyg_tests.json"
    assert report.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc, json.loads(report.read_text())


@pytest.fixture
def stand_in(tmp_path) -> Path:
    src = tmp_path / "pyg"
    (src / "test" / "loader").mkdir(parents=True)
    (src / "test" / "loader" / "test_stand_in.py").write_text(STAND_IN_TESTS)
    (src / "pyproject.toml").write_text("[tool.pytest.ini_options]\naddopts = ['-x']\n")
    return src


def outcomes(report: dict) -> dict[str, tuple[str, bool]]:
    return {t["id"].split("::")[-1]: (t["outcome"], any(s.startswith("pyg_mgpu.")
                                                         for s in t["samplers"]))
            for t in report["tests"]}


def test_pyg_names_run_pyg_mgpu_classes_with_the_gates_lifted(stand_in, tmp_path):
    proc, report = run(stand_in, tmp_path / "ours", "--tests", "test/loader/test_stand_in.py")
    assert outcomes(report) == {
        "test_loader_draws_true_in_neighbours": ("passed", True),
        "test_a_failure_in_our_sampler": ("failed", True),
        "test_without_a_sampler": ("passed", False),
    }, proc.stdout[-3000:]
    summary = report["summary"]
    assert summary["failed_running_pyg_mgpu"] == [
        "test/loader/test_stand_in.py::test_a_failure_in_our_sampler"]
    assert summary["passed_without_pyg_mgpu"] == [
        "test/loader/test_stand_in.py::test_without_a_sampler"]
    # The checkout's own addopts (here -x) do not cut the run short.
    assert proc.returncode == 1, "a failure in pyg_mgpu's code must fail the script"


def test_the_control_run_keeps_pygs_classes(stand_in, tmp_path):
    proc, report = run(stand_in, tmp_path / "pyg", "--classes", "pyg",
                       "--tests", "test/loader/test_stand_in.py")
    assert report["classes"] == "pyg"
    assert not any(ran for _, ran in outcomes(report).values())
    # Without pyg-lib or torch-sparse, PyG's own sampler cannot draw the batch.
    assert outcomes(report)["test_loader_draws_true_in_neighbours"][0] == "failed"
    assert proc.returncode == 0


def test_a_folder_without_pygs_tests_is_refused(stand_in, tmp_path):
    for src, args, says in ((tmp_path, (), "has no test/ folder"),
                            (stand_in, (), "not in"),
                            (stand_in, ("--tests", "test/loader/test_x.py"), "test_x.py")):
        proc = subprocess.run([sys.executable, str(SCRIPT), str(src), *args],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and says in proc.stderr, proc.stderr


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("PYG_SRC"),
                    reason="PYG_SRC names no PyG checkout (its tests are not in PyG's packages)")
def test_pygs_own_tests_pass_on_pyg_mgpu(tmp_path):
    proc, report = run(Path(os.environ["PYG_SRC"]), tmp_path / "run")
    summary = report["summary"]
    assert proc.returncode == 0, proc.stdout[-5000:]
    assert summary["outcomes_running_pyg_mgpu"].get("passed", 0) >= 100, summary
