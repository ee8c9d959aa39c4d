"""What every pyg_mgpu command's parser shares: help that shows each flag's default once, and a
refused flag reported in one ``error:`` line, as every other input error is."""
from __future__ import annotations

import argparse


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends ``(default: ...)`` to a flag's help, unless its help names the default itself or
    the default is None (unset)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default is None or "default" in (action.help or "").lower():
            return action.help
        return super()._get_help_string(action)


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` that reports a bad flag in one ``error:`` line and a pointer to
    ``--help``, instead of the whole usage above it; exit code 2, as argparse's."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        self.exit(2, f"error: {message}\n({self.prog} --help lists every flag)\n")
