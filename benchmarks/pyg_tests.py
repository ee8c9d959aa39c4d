"""Runs PyG's own loader and sampler tests against pyg_mgpu's classes.

``pyg_mgpu.NeighborLoader``, ``LinkNeighborLoader``, ``NeighborSampler`` and
``BidirectionalNeighborSampler`` promise PyG's batches. PyG's own tests of those classes are the
sharpest check of that promise, but they skip without pyg-lib or torch-sparse. This script runs
them from a PyG checkout with PyG's names bound to pyg_mgpu's classes and those skips lifted
(see ``benchmarks/_pyg_tests_plugin.py``)::

    git clone https://github.com/pyg-team/pytorch_geometric
    git -C pytorch_geometric checkout 2.8.0.post1        # the installed release's tests
    python benchmarks/pyg_tests.py pytorch_geometric --out pyg_tests_run

The tests import the installed ``torch_geometric``, not the checkout's sources. Each test's
outcome, and the sampler classes it built or sampled with, go to ``<out>/pyg_tests.json``. A
test that fails without having run a pyg_mgpu class (PyG's tests that call pyg-lib's and
torch-sparse's operators directly, to compare the two) is listed apart. The script exits
non-zero if a test that ran pyg_mgpu's code fails, or if a test module's pyg-lib gate stayed
closed.

``--classes pyg`` is the control run: the same gates lifted, PyG's own classes kept. Without
pyg-lib or torch-sparse, PyG's sampler then fails the tests that ours passes.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
PLUGIN = "_pyg_tests_plugin"

# PyG's tests of the classes pyg_mgpu offers, then its other loader tests that build one.
CORE_TESTS = ("test/loader/test_neighbor_loader.py",
              "test/sampler/test_sampler_neighbor_sampler.py",
              "test/loader/test_link_neighbor_loader.py")
OTHER_TESTS = ("test/loader/test_cache.py", "test/loader/test_imbalanced_sampler.py",
               "test/loader/test_prefetch.py", "test/loader/test_zip_loader.py",
               "test/loader/test_mixin.py")


def ran_ours(test: dict) -> bool:
    return any(name.startswith("pyg_mgpu.") for name in test["samplers"])


def summarise(tests: list[dict]) -> dict:
    """Outcome counts, those of the tests that ran a pyg_mgpu class, and the tests to look at."""
    def ids(outcome: str, ours: bool) -> list[str]:
        return [t["id"] for t in tests if t["outcome"] == outcome and ran_ours(t) == ours]

    return {"outcomes": dict(Counter(t["outcome"] for t in tests)),
            "outcomes_running_pyg_mgpu": dict(Counter(t["outcome"] for t in tests
                                                      if ran_ours(t))),
            "failed_running_pyg_mgpu": ids("failed", True),
            "failed_without_pyg_mgpu": ids("failed", False),
            "passed_without_pyg_mgpu": ids("passed", False),
            "gate_not_lifted": [t["id"] for t in tests
                                if any(s.startswith("gate not lifted") for s in t["samplers"])]}


def git_describe(path: Path) -> str | None:
    proc = subprocess.run(["git", "-C", str(path), "describe", "--tags", "--always", "--dirty"],
                          capture_output=True, text=True)
    return proc.stdout.strip() or None if proc.returncode == 0 else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pyg_src", type=Path, help="a PyG checkout (the folder holding test/)")
    parser.add_argument("--out", type=Path, default=Path("pyg_tests_run"))
    parser.add_argument("--classes", choices=("pyg_mgpu", "pyg"), default="pyg_mgpu",
                        help="whose classes PyG's names are bound to (pyg: the control run)")
    parser.add_argument("--tests", nargs="+", default=None,
                        help=f"test files, relative to pyg_src (default: {' '.join(CORE_TESTS)}"
                             f" {' '.join(OTHER_TESTS)}; those missing from the checkout are"
                             " left out)")
    parser.epilog = "Arguments after -- go to pytest (for example -- -k hetero)."
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    args = parser.parse_args(argv[:len(argv) - len(extra) - bool(extra or "--" in argv)])

    src = args.pyg_src.resolve()
    if not (src / "test").is_dir():
        parser.error(f"{src} has no test/ folder: give the root of a PyG checkout")
    wanted = args.tests or [*CORE_TESTS, *OTHER_TESTS]
    files = [f for f in wanted if (src / f).is_file()]
    missing = sorted(set(wanted) - set(files))
    if (args.tests and missing) or not files:
        parser.error(f"not in {src}: {', '.join(missing)}")
    args.out.mkdir(parents=True, exist_ok=True)
    report_path = args.out / "pyg_tests.json"
    report_path.unlink(missing_ok=True)

    env = {**os.environ, "PYG_TESTS_CLASSES": args.classes,
           "PYG_TESTS_REPORT": str(report_path.resolve()),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE),
                                                       os.environ.get("PYTHONPATH")]))}
    # Run from an empty folder: with the checkout as the working directory, `python -m pytest`
    # would import the checkout's torch_geometric instead of the installed one.
    with tempfile.TemporaryDirectory(prefix="pyg_tests-") as cwd:
        cmd = [sys.executable, "-m", "pytest", "-p", PLUGIN, "-c", str(src / "pyproject.toml"),
               "--rootdir", str(src), "-o", "addopts=", "-q", "-rfs", "-p", "no:cacheprovider",
               # PyG's `dataset` mark means "may download"; Karate Club, the one these
               # tests load, is built into PyG.
               "-m", "not rag",
               *[str(src / f) for f in files], *extra]
        print("$", " ".join(cmd), flush=True)
        proc = subprocess.run(cmd, cwd=cwd, env=env)
    if not report_path.exists():
        print(f"pytest exited {proc.returncode} before reporting", file=sys.stderr)
        return proc.returncode or 1

    report = json.loads(report_path.read_text())
    report.update(pyg_src=str(src), pyg_src_ref=git_describe(src), files=files,
                  left_out=missing, pytest_exit_code=proc.returncode)
    report["summary"] = summary = summarise(report["tests"])
    report_path.write_text(json.dumps(report, indent=1))

    def counted(counts: dict) -> str:
        return ", ".join(f"{n} {outcome}" for outcome, n in sorted(counts.items())) or "none"
    print(f"\nPyG's tests from {src} ({report['pyg_src_ref'] or 'not a git checkout'}), "
          f"torch_geometric {report['torch_geometric']}, classes: {report['classes']}")
    print(f"  all: {counted(summary['outcomes'])}")
    print(f"  running a pyg_mgpu class: {counted(summary['outcomes_running_pyg_mgpu'])}")
    print(f"  passed without running one (PyG's test returns early for these parameters, or"
          f" needs no sampler): {len(summary['passed_without_pyg_mgpu'])}")
    for key, title in (("failed_running_pyg_mgpu", "failed, running pyg_mgpu's code"),
                       ("failed_without_pyg_mgpu", "failed without running a pyg_mgpu class"),
                       ("gate_not_lifted", "pyg-lib gate not lifted")):
        if summary[key]:
            print(f"  {title}:\n" + "\n".join(f"    {i}" for i in summary[key]))
    if missing:
        print(f"  not in this checkout, left out: {', '.join(missing)}")
    print(f"  -> {report_path}")
    if args.classes == "pyg":  # the control run is expected to fail: its verdict is the counts
        return 0
    return 1 if summary["failed_running_pyg_mgpu"] or summary["gate_not_lifted"] else 0

if __name__ == "__main__":
    sys.exit(main())
