"""The documentation site: Sphinx builds docs/ with warnings as errors, the generated CLI and API
references cover every flag and every exported name, every internal link and anchor resolves,
and (where Chromium is installed) a real browser renders the pages and finds through search."""
import html.parser
import inspect
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

import pyg_mgpu
from pyg_mgpu.distributed_sampling import build_parser

pytest.importorskip("sphinx", reason='the docs build needs pip install -e ".[docs]"')
pytest.importorskip("myst_parser", reason='the docs build needs pip install -e ".[docs]"')

DOCS = Path(__file__).resolve().parents[1] / "docs"
pytestmark = pytest.mark.slow  # one Sphinx build of the whole site


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b",
                           "html", "-d", str(out / ".doctrees"), str(DOCS), str(out)],
                          capture_output=True, text=True)
    assert done.returncode == 0, f"sphinx -W failed:\n{done.stdout}\n{done.stderr}"
    return out


class _Links(html.parser.HTMLParser):
    """Every href/src and every id of one HTML page."""

    def __init__(self):
        super().__init__()
        self.links, self.ids = [], set()

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if name in ("href", "src") and value:
                self.links.append(value)
            elif name == "id" and value:
                self.ids.add(value)


def _parse(page: Path) -> _Links:
    parser = _Links()
    parser.feed(page.read_text(encoding="utf-8"))
    return parser


def test_every_page_of_the_toctree_is_built(site):
    for page in ("index", "getting_started", "api", "from_pyg_tutorial", "cli", "reference",
                 "datasets", "outputs", "multinode", "faults", "benchmarks", "comparison",
                 "architecture", "changelog"):
        assert (site / f"{page}.html").is_file(), page


def test_every_internal_link_and_anchor_resolves(site):
    pages = {page: _parse(page) for page in site.rglob("*.html")}
    broken = []
    for page, parsed in pages.items():
        for link in parsed.links:
            parts = urlsplit(link)
            if parts.scheme or link.startswith("//"):
                continue  # external: not fetched (no network in CI)
            target = (page.parent / unquote(parts.path)).resolve() if parts.path else page
            if not target.exists():
                broken.append(f"{page.name}: {link} (no such file)")
            elif parts.fragment and target.suffix == ".html":
                ids = pages[target].ids if target in pages else _parse(target).ids
                if unquote(parts.fragment) not in ids:
                    broken.append(f"{page.name}: {link} (no such anchor)")
    assert not broken, "\n".join(broken)


def test_cli_reference_lists_every_flag_of_the_parser(site):
    page = (site / "cli.html").read_text(encoding="utf-8")
    parser = build_parser()
    flags = [flag for action in parser._actions for flag in action.option_strings
             if flag not in ("-h", "--help")]
    assert len(flags) > 30
    missing = [flag for flag in flags if flag not in page]
    assert not missing, missing
    for group in parser._action_groups[2:]:  # the topic groups, after argparse's own two
        assert group.title[1:] in page, group.title


def test_api_reference_documents_everything_exported(site):
    ids = _parse(site / "reference.html").ids
    for name in pyg_mgpu.__all__:
        obj = getattr(pyg_mgpu, name)
        expected = (f"module-{obj.__name__}" if inspect.ismodule(obj)
                    else f"pyg_mgpu.{name}")
        assert expected in ids, name
    # Google-style sections become field lists: the loader's arguments are documented.
    assert "pyg_mgpu.NeighborLoader.set_epoch" in ids


def test_search_index_holds_the_api(site):
    index = (site / "searchindex.js").read_text(encoding="utf-8")
    for word in ("spawn", "neighborload", "load_dataset"):
        assert word in index.lower(), word


def _chromium():
    return next((shutil.which(name) for name in ("chromium", "chromium-browser",
                                                 "google-chrome") if shutil.which(name)), None)


def _dump_dom(browser: str, url: str) -> str:
    done = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu",
                           "--virtual-time-budget=10000", "--dump-dom", url],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@pytest.mark.skipif(_chromium() is None, reason="needs Chromium (Debian: apt-get install "
                                                "chromium)")
def test_a_browser_renders_the_pages_and_searches(site):
    browser = _chromium()
    landing = _dump_dom(browser, (site / "index.html").as_uri())
    assert "Getting started" in landing and "API reference" in landing
    reference = _dump_dom(browser, (site / "reference.html").as_uri())
    assert 'id="pyg_mgpu.spawn"' in reference and 'id="pyg_mgpu.NeighborLoader"' in reference
    # The search page runs its script over searchindex.js in the browser and lists the hits.
    hits = _dump_dom(browser, (site / "search.html").as_uri() + "?q=spawn")
    assert "reference.html#pyg_mgpu.spawn" in hits, hits[-3000:]
