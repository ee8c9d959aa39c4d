"""docs/architecture.md's module table names every module of the package, and only modules that
exist.

A row's first cell names modules in backticks: a path from the repository root
(``pyg_mgpu/train/loop.py``), or a path followed by more file names in the same folder
(``pyg_mgpu/tools/``: ``report.py``, ``bench.py``; ``pyg_mgpu/bench.py``, ``report.py``).
Packages' ``__init__.py`` files are not listed."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"


def table_modules(text: str) -> list[str]:
    """The modules the module table's rows name, as paths from the repository root."""
    lines = text.splitlines()
    start = lines.index("| module | role |") + 2  # after the header and its rule
    named = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        first_cell = line.split("|")[1]
        names = re.findall(r"`([^`]+)`", first_cell)
        assert names and names[0].startswith("pyg_mgpu/"), f"a row names no module: {line}"
        folder = names[0] if names[0].endswith("/") else names[0].rsplit("/", 1)[0] + "/"
        if not names[0].endswith("/"):
            named.append(names[0])
        named += [folder + name for name in names[1:] if name.endswith(".py")]
    return named


def package_modules() -> set[str]:
    return {path.relative_to(ROOT).as_posix() for path in (ROOT / "pyg_mgpu").rglob("*.py")
            if path.name != "__init__.py"}


def test_table_modules_reads_each_convention():
    text = ("| module | role |\n| --- | --- |\n"
            "| `pyg_mgpu/errors.py` | x |\n"
            "| `pyg_mgpu/tools/`: `report.py`, `bench.py` (both) | y |\n"
            "| `pyg_mgpu/bench.py`, `report.py` | z |\n"
            "\n| `pyg_mgpu/not_a_row.py` | after the table |\n")
    assert table_modules(text) == ["pyg_mgpu/errors.py", "pyg_mgpu/tools/report.py",
                                   "pyg_mgpu/tools/bench.py", "pyg_mgpu/bench.py",
                                   "pyg_mgpu/report.py"]


def test_the_module_table_names_every_module_once():
    named = table_modules(DOC.read_text())
    assert sorted(package_modules() - set(named)) == [], "modules missing from the table"
    assert sorted(set(named) - package_modules()) == [], "the table names modules that do not exist"
    assert sorted(m for m in set(named) if named.count(m) > 1) == [], "modules named twice"
