"""pytest plugin for ``benchmarks/pyg_tests.py``: PyG's own tests, on pyg_mgpu's classes.

Loaded with ``-p`` before PyG's test modules are imported, it does three things:

1. PyG's names ``NeighborLoader``, ``LinkNeighborLoader``, ``NeighborSampler`` and
   ``BidirectionalNeighborSampler`` (in ``torch_geometric.loader``, ``torch_geometric.sampler``
   and the modules that build samplers) become pyg_mgpu's, unless ``PYG_TESTS_CLASSES=pyg``
   (a control run with PyG's own classes).
2. The gates that skip a test because neither pyg-lib nor torch-sparse is installed are lifted:
   ``onlyNeighborSampler`` runs the test, ``withPackage`` drops those two packages (other
   packages still gate), and while a test module is imported its ``WITH_PYG_LIB``,
   ``WITH_TORCH_SPARSE``, ``WITH_WEIGHTED_NEIGHBOR_SAMPLE`` and
   ``WITH_EDGE_TIME_NEIGHBOR_SAMPLE`` read True, so the tests take the branches that pyg-lib's
   sampler passes. PyG's internals see the real values again once the module is imported.
3. Each test's outcome is written to ``$PYG_TESTS_REPORT`` (JSON) with the loader and sampler
   classes it built or sampled with (recorded as their constructors begin, so that one that
   raises counts), so that a pass is known to have run pyg_mgpu's code.
"""
from __future__ import annotations

import collections
import json
import os
from typing import Callable

import pytest
import torch_geometric
import torch_geometric.loader
import torch_geometric.loader.link_neighbor_loader
import torch_geometric.loader.neighbor_loader
import torch_geometric.sampler
import torch_geometric.sampler.neighbor_sampler
import torch_geometric.testing
import torch_geometric.testing.decorators
import torch_geometric.typing
from torch_geometric.loader.link_loader import LinkLoader
from torch_geometric.loader.node_loader import NodeLoader

import pyg_mgpu

OURS = os.environ.get("PYG_TESTS_CLASSES", "pyg_mgpu") == "pyg_mgpu"
BACKENDS = {"pyg_lib", "pyg-lib", "torch_sparse", "torch-sparse"}
FLAGS = ("WITH_PYG_LIB", "WITH_TORCH_SPARSE", "WITH_WEIGHTED_NEIGHBOR_SAMPLE",
         "WITH_EDGE_TIME_NEIGHBOR_SAMPLE")
REAL_FLAGS = {name: getattr(torch_geometric.typing, name) for name in FLAGS}
SAMPLERS = (torch_geometric.sampler.NeighborSampler,
            torch_geometric.sampler.BidirectionalNeighborSampler)

# 1. PyG's names -> pyg_mgpu's classes.
if OURS:
    for module in (torch_geometric.loader, torch_geometric.loader.neighbor_loader):
        module.NeighborLoader = pyg_mgpu.NeighborLoader
    torch_geometric.loader.LinkNeighborLoader = pyg_mgpu.LinkNeighborLoader
    torch_geometric.loader.link_neighbor_loader.LinkNeighborLoader = pyg_mgpu.LinkNeighborLoader
    for module in (torch_geometric.sampler, torch_geometric.sampler.neighbor_sampler,
                   torch_geometric.loader.neighbor_loader,
                   torch_geometric.loader.link_neighbor_loader):
        module.NeighborSampler = pyg_mgpu.NeighborSampler
        if hasattr(module, "BidirectionalNeighborSampler"):
            module.BidirectionalNeighborSampler = pyg_mgpu.BidirectionalNeighborSampler


# 2. Gates for pyg-lib and torch-sparse lifted.
def _is_backend(requirement: str) -> bool:
    from packaging.requirements import Requirement
    return all(Requirement(part).name in BACKENDS for part in requirement.split("|"))


_with_package = torch_geometric.testing.decorators.withPackage


def withPackage(*requirements: str) -> Callable:  # noqa: N802 (PyG's name)
    return _with_package(*[r for r in requirements if not _is_backend(r)])


def onlyNeighborSampler(func: Callable) -> Callable:  # noqa: N802 (PyG's name)
    return func


for module in (torch_geometric.testing, torch_geometric.testing.decorators):
    module.withPackage = withPackage
    module.onlyNeighborSampler = onlyNeighborSampler


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    # A test module is imported while it is collected: its `from torch_geometric.typing import
    # WITH_...` copies and import-time skipif conditions read True, then the real values return.
    if not isinstance(collector, pytest.Module):
        return (yield)
    for name in FLAGS:
        setattr(torch_geometric.typing, name, True)
    try:
        return (yield)
    finally:
        for name, value in REAL_FLAGS.items():
            setattr(torch_geometric.typing, name, value)


# 3. Which sampler classes each test used, and its outcome.
_current: list[str] = []
_used: dict[str, set[str]] = collections.defaultdict(set)
_results: dict[str, dict] = {}


def _record(obj) -> None:
    if _current:
        _used[_current[0]].add(f"{type(obj).__module__}.{type(obj).__qualname__}")


def _recording_init(cls, attribute: str) -> None:
    init = cls.__init__

    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        _record(getattr(self, attribute))
    cls.__init__ = __init__


def _recording_method(cls, name: str) -> None:
    method = getattr(cls, name)

    def wrapper(self, *args, **kwargs):
        _record(self)
        return method(self, *args, **kwargs)
    setattr(cls, name, wrapper)


def _recording_construction(cls) -> None:
    # Recorded on entry, so that a constructor that raises still counts as ours having run.
    init = cls.__init__

    def __init__(self, *args, **kwargs):
        _record(self)
        init(self, *args, **kwargs)
    cls.__init__ = __init__


_recording_init(NodeLoader, "node_sampler")
_recording_init(LinkLoader, "link_sampler")
for cls in {*SAMPLERS, pyg_mgpu.NeighborSampler, pyg_mgpu.BidirectionalNeighborSampler}:
    for name in ("sample_from_nodes", "sample_from_edges"):
        _recording_method(cls, name)
for cls in (pyg_mgpu.NeighborSampler, pyg_mgpu.BidirectionalNeighborSampler,
            pyg_mgpu.NeighborLoader, pyg_mgpu.LinkNeighborLoader):
    _recording_construction(cls)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    flags = {name: getattr(item.module, name) for name in FLAGS if hasattr(item.module, name)}
    if not all(flags.values()):
        _used[item.nodeid].add(f"gate not lifted: {flags}")
    _current[:] = [item.nodeid]
    try:
        return (yield)
    finally:
        _current.clear()


def pytest_runtest_logreport(report) -> None:
    outcome = report.outcome
    if hasattr(report, "wasxfail"):
        outcome = "xfailed" if report.skipped else "xpassed"
    if report.when == "call" or (report.when == "setup" and not report.passed) \
            or (report.when == "teardown" and report.failed):
        entry = {"outcome": outcome}
        if report.failed:
            entry["message"] = report.longrepr.reprcrash.message if hasattr(
                report.longrepr, "reprcrash") else str(report.longrepr)[-500:]
        elif report.skipped and isinstance(report.longrepr, tuple):
            entry["message"] = report.longrepr[2]
        _results[report.nodeid] = entry


def pytest_sessionfinish(session) -> None:
    path = os.environ.get("PYG_TESTS_REPORT")
    if not path:
        return
    tests = [{"id": nodeid, **entry, "samplers": sorted(_used.get(nodeid, ()))}
             for nodeid, entry in sorted(_results.items())]
    with open(path, "w") as f:
        json.dump({"classes": "pyg_mgpu" if OURS else "pyg",
                   "torch_geometric": torch_geometric.__version__,
                   "torch_geometric_path": os.path.dirname(torch_geometric.__file__),
                   "real_flags": REAL_FLAGS, "tests": tests}, f, indent=1)
