"""What every pyg_mgpu command's parser shares: help that shows each flag's default once, and a
refused flag reported in one ``error:`` line, as every other input error is; and a Ctrl-C
before any rank has started reported as a stop, in one line."""
from __future__ import annotations

import argparse
import re
import signal
import sys
from typing import Callable, Optional, Sequence


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

    def parse_known_args(self, args=None, namespace=None):
        self._argv = list(sys.argv[1:] if args is None else args)  # for error()'s hint
        return super().parse_known_args(args, namespace)

    def error(self, message: str):
        missing = re.fullmatch(r"argument (--[\w-]+).*: expected one argument", message)
        argv = getattr(self, "_argv", [])
        # argparse takes a value such as -1,10 for a flag: the last such value after the flag
        values = [value for flag, value in zip(argv, argv[1:])
                  if missing and flag == missing.group(1) and re.match(r"-[\d.]", value)]
        if values:
            message += (f"; a value that starts with '-' goes after '=': "
                        f"{missing.group(1)}={values[-1]}")
        self.exit(2, f"error: {message}\n({self.prog} --help lists every flag)\n")


def stopped_at_start_is_one_line(command: Callable[[Optional[Sequence[str]]], int],
                                 argv: Optional[Sequence[str]]) -> int:
    """``command(argv)``'s exit code; a Ctrl-C that reaches it (while torch or the data loads:
    no rank has started, so nothing else reports it) ends with ``error: stopped by SIGINT``
    and exit code 130."""
    try:
        return command(argv)
    except KeyboardInterrupt:
        print("\nerror: stopped by SIGINT", file=sys.stderr)
        return 128 + signal.SIGINT


def add_setting_flags(parser: argparse.ArgumentParser, config_type: type,
                      helps: Optional[dict[str, str]] = None) -> None:
    """One flag per setting of ``config_type`` (a dataclass of settings groups, such as
    :class:`~pyg_mgpu.train.config.TrainConfig`), one ``--help`` section per group, all made
    from the settings' own definitions (:func:`~pyg_mgpu.train.setting.setting`).

    The flags' values go to the config as the command line gives them: the config checks
    choices and parses lists, so each is checked in one place. A setting left to the model's
    recipe has no default here, so the config can tell it was not given. ``helps``: another
    help text for some settings, by name (a command that writes elsewhere describes ``out``).
    """
    from dataclasses import fields

    from pyg_mgpu.train.setting import flag_fields, flag_of

    for group in fields(config_type):
        settings = group.default_factory
        section = parser.add_argument_group(settings.TITLE, getattr(settings, "NOTE", None))
        for f in flag_fields(settings):
            meta = f.metadata
            text = (helps or {}).get(f.name, meta["help"])
            if f.default is False:
                section.add_argument(flag_of(f.name), dest=f.name, action="store_true",
                                     help=text)
                continue
            default = f.default
            if meta["from_recipe"]:
                default = argparse.SUPPRESS
            elif isinstance(default, tuple):
                default = ",".join(map(str, default))
            metavar = meta["metavar"]
            if meta["choices"]:
                metavar = "{" + ",".join(meta["choices"]) + "}"
            kind = meta["type"] or (type(f.default) if f.default is not None else str)
            section.add_argument(flag_of(f.name), dest=f.name, default=default,
                                 type=str if kind is tuple else kind, metavar=metavar,
                                 help=text)
