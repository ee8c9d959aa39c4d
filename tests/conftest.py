"""Fixtures and the device guard shared by the test modules."""
from pathlib import Path

import pytest

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def pytest_runtest_setup(item):
    """A test marked ``gpu`` (``@pytest.mark.gpu``, the shared device guard) needs CUDA and
    skips without it."""
    if item.get_closest_marker("gpu") is not None:
        import torch
        if not torch.cuda.is_available():
            pytest.skip("needs CUDA")


@pytest.fixture
def shared_data() -> Path:
    """The offline data folder beside the checkout (``../shared/data``); skips when absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"offline data folder {SHARED_DATA} is absent (put PyG's raw Planetoid "
                    "files there to run these tests)")
    return SHARED_DATA


@pytest.fixture(autouse=True, scope="session")
def private_graph_cache(tmp_path_factory):
    """Runs (in this process and the subprocesses it starts) keep their converted-graph cache
    in a temporary folder, not the user's ~/.cache."""
    import os
    before = os.environ.get("PYG_MGPU_CACHE")
    os.environ["PYG_MGPU_CACHE"] = str(tmp_path_factory.mktemp("pyg_mgpu_cache"))
    yield
    if before is None:
        os.environ.pop("PYG_MGPU_CACHE", None)
    else:
        os.environ["PYG_MGPU_CACHE"] = before
