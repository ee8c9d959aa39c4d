"""Two directives that generate reference pages from the code, so they cannot drift from it.

``{api-reference}``: an autodoc entry for every name in ``pyg_mgpu.__all__``.
``{cli-reference}``: every flag of the CLI's parser, group by group, as ``--help`` shows them.
"""
from __future__ import annotations

import argparse
import inspect

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.util.docutils import SphinxDirective
from sphinx.util.nodes import nested_parse_with_titles


def _rst_text(text: str) -> str:
    """Plain text with reStructuredText's markup characters escaped."""
    for char in ("\\", "*", "`", "|", "_"):
        text = text.replace(char, "\\" + char)
    return text


class _GeneratedRst(SphinxDirective):
    has_content = False

    def lines(self) -> list[str]:
        raise NotImplementedError

    def run(self) -> list[nodes.Node]:
        container = nodes.section()
        source = self.get_source_info()[0]
        content = StringList(self.lines(), source=source)
        nested_parse_with_titles(self.state, content, container)
        return container.children


class ApiReference(_GeneratedRst):
    """autodoc entries for ``pyg_mgpu.__all__``: classes, then functions, then modules."""

    def lines(self) -> list[str]:
        import pyg_mgpu

        kinds = {"class": [], "function": [], "module": []}
        for name in pyg_mgpu.__all__:
            obj = getattr(pyg_mgpu, name)
            kind = ("class" if inspect.isclass(obj) else
                    "module" if inspect.ismodule(obj) else "function")
            kinds[kind].append(name)
        out: list[str] = []
        titles = {"class": "Classes", "function": "Functions", "module": "Modules"}
        for kind, names in kinds.items():
            if not names:
                continue
            out += [titles[kind], "-" * len(titles[kind]), ""]
            for name in names:
                obj = getattr(pyg_mgpu, name)
                target = obj.__name__ if kind == "module" else f"pyg_mgpu.{name}"
                out += [f".. auto{kind}:: {target}"]
                if kind == "class":
                    out += ["   :no-inherited-members:"]
                if kind == "module":  # what the package exports itself is documented above
                    exported = [n for n in pyg_mgpu.__all__ if getattr(obj, n, None) is not None
                                and getattr(obj, n) is getattr(pyg_mgpu, n)]
                    if exported:
                        out += ["   :exclude-members: " + ", ".join(exported)]
                out += [""]
        return out


class CliReference(_GeneratedRst):
    """Every flag of ``pyg_mgpu.distributed_sampling``'s parser, one section per group."""

    def lines(self) -> list[str]:
        from pyg_mgpu.distributed_sampling import build_parser

        parser = build_parser()
        out = ["Usage", "-----", "", "::", ""]
        out += ["   " + line for line in parser.format_usage().splitlines()] + [""]
        for group in parser._action_groups:  # argparse keeps its groups here, in order
            actions = [a for a in group._group_actions if a.option_strings
                       and not isinstance(a, argparse._HelpAction)]
            if not actions:
                continue
            title = group.title[0].upper() + group.title[1:]
            out += [title, "-" * len(title), ""]
            if group.description:
                out += [_rst_text(group.description), ""]
            for action in actions:
                out += [f"``{_flag(action)}``"]
                out += ["   " + _rst_text(action.help or "(no description)"), ""]
                out += ["   " + _default(action), ""]
        return out


def _flag(action: argparse.Action) -> str:
    names = ", ".join(action.option_strings)
    if action.nargs == 0:
        return names
    if action.choices:
        return f"{names} {{{','.join(map(str, action.choices))}}}"
    return f"{names} {action.metavar or action.dest.upper()}"


def _default(action: argparse.Action) -> str:
    if action.default is argparse.SUPPRESS:
        return "Default: the model's recipe."
    if action.default is None or action.nargs == 0:
        return "Default: off." if action.nargs == 0 else "Default: none."
    value = action.default
    if isinstance(value, tuple):
        value = ",".join(map(str, value))
    return f"Default: ``{value}``."


def setup(app):
    app.add_directive("api-reference", ApiReference)
    app.add_directive("cli-reference", CliReference)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
