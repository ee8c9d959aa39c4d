"""Every name ``pyg_mgpu`` exports documents an example, and the examples that run on their own
(``>>>``) give what they show. Examples run with ``torch`` and ``pyg_mgpu`` imported, as a
reader's script would have them."""
import doctest
import inspect
import re

import pytest
import torch

import pyg_mgpu

EXPORTED = [name for name in pyg_mgpu.__all__ if not inspect.ismodule(getattr(pyg_mgpu, name))]


@pytest.mark.parametrize("name", EXPORTED)
def test_the_docstring_has_an_example(name):
    doc = inspect.getdoc(getattr(pyg_mgpu, name)) or ""
    # An "Example:" section (Google style) holding a doctest or a code block, or "Example::"
    # followed by one (reStructuredText); in both the example runs to the next unindented line.
    section = re.search(r"^Examples?:(:?)\n(.*?)(?=^\S|\Z)", doc, re.M | re.S)
    assert section, f"pyg_mgpu.{name}'s docstring has no Example section"
    literal, body = section.groups()
    assert body.strip() and (literal or ">>>" in body or "::" in body), \
        f"pyg_mgpu.{name}'s Example section holds no doctest and no code block"


@pytest.mark.parametrize("name", EXPORTED)
def test_the_docstring_examples_run(name):
    tests = doctest.DocTestFinder(recurse=False).find(
        getattr(pyg_mgpu, name), f"pyg_mgpu.{name}",
        globs={"torch": torch, "pyg_mgpu": pyg_mgpu})
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    for test in tests:
        torch.manual_seed(0)
        runner.run(test)
    assert runner.failures == 0, f"pyg_mgpu.{name}: see the doctest report above"


def test_most_exported_names_have_runnable_examples():
    runnable = [name for name in EXPORTED
                if ">>>" in (inspect.getdoc(getattr(pyg_mgpu, name)) or "")]
    # spawn, RankFailed and RankContext need a job of several processes, pinned_data a GPU:
    # shown, not run.
    assert set(EXPORTED) - set(runnable) <= {"spawn", "RankFailed", "RankContext", "pinned_data"}


@pytest.mark.parametrize("module", ["pyg_mgpu.nn.hetero", "pyg_mgpu.data.stores"])
def test_module_examples_run(module):
    """Examples of public classes and functions that are reached through their modules."""
    import importlib
    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS,
                             extraglobs={"torch": torch, "pyg_mgpu": pyg_mgpu})
    assert result.attempted > 0 and result.failed == 0
