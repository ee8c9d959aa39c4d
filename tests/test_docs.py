"""The code in docs/api.md runs as written (with the data folder pointed at a copy of Cora)."""
import re
import shutil
from pathlib import Path

import pytest

API_DOC = Path(__file__).resolve().parents[1] / "docs" / "api.md"


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
