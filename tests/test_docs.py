"""The code in docs/api.md runs as written (with the data folder pointed at a copy of Cora), and
every pyg_mgpu name the docs mention exists."""
import importlib
import re
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
API_DOC = REPO / "docs" / "api.md"


def resolves(dotted: str) -> bool:
    """Whether ``pyg_mgpu.a.b.c`` names a module, or an attribute of the longest module prefix."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for name in parts[i:]:
                obj = getattr(obj, name)
        except AttributeError:
            return False
        return True
    return False


def test_every_pyg_mgpu_name_in_the_docs_exists():
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    named = {(m.group(1), page.name) for page in pages
             for m in re.finditer(r"\b(pyg_mgpu(?:\.\w+)+)", page.read_text())}
    assert len(named) > 30
    missing = sorted(f"{name} ({page})" for name, page in named if not resolves(name))
    assert not missing, missing


def python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


@pytest.mark.slow
def test_drop_in_tutorial_trains_on_cora(shared_data, tmp_path, monkeypatch):
    tutorial = next(b for b in python_blocks(API_DOC.read_text()) if "Planetoid(" in b)
    shutil.copytree(shared_data / "planetoid" / "Cora", tmp_path / "data" / "planetoid" / "Cora")
    monkeypatch.chdir(tmp_path)  # the tutorial reads data/planetoid
    scope: dict = {}
    exec(compile(tutorial, str(API_DOC), "exec"), scope)
    model, data = scope["model"], scope["data"]
    model.eval()
    pred = model(data.x, data.edge_index).argmax(1)
    accuracy = float((pred[data.test_mask] == data.y[data.test_mask]).float().mean())
    assert accuracy > 0.6, f"the tutorial trained to only {accuracy:.3f} test accuracy"
