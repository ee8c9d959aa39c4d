"""Sphinx configuration: the Markdown pages of docs/ (MyST), an API reference from the docstrings
of ``pyg_mgpu.__all__`` and a CLI reference from the CLI's argparse parser (docs/_ext)."""
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "_ext"))
sys.path.insert(0, str(HERE.parent))  # the checkout's pyg_mgpu, installed or not

project = "pyg_mgpu"
author = "pyg_mgpu developers"
copyright = "2026, pyg_mgpu developers"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",  # Google-style Args:/Returns: sections
    "sphinx.ext.doctest",
    "pyg_mgpu_reference",  # {api-reference} and {cli-reference}
]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
smartquotes = False  # flags like --lr stay as typed (smartquotes makes "--" an en dash)
exclude_patterns = ["_build", "scale/*.json", "scale/*.csv"]

myst_heading_anchors = 4  # `page.md#a-heading` links resolve, as on GitHub
myst_enable_extensions = ["colon_fence"]

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": True}
napoleon_google_docstring = True
napoleon_numpy_docstring = False

# furo: a content column that widens with the window, so long commands are not clipped.
html_theme = "furo"
html_title = "pyg_mgpu: multi-GPU neighbour-sampling training for PyTorch Geometric"
